%%% Helpers shared by the Common Test suites.
-module(beamdiag_test_lib).

-export([missing/1, fixture/1, escript/0, otp_exec/1, start_node/2, with_node/3, eval/2, run_exe/3, read_port/2]).
-export([start_peers/3, stop_peers/1]).

%% A tool the suite needs is missing: skipped on a developer's machine,
%% a failure in CI, where the set-up must have installed it.
missing(Why) ->
    case os:getenv("CI") of
        "true" -> ct:fail(["CI must install what this suite needs: " | Why]);
        _ -> {skip, Why}
    end.

%% A file under test/fixtures, found from where the beamdiag modules were
%% loaded, whatever directory the suite runs in.
fixture(Rel) ->
    fixture(filename:dirname(filename:dirname(code:which(beamdiag))), Rel).

fixture("/", Rel) ->
    error({no_fixture, Rel});
fixture(Dir, Rel) ->
    F = filename:join([Dir, "test", "fixtures", Rel]),
    case filelib:is_regular(F) of
        true -> F;
        false -> fixture(filename:dirname(Dir), Rel)
    end.

%% The built escript, found above where the beamdiag modules were loaded
%% from (`_build/PROFILE/lib/beamdiag/ebin'), whatever directory the suite
%% runs in: `{ok, Path}', or `error' when it has not been built.
escript() ->
    escript(filename:dirname(code:which(beamdiag))).

escript(Dir) ->
    E = filename:join([Dir, "_build", "default", "bin", "beamdiag"]),
    case filelib:is_regular(E) of
        true -> {ok, E};
        false when Dir =:= "/" -> error;
        false -> escript(filename:dirname(Dir))
    end.

%% Runs a program with these arguments and environment, its standard error
%% going to a file of its own, for at most two minutes:
%% `{ExitCode, Stdout, Stderr}' with Stderr as a string.
run_exe(Exe, Args, Env) ->
    Err = filename:join("/tmp", "beamdiag_test_err_" ++
                            integer_to_list(erlang:unique_integer([positive]))),
    Port = open_port({spawn_executable, "/bin/sh"},
                     [{args, ["-c", "exec \"$0\" \"$@\" 2>\"$BEAMDIAG_TEST_ERR\"", Exe | Args]},
                      {env, [{"BEAMDIAG_TEST_ERR", Err} | Env]}, exit_status, binary, hide]),
    {Code, Out} = read_port(Port, <<>>),
    {ok, E} = file:read_file(Err),
    ok = file:delete(Err),
    {Code, Out, unicode:characters_to_list(E)}.

%% The output of a port until it exits: {ExitCode, Output}.
read_port(Port, Acc) ->
    receive
        {Port, {data, D}} -> read_port(Port, <<Acc/binary, D/binary>>);
        {Port, {exit_status, S}} -> {S, Acc}
    after 120000 ->
        catch port_close(Port),
        error(exe_timeout)
    end.

%% The `exec' option of OTP's `peer' that starts `erl' on another OTP
%% release, in a Debian root of its own (scripts/otp-root.sh builds and
%% caches it; scripts/otp-run.sh enters it): 27 is Debian trixie's, 29 is
%% sid's. 25 (or the running release) is this machine's own `erl'.
%% `{ok, {Exe, Args}}', or what `missing/1' returns when the root cannot be
%% built.
otp_exec(Release) when is_integer(Release) ->
    Here = list_to_integer(erlang:system_info(otp_release)),
    case Release of
        Here ->
            {ok, {os:find_executable("erl"), []}};
        _ ->
            Suite = case Release of 27 -> "trixie"; 29 -> "sid" end,
            Scripts = filename:join(top(), "scripts"),
            Out = os:cmd(filename:join(Scripts, "otp-root.sh") ++ " " ++ Suite ++
                         " 2>&1; echo \"exit=$?\""),
            case string:find(Out, "exit=0") of
                nomatch -> missing(["cannot build the OTP ", integer_to_list(Release),
                                    " root: ", Out]);
                _ -> {ok, {filename:join(Scripts, "otp-run.sh"), [Suite, "erl"]}}
            end
    end.

%% The project's top folder: the first one above the loaded beamdiag
%% modules that holds scripts/otp-run.sh.
top() ->
    top(filename:dirname(code:which(beamdiag))).

top("/") ->
    error(no_project_folder);
top(Dir) ->
    case filelib:is_regular(filename:join([Dir, "scripts", "otp-run.sh"])) of
        true -> Dir;
        false -> top(filename:dirname(Dir))
    end.

%% Starts a node on the given OTP release with OTP's `peer' over standard
%% I/O (it dies with the test): `{ok, Peer, Node}' or a skip. Opts go to
%% `peer:start/1' (`args', `name'...).
%% Runs Fun(Peer, Node) with a node of that release (start_node/2), which
%% is stopped afterwards whatever happens; when the node cannot be started,
%% what `missing/1' returns (a skip, or a failure in CI).
with_node(Release, Opts, Fun) ->
    case start_node(Release, Opts) of
        {ok, Peer, Node} ->
            try
                Fun(Peer, Node)
            after
                catch peer:stop(Peer)
            end;
        Skip ->
            Skip
    end.

%% Evaluates Erlang expressions given as text on a peer node (code that
%% then runs on that node's OTP, whatever this one is): their value.
eval(Peer, Text) ->
    {ok, Tokens, _} = erl_scan:string(Text),
    {ok, Exprs} = erl_parse:parse_exprs(Tokens),
    {value, Value, _} = peer:call(Peer, erl_eval, exprs, [Exprs, []]),
    Value.

start_node(Release, Opts) ->
    case otp_exec(Release) of
        {ok, Exec} ->
            Name = maps:get(name, Opts, list_to_atom(lists:concat(
                       ["beamdiag_otp", Release, "_", erlang:unique_integer([positive])]))),
            peer:start(maps:merge(#{name => Name, connection => standard_io, exec => Exec,
                                    wait_boot => 60000}, Opts#{name => Name}));
        Other ->
            Other
    end.

%% Starts many small nodes of this OTP side by side (Batch at a time), each
%% over standard I/O (it dies with the test) with these extra arguments:
%% [{Peer, Node}] in the order of the names. A node that fails to start
%% stops the others and fails the test.
start_peers(Names, Args, Batch) ->
    start_peers(Names, Args, Batch, []).

start_peers([], _Args, _Batch, Acc) ->
    Acc;
start_peers(Names, Args, Batch, Acc) ->
    {Now, Later} = lists:split(min(Batch, length(Names)), Names),
    Self = self(),
    Pids = [spawn(fun() ->
                      Self ! {self(), catch peer:start(#{name => N, args => Args,
                                                         connection => standard_io,
                                                         wait_boot => 120000})}
                  end) || N <- Now],
    Started = [receive {P, R} -> R end || P <- Pids],
    Ok = [{P, N} || {ok, P, N} <- Started],
    case length(Ok) =:= length(Now) of
        true ->
            start_peers(Later, Args, Batch, Acc ++ Ok);
        false ->
            stop_peers(Acc ++ Ok),
            error({peers_not_started, [R || R <- Started, element(1, R) =/= ok]})
    end.

%% Stops the nodes start_peers/3 started, and kills with kill -9 any that
%% did not stop (a stuck node ignores a polite stop).
stop_peers(Peers) ->
    OsPids = [catch peer:call(P, os, getpid, [], 2000) || {P, _} <- Peers],
    _ = [catch peer:stop(P) || {P, _} <- Peers],
    _ = [os:cmd("kill -9 " ++ Pid ++ " 2>/dev/null") || Pid <- OsPids, is_list(Pid)],
    ok.
