%%% EUnit tests of one walk of the process table, on processes of this
%%% node made for it: which processes a walk reads, the figures it keeps,
%%% the tops it ranks in its one pass, and the suspended processes it finds.
-module(beamdiag_agent_proc_walk_tests).

-include_lib("eunit/include/eunit.hrl").

items_test() ->
    ?assertEqual([reductions, message_queue_len, heap_size], beamdiag_agent_proc_walk:items(false)),
    ?assertEqual([reductions, message_queue_len, heap_size, initial_call],
                 beamdiag_agent_proc_walk:items(true)).

%% The figures follow the items' order; the walk's status comes apart.
to_tuple_test() ->
    R = {reductions, 7}, Q = {message_queue_len, 2}, H = {heap_size, 233},
    I = {initial_call, {m, f, 0}},
    ?assertEqual({7, 2, 233}, beamdiag_agent_proc_walk:to_tuple([R, Q, H])),
    ?assertEqual({7, 2, 233, {m, f, 0}}, beamdiag_agent_proc_walk:to_tuple([R, Q, H, I])),
    ?assertEqual({{7, 2, 233}, waiting},
                 beamdiag_agent_proc_walk:to_tuple([R, Q, H, {status, waiting}])),
    ?assertEqual({{7, 2, 233, {m, f, 0}}, running},
                 beamdiag_agent_proc_walk:to_tuple([R, Q, H, I, {status, running}])).

%% At the end a queue ranks by its growth plus its length.
queue_key_test() ->
    P = list_to_pid("<0.1.0>"),
    Base = #{P => {0, 100, 10}},
    ?assertEqual(400 + 500, beamdiag_agent_proc_walk:queue_key(P, {0, 500, 10}, Base)),
    %% Shrunk: its length alone.
    ?assertEqual(50, beamdiag_agent_proc_walk:queue_key(P, {0, 50, 10}, Base)),
    %% Emptied since: nothing left to rank by.
    ?assertEqual(0, beamdiag_agent_proc_walk:queue_key(P, {0, 0, 10}, Base)),
    %% Born since the start: from nothing.
    Q = list_to_pid("<0.2.0>"),
    ?assertEqual(60, beamdiag_agent_proc_walk:queue_key(Q, {0, 30, 10}, Base)),
    ?assertEqual(0, beamdiag_agent_proc_walk:queue_key(Q, {0, 0, 10}, #{})).

%% Up to the bound every process; above it the sample of the release
%% (every k-th process on OTP 28+, the registered ones before).
pids_test() ->
    Count = erlang:system_info(process_count),
    {all, All} = beamdiag_agent_proc_walk:pids(Count, Count + 1000),
    ?assert(lists:member(self(), All)),
    Registered = lists:sort([whereis(N) || N <- registered(), is_pid(whereis(N))]),
    case beamdiag_agent_proc_walk:pids(Count, 10) of
        {registered, Reg} ->
            ?assertNot(erlang:function_exported(erlang, processes_iterator, 0)),
            ?assertEqual(Registered, lists:sort(Reg));
        {sampled, Sampled} ->
            ?assert(erlang:function_exported(erlang, processes_iterator, 0)),
            ?assert(length(Sampled) =< 10 + length(Registered))
    end.

new_registered_test() ->
    P = spawn(fun() -> receive stop -> ok end end),
    true = register(beamdiag_proc_walk_test_new, P),
    try
        ?assert(lists:member(P, beamdiag_agent_proc_walk:new_registered(#{}))),
        ?assertNot(lists:member(P, beamdiag_agent_proc_walk:new_registered(#{P => {0, 0, 0}})))
    after
        P ! stop
    end.

%% A start walk and an end walk over processes made for them: the queue,
%% the heap and the worker each top their list, and the suspended one is
%% found.
walk_test() ->
    Queue = spawn(fun() -> receive stop -> ok end end),
    [Queue ! {msg, N} || N <- lists:seq(1, 50)],
    Heap = spawn(fun() -> L = lists:seq(1, 100000), receive stop -> length(L) end end),
    Self = self(),
    Worker = spawn(fun() -> receive go -> Self ! {worked, work(200000)} end,
                            receive stop -> ok end end),
    Held = spawn(fun() -> receive stop -> ok end end),
    true = erlang:suspend_process(Held),
    Pids = [Queue, Heap, Worker, Held],
    try
        timer:sleep(50),
        Items = beamdiag_agent_proc_walk:items(false),
        Tops0 = #{queues => beamdiag_agent_top:new(2), heaps => beamdiag_agent_top:new(2)},
        {Walked, Tops, false, []} =
            beamdiag_agent_proc_walk:walk(Pids, now_us(), Items, #{}, #{}, true, Tops0),
        ?assertEqual(lists:sort(Pids), lists:sort([P || {P, _} <- Walked])),
        ?assertMatch([{Queue, {_, 50, _}}], beamdiag_agent_top:items(maps:get(queues, Tops))),
        ?assertEqual(Heap, hd(beamdiag_agent_top:pids(maps:get(heaps, Tops)))),
        ?assertEqual(4, maps:get(walked, Tops)),
        ?assertEqual({1, [Held]}, maps:get(suspended, Tops)),
        ?assertNot(is_map_key(reductions, Tops)),
        %% The end walk: reductions over the window, from the start's figures.
        Worker ! go,
        receive {worked, _} -> ok after 5000 -> error(no_work) end,
        [Queue ! {msg, N} || N <- lists:seq(1, 10)],
        Base = maps:from_list(Walked),
        Tops1 = Tops0#{reductions => beamdiag_agent_top:new(1)},
        {[], End, false, []} =
            beamdiag_agent_proc_walk:walk(Pids, now_us(), Items, Base, #{}, false, Tops1),
        ?assertEqual([Worker], beamdiag_agent_top:pids(maps:get(reductions, End))),
        %% 10 more (growth) plus 60 waiting.
        [{Queue, {_, 60, _}}] = beamdiag_agent_top:items(maps:get(queues, End)),
        ?assertEqual(70, beamdiag_agent_proc_walk:queue_key(Queue, {0, 60, 0}, Base))
    after
        _ = erlang:resume_process(Held),
        [P ! stop || P <- Pids]
    end.

%% A walk past its time is cut short and says so; a process gone is
%% left out without a word.
deadline_and_gone_test() ->
    {Gone, MRef} = spawn_monitor(fun() -> ok end),
    receive {'DOWN', MRef, process, Gone, _} -> ok end,
    Tops0 = #{queues => beamdiag_agent_top:new(2), heaps => beamdiag_agent_top:new(2)},
    Items = beamdiag_agent_proc_walk:items(false),
    {Walked, #{walked := 1}, false, []} =
        beamdiag_agent_proc_walk:walk([Gone, self()], now_us(), Items, #{}, #{}, true, Tops0),
    ?assertMatch([{_, {_, _, _}}], Walked),
    %% Started 10 s ago: past the walk's 500 ms.
    {_, _, true, _} = beamdiag_agent_proc_walk:walk(erlang:processes(), now_us() - 10000000,
                                                    Items, #{}, #{}, false, Tops0).

now_us() ->
    erlang:monotonic_time(microsecond).

work(0) -> done;
work(N) -> _ = erlang:phash2(N), work(N - 1).
