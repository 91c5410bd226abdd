-module(beamdiag_ledger_tests).
-include_lib("eunit/include/eunit.hrl").

capture(Name) ->
    beamdiag_test_lib:fixture_capture(Name).

by_type(Name, Type) ->
    L = beamdiag_ledger:build(capture(Name)),
    maps:get(Type, maps:get(by_type, L)).

share(K, Row = #{wall := W}) -> beamdiag_ledger:share(K, Row, W).

%% Two hand-made samples one second apart: every field is checked against
%% arithmetic done by hand.
arithmetic_test() ->
    Settings = #{schedulers => 1, dirty_cpu_schedulers => 0, schedulers_online => 1,
                 logical_processors_available => 2},
    T = fun(Run, Wait, U, S) -> #{name => <<"1_scheduler">>, utime => U, stime => S,
                                  minflt => 0, majflt => 0, run_ns => Run, wait_ns => Wait,
                                  nvcsw => 0, nivcsw => 0} end,
    Sample = fun(Tns, Act, Tot, Th) ->
        #{t => Tns, threads => #{1 => Th}, host => {error, none}, cgroup => {error, none},
          vm => #{swt => [{1, Act, Tot}], run_queues => [0, 0, 0], reductions => 0, gcs => 0,
                  gc_words => 0, context_switches => 0, process_count => 1}}
    end,
    C = #{settings => Settings, notes => [],
          samples => [Sample(0, 0, 0, T(0, 0, 0, 0)),
                      %% busy 30% of 1 s; on CPU 0.6 s (3:1 user:sys); 0.1 s runnable.
                      Sample(1000000000, 300, 1000, T(600000000, 100000000, 45, 15))]},
    #{threads := [R], window_s := W} = beamdiag_ledger:build(C),
    ?assertEqual(1.0, W),
    ?assertEqual(0.3, maps:get(busy, R)),
    ?assertEqual(0.6, maps:get(on_cpu, R)),
    ?assert(abs(maps:get(user, R) - 0.45) < 1.0e-9),
    ?assert(abs(maps:get(sys, R) - 0.15) < 1.0e-9),
    ?assertEqual(0.1, maps:get(runq, R)),
    ?assert(abs(maps:get(off_cpu, R) - 0.3) < 1.0e-9),
    ?assert(abs(maps:get(spin, R) - 0.3) < 1.0e-9),
    ?assertEqual(0.0, maps:get(blocked, R)).

%% A capture cut short ends on a middle tick, which kept an idle-looking
%% scheduler thread's figures from the first sample (`carried'): the BEAM
%% counts it busy 0.5 s of the second, the kernel's figures stop at the
%% first sample. Its blocked time is not known, so no rule reads 0.5 s of
%% blocking from it; a thread read afresh keeps its blocked time.
carried_thread_is_not_blocked_test() ->
    Settings = #{schedulers => 2, dirty_cpu_schedulers => 0, schedulers_online => 2,
                 logical_processors_available => 2},
    T = fun(Name, Run, Wait) -> #{name => Name, utime => 0, stime => 0, minflt => 0, majflt => 0,
                                  run_ns => Run, wait_ns => Wait} end,
    Sample = fun(Tns, Swt, Th) ->
        #{t => Tns, threads => Th, host => {error, none}, cgroup => {error, none},
          vm => #{swt => Swt, run_queues => [0, 0, 0], reductions => 0, gcs => 0,
                  gc_words => 0, context_switches => 0, process_count => 1}}
    end,
    First = #{1 => T(<<"1_scheduler">>, 0, 0), 2 => T(<<"2_scheduler">>, 0, 0)},
    Last = #{1 => (T(<<"1_scheduler">>, 0, 0))#{carried => true}, 2 => T(<<"2_scheduler">>, 0, 0)},
    C = #{settings => Settings, notes => [],
          samples => [Sample(0, [{1, 0, 0}, {2, 0, 0}], First),
                      Sample(1000000000, [{1, 500, 1000}, {2, 500, 1000}], Last)]},
    L = #{threads := [R1, R2]} = beamdiag_ledger:build(C),
    ?assertEqual({0.5, undefined}, {maps:get(busy, R1), maps:get(blocked, R1)}),
    ?assertEqual({0.5, 0.5}, {maps:get(busy, R2), maps:get(blocked, R2)}),
    ?assertEqual(0.5, maps:get(blocked, maps:get(scheduler, maps:get(by_type, L)))).

one_sample_gives_a_note_test() ->
    #{notes := [N | _], threads := []} =
        beamdiag_ledger:build(#{samples => [], settings => #{}, notes => []}),
    ?assertMatch(<<"fewer than two", _/binary>>, N).

%% The recorded scenarios show their signal in the ledger itself.
busy_wait_spins_test() ->
    R = by_type("busy_wait", scheduler),
    ?assert(share(on_cpu, R) >= 2 * share(busy, R)).

busy_wait_off_does_not_spin_test() ->
    R = by_type("busy_wait_off", scheduler),
    ?assert(share(spin, R) < 0.05).

saturated_is_busy_test() ->
    R = by_type("cpu_saturated", scheduler),
    ?assert(share(busy, R) > 0.9).

starvation_waits_test() ->
    R = by_type("cpu_starvation", scheduler),
    ?assert(share(runq, R) > 0.3).

blocking_is_blocked_test() ->
    R = by_type("scheduler_blocking", scheduler),
    ?assert(share(blocked, R) > 0.5).

system_cpu_test() ->
    #{totals := #{sys := Sys, on_cpu := On}} = beamdiag_ledger:build(capture("high_system_cpu")),
    ?assert(Sys / On > 0.5).

throttling_test() ->
    #{cgroup := Cg} = beamdiag_ledger:build(capture("cpu_throttling")),
    ?assert(maps:get(throttled_ratio, Cg) > 0.5),
    ?assertEqual(0.2, maps:get(quota_cpus, Cg)).

dirty_gc_test() ->
    #{msacc := #{by_type := #{dirty_cpu := #{seconds := S}}}, window_s := W} =
        beamdiag_ledger:build(capture("dirty_cpu_gc")),
    ?assert(maps:get(gc, S) / W > 0.2).

%% One row set per interval between samples: as many as the capture's
%% samples less one, each with the scheduler's wall time.
series_per_tick_test() ->
    C = #{samples := Samples} = capture("idle"),
    #{series := Series} = beamdiag_ledger:build(C),
    ?assert(length(Series) >= 3),
    ?assertEqual(length(Samples) - 1, length(Series)),
    [?assertMatch(#{by_type := #{scheduler := #{wall := W}}} when W > 0, S) || S <- Series].

%% msacc on for the end of the window only: the ledger reads it over the
%% samples that carry it, and the rule divides by that span.
dirty_gc_slice_test() ->
    C = #{samples := Samples} = capture("dirty_cpu_gc"),
    N = length(Samples),
    Keep = N div 2,
    Cut = [case I =< N - Keep of
               true -> S#{vm := maps:remove(msacc, V)};
               false -> S
           end || {I, S = #{vm := V}} <- lists:enumerate(Samples)],
    #{t := T0} = lists:nth(N - Keep + 1, Samples),
    #{t := T1} = lists:last(Samples),
    L = #{msacc := #{span_s := Span, by_type := #{dirty_cpu := #{seconds := S}}}, window_s := W} =
        beamdiag_ledger:build(C#{samples := Cut}),
    ?assert(abs(Span - (T1 - T0) / 1.0e9) < 1.0e-9),
    ?assert(Span < W),
    ?assert(maps:get(gc, S) / Span > 0.2),
    [#{metrics := #{msacc_span_s := RuleSpan}}] =
        [F || F = #{id := dirty_cpu_gc} <- beamdiag_rules:findings(C#{samples := Cut}, L)],
    ?assertEqual(Span, RuleSpan).

msacc_in_one_sample_is_none_test() ->
    C = #{samples := Samples} = capture("dirty_cpu_gc"),
    Cut = [S#{vm := maps:remove(msacc, V)} || S = #{vm := V} <- lists:droplast(Samples)] ++
          [lists:last(Samples)],
    ?assertEqual(#{}, maps:get(msacc, beamdiag_ledger:build(C#{samples := Cut}))).

%% The five states of a row: shares that add up to 1, running is on-CPU
%% less spinning, counters a little over the wall scaled down to it, and a
%% row with no wall time in no state at all (the one definition HTML, watch
%% and metrics read).
state_shares_test() ->
    ?assertEqual([run, spin, blocked, runq, idle], beamdiag_ledger:states()),
    ?assertEqual(<<"runnable-waiting">>, beamdiag_ledger:state_name(runq)),
    S = beamdiag_ledger:state_shares(#{wall => 2.0, on_cpu => 1.0, spin => 0.4, blocked => 0.2,
                                       runq => 0.2}),
    ?assertEqual(#{run => 0.3, spin => 0.2, blocked => 0.1, runq => 0.1, idle => 0.3},
                 maps:map(fun(_, V) -> round(V * 1000) / 1000 end, S)),
    Over = beamdiag_ledger:state_shares(#{wall => 1.0, on_cpu => 0.8, spin => 0.0,
                                          blocked => 0.1, runq => 0.2}),
    ?assert(abs(lists:sum(maps:values(Over)) - 1.0) < 1.0e-9),
    Zero = maps:from_list([{K, 0.0} || K <- beamdiag_ledger:states()]),
    ?assertEqual(Zero, beamdiag_ledger:state_shares(#{wall => 0.0, on_cpu => 0.0})),
    ?assertEqual(Zero, beamdiag_ledger:state_shares(#{})).

%% A node on the stock emulator gets the note that says what to build to
%% count its locks; a lock-counting node does not.
lock_counting_note_test() ->
    Notes = fun(S) -> maps:get(notes, beamdiag_ledger:build(#{samples => [], settings => S,
                                                                notes => []})) end,
    Stock = #{otp_release => <<"29">>, otp_version => <<"29.1.2">>, erts_version => <<"17.1.1">>,
              lock_counting => false},
    ?assertMatch([_, <<"locks not counted", _/binary>>], Notes(Stock)),
    ?assertMatch([_], Notes(Stock#{lock_counting => true})).

%% The per-tick rows of a few threads are those of a ledger built over
%% each interval alone, in one pass; the host's figures too.
ticks_are_the_intervals_ledgers_test() ->
    [begin
         C = #{samples := Samples} = capture(Name),
         #{threads := All} = beamdiag_ledger:build(C),
         Tids = [Tid || #{tid := Tid} <- lists:sublist(All, 3)],
         Ticks = beamdiag_ledger:ticks(C, Tids),
         Pairs = lists:zip(lists:droplast(Samples), tl(Samples)),
         ?assertEqual(length(Pairs), length(Ticks)),
         ?assert(length(Ticks) >= 2),
         [begin
              L = beamdiag_ledger:build(C#{samples => [A, B], notes => []}),
              ?assertEqual(maps:get(window_s, L), T),
              ?assertEqual([R || R = #{tid := Tid} <- maps:get(threads, L),
                                 lists:member(Tid, Tids)], Rows),
              ?assertEqual(length(Tids), length(Rows)),
              ?assertEqual(maps:with([busy, ncpu], maps:get(host, L)), maps:with([busy, ncpu], H))
          end || {{A, B}, #{t := T, threads := Rows, host := H}} <- lists:zip(Pairs, Ticks)]
     end || Name <- ["busy_wait", "cpu_throttling", "dirty_cpu_gc"]],
    ?assertEqual([], beamdiag_ledger:ticks(#{samples => [], settings => #{}}, [1])).

%% Three threads whose counters, each read at its own instant, sum to 2.06
%% CPUs over the window of a node that may use 2: the node used 2.00, the
%% bound, not more.
cpus_used_within_bound_test() ->
    Settings = #{schedulers => 2, dirty_cpu_schedulers => 0, schedulers_online => 2,
                 logical_processors_available => 2},
    T = fun(Name, Run) -> #{name => Name, utime => 0, stime => 0, minflt => 0, majflt => 0,
                            run_ns => Run, wait_ns => 0} end,
    Sample = fun(Tns, Th) ->
        #{t => Tns, threads => Th, host => {error, none}, cgroup => {error, none},
          vm => #{swt => [{1, 0, 0}, {2, 0, 0}], run_queues => [0, 0, 0], reductions => 0,
                  gcs => 0, gc_words => 0, context_switches => 0, process_count => 1}}
    end,
    Zero = #{1 => T(<<"1_scheduler">>, 0), 2 => T(<<"2_scheduler">>, 0), 3 => T(<<"aux">>, 0)},
    End = #{1 => T(<<"1_scheduler">>, 1000000000), 2 => T(<<"2_scheduler">>, 1000000000),
            3 => T(<<"aux">>, 60000000)},
    C = #{settings => Settings, notes => [],
          samples => [Sample(0, Zero), Sample(1000000000, End)]},
    #{totals := Tot} = beamdiag_ledger:build(C),
    ?assertEqual(2.0, maps:get(cpus_available, Tot)),
    ?assertEqual(2.0, maps:get(cpus_used, Tot)).
