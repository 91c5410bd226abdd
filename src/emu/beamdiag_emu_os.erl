%%% @doc Programs and files for building the lock-counting emulator:
%%% finding and running programs with explicit arguments (never through a
%%% shell, their output streamed to the `progress' fun), and the file
%%% operations of a build. Failures are thrown as `{beamdiag_emu_type,
%%% Reason}', which `beamdiag_emu_type:build/1' returns as its error.
%%%
%%% ```
%%% 1> beamdiag_emu_os:run_output("/bin/echo", ["hi"]).
%%% {0, "hi\n"}
%%% '''
-module(beamdiag_emu_os).

-export([exe/1, run/5, run/6, run_output/2]).
-export([copy_exec/2, mkdir_p/1, write_file/2, file_op/3, make_temp_dir/0]).

-ifdef(TEST).
-export([own_nice/0, group_nice/2]).
-endif.

%%%===================================================================
%%% Running programs
%%%===================================================================

%% @doc The path of a program, thrown `not_found' when there is none.
-spec exe(string()) -> string().
exe(Name) ->
    case os:find_executable(Name) of
        false -> throw({beamdiag_emu_type, {not_found, Name}});
        Path -> Path
    end.

%% @doc Runs a program (`run/6'), thrown `command_failed' when it fails.
-spec run(string(), [string()], string(), [{string(), string() | false}], fun((iodata()) -> ok)) ->
    ok.
run(Exe, Args, Dir, Env, P) ->
    case run(Exe, Args, Dir, Env, P, nothrow) of
        ok -> ok;
        {error, Reason} -> throw({beamdiag_emu_type, Reason})
    end.

%% @doc Runs a program with explicit arguments, streaming its output lines to
%% the progress fun and keeping the last 20 for an error report.
-spec run(string(), [string()], string(), [{string(), string() | false}], fun((iodata()) -> ok),
          nothrow) -> ok | {error, term()}.
run(Exe, Args, Dir, Env, P, nothrow) ->
    Port = open_port(
        {spawn_executable, Exe},
        [{args, Args}, {cd, Dir}, {env, Env}, {line, 4096}, binary, exit_status,
         stderr_to_stdout, use_stdio, hide]
    ),
    ok = keep_nice(Port),
    case collect_lines(Port, P, []) of
        {0, _} ->
            ok;
        {Status, Tail} ->
            Cmd = lists:join(" ", [filename:basename(Exe) | Args]),
            {error, {command_failed, Cmd, Status, lists:join("\n", lists:reverse(Tail))}}
    end.

%% A program the VM spawns runs in a session of its own (erl_child_setup
%% calls setsid), and with the kernel's autogroups (sched_autogroup_enabled)
%% a session is scheduled as one group whatever its members' nice values:
%% a build started under `nice -n 19' would take as much CPU as any other
%% session. So a niced VM gives its program's session its own nice value
%% (/proc/PID/autogroup; raising it needs no privilege). Where the file is
%% missing (no autogroups) nothing changes.
-spec keep_nice(port()) -> ok.
keep_nice(Port) ->
    case {own_nice(), erlang:port_info(Port, os_pid)} of
        {N, {os_pid, OsPid}} when is_integer(N), N > 0, is_integer(OsPid) ->
            _ = group_nice(OsPid, N),
            ok;
        _ ->
            ok
    end.

%% Sets the nice value of the autogroup of OS process OsPid once that
%% process leads its own session. The port's OS pid is known as soon as the
%% child is forked, before it calls setsid: a value written then goes to the
%% group it leaves (erl_child_setup's), and its new group keeps nice 0.
%% Waits 500 ms at most for the setsid; `false' when it never came (the
%% program ended first) or the file cannot be written.
-spec group_nice(pos_integer(), integer()) -> boolean().
group_nice(OsPid, N) ->
    Proc = "/proc/" ++ integer_to_list(OsPid),
    Deadline = erlang:monotonic_time(millisecond) + 500,
    case await_session(Proc, OsPid, Deadline) of
        true -> file:write_file(Proc ++ "/autogroup", integer_to_list(N)) =:= ok;
        false -> false
    end.

-spec await_session(string(), pos_integer(), integer()) -> boolean().
await_session(Proc, OsPid, Deadline) ->
    case session(Proc) of
        OsPid ->
            true;
        S when is_integer(S) ->
            case erlang:monotonic_time(millisecond) < Deadline of
                true ->
                    receive after 1 -> ok end,
                    await_session(Proc, OsPid, Deadline);
                false ->
                    false
            end;
        undefined ->
            false
    end.

%% The session id of a process (/proc/PID/stat, field 6), or undefined.
session(Proc) ->
    stat_field(Proc ++ "/stat", 6).

%% This VM's nice value (/proc/self/stat, field 19), or undefined.
own_nice() ->
    stat_field("/proc/self/stat", 19).

%% Field K (from 3, the first after the name) of a /proc stat file, an
%% integer, or undefined.
stat_field(Path, K) when K >= 3 ->
    case file:read_file(Path) of
        {ok, Stat} ->
            case beamdiag_agent_procfs:stat_fields(Stat) of
                {ok, _, Fields} when length(Fields) >= K - 2 ->
                    try binary_to_integer(lists:nth(K - 2, Fields))
                    catch error:badarg -> undefined
                    end;
                _ -> undefined
            end;
        {error, _} ->
            undefined
    end.

-spec collect_lines(port(), fun((iodata()) -> ok), [binary()]) -> {integer(), [binary()]}.
collect_lines(Port, P, Tail) ->
    receive
        {Port, {data, {Flag, Line}}} ->
            P(["  ", Line, case Flag of eol -> "\n"; noeol -> "" end]),
            collect_lines(Port, P, lists:sublist([Line | Tail], 20));
        {Port, {exit_status, Status}} ->
            {Status, Tail}
    end.

%% @doc Runs a program and returns its exit status and output.
-spec run_output(string(), [string()]) -> {integer(), string()}.
run_output(Exe, Args) ->
    Port = open_port(
        {spawn_executable, Exe},
        [{args, Args}, binary, exit_status, stderr_to_stdout, use_stdio, hide]
    ),
    run_output_loop(Port, []).

-spec run_output_loop(port(), [binary()]) -> {integer(), string()}.
run_output_loop(Port, Acc) ->
    receive
        {Port, {data, D}} -> run_output_loop(Port, [D | Acc]);
        {Port, {exit_status, S}} -> {S, unicode:characters_to_list(lists:reverse(Acc))}
    end.

%%%===================================================================
%%% Files
%%%===================================================================

%% @doc Makes a directory and its parents.
-spec mkdir_p(string()) -> ok.
mkdir_p(Dir) ->
    file_op("create", Dir, filelib:ensure_dir(filename:join(Dir, "x"))).

%% @doc Writes a file.
-spec write_file(string(), iodata()) -> ok.
write_file(Path, Data) ->
    file_op("write", Path, file:write_file(Path, Data)).

%% @doc A file operation's result: `ok', or its error thrown.
-spec file_op(string(), string(), ok | {error, term()}) -> ok.
file_op(_Op, _Path, ok) -> ok;
file_op(Op, Path, {error, Why}) -> throw({beamdiag_emu_type, {file, Op, Path, Why}}).

%% @doc Makes a new directory under TMPDIR (or /tmp).
-spec make_temp_dir() -> string().
make_temp_dir() ->
    Dir = beamdiag_tmp:path("beamdiag-emu-type"),
    ok = file_op("create", Dir, file:make_dir(Dir)),
    Dir.

%% @doc Copies an executable into place: to a temporary name, made
%% executable, then renamed.
-spec copy_exec(string(), string()) -> ok.
copy_exec(From, To) ->
    Tmp = To ++ ".beamdiag-tmp",
    case file:copy(From, Tmp) of
        {ok, _} -> ok;
        {error, Why} -> throw({beamdiag_emu_type, {file, "copy to", Tmp, Why}})
    end,
    ok = file_op("chmod", Tmp, file:change_mode(Tmp, 8#755)),
    ok = file_op("rename to", To, file:rename(Tmp, To)).
