%%% EUnit tests of beamdiag_host_session's perf on held threads, on this VM's own
%%% OS process (no scheduler of it is held): turned off, perf never runs
%%% and the handle says so; on, nothing held is profiled, and why is said.
-module(beamdiag_host_session_tests).
-include_lib("eunit/include/eunit.hrl").

handle(Opts) ->
    OsPid = list_to_integer(os:getpid()),
    beamdiag_host_session:start(#{os_pid => OsPid, how => given}, Opts#{duration => 6}).

perf_off_test() ->
    H = beamdiag_host_session:arm(handle(#{perf => false}), #{max_seconds => 2}),
    ?assertNot(beamdiag_host_session:armed(H)),
    C = beamdiag_host_session:with_held_perf(H, #{extras => #{}}),
    ?assertEqual(#{extras => #{}}, C),
    ?assertError({badarg, {held_perf, 'maybe'}}, beamdiag:options(#{held_perf => 'maybe'})),
    ?assertMatch(#{held_perf := true}, beamdiag:options(#{})).

nothing_held_test() ->
    H0 = handle(#{}),
    timer:sleep(1100),
    H = beamdiag_host_session:arm(H0, #{max_seconds => 2}),
    ?assertNot(beamdiag_host_session:armed(H)),
    ok = beamdiag_host_session:cancel(H).

%% A message that is not the handle's perf's result is left alone.
perf_done_other_test() ->
    H = handle(#{}),
    ?assertEqual(ignore, beamdiag_host_session:perf_done(H, {beamdiag_host_session, self(), {ok, <<>>, []}})),
    ok = beamdiag_host_session:cancel(H).
