%%% @doc The ledger rules: from a ledger and the VM's settings to findings.
%%%
%%% Each rule reads the ledger, compares a ratio with its thresholds and,
%%% when it fires, builds a finding whose evidence quotes the numbers. The
%%% thresholds are data (`thresholds/0'), documented in docs/LEDGER.md.
%%% Lock and profile findings come from `beamdiag_lock_rules' and
%%% `beamdiag_profile_rules' when the capture carries that data.
%%%
%%% ```
%%% 1> [Id || #{id := Id} <- beamdiag_rules:findings(Capture, Ledger)].
%%% [busy_wait]
%%% '''
-module(beamdiag_rules).

-export([findings/2]).
%% Called by the tests only.
-ifdef(TEST).
-export([span_on_cpu/3, suppress/1]).
-endif.

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Every finding for a capture and its ledger, most severe first.
-spec findings(beamdiag_capture:capture(), beamdiag_ledger:ledger()) ->
    [beamdiag_finding:finding()].
findings(Capture, Ledger = #{threads := Threads}) when Threads =/= [] ->
    Settings = maps:get(settings, Capture),
    T = thresholds(),
    Ledgers = lists:append([
        Rule(Ledger, Settings, T)
     || Rule <- [
            fun busy_wait/3,
            fun cpu_throttling/3,
            fun cpu_starvation/3,
            fun scheduler_blocking/3,
            fun high_system_cpu/3,
            fun dirty_cpu_gc/3,
            fun port_io/3,
            fun scheduler_imbalance/3,
            fun cpu_saturated/3,
            fun schedulers_exceed_cpus/3
        ]
    ]),
    %% Threads blocked in the kernel (beamdiag_wait_rules): the dirty IO
    %% schedulers' finding, and the calls behind scheduler_blocking.
    Waits = beamdiag_wait_rules:findings(Capture, Ledger, #{}),
    Own = beamdiag_wait_rules:annotate(suppress(Ledgers ++ Waits), Capture, Ledger),
    beamdiag_finding:sort(beamdiag_sched_rules:suppress(
        processes(Own ++ extras(Capture, Ledger), Capture, Ledger)));
findings(Capture, Ledger) ->
    beamdiag_finding:sort(processes(extras(Capture, Ledger), Capture, Ledger)).

%% @doc The thresholds the rules use.
-spec thresholds() -> #{atom() => number()}.
thresholds() ->
    #{
        %% Spinning as a share of the schedulers' on-CPU time, and in CPUs.
        spin_share_info => 0.25,
        spin_share_warn => 0.40,
        spin_cpus_min => 0.10,
        %% Runnable-wait as a share of scheduler wall time.
        runq_share_warn => 0.10,
        runq_share_crit => 0.30,
        %% CPUs used by the rest of the host below which a runnable wait is
        %% the node competing with itself.
        external_cpus_min => 0.30,
        %% Share of CFS periods throttled, and throttled time per second.
        throttled_ratio_warn => 0.10,
        throttled_ratio_crit => 0.40,
        throttled_share_min => 0.02,
        %% Blocked as a share of busy time (normal and dirty CPU schedulers).
        blocked_share_warn => 0.25,
        blocked_share_crit => 0.50,
        blocked_cpus_min => 0.10,
        %% System time as a share of the node's on-CPU time.
        sys_share_warn => 0.30,
        sys_share_crit => 0.60,
        sys_cpus_min => 0.10,
        %% GC on dirty CPU schedulers, in CPUs.
        dirty_gc_cpus_warn => 0.10,
        %% Port work as a share of the normal schedulers' time awake (msacc),
        %% and in CPUs.
        port_share_info => 0.35,
        port_share_warn => 0.50,
        port_cpus_min => 0.20,
        %% Busy spread between the busiest and idlest normal scheduler.
        imbalance_spread => 0.50,
        imbalance_mean_min => 0.15,
        imbalance_mean_max => 0.75,
        %% CPU used by the node as a share of the CPUs it has.
        saturated_share => 0.90,
        saturated_busy => 0.85
    }.

%%%===================================================================
%%% Internal
%%%===================================================================

busy_wait(L, Settings, T) ->
    Rows = sched_rows(L, [scheduler, dirty_cpu, dirty_io]),
    OnCpu = sum(on_cpu, Rows),
    Busy = sum(busy, Rows),
    Spin = sum(spin, Rows),
    W = window(L),
    SpinCpus = Spin / W,
    Share = ratio(Spin, OnCpu),
    Flags = [beamdiag_flags:value(K, Settings) || K <- beamdiag_flags:busy_wait_keys()],
    AllOff = beamdiag_flags:busy_wait_off(Settings),
    Severity =
        if
            AllOff -> none;
            SpinCpus < map_get(spin_cpus_min, T) -> none;
            Share >= map_get(spin_share_warn, T) ->
                case contended(L, T) of
                    true -> critical;
                    false -> warning
                end;
            Share >= map_get(spin_share_info, T) -> info;
            true -> none
        end,
    emit(busy_wait, Severity, [
        fmt("scheduler threads were on CPU ~.2f CPU-seconds but busy ~.2f s: ~.2f CPU-seconds "
            "spinning (~s of their CPU time)", [OnCpu, Busy, Spin, beamdiag_units:pct(Share)]),
        fmt("spinning burns ~.2f CPUs of the ~.2f the node uses", [SpinCpus, cpus_used(L)]),
        fmt("busy-wait flags in effect: +sbwt ~s +sbwtdcpu ~s +sbwtdio ~s", Flags)
    ] ++ msacc_spin(L), #{spin_s => Spin, on_cpu_s => OnCpu, busy_s => Busy, spin_share => Share,
         spin_cpus => SpinCpus},
      [fig(on_cpu_s, OnCpu, cpu_s), fig(spin_s, Spin, cpu_s, on_cpu_s),
       fig(busy_s, Busy, wall_s, sched_wall_s), fig(sched_wall_s, sum(wall, Rows), wall_s),
       fig(spin_share, Share, share), fig(spin_cpus, SpinCpus, cpus, cpus_used),
       fig(cpus_used, cpus_used(L), cpus)], Settings).

cpu_starvation(L, Settings, T) ->
    %% Runnable-wait counts only while the thread had work: the BEAM's busy
    %% time includes time descheduled by the OS, while a thread that waits
    %% for a CPU only to spin or to go to sleep was not kept from any work.
    Rows = [R#{runq := min(maps:get(runq, R), maps:get(busy, R))}
            || R <- sched_rows(L, [scheduler, dirty_cpu])],
    Runq = sum(runq, Rows),
    Wall = sum(wall, Rows),
    Share = ratio(Runq, Wall),
    Host = maps:get(host, L),
    Steal = maps:get(steal, Host, 0.0),
    %% CPU the rest of the host used: when it is small, the node's own
    %% threads (normal and dirty schedulers together) want more CPUs than
    %% there are, which the node's other findings explain better.
    External = max(0.0, maps:get(busy, Host, 0.0) * maps:get(ncpu, Host, 0) - cpus_used(L)),
    Own = External + Steal * maps:get(ncpu, Host, 0) < map_get(external_cpus_min, T),
    Severity = case level(Share, map_get(runq_share_warn, T), map_get(runq_share_crit, T)) of
                   none -> none;
                   _ when Own -> info;
                   S -> S
               end,
    Worst = worst(runq, Rows),
    WorstShare = ratio(maps:get(runq, Worst), maps:get(wall, Worst)),
    emit(cpu_starvation, Severity, [
        fmt("scheduler threads with work waited ~.2f s (wall time) for a CPU: ~s of their "
            "~.2f s of wall time", [Runq, beamdiag_units:pct(Share), Wall]),
        fmt("worst thread ~s waited for a CPU ~s of the window while it had work",
            [maps:get(name, Worst), beamdiag_units:pct(WorstShare)]),
        fmt("host: ~b CPUs, ~s busy, steal ~s, load ~s; the node used ~.2f CPUs, the rest of the host ~.2f",
            [maps:get(ncpu, Host, 0), beamdiag_units:pct(maps:get(busy, Host, 0.0)), beamdiag_units:pct(Steal), load(Host), cpus_used(L), External])
    ] ++ [<<"little else runs on the host: the node's own busy threads (normal and dirty "
            "schedulers) outnumber its CPUs">> || Own]
      ++ competitors(L) ++ placement(Settings),
      #{runq_s => Runq, runq_share => Share, steal_share => Steal, external_cpus => External,
        host_busy => maps:get(busy, Host, 0.0)},
      [fig(runq_s, Runq, wall_s, sched_wall_s), fig(sched_wall_s, Wall, wall_s),
       fig(runq_share, Share, share), fig(worst_runq_share, WorstShare, share),
       fig(host_busy, maps:get(busy, Host, 0.0), share, #{scope => host}),
       fig(steal_share, Steal, share, #{scope => host}),
       fig(external_cpus, External, cpus, #{scope => host}),
       fig(cpus_used, cpus_used(L), cpus)], Settings).

cpu_throttling(L, Settings, T) ->
    Cg = maps:get(cgroup, L),
    Ratio = maps:get(throttled_ratio, Cg, 0.0),
    Share = maps:get(throttled_share, Cg, 0.0),
    Severity =
        case Share >= map_get(throttled_share_min, T) of
            true -> level(Ratio, map_get(throttled_ratio_warn, T), map_get(throttled_ratio_crit, T));
            false -> none
        end,
    %% The kernel sums throttled time over the CPUs' run queues, so it is
    %% bounded by the window times the host's CPUs, not by the window.
    Ncpu = max(1, maps:get(ncpu, maps:get(host, L), 1)),
    ThrottledS = maps:get(throttled_s, Cg, 0.0),
    Bound = window(L) * Ncpu,
    emit(cpu_throttling, Severity, [
        fmt("~b of ~b CFS periods throttled (~s)",
            [maps:get(throttled_periods, Cg, 0), maps:get(periods, Cg, 0), beamdiag_units:pct(Ratio)]),
        fmt("run queues throttled ~.2f s in all, of ~.2f s (a ~.1f s window on ~b CPUs; the "
            "kernel sums throttled time over the CPUs)", [ThrottledS, Bound, window(L), Ncpu]),
        fmt("quota ~s CPUs; the node used ~.2f CPUs", [num(maps:get(quota_cpus, Cg, unlimited)), cpus_used(L)])
    ], #{throttled_ratio => Ratio, throttled_share => Share,
         quota_cpus => quota(maps:get(quota_cpus, Cg, unlimited))},
      [fig(throttled_ratio, Ratio, share),
       fig(throttled_s, ThrottledS, wall_s, #{scope => host, part_of => runq_wall_s}),
       fig(runq_wall_s, Bound, wall_s, #{scope => host}),
       fig(cpus_used, cpus_used(L), cpus)], Settings).

scheduler_blocking(L, Settings, T) ->
    Rows = sched_rows(L, [scheduler, dirty_cpu]),
    Busy = sum(busy, Rows),
    Blocked = sum(blocked, Rows),
    Share = ratio(Blocked, Busy),
    Severity =
        case Blocked / window(L) >= map_get(blocked_cpus_min, T) of
            true -> level(Share, map_get(blocked_share_warn, T), map_get(blocked_share_crit, T));
            false -> none
        end,
    Maj = sum(majflt, Rows),
    Vol = sum(nvcsw, Rows),
    emit(scheduler_blocking, Severity, [
        fmt("schedulers busy ~.2f s but on CPU or waiting for one only ~.2f s: ~.2f s blocked (~s of busy)",
            [Busy, Busy - Blocked, Blocked, beamdiag_units:pct(Share)]),
        fmt("~b voluntary context switches, ~b major page faults on these threads over the window",
            [round(Vol), round(Maj)]),
        lock_hint(L)
    ], #{blocked_s => Blocked, busy_s => Busy, blocked_share => Share, major_faults => Maj},
      [fig(busy_s, Busy, wall_s, sched_wall_s), fig(sched_wall_s, sum(wall, Rows), wall_s),
       fig(blocked_s, Blocked, wall_s, busy_s), fig(blocked_share, Share, share),
       fig(major_faults, Maj, count)], Settings).

high_system_cpu(L, Settings, T) ->
    #{on_cpu := OnCpu, sys := Sys} = maps:get(totals, L),
    Share = ratio(Sys, OnCpu),
    Severity =
        case Sys / window(L) >= map_get(sys_cpus_min, T) of
            true -> level(Share, map_get(sys_share_warn, T), map_get(sys_share_crit, T));
            false -> none
        end,
    Worst = worst(sys, maps:get(threads, L)),
    Faults = sum(minflt, maps:get(threads, L)) + sum(majflt, maps:get(threads, L)),
    emit(high_system_cpu, Severity, [
        fmt("system time ~.2f CPU-seconds of ~.2f on CPU (~s)", [Sys, OnCpu, beamdiag_units:pct(Share)]),
        fmt("most in ~s (~.2f CPU-seconds); ~b page faults over the window, ~b context switches/s on the node",
            [maps:get(name, Worst), maps:get(sys, Worst), round(Faults),
             round(maps:get(context_switches_per_s, maps:get(vm, L), 0.0))])
    ] ++ busy_wait_state(Settings),
      #{sys_s => Sys, on_cpu_s => OnCpu, sys_share => Share, page_faults => Faults},
      [fig(on_cpu_s, OnCpu, cpu_s), fig(sys_s, Sys, cpu_s, on_cpu_s),
       fig(worst_sys_s, maps:get(sys, Worst), cpu_s, sys_s), fig(sys_share, Share, share),
       fig(page_faults, Faults, count)], Settings).

%% The CPU time threads of one type spent in some msacc states, over the
%% span msacc covered (the end of the window). msacc's state times are wall
%% time, waiting for a CPU included: the states' CPU is their share of the
%% threads' non-sleeping wall time applied to the threads' on-CPU time over
%% the same span. `none' without msacc for that type.
state_cpu(L, Type, States) ->
    case maps:get(msacc, L) of
        M = #{by_type := #{Type := #{seconds := Secs, n := N}}} ->
            Wall = lists:sum([maps:get(S, Secs, 0) || S <- States]),
            Span = maps:get(span_s, M, window(L)),
            Awake = lists:sum(maps:values(Secs)) - maps:get(sleep, Secs, 0),
            Share = min(1.0, ratio(Wall, Awake)),
            OnCpu = span_on_cpu(L, Type, Span),
            %% Never more CPU time than wall time in the states: msacc is
            %% read when each thread answers (a dirty scheduler in a long
            %% collection answers after it) and the OS counters when the
            %% tick reads them, so the two spans can differ by that long.
            Cpu = min(OnCpu * Share, Wall),
            #{wall => Wall, span => Span, n => N, share => Share, on_cpu => OnCpu, cpu => Cpu,
              cpus => Cpu / max(Span, 1.0e-9),
              %% The node's CPUs over the same span: the window's average
              %% would put a burst at the window's end above the node.
              span_cpus => span_on_cpu(L, all, Span) / max(Span, 1.0e-9)};
        _ ->
            none
    end.

dirty_cpu_gc(L, Settings, T) ->
    case state_cpu(L, dirty_cpu, [gc, gc_full]) of
        #{wall := GcWall, span := Span, n := N, share := GcShare, on_cpu := OnCpu, cpu := GcCpu,
          cpus := Cpus, span_cpus := SpanCpus} ->
            Mdai = beamdiag_flags:value(mdai, Settings),
            SharedInstance = Mdai =:= beamdiag_flags:default(mdai),
            Severity =
                case Cpus >= map_get(dirty_gc_cpus_warn, T) of
                    true when SharedInstance -> warning;
                    true -> info;
                    false -> none
                end,
            emit(dirty_cpu_gc, Severity, [
                fmt("dirty CPU schedulers were in garbage collection ~.2f s of their ~.2f s of "
                    "wall time (msacc over the last ~.1f s, ~b threads; wall time, waiting for "
                    "a CPU included): ~s of their time awake",
                    [GcWall, Span * N, Span, N, beamdiag_units:pct(GcShare)]),
                fmt("they were on CPU ~.2f CPU-seconds in that span, so garbage collection "
                    "took about ~.2f CPU-seconds: ~.2f CPUs of the ~.2f the node used in that span",
                    [OnCpu, GcCpu, Cpus, SpanCpus]),
                fmt("~b GCs/s node-wide, ~.1f MB reclaimed/s; +Mdai is ~s (~b eheap_alloc instances for ~b schedulers)",
                    [round(maps:get(gcs_per_s, maps:get(vm, L), 0.0)),
                     maps:get(gc_words_per_s, maps:get(vm, L), 0.0) * 8 / 1.0e6, Mdai,
                     maps:get(eheap_alloc_instances, Settings, 0), maps:get(schedulers, Settings)])
            ], #{dirty_gc_s => GcCpu, dirty_gc_cpus => Cpus, msacc_span_s => Span,
                 dirty_gc_wall_s => GcWall},
              [fig(dirty_gc_wall_s, GcWall, wall_s, msacc_wall_s),
               fig(msacc_wall_s, Span * N, wall_s),
               fig(dirty_gc_awake_share, GcShare, share),
               fig(dirty_on_cpu_s, OnCpu, cpu_s), fig(dirty_gc_cpu_s, GcCpu, cpu_s, dirty_on_cpu_s),
               fig(dirty_gc_cpus, Cpus, cpus, #{scope => span, part_of => span_cpus_used}),
               fig(span_cpus_used, SpanCpus, cpus, #{scope => span})],
              Settings);
        none ->
            []
    end.

%% Port work (drivers' callbacks, for sockets the inet driver's sends and
%% receives) as a share of the normal schedulers' time awake, and its CPU.
port_io(L, Settings, T) ->
    case state_cpu(L, scheduler, [port]) of
        #{wall := PortWall, span := Span, n := N, share := Share, on_cpu := OnCpu, cpu := Cpu,
          cpus := Cpus, span_cpus := SpanCpus} ->
            Severity =
                if
                    Cpus < map_get(port_cpus_min, T) -> none;
                    Share >= map_get(port_share_warn, T) -> warning;
                    Share >= map_get(port_share_info, T) -> info;
                    true -> none
                end,
            Rows = sched_rows(L, [scheduler]),
            SysShare = ratio(sum(sys, Rows), sum(on_cpu, Rows)),
            emit(port_io, Severity, [
                fmt("schedulers were in port work ~.2f s of their ~.2f s of wall time (msacc "
                    "over the last ~.1f s, ~b threads; wall time, waiting for a CPU included): "
                    "~s of their time awake", [PortWall, Span * N, Span, N, beamdiag_units:pct(Share)]),
                fmt("they were on CPU ~.2f CPU-seconds in that span, so port work took about "
                    "~.2f CPU-seconds: ~.2f CPUs of the ~.2f the node used in that span",
                    [OnCpu, Cpu, Cpus, SpanCpus]),
                fmt("the kernel took ~s of the schedulers' CPU time over the window, with ~b "
                    "context switches/s on the node: a socket send is a system call",
                    [beamdiag_units:pct(SysShare),
                     round(maps:get(context_switches_per_s, maps:get(vm, L), 0.0))])
            ], #{port_cpu_s => Cpu, port_cpus => Cpus, msacc_span_s => Span,
                 port_wall_s => PortWall, port_share => Share},
              [fig(port_wall_s, PortWall, wall_s, msacc_wall_s),
               fig(msacc_wall_s, Span * N, wall_s),
               fig(port_awake_share, Share, share),
               fig(sched_on_cpu_s, OnCpu, cpu_s), fig(port_cpu_s, Cpu, cpu_s, sched_on_cpu_s),
               fig(port_cpus, Cpus, cpus, #{scope => span, part_of => span_cpus_used}),
               fig(span_cpus_used, SpanCpus, cpus, #{scope => span}),
               fig(sched_sys_share, SysShare, share)],
              Settings);
        none ->
            []
    end.

scheduler_imbalance(L, Settings, T) ->
    Online = maps:get(schedulers_online, Settings),
    Rows = [R || R = #{type := scheduler, index := I} <- maps:get(threads, L), I =< Online,
                 is_number(maps:get(busy, R))],
    case length(Rows) >= 2 of
        true ->
            Shares = [ratio(maps:get(busy, R), maps:get(wall, R)) || R <- Rows],
            Mean = lists:sum(Shares) / length(Shares),
            Spread = lists:max(Shares) - lists:min(Shares),
            Severity =
                case Spread >= map_get(imbalance_spread, T) andalso
                     Mean >= map_get(imbalance_mean_min, T) andalso
                     Mean =< map_get(imbalance_mean_max, T) of
                    true -> warning;
                    false -> none
                end,
            emit(scheduler_imbalance, Severity, [
                fmt("normal schedulers busy from ~s to ~s (mean ~s) over ~b online",
                    [beamdiag_units:pct(lists:min(Shares)), beamdiag_units:pct(lists:max(Shares)), beamdiag_units:pct(Mean), Online]),
                fmt("run queue ~.1f on average, +scl ~s, +sub ~s",
                    [maps:get(run_queue_avg, maps:get(vm, L), 0.0),
                     beamdiag_flags:value(scl, Settings), beamdiag_flags:value(sub, Settings)])
            ], #{busy_min => lists:min(Shares), busy_max => lists:max(Shares), busy_mean => Mean},
              [fig(busy_min, lists:min(Shares), share), fig(busy_max, lists:max(Shares), share),
               fig(busy_mean, Mean, share)], Settings);
        false ->
            []
    end.

cpu_saturated(L, Settings, T) ->
    #{cpus_used := Used, cpus_available := Avail} = maps:get(totals, L),
    Online = maps:get(schedulers_online, Settings),
    Rows = [R || R = #{type := scheduler, index := I} <- maps:get(threads, L), I =< Online],
    Busy = part(sum(busy, Rows), sum(wall, Rows)),
    %% Runnable-wait while the thread had work: demand the OS did not meet.
    Queued = lists:sum([min(maps:get(runq, R), num_or_zero(maps:get(busy, R, 0))) || R <- Rows]),
    OnCpu = part(sum(on_cpu, Rows) + Queued, sum(wall, Rows)),
    Share = part(Used, Avail),
    Demand = Busy >= map_get(saturated_busy, T) andalso OnCpu >= map_get(saturated_busy, T),
    %% The catalogue's headline says the node uses all its CPU: only when
    %% the OS says so. Schedulers that have work all the time but get part
    %% of the CPUs are saturated and starved at once, and the title says so.
    {Severity, Title} =
        if
            Demand andalso Share >= map_get(saturated_share, T) -> {warning, default};
            Demand ->
                {warning, fmt("The node's schedulers have work all the time but get only "
                              "~.2f of its ~.2f CPUs", [Used, float(Avail)])};
            true -> {none, default}
        end,
    Found = emit(cpu_saturated, Severity, [
        fmt("the node used ~.2f of ~.2f CPUs (~s); schedulers busy ~s, on CPU or waiting for "
            "one with work ~s", [Used, float(Avail), beamdiag_units:pct(Share), beamdiag_units:pct(Busy), beamdiag_units:pct(OnCpu)]),
        fmt("~.1f M reductions/s, run queue ~.1f on average",
            [maps:get(reductions_per_s, maps:get(vm, L), 0.0) / 1.0e6,
             maps:get(run_queue_avg, maps:get(vm, L), 0.0)])
    ], #{cpus_used => Used, cpus_available => float(Avail), busy_share => Busy},
      [fig(cpus_used, Used, cpus), fig(cpus_available, float(Avail), cpus, #{scope => host}),
       fig(used_share, Share, share), fig(busy_share, Busy, share),
       fig(on_cpu_or_queued_share, OnCpu, share)], Settings),
    case Title of
        default -> Found;
        _ -> [F#{title := iolist_to_binary(Title)} || F <- Found]
    end.

num_or_zero(V) when is_number(V) -> V;
num_or_zero(_) -> 0.0.

schedulers_exceed_cpus(L, Settings, _T) ->
    Online = maps:get(schedulers_online, Settings),
    Avail = maps:get(cpus_available, maps:get(totals, L)),
    Cpus = max(1, ceil_(Avail)),
    Severity = case Online > Cpus of true -> warning; false -> none end,
    emit(schedulers_exceed_cpus, Severity, [
        fmt("~b schedulers online, ~.2f CPUs available (~b logical processors available, quota ~s)",
            [Online, float(Avail), val(maps:get(logical_processors_available, Settings, null)),
             num(maps:get(quota_cpus, maps:get(cgroup, L), unlimited))])
    ], #{schedulers_online => Online, cpus_available => float(Avail)},
      [fig(schedulers_online, Online, count),
       fig(cpus_available, float(Avail), cpus, #{scope => host})], Settings).

%% Microstate accounting's own view of the spinning, to set beside the
%% ledger's: the busy_wait state when the emulator records it, otherwise
%% the 'other' state that holds it.
msacc_spin(L = #{msacc := #{by_type := #{scheduler := #{shares := Shares}}, extra := Extra}}) ->
    [#{spin := Spin, wall := W} | _] = [maps:get(scheduler, maps:get(by_type, L))],
    Ledger = ratio(Spin, W),
    case Extra of
        true ->
            [fmt("msacc measured busy_wait ~s of scheduler time; the ledger's spin estimate is ~s",
                 [beamdiag_units:pct(maps:get(busy_wait, Shares, 0.0)), beamdiag_units:pct(Ledger)])];
        false ->
            [fmt("msacc 'other' (which holds busy_wait in this emulator) is ~s of scheduler time; "
                 "the ledger's spin estimate is ~s", [beamdiag_units:pct(maps:get(other, Shares, 0.0)), beamdiag_units:pct(Ledger)])]
    end;
msacc_spin(_) ->
    [].

%% Name the cause, not the symptoms: a finding (at warning or above) drops
%% the ones it explains.
suppress(Findings) ->
    Causes = [Id || #{id := Id, severity := S} <- Findings, S =/= info],
    Explained = lists:append([Symptoms || {Cause, Symptoms} <- explains(),
                                          lists:member(Cause, Causes)]),
    [F || F = #{id := Id} <- Findings, not lists:member(Id, Explained)].

%% What each cause explains. A throttled node also looks starved (the
%% kernel counts throttled time as waiting for a CPU), blocked and
%% saturated. A blocked scheduler counts as busy while its thread sleeps in
%% the kernel, so the schedulers look unevenly loaded, and no balance flag
%% (+scl, +sub) moves work off a scheduler that is not running.
explains() ->
    [{cpu_throttling, [scheduler_blocking, cpu_saturated, cpu_starvation]},
     {scheduler_blocking, [scheduler_imbalance]}].

%% Findings from lock counting and profiles, when the capture has them.
extras(Capture, Ledger) ->
    Extras = maps:get(extras, Capture, #{}),
    Locks = case maps:find(locks, Extras) of
                {ok, LockData = #{}} when not is_map_key(error, LockData) ->
                    beamdiag_lock_rules:findings(LockData, maps:get(settings, Capture, #{}));
                _ -> []
            end,
    Profile = case maps:find(profile, Extras) of
                  {ok, Prof = #{profile := P}} ->
                      beamdiag_profile_rules:findings(P, maps:with([callers], Prof));
                  _ -> []
              end,
    Schedules = case maps:find(long_schedules, Extras) of
                    {ok, LS = #{}} ->
                        beamdiag_sched_rules:findings(
                          LS, Ledger#{settings => maps:get(settings, Capture, #{})});
                    _ -> []
                end,
    %% perf's samples of the scheduler threads the host saw held while the
    %% node answered (beamdiag_host_session:held/2).
    Held = case maps:find(held_perf, Extras) of
               {ok, HeldPerf = #{perf := _}} -> beamdiag_host_rules:held_findings(HeldPerf);
               _ -> []
           end,
    Locks ++ Profile ++ Schedules ++ Held ++ beamdiag_limit_rules:findings(Capture).

%% Findings from the process walks, and their evidence added to the other
%% findings (see beamdiag_proc_rules).
processes(Findings, Capture, Ledger) ->
    case maps:find(procs, maps:get(extras, Capture, #{})) of
        {ok, Procs = #{top_reductions := _}} ->
            Own = beamdiag_proc_rules:findings(Procs, Ledger, maps:get(settings, Capture)),
            beamdiag_proc_rules:annotate(Own ++ Findings, Procs, Ledger);
        _ ->
            Findings
    end.

contended(L, T) ->
    Rows = sched_rows(L, [scheduler, dirty_cpu]),
    Work = lists:sum([min(maps:get(runq, R), maps:get(busy, R)) || R <- Rows]),
    ratio(Work, sum(wall, Rows)) >= map_get(runq_share_warn, T) orelse
        maps:get(throttled_ratio, maps:get(cgroup, L), 0.0) >= map_get(throttled_ratio_warn, T).

lock_hint(L) ->
    case maps:get(msacc, L) of
        #{extra := true} -> "see the lock table and msacc states below";
        _ -> beamdiag_lock_advice:session()
    end.

emit(_Id, none, _Evidence, _Metrics, _Figures, _Settings) -> [];
emit(Id, Severity, Evidence, Metrics, Figures, Settings) ->
    [beamdiag_finding:new(Id, Severity, Evidence, Metrics,
                          #{figures => Figures, fix => beamdiag_fix_text:fix(Id, Settings)})].

fig(Name, V, Unit) -> beamdiag_finding:figure(Name, V, Unit).
fig(Name, V, Unit, Opts) when is_map(Opts) -> beamdiag_finding:figure(Name, V, Unit, Opts);
fig(Name, V, Unit, Whole) when is_atom(Whole) ->
    beamdiag_finding:figure(Name, V, Unit, #{part_of => Whole}).

%% On-CPU seconds of one thread type over the last Span seconds of the
%% window, from the per-tick series (msacc covers the end of the window).
span_on_cpu(#{series := Series}, Type, Span) ->
    span_on_cpu(lists:reverse(Series), Type, Span, 0.0, 0.0).

span_on_cpu([], _Type, _Span, _T, Acc) ->
    Acc;
span_on_cpu(_, _Type, Span, T, Acc) when T >= Span - 1.0e-3 ->
    Acc;
span_on_cpu([#{t := Dt, by_type := ByType} | Rest], Type, Span, T, Acc) ->
    %% The interval that crosses the span's start counts for its part
    %% inside it: msacc's span and the ticks' need not meet to the
    %% millisecond, and a whole extra interval would put more CPU time in
    %% the span than its wall time.
    Inside = min(1.0, (Span - T) / max(Dt, 1.0e-9)),
    span_on_cpu(Rest, Type, Span, T + Dt, Acc + Inside * interval_on_cpu(Type, ByType)).

interval_on_cpu(all, ByType) ->
    lists:sum([V || #{on_cpu := V} <- maps:values(ByType), is_number(V)]);
interval_on_cpu(Type, ByType) ->
    case maps:find(Type, ByType) of
        {ok, #{on_cpu := V}} when is_number(V) -> V;
        _ -> 0.0
    end.

%% The busy-wait flags, when they bear on system time.
busy_wait_state(Settings) ->
    case beamdiag_flags:busy_wait_off(Settings) of
        true -> [<<"busy waiting is off on every scheduler type (+sbwt none +sbwtdcpu none "
                   "+sbwtdio none): idle schedulers sleep at once and are woken by futex calls">>];
        false -> []
    end.

%% Who else used the host's CPUs over the window, when the agent could tell.
competitors(#{host := H = #{top := Top = [_ | _]}}) ->
    [iolist_to_binary(["busiest other processes on the host: ",
                       lists:join(", ", [io_lib:format("~s (pid ~b) ~.2f CPUs", [Name, Pid, Cpus])
                                         || #{name := Name, pid := Pid, cpus := Cpus} <- Top]),
                       case maps:get(top_partial, H, false) of
                           true -> " (of the processes the agent had time to read)";
                           false -> ""
                       end])];
competitors(_) ->
    [].

%% Where the node may run: scheduler binding and the CPUs it may use.
placement(Settings) ->
    Bind = case maps:get(bind_type, Settings, <<"unbound">>) of
               B0 when is_binary(B0) -> B0;
               _ -> <<"unbound">>
           end,
    Cpuset = maps:get(cpus_allowed, Settings, null),
    [iolist_to_binary(
        [case Bind of
             <<"unbound">> -> "schedulers unbound";
             _ -> ["schedulers bound to cores (bind type ", Bind, ")"]
         end,
         case Cpuset of
             B when is_binary(B) -> ["; the node may run on CPUs ", B];
             _ -> ""
         end])].

level(X, _Warn, Crit) when X >= Crit -> critical;
level(X, Warn, _Crit) when X >= Warn -> warning;
level(_, _, _) -> none.

sched_rows(#{threads := Threads}, Types) ->
    [R || R = #{type := Ty} <- Threads, lists:member(Ty, Types), is_number(maps:get(busy, R))].

sum(K, Rows) -> lists:sum([V || R <- Rows, V <- [maps:get(K, R, 0)], is_number(V)]) + 0.0.

worst(K, Rows) ->
    case [R || R <- Rows, is_number(maps:get(K, R, undefined))] of
        [] -> #{name => <<"-">>, K => 0.0, wall => 1.0};
        Rs -> hd(lists:sort(fun(A, B) -> maps:get(K, A) >= maps:get(K, B) end, Rs))
    end.

window(#{window_s := W}) -> max(W, 1.0e-9).
cpus_used(L) -> maps:get(cpus_used, maps:get(totals, L), 0.0).

ratio(_, D) when D == 0 -> 0.0;
ratio(N, D) -> N / D.

%% A part over its whole (on-CPU and queued time over wall time): at most 1.
%% The kernel's counters and the wall clock are read microseconds apart, so
%% the raw ratio can pass 1 by that skew.
part(N, D) -> min(1.0, ratio(N, D)).

fmt(F, A) -> io_lib:format(F, A).
num(unlimited) -> "unlimited";
num(N) when is_number(N) -> io_lib:format("~.2f", [float(N)]).
quota(unlimited) -> <<"unlimited">>;
quota(N) -> N.
val(N) when is_integer(N) -> N;
val(_) -> 0.
load(#{loadavg := [L1 | _]}) -> io_lib:format("~.2f", [float(L1)]);
load(_) -> "unknown".
ceil_(X) -> round(X + 0.4999).
