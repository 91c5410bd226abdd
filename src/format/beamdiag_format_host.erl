%%% @doc The parts of a report that only a host-only diagnosis has
%%% (`beamdiag_host_session'): the header saying why the report is host-side only
%%% and what the distribution layer saw, the threads that wanted a CPU
%%% most, memory, and perf's view of the held threads. The text, JSON and
%%% HTML reports put these where the agent's sections would be.
%%%
%%% ```
%%% 1> io:put_chars(beamdiag_format_host:header(D)).
%%% beamdiag: app@host (OS pid 4242, found from epmd's port)
%%% the node did not answer in 3.0 s; host-side only
%%% ...
%%% '''
-module(beamdiag_format_host).

-export([header/1, threads/1, summary/1, none/0]).

-export_type([summary/0]).

%% summary/1: the host view's context keys it has (beamdiag_host_rules),
%% the reason as a line, the held threads, perf's result or why there is
%% none, and the node's memory as the host saw it.
-type summary() :: #{
    reason => requested | unresponsive | unreachable | slow,
    why => binary(),
    waited_ms => integer(),
    distribution => binary(),
    os_pid => pos_integer(),
    node => binary(),
    located => given | epmd_port | cmdline | ns_pid,
    window_s => number(),
    process_state => running | sleeping | stopped | zombie | gone | unknown,
    attach => beamdiag_attach_plan:public() | #{},
    header := binary(),
    hot_threads := [beamdiag_ledger:row()],
    perf := beamdiag_host_rules:perf_top() | #{error := binary()},
    memory := beamdiag_host_view:memory()
}.

%% Threads listed in the hot-threads table.
-define(TOP_THREADS, 6).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The report's header: the node, why host-side only, what
%% distribution saw, the window, the host's CPUs, cgroup and memory, perf.
-spec header(beamdiag_diagnosis:diagnosis()) -> iolist().
header(D = #{capture := C, ledger := L, host_view := V}) ->
    S = maps:get(settings, C),
    H = maps:get(host, L, #{}),
    T = maps:get(totals, L, #{}),
    Cg = maps:get(cgroup, L, #{}),
    [
        io_lib:format("beamdiag: ~ts (OS pid ~b, ~ts)~n",
                      [beamdiag_safe_text:safe(maps:get(node, V, <<"?">>), 68), maps:get(os_pid, V),
                       located(maps:get(located, V, given))]),
        reason(V),
        beamdiag_format_text:attach(maps:get(attach, V, #{})),
        io_lib:format("host view: ~.1f s window, ~b samples of /proc~ts; schedulers ~b, dirty cpu ~b, "
                      "dirty io ~b (from the threads' names)~n",
                      [maps:get(window_s, L, 0.0), length(maps:get(samples, C)),
                       beamdiag_format_text:ready(D),
                       maps:get(schedulers, S), maps:get(dirty_cpu_schedulers, S),
                       maps:get(dirty_io_schedulers, S)]),
        case H of
            #{ncpu := N} ->
                io_lib:format("host ~b CPUs, ~s busy, steal ~s; node used ~.2f CPUs~n",
                              [N, beamdiag_units:pct(maps:get(busy, H)), beamdiag_units:pct(maps:get(steal, H)),
                               maps:get(cpus_used, T, 0.0)]);
            _ ->
                ""
        end,
        cgroup(Cg),
        memory(C),
        case {maps:get(perf, V, none), V} of
            {none, #{perf_skipped := Why}} ->
                ["perf: not run: ", beamdiag_safe_text:safe(Why, 200), "\n"];
            {Perf, _} ->
                perf(Perf)
        end
    ].

%% @doc The threads that wanted a CPU most (on it, or runnable waiting for
%% it), as shares of the window.
-spec threads(beamdiag_diagnosis:diagnosis()) -> iolist().
threads(#{ledger := #{threads := Rows, window_s := W}}) when W > 0 ->
    Sorted = lists:sort(fun(A, B) -> wanted(A) >= wanted(B) end, Rows),
    [
        "THREADS (share of the window; from /proc/PID/task, the node not asked)\n",
        io_lib:format("  ~-16s ~8s ~10s ~7s ~6s ~6s ~6s ~9s~n",
                      ["thread", "tid", "type", "wanted", "on-cpu", "user", "runq", "vol. cs"]),
        [io_lib:format("  ~-16ts ~8b ~10s ~7s ~6s ~6s ~6s ~9b~n",
                       [beamdiag_safe_text:safe(Name, 16), Tid, Type, beamdiag_units:pct(min(1.0, wanted(R) / W)),
                        beamdiag_units:pct(min(1.0, On / W)), beamdiag_units:pct(min(1.0, U / W)), beamdiag_units:pct(min(1.0, Q / W)), Vol])
         || R = #{name := Name, tid := Tid, type := Type, on_cpu := On, user := U, runq := Q,
                  nvcsw := Vol} <- lists:sublist(Sorted, ?TOP_THREADS)],
        "\n"
    ];
threads(_) ->
    "THREADS\n  no per-thread figures (see notes)\n\n".

%% @doc The findings line of a host-only report without findings: only
%% what the host can see is cleared.
-spec none() -> binary().
none() ->
    <<"none from the host: no scheduler thread held or blocked in the kernel, no CPU "
      "saturation or throttling, no memory shortage (busy-waiting, lock waits and the VM's own figures "
      "cannot be seen from the host)">>.

%% @doc What the JSON report carries about the host-only view.
-spec summary(beamdiag_diagnosis:diagnosis()) -> summary().
summary(#{capture := C, host_view := V}) ->
    Base = maps:with([reason, why, waited_ms, distribution, os_pid, node, located, window_s,
                      process_state, attach], V),
    Perf = case maps:get(perf, V, none) of
               {ok, P} -> P;
               {error, Why} -> #{error => Why};
               none -> #{error => iolist_to_binary(["not run: ", maps:get(perf_skipped, V,
                                                                          <<"no thread held">>)])}
           end,
    Base#{header => iolist_to_binary(reason_line(V)),
          hot_threads => [maps:with([tid, name], R) || R <- maps:get(hot, V, [])],
          perf => Perf,
          memory => last_memory(C)}.

%%%===================================================================
%%% Internal
%%%===================================================================

reason(V) ->
    [reason_line(V), "\n",
     case V of
         #{distribution := D} -> ["  distribution: ", D, "\n"];
         _ -> ""
     end,
     case maps:get(process_state, V, unknown) of
         stopped -> "  the node's OS process is stopped (SIGSTOP, or a debugger holds it): "
                    "none of its threads runs\n";
         zombie -> "  the node's OS process has exited (a zombie its parent has not reaped)\n";
         gone -> "  the node's OS process is gone\n";
         _ -> ""
     end].

reason_line(#{reason := unresponsive, waited_ms := Ms}) ->
    io_lib:format("the node did not answer in ~.1f s; host-side only", [Ms / 1000]);
reason_line(#{reason := unreachable}) ->
    "the node runs but was not reached over distribution; host-side only";
reason_line(#{reason := slow, why := Why}) ->
    [Why, "; host-side only"];
reason_line(_) ->
    "host-side only, as asked: the node was not asked anything".

located(given) -> "given";
located(epmd_port) -> "found from epmd's port";
located(cmdline) -> "found from its command line";
located(ns_pid) -> "given as the pid it sees in its own PID namespace".

cgroup(#{quota_cpus := Q} = Cg) when is_number(Q) ->
    io_lib:format("cgroup quota ~.2f CPUs; throttled ~b of ~b periods~n",
                  [float(Q), maps:get(throttled_periods, Cg, 0), maps:get(periods, Cg, 0)]);
cgroup(#{}) ->
    "cgroup quota: none\n".

memory(C) ->
    M = last_memory(C),
    Host = case M of
               #{mem_available := A, mem_total := Tot} ->
                   io_lib:format("host ~ts available of ~ts", [beamdiag_units:memory(A), beamdiag_units:memory(Tot)]);
               _ -> "host: unknown"
           end,
    Rss = case M of
              #{rss := R} -> io_lib:format("; node resident ~ts", [beamdiag_units:memory(R)]);
              _ -> ""
          end,
    Cg = case M of
             #{cgroup_max := max, cgroup_current := Cur} ->
                 io_lib:format("; cgroup uses ~ts, no limit", [beamdiag_units:memory(Cur)]);
             #{cgroup_max := Max, cgroup_current := Cur} ->
                 io_lib:format("; cgroup uses ~ts of ~ts", [beamdiag_units:memory(Cur), beamdiag_units:memory(Max)]);
             _ -> ""
         end,
    ["memory: ", Host, Rss, Cg, "\n"].

last_memory(#{extras := #{memory := M}}) -> M;
last_memory(_) -> #{}.

perf({ok, #{samples := N, top := Top}}) ->
    ["perf: ", integer_to_list(N), " samples of the held threads",
     case Top of
         [] -> "";
         _ -> [": ", lists:join(", ", [[beamdiag_safe_text:safe(S, 60), " (",
                                        beamdiag_safe_text:safe(filename:basename(D), 60), ") ",
                                        beamdiag_units:pct(Sh)]
                                       || #{symbol := S, dso := D, share := Sh} <-
                                              lists:sublist(Top, 3)])]
     end, "\n"];
perf({error, Why}) ->
    ["perf: not used: ", beamdiag_safe_text:safe(Why, 200), "\n"];
perf(none) ->
    "perf: not run (no thread held, or too little of the window left)\n".

wanted(#{on_cpu := On, runq := Q}) -> On + Q.


