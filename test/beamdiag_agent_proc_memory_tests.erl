%%% EUnit tests of process memory for the walks: read for a quiet process,
%%% estimated (never read) for a flooded one and for one that did not
%%% answer, and the start figure from the young heap.
-module(beamdiag_agent_proc_memory_tests).

-include_lib("eunit/include/eunit.hrl").

estimate_test() ->
    ?assertEqual(233 * 8 + 20000 * 112, beamdiag_agent_proc_memory:estimate(233, 20000, 8)),
    ?assertEqual(400, beamdiag_agent_proc_memory:estimate(100, 0, 4)),
    ?assertEqual(11200 + 5000 * 112, beamdiag_agent_proc_memory:grown(11200, 5000)),
    %% A queue that shrank: never below nothing.
    ?assertEqual(0, beamdiag_agent_proc_memory:grown(1000, -100)).

%% A quiet process is read; one whose queue is past the bound is estimated
%% from the walk's figures; one known not to answer is estimated when the
%% walk read it, and left out when it did not.
read_test() ->
    Quiet = spawn(fun() -> receive stop -> ok end end),
    Flooded = spawn(fun() -> receive stop -> ok end end),
    Known = spawn(fun() -> receive stop -> ok end end),
    Unread = spawn(fun() -> receive stop -> ok end end),
    try
        W = erlang:system_info(wordsize),
        Walked = #{Quiet => {0, 0, 233}, Flooded => {0, 20000, 233}, Known => {0, 3, 100}},
        {Mem, Est, Stalled} = beamdiag_agent_proc_memory:read([Quiet, Flooded, Known, Unread],
                                                              Walked, #{Known => 150,
                                                                        Unread => 150}),
        {memory, QuietMem} = erlang:process_info(Quiet, memory),
        ?assertEqual(QuietMem, maps:get(Quiet, Mem)),
        ?assertEqual(233 * W + 20000 * 112, maps:get(Flooded, Mem)),
        ?assertEqual(100 * W + 3 * 112, maps:get(Known, Mem)),
        ?assertNot(is_map_key(Unread, Mem)),
        ?assertEqual(#{Flooded => true, Known => true}, Est),
        ?assertEqual([], Stalled)
    after
        [P ! stop || P <- [Quiet, Flooded, Known, Unread]]
    end.

%% A process gone since the walk: no figure, not an error.
gone_test() ->
    {P, MRef} = spawn_monitor(fun() -> ok end),
    receive {'DOWN', MRef, process, P, _} -> ok end,
    ?assertEqual({#{}, #{}, []}, beamdiag_agent_proc_memory:read([P], #{P => {0, 0, 10}}, #{})).

at_start_test() ->
    P = list_to_pid("<0.1.0>"),
    Q = list_to_pid("<0.2.0>"),
    W = erlang:system_info(wordsize),
    ?assertEqual(5000, beamdiag_agent_proc_memory:at_start(P, #{P => 5000}, #{P => {0, 0, 10}})),
    ?assertEqual(10 * W, beamdiag_agent_proc_memory:at_start(P, #{}, #{P => {0, 0, 10}})),
    ?assertEqual(0, beamdiag_agent_proc_memory:at_start(Q, #{}, #{P => {0, 0, 10}})).
