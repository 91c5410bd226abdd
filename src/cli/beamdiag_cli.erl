%%% @doc The `beamdiag' command line: parses arguments, calls the library, prints.
%%%
%%% Each command is a module `beamdiag_cli_<command>' implementing the
%%% `beamdiag_cli' behaviour: `spec/0' gives its arguments as data (so the
%%% spec can move to OTP 26's argparse later) and `run/2' does the work
%%% through the library and returns what to print. `main/1' only calls
%%% `run/1' and halts with its exit code, so tests call `run/1'.
%%% The options several commands take (cookie, window, output) are
%%% defined once, in `beamdiag_cli_options'; a former option name kept for
%%% one release parses as the new one and prints a note on standard error.
%%%
%%% ```
%%% 1> beamdiag_cli:run(["diagnose", "--help"]).
%%% 0
%%% '''
%%%
%%% Exit codes: 0 done (whatever was found), 1 a finding at or above
%%% `--fail-on', 2 usage error, 3 the node cannot be reached, 4 the run
%%% failed (the target died mid-window, a tool is missing, bad input file).
%%% `exit_code/1' is the one mapping from error reasons to codes; commands
%%% report every error through `fail/2' and every `--fail-on' verdict
%%% through `findings_code/2', and list the codes they can return in their
%%% spec (`exit_codes'), which `--help' prints.
-module(beamdiag_cli).

-export([main/1, run/1, run/2, emit/3, format_error/1]).
-export([fail/2, usage_error/2, findings_code/2, html/3]).
%% A logger filter (see main/1).
-export([local_only/2]).
%% main/1: the escript's entry point (escript_emu_args in rebar.config).
-ignore_xref([{main, 1}]).
%% Called as Module:format_error/1 on an {error, {Module, Reason}} value.
-ignore_xref([{format_error, 1}]).
%% Called by the tests only.
-ifdef(TEST).
-export([parse/2, usage/1, commands/0, exit_code/1]).
-endif.

-export_type([spec/0, option/0, io/0, result/0, exit_code/0, opts/0]).

-define(EXIT_OK, 0).
-define(EXIT_FINDINGS, 1).
-define(EXIT_USAGE, 2).
-define(EXIT_UNREACHABLE, 3).
-define(EXIT_FAILED, 4).

-type type() ::
    string
    | binary
    | boolean
    | {integer, integer(), integer()}
    | {float, float(), float()}
    | {enum, [atom()]}
    | {list, string}.
-type option() :: #{
    key := atom(),
    long := string(),
    type := type(),
    help := string(),
    default => term(),
    short => char(),
    metavar => string(),
    %% A former name kept for one release: the option to use instead
    %% (see beamdiag_cli_options:deprecated/2).
    replaced_by => string()
}.
-type positional() :: #{key := atom(), help := string(), required := boolean(), metavar => string(),
                        repeat => boolean()}.
-type spec() :: #{
    name := string(),
    summary := string(),
    example := string(),
    positional := [positional()],
    options := [option()],
    %% The codes the command can return, listed by --help (all five when
    %% absent; beamdiag_exit_codes_tests wants every command to say).
    exit_codes => [exit_code()],
    aliases => [string()]
}.
%% Where a command writes: `out' is standard output, `err' standard error
%% (progress and warnings), `colour' whether standard output is a terminal
%% that wants colour.
%% `tty' whether standard error is a terminal (progress is drawn only then).
%% `relaunch' (the escript only) runs the same command line in this
%% escript started again with more emulator flags, sharing the standard
%% streams, and returns its exit code.
-type io() :: #{out := fun((iodata()) -> ok), err := fun((iodata()) -> ok), colour := boolean(),
                tty => boolean(), relaunch => fun(([string()]) -> exit_code())}.
%% The parsed options parse/2 returns, every default filled in. Open: its
%% keys are the command spec's option and positional keys (each
%% command's own) and its values of their types (type()).
-type opts() :: #{atom() => term()}.
%% What a command returns: the exit code; everything it printed went through io().
-type result() :: exit_code().
%% 0 done, 1 a finding at or above --fail-on, 2 usage, 3 unreachable, 4 failed.
-type exit_code() :: 0..4.

-callback spec() -> spec().
-callback run(Opts :: opts(), IO :: io()) -> result().

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Escript entry point.
-spec main([string()]) -> no_return().
main(Args) ->
    Started = erlang:system_time(millisecond),
    quiet(),
    IO = case os:getenv("BEAMDIAG_RELAUNCHED") of
             false -> (default_io())#{relaunch => fun(Flags) -> relaunch(Args, Flags, Started) end};
             _ -> default_io()
         end,
    Code = run(Args, IO),
    erlang:halt(Code, [{flush, true}]).

%% @doc Runs a command line and returns its exit code, printing to the
%% standard streams.
-spec run([string()]) -> result().
run(Args) ->
    run(Args, default_io()).

%% @doc Runs a command line with the given output functions.
-spec run([string()], io()) -> result().
run([], #{err := Err}) ->
    Err(top_usage()),
    ?EXIT_USAGE;
run([H | _], #{out := Out}) when H =:= "--help"; H =:= "-h"; H =:= "help" ->
    Out(top_usage()),
    ?EXIT_OK;
run(["--version" | _], #{out := Out}) ->
    %% In the escript nothing has loaded the application's resource file yet.
    _ = application:load(beamdiag),
    Vsn = case application:get_key(beamdiag, vsn) of
              {ok, V} -> V;
              undefined -> "(version unknown)"
          end,
    Out(["beamdiag ", Vsn, " on OTP ", erlang:system_info(otp_release), ", running code compiled by ",
         release_text(beamdiag_beams:compiled_by(?MODULE)), " (this build holds code compiled by ",
         lists:join(" and ", [release_text(R) || R <- beamdiag_beams:releases()]), ")\n"]),
    ?EXIT_OK;
run([Cmd | Rest], IO0 = #{out := Out, err := Err0}) ->
    %% Messages may quote file names, node names and other input: nothing
    %% but newlines and carriage returns goes to the terminal raw.
    Err = fun(D) -> Err0(beamdiag_safe_text:terminal(D)) end,
    IO = IO0#{err => Err},
    case lists:keyfind(Cmd, 1, commands() ++ aliases()) of
        false ->
            Err(["beamdiag: unknown command '", beamdiag_safe_text:safe(Cmd, 200), "'\n\n", top_usage()]),
            ?EXIT_USAGE;
        {Cmd, Mod, _} ->
            Spec = Mod:spec(),
            case lists:member("--help", Rest) orelse lists:member("-h", Rest) of
                true ->
                    Out(usage(Spec)),
                    ?EXIT_OK;
                false ->
                    case parse(Spec, Rest) of
                        {ok, Opts} ->
                            _ = [Err(["beamdiag ", Cmd, ": ", Old, " is deprecated and goes in the "
                                      "next release; use ", New, " instead\n"])
                                 || {Old, New} <- deprecated(Spec, Rest)],
                            guarded(Cmd, fun() -> Mod:run(Opts, IO) end, Err);
                        {error, Reason} ->
                            Err([
                                "beamdiag ", Cmd, ": ", format_error(Reason), "\n",
                                "try: beamdiag ", Cmd, " --help\n"
                            ]),
                            exit_code({?MODULE, Reason})
                    end
            end
    end.

%% A command that crashes (a bug, not an expected failure: those are
%% values with sentences) says so in one line, with where, and exits with
%% "the run failed" rather than the escript's stack trace and 127.
guarded(Cmd, Run, Err) ->
    try
        Run()
    catch
        Class:Reason:Stack ->
            Where = case Stack of
                        [{M, F, A, _} | _] when is_atom(M), is_atom(F) ->
                            io_lib:format(" in ~p:~p/~p", [M, F, arity(A)]);
                        _ -> ""
                    end,
            Err(["beamdiag ", Cmd, ": internal error", Where, ": ",
                 beamdiag_safe_text:safe(io_lib:format("~p:~0p", [Class, Reason]), 300),
                 "\nthis is a bug in beamdiag\n"]),
            ?EXIT_FAILED
    end.

release_text(R) when is_integer(R) -> ["OTP ", integer_to_list(R)];
release_text(unknown) -> "an OTP release not known here".

arity(A) when is_list(A) -> length(A);
arity(A) -> A.

%% @doc The commands, their modules and one-line summaries.
-spec commands() -> [{string(), module(), string()}].
commands() ->
    [
        {Name, Mod, Summary}
     || Mod <- command_modules(),
        #{name := Name, summary := Summary} <- [Mod:spec()]
    ].

%% @doc Other names of commands (an old name kept working), with their
%% modules and summaries.
-spec aliases() -> [{string(), module(), string()}].
aliases() ->
    [
        {Alias, Mod, Summary}
     || Mod <- command_modules(),
        #{summary := Summary} = Spec <- [Mod:spec()],
        Alias <- maps:get(aliases, Spec, [])
    ].

%% @doc Parses arguments against a command spec: `{ok, Opts}' with every
%% default filled in, or `{error, Reason}' for `format_error/1'.
-spec parse(spec(), [string()]) -> {ok, opts()} | {error, term()}.
parse(#{options := Options, positional := Positional}, Args) ->
    Defaults = maps:from_list([{K, D} || #{key := K, default := D} <- Options]),
    %% Defaults go in after parsing, so a repeatable option given on the
    %% command line replaces its default instead of adding to it.
    case parse_args(Args, Options, #{}, []) of
        {ok, Opts, Pos} -> bind_positional(Positional, lists:reverse(Pos), maps:merge(Defaults, Opts));
        {error, _} = E -> E
    end.

%% @doc The help text of one command.
-spec usage(spec()) -> iolist().
usage(Spec = #{name := Name, summary := Summary, example := Example, positional := Pos,
               options := Opts}) ->
    Codes = maps:get(exit_codes, Spec, [?EXIT_OK, ?EXIT_FINDINGS, ?EXIT_USAGE, ?EXIT_UNREACHABLE,
                                        ?EXIT_FAILED]),
    [
        "usage: beamdiag ", Name,
        [[" ", positional_usage(P)] || P <- Pos],
        case Opts of [] -> ""; _ -> " [options]" end, "\n\n",
        Summary, "\n",
        case Pos of
            [] -> "";
            _ -> ["\narguments:\n", [option_line(metavar(P), H) || P = #{help := H} <- Pos]]
        end,
        case Opts of
            [] -> "";
            _ -> ["\noptions:\n", [option_line(option_usage(O), option_help(O))
                                    || O <- Opts, not is_map_key(replaced_by, O)]]
        end,
        "\nexample:\n  ", Example, "\n",
        "\nexit codes:\n",
        [io_lib:format("  ~b  ~s~n", [C, exit_meaning(C)]) || C <- lists:usort(Codes)]
    ].

%% @doc The exit code of an error: the one mapping from error reasons to
%% exit codes. 2 for what the user gave wrong (arguments, node name,
%% cookie, workload, scenario), 3 when the node cannot be reached (or this
%% machine cannot start distribution to reach it), 4 for every other
%% failure of the run.
-spec exit_code({module(), term()}) -> exit_code().
exit_code({?MODULE, {write, _, _}}) -> ?EXIT_FAILED;
exit_code({?MODULE, _}) -> ?EXIT_USAGE;
exit_code({beamdiag_node_name, {bad_node, _}}) -> ?EXIT_USAGE;
exit_code({beamdiag_remote, no_cookie}) -> ?EXIT_USAGE;
exit_code({beamdiag_remote, {bad_cookie, _}}) -> ?EXIT_USAGE;
exit_code({beamdiag_remote, {cookie_file, _, _}}) -> ?EXIT_USAGE;
exit_code({beamdiag_remote, {no_distribution, _}}) -> ?EXIT_UNREACHABLE;
exit_code(E = {beamdiag_remote, _}) ->
    case beamdiag_remote:unreachable(E) of
        true -> ?EXIT_UNREACHABLE;
        false -> ?EXIT_FAILED
    end;
exit_code({beamdiag, {host_only, _, _}}) -> ?EXIT_UNREACHABLE;
exit_code({beamdiag_cluster, {members, _, _}}) -> ?EXIT_UNREACHABLE;
exit_code({beamdiag_cluster, {too_many_nodes, _, _}}) -> ?EXIT_USAGE;
exit_code({beamdiag_cluster, {bad_line, _, _, _}}) -> ?EXIT_USAGE;
exit_code({beamdiag_cluster, {no_nodes, _}}) -> ?EXIT_USAGE;
exit_code({beamdiag_cluster, {nodes_file, _, _}}) -> ?EXIT_USAGE;
exit_code({beamdiag, {elsewhere, _, _}}) -> ?EXIT_UNREACHABLE;
exit_code({beamdiag_lab, {unknown_scenario, _, _}}) -> ?EXIT_USAGE;
exit_code({beamdiag_lab, {bad_variation, _, _, _}}) -> ?EXIT_USAGE;
exit_code({beamdiag_lab, {bad_variation, _, _, _, _}}) -> ?EXIT_USAGE;
exit_code({beamdiag_experiment, {unknown_lab, _}}) -> ?EXIT_USAGE;
exit_code({beamdiag_experiment, {bad_workload, _}}) -> ?EXIT_USAGE;
exit_code({beamdiag_experiment, {no_module, _}}) -> ?EXIT_USAGE;
exit_code({beamdiag_experiment, {no_function, _, _}}) -> ?EXIT_USAGE;
exit_code({beamdiag_experiment, {bad_variant, _}}) -> ?EXIT_USAGE;
exit_code({M, _}) when is_atom(M) -> ?EXIT_FAILED.

%% @doc Says what went wrong on standard error and returns the error's
%% exit code. A node that cannot be reached is said in one line.
-spec fail({module(), term()}, io()) -> exit_code().
fail({M, R} = Error, #{err := Err}) ->
    Text = M:format_error(R),
    case exit_code(Error) of
        ?EXIT_UNREACHABLE ->
            Err(["beamdiag: ", one_line(Text), "\n"]),
            ?EXIT_UNREACHABLE;
        Code ->
            Err(["beamdiag: ", Text, "\n"]),
            Code
    end.

%% @doc A command's own usage error (a combination of options the parser
%% cannot check): says so on standard error and returns 2.
-spec usage_error(unicode:chardata(), io()) -> exit_code().
usage_error(Text, #{err := Err}) ->
    Err(["beamdiag: ", Text, "\n"]),
    ?EXIT_USAGE.

%% @doc The exit code of a finished run: 1 when a finding is at or above
%% the options' `fail_on' level, 0 otherwise.
-spec findings_code([beamdiag_finding:finding()], opts()) -> exit_code().
findings_code(Findings, Opts) ->
    case maps:get(fail_on, Opts, undefined) of
        L when L =:= undefined; L =:= none -> ?EXIT_OK;
        Level ->
            case lists:any(fun(F) -> beamdiag_finding:at_least(F, Level) end, Findings) of
                true -> ?EXIT_FINDINGS;
                false -> ?EXIT_OK
            end
    end.

%% @doc Prints a report on standard output, or writes it to the `out' file
%% of the options and says so on standard error. Returns 0, or 4 when the
%% file cannot be written. The report is made terminal-safe either way
%% (`beamdiag_safe_text:report/2'): control characters and bytes that are
%% not UTF-8 become `?', newlines stay, and on a terminal that wants colour
%% so do the formatter's colour codes.
-spec emit(unicode:chardata() | iodata(), opts(), io()) -> result().
emit(Text, Opts, IO = #{out := Out}) ->
    case maps:find(out, Opts) of
        {ok, File} ->
            write(File, beamdiag_safe_text:report(Text), "", IO);
        error ->
            Out(beamdiag_safe_text:report(Text, case IO of
                                                    #{colour := true} -> colour;
                                                    _ -> plain
                                                end)),
            ?EXIT_OK
    end.

%% @doc Writes an HTML report to the options' `html' file when there is
%% one (the fun renders it) and says so on standard error; returns 0, or 4
%% when the file cannot be written.
-spec html(fun(() -> iodata()), opts(), io()) -> exit_code().
html(Render, #{html := File}, IO) ->
    write(File, Render(), "HTML report ", IO);
html(_Render, _Opts, _IO) ->
    ?EXIT_OK.

%% @doc Turns a parse error (or a file the command line named that cannot
%% be written) into a sentence.
-spec format_error(term()) -> unicode:chardata().
format_error({unknown_option, O}) -> ["unknown option ", beamdiag_safe_text:safe(O, 200)];
format_error({missing_value, O}) -> ["option ", O, " needs a value"];
format_error({bad_value, O, V, Why}) -> ["bad value '", beamdiag_safe_text:safe(V, 200), "' for ", O, ": ", Why];
format_error({missing_argument, M}) -> ["missing argument ", M];
format_error({extra_argument, A}) -> ["unexpected argument '", beamdiag_safe_text:safe(A, 200), "'"];
format_error({write, File, Why}) -> ["cannot write ", File, ": ", file:format_error(Why)].

%%%===================================================================
%%% Internal
%%%===================================================================

%% Writes a file the command line named and says so on standard error;
%% 0, or 4 when it cannot be written.
write(File, Data, What, IO = #{err := Err}) ->
    case file:write_file(File, Data) of
        ok ->
            Err(["beamdiag: ", What, "written to ", File, "\n"]),
            ?EXIT_OK;
        {error, R} ->
            fail({?MODULE, {write, File, R}}, IO)
    end.

%% The former option names given on a command line, each with the usage
%% of the option that replaces it.
deprecated(#{options := Options}, Args) ->
    Given = [hd(string:split(A, "="))
             || A <- lists:takewhile(fun(A) -> A =/= "--" end, Args), lists:prefix("--", A)],
    lists:usort([{Old, option_usage(O)}
                 || #{long := Old, replaced_by := NewLong} <- Options, lists:member(Old, Given),
                    O = #{long := L} <- Options, L =:= NewLong]).

exit_meaning(?EXIT_OK) -> "done, whatever was found";
exit_meaning(?EXIT_FINDINGS) -> "a finding at or above --fail-on";
exit_meaning(?EXIT_USAGE) -> "usage error (arguments, node name, cookie)";
exit_meaning(?EXIT_UNREACHABLE) -> "the node cannot be reached";
exit_meaning(?EXIT_FAILED) -> "the run failed".

%% Error sentences on one line: line breaks (and the indentation after
%% them, as ~p writes long terms) become one space.
one_line(Text) ->
    string:trim(re:replace(beamdiag_safe_text:chars(Text), "\\s*\\n\\s*", " ",
                           [global, unicode, {return, list}]), trailing).

command_modules() ->
    [
        beamdiag_cli_diagnose,
        beamdiag_cli_lab,
        beamdiag_cli_catalogue,
        beamdiag_cli_emu_type,
        beamdiag_cli_flame,
        beamdiag_cli_report,
        beamdiag_cli_compare,
        beamdiag_cli_experiment,
        beamdiag_cli_watch,
        beamdiag_cli_metrics,
        beamdiag_cli_cluster
    ].

%% The escript once more, as a child sharing this one's standard streams,
%% with Flags added to the emulator's arguments (ERL_AFLAGS, ahead of any
%% the user set): its exit code. BEAMDIAG_RELAUNCHED keeps it from doing
%% the same again; BEAMDIAG_STARTED says when this one started, so that
%% the child's report is due, and said ready, from the call.
relaunch(Args, Flags, Started) ->
    Bin = case os:getenv("BINDIR") of
              false -> filename:dirname(os:find_executable("escript"));
              B -> B
          end,
    Aflags = string:join([quote(F) || F <- Flags], " ") ++
        case os:getenv("ERL_AFLAGS") of
            false -> "";
            Old -> " " ++ Old
        end,
    Port = open_port({spawn_executable, filename:join(Bin, "escript")},
                     [{args, [escript:script_name() | Args]},
                      {env, [{"ERL_AFLAGS", Aflags}, {"BEAMDIAG_RELAUNCHED", "1"},
                             {"BEAMDIAG_STARTED", integer_to_list(Started)}]},
                      exit_status, nouse_stdio]),
    receive
        {Port, {exit_status, Code}} when Code >= 0, Code =< 4 -> Code;
        {Port, {exit_status, _}} -> ?EXIT_FAILED
    end.

%% An argument as erlexec reads it from ERL_AFLAGS: each blank, quote
%% and backslash escaped with a backslash.
quote(Arg) ->
    lists:flatmap(fun(C) ->
                          case lists:member(C, " \t\n\r\"'\\") of
                              true -> [$\\, C];
                              false -> [C]
                          end
                  end, Arg).

%% Standard output is written through `user', not this process's group
%% leader, which main/1 turns into a sink.
default_io() ->
    #{
        out => fun(D) -> io:put_chars(user, D) end,
        err => fun(D) -> io:put_chars(standard_error, D) end,
        colour => want_colour(),
        tty => is_terminal(2)
    }.

want_colour() ->
    os:getenv("NO_COLOR") =:= false andalso os:getenv("TERM") =/= "dumb" andalso
        io:columns(user) =/= {error, enotsup}.

%% Whether a file descriptor of this OS process is a terminal (Linux: where
%% /proc/self/fd/N points).
is_terminal(Fd) ->
    case file:read_link("/proc/self/fd/" ++ integer_to_list(Fd)) of
        {ok, "/dev/pts/" ++ _} -> true;
        {ok, "/dev/tty" ++ _} -> true;
        {ok, "/dev/console"} -> true;
        _ -> false
    end.

%% Nothing but beamdiag's own output reaches standard output. A remote call
%% runs on the target with the caller's group leader, and the target's
%% errors about it (a module it cannot load, a crash report) come back to
%% this node: the group leader of the command becomes a sink that answers
%% every request and prints nothing, and the node's logger writes only this
%% node's own warnings, without OTP's reports, to standard error.
quiet() ->
    group_leader(spawn(fun sink/0), self()),
    _ = logger:remove_handler(default),
    _ = logger:add_handler(beamdiag_stderr, logger_std_h, #{
        level => warning,
        config => #{type => standard_error},
        filter_default => log,
        filters => [{local, {fun ?MODULE:local_only/2, []}},
                    {otp, {fun logger_filters:domain/2, {stop, sub, [otp]}}}]
    }),
    ok.

%% @doc A logger filter: stops events from processes on other nodes.
-spec local_only(logger:log_event(), term()) -> logger:filter_return().
local_only(#{meta := #{pid := Pid}}, _) when is_pid(Pid), node(Pid) =/= node() -> stop;
local_only(#{meta := #{gl := Gl}}, _) when is_pid(Gl), node(Gl) =/= node() -> stop;
local_only(_Event, _) -> ignore.

%% Output is taken and dropped (`ok'): an error reply makes the writer
%% fail, and a lab node, whose output comes here through `peer', died of
%% it when it logged a refused connection. Input is not there.
sink() ->
    receive
        {io_request, From, ReplyAs, Request} ->
            From ! {io_reply, ReplyAs, sink_reply(Request)},
            sink();
        _ ->
            sink()
    end.

sink_reply({put_chars, _, _}) -> ok;
sink_reply({put_chars, _, _, _, _}) -> ok;
sink_reply({requests, Rs}) ->
    case lists:all(fun(R) -> sink_reply(R) =:= ok end, Rs) of
        true -> ok;
        false -> {error, enotsup}
    end;
sink_reply(_) -> {error, enotsup}.

top_usage() ->
    [
        "usage: beamdiag COMMAND [options]\n\n",
        "Explains where a live BEAM node's CPU time goes.\n\ncommands:\n",
        [io_lib:format("  ~-12s ~s~n", [N, S]) || {N, _, S} <- commands()],
        [io_lib:format("  ~-12s the same as ~s~n", [A, N])
         || {A, Mod, _} <- aliases(), {N, M, _} <- commands(), M =:= Mod],
        "\nbeamdiag COMMAND --help shows a command's options and an example.\n"
    ].

parse_args([], _Options, Acc, Pos) ->
    {ok, Acc, Pos};
parse_args(["--" | Rest], _Options, Acc, Pos) ->
    {ok, Acc, lists:reverse(Rest, Pos)};
parse_args([[$-, $- | _] = Arg | Rest], Options, Acc, Pos) ->
    {Long, Inline} =
        case string:split(Arg, "=") of
            [L, V] -> {L, {value, V}};
            [L] -> {L, none}
        end,
    case [O || O = #{long := L2} <- Options, L2 =:= Long] of
        [O] -> take_value(O, Inline, Rest, Options, Acc, Pos);
        [] -> {error, {unknown_option, Long}}
    end;
parse_args([[$-, C] = Arg | Rest], Options, Acc, Pos) ->
    case [O || O = #{short := S} <- Options, S =:= C] of
        [O] -> take_value(O, none, Rest, Options, Acc, Pos);
        [] -> {error, {unknown_option, Arg}}
    end;
parse_args([A | Rest], Options, Acc, Pos) ->
    parse_args(Rest, Options, Acc, [A | Pos]).

take_value(#{key := K, type := boolean}, none, Rest, Options, Acc, Pos) ->
    parse_args(Rest, Options, Acc#{K => true}, Pos);
take_value(#{long := L, type := boolean}, {value, _}, _Rest, _Options, _Acc, _Pos) ->
    {error, {bad_value, L, "=...", "takes no value"}};
take_value(#{long := L} = O, none, Rest, Options, Acc, Pos) ->
    case Rest of
        [V | Rest2] -> store(O, V, Rest2, Options, Acc, Pos);
        [] -> {error, {missing_value, L}}
    end;
take_value(O, {value, V}, Rest, Options, Acc, Pos) ->
    store(O, V, Rest, Options, Acc, Pos).

store(#{key := K, long := L, type := T}, V, Rest, Options, Acc, Pos) ->
    case convert(T, V) of
        {ok, {list, X}} ->
            Prev = case maps:get(K, Acc, []) of P when is_list(P) -> P; _ -> [] end,
            %% A repeatable option also takes the values that follow it up to
            %% the next option.
            {More, Rest2} = lists:splitwith(fun(A) -> not lists:prefix("-", A) end, Rest),
            parse_args(Rest2, Options, Acc#{K => Prev ++ [X | More]}, Pos);
        {ok, X} ->
            parse_args(Rest, Options, Acc#{K => X}, Pos);
        {error, Why} ->
            {error, {bad_value, L, V, Why}}
    end.

convert(string, V) ->
    {ok, V};
convert(binary, V) ->
    {ok, unicode:characters_to_binary(V)};
convert({list, string}, V) ->
    {ok, {list, V}};
convert({integer, Min, Max}, V) ->
    case string:to_integer(V) of
        {I, ""} when I >= Min, I =< Max -> {ok, I};
        {I, ""} when is_integer(I) -> {error, io_lib:format("must be between ~b and ~b", [Min, Max])};
        _ -> {error, "not an integer"}
    end;
convert({float, Min, Max}, V) ->
    case to_number(V) of
        {ok, F} when F >= Min, F =< Max -> {ok, F};
        {ok, _} -> {error, ["must be between ", short(Min), " and ", short(Max)]};
        error -> {error, "not a number"}
    end;
convert({enum, Allowed}, V) ->
    case [A || A <- Allowed, atom_to_list(A) =:= V] of
        [A] -> {ok, A};
        [] -> {error, ["one of: ", lists:join(", ", [atom_to_list(A) || A <- Allowed])]}
    end.

to_number(V) ->
    case string:to_float(V) of
        {F, ""} ->
            {ok, F};
        _ ->
            case string:to_integer(V) of
                {I, ""} when is_integer(I) -> {ok, float(I)};
                _ -> error
            end
    end.

bind_positional([], [], Opts) ->
    {ok, Opts};
bind_positional([], [Extra | _], _Opts) ->
    {error, {extra_argument, Extra}};
bind_positional([#{key := K, repeat := true} | _], Values, Opts) when Values =/= [] ->
    {ok, Opts#{K => Values}};
bind_positional([#{key := K} | Rest], [V | Vs], Opts) ->
    bind_positional(Rest, Vs, Opts#{K => V});
bind_positional([P = #{required := true} | _], [], _Opts) ->
    {error, {missing_argument, metavar(P)}};
bind_positional([_ | Rest], [], Opts) ->
    bind_positional(Rest, [], Opts).

positional_usage(P = #{required := true}) -> metavar(P);
positional_usage(P) -> ["[", metavar(P), "]"].

metavar(#{metavar := M}) -> M;
metavar(#{key := K}) -> string:uppercase(atom_to_list(K)).

option_usage(#{long := L, type := boolean}) ->
    L;
option_usage(O = #{long := L}) ->
    [L, " ", option_metavar(O)].

option_metavar(#{metavar := M}) -> M;
option_metavar(#{type := {enum, As}}) -> lists:join("|", [atom_to_list(A) || A <- As]);
option_metavar(#{key := K}) -> string:uppercase(atom_to_list(K)).

option_help(#{help := H, default := D}) when D =/= undefined, D =/= false, D =/= [] ->
    [H, " (default: ", default_text(D), ")"];
option_help(#{help := H}) ->
    H.

default_text(D) when is_atom(D) -> atom_to_list(D);
default_text(D) when is_integer(D) -> integer_to_list(D);
default_text(D) when is_float(D) -> short(D);
default_text(D) when is_binary(D) -> D;
default_text(D) -> io_lib:format("~p", [D]).

%% A float as people write it: 2, 0.1, 3600.
short(F) when is_float(F), F == trunc(F), abs(F) < 1.0e15 -> integer_to_list(trunc(F));
short(F) when is_float(F) -> float_to_list(F, [short]);
short(I) when is_integer(I) -> integer_to_list(I).

option_line(Left, Help) ->
    L = lists:flatten(io_lib:format("~s", [Left])),
    case length(L) of
        N when N =< 24 -> io_lib:format("  ~-24s ~s~n", [L, Help]);
        _ -> io_lib:format("  ~s~n  ~24s ~s~n", [L, "", Help])
    end.

