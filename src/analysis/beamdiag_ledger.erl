%%% @doc The time ledger: for each thread over the window, where the wall
%%% time went, by the OS's account and the BEAM's, side by side.
%%%
%%% For a scheduler thread over a window of W seconds:
%%% <ul>
%%% <li>`busy': the BEAM's active time (scheduler_wall_time), which counts
%%%     time blocked on a mutex or descheduled by the OS, but not spinning;</li>
%%% <li>`on_cpu' (`user' + `sys'): time the kernel ran the thread (schedstat);</li>
%%% <li>`runq': time runnable but waiting for a CPU (schedstat);</li>
%%% <li>`off_cpu' = W - on_cpu - runq: asleep in the kernel;</li>
%%% <li>`spin' = max(0, on_cpu - busy): on CPU but not busy: busy-waiting;</li>
%%% <li>`blocked' = max(0, busy - on_cpu - runq): busy but neither running
%%%     nor waiting for a CPU: lock waits, page faults, blocking calls. Not
%%%     known (`undefined') for a thread whose figures the last sample kept
%%%     from an earlier tick (`carried': a capture cut short ends on a
%%%     middle tick, which reads only the threads that ran).</li>
%%% </ul>
%%% A row's wall time also splits into five states that add up to it, the
%%% one definition every view reads (`states/0', `state_name/1',
%%% `state_shares/1'): running (on CPU, not spinning), spinning, blocked,
%%% runnable-waiting (runq) and idle (the rest).
%%%
%%% All pure: input is a capture, output plain maps.
%%%
%%% ```
%%% 1> L = beamdiag_ledger:build(Capture).
%%% 2> maps:get(scheduler, maps:get(by_type, L)).
%%% #{n => 2, busy => 1.2, on_cpu => 3.9, spin => 2.7, ...}
%%% '''
-module(beamdiag_ledger).

-export([build/1, outliers/2, ticks/2, share/3, states/0, state_name/1, state_shares/1]).

-export_type([ledger/0, row/0, state/0, tick/0]).

-type row() :: #{atom() => number() | binary() | atom() | undefined}.
-type ledger() :: #{
    window_s := float(),
    threads := [row()],
    %% The scheduler threads that stand out from their type, most first
    %% (beamdiag_outliers:threads/1).
    outliers := [row()],
    by_type := #{beamdiag_threads:type() => row()},
    totals := row(),
    host := map(),
    cgroup := map(),
    vm := map(),
    msacc := map(),
    series := [map()],
    notes := [binary()]
}.

%% One interval between two samples (ticks/2): its length in seconds, the
%% host's CPU shares over it (empty without the host's figures) and the
%% threads' rows.
-type tick() :: #{t := float(), host := tick_host(), threads := [row()]}.
-type tick_host() :: #{
    ncpu => pos_integer(),
    busy => float(),
    user => float(),
    system => float(),
    iowait => float(),
    steal => float(),
    loadavg => [number()] | null
}.

%% The states a row's wall time splits into, in chart order.
-type state() :: run | spin | blocked | runq | idle.
-define(STATES, [run, spin, blocked, runq, idle]).

%% The seconds fields of a ledger row, in table order.
-define(FIELDS, [busy, on_cpu, user, sys, runq, off_cpu, spin, blocked]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The ledger of a capture; a capture with fewer than two samples gives
%% an empty ledger with a note.
-spec build(beamdiag_capture:capture()) -> ledger().
build(#{samples := Samples, settings := Settings} = Capture) when length(Samples) >= 2 ->
    First = hd(Samples),
    Last = lists:last(Samples),
    Window = seconds(First, Last),
    %% Scheduler wall time from the first and last samples that have it: a
    %% tick whose schedulers did not all answer in time goes without it.
    {SwtA, SwtB} = swt_ends(Samples),
    Threads = thread_rows(with_swt(First, SwtA), with_swt(Last, SwtB), Settings),
    ByType = by_type(Threads),
    Host = others(Capture, host(First, Last)),
    Cgroup = cgroup(First, Last, Window),
    #{
        window_s => Window,
        threads => Threads,
        outliers => beamdiag_outliers:threads(Threads),
        by_type => ByType,
        totals => totals(Threads, Window, Settings, Host, Cgroup),
        host => Host,
        cgroup => Cgroup,
        vm => vm(Samples, Window, Settings),
        msacc => msacc([S || S = #{vm := #{msacc := [_ | _]}} <- Samples]),
        series => series(Samples, Settings),
        notes => notes(Capture, First)
    };
build(Capture) ->
    #{
        window_s => 0.0, threads => [], outliers => [], by_type => #{}, totals => #{}, host => #{},
        cgroup => #{}, vm => #{}, msacc => #{}, series => [],
        notes => [<<"fewer than two samples: no ledger">> | notes(Capture, #{})]
    }.

%% @doc The N scheduler threads of a ledger that stand out most from their
%% type, most first: each report shows as many as it has room for.
-spec outliers(ledger(), non_neg_integer()) -> [row()].
outliers(Ledger, N) ->
    lists:sublist(maps:get(outliers, Ledger, []), N).

%% @doc Tick by tick, for the threads Tids: the interval's length in
%% seconds (`t'), the host's CPU figures (`host') and those threads' rows
%% (`threads'), each as `build/1' gives it over that one interval. One pass
%% over the samples, for the views that chart threads over time.
-spec ticks(beamdiag_capture:capture(), [term()]) -> [tick()].
ticks(#{samples := Samples = [_, _ | _], settings := Settings}, Tids) ->
    [#{t => seconds(A, B), host => host(A, B),
       threads => thread_rows(only(Tids, A), B, Settings)}
     || {A, B} <- lists:zip(lists:droplast(Samples), tl(Samples))];
ticks(_Capture, _Tids) ->
    [].

%% @doc A field of a row as a share of the row's wall time (0.0 when the
%% row has none).
-spec share(atom(), row(), float()) -> float().
share(Field, Row, Wall) ->
    case {maps:get(Field, Row, undefined), Wall} of
        {V, W} when is_number(V), W > 0 -> V / W;
        _ -> 0.0
    end.

%% @doc The states a row's wall time splits into, in chart order.
-spec states() -> [state()].
states() ->
    ?STATES.

%% @doc What reports call a state.
-spec state_name(state()) -> binary().
state_name(run) -> <<"running">>;
state_name(spin) -> <<"spinning">>;
state_name(blocked) -> <<"blocked">>;
state_name(runq) -> <<"runnable-waiting">>;
state_name(idle) -> <<"idle">>.

%% @doc A row's wall time split into the states, as shares that add up to
%% 1: running is on-CPU time less spinning, idle what is left. A row with
%% no wall time has no share in any state (all 0.0).
-spec state_shares(row()) -> #{state() => float()}.
state_shares(Row) ->
    W = num(maps:get(wall, Row, 0)),
    case W > 0 of
        false ->
            maps:from_list([{S, 0.0} || S <- ?STATES]);
        true ->
            Spin = num(maps:get(spin, Row, 0)),
            Blocked = num(maps:get(blocked, Row, 0)),
            Runq = num(maps:get(runq, Row, 0)),
            Run = max(0.0, num(maps:get(on_cpu, Row, 0)) - Spin),
            Idle = max(0.0, W - Run - Spin - Blocked - Runq),
            %% The OS and BEAM counters are read microseconds apart: when
            %% they add up to a little more than the wall time, scale them
            %% down to it.
            Total = max(W, Run + Spin + Blocked + Runq + Idle),
            maps:map(fun(_, V) -> max(0.0, min(1.0, V / Total)) end,
                     #{run => Run, spin => Spin, blocked => Blocked, runq => Runq, idle => Idle})
    end.

%%%===================================================================
%%% Internal
%%%===================================================================

num(X) when is_number(X) -> float(X);
num(_) -> 0.0.

seconds(#{t := A}, #{t := B}) -> max(1.0e-9, (B - A) / 1.0e9).

swt_ends(Samples) ->
    case [Swt || #{vm := #{swt := Swt}} <- Samples, is_list(Swt)] of
        [A | Rest = [_ | _]] -> {A, lists:last(Rest)};
        _ -> {undefined, undefined}
    end.

with_swt(S = #{vm := Vm}, Swt) ->
    S#{vm := Vm#{swt => Swt}}.

only(Tids, S = #{threads := Th}) when is_map(Th) ->
    S#{threads := maps:with(Tids, Th)};
only(_Tids, S) ->
    S.

thread_rows(#{threads := TA, vm := VA} = A, #{threads := TB, vm := VB} = B, Settings)
  when is_map(TA), is_map(TB) ->
    Wall = seconds(A, B),
    Busy = busy_by_id(maps:get(swt, VA), maps:get(swt, VB)),
    Kinds = beamdiag_threads:classify_all(
              [{Tid, maps:get(name, Th)} || {Tid, Th} <- maps:to_list(TB)], Settings),
    Rows = [thread_row(Tid, ThA, ThB, maps:get(Tid, Kinds), Wall, Busy, Settings)
            || {Tid, ThA} <- maps:to_list(TA),
               {ok, ThB} <- [maps:find(Tid, TB)]],
    lists:sort(fun(X, Y) -> order(X) =< order(Y) end, Rows);
thread_rows(_, _, _) ->
    [].

order(#{type := T, index := I, tid := Tid}) ->
    {index_of(T, beamdiag_threads:types()), I, Tid}.

index_of(X, L) -> length(lists:takewhile(fun(Y) -> Y =/= X end, L)).

thread_row(Tid, A, B, {Type, Index}, Wall, Busy, Settings) ->
    Name = maps:get(name, B),
    SchedId = beamdiag_threads:scheduler_id({Type, Index}, Settings),
    DU = beamdiag_units:ticks_to_s(delta(utime, A, B)),
    DS = beamdiag_units:ticks_to_s(delta(stime, A, B)),
    OnCpu =
        case maps:is_key(run_ns, A) andalso maps:is_key(run_ns, B) of
            true -> delta(run_ns, A, B) / 1.0e9;
            false -> DU + DS
        end,
    {User, Sys} =
        case DU + DS of
            Z when Z == 0 -> {OnCpu, 0.0};
            T -> {OnCpu * DU / T, OnCpu * DS / T}
        end,
    Runq = delta(wait_ns, A, B) / 1.0e9,
    BusyS =
        case maps:find(SchedId, Busy) of
            {ok, Ratio} -> Ratio * Wall;
            error -> undefined
        end,
    Base = #{
        tid => Tid, name => Name, type => Type, index => Index, scheduler_id => SchedId,
        wall => Wall, on_cpu => OnCpu, user => User, sys => Sys, runq => Runq,
        off_cpu => max(0.0, Wall - OnCpu - Runq), busy => BusyS,
        nvcsw => delta(nvcsw, A, B), nivcsw => delta(nivcsw, A, B),
        minflt => delta(minflt, A, B), majflt => delta(majflt, A, B)
    },
    case B of
        #{carried := true} when is_number(BusyS) ->
            %% The window's last sample kept this thread's figures from an
            %% earlier one (a capture cut short ends on a middle tick): the
            %% BEAM's busy time is read to the end, the kernel's wait and
            %% CPU time only to that earlier read, so busy time beyond
            %% them is not known to be blocked.
            (derive(Base))#{blocked := undefined};
        _ ->
            derive(Base)
    end.

%% Spinning and blocking are derived from busy; threads the BEAM does not
%% account (aux, poll...) have neither.
derive(Row = #{busy := undefined}) ->
    Row#{spin => undefined, blocked => undefined};
derive(Row = #{busy := Busy, on_cpu := OnCpu, runq := Runq}) ->
    Row#{spin => max(0.0, OnCpu - Busy), blocked => max(0.0, Busy - OnCpu - Runq)}.

delta(K, A, B) ->
    case {maps:get(K, A, undefined), maps:get(K, B, undefined)} of
        {X, Y} when is_integer(X), is_integer(Y), Y >= X -> Y - X;
        _ -> 0
    end.

%% Scheduler id => active share over the interval.
busy_by_id(SA, SB) when is_list(SA), is_list(SB) ->
    maps:from_list(
        [{Id, clamp(ratio(Act2 - Act1, Tot2 - Tot1))}
         || {Id, Act1, Tot1} <- SA, {Id2, Act2, Tot2} <- SB, Id =:= Id2]
    );
busy_by_id(_, _) ->
    #{}.

ratio(_, D) when D =< 0 -> 0.0;
ratio(N, D) -> N / D.

clamp(X) -> max(0.0, min(1.0, X)).

by_type(Threads) ->
    Groups = maps:groups_from_list(fun(#{type := T}) -> T end, Threads),
    maps:map(fun(_, Rows) -> sum_rows(Rows) end, Groups).

sum_rows(Rows) ->
    Sum = fun(K) -> sum([maps:get(K, R) || R <- Rows]) end,
    Base = maps:from_list([{K, Sum(K)} || K <- ?FIELDS ++ [wall, nvcsw, nivcsw, minflt, majflt]]),
    Base#{n => length(Rows)}.

%% undefined (no BEAM account) stays undefined when every row has none.
sum(Vs) ->
    case [V || V <- Vs, is_number(V)] of
        [] -> undefined;
        Ns -> lists:sum(Ns)
    end.

totals(Threads, Window, Settings, Host, Cgroup) ->
    OnCpu = sum([maps:get(on_cpu, R) || R <- Threads]),
    Sys = sum([maps:get(sys, R) || R <- Threads]),
    Cpus = available_cpus(Settings, Host, Cgroup),
    #{
        on_cpu => OnCpu,
        sys => Sys,
        %% At most the CPUs it can use: each thread's counter is read at
        %% its own instant inside a sample, so on a saturated node the
        %% sum over a window can pass them by the reading's skew (2.06 of
        %% 2.00 was seen), which no node can use.
        cpus_used => case OnCpu of undefined -> 0.0; _ -> min(OnCpu / Window, Cpus) end,
        cpus_available => Cpus,
        threads => length(Threads)
    }.

%% The CPUs the node can use: the affinity mask, cut by the cgroup quota.
available_cpus(Settings, Host, Cgroup) ->
    Logical =
        case maps:get(logical_processors_available, Settings, null) of
            N when is_integer(N) -> N;
            _ -> maps:get(ncpu, Host, maps:get(schedulers, Settings))
        end,
    case maps:get(quota_cpus, Cgroup, unlimited) of
        Q when is_number(Q) -> min(float(Logical), Q);
        _ -> float(Logical)
    end.

host(#{host := #{cpu := A, ncpu := N} = HA}, #{host := #{cpu := B} = HB}) ->
    Keys = [user, nice, system, idle, iowait, irq, softirq, steal],
    D = maps:from_list([{K, max(0, maps:get(K, B, 0) - maps:get(K, A, 0))} || K <- Keys]),
    Total = lists:sum(maps:values(D)),
    Share = fun(K) -> ratio(maps:get(K, D), Total) end,
    #{
        ncpu => N,
        busy => 1.0 - Share(idle) - Share(iowait),
        user => Share(user) + Share(nice),
        system => Share(system) + Share(irq) + Share(softirq),
        iowait => Share(iowait),
        steal => Share(steal),
        loadavg => case maps:get(loadavg, HB, maps:get(loadavg, HA, undefined)) of
                       {L1, L5, L15} -> [L1, L5, L15];
                       _ -> null
                   end
    };
host(_, _) ->
    #{}.

%% The host's busiest other processes, when the host's figures are there.
others(Capture, Host = #{ncpu := N}) ->
    {Top, Partial} = top_others(maps:get(extras, Capture, #{}), N),
    Host#{top => Top, top_partial => Partial};
others(_Capture, Host) ->
    Host.

%% The few other processes on the host that used the most CPU over the
%% window, in CPUs, from the agent's two scans (each process over the time
%% between its own two readings, which must be half a second at least);
%% those under 0.02 CPUs are left out.
top_others(#{host_scan := #{first := A, last := B} = Scan}, Ncpu) when is_map(A), is_map(B) ->
    Used = [#{pid => Pid, name => Comm, cpus => min(Ncpu, beamdiag_units:ticks_to_s(TB - TA) / ((MB - MA) / 1000))}
            || {Pid, {Comm, TB, MB}} <- maps:to_list(B), is_integer(Pid), is_binary(Comm),
               is_integer(TB), is_integer(MB),
               {ok, {_, TA, MA}} <- [maps:find(Pid, A)], is_integer(TA), is_integer(MA),
               TB >= TA, MB - MA >= 500],
    Sorted = lists:sort(fun(#{cpus := X}, #{cpus := Y}) -> X >= Y end, Used),
    {[P || P = #{cpus := C} <- lists:sublist(Sorted, 3), C >= 0.02],
     maps:get(truncated, Scan, false) =:= true};
top_others(_, _) ->
    {[], false}.


cgroup(#{cgroup := A}, #{cgroup := B}, Window) when is_map(A), is_map(B) ->
    D = fun(K) -> max(0, maps:get(K, B, 0) - maps:get(K, A, 0)) end,
    Periods = D(nr_periods),
    #{
        version => maps:get(version, B),
        quota_cpus => maps:get(quota_cpus, B),
        periods => Periods,
        throttled_periods => D(nr_throttled),
        throttled_ratio => ratio(D(nr_throttled), Periods),
        throttled_s => D(throttled_ns) / 1.0e9,
        throttled_share => D(throttled_ns) / 1.0e9 / Window
    };
cgroup(_, _, _) ->
    #{}.

vm(Samples = [#{vm := A} | _], Window, Settings) ->
    #{vm := B} = lists:last(Samples),
    S = maps:get(schedulers, Settings),
    %% run_queue_lengths_all: one queue per normal scheduler, then the dirty
    %% CPU queue and the dirty IO queue.
    Queues = [maps:get(run_queues, V) || #{vm := V} <- Samples],
    Normal = [lists:sum(lists:sublist(Q, S)) || Q <- Queues],
    DirtyCpu = [lists:nth(S + 1, Q) || Q <- Queues, length(Q) > S],
    Avg = fun([]) -> 0.0; (L) -> lists:sum(L) / length(L) end,
    D = fun(K) -> (maps:get(K, B) - maps:get(K, A)) / Window end,
    #{
        reductions_per_s => D(reductions),
        gcs_per_s => rate_of(gcs, Samples),
        gc_words_per_s => rate_of(gc_words, Samples),
        context_switches_per_s => D(context_switches),
        run_queue_avg => Avg(Normal),
        run_queue_max => lists:max(Normal),
        dirty_cpu_queue_avg => Avg(DirtyCpu),
        process_count => maps:get(process_count, B),
        tick_cost_us_avg => Avg([maps:get(tick_cost_us, X, 0) || X <- Samples])
    }.

%% A counter's rate between the first and last samples that have it (the
%% garbage collection counters need every scheduler's answer, and a tick
%% goes without them when one is held).
rate_of(K, Samples) ->
    case [S || S = #{vm := #{K := V}} <- Samples, is_integer(V)] of
        [SA = #{vm := A} | Rest = [_ | _]] ->
            SB = #{vm := B} = lists:last(Rest),
            (maps:get(K, B) - maps:get(K, A)) / seconds(SA, SB);
        _ ->
            0.0
    end.

%% Microstate accounting over the samples that carry it (the agent keeps it
%% on for the end of the window only): per thread type, each state's share
%% of the type's accounted time and the seconds per state, and the span
%% those cover.
msacc([First = #{vm := #{msacc := MA}} | Rest = [_ | _]]) ->
    Last = #{vm := #{msacc := MB}} = lists:last(Rest),
    Key = fun(#{type := T, id := I}) -> {T, I} end,
    AMap = maps:from_list([{Key(M), C} || M = #{counters := C} <- MA]),
    Deltas = [{msacc_type(T), maps:map(fun(S, V) -> max(0, V - maps:get(S, CA, 0)) end, CB)}
              || M = #{type := T, counters := CB} <- MB,
                 {ok, CA} <- [maps:find(Key(M), AMap)]],
    Groups = maps:groups_from_list(fun({T, _}) -> T end, fun({_, C}) -> C end, Deltas),
    Unit = erlang:convert_time_unit(1, second, perf_counter),
    ByType = maps:map(
        fun(_, Cs) ->
            Sum = lists:foldl(fun(C, Acc) -> maps:fold(fun(K, V, A2) ->
                      A2#{K => V + maps:get(K, A2, 0)} end, Acc, C) end, #{}, Cs),
            Total = lists:sum(maps:values(Sum)),
            #{
                n => length(Cs),
                shares => maps:map(fun(_, V) -> ratio(V, Total) end, Sum),
                seconds => maps:map(fun(_, V) -> V / Unit end, Sum)
            }
        end,
        Groups),
    #{extra => beamdiag_agent_vm:msacc_extra(MB), by_type => ByType, span_s => seconds(First, Last)};
msacc(_) ->
    #{}.

msacc_type(scheduler) -> scheduler;
msacc_type(dirty_cpu_scheduler) -> dirty_cpu;
msacc_type(dirty_io_scheduler) -> dirty_io;
msacc_type(T) -> T.

%% Per tick and thread type: the ledger fields in seconds, for charts and for
%% the run-to-run noise that compare uses.
series([_], _Settings) ->
    [];
series([A, B | Rest], Settings) ->
    Rows = thread_rows(A, B, Settings),
    Types = maps:map(fun(_, R) -> maps:with(?FIELDS ++ [wall, n], R) end, by_type(Rows)),
    [#{t => seconds(A, B), by_type => Types} | series([B | Rest], Settings)].

%% Ticks whose schedulers did not all answer in time.
missing_note(Missing = [#{waited_ms := Ms} | _], N) ->
    iolist_to_binary(
      io_lib:format("scheduler wall time (and msacc, when on, and the VM's memory account) missing in "
                    "~b of ~b samples: not "
                    "every scheduler answered within ~b ms (a scheduler held by a NIF or a long "
                    "BIF answers only when it returns); the busy figures come from the samples "
                    "that have it", [length(Missing), N, Ms]));
missing_note(Missing, N) ->
    iolist_to_binary(io_lib:format("scheduler wall time missing in ~b of ~b samples",
                                   [length(Missing), N])).

notes(Capture, First) ->
    Sources = [
        {threads, <<"per-thread OS figures">>},
        {host, <<"host CPU figures">>},
        {cgroup, <<"cgroup CPU figures">>}
    ],
    SourceNotes = [
        iolist_to_binary([Label, " unavailable: ", error_text(E)])
     || {K, Label} <- Sources, {error, _} = E <- [maps:get(K, First, ok)]
    ],
    Samples = maps:get(samples, Capture, []),
    Missing = [W || #{vm := #{missing := W}} <- Samples],
    Swt = case {First, Missing} of
              {#{vm := #{swt := undefined, missing := _}}, _} ->
                  [missing_note(Missing, length(Samples))];
              {#{vm := #{swt := undefined}}, _} ->
                  [<<"scheduler_wall_time unavailable">>];
              {_, [_ | _]} ->
                  [missing_note(Missing, length(Samples))];
              _ ->
                  []
          end,
    Left = case maps:get(extras, Capture, #{}) of
               #{left_loaded := Mods = [_ | _]} ->
                   [iolist_to_binary(
                        ["agent modules left loaded, inert, on the target (unloading would make "
                         "the code purger check every one of its processes): ",
                         lists:join(", ", [atom_to_binary(M) || M <- Mods, is_atom(M)])])];
               _ -> []
           end,
    %% A node on the stock emulator: what to build to count its locks; one
    %% that counts them, whose counters could not be read in time: why.
    Locks = case {maps:get(settings, Capture, #{}), maps:get(extras, Capture, #{})} of
                {#{lock_counting := false} = S, _} ->
                    [beamdiag_lock_advice:emulator(S)];
                {_, #{locks_missing := Why}} when is_binary(Why) ->
                    [<<"locks not counted in this report: ", Why/binary>>];
                _ ->
                    []
            end,
    maps:get(notes, Capture, []) ++ SourceNotes ++ Swt ++ Left ++ Locks.

error_text({error, {M, R}}) when is_atom(M) ->
    try iolist_to_binary(M:format_error(R))
    catch _:_ -> iolist_to_binary(io_lib:format("~p", [R]))
    end;
error_text(E) ->
    iolist_to_binary(io_lib:format("~p", [E])).
