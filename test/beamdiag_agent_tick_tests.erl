%%% EUnit tests of a tick's sample on this node: its shape, the state it
%%% hands on to the next tick, a deadline already past, and the queue
%%% watch's readings that no tick waits for.
-module(beamdiag_agent_tick_tests).

-include_lib("eunit/include/eunit.hrl").

%% Two samples of this node, as the metrics sampler takes them: the
%% second reads what the first left open, and knows the threads seen.
sample_test() ->
    S0 = state(),
    {A, S1} = beamdiag_agent_tick:sample(S0),
    #{t := T1, vm := Vm, threads := Threads, host := Host, tick_cost_us := Cost,
      limits := Limits} = A,
    ?assert(is_integer(T1)),
    ?assert(is_map(Vm)),
    ?assertMatch(#{cpu := _}, Host),
    ?assert(is_map(Threads) andalso map_size(Threads) > 0),
    ?assert(is_integer(Cost) andalso Cost >= 0),
    ?assert(is_map(Limits)),
    %% No queue watch: no readings.
    ?assertNot(is_map_key(queue_reads, A)),
    #{previous := Prev, held := _, active := Active, cgroup_before := _} = S1,
    ?assertEqual(lists:sort(maps:keys(Threads)), lists:sort(maps:keys(Prev))),
    %% After the first sample every thread counts as active.
    ?assertEqual(lists:sort(maps:keys(Threads)), lists:sort(Active)),
    {#{t := T2}, S2} = beamdiag_agent_tick:sample(S1#{status => false}),
    ?assert(T2 > T1),
    ?assert(is_list(maps:get(active, S2))).

%% A deadline already past: `late', before any /proc read.
late_test() ->
    Past = erlang:monotonic_time(millisecond) - 1,
    ?assertEqual(late, beamdiag_agent_tick:sample(state(), Past)),
    ?assertMatch({ok, #{t := _}, #{}},
                 beamdiag_agent_tick:sample(state(), erlang:monotonic_time(millisecond) + 60000)).

%% A cgroup that could not be located: the sample says why, the tick goes on.
no_cgroup_test() ->
    E = {error, {beamdiag_agent_cgroup, no_cgroup}},
    {#{cgroup := C}, _} = beamdiag_agent_tick:sample((state())#{cgroup_location => E}),
    ?assertEqual(E, C).

state() ->
    Os = os:getpid(),
    Cg = case beamdiag_agent_cgroup:locate("/proc", Os) of
             {ok, L} -> L;
             {error, _} = E -> E
         end,
    #{pid => Os, proc_root => "/proc", msacc => false, cgroup_location => Cg}.

%% A process with messages waiting (so its queue is watched each tick) that
%% holds its scheduler 800 ms at a time, as a NIF would: the raw signal
%% first, a read of its queue length waits for it; then no tick of a
%% session waits with it (the ticks read the queue watch, whose reader
%% waits for the answers), and the ticks after its first answer carry it.
held_queue_test_() ->
    {timeout, 60, fun held_queue/0}.

held_queue() ->
    case erlang:system_info(schedulers_online) >= 2 of
        false ->
            %% The held process would hold the only scheduler: this case
            %% needs two, as every host the tests run on has.
            error({needs_two_schedulers, erlang:system_info(schedulers_online)});
        true ->
            %% Loaded first: the code server may be queued on the held
            %% scheduler.
            _ = [{module, M} = code:ensure_loaded(M)
                 || M <- [beamdiag_agent_tick, beamdiag_agent_queues, timer]],
            %% Bound to scheduler 1 (the `scheduler' spawn option, as the
            %% agent's sampler uses it), its reader to scheduler 2: a reader
            %% on the held scheduler runs only in the holder's gaps.
            {Held, _Clock} = beamdiag_test_lib:held_scheduler(),
            [Held ! {msg, I} || I <- lists:seq(1, 50)],
            try
                Self = self(),
                _ = beamdiag_test_lib:bound(2, fun() ->
                                 Self ! {waits, [begin
                                                     timer:sleep(97),
                                                     element(1, timer:tc(erlang, process_info,
                                                                         [Held, message_queue_len]))
                                                 end || _ <- lists:seq(1, 5)]}
                             end),
                Waits = receive {waits, W} -> W after 10000 -> [] end,
                ?assert(lists:max([0 | Waits]) > 100000),
                %% The ticks' reads of the watched queue, from scheduler 2 as
                %% the raw reads, 200 ms apart for 2 s.
                Watch = beamdiag_agent_queues:start([Held], #{}),
                State = #{watch => Watch, interval_ms => 200},
                _ = beamdiag_test_lib:bound(2, fun() ->
                                 Self ! {ticks, [begin
                                                     timer:sleep(200),
                                                     timer:tc(beamdiag_agent_tick, queues, [State, #{}])
                                                 end || _ <- lists:seq(1, 10)]}
                             end),
                Ticks = receive {ticks, T} -> T after 10000 -> [] end,
                beamdiag_agent_queues:stop(Watch),
                Read = [Us || {Us, #{queue_reads := _}} <- Ticks],
                ?debugFmt("raw reads waited ~p us; the ticks' reads ~p",
                          [Waits, [{Us, maps:get(queue_reads, S, none)} || {Us, S} <- Ticks]]),
                ?assertEqual(10, length(Ticks)),
                ?assert(lists:max([Us || {Us, _} <- Ticks]) < 5000),
                %% It answered at least once in 2 s: the later ticks have it.
                ?assert(length(Read) >= 5),
                [{_, #{queue_reads := R}} | _] = lists:reverse(Ticks),
                ?assertMatch([#{queue := Q}] when Q >= 50, maps:values(R))
            after
                exit(Held, kill)
            end
    end.

%% A scheduler held 800 ms at a time, as a NIF would: the raw signal
%% first, erlang:memory/0 waits for it; then a tick of a session (its
%% helper, 1 s ticks) does not: it comes within its wait for every
%% scheduler's figures, the VM's memory account missing and saying why,
%% the OS's account there.
held_memory_test_() ->
    {timeout, 60, fun held_memory/0}.

held_memory() ->
    case erlang:system_info(schedulers_online) >= 2 of
        false ->
            error({needs_two_schedulers, erlang:system_info(schedulers_online)});
        true ->
            _ = [{module, M} = code:ensure_loaded(M)
                 || M <- [beamdiag_agent_tick, beamdiag_agent_memory, beamdiag_agent_vm,
                          beamdiag_agent_procfs, beamdiag_agent_bounded_call, timer]],
            State = (state())#{probe => beamdiag_agent_bounded_call:start(self()),
                               interval_ms => 1000},
            {_, S1} = beamdiag_agent_tick:sample(State),
            {Held, Clock} = beamdiag_test_lib:held_scheduler(),
            Name = {?MODULE, held_memory},
            try
                %% Timed by the holder's clock: erlang:memory/0 returns only
                %% when the hold has ended, 800 ms after it began...
                Raw = beamdiag_test_lib:in_hold(Clock, fun() -> erlang:memory() end, Name),
                %% ...and a tick returns while it is still on.
                Tick = beamdiag_test_lib:in_hold(
                         Clock, fun() ->
                                        beamdiag_agent_tick:sample(
                                          S1, erlang:monotonic_time(millisecond) + 5000)
                                end, Name),
                #{result := {ok, #{memory := Memory, vm := Vm}, _}} = Tick,
                ?debugFmt("erlang:memory/0 from ~b to ~b ms into an 800 ms hold; the tick "
                          "from ~b to ~b ms: memory ~p, missing ~p",
                          [maps:get(start_ms, Raw), maps:get(end_ms, Raw), maps:get(start_ms, Tick),
                           maps:get(end_ms, Tick), Memory, maps:get(missing, Vm, none)]),
                ?assert(maps:get(end_ms, Raw) >= 795),
                ?assertMatch(#{same_hold := true, end_ms := E} when E < 800, Tick),
                ?assertMatch(#{vm := V, vm_missing := timeout, os := #{rss := _}}
                               when map_size(V) =:= 0, Memory),
                ?assertMatch(#{missing := #{items := [_ | _], why := timeout}}, Vm),
                ?assert(lists:member(memory, maps:get(items, maps:get(missing, Vm))))
            after
                exit(Held, kill),
                beamdiag_agent_bounded_call:stop(maps:get(probe, State))
            end
    end.



%% The memory account has a helper of its own: one still busy with an
%% earlier tick's reading (here a read that takes 2 s, as the allocators'
%% sizes do behind blocked schedulers) makes that tick's memory account
%% `busy', and the time ledger's counters come all the same. With both in
%% one helper, the tick lost its scheduler wall time too.
memory_helper_busy_test() ->
    Self = self(),
    Mem = beamdiag_agent_bounded_call:start(Self),
    Probe = beamdiag_agent_bounded_call:start(Self),
    _ = erlang:system_flag(scheduler_wall_time, true),
    try
        Slow = beamdiag_agent_bounded_call:ask(Mem, fun() -> timer:sleep(2000) end),
        State = (state())#{probe => Probe, memory_probe => Mem, interval_ms => 1000},
        {#{vm := Vm, memory := Memory}, _} = beamdiag_agent_tick:sample(State),
        ?assert(is_list(maps:get(swt, Vm))),
        ?assertNot(is_map_key(missing, Vm)),
        ?assertMatch(#{vm_missing := busy, os := #{rss := _}}, Memory),
        ?assertEqual(timeout, beamdiag_agent_bounded_call:answer(Slow, 0)),
        %% Once it is free, the memory account comes with the tick.
        ok = beamdiag_test_lib:wait_until(
               fun() -> beamdiag_agent_bounded_call:call(Mem, fun() -> ok end, 100) =:= {ok, ok} end,
               5000),
        {#{memory := Memory2}, _} = beamdiag_agent_tick:sample(State#{status => true}),
        ?assertMatch(#{vm := #{total := T}, alloc := A} when T > 0 andalso map_size(A) > 0, Memory2),
        ?assertNot(is_map_key(vm_missing, Memory2))
    after
        _ = erlang:system_flag(scheduler_wall_time, false),
        beamdiag_agent_bounded_call:stop(Mem),
        beamdiag_agent_bounded_call:stop(Probe)
    end.
