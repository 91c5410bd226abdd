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

%% The sampler's report (the system monitor taken): the shape the watcher
%% gives it, one process seen held in 25 of 38 samples.
sampler_report(Count) ->
    #{state => taken, source => sampler, span_ms => 5000,
      taken_by => #{pid => <<"<0.298.0>">>, name => <<"rabbit_sysmon_handler">>},
      sampler => #{samples => 38, signs => 25, candidates => 1, rate_hz => 10, held_ms => 10,
                   walks => [#{read => 252, slow => 1}]},
      nif_modules => [<<"mynif: spin/1">>],
      processes => [#{pid => <<"<0.96.0>">>, name => null, initial_call => <<"erlang:apply/2">>,
                      native => erlang, in => <<"worker:call_loop/3">>,
                      out => <<"worker:call_loop/3">>, count => Count, consecutive => 7,
                      samples => 38, longest_ms => 100, total_ms => 2300}]}.

%% A sampled hold makes the same finding as the runtime's events, says it
%% was sampled and estimated, and names the NIF libraries.
sampler_finding_test() ->
    F = beamdiag_sched_rules:findings(sampler_report(25), ledger(0.10 * 12.0)),
    ?assertEqual([long_schedule], ids(F)),
    [#{metrics := M, evidence := Ev}] = F,
    ?assertEqual(<<"<0.96.0>">>, maps:get(pid, M)),
    ?assertEqual(<<"worker:call_loop/3">>, maps:get(function, M)),
    ?assertEqual(<<"sampler">>, maps:get(source, M)),
    Text = iolist_to_binary(lists:join("\n", Ev)),
    ?assertMatch({_, _}, binary:match(Text, <<"25 of 38 samples (7 in a row)">>)),
    ?assertMatch({_, _}, binary:match(Text, <<"estimates from the samples' spacing">>)),
    ?assertMatch({_, _}, binary:match(Text, <<"mynif: spin/1">>)),
    %% ...and drops the imbalance it explains.
    Imb = #{id => scheduler_imbalance},
    ?assertEqual([long_schedule], ids(beamdiag_sched_rules:suppress([Imb | F]))).

%% A process the walks found late in the window: held in 9 of its 18
%% samples over its last 1.8 s, 900 ms estimated over a 5.1 s window. Its
%% share is that of the time it was watched (50%), not of the window
%% (18%, under the rule's quarter); with fewer samples than the rule's
%% minimum, the window's share stands and there is no finding.
sampler_found_late_test() ->
    R = #{processes := [P]} = sampler_report(9),
    Late = R#{span_ms := 5113, processes := [P#{samples := 18, total_ms := 900, consecutive := 4,
                                               watched_ms => 1800}]},
    [#{metrics := M, evidence := Ev, severity := Sev}] =
        beamdiag_sched_rules:findings(Late, ledger(0.10 * 12.0)),
    ?assertEqual(0.5, maps:get(held_share, M)),
    ?assertEqual(<<"watched">>, maps:get(held_share_of, M)),
    ?assertEqual(critical, Sev),
    Text = iolist_to_binary(lists:join("\n", Ev)),
    ?assertMatch({_, _}, binary:match(Text, <<"9 of 18 samples (4 in a row) over 1.8 s of watching">>)),
    ?assertMatch({_, _}, binary:match(Text, <<"held 50.0% of the time it was watched">>)),
    Few = R#{span_ms := 5113, processes := [P#{samples := 9, total_ms := 900}]},
    ?assertEqual([], beamdiag_sched_rules:findings(Few, ledger(0.10 * 12.0))).

%% Late answers after collections are not held samples, and the evidence
%% says how many there were.
sampler_collected_test() ->
    R = #{processes := [P]} = sampler_report(25),
    [#{evidence := Ev}] = beamdiag_sched_rules:findings(R#{processes := [P#{collected => 4}]},
                                                        ledger(0.10 * 12.0)),
    ?assertMatch({_, _}, binary:match(iolist_to_binary(Ev),
                                      <<"4 more late answers followed a garbage collection">>)).

%% Fewer held samples than the rule's minimum: no finding.
sampler_too_few_test() ->
    ?assertEqual([], beamdiag_sched_rules:findings(sampler_report(2), ledger(0.10 * 12.0))).

%% Late answers on a host whose scheduler threads wait for a CPU (a
%% quarter of their time or more) are not read as a held scheduler; the
%% runtime's events of a NIF are.
sampler_starved_host_test() ->
    ?assertEqual([], beamdiag_sched_rules:findings(sampler_report(25), ledger(0.30 * 12.0))),
    ?assertMatch([_], beamdiag_sched_rules:findings(sampler_report(25), ledger(0.20 * 12.0))).

%% A process sampled late in erlang:hibernate/3 was being collected, not
%% holding its scheduler in a BIF.
sampler_hibernate_test() ->
    R = #{processes := [P | _]} = sampler_report(25),
    R2 = R#{processes := [P#{in => <<"erlang:hibernate/3">>, out => <<"erlang:hibernate/3">>,
                            native => bif}]},
    ?assertEqual([], beamdiag_sched_rules:findings(R2, ledger(0.10 * 12.0))).

%% The events' evidence does not claim sampling.
events_not_sampled_test() ->
    [#{metrics := M, evidence := Ev}] = beamdiag_sched_rules:findings(report(), ledger(0.0)),
    ?assertEqual(<<"system_monitor">>, maps:get(source, M)),
    ?assertEqual(nomatch, binary:match(iolist_to_binary(Ev), <<"ample">>)).

%% The note says the monitor is taken, by whom, and that it was sampled.
sampler_note_test() ->
    N = beamdiag_sched_rules:note(sampler_report(25)),
    ?assertMatch({_, _}, binary:match(N, <<"system monitor is taken by rabbit_sysmon_handler "
                                           "<0.298.0> and was left alone">>)),
    ?assertMatch({_, _}, binary:match(N, <<"sampled instead: 38 samples">>)),
    ?assertEqual(none, beamdiag_sched_rules:note(report())).
