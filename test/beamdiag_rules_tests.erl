-module(beamdiag_rules_tests).
-include_lib("eunit/include/eunit.hrl").

capture(Name) ->
    beamdiag_test_lib:fixture_capture(Name).

findings(Name) ->
    #{findings := F} = beamdiag:analyse(capture(Name)),
    F.

ids(Name) -> [Id || #{id := Id} <- findings(Name)].
serious(Name) -> [Id || F = #{id := Id} <- findings(Name), beamdiag_finding:at_least(F, warning)].

%% Each recorded pathology is named.
named_test_() ->
    [{N, ?_assert(lists:member(Id, serious(N)))} || {N, Id} <- [
        {"busy_wait", busy_wait},
        {"cpu_saturated", cpu_saturated},
        {"cpu_starvation", cpu_starvation},
        {"cpu_throttling", cpu_throttling},
        {"high_system_cpu", high_system_cpu},
        {"dirty_cpu_gc", dirty_cpu_gc},
        {"scheduler_blocking", scheduler_blocking},
        {"scheduler_imbalance", scheduler_imbalance}]].

%% Negative controls.
idle_flags_nothing_test() ->
    ?assertEqual([], serious("idle")).

busy_wait_off_is_not_busy_wait_test() ->
    ?assertNot(lists:member(busy_wait, ids("busy_wait_off"))).

saturated_is_not_blocked_test() ->
    ?assertNot(lists:member(scheduler_blocking, ids("cpu_saturated"))).

throttling_is_named_not_its_symptoms_test() ->
    Ids = ids("cpu_throttling"),
    ?assertNot(lists:member(cpu_starvation, Ids)),
    ?assertNot(lists:member(scheduler_blocking, Ids)).

findings_are_complete_and_sorted_test() ->
    F = findings("cpu_throttling"),
    Ranks = [beamdiag_finding:severity_rank(S) || #{severity := S} <- F],
    ?assertEqual(lists:sort(Ranks), Ranks),
    [begin
         ?assert(is_binary(Fix) andalso byte_size(Fix) > 20),
         ?assert(Ev =/= []),
         ?assert(lists:all(fun is_binary/1, Ev))
     end || #{fix := Fix, evidence := Ev} <- F].

%% Findings quote numbers the ledger measured.
evidence_has_numbers_test() ->
    [#{evidence := [E | _], metrics := M}] = [F || F = #{id := busy_wait} <- findings("busy_wait")],
    ?assertMatch({match, _}, re:run(E, "[0-9]+\\.[0-9]+")),
    ?assert(maps:get(spin_share, M) > 0.4).

no_busy_wait_when_flags_are_none_test() ->
    C = capture("busy_wait"),
    S = maps:get(settings, C),
    Off = C#{settings => S#{sbwt => <<"none">>, sbwtdcpu => <<"none">>, sbwtdio => <<"none">>}},
    #{findings := F} = beamdiag:analyse(Off),
    ?assertNot(lists:member(busy_wait, [Id || #{id := Id} <- F])).

schedulers_exceed_cpus_test() ->
    C = capture("idle"),
    S = maps:get(settings, C),
    More = C#{settings => S#{schedulers_online => 8, logical_processors_available => 2}},
    #{findings := F} = beamdiag:analyse(More),
    ?assert(lists:member(schedulers_exceed_cpus, [Id || #{id := Id} <- F])).

%% The ledger's spin estimate agrees with microstate accounting, which
%% counts busy-waiting inside 'other' on a default emulator.
msacc_cross_check_test() ->
    #{ledger := L, findings := F} = beamdiag:analyse(capture("busy_wait")),
    #{by_type := #{scheduler := S = #{wall := W}},
      msacc := #{by_type := #{scheduler := #{shares := Shares}}}} = L,
    Spin = maps:get(spin, S) / W,
    Other = maps:get(other, Shares),
    ?assert(abs(Spin - Other) < 0.10),
    [#{evidence := Ev}] = [X || X = #{id := busy_wait} <- F],
    ?assert(lists:any(fun(E) -> binary:match(E, <<"msacc">>) =/= nomatch end, Ev)).

%% Runnable-wait counts only while a thread had work: a scheduler that
%% waited for a CPU only to spin (no busy time) is never the worst thread
%% and adds nothing to the wait.
starvation_counts_only_threads_with_work_test() ->
    C = capture("cpu_starvation"),
    L0 = #{threads := Threads} = beamdiag_ledger:build(C),
    [#{runq_s := Runq0}] = [M || #{id := cpu_starvation, metrics := M} <-
                                     beamdiag_rules:findings(C, L0)],
    W = maps:get(window_s, L0),
    Spinner = #{tid => 1, name => <<"9_scheduler">>, type => scheduler, index => 9,
                scheduler_id => 9, wall => W, on_cpu => 0.05 * W, user => 0.05 * W, sys => 0.0,
                runq => 0.9 * W, off_cpu => 0.05 * W, busy => 0.0, spin => 0.05 * W,
                blocked => 0.0, nvcsw => 0, nivcsw => 0, minflt => 0, majflt => 0},
    L = L0#{threads := Threads ++ [Spinner]},
    [#{evidence := Ev, metrics := #{runq_s := Runq}}] =
        [F || F = #{id := cpu_starvation} <- beamdiag_rules:findings(C, L)],
    ?assertEqual(Runq0, Runq),
    ?assertEqual(nomatch, binary:match(iolist_to_binary(Ev), <<"9_scheduler">>)).

%% Starvation names the node's placement (binding, CPUs allowed).
starvation_names_binding_and_cpuset_test() ->
    C = capture("cpu_starvation"),
    S = maps:get(settings, C),
    Bound = C#{settings => S#{bind_type => <<"thread_no_node_processor_spread">>,
                              cpus_allowed => <<"0-1">>}},
    [#{evidence := Ev, fix := Fix}] = [F || F = #{id := cpu_starvation} <-
                                                maps:get(findings, beamdiag:analyse(Bound))],
    E = iolist_to_binary(Ev),
    ?assertMatch({_, _}, binary:match(E, <<"schedulers bound to cores">>)),
    ?assertMatch({_, _}, binary:match(E, <<"may run on CPUs 0-1">>)),
    ?assertMatch({_, _}, binary:match(Fix, <<"+sbt u">>)).

%% "The node uses all the CPU it has" only when the OS says it used 90% of
%% its CPUs; on every capture.
saturation_headline_fits_its_figures_test() ->
    Dir = beamdiag_test_lib:fixture_dir("captures"),
    Title = maps:get(title, beamdiag_catalogue:entry(cpu_saturated)),
    [begin
         {ok, [C]} = file:consult(F),
         [?assert(hd([V || #{name := used_share, value := V} <- Figs]) >= 0.9)
          || #{id := cpu_saturated, title := T, figures := Figs} <-
                 maps:get(findings, beamdiag:analyse(C)), T =:= Title]
     end || F <- filelib:wildcard(filename:join(Dir, "*.capture"))].

%% The field case: high system time on a node that runs with busy waiting
%% off is not told to turn it off, nor to wake schedulers earlier.
high_system_cpu_fitted_to_rabbitmq_flags_test() ->
    C = capture("high_system_cpu"),
    S = maps:get(settings, C),
    Off = C#{settings => S#{sbwt => <<"none">>, sbwtdcpu => <<"none">>, sbwtdio => <<"none">>}},
    [#{fix := Fix, evidence := Ev}] = [F || F = #{id := high_system_cpu} <-
                                                maps:get(findings, beamdiag:analyse(Off))],
    ?assertEqual(nomatch, re:run(Fix, "\\+swt (very_)?low")),
    ?assertEqual(nomatch, re:run(Fix, "\\(\\+sbwt none")),
    ?assertMatch({_, _}, binary:match(iolist_to_binary(Ev), <<"busy waiting is off">>)).

%% A late agent's partial capture: the first two samples of the recorded
%% throttled node (ticks of 2.0 to 3.0 s there), marked partial with a
%% note, still show the throttling (raw: the cgroup's counters moved),
%% and the report says it is partial.
partial_throttled_capture_test() ->
    C0 = capture("cpu_throttling"),
    [S1, S2 | _] = maps:get(samples, C0),
    ?assert(maps:get(tick_cost_us, S1) >= 2000000),
    C = C0#{samples => [S1, S2], complete => false,
            notes => [<<"partial capture: the agent's last word did not come in time">>]},
    #{ledger := L, findings := F} = D = beamdiag:analyse(C),
    Cg = maps:get(cgroup, L),
    ?assert(maps:get(throttled_ratio, Cg) > 0.3),
    ?assertMatch([_], [X || X = #{id := cpu_throttling} <- F]),
    Text = iolist_to_binary(beamdiag_format_text:diagnosis(D, #{colour => false})),
    ?assertNotEqual(nomatch, binary:match(Text, <<"PARTIAL">>)),
    ?assertNotEqual(nomatch, binary:match(Text, <<"last word did not come in time">>)).

%% On-CPU time over msacc's span counts the tick interval that crosses the
%% span's start for its part inside it: three 1 s intervals at 1 CPU each,
%% over the last 1.5 s, are 1.5 CPU-seconds, not 2.
span_on_cpu_prorates_test() ->
    Tick = #{t => 1.0, by_type => #{dirty_cpu => #{on_cpu => 1.0}, scheduler => #{on_cpu => 0.5}}},
    L = #{series => [Tick, Tick, Tick]},
    ?assertEqual(1.5, beamdiag_rules:span_on_cpu(L, dirty_cpu, 1.5)),
    ?assertEqual(2.25, beamdiag_rules:span_on_cpu(L, all, 1.5)),
    ?assertEqual(3.0, beamdiag_rules:span_on_cpu(L, dirty_cpu, 5.0)).

%% dirty_cpu_gc's CPU time stays within its physical bounds: the GC's CPU
%% time within its wall time in msacc, and the dirty schedulers' on-CPU
%% time within their wall time over msacc's span.
dirty_gc_figures_within_bounds_test() ->
    [#{figures := Figs}] = [F || F = #{id := dirty_cpu_gc} <- findings("dirty_cpu_gc")],
    V = maps:from_list([{N, X} || #{name := N, value := X} <- Figs]),
    ?assert(maps:get(dirty_gc_cpu_s, V) =< maps:get(dirty_gc_wall_s, V) + 1.0e-6),
    ?assert(maps:get(dirty_on_cpu_s, V) =< maps:get(msacc_wall_s, V) + 1.0e-6).

%% The same when msacc saw the dirty schedulers awake for less time than
%% the OS saw them on a CPU (the two are read at different moments): the
%% GC's CPU time is still no more than its wall time.
dirty_gc_cpu_within_gc_wall_when_msacc_lags_test() ->
    C = capture("dirty_cpu_gc"),
    L = beamdiag_ledger:build(C),
    #{msacc := M = #{by_type := BT = #{dirty_cpu := D = #{seconds := Secs}}}} = L,
    Awake = lists:sum(maps:values(Secs)) - maps:get(sleep, Secs, 0),
    Lagging = maps:map(fun(sleep, V) -> V + 0.7 * Awake; (_, V) -> 0.3 * V end, Secs),
    L2 = L#{msacc := M#{by_type := BT#{dirty_cpu := D#{seconds := Lagging}}}},
    [#{figures := Figs}] = [F || F = #{id := dirty_cpu_gc} <- beamdiag_rules:findings(C, L2)],
    V = maps:from_list([{N, X} || #{name := N, value := X} <- Figs]),
    ?assert(maps:get(dirty_on_cpu_s, V) > maps:get(dirty_gc_wall_s, V)),
    ?assert(maps:get(dirty_gc_cpu_s, V) =< maps:get(dirty_gc_wall_s, V) + 1.0e-6).

%% ejabberd relaying chat messages between 20 pairs of clients on loopback
%% (a real server, its capture): the raw signal first, msacc's port state
%% over half of the normal schedulers' time awake; then the finding, with
%% its CPU figure within the node's and a fix for socket I/O.
port_io_ejabberd_test() ->
    C = beamdiag_test_lib:fixture_capture("ejabberd_chat"),
    #{ledger := L, findings := F} = beamdiag:analyse(C),
    #{by_type := #{scheduler := #{seconds := Secs}}} = maps:get(msacc, L),
    Awake = lists:sum(maps:values(Secs)) - maps:get(sleep, Secs, 0),
    ?assert(maps:get(port, Secs) / Awake >= 0.5),
    [#{severity := warning, metrics := M, evidence := Ev, fix := Fix}] =
        [X || X = #{id := port_io} <- F],
    ?assert(maps:get(port_share, M) >= 0.5),
    ?assert(maps:get(port_cpus, M) >= 0.2),
    ?assert(maps:get(port_cpus, M) =< maps:get(cpus_used, maps:get(totals, L)) + 0.05),
    ?assertMatch({_, _}, binary:match(iolist_to_binary(Ev), <<"of their time awake">>)),
    ?assertMatch({_, _}, binary:match(iolist_to_binary(Fix), <<"{delay_send, true}">>)).

%% Servers whose port work is a small share (Yaws, a paced RabbitMQ) and the
%% lab's captures get no port_io finding.
port_io_not_elsewhere_test() ->
    [?assertEqual([], [X || X = #{id := port_io} <-
                                maps:get(findings, beamdiag:analyse(
                                                     beamdiag_test_lib:fixture_capture(N)))])
     || N <- ["yaws_flat_out", "yaws_paced", "rabbitmq_paced", "busy_wait", "cpu_saturated"]].

%% A cause drops the symptoms it explains. Seen on a node whose scheduler 1
%% slept in the kernel 800 ms at a time: scheduler_blocking (critical) and
%% scheduler_imbalance advising +scl false +sub true, which cannot move work
%% off a scheduler that is not running. An info-level cause drops nothing.
suppress_explained_test() ->
    F = fun(Id, Sev) -> #{id => Id, severity => Sev} end,
    Ids = fun(Fs) -> [Id || #{id := Id} <- beamdiag_rules:suppress(Fs)] end,
    ?assertEqual([scheduler_blocking],
                 Ids([F(scheduler_blocking, critical), F(scheduler_imbalance, warning)])),
    ?assertEqual([scheduler_blocking, scheduler_imbalance],
                 Ids([F(scheduler_blocking, info), F(scheduler_imbalance, warning)])),
    %% Throttling explains the blocking, which still explains the
    %% imbalance: no balance flag is advised to a throttled node either.
    ?assertEqual([cpu_throttling],
                 Ids([F(cpu_throttling, critical), F(cpu_starvation, warning),
                      F(scheduler_blocking, warning), F(cpu_saturated, warning),
                      F(scheduler_imbalance, warning)])),
    %% The lab's imbalance, with no blocking, keeps its finding.
    #{findings := Lab} = beamdiag:analyse(beamdiag_test_lib:fixture_capture("scheduler_imbalance")),
    ?assert(lists:member(scheduler_imbalance, [Id || #{id := Id} <- Lab])).
