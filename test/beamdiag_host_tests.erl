%%% EUnit tests of beamdiag_host's perf on held threads, on this VM's own
%%% OS process (no scheduler of it is held): turned off, perf never runs
%%% and the handle says so; on, nothing held is profiled, and why is said.
-module(beamdiag_host_tests).
-include_lib("eunit/include/eunit.hrl").

handle(Opts) ->
    OsPid = list_to_integer(os:getpid()),
    beamdiag_host:start(#{os_pid => OsPid, how => given}, Opts#{duration => 6}).

perf_off_test() ->
    H = beamdiag_host:arm(handle(#{perf => false}), #{max_seconds => 2}),
    ?assertNot(beamdiag_host:armed(H)),
    D = beamdiag_host:held(H, #{capture => #{extras => #{}}}),
    ?assertEqual(#{capture => #{extras => #{}}}, D),
    ?assertError({badarg, {held_perf, 'maybe'}}, beamdiag:options(#{held_perf => 'maybe'})),
    ?assertMatch(#{held_perf := true}, beamdiag:options(#{})).

nothing_held_test() ->
    H0 = handle(#{}),
    timer:sleep(1100),
    H = beamdiag_host:arm(H0, #{max_seconds => 2}),
    ?assertNot(beamdiag_host:armed(H)),
    ok = beamdiag_host:cancel(H).

%% A message that is not the handle's perf's result is left alone.
perf_done_other_test() ->
    H = handle(#{}),
    ?assertEqual(ignore, beamdiag_host:perf_done(H, {beamdiag_host, self(), {ok, <<>>, []}})),
    ok = beamdiag_host:cancel(H).
