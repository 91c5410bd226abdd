%%% @doc The HTML report: one self-contained file that opens offline.
%%%
%%% Everything is inline: the style sheet, the data (one JSON document in a
%%% `<script type="application/json">' element) and a small script that
%%% draws the charts as SVG. The tables are rendered on the server side, so
%%% the findings, ledger, settings and lock tables read fine even with
%%% scripts off.
%%%
%%% This module lays out the report's sections; the rest has a module each:
%%% the page around them (beamdiag_html_page), the charts' data
%%% (beamdiag_html_chart_data), the tables for terms with no layout of
%%% their own (beamdiag_html_table) and escaped, bounded text
%%% (beamdiag_html_text).
%%%
%%% Every string that came from the target (node, thread, process, table and
%%% lock names, evidence, flag values) is HTML-escaped (beamdiag_html_text),
%%% and the charts set text with `textContent' only. The embedded JSON
%%% escapes `<', `>' and `&', so no string can close the script element.
%%% The flamegraph, drawn here from the folded stacks in the capture
%%% (`extras.profile.profile'), is shown in a sandboxed frame, where its own
%%% script can run but cannot reach the report.
%%%
%%% The script writes `data-rendered="N"' on the body when it has drawn N
%%% charts, and `data-errors' when a chart failed; tests read them back.
%%%
%%% `compare/1' and `experiment/1' render any result map generically: maps
%%% of numbers become tables, lists of maps become tables with one column
%%% per key, findings are shown as in a diagnosis.
%%%
%%% ```
%%% 1> {ok, D} = beamdiag:diagnose(#{duration => 5}).
%%% 2> file:write_file("report.html", beamdiag_format_html:diagnosis(D)).
%%% ok
%%% '''
-module(beamdiag_format_html).

-export([diagnosis/1, compare/1, experiment/1, cluster/1]).
%% Called by the tests only.
-ifdef(TEST).
-export([generic/2, escape/1]).
-endif.

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The whole diagnosis as one HTML document, Elixir's functions named
%% the Elixir way (beamdiag_elixir_names).
-spec diagnosis(beamdiag_diagnosis:diagnosis()) -> iodata().
diagnosis(D) ->
    document(beamdiag_elixir_names:diagnosis(D)).

document(D = #{capture := C, ledger := L, findings := F}) ->
    Node = maps:get(node, C, <<"?">>),
    Extras = maps:get(extras, C, #{}),
    Data = beamdiag_html_chart_data:diagnosis(C, L),
    Sections = host_only_section(D) ++ [
        {"findings", "Findings", case D of
                                     #{host_only := true, findings := []} ->
                                         ["<p class=\"none\">", esc(beamdiag_format_host:none()),
                                          "</p>\n"];
                                     _ -> findings(F)
                                 end},
        {"ledger", "Time ledger", ledger_section(L)},
        {"schedulers", "Schedulers", scheduler_section(L, Data)},
        {"cpu", "OS CPU and scheduler utilisation", cpu_section(L)},
        {"msacc", "Microstates", msacc_section(L)}
    ] ++ procs_section(Extras) ++ locks_section(Extras) ++ profile_section(Node, Extras) ++ [
        {"settings", "VM and host", settings_section(C, L)},
        {"notes", "Notes", notes_section(L, C)}
    ],
    Title = ["beamdiag: ", esc(lists:sublist(beamdiag_html_text:chars(Node), 200))],
    beamdiag_html_page:document(Title, header(C, L, F), Sections, Data).

%% @doc A cluster report (see `beamdiag_cluster') as one HTML document: the
%% outliers with their findings, a chart per figure across the nodes (each
%% node a bar, sorted, the outliers marked, the median drawn), the rest of
%% the nodes in summary, the members not diagnosed, and a row per node.
-spec cluster(beamdiag_cluster_analysis:cluster()) -> iodata().
cluster(C = #{members := Ms, nodes := Nodes, outliers := Out, errors := Errs}) ->
    Findings = maps:get(findings, C, #{}),
    #{windows := #{start_spread_s := Spread, overlap_s := Overlap}, window_s := W} = C,
    Header = ["<header>\n<h1>beamdiag cluster</h1>\n<p class=\"meta\">",
              integer_to_list(length(Ms)), " members &middot; ", integer_to_list(length(Nodes)),
              " answered &middot; ", integer_to_list(length(Errs)), " not diagnosed &middot; ",
              fmt("~.1f", [float(W)]), " s windows started within ", fmt("~.2f", [float(Spread)]),
              " s, all overlapping for ", fmt("~.1f", [float(Overlap)]), " s</p>\n",
              "<p class=\"summary\">",
              case Out of
                  [] -> "<span class=\"badge ok\">no outlier</span>";
                  _ -> ["<span class=\"badge warning\">", integer_to_list(length(Out)),
                        " outlier", case Out of [_] -> ""; _ -> "s" end, "</span>"]
              end, "</p>\n</header>\n"],
    Sections = [
        {"outliers", "Outliers",
         case Out of
             [] -> "<p class=\"none\">No node's figures stand out from the cluster's median.</p>\n";
             _ -> [["<h3>", cell_text(N, 200), "</h3>\n", findings(maps:get(N, Findings, []))]
                   || #{node := N} <- Out]
         end},
        {"figures", "Figures across the nodes",
         ["<p class=\"help\">One bar per node, sorted; outliers in red, the dashed line is the "
          "cluster's median.</p>\n<div class=\"charts\" id=\"cluster-charts\"></div>\n"]},
        {"rest", "The other nodes", cluster_rest(maps:get(rest, C, #{}))},
        {"errors", "Not diagnosed",
         case Errs of
             [] -> "<p class=\"none\">Every member answered.</p>\n";
             _ -> [saturated_host(maps:get(saturated_host, C, null)),
                   "<table><thead><tr><th>node</th><th>why</th></tr></thead><tbody>\n",
                   [["<tr><td>", cell_text(N, 200), "</td><td>", esc(M), "</td></tr>\n"]
                    || #{node := N, message := M} <- Errs],
                   "</tbody></table>\n"]
         end},
        {"nodes", "Every node",
         ["<details><summary>", integer_to_list(length(Nodes)), " nodes</summary>\n",
          "<table class=\"num\"><thead><tr><th>node</th>",
          [["<th>", esc(K), "</th>"] || K <- beamdiag_outliers:figures()],
          %% shares of scheduler wall time in %, CPUs, reductions per second
          "<th>findings</th></tr></thead><tbody>\n",
          [["<tr><td class=\"t\">", cell_text(N, 200), "</td>",
            [["<td>", cluster_value(K, maps:get(K, R)), "</td>"] || K <- beamdiag_outliers:figures()],
            "<td class=\"t\">", esc(lists:join(", ", [atom_to_list(Id) || #{id := Id} <- Fs])),
            "</td></tr>\n"]
           || R = #{node := N, findings := Fs} <- lists:sublist(Nodes, max_rows() * 4)],
          "</tbody></table>\n</details>\n"]}
    ],
    beamdiag_html_page:document("beamdiag cluster", Header, Sections,
                                beamdiag_html_chart_data:cluster(C)).

%% A diagnosis from the host alone (beamdiag_host_session): why, what distribution
%% saw, and the threads, first; the VM's sections below stay empty.
host_only_section(D = #{host_only := true}) ->
    [{"host", "Host-side only",
      ["<pre>", esc(iolist_to_binary([beamdiag_format_host:header(D), "\n",
                                      beamdiag_format_host:threads(D)])), "</pre>"]}];
host_only_section(_) ->
    [].

%% @doc A compare result (its JSON document) as one HTML document.
-spec compare(beamdiag_compare:document()) -> iodata().
compare(Result) ->
    result_page(<<"beamdiag compare">>, Result).

%% @doc An experiment result (its JSON document) as one HTML document.
-spec experiment(beamdiag_format_experiment:document()) -> iodata().
experiment(Result) ->
    result_page(<<"beamdiag experiment">>, Result).

-ifdef(TEST).
%% @doc Any JSON-able term (maps, lists, numbers, binaries, atoms) as HTML
%% tables, nested up to a depth; other terms are printed bounded. Option:
%% `depth' (0).
-spec generic(term(), #{depth => non_neg_integer()}) -> iodata().
generic(Term, Opts) ->
    beamdiag_html_table:render(Term, maps:get(depth, Opts, 0)).
-endif.

-ifdef(TEST).
%% @doc HTML-escapes text (for element content and quoted attributes).
%% Invalid UTF-8 becomes U+FFFD; control characters other than newline and
%% tab become U+FFFD as well.
-spec escape(iodata() | atom() | number()) -> binary().
escape(X) ->
    iolist_to_binary(beamdiag_html_text:escape(X)).
-endif.

%%%===================================================================
%%% Internal: page header and result pages
%%%===================================================================

result_page(Title, Result) ->
    {Findings, Rest} =
        case Result of
            #{findings := Fs} when is_list(Fs), Fs =/= [] ->
                case lists:all(fun is_finding/1, Fs) of
                    true -> {[{"findings", "Findings", findings(Fs)}], maps:without([findings], Result)};
                    false -> {[], Result}
                end;
            _ ->
                {[], Result}
        end,
    Header = ["<header><h1>", esc(Title), "</h1><p class=\"meta\">generated ",
              esc(now_text()), "</p></header>\n"],
    beamdiag_html_page:document(esc(Title), Header,
                                Findings ++ [{"result", "Result", value(Rest, 0)}],
                                #{kind => result}).

is_finding(F) ->
    is_map(F) andalso is_map_key(severity, F) andalso is_map_key(title, F) andalso
        is_map_key(evidence, F).

header(C, L, F) ->
    S = maps:get(settings, C, #{}),
    Samples = length(maps:get(samples, C, [])),
    Partial = case maps:get(complete, C, true) of
                  true -> "";
                  _ -> " <span class=\"badge critical\">partial: see the notes</span>"
              end,
    Counts = [{Sev, length([x || #{severity := S1} <- F, S1 =:= Sev])}
              || Sev <- [critical, warning, info]],
    [
        "<header>\n<h1>beamdiag <span class=\"node\">", cell_text(maps:get(node, C, <<"?">>), 200),
        "</span>", Partial, "</h1>\n<p class=\"meta\">OTP ", esc(maps:get(otp_release, S, <<"?">>)),
        " (", esc(maps:get(emu_flavor, S, <<"?">>)), ") &middot; ",
        fmt("~.1f", [float(maps:get(window_s, L, 0.0))]), " s window &middot; ",
        integer_to_list(Samples), " samples &middot; started ", esc(start_text(C)),
        "</p>\n<p class=\"summary\">",
        case F of
            [] -> "<span class=\"badge ok\">no findings</span>";
            _ -> [["<span class=\"badge ", atom_to_list(Sev), "\">", integer_to_list(N), " ",
                   atom_to_list(Sev), "</span> "] || {Sev, N} <- Counts, N > 0]
        end,
        cpus_line(L),
        "</p>\n</header>\n"
    ].

cpus_line(#{totals := #{cpus_used := U, cpus_available := A}}) when is_number(U), is_number(A) ->
    [" the node used <b>", fmt("~.2f", [float(U)]), "</b> of <b>", fmt("~.2f", [float(A)]),
     "</b> CPUs"];
cpus_line(_) ->
    "".

%%%===================================================================
%%% Internal: findings
%%%===================================================================

findings([]) ->
    "<p class=\"none\">No findings: no sign of busy-waiting, starvation, throttling, blocking "
    "or saturation in this window.</p>\n";
findings(Fs) ->
    [finding(F) || F <- Fs].

finding(F) ->
    Sev = maps:get(severity, F, info),
    [
        "<article class=\"finding ", esc(Sev), "\">\n<h3><span class=\"badge ", esc(Sev), "\">",
        esc(Sev), "</span> ", esc(maps:get(title, F, <<>>)), " <code>", esc(maps:get(id, F, <<>>)),
        "</code></h3>\n",
        "<ul class=\"evidence\">", [["<li>", cell_text(E, 1000), "</li>"] || E <- list(maps:get(evidence, F, []))],
        "</ul>\n",
        "<p class=\"fix\"><b>Fix:</b> ", esc(maps:get(fix, F, <<>>)), "</p>\n",
        case maps:get(when_not, F, <<>>) of
            <<>> -> "";
            W -> ["<p class=\"whennot\"><b>When not:</b> ", esc(W), "</p>\n"]
        end,
        case maps:get(metrics, F, #{}) of
            M when is_map(M), map_size(M) > 0 ->
                ["<details><summary>metrics</summary>", value(M, 1), "</details>\n"];
            _ -> ""
        end,
        "</article>\n"
    ].

%%%===================================================================
%%% Internal: ledger sections
%%%===================================================================

ledger_section(#{threads := []}) ->
    "<p class=\"none\">No per-thread figures in this capture (see the notes).</p>\n";
ledger_section(#{by_type := ByType}) ->
    [
        "<p class=\"help\">Where each thread type's wall time went, tick by tick, as a share of "
        "the type's thread-seconds: <b>running</b> (on CPU doing work), <b>spinning</b> (on CPU "
        "but not busy: busy-waiting), <b>blocked</b> (busy by the BEAM's account but neither "
        "running nor runnable: locks, page faults, blocking calls), <b>runnable-waiting</b> "
        "(ready, waiting for a CPU) and <b>idle</b>.</p>\n",
        legend(),
        "<div class=\"charts\" id=\"ledger-charts\"></div>\n",
        "<h3>Over the whole window</h3>\n",
        "<table class=\"num\"><thead><tr><th>type</th><th>threads</th>", state_heads(),
        "<th>user</th><th>sys</th><th>busy (BEAM)</th><th>share of wall</th></tr></thead><tbody>\n",
        [type_row(T, maps:get(T, ByType)) || T <- beamdiag_threads:types(), maps:is_key(T, ByType)],
        "</tbody></table>\n"
    ].

legend() ->
    ["<div class=\"legend\">",
     [["<span><i class=\"sw ", atom_to_list(K), "\"></i>", beamdiag_ledger:state_name(K), "</span>"] || K <- beamdiag_ledger:states()],
     "</div>\n"].

state_heads() ->
    [["<th>", beamdiag_ledger:state_name(S), "</th>"] || S <- beamdiag_ledger:states()].

type_row(Type, Row) ->
    Parts = beamdiag_ledger:state_shares(Row),
    W = num(maps:get(wall, Row, 0)),
    Sh = fun(K) -> case maps:get(K, Row, undefined) of
                       V when is_number(V), W > 0 -> beamdiag_units:pct(V / W, "&ndash;");
                       _ -> "&ndash;"
                   end
         end,
    ["<tr><th>", esc(Type), "</th><td>", integer_to_list(maps:get(n, Row, 0)), "</td>",
     [["<td>", beamdiag_units:pct(maps:get(K, Parts), "&ndash;"), "</td>"] || K <- beamdiag_ledger:states()],
     "<td>", Sh(user), "</td><td>", Sh(sys), "</td><td>", Sh(busy), "</td>",
     "<td class=\"bar\">", bar(Parts), "</td></tr>\n"].

bar(Parts) ->
    ["<div class=\"hbar\">",
     [["<i class=\"", atom_to_list(K), "\" style=\"width:", fmt("~.2f", [100 * maps:get(K, Parts)]),
       "%\"></i>"] || K <- beamdiag_ledger:states(), maps:get(K, Parts) > 0.0005],
     "</div>"].

scheduler_section(#{threads := Threads}, #{outliers := Outliers}) when Threads =/= [] ->
    Sched = [T || T = #{type := Ty} <- Threads, beamdiag_threads:is_scheduler(Ty)],
    Shown = lists:sublist(Sched, max_rows()),
    [
        case Outliers of
            [] -> "<p class=\"help\">No scheduler thread stands out from its type.</p>\n";
            _ -> ["<p class=\"help\">The scheduler threads that stand out most from their type "
                  "(spinning, blocked, runnable-waiting or busy), tick by tick.</p>\n",
                  "<div class=\"charts\" id=\"outlier-charts\"></div>\n"]
        end,
        "<details", case length(Sched) =< 16 of true -> " open"; false -> "" end,
        "><summary>every scheduler thread (", integer_to_list(length(Sched)), ")</summary>\n",
        "<table class=\"num\"><thead><tr><th>thread</th><th>type</th><th>id</th>", state_heads(),
        "<th>share of wall</th></tr></thead><tbody>\n",
        [thread_row(T) || T <- Shown],
        "</tbody></table>\n",
        case length(Sched) > max_rows() of
            true -> ["<p class=\"help\">", integer_to_list(length(Sched) - max_rows()),
                     " more not shown.</p>"];
            false -> ""
        end,
        "</details>\n"
    ];
scheduler_section(_, _) ->
    "<p class=\"none\">No per-thread figures.</p>\n".

thread_row(T) ->
    P = beamdiag_ledger:state_shares(T),
    ["<tr><th>", cell_text(maps:get(name, T, <<>>), 40), "</th><td>", esc(maps:get(type, T, <<>>)),
     "</td><td>", esc(maps:get(scheduler_id, T, <<>>)), "</td>",
     [["<td>", beamdiag_units:pct(maps:get(K, P), "&ndash;"), "</td>"] || K <- beamdiag_ledger:states()],
     "<td class=\"bar\">", bar(P), "</td></tr>\n"].

cpu_section(#{threads := []}) ->
    "<p class=\"none\">No per-thread figures.</p>\n";
cpu_section(L) ->
    T = maps:get(totals, L, #{}),
    H = maps:get(host, L, #{}),
    [
        "<p class=\"help\">In CPUs, per tick: the CPU the node's threads got from the OS, the "
        "schedulers' busy time as the BEAM counts it (normal and dirty CPU schedulers), the host's "
        "busy CPUs, and the CPUs the node may use. OS CPU well above scheduler busy is spinning; "
        "scheduler busy well above OS CPU is blocking or CPU starvation.</p>\n",
        "<div class=\"charts\" id=\"cpu-charts\"></div>\n",
        "<p>Over the window: node ", fmt("~.2f", [num(maps:get(cpus_used, T, 0))]), " CPUs of ",
        fmt("~.2f", [num(maps:get(cpus_available, T, 0))]), " available",
        case H of
            #{ncpu := N, busy := B} -> [", host ", integer_to_list(N), " CPUs ", beamdiag_units:pct(B, "&ndash;"), " busy",
                                        ", steal ", beamdiag_units:pct(num(maps:get(steal, H, 0)), "&ndash;")];
            _ -> ""
        end,
        ".</p>\n"
    ].

msacc_section(L = #{msacc := #{by_type := ByType} = M}) when map_size(ByType) > 0 ->
    [
        "<p class=\"help\">Microstate accounting: each state's share of the wall time of "
        "each thread type (not CPU time: a thread that waits for a CPU stays in its state)",
        case maps:get(span_s, M, undefined) of
            S when is_number(S) -> io_lib:format(", over the last ~.1f s of the ~.1f s window.",
                                                 [float(S), float(maps:get(window_s, L, S))]);
            _ -> "."
        end,
        case maps:get(extra, M, false) of
            true -> " This emulator has the extra states.";
            _ -> " Default states only: busy-waiting and timers are inside <i>other</i>; BIFs, "
                 "ETS, NIFs and send inside <i>emulator</i>."
        end,
        "</p>\n<div class=\"charts\" id=\"msacc-charts\"></div>\n",
        "<details><summary>table</summary>", msacc_table(ByType), "</details>\n"
    ];
msacc_section(_) ->
    "<p class=\"none\">Microstate accounting was off for this capture.</p>\n".

msacc_table(ByType) ->
    States = lists:usort(lists:append([maps:keys(maps:get(shares, V, #{}))
                                       || V <- maps:values(ByType), is_map(V)])),
    ["<table class=\"num\"><thead><tr><th>type</th>", [["<th>", esc(S), "</th>"] || S <- States],
     "</tr></thead><tbody>",
     [["<tr><th>", esc(T), "</th>",
       [["<td>", beamdiag_units:pct(num(maps:get(S, maps:get(shares, V, #{}), 0)), "&ndash;"), "</td>"] || S <- States],
       "</tr>\n"] || {T, V} <- lists:sort(maps:to_list(ByType)), is_map(V)],
     "</tbody></table>"].

procs_section(#{procs := P}) when is_map(P) ->
    [{"processes", "Top processes",
      ["<pre>", esc(beamdiag_safe_text:terminal(beamdiag_format_procs:text(P))), "</pre>\n",
       value(maps:with([top_reductions, queues, heaps, heap_growth], P), 0)]}];
procs_section(_) ->
    [].

locks_section(#{locks := Locks}) ->
    [{"locks", "Locks", ["<p class=\"help\">Lock counting over the window.</p>\n",
                         value(Locks, 0)]}];
locks_section(_) ->
    [].

%% The flamegraph is drawn here, from the folded stacks the capture keeps.
profile_section(Node, #{profile := #{profile := Folded}}) when is_map(Folded) ->
    Bin = iolist_to_binary(beamdiag_format_flamegraph:svg(Folded, #{title => Node})),
    Height = case re:run(Bin, "<svg[^>]*\\sheight=\"([0-9]+)", [{capture, all_but_first, list}]) of
                 {match, [H]} -> min(4000, list_to_integer(H) + 20);
                 _ -> 600
             end,
    [{"profile", "Flamegraph",
      ["<p class=\"help\">Where the schedulers' CPU time went, by stack. Click a frame to zoom "
       "when the graph supports it.</p>\n",
       "<iframe class=\"flame\" sandbox=\"allow-scripts\" title=\"flamegraph\" style=\"height:",
       integer_to_list(Height), "px\" srcdoc=\"",
       esc(["<!DOCTYPE html><html><head><meta charset=\"utf-8\"><style>body{margin:0}"
            "svg{max-width:100%;height:auto}</style></head><body>", Bin, "</body></html>"]),
       "\"></iframe>\n"]}];
profile_section(_Node, #{profile := P}) ->
    [{"profile", "Profile", value(maps:without([svg], P), 0)}];
profile_section(_Node, _) ->
    [].

settings_section(C, L) ->
    S = maps:get(settings, C, #{}),
    Groups = [
        {"Schedulers", [schedulers, schedulers_online, dirty_cpu_schedulers,
                        dirty_cpu_schedulers_online, dirty_io_schedulers, bind_type,
                        thread_pool_size]},
        %% The emulator flags and their groups come from the flag table.
        {"Busy wait and wake-up", beamdiag_flags:group(scheduling)},
        {"Memory", beamdiag_flags:group(memory) ++ [eheap_alloc_instances]},
        {"Emulator", [otp_release, erts_version, emu_flavor, build_type, lock_counting] ++
                     beamdiag_flags:group(emulator) ++
                     [os, os_pid, logical_processors, logical_processors_available,
                      logical_processors_online, process_limit, atom_count, atom_limit]}
    ],
    Known = lists:append([Ks || {_, Ks} <- Groups]),
    Other = lists:sort(maps:keys(S) -- Known),
    [
        "<div class=\"grid\">",
        [["<div><h3>", Name, "</h3>", kv_table([{K, flag_value(K, maps:get(K, S))}
                                               || K <- Keys, maps:is_key(K, S)]),
          "</div>"] || {Name, Keys} <- Groups],
        case Other of
            [] -> "";
            _ -> ["<div><h3>Other</h3>", kv_table([{K, maps:get(K, S)} || K <- Other]), "</div>"]
        end,
        [["<div><h3>", Name, "</h3>", value(V, 1), "</div>"]
         || {Name, K} <- [{"Totals", totals}, {"Host", host}, {"cgroup", cgroup}, {"VM", vm}],
            V <- [maps:get(K, L, #{})], is_map(V), map_size(V) > 0],
        "</div>\n"
    ].

%% An emulator flag's value, and the documented default when the node's
%% differs from it.
flag_value(K, V) when is_binary(V) ->
    case [D || #{key := Key, default := D, read := true} <- beamdiag_flags:table(), Key =:= K,
               is_binary(D)] of
        [D] when D =/= V -> <<V/binary, " (default ", D/binary, ")">>;
        _ -> V
    end;
flag_value(_K, V) ->
    V.

notes_section(L, C) ->
    case maps:get(notes, L, []) ++ maps:get(notes, C, []) -- maps:get(notes, L, []) of
        [] -> "<p class=\"none\">None.</p>\n";
        Notes -> ["<ul>", [["<li>", esc(N), "</li>"] || N <- Notes], "</ul>\n"]
    end.

%%%===================================================================
%%% Internal: cluster
%%%===================================================================

cluster_rest(#{n := 0}) ->
    "<p class=\"none\">Every node that answered is an outlier.</p>\n";
cluster_rest(#{n := N, shared := #{by_finding := By, without_findings := None}, spread := Spread}) ->
    ["<p>", integer_to_list(N), " nodes.</p>\n",
     "<table class=\"num\"><thead><tr><th>finding</th><th>nodes</th></tr></thead><tbody>\n",
     [["<tr><td class=\"t\"><span class=\"badge ", esc(S), "\">", esc(S), "</span> <code>",
       esc(Id), "</code></td><td>", integer_to_list(K), "</td></tr>\n"]
      || #{id := Id, severity := S, nodes := K} <- By],
     "<tr><td class=\"t\">no finding</td><td>", integer_to_list(None), "</td></tr>\n",
     "</tbody></table>\n",
     "<table class=\"num\"><thead><tr><th>figure</th><th>min</th><th>p10</th><th>p50</th>"
     "<th>p90</th><th>max</th></tr></thead><tbody>\n",
     [["<tr><td class=\"t\">", esc(K), "</td>",
       [["<td>", cluster_value(K, maps:get(P, maps:get(K, Spread))), "</td>"]
        || P <- [min, p10, p50, p90, max]], "</tr>\n"]
      || K <- beamdiag_outliers:figures()],
     "</tbody></table>\n"];
cluster_rest(_) ->
    "".

cluster_value(cpus_used, V) -> fmt("~.2f", [float(V)]);
cluster_value(reductions_per_s, V) when V >= 1.0e6 -> fmt("~.1fM", [V / 1.0e6]);
cluster_value(reductions_per_s, V) when V >= 1.0e3 -> fmt("~.1fk", [V / 1.0e3]);
cluster_value(reductions_per_s, V) -> integer_to_list(round(V));
cluster_value(_, V) -> beamdiag_units:pct(V).

%%%===================================================================
%%% Internal: small helpers
%%%===================================================================

%% Escaping and bounded text have one home (beamdiag_html_text).
esc(X) -> beamdiag_html_text:escape(X).

cell_text(T, Max) -> beamdiag_html_text:bounded(T, Max).

value(Term, Depth) -> beamdiag_html_table:render(Term, Depth).

kv_table(Pairs) -> beamdiag_html_table:kv_table(Pairs).

max_rows() -> beamdiag_html_table:max_rows().

list(L) when is_list(L) -> L;
list(X) -> [X].

num(X) when is_number(X) -> float(X);
num(_) -> 0.0.

fmt(F, A) -> lists:flatten(io_lib:format(F, A)).

start_text(#{wall_start_ms := Ms}) when is_integer(Ms) ->
    calendar:system_time_to_rfc3339(Ms, [{unit, millisecond}, {offset, "Z"}]);
start_text(_) -> "?".

now_text() ->
    calendar:system_time_to_rfc3339(erlang:system_time(second), [{offset, "Z"}]).

%% This host saturated while members on it did not answer (see
%% beamdiag_cluster_analysis:saturated_host/3): said once, above the table.
saturated_host(null) ->
    "";
saturated_host(#{members := M, ncpu := N, busy := B, cpus := Cpus}) ->
    ["<p class=\"warning\"><strong>This host was saturated:</strong> ", integer_to_list(M),
     " members on it did not answer in time while its ", integer_to_list(N), " CPUs were ",
     esc(beamdiag_units:pct(B)), " busy (", esc(io_lib:format("~.2f", [float(Cpus)])),
     " CPUs). What the table says of them is this host's doing.</p>\n"].
