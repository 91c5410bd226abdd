%%% @doc Diagnoses every node of a cluster at once and points at the odd
%%% one out.
%%%
%%% From one node the cluster's members are read over distribution
%%% (`erlang:nodes()' on that node, plus the node itself; hidden nodes are
%%% not members). Each member is diagnosed in a process of its own, all over
%%% the same window, with `beamdiag:diagnose/2'. The report is a summary row
%%% per node, each node's findings, and the outliers: for every ledger
%%% figure, each node's robust z-score against the cluster, `(x - median) /
%%% (1.4826 * MAD)', where the MAD (median absolute deviation) has a floor
%%% (5 points of a share, 0.1 CPUs, half the median rate) so that a
%%% cluster of near-identical nodes does not turn measurement jitter into an
%%% outlier. |z| >= 3.5 (Iglewicz and Hoaglin's cut-off) marks an outlier;
%%% it takes at least three answering nodes.
%%%
%%% ```
%%% 1> {ok, C} = beamdiag_cluster:diagnose("app@host1", #{duration => 5}).
%%% 2> [N || #{node := N} <- maps:get(outliers, C)].
%%% [<<"app@host3">>]
%%% 3> io:put_chars(beamdiag_cluster:text(C)).
%%% '''
-module(beamdiag_cluster).

-export([diagnose/2, summary_row/1, outliers/1, text/1, document/1, format_error/1]).

-export_type([cluster/0]).

-type cluster() :: #{
    schema := binary(),
    seed := binary(),
    members := [binary()],
    nodes := [map()],
    outliers := [map()],
    errors := [map()],
    diagnoses := #{binary() => beamdiag:diagnosis()}
}.

-define(SCHEMA, <<"beamdiag.cluster/1">>).
-define(DEFAULTS, #{max_nodes => 64}).
-define(CALL_TIMEOUT, 5000).
-define(Z_CUT, 3.5).
%% Figures per node: key, floor of the deviation scale.
-define(FIGURES, [
    {cpus_used, {abs, 0.1}},
    {busy, {abs, 0.05}},
    {on_cpu, {abs, 0.05}},
    {spin, {abs, 0.05}},
    {runq, {abs, 0.05}},
    {sys, {abs, 0.05}},
    {blocked, {abs, 0.05}},
    {reductions_per_s, {rel, 0.50}}
]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Diagnoses NODE and every node connected to it. Options: those of
%% `beamdiag:diagnose/2' (without `progress') and `max_nodes' (64; more
%% members is an error rather than a storm of connections).
-spec diagnose(node() | string() | binary(), map()) ->
    {ok, cluster()} | {error, {module(), term()}}.
diagnose(Node, Opts) when is_atom(Node) ->
    diagnose(atom_to_list(Node), Opts);
diagnose(NodeStr, Opts) when is_map(Opts) ->
    #{max_nodes := Max} = maps:merge(?DEFAULTS, maps:with([max_nodes], Opts)),
    DiagOpts = beamdiag:options(maps:without([max_nodes], Opts)),
    case beamdiag_remote:connect(NodeStr, maps:with([cookie, cookie_file], DiagOpts)) of
        {ok, Seed} ->
            case members(Seed) of
                {ok, Members} when length(Members) > Max ->
                    {error, {beamdiag_cluster, {too_many_nodes, length(Members), Max}}};
                {ok, Members} ->
                    Results = run_all(Members, maps:remove(progress, DiagOpts)),
                    {ok, build(Seed, Members, Results)};
                {error, _} = E ->
                    E
            end;
        {error, _} = E ->
            E
    end.

%% @doc The summary figures of one diagnosis: the node's CPUs, the normal
%% schedulers' shares of wall time, reductions per second, findings.
-spec summary_row(beamdiag:diagnosis()) -> map().
summary_row(#{capture := C, ledger := L, findings := F}) ->
    Sched = maps:get(scheduler, maps:get(by_type, L, #{}), #{}),
    Wall = maps:get(wall, Sched, 0.0),
    Share = fun(K) -> beamdiag_ledger:share(K, Sched, Wall) end,
    #{
        node => maps:get(node, C),
        window_s => maps:get(window_s, L, 0.0),
        cpus_used => maps:get(cpus_used, maps:get(totals, L, #{}), 0.0),
        busy => Share(busy),
        on_cpu => Share(on_cpu),
        spin => Share(spin),
        runq => Share(runq),
        sys => Share(sys),
        blocked => Share(blocked),
        reductions_per_s => maps:get(reductions_per_s, maps:get(vm, L, #{}), 0.0),
        findings => [#{id => Id, severity => S} || #{id := Id, severity := S} <- F],
        top_process => top_process(maps:get(extras, C, #{}))
    }.

%% @doc The outliers among summary rows: per node, the figures whose robust
%% z-score reaches the cut-off, and the findings no other node has.
-spec outliers([map()]) -> [map()].
outliers(Rows) when length(Rows) < 3 ->
    [];
outliers(Rows) ->
    Stats = [{K, robust(K, Floor, Rows)} || {K, Floor} <- ?FIGURES],
    Counts = lists:foldl(
        fun(#{findings := Fs}, Acc) ->
            lists:foldl(fun(Id, A) -> A#{Id => maps:get(Id, A, 0) + 1} end,
                        Acc, lists:usort([I || #{id := I} <- Fs]))
        end, #{}, Rows),
    Half = length(Rows) / 2,
    lists:filtermap(
        fun(Row = #{node := N, findings := Fs}) ->
            Figs = [#{figure => K, value => V, median => Med, z => Z}
                    || {K, {Med, Scale}} <- Stats, V <- [maps:get(K, Row)],
                       Z <- [(V - Med) / Scale], abs(Z) >= ?Z_CUT],
            Own = lists:usort([Id || #{id := Id} <- Fs, maps:get(Id, Counts) < Half]),
            case Figs of
                [] -> false;
                _ -> {true, #{node => N, figures => Figs, own_findings => Own,
                              score => lists:max([abs(Z) || #{z := Z} <- Figs])}}
            end
        end,
        Rows).

%% @doc The cluster report as text.
-spec text(cluster()) -> iolist().
text(#{seed := Seed, members := Ms, nodes := Nodes, outliers := Out, errors := Errs}) ->
    [
        io_lib:format("beamdiag cluster: ~b nodes reached from ~ts, ~b answered~n~n",
                      [length(Ms), safe(Seed), length(Nodes)]),
        io_lib:format("~-30s ~5s ~6s ~6s ~6s ~6s ~6s ~7s  ~s~n",
                      ["node", "cpus", "busy", "on-cpu", "spin", "runq", "sys", "red/s",
                       "findings"]),
        [io_lib:format("~-30ts ~5.2f ~6s ~6s ~6s ~6s ~6s ~7s  ~ts~n",
                       [safe(N), float(Cpus), pct(B), pct(O), pct(S), pct(R), pct(Sy), rate(Red),
                        short_findings(Fs)])
         || #{node := N, cpus_used := Cpus, busy := B, on_cpu := O, spin := S, runq := R,
              sys := Sy, reductions_per_s := Red, findings := Fs} <- Nodes],
        "\nOUTLIERS (robust z-score against the cluster's median, |z| >= 3.5)\n",
        case Out of
            [] when length(Nodes) < 3 -> "  need at least three answering nodes\n";
            [] -> "  none: the nodes' ledgers agree\n";
            _ -> [outlier_line(O) || O <- Out]
        end,
        "\nTOP PROCESS PER NODE (share of the node's reductions; largest mailbox)\n",
        [io_lib:format("  ~-30ts ~ts~n", [safe(N), top_process_text(maps:get(top_process, Row, null))])
         || Row = #{node := N} <- Nodes],
        "\nFINDINGS PER NODE\n",
        [case Fs of
             [] -> io_lib:format("  ~ts: none~n", [safe(N)]);
             _ -> io_lib:format("  ~ts: ~ts~n", [safe(N), long_findings(Fs)])
         end || #{node := N, findings := Fs} <- Nodes],
        case Errs of
            [] -> "";
            _ -> ["\nNOT DIAGNOSED\n",
                  [io_lib:format("  ~ts: ~ts~n", [safe(N), M])
                   || #{node := N, message := M} <- Errs]]
        end
    ].

%% @doc The cluster report as the map its JSON encodes: the summary rows,
%% outliers and errors, and each node's findings in full.
-spec document(cluster()) -> map().
document(C) ->
    Diags = maps:get(diagnoses, C, #{}),
    (maps:remove(diagnoses, C))#{
        findings => maps:map(fun(_, #{findings := Fs}) ->
                                     [maps:with([id, severity, title, evidence, metrics, fix], F)
                                      || F <- Fs]
                             end, Diags)
    }.

%% @doc Turns an error reason of this module into a sentence.
-spec format_error(term()) -> iolist().
format_error({members, Node, Why}) ->
    io_lib:format("cannot list the nodes connected to ~ts: ~0tp", [safe(Node), Why]);
format_error({too_many_nodes, N, Max}) ->
    io_lib:format("the cluster has ~b nodes; at most ~b are diagnosed at once", [N, Max]);
format_error(timeout) ->
    "the node's diagnosis did not finish in time".

%%%===================================================================
%%% Internal
%%%===================================================================

members(Seed) ->
    try erpc:call(Seed, erlang, nodes, [], ?CALL_TIMEOUT) of
        Nodes when is_list(Nodes) -> {ok, lists:usort([Seed | Nodes])}
    catch
        Class:Reason -> {error, {beamdiag_cluster, {members, Seed, {Class, Reason}}}}
    end.

run_all(Members, Opts) ->
    Self = self(),
    Timeout = round(maps:get(duration, Opts) * 1000) + 30000,
    Procs = [{spawn_monitor(fun() -> Self ! {self(), beamdiag:diagnose(M, Opts)} end), M}
             || M <- Members],
    Deadline = erlang:monotonic_time(millisecond) + Timeout,
    [collect(Pid, MRef, M, Deadline) || {{Pid, MRef}, M} <- Procs].

collect(Pid, MRef, M, Deadline) ->
    Wait = max(0, Deadline - erlang:monotonic_time(millisecond)),
    receive
        {Pid, Result} ->
            erlang:demonitor(MRef, [flush]),
            {M, Result};
        {'DOWN', MRef, process, Pid, Why} ->
            {M, {error, {beamdiag_cluster, {crashed, Why}}}}
    after Wait ->
        exit(Pid, kill),
        erlang:demonitor(MRef, [flush]),
        {M, {error, {beamdiag_cluster, timeout}}}
    end.

build(Seed, Members, Results) ->
    Ok = [{M, D} || {M, {ok, D}} <- Results],
    Rows = [summary_row(D) || {_, D} <- Ok],
    Errors = [#{node => atom_to_binary(M), message => iolist_to_binary(message(E))}
              || {M, {error, E}} <- Results],
    #{
        schema => ?SCHEMA,
        seed => atom_to_binary(Seed),
        members => [atom_to_binary(M) || M <- Members],
        nodes => Rows,
        outliers => lists:sort(fun(#{score := A}, #{score := B}) -> A >= B end, outliers(Rows)),
        errors => Errors,
        diagnoses => maps:from_list([{atom_to_binary(M), D} || {M, D} <- Ok])
    }.

message({beamdiag, {partial, Why, _}}) ->
    beamdiag:format_error({partial, Why, undefined});
message({M, R}) when is_atom(M) ->
    try M:format_error(R)
    catch _:_ -> io_lib:format("~p", [R])
    end.

%% Median and deviation scale of one figure over the rows.
robust(K, Floor, Rows) ->
    Vs = [maps:get(K, R) || R <- Rows],
    Med = median(Vs),
    Mad = median([abs(V - Med) || V <- Vs]),
    Min = case Floor of
              {abs, F} -> F;
              {rel, F} -> max(F * abs(Med), 1.0)
          end,
    {Med, max(1.4826 * Mad, Min)}.

median(Vs) ->
    S = lists:sort(Vs),
    N = length(S),
    case N rem 2 of
        1 -> lists:nth(N div 2 + 1, S);
        0 -> (lists:nth(N div 2, S) + lists:nth(N div 2 + 1, S)) / 2
    end.

outlier_line(#{node := N, figures := Figs, own_findings := Own}) ->
    [io_lib:format("  ~ts~n", [safe(N)]),
     [io_lib:format("    ~-18s ~11s   cluster median ~11s   z ~s~.1f~n",
                    [atom_to_list(K), fig(K, V), fig(K, Med), sign(Z), abs(float(Z))])
      || #{figure := K, value := V, median := Med, z := Z} <- Figs],
     case Own of
         [] -> "";
         _ -> io_lib:format("    findings no other node has: ~ts~n",
                            [lists:join(", ", [safe(I) || I <- Own])])
     end].

fig(cpus_used, V) -> io_lib:format("~.2f CPUs", [float(V)]);
fig(reductions_per_s, V) -> [rate(V), "/s"];
fig(_, V) -> pct(V).

sign(Z) when Z < 0 -> "-";
sign(_) -> "+".

%% The process with the largest share of a node's reductions, and the
%% longest mailbox at the end, from the process walks.
top_process(#{procs := P = #{top_reductions := Top}}) ->
    Total = maps:get(reductions, P, 0),
    Reds = case Top of
               [E | _] when Total > 0 ->
                   #{process => proc_key(E), share => maps:get(reductions, E) / Total};
               _ -> null
           end,
    Queue = case maps:get(queues, P, []) of
                [Q = #{queue := [_, QEnd]} | _] -> #{process => proc_key(Q), queue => QEnd};
                _ -> null
            end,
    #{reductions => Reds, mailbox => Queue};
top_process(_) ->
    null.

proc_key(#{name := N}) when is_binary(N) -> N;
proc_key(#{pid := P}) -> P.

top_process_text(#{reductions := R, mailbox := Q}) ->
    [case R of
         #{process := P, share := S} -> [safe(P), " ", pct(S)];
         null -> "-"
     end,
     case Q of
         #{process := QP, queue := Len} -> io_lib:format("; mailbox ~ts ~b", [safe(QP), Len]);
         null -> ""
     end];
top_process_text(_) ->
    "no process data".

short_findings([]) -> "-";
short_findings(Fs) -> lists:join(",", [safe(Id) || #{id := Id} <- Fs]).

long_findings(Fs) ->
    lists:join(", ", [["[", string:uppercase(safe(S)), "] ", safe(Id)]
                      || #{id := Id, severity := S} <- Fs]).

pct(X) -> io_lib:format("~.1f%", [100 * X]).

rate(V) when V >= 1.0e6 -> io_lib:format("~.1fM", [V / 1.0e6]);
rate(V) when V >= 1.0e3 -> io_lib:format("~.1fk", [V / 1.0e3]);
rate(V) -> integer_to_list(round(V)).

safe(B) -> beamdiag_text:safe(B, 120).
