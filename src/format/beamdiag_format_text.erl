%%% @doc The text report: findings first, then the time ledger by thread
%%% type with the worst outliers, then msacc and notes. Fits 80 columns
%%% whatever the number of schedulers.
%%%
%%% ```
%%% 1> io:put_chars(beamdiag_format_text:diagnosis(D, #{colour => false})).
%%% beamdiag: lab_busy_wait@host, OTP 25 (jit), 10.0 s window, 11 samples
%%% ...
%%% '''
-module(beamdiag_format_text).

-export([diagnosis/2, ready/1, cluster/2, attach/1]).

-ifdef(TEST).
-export([memory/1]).
-endif.
%% Called by scripts/ledger-table.escript.
-ignore_xref([{pct, 1}]).

-export_type([options/0]).

%% `colour': ANSI colours (false); `all': the cluster report's row per
%% node (false).
%% `memory': the report's memory ledger had accounts, so the all-clear
%% may say memory was looked at (set by report/2).
-type options() :: #{colour => boolean(), all => boolean(), memory => boolean()}.

-define(WIDTH, 80).
-define(OUTLIERS, 3).
%% The cluster report's bounds: outliers in full, outliers named, findings
%% counted, members not diagnosed listed.
-define(CLUSTER_FULL, 3).
-define(CLUSTER_NAMED, 5).
-define(CLUSTER_SHARED, 8).
-define(CLUSTER_ERRORS, 4).
-define(CLUSTER_HOSTS, 2).
%% Lines the cluster report keeps to without --all.
-define(CLUSTER_LINES, 50).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The whole report. Options: `colour' (false). Elixir's functions
%% are named the Elixir way (beamdiag_elixir_names).
-spec diagnosis(beamdiag_diagnosis:diagnosis(), options()) -> binary().
diagnosis(D, Opts) ->
    report(beamdiag_elixir_names:diagnosis(D), Opts).

report(D = #{host_only := true, capture := C, ledger := L, findings := F}, Opts) ->
    %% Seen from the host alone (beamdiag_host_session): no VM figures; the lock
    %% counters, read apart from the agent, when the node counts locks.
    finish(iolist_to_binary([
        beamdiag_format_host:header(D),
        "\n",
        case F of
            %% The host sees neither busy-waiting nor the VM's own figures.
            [] -> ["FINDINGS\n  ", beamdiag_format_host:none(), "\n"];
            _ -> findings(F, Opts#{colour => false})
        end,
        "\n",
        beamdiag_format_host:threads(D),
        memory(maps:get(memory, D, undefined)),
        locks(C),
        notes(L)
    ]), Opts);
report(D = #{capture := C, ledger := L, findings := F}, Opts) ->
    Plain = iolist_to_binary([
        header(C, L, ready(D)),
        attach(maps:get(attach, maps:get(extras, C, #{}), #{})),
        "\n",
        findings(F, Opts#{colour => false, memory => memory_measured(D)}),
        "\n",
        processes(C),
        ledger_table(L, Opts),
        memory(maps:get(memory, D, undefined)),
        msacc(L, maps:get(settings, C, #{})),
        locks(C),
        profile(C),
        notes(L)
    ]),
    finish(Plain, Opts).

%% Strings from the target or a capture file may hold anything: the
%% report is made safe for a terminal as a whole, then coloured.
finish(Plain, Opts) ->
    Clean = beamdiag_safe_text:report(Plain),
    case maps:get(colour, Opts, false) of
        true -> colourise(Clean);
        false -> Clean
    end.

%% @doc The findings section.
-spec findings([beamdiag_finding:finding()], options()) -> iolist().
findings([], #{memory := true}) ->
    "FINDINGS\n  none: no sign of busy-waiting, starvation, throttling, blocking or saturation,\n"
    "  and no part of the memory grew enough for a memory finding (MEMORY below\n"
    "  gives each part's rate)\n";
findings([], _Opts) ->
    "FINDINGS\n  none: no sign of busy-waiting, starvation, throttling, blocking or saturation\n"
    "  (memory not measured: no memory readings in the capture)\n";
findings(Findings, Opts) ->
    ["FINDINGS\n", [finding(F, Opts) || F <- Findings]].

%% The allocator types with the most free space in their carriers at the
%% window's end, three at most, each with the share of its carriers in use.
allocators([]) ->
    [];
allocators(Rows) ->
    ["  free in carriers at the end, most first:\n",
     [io_lib:format("    ~-14s ~10s free of ~10s (~s in use)~n",
                    [T, beamdiag_units:bytes(C - B), beamdiag_units:bytes(C),
                     beamdiag_units:whole_pct(B / C)])
      || #{type := T, carriers := C, blocks := B} <- lists:sublist(Rows, 3), C > 0]].

memory_measured(#{memory := #{accounts := Acc}}) -> map_size(Acc) > 0;
memory_measured(_) -> false.

%% @doc The memory ledger: each account at the window's ends, its change
%% and rate, whether it rose steadily; the room left and its time.
-spec memory(beamdiag_memory_ledger:memory() | undefined) -> iolist().
memory(#{accounts := Acc, span_s := Span} = M) when map_size(Acc) > 0 ->
    Names = #{rss => "resident (OS)", anon => "  anonymous", native => "  beyond the VM",
              outside => "  beyond carriers", total => "VM total", processes => "  processes",
              binary => "  binary", ets => "  ets", atom => "  atom", code => "  code",
              other => "  other", carriers => "VM carriers", blocks => "  in use (blocks)"},
    Rows = [io_lib:format("  ~-18s ~10s ~10s ~11s ~11s~s~n",
                          [maps:get(K, Names), beamdiag_units:bytes(F), beamdiag_units:bytes(L),
                           beamdiag_units:signed_bytes(Ch), beamdiag_units:signed_bytes(R),
                           case St of true -> "  steady"; false -> "" end])
            || K <- beamdiag_memory_ledger:accounts(),
               #{first := F, last := L, change := Ch, rate := R, steady := St} <- [maps:get(K, Acc, none)]],
    Room = case M of
               #{room := Room0, bound_by := By, time_left_s := Left} ->
                   io_lib:format("  room at the end: ~s (~s); ~s~n",
                                 [beamdiag_units:bytes(Room0),
                                  case By of host -> "the host's MemAvailable";
                                             cgroup -> "below the cgroup's limit" end,
                                  case Left of
                                      infinity -> "the resident memory did not grow";
                                      _ -> io_lib:format("at the resident memory's rate, gone in ~b s",
                                                         [round(Left)])
                                  end]);
               _ ->
                   "  room at the end: not read\n"
           end,
    [io_lib:format("MEMORY (the OS's account beside the VM's, bytes, ~b readings over ~.1f s)~n",
                   [maps:get(readings, M), Span]),
     io_lib:format("  ~-18s ~10s ~10s ~11s ~11s~n", ["account", "start", "end", "change", "per s"]),
     Rows, allocators(maps:get(allocators, M, [])), Room,
     [["  ", N, "\n"] || N <- maps:get(notes, M, [])]];
memory(#{notes := [Note | _]}) ->
    ["MEMORY\n  ", Note, "\n"];
memory(_) ->
    "".


%% @doc The ledger table: one line per thread type, then the outliers.
-spec ledger_table(beamdiag_ledger:ledger(), options()) -> iolist().
ledger_table(#{threads := []}, _Opts) ->
    "TIME LEDGER\n  no per-thread figures (see notes)\n";
ledger_table(L = #{by_type := ByType}, _Opts) ->
    Head = io_lib:format("~-10s ~4s ~6s ~6s ~6s ~6s ~6s ~6s ~6s ~7s~n",
                         ["type", "n", "busy", "on-cpu", "user", "sys", "runq", "off", "spin",
                          "blocked"]),
    Rows = [type_line(T, maps:get(T, ByType)) || T <- beamdiag_threads:types(),
                                                 maps:is_key(T, ByType)],
    [
        "TIME LEDGER (share of wall time per thread, summed by type)\n",
        Head,
        Rows,
        outliers(beamdiag_ledger:outliers(L, ?OUTLIERS))
    ].

%% @doc How long after the call a diagnosis made now was ready, for a
%% header line ("" for one re-read from a capture).
-spec ready(beamdiag_diagnosis:diagnosis()) -> iolist().
ready(#{ready_ms := Ms}) -> io_lib:format(", ready ~.1f s after the call", [Ms / 1000]);
ready(_) -> "".

%% @doc How the node was reached, or tried: each setting resolved with
%% where it came from, the cookie only as its origin and a short hash
%% ("" when the diagnosis does not say).
%% (#{}: a session that had no plan to show.)
-spec attach(beamdiag_attach_plan:public() | #{}) -> iolist().
attach(#{settings := Rows} = A) ->
    Cookie = case A of
                 #{cookie := #{from := From, hash := H}} ->
                     [row(<<"cookie">>, H, From)];
                 _ ->
                     case maps:get(cookies_tried, A, []) of
                         [] -> [];
                         Tried ->
                             [row(<<"cookies found">>,
                                  lists:join("; ", [[H, " from ", From]
                                                    || #{hash := H, from := From} <- Tried]), <<>>)]
                     end
             end,
    [Name | Rest] = [row(S, V, F) || #{setting := S, value := V, from := F} <- Rows],
    ["attach: ", Name, [["        ", R] || R <- Cookie ++ Rest],
     [["  note: ", wrap(N, 8, ?WIDTH), "\n"] || N <- maps:get(notes, A, [])]];
attach(_) ->
    "".

row(Setting, Value, <<>>) ->
    [wrap([Setting, " ", Value], 8, ?WIDTH), "\n"];
row(Setting, Value, From) ->
    [wrap([Setting, " ", Value, ", from ", From], 8, ?WIDTH), "\n"].

%% @doc Wraps text to the width, every line after the first indented.
-spec wrap(iodata(), non_neg_integer(), pos_integer()) -> iolist().
wrap(Text, Indent, Width) ->
    Words = string:lexemes(beamdiag_safe_text:chars(Text), " \n"),
    Pad = lists:duplicate(Indent, $\s),
    {Lines, Last} = lists:foldl(
        fun(W, {Acc, Cur}) ->
            case Cur of
                "" -> {Acc, W};
                _ when length(Cur) + 1 + length(W) + Indent > Width -> {[Cur | Acc], W};
                _ -> {Acc, Cur ++ " " ++ W}
            end
        end,
        {[], ""},
        Words
    ),
    lists:join(["\n", Pad], lists:reverse([Last | Lines])).

%%%===================================================================
%%% Internal
%%%===================================================================

header(#{node := Node, settings := S, samples := Samples} = C, L, Ready) ->
    Complete = case maps:get(complete, C, true) of
                   true -> "";
                   false -> " (PARTIAL: see the notes)"
               end,
    H = maps:get(host, L, #{}),
    T = maps:get(totals, L, #{}),
    Cg = maps:get(cgroup, L, #{}),
    [
        io_lib:format("beamdiag: ~ts~n", [beamdiag_safe_text:safe(Node, 68)]),
        io_lib:format("OTP ~ts (~ts~ts), ~.1f s window, ~b samples~ts~s~n",
                      [maps:get(otp_release, S), maps:get(emu_flavor, S),
                       case maps:get(lock_counting, S, false) of true -> ", lcnt"; _ -> "" end,
                       maps:get(window_s, L, 0.0), length(Samples), Ready, Complete]),
        io_lib:format("schedulers ~b/~b online, dirty cpu ~b, dirty io ~b~n"
                      "busy wait: +sbwt ~ts +sbwtdcpu ~ts +sbwtdio ~ts; +Mdai ~ts~n",
                      [maps:get(schedulers_online, S), maps:get(schedulers, S),
                       maps:get(dirty_cpu_schedulers_online, S), maps:get(dirty_io_schedulers, S),
                       maps:get(sbwt, S), maps:get(sbwtdcpu, S), maps:get(sbwtdio, S),
                       maps:get(mdai, S)]),
        case H of
            #{ncpu := N} ->
                io_lib:format("host ~b CPUs, ~s busy, steal ~s; node used ~.2f of ~.2f CPUs~n"
                              "cgroup quota: ~ts~n",
                              [N, beamdiag_units:pct(maps:get(busy, H)), beamdiag_units:pct(maps:get(steal, H)),
                               maps:get(cpus_used, T, 0.0),
                               float(maps:get(cpus_available, T, 0)),
                               quota(maps:get(quota_cpus, Cg, unlimited))]);
            _ ->
                ""
        end
    ].

finding(#{id := Id, severity := Sev, title := Title, evidence := Ev, fix := Fix,
          when_not := WhenNot}, _Opts) ->
    Tag = string:uppercase(atom_to_list(Sev)),
    [
        "\n[", Tag, "] ", atom_to_list(Id), ": ", Title, "\n",
        [["  - ", wrap(E, 4, ?WIDTH), "\n"] || E <- Ev],
        "  fix: ", wrap(Fix, 7, ?WIDTH), "\n",
        "  when not: ", wrap(WhenNot, 12, ?WIDTH), "\n"
    ].


%% Colours the severity tags at the start of finding lines.
colourise(Text) ->
    lists:foldl(
        fun({Tag, Esc}, T) ->
            binary:replace(T, <<"\n[", Tag/binary, "]">>,
                           <<"\n", Esc/binary, "[", Tag/binary, "]\e[0m">>, [global])
        end,
        Text,
        [{<<"CRITICAL">>, <<"\e[1;31m">>}, {<<"WARNING">>, <<"\e[1;33m">>},
         {<<"INFO">>, <<"\e[36m">>}]).

type_line(Type, Row = #{n := N, wall := Wall}) ->
    Cells = [beamdiag_units:pct(share(K, Row, Wall)) || K <- [busy, on_cpu, user, sys, runq, off_cpu, spin]],
    io_lib:format("~-10s ~4b ~6s ~6s ~6s ~6s ~6s ~6s ~6s ~7s~n",
                  [atom_to_list(Type), N | Cells] ++ [beamdiag_units:pct(share(blocked, Row, Wall))]).

share(K, Row, Wall) ->
    case maps:get(K, Row) of
        undefined -> undefined;
        V -> beamdiag_ledger:share(K, #{K => V}, Wall)
    end.

%% The scheduler threads that stand out most from their type (see
%% beamdiag_outliers:threads/1).
outliers([]) ->
    "";
outliers(Top) ->
    ["outliers:\n",
     [io_lib:format("  ~-15ts busy ~6s on-cpu ~6s runq ~6s spin ~6s blocked ~6s~n",
                    [safe(Name), beamdiag_units:pct(share(busy, T, W)), beamdiag_units:pct(share(on_cpu, T, W)),
                     beamdiag_units:pct(share(runq, T, W)), beamdiag_units:pct(share(spin, T, W)),
                     beamdiag_units:pct(share(blocked, T, W))])
      || T = #{name := Name, wall := W} <- Top]].

msacc(L = #{msacc := M = #{by_type := ByType, extra := Extra}}, Settings) ->
    Types = [T || T <- [scheduler, dirty_cpu, dirty_io, aux, poll], maps:is_key(T, ByType)],
    [
        "\nMICROSTATES (msacc, share of wall time", msacc_span(M, L), ")",
        case Extra of
            true ->
                " with extra states\n";
            false ->
                ["\n  default states only: busy_wait and timers are inside 'other'; bif, ets, nif\n"
                 "  and send inside 'emulator'; gc_full inside 'gc'. For the split, ",
                 beamdiag_lock_advice:msacc_split(Settings)]
        end,
        "  wall time, not CPU: a thread that waits for a CPU stays in its state\n",
        [msacc_line(T, maps:get(T, ByType)) || T <- Types]
    ];
msacc(_, _) ->
    "".

%% Says so when msacc covered only the end of the window.
msacc_span(#{span_s := S}, #{window_s := W}) when S < W - 0.05 ->
    io_lib:format(", last ~.1f s of the window", [S]);
msacc_span(_, _) ->
    "".

%% A saved capture read back keeps as binaries the state names this VM has
%% no atom for (the lock-counting emulator's extra states: alloc, timers).
msacc_line(Type, #{shares := Shares}) ->
    Top = beamdiag_agent_top:largest(5, 2, maps:to_list(Shares)),
    io_lib:format("  ~-10ts ~ts~n",
                  [beamdiag_safe_text:safe(Type, 20),
                   lists:join("  ", [[beamdiag_safe_text:safe(S, 20), " ", beamdiag_units:pct(V)]
                                     || {S, V} <- Top, V > 0.0005])]).

locks(#{extras := #{locks := Locks}}) when is_map(Locks) ->
    ["\n", beamdiag_format_locks:text(Locks)];
locks(_) ->
    "".

processes(#{extras := Extras = #{procs := P}}) when is_map(P) ->
    ByProcess = case Extras of
                    #{profile := #{by_process := B}} when is_list(B) -> B;
                    _ -> []
                end,
    [beamdiag_format_procs:text(P, ByProcess), "\n"];
processes(_) ->
    "".

profile(#{extras := #{profile := R = #{profile := P}}}) ->
    [
        "\nPROFILE: ", beamdiag_format_profile:header(R),
        beamdiag_fold:format_top("top functions", beamdiag_fold:top(P, #{kind => all, limit => 8}))
    ];
profile(_) ->
    "".

notes(#{notes := []}) -> "";
notes(#{notes := Notes}) -> ["\nNOTES\n", [["  - ", wrap(N, 4, ?WIDTH), "\n"] || N <- Notes]].

quota(unlimited) -> "none";
quota(Q) when is_number(Q) -> io_lib:format("~.2f CPUs", [float(Q)]).

%% Strings from the target: printable, one line, bounded.
safe(Text) -> beamdiag_safe_text:safe(Text, 120).

%%%===================================================================
%%% Cluster
%%%===================================================================

%% @doc The cluster report (see `beamdiag_cluster'): the outliers first,
%% each with the figures that set it apart and its findings, then one
%% screen on the other nodes (how many share each finding, the spread of
%% each figure), then the members that did not answer. Option `all'
%% (false) adds a row per node. Fits 80 columns and, without `all', about
%% 50 lines whatever the number of nodes.
-spec cluster(beamdiag_cluster_analysis:cluster(), options()) -> binary().
cluster(C, Opts) ->
    %% Fewer outliers in full (the others by name) when all would not fit.
    Texts = [cluster(C, Opts, Full) || Full <- lists:seq(?CLUSTER_FULL, 1, -1)],
    case [T || T <- Texts, length(binary:split(T, <<"\n">>, [global, trim])) =< ?CLUSTER_LINES] of
        [T | _] -> T;
        [] -> lists:last(Texts)
    end.

cluster(C = #{members := Ms, nodes := Nodes, outliers := Out, errors := Errs}, Opts, Full) ->
    #{windows := #{start_spread_s := Spread, overlap_s := Overlap}, window_s := W} = C,
    Plain = iolist_to_binary([
        io_lib:format("beamdiag cluster: ~b members ~ts, ~b answered, ~b did not~n",
                      [length(Ms), source(C), length(Nodes), length(Errs)]),
        case Nodes of
            [] -> "";
            _ -> [io_lib:format("  ~.1f s windows, started within ~.2f s (wall clock); "
                                "all overlap for ~.1f s~n",
                                [float(W), float(Spread), float(Overlap)]),
                  case C of
                      #{timing := T = #{phases_ms := Ph}} ->
                          [cluster_phases(Ph), per_member(T)];
                      #{prepare_s := P, total_s := T} ->
                          [io_lib:format("  connect and load: ~.1f s; report ready ~.1f s after the "
                                         "agents started~n",
                                         [float(P), float(T - P)]),
                           cluster_timing(maps:get(timing, C, #{}))];
                      _ -> ""
                  end]
        end,
        "\n",
        cluster_outliers(Out, length(Nodes), Full),
        "\n",
        cluster_hosts(maps:get(hosts, C, [])),
        cluster_rest(C),
        cluster_saturated(maps:get(saturated_host, C, null)),
        cluster_errors(Errs),
        case maps:get(all, Opts, false) of
            true -> ["\n", cluster_rows(Nodes)];
            false when Nodes =/= [] -> "\n(one row per node: --all; everything: --json)\n";
            false -> ""
        end
    ]),
    beamdiag_safe_text:report(Plain).

source(#{source := seed, seed := Seed}) -> ["(", safe(Seed), " and the nodes it is connected to)"];
source(#{source := list}) -> "(from the node list)".

%% The outliers in full, at most ?CLUSTER_FULL of them; the next ones by
%% name and headline.
cluster_outliers(_Out, N, _Full) when N < 3 ->
    "OUTLIERS\n  none: it takes at least three answering nodes\n";
cluster_outliers([], _N, _Full) ->
    "OUTLIERS\n  none: no node's figures stand out above the cluster's median (z < 3.5)\n";
cluster_outliers(Out, _N, InFull) ->
    {Full, Short} = lists:split(min(InFull, length(Out)), Out),
    {Named, Unnamed} = lists:split(min(?CLUSTER_NAMED, length(Short)), Short),
    ["OUTLIERS (", integer_to_list(length(Out)), "; robust z above the cluster's median "
     ">= 3.5)\n",
     [cluster_outlier(O) || O <- Full],
     [io_lib:format("  ~ts: ~ts~n", [safe(N), cut(hd(Ev), ?WIDTH - 6 - string:length(safe(N)))])
      || #{node := N, finding := #{evidence := Ev}} <- Named],
     case Unnamed of
         [] -> "";
         _ -> io_lib:format("  and ~b more (--all, --json)~n", [length(Unnamed)])
     end].

cluster_outlier(#{node := N, figures := Figs, finding := #{evidence := [Head | _]},
                  findings := Fs}) ->
    ["  ", cut([safe(N), " (z ", zs(Figs), ")"], ?WIDTH - 2), "\n",
     block(["WARNING cluster_outlier: ", Head], 4),
     case [F || F = #{id := Id} <- Fs, Id =/= cluster_outlier] of
         [] -> "    its findings: none\n";
         Own -> ["    its findings: ",
                 cut(lists:join(", ", [[string:uppercase(atom_to_list(S)), " ", atom_to_list(Id)]
                                       || #{id := Id, severity := S} <- Own]), ?WIDTH - 18),
                 "\n"]
     end].

zs(Figs) ->
    lists:join(", ", [io_lib:format("~ts ~s~.1f", [K, sign(Z), abs(Z)])
                      || #{figure := K, z := Z} <- lists:sublist(Figs, 3)]).

sign(Z) when Z < 0 -> "-";
sign(_) -> "+".

cluster_rest(#{rest := #{n := 0}}) ->
    "";
cluster_rest(#{rest := #{n := N, shared := #{by_finding := By, without_findings := None},
                         spread := Spread}}) ->
    Shown = lists:sublist(By, ?CLUSTER_SHARED),
    [io_lib:format("THE OTHER ~b NODES~n", [N]),
     io_lib:format("  ~-40s ~6s~n", ["findings", "nodes"]),
     [io_lib:format("  ~-40ts ~6b~n", [[string:uppercase(atom_to_list(S)), " ", atom_to_list(Id)], K])
      || #{id := Id, severity := S, nodes := K} <- Shown],
     case length(By) > ?CLUSTER_SHARED of
         true -> io_lib:format("  and ~b findings more (--json)~n", [length(By) - ?CLUSTER_SHARED]);
         false -> ""
     end,
     io_lib:format("  ~-40s ~6b~n", ["no finding", None]),
     io_lib:format("~n  ~-22s ~10s ~10s ~10s ~10s~n", ["figure", "min", "p50", "p90", "max"]),
     [io_lib:format("  ~-22s ~10ts ~10ts ~10ts ~10ts~n",
                    [figure_label(K) | [figure_value(K, maps:get(P, S)) || P <- [min, p50, p90, max]]])
      || K <- beamdiag_outliers:figures(), S <- [maps:get(K, Spread)]]].

figure_label(cpus_used) -> "CPUs used";
figure_label(reductions_per_s) -> "reductions/s";
figure_label(busy) -> "sched busy (% wall)";
figure_label(on_cpu) -> "sched on CPU (% wall)";
figure_label(spin) -> "sched spin (% wall)";
figure_label(runq) -> "sched runq (% wall)";
figure_label(sys) -> "sched kernel (% wall)";
figure_label(blocked) -> "sched blocked (% wall)".

figure_value(cpus_used, V) -> io_lib:format("~.2f", [float(V)]);
figure_value(reductions_per_s, V) -> beamdiag_units:rate(V);
figure_value(_, V) -> beamdiag_units:pct(V).


%% Where the session's time went, phase by phase.
cluster_phases(Ph) ->
    S = fun(K) -> io_lib:format("~.1f", [maps:get(K, Ph, 0) / 1000]) end,
    Total = lists:sum([V || V <- maps:values(Ph), is_integer(V)]),
    io_lib:format("  took ~.1f s: members ~s, connect and load ~s, agents' start ~s,~n"
                  "  window ~s, collect ~s, analyse ~s, report ~s~n",
                  [Total / 1000, S(members), S(prepare), S(start), S(window), S(collect),
                   S(analyse), S(report)]).

%% The hosts two members or more share: each with its members, its CPUs
%% and, when the members waited for them, the finding that says so once
%% for the host (at most ?CLUSTER_HOSTS of them; the rest counted).
cluster_hosts(Hosts) ->
    case [H || H = #{members := [_, _ | _]} <- Hosts] of
        [] ->
            "";
        Shared ->
            {Shown, More} = lists:split(min(?CLUSTER_HOSTS, length(Shared)), Shared),
            [io_lib:format("HOSTS (~b shared by ~b members)~n",
                           [length(Shared), lists:sum([length(Ms) || #{members := Ms} <- Shared])]),
             [cluster_host(H) || H <- Shown],
             case More of
                 [] -> "";
                 _ -> io_lib:format("  and ~b more (--json)~n", [length(More)])
             end,
             "\n"]
    end.

%% A host on one line, and its finding in words from its figures.
cluster_host(H = #{name := Name, members := Ms}) ->
    Id = case maps:get(boot_id, H, null) of
             B when is_binary(B) -> [" (boot id ", binary:part(B, 0, min(8, byte_size(B))), ")"];
             _ -> ""
         end,
    Cpus = case maps:get(cpus, H, null) of
               null -> "";
               N -> io_lib:format(", ~b CPUs", [round(N)])
           end,
    Busy = case maps:get(busy, H, null) of
               #{median := B2} -> [" ", beamdiag_units:pct(B2), " busy"];
               _ -> ""
           end,
    ["  ", cut([safe(Name), Id, io_lib:format(": ~b members", [length(Ms)]), Cpus, Busy], ?WIDTH - 2),
     "\n",
     [block([string:uppercase(atom_to_list(S)), " ", atom_to_list(Id2), ": ",
             io_lib:format("~b ~s for a CPU with work to do (median ~s, worst ~s of "
                           "their schedulers' wall time)",
                           [maps:get(members_waiting, M, 0),
                            case maps:get(members_waiting, M, 0) of
                                1 -> "member waited";
                                _ -> "members waited"
                            end,
                            beamdiag_units:pct(maps:get(runq_share_median, M, 0.0)),
                            beamdiag_units:pct(maps:get(worst_runq_share, M, 0.0))])], 4)
      || #{id := Id2, severity := S, metrics := M} <- maps:get(findings, H, [])]].

%% A member's connect and load: the median and the slowest.
per_member(#{connect_ms := #{median := CM, max := CX}, load_ms := #{median := LM, max := LX}})
  when is_integer(CM), is_integer(LM) ->
    io_lib:format("  per member, median (max): connect ~b ms (~b), load ~b ms (~b)~n",
                  [CM, CX, LM, LX]);
per_member(_) ->
    "".

%% Where the time went: a member's median and the slowest, then when the
%% captures came and were analysed, from the agents' start.
cluster_timing(#{connect_ms := #{median := CM, max := CX}, load_ms := #{median := LM, max := LX},
                 captured_ms := #{median := CapM, max := CapX},
                 analysed_ms := #{median := AM, max := AX}})
  when is_integer(CM), is_integer(LM), is_integer(CapM), is_integer(AM) ->
    [io_lib:format("  per member, median (max): connect ~b ms (~b), load ~b ms (~b)~n",
                   [CM, CX, LM, LX]),
     io_lib:format("  captured ~.1f s (~.1f), analysed ~.1f s (~.1f) after the agents' start~n",
                   [CapM / 1000, CapX / 1000, AM / 1000, AX / 1000])];
cluster_timing(_) ->
    "".

%% This host saturated while members on it did not answer: said once,
%% with the host's figures, before the members not diagnosed.
cluster_saturated(null) ->
    "";
cluster_saturated(#{members := M, ncpu := N, busy := B, cpus := Cpus, load1 := L1,
                    span_s := Span, nodes := Nodes}) ->
    Load = case L1 of
               null -> "";
               _ -> io_lib:format(", load average ~.1f", [float(L1)])
           end,
    ["\nTHIS HOST WAS SATURATED\n",
     block(io_lib:format("~b members on this host did not answer in time (~ts~ts) while its ~b "
                         "CPUs were ~ts busy (~.2f CPUs~ts) over the ~.1f s their windows were run: "
                         "they had no CPU to answer with, so what is said of them below is this "
                         "host's doing, not theirs. Diagnose fewer at once (--nodes), or "
                         "members on hosts with CPU to spare.",
                         [M, lists:join(", ", [safe(X) || X <- Nodes]),
                          case M > length(Nodes) of true -> ", ..."; false -> "" end,
                          N, beamdiag_units:pct(B), float(Cpus), Load, float(Span)]), 2)].

%% The members not diagnosed, those with the same reason said once.
cluster_errors([]) ->
    "";
cluster_errors(Errs) ->
    Groups = error_groups(Errs),
    {Shown, More} = lists:split(min(?CLUSTER_ERRORS, length(Groups)), Groups),
    ["\nNOT DIAGNOSED (", integer_to_list(length(Errs)), ")\n",
     [case Ns of
          [N] -> block([safe(N), ": ", M], 2);
          _ -> block(io_lib:format("~b members (~ts~ts): ~ts",
                                   [length(Ns), lists:join(", ", [safe(X) || X <- lists:sublist(Ns, 3)]),
                                    case length(Ns) > 3 of true -> ", ..."; false -> "" end, M]), 2)
      end || {M, Ns} <- Shown],
     case More of
         [] -> "";
         _ -> io_lib:format("  and ~b more (--json)~n", [lists:sum([length(Ns) || {_, Ns} <- More])])
     end].

%% The errors grouped by their words, in the order each first comes.
error_groups(Errs) ->
    {Order, ByMsg} = lists:foldl(fun(#{node := N, message := M}, {O, By}) ->
                                         case By of
                                             #{M := Ns} -> {O, By#{M := [N | Ns]}};
                                             _ -> {[M | O], By#{M => [N]}}
                                         end
                                 end, {[], #{}}, Errs),
    [{M, lists:reverse(maps:get(M, ByMsg))} || M <- lists:reverse(Order)].

cluster_rows(Nodes) ->
    [io_lib:format("~-24s ~5s ~6s ~6s ~6s ~6s ~7s  ~s~n",
                   ["node", "cpus", "busy", "on-cpu", "spin", "runq", "red/s", "findings"]),
     [io_lib:format("~-24ts ~5.2f ~6s ~6s ~6s ~6s ~7s  ~ts~n",
                    [safe(N), float(Cpus), beamdiag_units:pct(B), beamdiag_units:pct(O), beamdiag_units:pct(S), beamdiag_units:pct(R), beamdiag_units:rate(Red),
                     case Fs of
                         [] -> "-";
                         _ -> cut(lists:join(",", [atom_to_list(Id) || #{id := Id} <- Fs]), 80)
                     end])
      || #{node := N, cpus_used := Cpus, busy := B, on_cpu := O, spin := S, runq := R,
           reductions_per_s := Red, findings := Fs} <- Nodes]].

%% Text wrapped to the width, every line indented.
block(Text, Indent) ->
    [lists:duplicate(Indent, $\s), wrap(Text, Indent, ?WIDTH), "\n"].

%% Text cut to at most N characters, "..." marking the cut.
cut(Text, N) ->
    beamdiag_safe_text:cut(Text, N).
