%%% @doc Helpers shared by the Common Test suites and the EUnit tests, each
%%% kind in one place: the project's folders and fixtures (files, folders,
%%% terms, recorded captures), the built escript, nodes of any OTP release
%%% (started, and killed with SIGKILL when they do not stop), lab nodes,
%%% programs run through ports (their whole output, or until a line
%%% shows), the CLI run in process with its output captured, waiting on a
%%% condition (in milliseconds, with or without a value), the check that
%%% nothing of beamdiag stays on a target and whether msacc is on there,
%%% figures read straight from a capture's raw counters, and the skip a
%%% starved host gets.
-module(beamdiag_test_lib).

-include_lib("stdlib/include/assert.hrl").

-export([perf_usable/0, retry_on_loaded_host/3, tries_on_loaded_host/2, retried/2, host_cpu/0, host_busy_since/1, missing/1, fixture/1, fixture_dir/1, fixture_term/1, fixture_capture/1, top/0,
         script/1, escript/0, otp_exec/1, otp_root/1]).
-export([start_node/2, stop_node/1, with_node/3, eval/2, os_pid_alive/1, kill_os_node/1]).
-export([start_peers/3, stop_peers/1]).
-export([start_lab/2, stop_lab/1, case_lab/3, end_case_lab/1, release_config/2]).
-export([lab_ledger/2, held_schedulers/2, lab_ping/1, lab_cli/2]).
-export([held_scheduler/0, held_scheduler/1, release/1, hold_begun/1, bound/2, in_hold/3]).
-export([run_exe/3, read_port/2, await_output/3, sh/1, sh/2]).
-export([capture_io/0, collect_io/0, cli/1]).
-export([wait_until/2, await/2, poll/2, on_time/2, within/2]).
-export([agent_gone/1, agent_gone/2, lab_lost/2, beamdiag_modules/1, msacc_on/1, memory_findings/1]).
-export([sched_stat/1, sched_stat/2, sched_wait_since/1, dirty_starved/2]).
-export([read_capture/1, raw_shares/1, raw_threads/2, raw_host/1, raw_msacc/3, starved/2, not_produced/2, png_colours/1, sentence/1]).

%% How far into a scheduler's hold a timed call may begin, and on how many
%% holds it is tried (in_hold/3).
-define(HOLD_LATE_MS, 60).
-define(HOLD_TRIES, 5).

%%%===================================================================
%%% Folders, fixtures, the escript
%%%===================================================================

%% @doc A tool the suite needs is missing: skipped on a developer's
%% machine, a failure in CI, where the set-up must have installed it.
-spec missing(iodata()) -> {skip, iodata()}.
missing(Why) ->
    case os:getenv("CI") of
        "true" -> ct:fail(["CI must install what this suite needs: " | Why]);
        _ -> {skip, Why}
    end.

%% @doc A file under test/fixtures, found from where the beamdiag modules
%% were loaded, whatever directory the suite runs in.
-spec fixture(file:filename()) -> file:filename().
fixture(Rel) ->
    fixture(Rel, fun filelib:is_regular/1).

%% @doc A folder under test/fixtures, found as `fixture/1' finds a file.
-spec fixture_dir(file:filename()) -> file:filename().
fixture_dir(Rel) ->
    fixture(Rel, fun filelib:is_dir/1).

fixture(Rel, Is) ->
    F = filename:join([top(), "test", "fixtures", Rel]),
    case Is(F) of
        true -> F;
        false -> error({no_fixture, Rel})
    end.

%% @doc The one term a fixture file holds (file:consult/1).
-spec fixture_term(file:filename()) -> term().
fixture_term(Rel) ->
    {ok, [T]} = file:consult(fixture(Rel)),
    T.

%% @doc A capture recorded from a real node, test/fixtures/captures/NAME.capture.
-spec fixture_capture(string()) -> map().
fixture_capture(Name) ->
    fixture_term(filename:join("captures", Name ++ ".capture")).

%% @doc The project's top folder: the first one above the loaded beamdiag
%% modules that holds scripts/otp-run.sh (rebar3 copies or links the
%% sources under _build; the scripts stay at the top).
-spec top() -> file:filename().
top() ->
    top(filename:dirname(code:which(beamdiag))).

top("/") ->
    error(no_project_folder);
top(Dir) ->
    case filelib:is_regular(filename:join([Dir, "scripts", "otp-run.sh"])) of
        true -> Dir;
        false -> top(filename:dirname(Dir))
    end.

%% @doc A script of the project's scripts/ folder.
-spec script(string()) -> file:filename().
script(Name) ->
    filename:join([top(), "scripts", Name]).

%% @doc The built escript (`_build/default/bin/beamdiag' at the top):
%% `{ok, Path}', or `error' when it has not been built.
-spec escript() -> {ok, file:filename()} | error.
escript() ->
    E = filename:join([top(), "_build", "default", "bin", "beamdiag"]),
    case filelib:is_regular(E) of
        true -> {ok, E};
        false -> error
    end.

%% @doc The `exec' option of OTP's `peer' that starts `erl' on another OTP
%% release, in a Debian root of its own (scripts/otp-root.sh builds and
%% caches it; scripts/otp-run.sh enters it): 27 is Debian trixie's, 29 is
%% sid's. The running release is this machine's own `erl'. `{ok, {Exe,
%% Args}}', or what `missing/1' returns when the root cannot be built.
-spec otp_exec(pos_integer()) -> {ok, {file:filename(), [string()]}} | {skip, iodata()}.
otp_exec(Release) when is_integer(Release) ->
    case Release =:= list_to_integer(erlang:system_info(otp_release)) of
        true ->
            {ok, {os:find_executable("erl"), []}};
        false ->
            Suite = suite_of(Release),
            case otp_root(Release) of
                {ok, _} -> {ok, {script("otp-run.sh"), [Suite, "erl"]}};
                {error, Out} -> missing(["cannot build the OTP ", integer_to_list(Release),
                                         " root: ", Out])
            end
    end.

%% @doc The folder of the Debian root that holds this OTP release (built
%% and cached by scripts/otp-root.sh on its first use): `{ok, Dir}' or
%% `{error, Output}'.
-spec otp_root(27 | 29) -> {ok, file:filename()} | {error, string()}.
otp_root(Release) ->
    %% The first build (debootstrap) takes minutes: it is waited for, as
    %% two builds of one root must never run at once.
    {Code, Out} = sh([script("otp-root.sh"), " ", suite_of(Release), " 2>/dev/null"], 3600000),
    case Code of
        0 -> {ok, string:trim(lists:last(string:split(string:trim(binary_to_list(Out)), "\n",
                                                     all)))};
        _ -> {error, binary_to_list(Out)}
    end.

suite_of(27) -> "trixie";
suite_of(29) -> "sid".

%%%===================================================================
%%% Nodes
%%%===================================================================

%% @doc Starts a node on the given OTP release with OTP's `peer' over
%% standard I/O (it dies with the test): `{ok, Peer, Node}' or a skip.
%% Its name holds this VM's OS pid: the two lanes of scripts/test-run.sh
%% are two Common Test VMs, whose unique integers repeat each other's.
%% Opts go to `peer:start/1' (`args', `name'...). Its OS pid is kept for
%% `stop_node/1', which kills it with SIGKILL if it does not stop.
-spec start_node(pos_integer(), map()) -> {ok, pid(), node()} | {skip, iodata()} | {error, term()}.
start_node(Release, Opts) ->
    case otp_exec(Release) of
        {ok, Exec} ->
            Name = maps:get(name, Opts, list_to_atom(lists:concat(
                       ["beamdiag_otp", Release, "_", os:getpid(), "_", erlang:unique_integer([positive])]))),
            case peer:start(maps:merge(#{name => Name, connection => standard_io, exec => Exec,
                                         wait_boot => 60000}, Opts#{name => Name})) of
                {ok, Peer, Node} ->
                    remember(Peer, peer:call(Peer, os, getpid, [], 30000)),
                    {ok, Peer, Node};
                Error ->
                    Error
            end;
        Other ->
            Other
    end.

%% @doc Stops a node started by `start_node/2' (or any peer): OTP's stop
%% first, then SIGKILL to its OS process if it is still there (a stuck
%% node ignores the polite way).
-spec stop_node(pid()) -> ok.
stop_node(Peer) ->
    OsPid = case persistent_term:get({?MODULE, Peer}, undefined) of
                undefined -> catch peer:call(Peer, os, getpid, [], 2000);
                P -> P
            end,
    bounded(fun() -> catch peer:stop(Peer) end, 15000),
    forget(Peer, OsPid).

%% @doc Runs Fun(Peer, Node) with a node of that release (start_node/2),
%% which is stopped afterwards whatever happens (stop_node/1); when the
%% node cannot be started, what `missing/1' returns (a skip, or a failure
%% in CI). The caller returns that skip: it is the case's result.
-spec with_node(pos_integer(), map(), fun((pid(), node()) -> Result)) -> Result | {skip, iodata()}.
with_node(Release, Opts, Fun) ->
    case start_node(Release, Opts) of
        {ok, Peer, Node} ->
            try
                Fun(Peer, Node)
            after
                stop_node(Peer)
            end;
        {skip, _} = Skip ->
            Skip;
        {error, Why} ->
            ct:fail({node_start, Release, Why})
    end.

%% @doc Evaluates Erlang expressions given as text on a peer node (code
%% that then runs on that node's OTP, whatever this one is): their value.
-spec eval(pid(), string()) -> term().
eval(Peer, Text) ->
    {ok, Tokens, _} = erl_scan:string(Text),
    {ok, Exprs} = erl_parse:parse_exprs(Tokens),
    {value, Value, _} = peer:call(Peer, erl_eval, exprs, [Exprs, []]),
    Value.

%% @doc Whether an OS process of this pid exists.
-spec os_pid_alive(string() | integer()) -> boolean().
os_pid_alive(OsPid) ->
    filelib:is_dir(lists:concat(["/proc/", OsPid])).

%% @doc Starts a lab scenario (beamdiag_lab:start/2) and keeps its OS pid
%% for `stop_lab/1'.
-spec start_lab(atom() | map(), map()) -> {ok, map()} | {error, term()}.
start_lab(Scenario, Opts) ->
    case beamdiag_lab:start(Scenario, Opts) of
        {ok, Lab = #{peer := Peer}} ->
            remember(Peer, catch peer:call(Peer, os, getpid, [], 30000)),
            {ok, Lab};
        Error ->
            Error
    end.

%% @doc Stops a lab (beamdiag_lab:stop/1: its workload, competitor and
%% cgroup), then SIGKILL to the node if it is still there.
-spec stop_lab(map()) -> ok.
stop_lab(Lab = #{peer := Peer}) ->
    OsPid = persistent_term:get({?MODULE, Peer}, undefined),
    bounded(fun() -> beamdiag_lab:stop(Lab) end, 30000),
    forget(Peer, OsPid).

%% @doc A case's lab (init_per_testcase): the scenario started with these
%% options, in the case's config as `lab'.
-spec case_lab(atom() | map(), map(), list()) -> list().
case_lab(Scenario, Opts, Config) ->
    {ok, Lab} = start_lab(Scenario, Opts),
    [{lab, Lab} | Config].

%% @doc Stops the case's lab, if it has one (end_per_testcase).
-spec end_case_lab(list()) -> ok.
end_case_lab(Config) ->
    case proplists:get_value(lab, Config) of
        undefined -> ok;
        Lab -> stop_lab(Lab)
    end.

%% @doc The ledger of a lab node's threads over Ms milliseconds, read
%% from the host (beamdiag_host_view), the node not asked.
-spec lab_ledger(map(), pos_integer()) -> map().
lab_ledger(Lab, Ms) ->
    S = beamdiag_host_view:start(list_to_integer(maps:get(os_pid, Lab)), #{}),
    timer:sleep(Ms),
    Samples = beamdiag_host_view:stop(S),
    beamdiag_ledger:build(#{samples => Samples, settings => beamdiag_host_view:settings(Samples)}).

%% @doc The raw signal of a held scheduler, read from the host 2 s at a
%% time until it shows, for Ms milliseconds at most: the names of the
%% normal scheduler threads that wanted a CPU (ran, or waited for one) 90%
%% of the 2 s or more, 90% of their CPU time in user mode, and slept at
%% most twice; each reading is logged with every scheduler thread's
%% figures. A lab node's NIF can take a second or two after its start to
%% hold its thread: CI once read none in the first 2 s.
-spec held_schedulers(map(), pos_integer()) -> [binary()].
held_schedulers(Lab, Ms) ->
    Read = fun() ->
                   L = lab_ledger(Lab, 2000),
                   W = maps:get(window_s, L),
                   Seen = [{Name, (On + Q) / W, U / max(1.0e-9, On), V}
                           || #{type := scheduler, name := Name, on_cpu := On, runq := Q,
                                user := U, nvcsw := V} <- maps:get(threads, L)],
                   ct:pal("scheduler threads (name, share of the window wanting a CPU, share "
                          "of it in user mode, voluntary switches): ~p", [Seen]),
                   case [N || {N, Want, User, V} <- Seen, Want >= 0.9, User >= 0.9, V =< 2] of
                       [] -> {false, []};
                       Held -> {true, Held}
                   end
           end,
    {_, Held} = poll(Read, Ms),
    ct:pal("held scheduler threads: ~p", [Held]),
    Held.

%% @doc A scheduler of this VM held as a NIF would hold it: a process
%% bound to scheduler 1 that sleeps in the emulator 800 ms at a time
%% (erts_debug's `sleep', allowed here), 1 ms apart, and the `atomics' in
%% which it writes when its latest hold began (monotonic ms) just before
%% each. The caller kills it.
-spec held_scheduler() -> {pid(), atomics:atomics_ref()}.
held_scheduler() ->
    held_scheduler(fun() -> none end).

%% @doc As `held_scheduler/0', the process first running Before and
%% keeping its result on its heap (reductions and memory of its own); it
%% stops holding, and only waits, once `release/1' is called.
-spec held_scheduler(fun(() -> term())) -> {pid(), atomics:atomics_ref()}.
held_scheduler(Before) ->
    _ = erts_debug:set_internal_state(available_internal_state, true),
    Clock = atomics:new(2, []),
    Held = bound(1, fun() ->
                        Kept = Before(),
                        hold(Clock, Kept)
                    end),
    {Held, Clock}.

hold(Clock, Kept) ->
    case atomics:get(Clock, 2) of
        0 ->
            ok = atomics:put(Clock, 1, erlang:monotonic_time(millisecond)),
            _ = erts_debug:set_internal_state(sleep, 800),
            receive after 1 -> ok end,
            hold(Clock, Kept);
        _ ->
            receive stop -> Kept end
    end.

%% @doc The process of `held_scheduler/0,1' holds no more once its
%% current hold ends.
-spec release(atomics:atomics_ref()) -> ok.
release(Clock) ->
    atomics:put(Clock, 2, 1).

%% @doc Returns once a new hold of `held_scheduler/0' has begun (within a
%% millisecond or two of it).
-spec hold_begun(atomics:atomics_ref()) -> ok.
hold_begun(Clock) ->
    hold_begun(Clock, atomics:get(Clock, 1)).

hold_begun(Clock, Last) ->
    case atomics:get(Clock, 1) of
        Last -> timer:sleep(1), hold_begun(Clock, Last);
        _ -> ok
    end.

%% @doc F spawned bound to scheduler Sched (the `scheduler' spawn option,
%% as the agent's sampler uses it; through apply: it is not in
%% spawn_opt's documented type).
-spec bound(pos_integer(), fun(() -> term())) -> pid().
bound(Sched, F) ->
    beamdiag_agent_spawn:bound(Sched, F, []).

%% @doc F run on scheduler 2 just as a hold of `held_scheduler/0' begins,
%% timed by the holder's clock: when F began and returned (ms after the
%% hold began; the hold ends 800 ms after it began) and whether the same
%% hold was still on when F returned. A start more than ?HOLD_LATE_MS
%% into the hold (the host kept the test's process from running: measured
%% by the test's own clock) is tried again on a later hold, at most
%% ?HOLD_TRIES times, each retry recorded beside the run's skips as Name's.
-spec in_hold(atomics:atomics_ref(), fun(() -> term()), {module(), atom()}) ->
    #{result := term(), start_ms := integer(), end_ms := integer(), same_hold := boolean(),
      tries := pos_integer()}.
in_hold(Clock, F, Name = {Mod, Case}) ->
    Self = self(),
    Ref = make_ref(),
    _ = bound(2, fun() -> Self ! {Ref, in_hold(Clock, F, 1, [])} end),
    receive
        {Ref, {late, Starts}} ->
            error({host_kept_the_test_from_running, Name,
                   {began_ms_into_each_hold, Starts}});
        {Ref, R = #{tries := Tries, late := Starts}} ->
            _ = [beamdiag_cth:record(Mod, Case,
                                     io_lib:format("retried: began ~b ms into the scheduler's "
                                                   "hold, past ~b ms", [S, ?HOLD_LATE_MS]))
                 || Tries > 1, S <- Starts],
            maps:remove(late, R)
    after 60000 ->
        error({in_hold_no_answer, Name})
    end.

in_hold(_Clock, _F, Try, Late) when Try > ?HOLD_TRIES ->
    {late, lists:reverse(Late)};
in_hold(Clock, F, Try, Late) ->
    ok = hold_begun(Clock),
    Began = atomics:get(Clock, 1),
    timer:sleep(5),
    case erlang:monotonic_time(millisecond) - Began of
        Start when Start > ?HOLD_LATE_MS ->
            in_hold(Clock, F, Try + 1, [Start | Late]);
        Start ->
            R = F(),
            End = erlang:monotonic_time(millisecond) - Began,
            #{result => R, start_ms => Start, end_ms => End,
              same_hold => atomics:get(Clock, 1) =:= Began, tries => Try,
              late => lists:reverse(Late)}
    end.

%% @doc `net_adm:ping/1' of a lab node from this VM (made a hidden node
%% first if it is not distributed), then disconnected: pong or pang.
-spec lab_ping(map()) -> pong | pang.
lab_ping(Lab) ->
    _ = case node() of
            nonode@nohost ->
                net_kernel:start(list_to_atom("beamdiag_ct_" ++ os:getpid()),
                                 #{name_domain => shortnames, hidden => true});
            _ -> ok
        end,
    Node = beamdiag_lab:node(Lab),
    true = erlang:set_cookie(Node, beamdiag_lab:cookie(Lab)),
    R = net_adm:ping(Node),
    _ = erlang:disconnect_node(Node),
    R.

%% @doc The CLI in this VM (`cli/1') with the cookie in BEAMDIAG_COOKIE
%% (none when undefined), timed: `{ExitCode, Stdout, Stderr, Milliseconds}'.
-spec lab_cli([string()], atom()) -> {integer(), binary(), binary(), non_neg_integer()}.
lab_cli(Args, Cookie) ->
    case Cookie of
        undefined -> os:unsetenv("BEAMDIAG_COOKIE");
        _ -> os:putenv("BEAMDIAG_COOKIE", atom_to_list(Cookie))
    end,
    T0 = erlang:monotonic_time(millisecond),
    {Code, Out, Err} = cli(Args),
    Ms = erlang:monotonic_time(millisecond) - T0,
    os:unsetenv("BEAMDIAG_COOKIE"),
    {Code, Out, Err, Ms}.

%% @doc A group's OTP release (init_per_group): `release' and `exec' in
%% the config, or the skip `otp_exec/1' gives.
-spec release_config(pos_integer(), list()) -> list() | {skip, iodata()}.
release_config(Release, Config) ->
    case otp_exec(Release) of
        {ok, Exec} -> [{release, Release}, {exec, Exec} | Config];
        Skip -> Skip
    end.

%% Runs F in a process of its own for at most Ms milliseconds.
bounded(F, Ms) ->
    {Pid, Ref} = spawn_monitor(F),
    receive {'DOWN', Ref, process, Pid, _} -> ok
    after Ms -> exit(Pid, kill)
    end.

%% Kills the node's OS process if it is still there, and forgets it.
forget(Peer, OsPid) ->
    kill_os_node(OsPid),
    _ = persistent_term:erase({?MODULE, Peer}),
    ok.

%% Kills a node's OS process if it is still there (kill -9), and removes
%% the perf map and jitdump that a node started with +JPperf left in /tmp
%% (6 to 16 MB each, never removed by the VM; a node in an OTP root wrote
%% them into the root's own /tmp, gone with it).
kill_os_node(OsPid) when is_integer(OsPid) ->
    kill_os_node(integer_to_list(OsPid));
kill_os_node(OsPid) ->
    kill9(OsPid),
    _ = [file:delete(F) || is_list(OsPid),
                           F <- ["/tmp/perf-" ++ OsPid ++ ".map", "/tmp/jit-" ++ OsPid ++ ".dump"]],
    ok.

remember(Peer, OsPid) when is_list(OsPid) ->
    persistent_term:put({?MODULE, Peer}, OsPid);
remember(_, _) ->
    ok.

kill9(OsPid) when is_list(OsPid) ->
    case os_pid_alive(OsPid) of
        true -> _ = os:cmd("kill -9 " ++ OsPid), ok;
        false -> ok
    end;
kill9(_) ->
    ok.

%%%===================================================================
%%% Programs and ports
%%%===================================================================

%% @doc Runs a program with these arguments and environment, its standard
%% error going to a file of its own, for at most two minutes:
%% `{ExitCode, Stdout, Stderr}' with Stdout a binary and Stderr a string.
-spec run_exe(file:filename(), [string()], [{string(), string()}]) ->
          {integer(), binary(), string()}.
run_exe(Exe, Args, Env) ->
    Err = filename:join("/tmp", "beamdiag_test_err_" ++ os:getpid() ++ "_" ++
                            integer_to_list(erlang:unique_integer([positive]))),
    Port = open_port({spawn_executable, "/bin/sh"},
                     [{args, ["-c", "exec \"$0\" \"$@\" 2>\"$BEAMDIAG_TEST_ERR\"", Exe | Args]},
                      {env, [{"BEAMDIAG_TEST_ERR", Err} | Env]}, exit_status, binary, hide]),
    {Code, Out} = read_port(Port, 120000),
    {ok, E} = file:read_file(Err),
    ok = file:delete(Err),
    {Code, Out, unicode:characters_to_list(E)}.

%% @doc The output of a port until it exits, for at most Ms milliseconds
%% (the port is closed and the call fails after that): `{ExitCode,
%% Output}'.
-spec read_port(port(), non_neg_integer()) -> {integer(), binary()}.
read_port(Port, Ms) ->
    read_port(Port, <<>>, erlang:monotonic_time(millisecond) + Ms).

read_port(Port, Acc, Deadline) ->
    receive
        {Port, {data, D}} when is_binary(D) -> read_port(Port, <<Acc/binary, D/binary>>, Deadline);
        {Port, {data, D}} -> read_port(Port, <<Acc/binary, (iolist_to_binary(D))/binary>>, Deadline);
        {Port, {exit_status, S}} -> {S, Acc}
    after max(0, Deadline - erlang:monotonic_time(millisecond)) ->
        %% Closing the port does not end the program: it is killed.
        case erlang:port_info(Port, os_pid) of
            {os_pid, OsPid} -> _ = os:cmd("kill -9 " ++ integer_to_list(OsPid));
            undefined -> ok
        end,
        catch port_close(Port),
        error({port_timeout, Acc})
    end.

%% @doc Reads a port's output until it matches the regular expression Re,
%% for at most Ms milliseconds: the expression's captured groups (strings)
%% and all the output read so far. The port is left open; its exit, or
%% the deadline, fails the call with the output read.
-spec await_output(port(), iodata(), non_neg_integer()) -> {[string()], binary()}.
await_output(Port, Re, Ms) ->
    await_output(Port, Re, <<>>, erlang:monotonic_time(millisecond) + Ms).

await_output(Port, Re, Acc, Deadline) ->
    case re:run(Acc, Re, [{capture, all_but_first, list}]) of
        {match, Groups} ->
            {Groups, Acc};
        nomatch ->
            receive
                {Port, {data, D}} ->
                    await_output(Port, Re, <<Acc/binary, (iolist_to_binary(D))/binary>>, Deadline);
                {Port, {exit_status, S}} ->
                    error({port_exited, S, Acc})
            after max(0, Deadline - erlang:monotonic_time(millisecond)) ->
                error({port_silent, Re, Acc})
            end
    end.

%% @doc A shell command (iodata), its standard error with its output, for
%% at most three minutes: `{ExitCode, Output}'.
-spec sh(iodata()) -> {integer(), binary()}.
sh(Cmd) ->
    sh(Cmd, 180000).

%% @doc `sh/1' for at most Ms milliseconds.
-spec sh(iodata(), non_neg_integer()) -> {integer(), binary()}.
sh(Cmd, Ms) ->
    Port = open_port({spawn_executable, "/bin/sh"},
                     [{args, ["-c", unicode:characters_to_list([Cmd, " 2>&1"])]},
                      exit_status, binary, hide]),
    read_port(Port, Ms).

%%%===================================================================
%%% The CLI's output, captured in process
%%%===================================================================

%% @doc The IO map beamdiag_cli:run/2 and the command modules take, sending
%% what they print to the calling process; `collect_io/0' reads it back.
-spec capture_io() -> map().
capture_io() ->
    Self = self(),
    #{out => fun(D) -> Self ! {?MODULE, out, text(D)}, ok end,
      err => fun(D) -> Self ! {?MODULE, err, text(D)}, ok end,
      colour => false, tty => false}.

%% What the CLI writes must be text: anything else fails the write, in
%% the writer (as `io:put_chars/2' would).
text(D) ->
    case unicode:characters_to_binary(D) of
        B when is_binary(B) -> B;
        Bad -> error({not_text, Bad, D})
    end.

%% @doc What the IO of `capture_io/0' printed so far: `{Stdout, Stderr}'.
-spec collect_io() -> {binary(), binary()}.
collect_io() ->
    collect_io(<<>>, <<>>).

collect_io(Out, Err) ->
    receive
        {?MODULE, out, D} -> collect_io(<<Out/binary, D/binary>>, Err);
        {?MODULE, err, D} -> collect_io(Out, <<Err/binary, D/binary>>)
    after 0 -> {Out, Err}
    end.

%% @doc `beamdiag_cli:run/2' in this VM with `capture_io/0': `{ExitCode,
%% Stdout, Stderr}'.
-spec cli([string()]) -> {integer(), binary(), binary()}.
cli(Args) ->
    _ = collect_io(),
    Code = beamdiag_cli:run(Args, capture_io()),
    {Out, Err} = collect_io(),
    {Code, Out, Err}.

%%%===================================================================
%%% Waiting
%%%===================================================================

%% @doc Calls F every 50 ms until it returns true, for at most Ms
%% milliseconds: `ok', or `timeout' (F is called a last time at the
%% deadline).
-spec wait_until(fun(() -> boolean()), non_neg_integer()) -> ok | timeout.
wait_until(F, Ms) ->
    Poll = fun() ->
        case F() of
            true -> {true, ok};
            false -> {false, false}
        end
    end,
    case poll(Poll, Ms) of
        {ok, ok} -> ok;
        {timeout, false} -> timeout
    end.

%% @doc `wait_until/2' for a condition that has a value: F returns `{true,
%% Value}' when it holds and `{false, Seen}' when not. `{ok, Value}', or
%% `{timeout, Seen}' with what F saw last (at the deadline), for the
%% caller's failure to show.
-spec poll(fun(() -> {true, T} | {false, S}), non_neg_integer()) -> {ok, T} | {timeout, S}.
poll(F, Ms) ->
    poll_loop(F, erlang:monotonic_time(millisecond) + Ms).

poll_loop(F, Deadline) ->
    case F() of
        {true, Value} ->
            {ok, Value};
        {false, Seen} ->
            case erlang:monotonic_time(millisecond) >= Deadline of
                true -> {timeout, Seen};
                false -> timer:sleep(50), poll_loop(F, Deadline)
            end
    end.

%% @doc A report ready within the window plus 2 s of the call (Took ms,
%% start-up included); on a host whose load is beyond four times its CPUs
%% the figure is logged and the latency check skipped, with the numbers.
-spec on_time(non_neg_integer(), pos_integer()) -> ok.
on_time(Took, WindowS) ->
    within(Took, (WindowS + 2) * 1000).

%% @doc Took ms at most Limit ms; past it on a host loaded beyond four
%% runnable threads a CPU, a counted starved skip (CI fails past one),
%% never a pass.
-spec within(non_neg_integer(), pos_integer()) -> ok.
within(Took, Limit) ->
    {ok, L} = file:read_file("/proc/loadavg"),
    Load = binary_to_float(hd(binary:split(L, <<" ">>))),
    Cores = case erlang:system_info(logical_processors_available) of
                unknown -> 1;
                N -> N
            end,
    ct:pal("report in ~b ms (limit ~b); host load ~.1f on ~b CPUs", [Took, Limit, Load, Cores]),
    case Took =< Limit of
        true ->
            ok;
        false when Load > 4 * Cores ->
            starved("report in ~b ms, past ~b ms: host load ~.1f on ~b CPUs",
                    [Took, Limit, Load, Cores]);
        false ->
            ?assert(Took =< Limit)
    end.

%% @doc `wait_until/2' that fails the case when the condition does not hold
%% within Ms milliseconds.
-spec await(fun(() -> boolean()), non_neg_integer()) -> ok.
await(F, Ms) ->
    case wait_until(F, Ms) of
        ok -> ok;
        timeout -> error({condition_not_met_within_ms, Ms})
    end.

%%%===================================================================
%%% Nothing left on the target
%%%===================================================================

%% @doc No agent module and no flag of beamdiag left on the node (a peer,
%% a lab, or a node name), waited for up to 35 s (an agent whose last word
%% came late ends by its own deadline, at most 30 s past the window);
%% msacc, off before the session, is off.
%% @doc The memory findings among Findings, at any severity: those of the
%% catalogue's memory area, and the host's memory nearly used up. A
%% healthy node gets none.
-spec memory_findings([map()]) -> [atom()].
memory_findings(Findings) ->
    [Id || #{id := Id} <- Findings,
           Id =:= host_memory_low orelse maps:get(area, beamdiag_catalogue:entry(Id)) =:= memory].

-spec agent_gone(pid() | map() | node()) -> ok.
agent_gone(Target) ->
    agent_gone(Target, 35000).

-spec agent_gone(pid() | map() | node(), non_neg_integer()) -> ok.
agent_gone(Lab = #{peer := Peer}, Ms) ->
    try
        agent_gone(Peer, Ms)
    catch
        exit:Why -> ct:fail(lab_lost(Lab, Why))
    end;
agent_gone(Target, Ms) ->
    Gone = fun() ->
        beamdiag_modules(Target) =:= [] andalso
            call(Target, erlang, statistics, [scheduler_wall_time]) =:= undefined
    end,
    case wait_until(Gone, Ms) of
        ok -> ok;
        timeout -> ?assertEqual({[], undefined},
                                {beamdiag_modules(Target),
                                 call(Target, erlang, statistics, [scheduler_wall_time])})
    end,
    ?assertNot(call(Target, erlang, system_flag, [microstate_accounting, false])),
    ok.

%% @doc Why a lab node stopped answering, read apart from beamdiag: Why
%% (the call's exit), whether its OS process is still there, and the
%% kernel's last words on a fault or a kill of a VM thread (dmesg: a
%% crashed scheduler, the OOM killer).
-spec lab_lost(map(), term()) -> {lab_node_lost, map()}.
lab_lost(Lab, Why) ->
    OsPid = maps:get(os_pid, Lab, undefined),
    Kernel = [L || L <- string:split(os:cmd("dmesg 2>/dev/null | tail -40"), "\n", all),
                   lists:any(fun(W) -> string:find(L, W) =/= nomatch end,
                             ["erts_", "beam", "segfault", "general protection", "Killed process",
                              "Out of memory"])],
    {lab_node_lost, #{why => Why, os_pid => OsPid,
                      alive => OsPid =/= undefined andalso os_pid_alive(OsPid),
                      kernel => Kernel}}.

%% @doc The modules of beamdiag loaded on the node, current or old code
%% (a module deleted but not purged is still there), but for the lab's own
%% workloads and the test fixtures shipped there on purpose.
-spec beamdiag_modules(pid() | map() | node()) -> [module()].
beamdiag_modules(Target) ->
    lists:usort([M || M <- [M || {M, _} <- call(Target, code, all_loaded, [])] ++
                           call(Target, erlang, loaded, []),
                      is_beamdiag(atom_to_list(M))]).

is_beamdiag("beamdiag") -> true;
is_beamdiag("beamdiag_lab" ++ _) -> false;
is_beamdiag("beamdiag_nif_thread") -> false;
is_beamdiag("beamdiag_profile_work") -> false;
is_beamdiag("beamdiag_" ++ _) -> true;
is_beamdiag(_) -> false.

%% @doc Whether microstate accounting is on on the node (a peer, a lab, or a
%% node name): its counters move over 30 ms. The flag is not touched
%% (erlang:statistics/1 returns counters whether it is on or off).
-spec msacc_on(pid() | map() | node()) -> boolean().
msacc_on(Target) ->
    A = msacc_sum(Target),
    timer:sleep(30),
    msacc_sum(Target) =/= A.

msacc_sum(Target) ->
    case call(Target, erlang, statistics, [microstate_accounting]) of
        L when is_list(L) -> lists:sum([lists:sum(maps:values(C)) || #{counters := C} <- L]);
        _ -> 0
    end.

call(#{peer := Peer}, M, F, A) ->
    call(Peer, M, F, A);
call(Peer, M, F, A) when is_pid(Peer) -> peer:call(Peer, M, F, A, 15000);
call(Node, M, F, A) when is_atom(Node) -> erpc:call(Node, M, F, A, 15000).

%%%===================================================================
%%% Raw figures, starvation, pictures, sentences
%%%===================================================================

%% @doc The normal schedulers' shares of their wall time over a capture,
%% from its raw counters only (the first and last samples' scheduler wall
%% time and per-thread schedstat), with no code of beamdiag: `busy'
%% (scheduler_wall_time active), `on_cpu' (thread run time), `runq'
%% (thread time runnable but waiting for a CPU), `spin' (on_cpu - busy,
%% at least 0), `blocked' (busy but neither on a CPU nor waiting for one:
%% in the kernel), `schedulers', `reductions_per_s' and `host_busy'.
-spec raw_shares(map()) -> #{atom() => number()}.
raw_shares(#{samples := Samples, settings := Settings}) ->
    N = maps:get(schedulers, Settings),
    First = hd(Samples),
    Last = lists:last(Samples),
    WallNs = erlang:convert_time_unit(maps:get(t, Last) - maps:get(t, First), native, nanosecond),
    %% Scheduler wall time over the first and last samples that hold it: a
    %% tick whose schedulers answered too late has none (`missing').
    Swt = fun(S) -> [{Id, A, T} || {Id, A, T} <- maps:get(swt, maps:get(vm, S)), Id =< N] end,
    {Active, Total} =
        case [S || S = #{vm := #{swt := L}} <- Samples, is_list(L)] of
            [SF | [_ | _] = SRest] ->
                Pairs = lists:zip(lists:sort(Swt(SF)), lists:sort(Swt(lists:last(SRest)))),
                {lists:sum([A1 - A0 || {{_, A0, _}, {_, A1, _}} <- Pairs]),
                 lists:sum([T1 - T0 || {{_, _, T0}, {_, _, T1}} <- Pairs])};
            _ ->
                {undefined, 0}
        end,
    Scheds = fun(S) -> maps:filter(fun(_, #{name := Name}) -> is_scheduler(normal, Name) end,
                                   maps:get(threads, S)) end,
    T0s = Scheds(First),
    T1s = Scheds(Last),
    Delta = fun(K) -> lists:sum([maps:get(K, T) - maps:get(K, maps:get(Tid, T0s))
                                 || {Tid, T} <- maps:to_list(T1s), maps:is_key(Tid, T0s)]) end,
    Wall = max(1, WallNs * N),
    Busy = case {Active, Total} of
               {undefined, _} -> undefined;
               {_, 0} -> 0.0;
               _ -> Active / Total
           end,
    OnCpu = Delta(run_ns) / Wall,
    Reds = maps:get(reductions, maps:get(vm, Last)) - maps:get(reductions, maps:get(vm, First)),
    Runq = Delta(wait_ns) / Wall,
    #{busy => Busy, on_cpu => OnCpu, runq => Runq,
      spin => spin(OnCpu, Busy), blocked => blocked(Busy, OnCpu, Runq), schedulers => N,
      reductions_per_s => Reds / max(1.0e-9, WallNs / 1.0e9),
      host_busy => host_busy(maps:get(host, First), maps:get(host, Last))}.

%% @doc The threads of a capture whose name matches Re (a regular
%% expression), from its raw counters only: summed over them between the
%% first and the last sample, `run_ns' (on a CPU), `wait_ns' (runnable,
%% waiting for one), `minflt', `majflt', their CPU time in clock ticks
%% (`ticks', utime plus stime), `n' (threads) and `wall_ns' (the capture's
%% span times n).
-spec raw_threads(map(), iodata()) -> #{atom() => number()}.
raw_threads(#{samples := Samples}, Re) ->
    First = hd(Samples),
    Last = lists:last(Samples),
    WallNs = erlang:convert_time_unit(maps:get(t, Last) - maps:get(t, First), native, nanosecond),
    Pick = fun(S) -> maps:filter(fun(_, #{name := Name}) -> re:run(Name, Re) =/= nomatch end,
                                 maps:get(threads, S)) end,
    T0s = Pick(First),
    Pairs = [{maps:get(Tid, T0s), T1} || {Tid, T1} <- maps:to_list(Pick(Last)), maps:is_key(Tid, T0s)],
    Delta = fun(K) -> lists:sum([maps:get(K, T1, 0) - maps:get(K, T0, 0) || {T0, T1} <- Pairs]) end,
    #{run_ns => Delta(run_ns), wait_ns => Delta(wait_ns), minflt => Delta(minflt),
      majflt => Delta(majflt), ticks => Delta(utime) + Delta(stime), n => length(Pairs),
      wall_ns => WallNs * length(Pairs)}.

%% @doc The host over a capture, from /proc/stat's counters and the node's
%% own process CPU time (the first and last samples): `ncpu', `busy' (the
%% share of the host's CPU time not idle), `cpus' (CPUs in use, all of the
%% host) and `node_cpus' (the node's threads' CPU time over the span).
-spec raw_host(map()) -> #{atom() => number()}.
raw_host(C = #{samples := Samples}) ->
    First = hd(Samples),
    Last = lists:last(Samples),
    WallS = erlang:convert_time_unit(maps:get(t, Last) - maps:get(t, First), native, nanosecond) / 1.0e9,
    #{ncpu := N} = maps:get(host, Last),
    Busy = host_busy(maps:get(host, First), maps:get(host, Last)),
    #{ticks := Ticks} = raw_threads(C, "."),
    %% USER_HZ: 100 clock ticks a second on every Linux.
    #{ncpu => N, busy => Busy, cpus => Busy * N, node_cpus => Ticks / 100 / max(1.0e-9, WallS)}.

%% @doc Microstate accounting's seconds in the States of the threads of
%% Type (`dirty_cpu_scheduler', ...) between the first and the last sample
%% that carry it, from the raw counters (perf_counter units).
-spec raw_msacc(map(), atom(), [atom()]) -> float().
raw_msacc(#{samples := Samples}, Type, States) ->
    case [M || #{vm := #{msacc := M = [_ | _]}} <- Samples] of
        [MA | Rest = [_ | _]] ->
            MB = lists:last(Rest),
            Sum = fun(M) -> lists:sum([maps:get(St, Cs, 0) || #{type := T, counters := Cs} <- M,
                                                              T =:= Type, St <- States]) end,
            (Sum(MB) - Sum(MA)) / erlang:convert_time_unit(1, second, perf_counter);
        _ ->
            0.0
    end.

%% The share of the host's CPU time not idle (nor waiting for I/O), from
%% /proc/stat's counters.
%% Spinning and blocked shares need scheduler wall time: `undefined'
%% (which fails any bound a test puts on it) when no two samples hold it.
spin(_OnCpu, undefined) -> undefined;
spin(OnCpu, Busy) -> max(0.0, OnCpu - Busy).

blocked(undefined, _OnCpu, _Runq) -> undefined;
blocked(Busy, OnCpu, Runq) -> max(0.0, Busy - OnCpu - Runq).

host_busy(#{cpu := C0}, #{cpu := C1}) ->
    D = maps:map(fun(K, V) -> V - maps:get(K, C0) end, C1),
    All = lists:sum([V || {K, V} <- maps:to_list(D), K =/= guest, K =/= guest_nice]),
    Idle = maps:get(idle, D) + maps:get(iowait, D, 0),
    case All of 0 -> 0.0; _ -> 1 - Idle / All end;
host_busy(_, _) ->
    0.0.

%% @doc The capture inside a file the CLI wrote with `--save', read by
%% hand from its documented frame (header line, length, CRC-32, external
%% term format with atoms as `{'$a', Name}'), not with beamdiag_capture.
-spec read_capture(file:filename()) -> map().
read_capture(File) ->
    {ok, Bin} = file:read_file(File),
    [<<"beamdiag-capture ", _/binary>>, Frame] = binary:split(Bin, <<"\n">>),
    <<Len:64, Crc:32, Body:Len/binary>> = Frame,
    ?assertEqual(Crc, erlang:crc32(Body)),
    #{body := #{capture := C}} = atoms(binary_to_term(Body)),
    C.

atoms({'$a', Name}) when is_binary(Name) -> binary_to_atom(Name);
atoms(L) when is_list(L) -> [atoms(E) || E <- L];
atoms(T) when is_tuple(T) -> list_to_tuple([atoms(E) || E <- tuple_to_list(T)]);
atoms(M) when is_map(M) -> maps:from_list([{atoms(K), atoms(V)} || {K, V} <- maps:to_list(M)]);
atoms(X) -> X.

%% @doc A node's normal scheduler threads as the kernel counts them, read
%% by the test itself from /proc/PID/task/*/{comm,schedstat} (no code of
%% beamdiag): per thread id, nanoseconds on a CPU and runnable waiting for
%% one, with the time of the reading. For `sched_wait_since/1'.
-spec sched_stat(string() | integer()) ->
    #{pid := string() | integer(), kind := normal | dirty_cpu, t := integer(),
      threads := #{binary() => {integer(), integer()}}}.
sched_stat(OsPid) ->
    sched_stat(OsPid, normal).

%% @doc As `sched_stat/1', for the node's normal scheduler threads or its
%% dirty CPU scheduler threads (`dirty_cpu').
-spec sched_stat(string() | integer(), normal | dirty_cpu) ->
    #{pid := string() | integer(), kind := normal | dirty_cpu, t := integer(),
      threads := #{binary() => {integer(), integer()}}}.
sched_stat(OsPid, Kind) ->
    Dir = lists:concat(["/proc/", OsPid, "/task"]),
    Tids = case file:list_dir(Dir) of
               {ok, L} -> L;
               {error, _} -> []
           end,
    Threads = maps:from_list(
                [{list_to_binary(Tid), {Run, Wait}}
                 || Tid <- Tids,
                    {ok, Comm} <- [file:read_file(filename:join([Dir, Tid, "comm"]))],
                    is_scheduler(Kind, string:trim(Comm)),
                    {ok, St} <- [file:read_file(filename:join([Dir, Tid, "schedstat"]))],
                    [Run, Wait | _] <- [[binary_to_integer(F)
                                         || F <- binary:split(St, [<<" ">>, <<"\n">>],
                                                              [global, trim_all])]]]),
    #{pid => OsPid, kind => Kind, t => erlang:monotonic_time(nanosecond), threads => Threads}.

%% @doc Since a `sched_stat/1,2' reading: the share of those
%% scheduler threads' wall time they waited runnable for a CPU
%% (`runq'), and on one (`on_cpu'), with the span in ms and the threads.
-spec sched_wait_since(#{pid := string() | integer(), kind := normal | dirty_cpu,
                          t := integer(), threads := map()}) ->
    #{atom() => number()}.
sched_wait_since(#{pid := OsPid, kind := Kind, t := T0, threads := Th0}) ->
    #{t := T1, threads := Th1} = sched_stat(OsPid, Kind),
    Pairs = [{A, B} || {Tid, B} <- maps:to_list(Th1), {ok, A} <- [maps:find(Tid, Th0)]],
    Wall = max(1, (T1 - T0) * length(Pairs)),
    #{runq => lists:sum([W1 - W0 || {{_, W0}, {_, W1}} <- Pairs]) / Wall,
      on_cpu => lists:sum([R1 - R0 || {{R0, _}, {R1, _}} <- Pairs]) / Wall,
      span_ms => (T1 - T0) div 1000000, threads => length(Pairs)}.

%% @doc dirty_cpu_gc was not named: a starved skip when the dirty CPU
%% scheduler threads waited for a CPU a quarter of the diagnosis's span or
%% more (a `sched_wait_since/1' reading of `sched_stat/2' with
%% `dirty_cpu', the test's own), else a failure with that reading. Ids:
%% the findings the diagnosis made.
-spec dirty_starved(#{atom() => number()}, [atom()]) -> no_return().
dirty_starved(#{runq := Runq, on_cpu := OnCpu, threads := N, span_ms := Span}, Ids) ->
    case Runq >= 0.25 of
        true ->
            starved("dirty_cpu_gc not named (findings ~p): the ~b dirty CPU scheduler threads "
                    "waited for a CPU ~.3f of ~b ms and ran ~.3f (read from /proc)",
                    [Ids, N, Runq, Span, OnCpu]);
        false ->
            ct:fail({dirty_cpu_gc_not_named, Ids, #{runq => Runq, on_cpu => OnCpu, threads => N,
                                                    span_ms => Span}})
    end.

%% Normal scheduler threads: "1_scheduler" (OTP 25, 26), "erts_sched_1"
%% (OTP 27 on); dirty CPU ones: "1_dirty_cpu_sch" (OTP 25, 26; the
%% kernel keeps 15 characters of a name, so "10_dirty_cpu_sc"),
%% "erts_dcpus_1" (OTP 27 on).
is_scheduler(normal, Name) ->
    re:run(Name, <<"^([0-9]+_scheduler|erts_sched_[0-9]+)$">>) =/= nomatch;
is_scheduler(dirty_cpu, Name) ->
    re:run(Name, <<"^([0-9]+_dirty_cpu_s|erts_dcpus_[0-9]+$)">>) =/= nomatch.

%% @doc The host could not give the pathology its CPUs: the case is
%% skipped (thrown, so it ends the case wherever it is called), with the
%% numbers that show it, never passed. The reason starts with "starved:",
%% which the run's hook (beamdiag_cth) counts: in CI more than one such
%% skip fails the run.
-spec starved(io:format(), [term()]) -> no_return().
starved(Fmt, Args) ->
    Why = lists:flatten(io_lib:format("starved: " ++ Fmt, Args)),
    ct:pal("~ts", [Why]),
    throw({skip, Why}).

%% @doc The host's CPU counters, read by the test from /proc/stat (the
%% first line): `#{all, idle}' in clock ticks, idle counting I/O wait.
-spec host_cpu() -> #{all := non_neg_integer(), idle := non_neg_integer()}.
host_cpu() ->
    {ok, B} = file:read_file("/proc/stat"),
    [<<"cpu">> | Fields] = binary:split(hd(binary:split(B, <<"\n">>)), <<" ">>, [global, trim_all]),
    [User, Nice, Sys, Idle, Iowait, Irq, Softirq, Steal | _] =
        [binary_to_integer(F) || F <- Fields] ++ [0, 0, 0, 0, 0, 0, 0, 0],
    #{all => User + Nice + Sys + Idle + Iowait + Irq + Softirq + Steal, idle => Idle + Iowait}.

%% @doc The share of the host's CPU time not idle since a `host_cpu/0'
%% reading (0.0 to 1.0).
-spec host_busy_since(#{all := non_neg_integer(), idle := non_neg_integer()}) -> float().
host_busy_since(#{all := A0, idle := I0}) ->
    #{all := A1, idle := I1} = host_cpu(),
    case A1 - A0 of
        0 -> 0.0;
        All -> 1 - (I1 - I0) / All
    end.

%% @doc Whether a case may measure again after a result its host spoiled
%% (a partial capture, lock data too late): only when the host's CPUs were
%% 0.85 busy or more since Cpu0 (`host_cpu/0', read by the test). A retry
%% allowed is recorded beside the run's skips ("retried:", listed at the
%% end of `make test') with its measured reason; on a host with CPU to
%% spare it is not, and the case fails on what it got.
-spec retry_on_loaded_host(#{all := non_neg_integer(), idle := non_neg_integer()},
                           io:format(), [term()]) -> boolean().
retry_on_loaded_host(Cpu0, Fmt, Args) ->
    Busy = host_busy_since(Cpu0),
    Why = lists:flatten(io_lib:format(Fmt, Args)),
    case Busy >= 0.85 of
        true ->
            retried("~ts; the host's CPUs ~.2f busy", [Why, Busy]),
            true;
        false ->
            ct:pal("no retry: ~ts, on a host whose CPUs were only ~.2f busy", [Why, Busy]),
            false
    end.

%% @doc Try made at most Tries times: a try that returns `{{again, Why},
%% Result}' is made again only when `retry_on_loaded_host/3' allows it
%% (the host's CPUs 0.85 busy or more since the try began, read by the
%% test), and recorded; `{ok, Result}' or the last try gives its Result.
-spec tries_on_loaded_host(pos_integer(), fun(() -> {ok | {again, iodata()}, T})) -> T.
tries_on_loaded_host(Tries, Try) ->
    Cpu0 = host_cpu(),
    case Try() of
        {{again, Why}, Result} when Tries > 1 ->
            case retry_on_loaded_host(Cpu0, "~ts", [Why]) of
                true -> tries_on_loaded_host(Tries - 1, Try);
                false -> Result
            end;
        {_, Result} ->
            Result
    end.

%% @doc A try the host spoiled, by a measurement of the test's own (given
%% in the text): logged and recorded beside the run's skips ("retried:",
%% listed at the end of `make test').
-spec retried(io:format(), [term()]) -> ok.
retried(Fmt, Args) ->
    Line = lists:flatten(io_lib:format("retried: " ++ Fmt, Args)),
    ct:pal("~ts", [Line]),
    {Suite, Case} = current_case(),
    ok = beamdiag_cth:record(Suite, Case, Line).

current_case() ->
    case catch ct:get_status() of
        L when is_list(L) ->
            case proplists:get_value(current, L) of
                {Su, C} -> {Su, C};
                [{Su, C} | _] -> {Su, C};
                _ -> {'?', '?'}
            end;
        _ -> {'?', '?'}
    end.

%% @doc Whether perf can sample on this host, measured by the test itself
%% and not by beamdiag: `perf record -e cpu-clock' of a short sleep, then
%% `perf script' of its file, must give samples. `ok', or the skip a case
%% that needs perf returns, with what perf said. Measured once per VM.
-spec perf_usable() -> ok | {skip, string()}.
perf_usable() ->
    case persistent_term:get({?MODULE, perf_usable}, undefined) of
        undefined ->
            R = measure_perf(),
            persistent_term:put({?MODULE, perf_usable}, R),
            R;
        R ->
            R
    end.

measure_perf() ->
    case os:find_executable("perf") of
        false ->
            {skip, "perf is not usable on this host: no perf on the PATH"};
        Perf ->
            File = filename:join(os:getenv("TMPDIR", "/tmp"),
                                 "beamdiag_test_perf_" ++ os:getpid() ++ ".data"),
            Rec = os:cmd(Perf ++ " record -q -e cpu-clock -F 999 -o " ++ File ++
                         " -- sh -c 'i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done' 2>&1; echo rc=$?"),
            Script = os:cmd(Perf ++ " script -i " ++ File ++ " 2>/dev/null | head -5"),
            _ = file:delete(File),
            case {lists:suffix("rc=0\n", Rec), Script} of
                {true, [_ | _]} -> ok;
                _ -> {skip, lists:flatten(io_lib:format("perf is not usable on this host: perf "
                                                        "record said ~ts", [string:trim(Rec)]))}
            end
    end.

%% @doc The lab cannot produce the pathology on a host of this size even
%% when the host is quiet (two cores do not contend a lock as hard as the
%% case needs): the case is skipped with the numbers measured, never
%% passed. Unlike `starved/2' this is not a loaded host, so the run's hook
%% does not count it; the CT summary shows it.
-spec not_produced(io:format(), [term()]) -> no_return().
not_produced(Fmt, Args) ->
    Why = lists:flatten(io_lib:format("not produced on this host: " ++ Fmt, Args)),
    ct:pal("~ts", [Why]),
    throw({skip, Why}).

%% @doc How many distinct colours a PNG file (8-bit, non-interlaced,
%% greyscale, RGB or RGBA, as Chromium writes them) has in its pixels: a
%% blank page has one.
-spec png_colours(file:filename()) -> non_neg_integer().
png_colours(File) ->
    {ok, <<137, "PNG", 13, 10, 26, 10, Chunks/binary>>} = file:read_file(File),
    {#{width := W, height := H, depth := 8, colour := Colour, interlace := 0}, Idat} =
        chunks(Chunks, #{}, []),
    Bpp = case Colour of 0 -> 1; 2 -> 3; 4 -> 2; 6 -> 4 end,
    Raw = zlib:uncompress(Idat),
    Rows = unfilter(Raw, W * Bpp, Bpp, binary:copy(<<0>>, W * Bpp), H, []),
    Pixels = sets:from_list([P || Row <- Rows, <<P:Bpp/binary>> <= Row]),
    sets:size(Pixels).

chunks(<<Len:32, "IHDR", W:32, H:32, D, C, _, _, I, _:32, Rest/binary>>, _, Acc) when Len =:= 13 ->
    chunks(Rest, #{width => W, height => H, depth => D, colour => C, interlace => I}, Acc);
chunks(<<Len:32, "IDAT", Data:Len/binary, _:32, Rest/binary>>, Hdr, Acc) ->
    chunks(Rest, Hdr, [Data | Acc]);
chunks(<<_:32, "IEND", _/binary>>, Hdr, Acc) ->
    {Hdr, iolist_to_binary(lists:reverse(Acc))};
chunks(<<Len:32, _:4/binary, _:Len/binary, _:32, Rest/binary>>, Hdr, Acc) ->
    chunks(Rest, Hdr, Acc).

unfilter(_, _, _, _, 0, Acc) ->
    lists:reverse(Acc);
unfilter(<<F, Rest/binary>>, Stride, Bpp, Prev, H, Acc) ->
    <<Line:Stride/binary, More/binary>> = Rest,
    Row = unfilter_row(F, Line, Prev, Bpp),
    unfilter(More, Stride, Bpp, Row, H - 1, [Row | Acc]).

unfilter_row(0, Line, _Prev, _Bpp) ->
    Line;
unfilter_row(F, Line, Prev, Bpp) ->
    L = binary_to_list(Line),
    P = binary_to_list(Prev),
    list_to_binary(unfilter_bytes(F, L, P, Bpp, [], [])).

%% Out holds the bytes decoded so far, newest first; UpLeft the bytes of
%% the row above, newest first.
unfilter_bytes(_, [], _, _, Out, _) ->
    lists:reverse(Out);
unfilter_bytes(F, [X | Xs], [B | Bs], Bpp, Out, UpLeft) ->
    A = nth_back(Bpp, Out),
    C = nth_back(Bpp, UpLeft),
    V = case F of
            1 -> X + A;
            2 -> X + B;
            3 -> X + (A + B) div 2;
            4 -> X + paeth(A, B, C)
        end,
    unfilter_bytes(F, Xs, Bs, Bpp, [V band 255 | Out], [B | UpLeft]).

nth_back(1, [H | _]) -> H;
nth_back(N, [_ | T]) -> nth_back(N - 1, T);
nth_back(_, []) -> 0.

paeth(A, B, C) ->
    P = A + B - C,
    Pa = abs(P - A),
    Pb = abs(P - B),
    Pc = abs(P - C),
    if
        Pa =< Pb, Pa =< Pc -> A;
        Pb =< Pc -> B;
        true -> C
    end.

%% @doc Asserts that a format_error/1 result is a sentence a user can read:
%% text of some length, not a printed Erlang term. Returns it as a binary.
-spec sentence(iodata()) -> binary().
sentence(IoData) ->
    Text = unicode:characters_to_binary(IoData),
    ?assert(is_binary(Text)),
    ?assert(byte_size(Text) >= 10),
    ?assertEqual(nomatch, re:run(Text, <<"^[{\\[<#]">>)),
    ?assertMatch({match, _}, re:run(Text, <<"[a-z]{3,} [a-z]{2,}">>)),
    Text.

%% @doc Starts many small nodes of this OTP side by side (Batch at a time), each
%% over standard I/O (it dies with the test) with these extra arguments:
%% [{Peer, Node}] in the order of the names. A node that fails to start
%% stops the others and fails the test.
-spec start_peers([atom()], [string()], pos_integer()) -> [{pid(), node()}].
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

%% @doc Stops the nodes start_peers/3 started, and kills with kill -9 any that
%% did not stop (a stuck node ignores a polite stop).
-spec stop_peers([{pid(), node()}]) -> ok.
stop_peers(Peers) ->
    OsPids = [catch peer:call(P, os, getpid, [], 2000) || {P, _} <- Peers],
    _ = [catch peer:stop(P) || {P, _} <- Peers],
    _ = [os:cmd("kill -9 " ++ Pid ++ " 2>/dev/null") || Pid <- OsPids, is_list(Pid)],
    ok.
