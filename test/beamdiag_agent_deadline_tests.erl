%%% EUnit tests of beamdiag_agent_deadline: deadlines on the monotonic clock.
-module(beamdiag_agent_deadline_tests).

-include_lib("eunit/include/eunit.hrl").

in_time_test() ->
    Now = erlang:monotonic_time(millisecond),
    ?assert(beamdiag_agent_deadline:in_time(infinity)),
    ?assert(beamdiag_agent_deadline:in_time(Now + 60000)),
    ?assertNot(beamdiag_agent_deadline:in_time(Now - 1)),
    NowUs = erlang:monotonic_time(microsecond),
    ?assert(beamdiag_agent_deadline:in_time(NowUs + 60000000, microsecond)),
    ?assertNot(beamdiag_agent_deadline:in_time(NowUs - 1, microsecond)).

left_test() ->
    Now = erlang:monotonic_time(millisecond),
    ?assertEqual(infinity, beamdiag_agent_deadline:left(infinity)),
    %% Never below 0: a receive's timeout.
    ?assertEqual(0, beamdiag_agent_deadline:left(Now - 5000)),
    L = beamdiag_agent_deadline:left(Now + 500),
    ?assert(L =< 500 andalso L >= 0),
    Us = beamdiag_agent_deadline:left(erlang:monotonic_time(microsecond) + 2000000, microsecond),
    ?assert(Us =< 2000000 andalso Us > 1000000).
