%%% EUnit tests of the agent on this node: microstate accounting stays off
%%% until the slice at the end of the window, only the slice's samples carry
%%% its counters, and the flag is back as it was found afterwards; an agent
%%% started with `go' waits for the word before its window. (The clock's
%%% arithmetic: beamdiag_agent_clock_tests; a tick's sample:
%%% beamdiag_agent_tick_tests; the end: beamdiag_agent_cleanup_tests.)
-module(beamdiag_agent_tests).

-include_lib("eunit/include/eunit.hrl").

msacc_slice_test_() ->
    {timeout, 30, [
        {"msacc covers the end of the window only", fun slice/0},
        {"msacc already on: the slice carries it, and it stays on", fun already_on/0},
        {"slice longer than the window: the whole window", fun whole/0}
    ]}.

slice() ->
    false = erlang:system_flag(microstate_accounting, false),
    Self = self(),
    %% A watcher reads the flag while the window runs (reading it means
    %% setting it, so it puts back what it read at once).
    Watcher = spawn_link(fun() -> Self ! {flags, watch([])} end),
    T0 = erlang:monotonic_time(millisecond),
    {ok, D} = beamdiag:diagnose(#{duration => 1.6, interval => 200, msacc_span => 0.4,
                                  locks => false}),
    Took = erlang:monotonic_time(millisecond) - T0,
    %% The diagnosis says when it was ready: after the window, within the call.
    #{ready_ms := Ready} = D,
    ?assert(Ready >= 1600 andalso Ready =< Took),
    Watcher ! stop,
    Flags = receive {flags, F} -> F after 5000 -> error(no_watcher) end,
    #{capture := #{samples := Samples}, ledger := #{msacc := M, window_s := W}} = D,
    With = [S || S = #{vm := #{msacc := [_ | _]}} <- Samples],
    ?assertEqual(false, has_msacc(hd(Samples))),
    ?assert(has_msacc(lists:last(Samples))),
    %% 0.4 s of 1.6 s at 200 ms ticks: the last three samples.
    ?assert(length(With) >= 3 andalso length(With) =< 4),
    #{span_s := Span, by_type := #{scheduler := _}} = M,
    ?assert(Span >= 0.35 andalso Span =< 0.75),
    ?assert(W > 1.4),
    %% Off for the first part of the window, on at its end, off afterwards.
    ?assertEqual(false, hd(Flags)),
    ?assert(lists:member(true, Flags)),
    ?assertNot(erlang:system_flag(microstate_accounting, false)).

already_on() ->
    _ = erlang:system_flag(microstate_accounting, true),
    try
        {ok, D} = beamdiag:diagnose(#{duration => 0.6, interval => 200, msacc_span => 0.2,
                                      locks => false}),
        #{capture := #{samples := Samples}, ledger := #{msacc := #{span_s := Span}, window_s := W}} = D,
        %% Learnt when the slice starts (not by setting the flag at the
        %% window's start): the slice's samples carry it, the last included.
        ?assert(has_msacc(lists:last(Samples))),
        ?assert(Span > 0.0 andalso Span < W),
        ?assert(erlang:system_flag(microstate_accounting, true))
    after
        erlang:system_flag(microstate_accounting, false)
    end.

whole() ->
    {ok, D} = beamdiag:diagnose(#{duration => 0.6, interval => 200, msacc_span => 5,
                                  locks => false}),
    #{capture := #{samples := Samples}, ledger := #{msacc := #{span_s := Span}, window_s := W}} = D,
    ?assert(lists:all(fun has_msacc/1, Samples)),
    ?assert(abs(Span - W) < 1.0e-6),
    ?assertNot(erlang:system_flag(microstate_accounting, false)).

has_msacc(#{vm := #{msacc := [_ | _]}}) -> true;
has_msacc(_) -> false.

watch(Acc) ->
    receive
        stop -> lists:reverse(Acc)
    after 50 ->
        Was = erlang:system_flag(microstate_accounting, true),
        _ = erlang:system_flag(microstate_accounting, Was),
        watch([Was | Acc])
    end.

%% With `go', the agent gets ready (its start walk done), says so to the
%% process named and sends nothing of a window until that process says
%% when the window ends; then the window runs to that end, its start word
%% carries it, and the start walk's report came before the window.
go_test_() ->
    {timeout, 30, [
        {"the window waits for the word and ends at its end", fun go_window/0},
        {"the word's process gone: the agent ends without a window", fun go_gone/0}
    ]}.

go_window() ->
    Self = self(),
    {ok, Agent, Ref} = beamdiag_agent:start(Self, #{duration_ms => 5000, interval_ms => 100,
                                                    msacc => false, go => Self}),
    receive {beamdiag_armed, Agent, Node} -> ?assertEqual(node(), Node)
    after 10000 -> error(not_armed)
    end,
    Before = words(Ref, 300),
    ?assertEqual([], [W || W <- Before, element(1, W) =:= start orelse element(1, W) =:= tick]),
    %% The start walk's report (sent again with who waits on whom, when
    %% that look is done) and the wait's deadline came while ready.
    ?assertMatch([_ | _], [S || {procs_start, S} <- Before]),
    ?assertMatch([_], [D || {deadline, D} <- Before]),
    EndWall = erlang:system_time(millisecond) + 400,
    Agent ! {beamdiag_go, EndWall},
    Window = until_done(Ref, 10000),
    [{start, Info} | _] = [W || W <- Window, element(1, W) =:= start],
    #{end_wall_ms := EndWall, duration_ms := D} = Info,
    %% What was left of the 400 ms, not the 5 s asked.
    ?assert(D =< 400 andalso D >= 200),
    Ticks = [T || {tick, T} <- Window],
    ?assert(length(Ticks) >= 2),
    #{t := T0} = hd(Ticks),
    #{t := T1} = lists:last(Ticks),
    ?assert((T1 - T0) div 1000000 =< 450),
    ?assertMatch({done, _}, lists:last(Window)).

go_gone() ->
    Self = self(),
    Go = spawn(fun() -> receive {beamdiag_armed, A, _} -> Self ! {armed, A} end end),
    {ok, Agent, Ref} = beamdiag_agent:start(Self, #{duration_ms => 5000, interval_ms => 100,
                                                    msacc => false, go => Go}),
    receive {armed, Agent} -> ok after 10000 -> error(not_armed) end,
    MRef = erlang:monitor(process, Agent),
    %% Go has ended (it took the word and returned): the agent ends too,
    %% without a tick, saying why.
    receive {'DOWN', MRef, process, Agent, _} -> ok after 10000 -> error(agent_left) end,
    Words = words(Ref, 100),
    ?assertEqual([], [T || {tick, T} <- Words]),
    ?assertMatch([{aborted, no_go}], [W || W = {aborted, _} <- Words]).

%% The agent's words that come within Ms.
words(Ref, Ms) ->
    receive {beamdiag, Ref, W} -> [W | words(Ref, Ms)]
    after Ms -> []
    end.

until_done(Ref, Ms) ->
    receive
        {beamdiag, Ref, W = {done, _}} -> [W];
        {beamdiag, Ref, W} -> [W | until_done(Ref, Ms)]
    after Ms -> error(no_done)
    end.
