%%% Sick nodes seen from the host: real lab nodes on OTP 25, 27 (trixie's
%%% root) and 29 (sid's root) whose scheduler a plain NIF holds (nif_stuck), and the
%%% control whose NIF yields (nif_yield). The NIF is built with this
%%% machine's gcc against OTP 25's erl_nif.h and loads on 29 too.
%%%
%%% Each case asserts the raw signal first (ping is pang; the held
%%% scheduler thread wanted a CPU the whole time and never slept, from
%%% /proc), then runs the CLI in this VM (beamdiag_cli:run/2) and asserts
%%% the exit code, the host-side-only header, the thread, perf's native
%%% symbol and library (when perf is usable here), the fix, and the
%%% latency from the call (window + 2 s at most). Every lab node is killed
%%% with SIGKILL at the end: a node held by its NIF ignores SIGTERM.
-module(beamdiag_sick_SUITE).
-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0, groups/0, suite/0, init_per_group/2, end_per_group/2,
         init_per_testcase/2, end_per_testcase/2]).
-export([nif_stuck_unresponsive/1, nif_stuck_os_pid/1, nif_yield_control/1]).

-define(WINDOW, 6).
%% The report is due this long after the window, counted from the call.
-define(LATE_MS, 2000).

suite() -> [{timetrap, {minutes, 4}}].

all() ->
    [{group, otp25}, {group, otp27}, {group, otp29}].

groups() ->
    Cases = [nif_stuck_unresponsive, nif_stuck_os_pid, nif_yield_control],
    [{otp25, [], Cases}, {otp27, [], Cases}, {otp29, [], Cases}].

init_per_group(otp25, Config) ->
    [{release, 25}, {lab_opts, #{}} | Config];
init_per_group(Group, Config) ->
    %% The roots are built by the set-up (scripts/otp-root.sh), never here.
    {Rel, Suite} = case Group of otp27 -> {27, "trixie"}; otp29 -> {29, "sid"} end,
    Ready = filename:join([os:getenv("BEAMDIAG_CACHE", "/var/cache/beamdiag"), "roots", Suite,
                           ".beamdiag-ready"]),
    case filelib:is_regular(Ready) of
        false ->
            beamdiag_test_lib:missing(["the OTP ", integer_to_list(Rel), " root is not built "
                                       "(scripts/otp-root.sh ", Suite, ")"]);
        true ->
            case beamdiag_test_lib:otp_exec(Rel) of
                {ok, Exec} -> [{release, Rel}, {lab_opts, #{exec => Exec}} | Config];
                Skip -> Skip
            end
    end.

end_per_group(_, _Config) ->
    ok.

init_per_testcase(Case, Config) ->
    Scenario = case Case of
                   nif_yield_control -> nif_yield;
                   _ -> nif_stuck
               end,
    case beamdiag_lab:start(Scenario, (?config(lab_opts, Config))#{duration => 180}) of
        {ok, Lab} ->
            ct:pal("OTP ~b lab node ~s, OS pid ~s",
                   [?config(release, Config), beamdiag_lab:node(Lab), maps:get(os_pid, Lab)]),
            [{lab, Lab} | Config];
        {error, {M, R}} ->
            ct:fail(lists:flatten(io_lib:format("~ts", [M:format_error(R)])))
    end.

end_per_testcase(_Case, Config) ->
    Lab = ?config(lab, Config),
    ok = beamdiag_lab:stop(Lab),
    %% stop/1 sends SIGKILL to these nodes: the OS process is gone.
    ?assertNot(filelib:is_dir("/proc/" ++ maps:get(os_pid, Lab))),
    ok.

%%%===================================================================
%%% Cases
%%%===================================================================

%% The node cannot finish a handshake: the CLI, asked as usual, finishes
%% the window from the host alone.
nif_stuck_unresponsive(Config) ->
    Lab = ?config(lab, Config),
    Node = atom_to_list(beamdiag_lab:node(Lab)),
    ?assertEqual(pang, beamdiag_test_lib:lab_ping(Lab)),
    held_signal(Lab),
    %% A report whose perf samples did not name the NIF's function, on a
    %% host whose CPUs were 0.85 busy or more over it (the test's own
    %% /proc/stat; the held threads then got few samples), is measured
    %% again, 3 tries in all.
    Out = beamdiag_test_lib:tries_on_loaded_host(3, fun() -> stuck_report(Lab, Node) end),
    held_report(Out, Config).

%% One diagnosis of the stuck node, and whether perf named the NIF's
%% function (or was not used).
stuck_report(Lab, Node) ->
    {Code, Out, Err, Ms} = beamdiag_test_lib:lab_cli(
                             ["diagnose", Node, "--duration", integer_to_list(?WINDOW)],
                             beamdiag_lab:cookie(Lab)),
    ct:pal("exit ~b in ~b ms (window ~b s)~n~ts~ts", [Code, Ms, ?WINDOW, Out, Err]),
    ?assertEqual(0, Code),
    ?assertMatch({0, _}, binary:match(Out, <<"beamdiag: ", (list_to_binary(Node))/binary>>)),
    ?assertMatch({_, _}, re:run(Out, <<"the node did not answer in [0-9]+\\.[0-9] s; host-side only">>)),
    ?assertMatch({_, _}, binary:match(Out, <<"distribution: it is registered in epmd">>)),
    ?assert(Ms =< ?WINDOW * 1000 + ?LATE_MS),
    case binary:match(Out, <<"perf: not used: ">>) =:= nomatch andalso
        binary:match(Out, <<"beamdiag_lab_spin_slice">>) =:= nomatch of
        true -> {{again, "perf's samples did not name beamdiag_lab_spin_slice"}, Out};
        false -> {ok, Out}
    end.

%% The same node by its OS pid, as JSON.
nif_stuck_os_pid(Config) ->
    Lab = ?config(lab, Config),
    held_signal(Lab),
    {Code, Out, Err, Ms} = beamdiag_test_lib:lab_cli(
                             ["diagnose", "--os-pid", maps:get(os_pid, Lab), "--json",
                             "--duration", integer_to_list(?WINDOW)], undefined),
    ct:pal("exit ~b in ~b ms~n~ts~ts", [Code, Ms, Out, Err]),
    ?assertEqual(0, Code),
    J = beamdiag_test_json:decode(Out),
    ?assertMatch(#{<<"host_only">> := true,
                   <<"host_view">> := #{<<"reason">> := <<"requested">>}}, J),
    [Held] = [F || F = #{<<"id">> := <<"scheduler_held_native">>} <- maps:get(<<"findings">>, J)],
    ?assertMatch({_, _}, binary:match(hd(maps:get(<<"evidence">>, Held)), <<"_sched">>)),
    ?assertMatch({_, _}, binary:match(maps:get(<<"fix">>, Held), <<"enif_schedule_nif">>)),
    ?assert(Ms =< ?WINDOW * 1000 + ?LATE_MS),
    %% Asked for, the finding needs perf to name the library.
    case maps:get(<<"perf">>, maps:get(<<"host_view">>, J)) of
        #{<<"top">> := [#{<<"symbol">> := Sym, <<"dso">> := Dso, <<"share">> := Share} | _]} ->
            ct:pal("perf top: ~ts in ~ts, ~.3f of the held thread's samples", [Sym, Dso, Share]),
            ?assertEqual(<<"beamdiag_lab_spin_slice">>, Sym),
            ?assertEqual(<<"beamdiag_lab_nif.so">>, filename:basename(Dso)),
            ?assert(Share >= 0.5);
        #{<<"error">> := Why} ->
            %% Excused only where the test's own perf run fails too.
            ?assertMatch({skip, _}, beamdiag_test_lib:perf_usable(), Why),
            beamdiag_test_lib:perf_usable()
    end.

%% The yielding NIF: the node answers, the agent's diagnosis names no held
%% scheduler, and neither does the host-only view (on OTP 29 the NIF's
%% scheduler thread is busy without sleeping, as a held one; perf shows it
%% going back to the emulator between slices).
nif_yield_control(Config) ->
    Lab = ?config(lab, Config),
    Node = atom_to_list(beamdiag_lab:node(Lab)),
    ?assertEqual(pong, beamdiag_test_lib:lab_ping(Lab)),
    %% The work runs: the schedulers are busy, yet they sleep.
    L = beamdiag_test_lib:lab_ledger(Lab, 2000),
    W = maps:get(window_s, L),
    Scheds = [R || R = #{type := scheduler} <- maps:get(threads, L)],
    Wanted = lists:sum([On + Q || #{on_cpu := On, runq := Q} <- Scheds]) / W,
    Sleeps = lists:sum([V || #{nvcsw := V} <- Scheds]) / W,
    ct:pal("schedulers wanted ~.2f CPUs, slept ~.1f times/s", [Wanted, Sleeps]),
    ?assert(Wanted >= 0.5),
    ?assert(Sleeps >= 20),
    {Code, Out, Err, Ms} = beamdiag_test_lib:lab_cli(
                             ["diagnose", Node, "--json", "--duration", integer_to_list(?WINDOW)],
                             beamdiag_lab:cookie(Lab)),
    ct:pal("exit ~b in ~b ms~n~ts", [Code, Ms, Err]),
    ?assertEqual(0, Code),
    J = beamdiag_test_json:decode(Out),
    ?assertNot(maps:is_key(<<"host_only">>, J)),
    ?assertNot(lists:member(<<"scheduler_held_native">>, ids(J))),
    {Code2, Out2, _, _} = beamdiag_test_lib:lab_cli(
                            ["diagnose", Node, "--host-only", "--json", "--duration", "4"],
                            undefined),
    ?assertEqual(0, Code2),
    J2 = beamdiag_test_json:decode(Out2),
    ?assertMatch(#{<<"host_only">> := true}, J2),
    ?assertNot(lists:member(<<"scheduler_held_native">>, ids(J2))).

%%%===================================================================
%%% Helpers
%%%===================================================================

%% The raw signal (beamdiag_test_lib:held_schedulers/2): a scheduler
%% thread held, read from the host until it shows, 10 s at most.
held_signal(Lab) ->
    ?assertMatch([_ | _], beamdiag_test_lib:held_schedulers(Lab, 10000)).

held_report(Out, Config) ->
    ?assertMatch({_, _}, binary:match(Out, <<"scheduler_held_native">>)),
    ?assertMatch({_, _}, binary:match(Out, <<"_sched">>)),
    [?assertMatch({_, _}, binary:match(Out, S))
     || S <- [<<"enif_consume_timeslice">>, <<"enif_schedule_nif">>,
              <<"ERL_NIF_DIRTY_JOB_CPU_BOUND">>]],
    case binary:match(Out, <<"perf: not used: ">>) of
        nomatch ->
            %% Failing, the first line gives the report's lines on perf and
            %% the held thread (a CI run shows only that).
            binary:match(Out, <<"beamdiag_lab_spin_slice">>) =/= nomatch orelse
                ct:fail("perf did not name beamdiag_lab_spin_slice: ~0p",
                        [[L || L <- binary:split(Out, <<"\n">>, [global]),
                               re:run(L, <<"perf|sampl|_sched|held">>) =/= nomatch]]),
            ?assertMatch({_, _}, binary:match(Out, <<"beamdiag_lab_nif.so">>));
        {P, _} ->
            %% perf not used: excused only where the test's own perf run
            %% fails too; the report's line is kept in the log.
            Line = hd(binary:split(binary:part(Out, P, byte_size(Out) - P), <<"\n">>)),
            ct:pal("OTP ~b: ~ts", [?config(release, Config), Line]),
            ?assertMatch({skip, _}, beamdiag_test_lib:perf_usable(), Line),
            beamdiag_test_lib:perf_usable()
    end.


ids(J) ->
    [Id || #{<<"id">> := Id} <- maps:get(<<"findings">>, J)].
