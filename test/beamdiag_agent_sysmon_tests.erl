%%% EUnit tests of the long-schedule watcher on this node. The system
%%% monitor's events are messages; the tests send them by hand (with a
%%% threshold no schedule here reaches, so the runtime sends none) and
%%% check what the report makes of them: counts, longest and total per
%%% process, where it was held and by what (Erlang code, a BIF, a NIF,
%%% mixed), the names, the bounds, the long queues, the reports sent as
%%% events come (at most one a second). Then the slot itself: taken and
%%% freed again when the watcher stops or its owner dies, left alone when
%%% somebody else holds it, with or without the held sampler.
-module(beamdiag_agent_sysmon_tests).

-include_lib("eunit/include/eunit.hrl").

-define(NEVER, #{threshold_ms => 600000}).

sysmon_test_() ->
    {foreach, fun free_slot/0, fun(_) -> ok end, [{timeout, 30, T} || T <- [
        {"the report of events sent by hand", fun events/0},
        {"a port's events", fun port_events/0},
        {"ten processes reported, a thousand counted", fun bounds/0},
        {"reports sent as events come, at most one a second", {timeout, 20, fun notify/0}},
        {"the slot taken and freed by stop", fun slot_stop/0},
        {"the slot freed when the owner dies", fun slot_owner_down/0},
        {"a slot held by another is left alone", fun taken/0},
        {"a slot held by another: the sampler stands in", fun taken_sampler/0}
    ]]}.

events() ->
    W = beamdiag_agent_sysmon:start(self(), ?NEVER),
    #{state := watching, threshold_ms := 600000, events := 0, processes := [],
      long_queues := [], process_count := 0} = beamdiag_agent_sysmon:report(W, 5000),
    P1 = idle(),
    true = register(beamdiag_sysmon_test_p1, P1),
    P2 = proc_lib:spawn(fun() -> receive stop -> ok end end),
    P3 = idle(),
    W ! {monitor, P1, long_schedule, held(120, {lists, seq, 2})},
    W ! {monitor, P1, long_schedule, held(80, {lists, seq, 2})},
    W ! {monitor, P1, long_schedule, [{timeout, 70}, {in, {lists, foldl, 3}},
                                      {out, {lists, map, 2}}]},
    W ! {monitor, P2, long_schedule, held(500, {prim_file, open_nif, 2})},
    W ! {monitor, P3, long_schedule, held(60, {erlang, term_to_binary, 1})},
    %% Another kind of event is not counted.
    W ! {monitor, P3, long_gc, [{timeout, 900}]},
    W ! {monitor, P1, long_message_queue, true},
    R = beamdiag_agent_sysmon:report(W, 5000),
    ?assertMatch(#{state := watching, events := 5, process_count := 3}, R),
    [E2, E1, E3] = maps:get(processes, R),
    %% The largest total first; each process's figures, and where it was
    %% held most often.
    ?assertMatch(#{pid := _, count := 1, longest_ms := 500, total_ms := 500,
                   in := <<"prim_file:open_nif/2">>, out := <<"prim_file:open_nif/2">>,
                   native := nif, name := null}, E2),
    ?assertEqual(key(P2), maps:get(pid, E2)),
    %% proc_lib's initial call: the fun's own where the emulator reads the
    %% key alone (OTP 26.2 and later), proc_lib's before.
    ?assertMatch(<<_/binary>>, maps:get(initial_call, E2)),
    ?assert(lists:member(binary:part(maps:get(initial_call, E2), 0, 12),
                         [<<"beamdiag_age">>, <<"proc_lib:ini">>])),
    %% The identity as the walks read it (label, spawn call, spawner) when
    %% the guarded read was answered; a process running this module's
    %% code counts as beamdiag's own and gets the direct read.
    Identity = [label, spawn_call, parent],
    ?assertEqual(#{pid => key(P1), name => <<"beamdiag_sysmon_test_p1">>,
                   initial_call => <<"erlang:apply/2">>, count => 3, longest_ms => 120,
                   total_ms => 270, in => <<"lists:seq/2">>, out => <<"lists:seq/2">>,
                   native => erlang}, maps:without(Identity, E1)),
    case E1 of
        #{parent := Parent} -> ?assertEqual(key(self()), maps:get(pid, Parent));
        _ -> ok
    end,
    ?assertMatch(#{count := 1, total_ms := 60, in := <<"erlang:term_to_binary/1">>,
                   native := bif}, E3),
    ?assertEqual([#{pid => key(P1), name => <<"beamdiag_sysmon_test_p1">>,
                    initial_call => <<"erlang:apply/2">>, long => true}],
                 [maps:without(Identity, Q) || Q <- maps:get(long_queues, R)]),
    ?assert(lists:all(fun is_binary/1, maps:get(nif_modules, R))),
    %% The queue's latest word replaces the first.
    W ! {monitor, P1, long_message_queue, false},
    ?assertMatch(#{long_queues := [#{long := false}]}, beamdiag_agent_sysmon:report(W, 5000)),
    stop_watcher(W),
    [exit(P, kill) || P <- [P1, P2, P3]].

port_events() ->
    W = beamdiag_agent_sysmon:start(self(), ?NEVER),
    Port = open_port({spawn, "cat"}, []),
    W ! {monitor, Port, long_schedule, [{timeout, 75}, {port_op, timeout}]},
    #{processes := [E]} = beamdiag_agent_sysmon:report(W, 5000),
    %% A port has no functions: neither in nor out, so `mixed'.
    ?assertEqual(#{pid => list_to_binary(erlang:port_to_list(Port)), name => <<"\"cat\"">>,
                   initial_call => null, count => 1, longest_ms => 75, total_ms => 75,
                   in => null, out => null, native => mixed}, E),
    port_close(Port),
    stop_watcher(W).

bounds() ->
    W = beamdiag_agent_sysmon:start(self(), ?NEVER),
    Ps = [idle() || _ <- lists:seq(1, 1001)],
    [W ! {monitor, P, long_schedule, held(I, {lists, seq, 2})}
     || {I, P} <- lists:enumerate(Ps)],
    %% The 1001st is counted among the events, not as a process.
    R = beamdiag_agent_sysmon:report(W, 10000),
    ?assertMatch(#{events := 1001, process_count := 1000}, R),
    Totals = [T || #{total_ms := T} <- maps:get(processes, R)],
    ?assertEqual(lists:seq(1000, 991, -1), Totals),
    stop_watcher(W),
    [exit(P, kill) || P <- Ps].

notify() ->
    Ref = make_ref(),
    W = beamdiag_agent_sysmon:start(self(), ?NEVER#{notify => {self(), Ref}}),
    P = idle(),
    T0 = erlang:monotonic_time(millisecond),
    W ! {monitor, P, long_schedule, held(100, {lists, seq, 2})},
    %% The first at once; the next event waits for a second to pass.
    #{events := 1} = notified(Ref),
    W ! {monitor, P, long_schedule, held(100, {lists, seq, 2})},
    W ! {monitor, P, long_schedule, held(100, {lists, seq, 2})},
    #{events := 3, processes := [#{total_ms := 300}]} = notified(Ref),
    ?assert(erlang:monotonic_time(millisecond) - T0 >= 1000),
    stop_watcher(W),
    %% Nothing else was sent: the two batches came as two reports.
    ?assertEqual([], [M || {beamdiag, R, _} = M <- mailbox(), R =:= Ref]),
    exit(P, kill).

slot_stop() ->
    W = beamdiag_agent_sysmon:start(self(), ?NEVER),
    #{state := watching} = beamdiag_agent_sysmon:report(W, 5000),
    {W, Opts} = erlang:system_monitor(),
    ?assert(lists:member({long_schedule, 600000}, Opts)),
    stop_watcher(W),
    ?assertEqual(undefined, erlang:system_monitor()).

slot_owner_down() ->
    Owner = idle(),
    W = beamdiag_agent_sysmon:start(Owner, ?NEVER),
    #{state := watching} = beamdiag_agent_sysmon:report(W, 5000),
    MRef = erlang:monitor(process, W),
    exit(Owner, kill),
    receive {'DOWN', MRef, process, W, _} -> ok after 5000 -> error(watcher_on) end,
    ?assertEqual(undefined, erlang:system_monitor()).

taken() ->
    Holder = hold_slot(),
    try
        W = beamdiag_agent_sysmon:start(self(), ?NEVER#{sampler => false}),
        R = beamdiag_agent_sysmon:report(W, 5000),
        ?assertMatch(#{state := taken, events := 0, processes := []}, R),
        ?assertEqual(#{pid => key(Holder), name => <<"beamdiag_sysmon_test_holder">>},
                     maps:get(taken_by, R)),
        ?assertNot(maps:is_key(source, R)),
        stop_watcher(W),
        %% Still the holder's.
        ?assertMatch({Holder, _}, erlang:system_monitor())
    after
        release_slot(Holder)
    end.

taken_sampler() ->
    Holder = hold_slot(),
    try
        W = beamdiag_agent_sysmon:start(self(), ?NEVER),
        R = beamdiag_agent_sysmon:report(W, 5000),
        ?assertMatch(#{state := taken, source := sampler, sampler := #{samplers := _}}, R),
        N = maps:get(samplers, maps:get(sampler, R)),
        ?assert(N >= 1 andalso N =< 4),
        ?assertEqual(length(maps:get(processes, R)), maps:get(process_count, R)),
        stop_watcher(W),
        ?assertMatch({Holder, _}, erlang:system_monitor())
    after
        release_slot(Holder)
    end.

%%% Helpers

%% Each test starts with the slot free (an agent of an earlier test frees
%% it when it ends).
free_slot() ->
    ok = beamdiag_test_lib:await(fun() -> erlang:system_monitor() =:= undefined end, 10000).

held(Ms, Mfa) ->
    [{timeout, Ms}, {in, Mfa}, {out, Mfa}].

idle() ->
    spawn(fun() -> receive stop -> ok end end).

key(P) ->
    list_to_binary(pid_to_list(P)).

notified(Ref) ->
    receive {beamdiag, Ref, {long_schedules, R}} -> R after 5000 -> error(not_notified) end.

stop_watcher(W) ->
    MRef = erlang:monitor(process, W),
    ok = beamdiag_agent_sysmon:stop(W),
    receive {'DOWN', MRef, process, W, _} -> ok after 5000 -> error(watcher_on) end.

hold_slot() ->
    Holder = idle(),
    true = register(beamdiag_sysmon_test_holder, Holder),
    _ = erlang:system_monitor(Holder, [{long_gc, 1000000}]),
    Holder.

release_slot(Holder) ->
    erlang:system_monitor(undefined),
    exit(Holder, kill).

mailbox() ->
    receive M -> [M | mailbox()] after 0 -> [] end.
