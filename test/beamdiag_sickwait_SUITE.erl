%%% Sick nodes that wait rather than burn, and held schedulers profiled by
%%% default, on real lab nodes on OTP 25 and 29 (sid's root):
%%%
%%% - every dirty IO scheduler blocked in open(2) of a FIFO nobody writes
%%%   (a hung NFS open, faithfully: open(2) of a FIFO for reading waits in
%%%   the kernel until a writer comes), on a node that can no longer load
%%%   the code a handshake needs (host-only report) and on one whose code
%%%   is all loaded (it answers; the report is due while its agent's reads
%%%   of /proc wait behind the same schedulers);
%%% - a plain NIF holding one scheduler on a node that answers: plain
%%%   `diagnose' profiles the held thread and names the native symbol.
%%%
%%% The raw signal first (each dirty IO thread's wchan and system call read
%%% from /proc over 2 s, its on-CPU time unchanged; the node's answer; the
%%% held thread's CPU share and sleeps), then the report, on time: the
%%% window plus 2 s from the call. Every lab node is killed at the end.
-module(beamdiag_sickwait_SUITE).
-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0, groups/0, suite/0, init_per_group/2, end_per_group/2,
         init_per_testcase/2, end_per_testcase/2]).
-export([dirty_io_host_only/1, dirty_io_answers/1, held_nif_answers/1]).

-define(WINDOW, 4).
-define(LATE_MS, 2000).

suite() -> [{timetrap, {minutes, 3}}].

all() ->
    [{group, otp25}, {group, otp29}].

groups() ->
    Cases = [dirty_io_host_only, dirty_io_answers, held_nif_answers],
    [{otp25, [], Cases}, {otp29, [], Cases}].

init_per_group(otp25, Config) ->
    [{release, 25}, {lab_opts, #{}} | Config];
init_per_group(otp29, Config) ->
    case beamdiag_test_lib:otp_exec(29) of
        {ok, Exec} -> [{release, 29}, {lab_opts, #{exec => Exec}} | Config];
        Skip -> Skip
    end.

end_per_group(_, _Config) ->
    ok.

%% The variations: OTP 25 with its 10 dirty IO schedulers, OTP 29 with 4
%% (+SDio 4) for the node that answers.
init_per_testcase(Case, Config) ->
    Scenario = case {Case, ?config(release, Config)} of
                   {dirty_io_host_only, _} -> dirty_io_blocked_cold;
                   {dirty_io_answers, 25} -> dirty_io_blocked;
                   {dirty_io_answers, 29} -> dirty_io_blocked_sdio4;
                   {held_nif_answers, _} -> nif_held
               end,
    case beamdiag_lab:start(Scenario, (?config(lab_opts, Config))#{duration => 120}) of
        {ok, Lab} ->
            ct:pal("OTP ~b lab node ~s (~s), OS pid ~s",
                   [?config(release, Config), beamdiag_lab:node(Lab), Scenario,
                    maps:get(os_pid, Lab)]),
            [{lab, Lab} | Config];
        {error, {M, R}} ->
            ct:fail(lists:flatten(io_lib:format("~ts", [M:format_error(R)])))
    end.

end_per_testcase(_Case, Config) ->
    Lab = ?config(lab, Config),
    ok = beamdiag_lab:stop(Lab),
    ?assertNot(filelib:is_dir("/proc/" ++ maps:get(os_pid, Lab))),
    ok.

%%%===================================================================
%%% Cases
%%%===================================================================

%% Nothing loaded before the opens: the node cannot load the code a
%% handshake needs, so the report is the host's, and names every dirty IO
%% thread blocked in openat of the FIFO, and no all-clear.
dirty_io_host_only(Config) ->
    Lab = ?config(lab, Config),
    N = blocked_signal(Lab),
    Node = atom_to_list(beamdiag_lab:node(Lab)),
    {Code, Out, Err, Ms} = beamdiag_test_lib:lab_cli(
                             ["diagnose", Node, "--duration", integer_to_list(?WINDOW)],
                             beamdiag_lab:cookie(Lab)),
    ct:pal("exit ~b in ~b ms~n~ts~ts", [Code, Ms, Out, Err]),
    ?assertEqual(0, Code),
    ?assertMatch({_, _}, re:run(Out, <<"the node did not answer in [0-9.]+ s; host-side only">>)),
    ?assertEqual(nomatch, binary:match(Out, <<"none: ">>)),
    ?assertMatch({_, _}, binary:match(Out, <<"[CRITICAL] dirty_io_blocked">>)),
    dirty_io_report(Out, N),
    ?assertMatch({_, _}, binary:match(Out, <<"the node did not answer">>)),
    on_time(Ms).

%% Every module loaded before the opens (a release in embedded mode): the
%% node still answers, its agent loads, but the agent's own reads of /proc
%% wait behind the blocked schedulers too, so the report comes from the
%% host view when due, with the finding.
dirty_io_answers(Config) ->
    Lab = ?config(lab, Config),
    N = blocked_signal(Lab),
    ?assertEqual(pong, beamdiag_test_lib:lab_ping(Lab)),
    Node = atom_to_list(beamdiag_lab:node(Lab)),
    {Code, Out, Err, Ms} = beamdiag_test_lib:lab_cli(
                             ["diagnose", Node, "--json", "--duration", integer_to_list(?WINDOW)],
                             beamdiag_lab:cookie(Lab)),
    ct:pal("exit ~b in ~b ms~n~ts~ts", [Code, Ms, Out, Err]),
    ?assertEqual(0, Code),
    J = beamdiag_test_json:decode(Out),
    [F] = [X || X = #{<<"id">> := <<"dirty_io_blocked">>} <- maps:get(<<"findings">>, J)],
    ct:pal("~p", [F]),
    ?assertMatch(#{<<"severity">> := <<"critical">>,
                   <<"metrics">> := #{<<"blocked">> := N, <<"dirty_io_threads">> := N,
                                      <<"call">> := <<"openat">>}}, F),
    dirty_io_report(iolist_to_binary(lists:join("\n", [maps:get(<<"title">>, F) |
                                                      maps:get(<<"evidence">>, F)])), N),
    %% The node answered: the report says so, not that it did not.
    ?assertMatch(#{<<"host_view">> := #{<<"reason">> := <<"slow">>}}, J),
    on_time(Ms).

%% A plain NIF holds the last scheduler and the node answers: the plain
%% command profiles the held thread with perf, and the agent's report
%% names the native symbol and its library.
held_nif_answers(Config) ->
    Lab = ?config(lab, Config),
    %% Raw signal: the held thread wanted a CPU 90% of 2 s or more, mostly
    %% in user mode, never slept; and the node answers. Read until it
    %% shows, 2 s at a time, for 10 s at most: a CI run once read no held
    %% thread in the 2 s right after the node's start.
    Held = beamdiag_test_lib:held_schedulers(Lab, 10000),
    ?assertMatch([_], Held),
    ?assertEqual(pong, beamdiag_test_lib:lab_ping(Lab)),
    {J, Ms} = beamdiag_test_lib:tries_on_loaded_host(3, fun() -> held_try(Lab) end),
    Ids = [Id || #{<<"id">> := Id} <- maps:get(<<"findings">>, J)],
    Notes = maps:get(<<"notes">>, J, []),
    case [F || F = #{<<"id">> := <<"scheduler_held_native">>} <- maps:get(<<"findings">>, J)] of
        [F] ->
            ct:pal("~ts~n~ts", [maps:get(<<"title">>, F),
                                lists:join("\n", maps:get(<<"evidence">>, F))]),
            ?assertEqual(<<"A scheduler is held in native code: beamdiag_lab_spin_slice">>,
                         maps:get(<<"title">>, F)),
            Ev = iolist_to_binary(maps:get(<<"evidence">>, F)),
            ?assertMatch({_, _}, binary:match(Ev, <<"beamdiag_lab_nif.so">>)),
            ?assertMatch({_, _}, binary:match(Ev, hd(Held)));
        [] ->
            %% Only a host where perf cannot sample (measured by the test,
            %% not by the report) excuses the missing finding; the report
            %% then says why.
            case beamdiag_test_lib:perf_usable() of
                ok ->
                    ct:fail({no_scheduler_held_native, Ids, Notes});
                {skip, _} = Skip ->
                    ?assertMatch([_ | _], [N || N <- Notes, binary:match(N, <<"perf">>) =/= nomatch]),
                    throw(Skip)
            end
    end,
    on_time(Ms, 5).

%%%===================================================================
%%% Helpers
%%%===================================================================

%% One diagnosis of the held node, as JSON, and its time. A capture cut
%% short (the node's ticks too slow for the report to be due on time)
%% without the finding is to be measured again (`again'), which
%% tries_on_loaded_host/2 allows only when the host's CPUs were 0.85 busy
%% or more over it, read by the test from /proc/stat: the held NIF takes
%% one CPU, so something beside the case took most of the other.
held_try(Lab) ->
    Node = atom_to_list(beamdiag_lab:node(Lab)),
    {Code, Out, Err, Ms} = beamdiag_test_lib:lab_cli(
                             ["diagnose", Node, "--json", "--duration", "5"],
                             beamdiag_lab:cookie(Lab)),
    ct:pal("exit ~b in ~b ms~n~ts", [Code, Ms, Err]),
    ?assertEqual(0, Code),
    J = beamdiag_test_json:decode(Out),
    ?assertNot(maps:is_key(<<"host_only">>, J)),
    Ids = [Id || #{<<"id">> := Id} <- maps:get(<<"findings">>, J)],
    Notes = maps:get(<<"notes">>, J, []),
    ct:pal("findings ~p~nnotes ~p", [Ids, Notes]),
    Partial = [N || N <- Notes, binary:match(N, <<"partial capture">>) =/= nomatch],
    case lists:member(<<"scheduler_held_native">>, Ids) of
        false when Partial =/= [] ->
            {{again, "no scheduler_held_native finding from a partial capture"}, {J, Ms}};
        _ ->
            {ok, {J, Ms}}
    end.

%% The raw signal: over 2 s, every dirty IO thread of the node sits in
%% openat of the lab's FIFO (wchan and system call read from /proc), and
%% the kernel does not run it. Returns how many there are.
blocked_signal(Lab) ->
    Pid = maps:get(os_pid, Lab),
    Read = fun() ->
               {ok, Th} = beamdiag_agent_procfs:threads("/proc", Pid, #{waits => true}),
               maps:from_list([{Tid, T} || {Tid, T = #{name := Name}} <- maps:to_list(Th),
                                          dirty_io(Name)])
           end,
    A = Read(),
    timer:sleep(2000),
    B = Read(),
    Rows = [{maps:get(name, T), maps:get(state, T), maps:get(wait, T, none),
             maps:get(run_ns, T) =:= maps:get(run_ns, maps:get(Tid, B, #{}), x)}
            || {Tid, T} <- maps:to_list(A)],
    ct:pal("dirty IO threads (name, state, wait, not run in 2 s): ~p", [Rows]),
    ?assert(length(Rows) >= 4),
    [?assertMatch({_, <<"S">>, #{wchan := <<"wait_for_partner">>,
                                 call := #{name := <<"openat">>}}, true}, R) || R <- Rows],
    [?assertMatch(#{wait := #{file := <<_/binary>>}}, T) || T <- maps:values(B)],
    length(Rows).

dirty_io_report(Text, N) ->
    Count = integer_to_binary(N),
    [?assertMatch({_, _}, binary:match(Text, S))
     || S <- [<<"All ", Count/binary, " dirty IO schedulers are blocked in "
                                        "openat(2) of ">>,
              <<"/fifo">>, <<Count/binary, " of the node's ", Count/binary, " dirty IO">>,
              <<"since before the window began">>, <<"wait_for_partner">>,
              <<"code loading">>]].


on_time(Ms) ->
    on_time(Ms, ?WINDOW).

%% Within the window plus 2 s of the call; a host loaded beyond four times
%% its CPUs turns a late report into a counted skip with its numbers.
on_time(Ms, Window) ->
    Limit = Window * 1000 + ?LATE_MS,
    {ok, L} = file:read_file("/proc/loadavg"),
    Load = binary_to_float(hd(binary:split(L, <<" ">>))),
    Cpus = erlang:system_info(logical_processors_available),
    ct:pal("report in ~b ms (limit ~b); host load ~.1f on ~p CPUs", [Ms, Limit, Load, Cpus]),
    case Ms =< Limit of
        true -> ok;
        false when is_integer(Cpus), Load > 4 * Cpus ->
            beamdiag_test_lib:starved("report in ~b ms, limit ~b: host load ~.1f on ~b CPUs",
                                      [Ms, Limit, Load, Cpus]);
        false -> ?assert(Ms =< Limit)
    end.

dirty_io(<<"erts_dios_", _/binary>>) -> true;
dirty_io(Name) -> binary:match(Name, <<"_dirty_io_">>) =/= nomatch.
