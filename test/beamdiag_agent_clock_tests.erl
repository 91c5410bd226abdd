%%% EUnit tests of the agent's clock: the hard deadline, the next tick when
%%% ticks grow costly, the tick that starts the msacc slice, and whether a
%%% deadline is still ahead.
-module(beamdiag_agent_clock_tests).

-include_lib("eunit/include/eunit.hrl").

%% The hard deadline: 5 s past the window, twice the costliest tick when
%% ticks cost more (a throttled node: 2 to 3 s a tick), 30 s at most.
hard_deadline_test() ->
    ?assertEqual(15000, beamdiag_agent_clock:hard_deadline(10000, 0)),
    ?assertEqual(15000, beamdiag_agent_clock:hard_deadline(10000, 2500)),
    ?assertEqual(16000, beamdiag_agent_clock:hard_deadline(10000, 3000)),
    ?assertEqual(40000, beamdiag_agent_clock:hard_deadline(10000, 60000)).

%% Every tick counted: cheap ticks come one after the other; a 1 s tick
%% waits three of its costs, and a tick that would crowd the last one (at
%% the window's end) is skipped, so the last tick comes next.
next_tick_test() ->
    Start = erlang:monotonic_time(millisecond),
    End = Start + 5000,
    ?assertEqual(1, beamdiag_agent_clock:next_tick(1000, Start, 1, 1000, End)),
    ?assertEqual(5, beamdiag_agent_clock:next_tick(1000000, Start, 1, 1000, End)),
    %% 300 ms ticks: the next may come at 1 s, but one at 4 s would leave
    %% the last one 1 s < 4 x 300 ms of rest: skipped to the last.
    ?assertEqual(1, beamdiag_agent_clock:next_tick(300000, Start, 1, 1000, End)),
    ?assertEqual(5, beamdiag_agent_clock:next_tick(300000, Start, 4, 1000, End)).

%% The tick that starts the msacc slice is never skipped.
msacc_tick_test() ->
    Pending = #{msacc => false, msacc_from => 3},
    ?assertEqual(3, beamdiag_agent_clock:msacc_tick(Pending, 2, 5)),
    ?assertEqual(2, beamdiag_agent_clock:msacc_tick(Pending, 2, 2)),
    ?assertEqual(5, beamdiag_agent_clock:msacc_tick(Pending#{msacc => true}, 2, 5)),
    ?assertEqual(5, beamdiag_agent_clock:msacc_tick(#{msacc => false, msacc_from => never}, 2, 5)).


%% The tick at the window's end is the last one when ticks are cheap; a
%% costly tick can put the next one past the end.
next_tick_end_test() ->
    Start = erlang:monotonic_time(millisecond),
    End = Start + 5000,
    ?assertEqual(5, beamdiag_agent_clock:next_tick(1000, Start, 5, 1000, End)),
    %% 2 s ticks in a 4.5 s window: the next may come only after 6 s, past
    %% the window (the agent takes it at the window's end).
    ?assertEqual(6, beamdiag_agent_clock:next_tick(2000000, Start, 1, 1000, Start + 4500)).

in_time_test() ->
    Now = erlang:monotonic_time(millisecond),
    ?assert(beamdiag_agent_deadline:in_time(infinity)),
    ?assert(beamdiag_agent_deadline:in_time(Now + 60000)),
    ?assertNot(beamdiag_agent_deadline:in_time(Now - 1)).
