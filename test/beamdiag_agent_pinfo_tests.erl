%%% Reads of many processes that never wait long on one: a process that
%%% holds its scheduler 800 ms at a time with messages waiting (so every
%%% read of it is a request it answers only between its holds) is set
%%% aside, and the others are read; the start walk lists it as stalled and
%%% watches it.
-module(beamdiag_agent_pinfo_tests).
-include_lib("eunit/include/eunit.hrl").

stalled_test_() ->
    {timeout, 60, fun stalled/0}.

stalled() ->
    with_held(fun(Held, Clock) ->
        %% Raw signal: plain reads of it wait for its holds.
        Waits = [begin
                     timer:sleep(97),
                     element(1, timer:tc(erlang, process_info, [Held, message_queue_len]))
                 end || _ <- lists:seq(1, 5)],
        ?debugFmt("plain reads waited ~p us", [Waits]),
        ?assert(lists:max(Waits) > 100000),
        A = spawn(fun() -> receive stop -> ok end end),
        B = spawn(fun() -> receive stop -> ok end end),
        A ! hello,
        %% The fold starts as a hold begins, so that it meets the hold
        %% whatever the host's load (a fold begun in a gap reads it).
        ok = beamdiag_test_lib:hold_begun(Clock),
        T0 = erlang:monotonic_time(millisecond),
        {Read, Stalled, Trunc} =
            beamdiag_agent_pinfo:fold(fun(P, [{message_queue_len, Q}], Acc) -> [{P, Q} | Acc] end,
                                      [], [A, Held, B], [message_queue_len], #{chunk => 2}),
        Took = erlang:monotonic_time(millisecond) - T0,
        ?debugFmt("fold took ~b ms; stalled ~p", [Took, Stalled]),
        ?assertEqual([{B, 0}, {A, 1}], Read),
        ?assertMatch([{Held, W}] when W >= 100, Stalled),
        ?assertNot(Trunc),
        ?assert(Took < 600),
        %% A deadline cuts a fold short (begun as a hold begins, as the
        %% fold above: begun late in one, it may meet the gap).
        ok = beamdiag_test_lib:hold_begun(Clock),
        {_, _, true} = beamdiag_agent_pinfo:fold(fun(_, _, Acc) -> Acc end, [], [Held, A],
                                                 [message_queue_len],
                                                 #{deadline => erlang:monotonic_time(microsecond)
                                                                   + 20000}),
        %% The start walk: done without it, it is stalled and watched.
        ok = beamdiag_test_lib:hold_begun(Clock),
        {WalkUs, S} = timer:tc(beamdiag_agent_processes, start, [#{}]),
        ?debugFmt("start walk ~b us, stalled ~p", [WalkUs, maps:get(stalled, S)]),
        ?assert(lists:keymember(Held, 1, maps:get(stalled, S))),
        ?assert(lists:member(Held, beamdiag_agent_processes:watch(S))),
        Snap = beamdiag_agent_processes:snapshot(S),
        HeldText = list_to_binary(pid_to_list(Held)),
        ?assertMatch([#{queue := [null, null], answered := false}],
                     [E || E = #{pid := P} <- maps:get(queues, Snap), P =:= HeldText]),
        [P ! stop || P <- [A, B]]
    end).

unread_start_test_() ->
    {timeout, 60, fun unread_start/0}.

%% A process the start walk could not read (it held its scheduler), that
%% had taken many reductions and built a large heap before: at the end,
%% read, its reductions and memory over the window are unknown, so it is
%% neither the top of the reductions (counted from zero, it took more than
%% the whole node) nor a heap that grew, nor newborn.
unread_start() ->
    Before = fun() -> Kept = lists:seq(1, 1000000), _ = work(3000000), Kept end,
    with_held(Before, fun(Held, Clock) ->
        ok = beamdiag_test_lib:hold_begun(Clock),
        S = beamdiag_agent_processes:start(#{}),
        ?assert(lists:keymember(Held, 1, maps:get(stalled, S))),
        beamdiag_test_lib:release(Clock),
        %% Raw signal: once it holds no more, it answers, with more
        %% reductions than the node took since the start walk, and a heap
        %% of 8 MB or more.
        ok = beamdiag_test_lib:wait_until(
               fun() -> element(2, erlang:process_info(Held, status)) =:= waiting end, 5000),
        {reductions, HeldReds} = erlang:process_info(Held, reductions),
        {memory, HeldMem} = erlang:process_info(Held, memory),
        R = beamdiag_agent_processes:finish(S, #{}),
        Total = maps:get(reductions, R),
        ?debugFmt("held: ~b reductions, ~b bytes; the node over the span: ~b", [HeldReds, HeldMem,
                                                                              Total]),
        ?assert(HeldReds > Total),
        ?assert(HeldMem >= 8000000),
        HeldText = list_to_binary(pid_to_list(Held)),
        Of = fun(Key) -> [E || E = #{pid := P} <- maps:get(Key, R), P =:= HeldText] end,
        ?assertEqual([], Of(top_reductions)),
        ?assertEqual([], [E || E = #{reductions := Rs} <- maps:get(top_reductions, R), Rs > Total]),
        ?assertEqual([], Of(heap_growth)),
        [E] = Of(heaps),
        ?assertMatch(#{memory := [null, _], born := false, reductions := 0}, E),
        %% Its memory at the end: read (8 MB or more), or, when the end
        %% walk's read was not answered within its bound either (a host
        %% whose other work delays the held process's signals), estimated
        %% from its heap and said to be, after the bound was waited.
        case maps:get(answered, E, true) of
            false ->
                ?debugFmt("the end read was not answered within ~b ms: estimated",
                          [maps:get(waited_ms, E)]),
                ?assertMatch(#{memory_estimated := true}, E),
                ?assert(maps:get(waited_ms, E) >= 100);
            true ->
                ?assert(lists:last(maps:get(memory, E)) >= 8000000)
        end,
        Held ! stop
    end).

work(0) -> ok;
work(N) -> _ = erlang:phash2(N), work(N - 1).

%% Items the runtime does not know are a caller's bug: an exception.
bad_items_test() ->
    ?assertError({beamdiag_agent_pinfo, _},
                 beamdiag_agent_pinfo:fold(fun(_, _, Acc) -> Acc end, [], [self()], [no_such_item],
                                           #{})).

%%% Helpers

with_held(Fun) ->
    with_held(fun() -> none end, Fun).

with_held(Before, Fun) ->
    case erlang:system_info(schedulers_online) >= 2 of
        false ->
            ok;
        true ->
            %% Loaded first: the code server may be queued on the held
            %% scheduler.
            _ = [{module, M} = code:ensure_loaded(M)
                 || M <- [beamdiag_agent_pinfo, beamdiag_agent_processes, beamdiag_agent_proc_walk,
                          beamdiag_agent_top, beamdiag_agent_proc_memory,
                          beamdiag_agent_proc_identity, beamdiag_agent_queues, timer, atomics]],
            _ = beamdiag_agent_processes:snapshot(beamdiag_agent_processes:start(#{})),
            %% Clock: when the latest hold began (monotonic ms), for the reader.
            {Held, Clock} = beamdiag_test_lib:held_scheduler(Before),
            [Held ! {msg, I} || I <- lists:seq(1, 50)],
            %% Read from the other scheduler (a reader on the held one runs
            %% only in its gaps).
            Self = self(),
            Ref = make_ref(),
            _ = beamdiag_test_lib:bound(2, fun() -> Self ! {Ref, catch Fun(Held, Clock)} end),
            try
                receive
                    {Ref, {'EXIT', Why}} -> erlang:error(Why);
                    {Ref, R} -> R
                after 50000 -> erlang:error(timeout)
                end
            after
                exit(Held, kill)
            end
    end.
