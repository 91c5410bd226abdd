%%% Tests of beamdiag_sched_rules: the long-schedule findings.
-module(beamdiag_sched_rules_tests).
-include_lib("eunit/include/eunit.hrl").

%% One process held its scheduler in and out of an Erlang function (the
%% runtime records the NIF's Erlang caller) 3 s of a 6 s window.
report() ->
    #{state => watching, threshold_ms => 50, span_ms => 6000,
      processes => [#{pid => <<"<0.90.0>">>, name => <<"worker">>, native => erlang,
                      in => <<"worker:loop/1">>, count => 30, longest_ms => 110,
                      total_ms => 3000}]}.

%% A ledger whose scheduler threads waited runnable RunqS of their 12 s of
%% wall time (2 schedulers over 6 s).
ledger(RunqS) ->
    #{window_s => 6.0, threads => [],
      by_type => #{scheduler => #{runq => RunqS, wall => 12.0}}}.

ids(Findings) ->
    [Id || #{id := Id} <- Findings].

%% The guard's threshold, a quarter of the window: the test's two sides.
threshold_test() ->
    ?assertEqual(0.25, maps:get(runq_max, beamdiag_sched_rules:thresholds())).

%% The threads got their CPU (runnable 20% of the time): the in-and-out
%% long schedule is taken for native code.
runq_below_guard_test() ->
    F = beamdiag_sched_rules:findings(report(), ledger(0.20 * 12.0)),
    ?assertEqual([long_schedule], ids(F)),
    [#{metrics := M}] = F,
    ?assertEqual(<<"worker">>, maps:get(name, M)),
    ?assertEqual(<<"worker:loop/1">>, maps:get(function, M)),
    ?assertEqual(<<"erlang">>, maps:get(native, M)).

%% They waited runnable 30% of the time (a CPU quota, a starved host): the
%% OS stretched the slices, and no finding is made.
runq_above_guard_test() ->
    ?assertEqual([], beamdiag_sched_rules:findings(report(), ledger(0.30 * 12.0))).

%% The guard is for Erlang functions only: a NIF named by the runtime is
%% reported whatever the run queue.
nif_ignores_guard_test() ->
    #{processes := [P]} = R = report(),
    R2 = R#{processes := [P#{native := nif, in := <<"mynif:spin/1">>}]},
    ?assertEqual([long_schedule],
                 ids(beamdiag_sched_rules:findings(R2, ledger(0.90 * 12.0)))).
