%%% @doc The host-only diagnosis: findings from what the host alone saw of
%%% a node (`beamdiag_host_view' samples, and perf's samples of the hot
%%% threads), for a node that does not answer or is not asked.
%%%
%%% All pure. The per-thread ledger is `beamdiag_ledger''s, built from the
%%% host samples (no BEAM figures: no busy time, no spinning); the
%%% throttling and system-CPU findings are `beamdiag_rules'' own, kept
%%% because the host's figures are all they read. This module adds:
%%% <ul>
%%% <li>`scheduler_held_native': a normal scheduler thread that wanted a
%%%     CPU (on it, or runnable waiting for it) for nearly the whole
%%%     window, almost all of it in user mode, and never slept (no
%%%     voluntary context switches), when perf shows that thread
%%%     in a native library outside the emulator, or when the node did not
%%%     answer (a scheduler running Erlang code is preempted and the node
%%%     answers);</li>
%%% <li>`host_memory_low': the host's or the cgroup's memory nearly used up;</li>
%%% <li>`cpu_saturated', as the host sees it: the node's threads used
%%%     nearly all the CPUs it may use (affinity, cgroup quota) and its
%%%     scheduler threads wanted a CPU nearly all the window. The host
%%%     cannot tell work from busy-waiting, and says so; perf's top frame,
%%%     when perf ran, is named, an unnamed JIT frame with the flag that
%%%     names it;</li>
%%% <li>`dirty_io_blocked', and `scheduler_blocking' for a scheduler thread
%%%     blocked in one system call for most of the window
%%%     (`beamdiag_wait_rules', from what the threads wait on).</li>
%%% </ul>
%%%
%%% ```
%%% 1> D = beamdiag_host_rules:analyse(Capture, #{unresponsive => true}).
%%% 2> [Id || #{id := Id} <- maps:get(findings, D)].
%%% [scheduler_held_native]
%%% '''
-module(beamdiag_host_rules).

-export([analyse/2, hot_threads/1, perf_top/2, held_findings/1]).

-export_type([perf_top/0, context/0, host_view/0]).

-type perf_top() :: #{
    samples := non_neg_integer(),
    top := [#{symbol := binary(), dso := binary(), samples := pos_integer(),
              share := float(), native := boolean()}]
}.

%% What the host view says beside its capture (beamdiag_host_session puts it
%% together, and in the capture's extras as `host_view'): why the report
%% came from the host, how long the node was given, what distribution saw,
%% perf's result. `attach' is what the session resolved of how to reach
%% the node (beamdiag_attach_plan:public/2), shown as it is.
-type context() :: #{
    unresponsive => boolean(),
    reason => requested | unresponsive | unreachable | slow,
    perf => {ok, perf_top()} | {error, binary()} | none,
    perf_skipped => binary(),
    waited_ms => integer(),
    distribution => binary(),
    attach => beamdiag_attach_plan:public() | #{},
    why => binary(),
    os_pid => pos_integer(),
    node => binary(),
    located => given | epmd_port | cmdline | ns_pid,
    window_s => number(),
    process_state => running | sleeping | stopped | zombie | gone | unknown,
    atom() => term()
}.
%% The diagnosis' `host_view': the context, the threads found held and the
%% settings the host saw.
-type host_view() :: #{
    hot := [beamdiag_ledger:row()],
    settings := beamdiag_agent_vm:settings(),
    unresponsive => boolean(),
    reason => requested | unresponsive | unreachable | slow,
    perf => {ok, perf_top()} | {error, binary()} | none,
    perf_skipped => binary(),
    waited_ms => integer(),
    distribution => binary(),
    attach => beamdiag_attach_plan:public() | #{},
    why => binary(),
    os_pid => pos_integer(),
    node => binary(),
    located => given | epmd_port | cmdline | ns_pid,
    window_s => number(),
    process_state => running | sleeping | stopped | zombie | gone | unknown,
    atom() => term()
}.
%% A ledger, or a host view's scheduler rows over the window.
-type rows() :: #{threads := [beamdiag_ledger:row()], window_s := number(), atom() => term()}.

%% The findings of beamdiag_rules that read nothing but host figures.
-define(HOST_RULES, [cpu_throttling, high_system_cpu]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The thresholds.
-spec thresholds() -> #{atom() => number()}.
thresholds() ->
    #{
        %% (on CPU + runnable-wait) / window of a held scheduler thread.
        held_wanted_share => 0.90,
        %% User time / on-CPU time of a held scheduler thread.
        held_user_share => 0.80,
        %% Voluntary context switches per second of a held scheduler thread,
        %% at most: it never goes back to its loop to sleep (a scheduler
        %% running a NIF that yields, among processes that wake every
        %% millisecond, slept 110 to 140 times a second on a loaded host).
        held_sleeps_per_s => 2.0,
        %% perf samples of the held thread in one native library, at least,
        %% when the node did not answer.
        native_share => 0.50,
        %% The same when the node was not asked or answered: a NIF that
        %% yields also keeps its scheduler thread busy, but that thread
        %% goes back to the emulator between slices (88 to 90% of its
        %% samples in the NIF on OTP 25; a held one: 97 to 100%, the lab's
        %% nif_held on OTP 29 96.7% of 183 samples, its calls returning to
        %% the emulator every 200 ms). So the share must be above the
        %% yielding NIF's 90% with 95% confidence, given perf's samples
        %% (Wilson's lower bound: 30 of 30 gives 0.917, 177 of 183 0.936,
        %% 90 of 100 0.840).
        native_share_asked => 0.90,
        %% The node's CPUs used / the CPUs it may use, and its scheduler
        %% threads' time on a CPU or runnable / their wall time, at least,
        %% for `cpu_saturated' from the host (the ledger rule's share).
        saturated_share => 0.90,
        saturated_wanted => 0.85,
        %% Memory available / total, below which memory is low (crit below half).
        memory_available_warn => 0.10
    }.

%% @doc The host-only diagnosis of a host capture (`samples' and
%% `settings' from `beamdiag_host_view', the last memory readings in
%% `extras.memory'). Context: `unresponsive' (the
%% node did not answer), `perf' (`{ok, perf_top()}', `{error, Text}' or
%% `none').
-spec analyse(beamdiag_capture:capture(), context()) -> beamdiag_diagnosis:diagnosis().
analyse(Capture, Context) ->
    Ledger = beamdiag_ledger:build(Capture),
    Settings = maps:get(settings, Capture),
    T = thresholds(),
    %% The ledger's rules that hold without the VM's figures, and those of
    %% whatever an agent sent before the report fell back on the host
    %% (lock data, process walk, long schedules: rules without threads).
    Kept = [F || F = #{id := Id} <- beamdiag_rules:findings(Capture, Ledger),
                 lists:member(Id, ?HOST_RULES)] ++
        beamdiag_rules:findings(Capture, Ledger#{threads := []}),
    Held = held(Ledger, Context, T),
    Saturated = case Held of
                    [] -> saturated(Ledger, Context, T);
                    _ -> []
                end,
    %% The memory ledger of the host's samples: the resident memory alone.
    Memory = beamdiag_memory_ledger:build(Capture),
    Findings = Held ++ memory(Capture, T) ++ Saturated ++
        beamdiag_wait_rules:host_findings(Capture, Ledger, Context) ++ Kept ++
        beamdiag_memory_rules:findings(Memory, Capture),
    #{capture => Capture, ledger => Ledger#{notes => host_notes(Ledger)}, memory => Memory,
      findings => beamdiag_finding:sort(Findings), host_only => true,
      host_view => maps:merge(Context, #{hot => hot_threads(Ledger), settings => Settings})}.

%% @doc `scheduler_held_native' for a node that answered: the host view's
%% figures of its scheduler threads over the window (`threads',
%% `window_s') and perf's samples of the threads it saw held (`perf':
%% `{ok, perf_top()}' or `{error, Why}'), as `beamdiag_host_session:held/2' puts
%% them in the capture. Named only when perf shows a held thread in a
%% native library for nearly all its samples: a scheduler busy with Erlang
%% code looks the same from /proc.
-spec held_findings(#{threads := [beamdiag_ledger:row()], window_s := float(),
                      perf := {ok, perf_top()} | {error, binary()}, atom() => term()}) ->
    [beamdiag_finding:finding()].
held_findings(#{threads := Rows, window_s := W, perf := Perf}) ->
    held(#{threads => Rows, window_s => W}, #{unresponsive => false, perf => Perf}, thresholds()).

%% @doc Normal scheduler threads that wanted a CPU (ran, or waited for
%% one) for nearly the whole window, mostly in user mode, and never went
%% to sleep, hottest first.
%% A ledger, or its scheduler rows alone (`held_findings/1').
-spec hot_threads(rows()) -> [beamdiag_ledger:row()].
hot_threads(#{threads := Rows, window_s := W}) when W > 0 ->
    #{held_wanted_share := WantedMin, held_user_share := UserMin,
      held_sleeps_per_s := SleepsMax} = thresholds(),
    Hot = [R || R = #{type := scheduler, on_cpu := On, runq := Q, user := U, nvcsw := Vol} <- Rows,
                (On + Q) / W >= WantedMin, On > 0, U / On >= UserMin, Vol / W =< SleepsMax],
    lists:sort(fun(#{on_cpu := A, runq := QA}, #{on_cpu := B, runq := QB}) ->
                   A + QA >= B + QB end, Hot);
hot_threads(_) ->
    [].

%% @doc Counts `perf script' samples (no call graph; fields comm, tid,
%% time, period, event, ip, sym, dso) of the given threads (all when the
%% list is empty) by symbol and library, most first.
-spec perf_top(binary(), [integer()]) -> perf_top().
perf_top(Script, Tids) ->
    Counts = lists:foldl(
        fun(Line, Acc) ->
            case beamdiag_fold_header:frame(Line) of
                {Tid, Sym, Dso} ->
                    case Tids =:= [] orelse lists:member(Tid, Tids) of
                        true -> maps:update_with({Sym, Dso}, fun(C) -> C + 1 end, 1, Acc);
                        false -> Acc
                    end;
                skip ->
                    Acc
            end
        end,
        #{}, binary:split(Script, <<"\n">>, [global, trim_all])),
    N = lists:sum(maps:values(Counts)),
    Sorted = lists:sort(fun({_, A}, {_, B}) -> A >= B end, maps:to_list(Counts)),
    #{samples => N,
      top => [#{symbol => S, dso => D, samples => C, share => C / N, native => native(D)}
              || {{S, D}, C} <- lists:sublist(Sorted, 8)]}.

%%%===================================================================
%%% Internal
%%%===================================================================

held(Ledger = #{window_s := W}, Context, T) ->
    Unresponsive = maps:get(unresponsive, Context, false),
    Perf = maps:get(perf, Context, none),
    case hot_threads(Ledger) of
        [] ->
            [];
        [Top | _] = Hot ->
            Least = case Unresponsive of
                        true -> map_get(native_share, T);
                        false -> map_get(native_share_asked, T)
                    end,
            Native = case Perf of
                         {ok, #{top := [#{native := true, share := S} = Sym | _]}}
                           when Unresponsive, S >= Least -> {yes, Sym};
                         {ok, #{samples := N, top := [#{native := true, share := S} = Sym | _]}}
                           when not Unresponsive ->
                             case beamdiag_stats:share_lower(S, N) >= Least of
                                 true -> {yes, Sym};
                                 false -> no
                             end;
                         {ok, #{top := [#{native := true} | _]}} when not Unresponsive -> no;
                         {ok, #{top := [#{dso := D} | _]}} ->
                             case emulator(D) of
                                 true -> no;
                                 false -> unknown
                             end;
                         _ -> unknown
                     end,
            case {Native, Unresponsive} of
                {no, _} -> [];
                {unknown, false} -> [];
                _ -> [held_finding(Top, Hot, Ledger, W, Native, Perf, Context)]
            end
    end.

held_finding(Top, Hot, Ledger, W, Native, Perf, Context) ->
    #{name := Name, tid := Tid, on_cpu := On, runq := Q, user := U, nvcsw := Vol} = Top,
    Others = [R || R = #{type := scheduler} <- maps:get(threads, Ledger),
                   not lists:member(R, Hot)],
    OthersShare = case Others of
                      [] -> 0.0;
                      _ -> lists:sum([min(1.0, (maps:get(on_cpu, R) + maps:get(runq, R)) / W)
                                      || R <- Others]) / length(Others)
                  end,
    Wanted = min(1.0, (On + Q) / W),
    UserShare = U / On,
    Evidence =
        [fmt("~ts (thread ~b) wanted a CPU ~s of the ~.1f s window: on CPU ~.2f s (~s of it "
             "user time), runnable waiting for a CPU ~.2f s; ~b voluntary context switches: it "
             "never went back to its scheduler loop to sleep",
             [Name, Tid, beamdiag_units:whole_pct(Wanted), W, On, beamdiag_units:whole_pct(UserShare), Q, Vol])] ++
        [fmt("also held: ~ts", [lists:join(", ", [N || #{name := N} <- tl(Hot)])])
         || length(Hot) > 1] ++
        [fmt("the node's other normal scheduler thread~s wanted a CPU ~s of the window~s",
             [plural(Others), beamdiag_units:whole_pct(OthersShare), case Others of [_] -> ""; _ -> " on average" end])
         || Others =/= []] ++
        case Native of
            {yes, _} -> native_lines(Native, Perf);
            _ -> skipped_lines(Native, Perf, Context)
        end ++
        answer_lines(Context),
    Metrics = #{thread => Name, wanted_share => Wanted, user_share => UserShare,
                on_cpu_s => On, runq_s => Q},
    Figures = [fig(window_s, W, wall_s, #{scope => window}),
               fig(on_cpu_s, On, cpu_s), fig(user_s, U, cpu_s, on_cpu_s),
               fig(runq_s, Q, wall_s, #{part_of => window_s}),
               fig(wanted_share, Wanted, share), fig(user_share, UserShare, share)] ++
              case Native of
                  {yes, #{share := S}} -> [fig(native_share, S, share)];
                  _ -> []
              end,
    Severity = critical,
    Title = case Native of
                {yes, #{symbol := Sym}} ->
                    [<<"A scheduler is held in native code: ">>, Sym];
                _ ->
                    <<"A scheduler is held, most likely in native code (a NIF or BIF that "
                      "does not yield)">>
            end,
    beamdiag_finding:new(scheduler_held_native, Severity, Evidence, Metrics,
                         #{figures => Figures, title => Title}).

%% The node used nearly all the CPUs it may use, its schedulers wanting
%% them: the host's own `cpu_saturated' (the ledger rule needs the BEAM's
%% busy time, which the host does not have). Not when a held scheduler is
%% named: that finding says more.
saturated(L = #{totals := #{cpus_used := Used, cpus_available := Avail}, window_s := W},
          Context, T) when W > 0, Avail > 0 ->
    Sched = [R || R = #{type := scheduler} <- maps:get(threads, L)],
    Wall = W * length(Sched),
    Wanted = case Wall > 0 of
                 true -> min(1.0, lists:sum([On + Q || #{on_cpu := On, runq := Q} <- Sched]) / Wall);
                 false -> 0.0
             end,
    Share = min(1.0, Used / Avail),
    case Share >= map_get(saturated_share, T) andalso Wanted >= map_get(saturated_wanted, T) of
        false ->
            [];
        true ->
            Evidence =
                [fmt("the node's threads used ~.2f of the ~.2f CPUs it may use (~s) over the "
                     "~.1f s window", [Used, float(Avail), beamdiag_units:whole_pct(Share), W]),
                 fmt("its ~b scheduler thread~s wanted a CPU ~s of the window (on one, or "
                     "runnable waiting for one)", [length(Sched), plural(Sched),
                                                   beamdiag_units:whole_pct(Wanted)]),
                 <<"seen from the host, work and busy-waiting look the same: the VM's own "
                   "figures (beamdiag diagnose with the node answering) tell them apart">>] ++
                perf_lines(maps:get(perf, Context, none)),
            Metrics = #{cpus_used => Used, cpus_available => float(Avail), used_share => Share,
                        scheduler_wanted_share => Wanted},
            Figures = [fig(cpus_used, Used, cpus), fig(cpus_available, float(Avail), cpus,
                                                       #{scope => host}),
                       fig(used_share, Share, share), fig(scheduler_wanted_share, Wanted, share)],
            [beamdiag_finding:new(cpu_saturated, warning, Evidence, Metrics,
                                  #{figures => Figures,
                                    title => fmt("The node uses ~.2f of its ~.2f CPUs (seen "
                                                 "from the host)", [Used, float(Avail)])})]
    end;
saturated(_, _, _) ->
    [].

%% perf's top frames of the hot threads, an unnamed JIT frame explained.
perf_lines({ok, #{samples := N, top := [#{symbol := S, dso := D, share := Sh} | _]}}) when N > 0 ->
    [fmt("perf, ~b samples: the top frame ~ts in ~ts (~s)", [N, S, D, beamdiag_units:whole_pct(Sh)])] ++
        [<<"[unknown] in the emulator's memory is JIT code that perf names only from a perf "
           "map: the node writes one when started with +JPperf true (then `beamdiag diagnose "
           "--perf` names the Erlang functions)">>
         || S =:= <<"[unknown]">>, D =:= <<"[unknown]">> orelse emulator(D)];
perf_lines(_) ->
    [].

native_lines({yes, #{symbol := S, dso := D, share := Sh}}, {ok, #{samples := N, top := Top}}) ->
    [fmt("perf, ~b samples of the held thread: ~s in ~ts (~ts)", [N, beamdiag_units:whole_pct(Sh), S, D])] ++
        [fmt("next: ~ts", [lists:join(", ", [[Sym, " ", beamdiag_units:whole_pct(Share)]
                                             || #{symbol := Sym, share := Share} <- tl(Top),
                                                Share >= 0.01])])
         || length([x || #{share := Share} <- tl(Top), Share >= 0.01]) > 0];
native_lines(unknown, {error, Why}) ->
    [fmt("perf could not sample the thread (~ts): the native function is not named", [Why])];
native_lines(_, _) ->
    [<<"perf was not run: the native function is not named">>].

%% Why perf did not run, when the host view knows.
skipped_lines(_Native, {ok, _}, _) -> [];
skipped_lines(_Native, {error, _}, _) -> [];
skipped_lines(_Native, _, #{perf_skipped := Why}) ->
    [fmt("perf was not run: ~ts; the native function is not named", [Why])];
skipped_lines(Native, Perf, _) ->
    native_lines(Native, Perf).

answer_lines(#{unresponsive := true, waited_ms := Ms} = C) ->
    [fmt("the node did not answer in ~.1f s: ~ts. A scheduler running Erlang code is "
         "preempted, and the node would answer", [Ms / 1000, maps:get(distribution, C, <<"">>)])];
answer_lines(_) ->
    [].

memory(#{extras := #{memory := M}}, T) ->
    Limit = map_get(memory_available_warn, T),
    host_memory(M, Limit) ++ cgroup_memory(M, Limit);
memory(_, _) ->
    [].

host_memory(#{mem_total := Tot, mem_available := Av} = M, Limit) when Tot > 0 ->
    Share = Av / Tot,
    case Share < Limit of
        true ->
            [beamdiag_finding:new(host_memory_low, severity(Share, Limit),
                [fmt("the host has ~s available of ~s (~s)", [beamdiag_units:memory(Av), beamdiag_units:memory(Tot), beamdiag_units:whole_pct(Share)])] ++
                    rss_line(M),
                #{available_share => Share},
                #{figures => [fig(available_share, Share, share, #{scope => host})]})];
        false ->
            []
    end;
host_memory(_, _) ->
    [].

cgroup_memory(#{cgroup_max := Max, cgroup_current := Cur} = M, Limit)
  when is_integer(Max), Max > 0, is_integer(Cur) ->
    Share = max(0.0, (Max - Cur) / Max),
    case Share < Limit of
        true ->
            [beamdiag_finding:new(host_memory_low, severity(Share, Limit),
                [fmt("the cgroup uses ~s of its ~s limit (memory.max); ~s left",
                     [beamdiag_units:memory(Cur), beamdiag_units:memory(Max), beamdiag_units:whole_pct(Share)])] ++ rss_line(M),
                #{available_share => Share},
                #{figures => [fig(available_share, Share, share, #{scope => host})]})];
        false ->
            []
    end;
cgroup_memory(_, _) ->
    [].

rss_line(#{rss := R}) -> [fmt("the node's resident memory: ~s", [beamdiag_units:memory(R)])];
rss_line(_) -> [].

severity(Share, Limit) when Share < Limit / 2 -> critical;
severity(_, _) -> warning.

%% The ledger's notes, less the one every host-only ledger has.
host_notes(#{notes := Notes}) ->
    [N || N <- Notes, N =/= <<"scheduler_wall_time unavailable">>].

%% A library of its own: not the emulator, the kernel, the vDSO or libc.
native(Dso) ->
    Base = filename:basename(Dso),
    not (emulator(Dso) orelse Dso =:= <<"[kernel.kallsyms]">> orelse Dso =:= <<"[unknown]">>
         orelse Dso =:= <<"[vdso]">> orelse
         binary:match(Base, <<"libc.so">>) =/= nomatch orelse
         binary:match(Base, <<"libc-">>) =/= nomatch).

%% The emulator's own code: its executable, or JIT code (anonymous memory,
%% or named by a perf map).
emulator(Dso) ->
    Base = filename:basename(Dso),
    binary:match(Dso, <<"memfd:">>) =/= nomatch orelse
        binary:match(Base, <<"beam.">>) =:= {0, 5} orelse
        binary:match(Base, <<"perf-">>) =:= {0, 5}.

fig(Name, V, Unit) -> beamdiag_finding:figure(Name, V, Unit).
fig(Name, V, Unit, Opts) when is_map(Opts) -> beamdiag_finding:figure(Name, V, Unit, Opts);
fig(Name, V, Unit, Whole) -> beamdiag_finding:figure(Name, V, Unit, #{part_of => Whole}).

fmt(F, A) -> iolist_to_binary(io_lib:format(F, A)).

plural([_]) -> "";
plural(_) -> "s".


