%%% @doc What stands out, in one place: the scheduler threads of one node
%%% that differ most from their type's mean (the ledger keeps them, ranked,
%%% and the text, watch and HTML reports show as many as each fits), and the nodes of a cluster whose figures lie far
%%% from the cluster's median (the cluster report). Pure.
%%%
%%% Threads: each scheduler thread's shares of wall time (run, spin,
%%% blocked, runq) against the mean of the threads of its type; the score
%%% is the largest absolute difference, and a thread whose score is at most
%%% 5 points of wall time does not stand out.
%%%
%%% Nodes: for each figure, the cluster's median, MAD (median absolute
%%% deviation) and percentiles, and each node's robust z-score
%%% `(x - median) / max(1.4826 * MAD, floor)'. The floor (a share's 5
%%% points, 0.1 CPUs, half the median rate and at least 20k reductions per
%%% second) keeps a cluster of near-identical nodes from turning jitter into
%%% an outlier. z >= 3.5 (Iglewicz and Hoaglin's cut-off, on the high side
%%% only) marks an outlier; it takes at least three nodes. Only the high
%%% side: a node that burns more, waits more or spins more than the rest is
%%% what this tool explains, while one that does less is where the load is
%%% not (and on a shared host, a node that happened to wait less for a CPU
%%% than its neighbours).
%%%
%%% ```
%%% 1> beamdiag_outliers:threads(maps:get(threads, Ledger)).
%%% [#{name => <<"1_scheduler">>, ...}]
%%% 2> #{outliers := [#{node := N} | _]} = beamdiag_outliers:nodes(Rows).
%%% '''
-module(beamdiag_outliers).

-export([threads/1, nodes/1, figures/0, spread/1]).

-export_type([node_outlier/0, spread/0, figure_outlier/0]).

%% One figure of one node that lies far from the cluster's median.
-type figure_outlier() :: #{
    figure := atom(),
    value := number(),
    median := number(),
    mad := number(),
    p10 := number(),
    p90 := number(),
    z := float()
}.
-type node_outlier() :: #{
    node := binary(),
    figures := [figure_outlier()],
    own_findings := [atom()],
    score := float()
}.
%% The distribution of one figure over the nodes.
-type spread() :: #{
    n := non_neg_integer(),
    min := number(),
    p10 := number(),
    p50 := number(),
    p90 := number(),
    max := number(),
    mad := number()
}.

-define(THREAD_CUT, 0.05).
-define(Z_CUT, 3.5).
%% The figures of a cluster's summary row, each with the floor of its
%% deviation scale.
-define(FIGURES, [
    {cpus_used, {abs, 0.1}},
    {busy, {abs, 0.05}},
    {on_cpu, {abs, 0.05}},
    {spin, {abs, 0.05}},
    {runq, {abs, 0.05}},
    {sys, {abs, 0.05}},
    {blocked, {abs, 0.05}},
    {reductions_per_s, {rel, 0.50, 2.0e4}}
]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The scheduler threads (of a ledger's `threads') that differ most
%% from their type's mean on run, spin, blocked or runq, most different
%% first; none within 5 points of the mean.
-spec threads([beamdiag_ledger:row()]) -> [beamdiag_ledger:row()].
threads(Threads) ->
    Sched = [T || T = #{type := Ty} <- Threads, beamdiag_threads:is_scheduler(Ty),
                  is_number(maps:get(busy, T, undefined))],
    Means = maps:map(fun(_, Rows) -> mean_shares(Rows) end,
                     maps:groups_from_list(fun(#{type := Ty}) -> Ty end, Sched)),
    Scored = [{thread_score(beamdiag_ledger:state_shares(T), maps:get(Ty, Means)), T}
              || T = #{type := Ty} <- Sched],
    [T || {S, T} <- lists:reverse(lists:keysort(1, Scored)), S > ?THREAD_CUT].

%% @doc The cluster analysis of summary rows (maps with `node', the
%% figures of `figures/0' and `findings'): the distribution of every figure
%% and the outlier nodes, highest score (largest z) first, each with the
%% figures that stand out and the findings fewer than half the nodes share.
-spec nodes([beamdiag_cluster_analysis:summary_row()]) -> #{spread := #{atom() => spread()}, outliers := [node_outlier()]}.
nodes(Rows) ->
    Spread = maps:from_list([{K, spread([maps:get(K, R) || R <- Rows])} || K <- figures()]),
    #{spread => Spread, outliers => node_outliers(Rows, Spread)}.

%% @doc The figures the cluster analysis compares, in report order.
-spec figures() -> [atom()].
figures() ->
    [K || {K, _} <- ?FIGURES].

%% @doc The distribution of a list of numbers: min, p10, median, p90, max
%% and the MAD. An empty list gives zeros and n = 0.
-spec spread([number()]) -> spread().
spread([]) ->
    #{n => 0, min => 0.0, p10 => 0.0, p50 => 0.0, p90 => 0.0, max => 0.0, mad => 0.0};
spread(Vs) ->
    P = fun(Q) -> beamdiag_stats:percentile(Vs, Q) end,
    Med = P(50),
    #{n => length(Vs), min => lists:min(Vs), p10 => P(10), p50 => Med, p90 => P(90),
      max => lists:max(Vs), mad => beamdiag_stats:percentile([abs(V - Med) || V <- Vs], 50)}.

%%%===================================================================
%%% Internal
%%%===================================================================

mean_shares(Rows) ->
    Ps = [beamdiag_ledger:state_shares(R) || R <- Rows],
    maps:from_list([{K, lists:sum([maps:get(K, P) || P <- Ps]) / length(Ps)}
                    || K <- beamdiag_ledger:states()]).

thread_score(P, Mean) ->
    lists:max([abs(maps:get(K, P) - maps:get(K, Mean)) || K <- [run, spin, blocked, runq]]).

node_outliers(Rows, _Spread) when length(Rows) < 3 ->
    [];
node_outliers(Rows, Spread) ->
    Scales = [{K, maps:get(K, Spread), scale(Floor, maps:get(K, Spread))} || {K, Floor} <- ?FIGURES],
    Counts = lists:foldl(
        fun(#{findings := Fs}, Acc) ->
            lists:foldl(fun(Id, A) -> A#{Id => maps:get(Id, A, 0) + 1} end,
                        Acc, lists:usort([I || #{id := I} <- Fs]))
        end, #{}, Rows),
    Half = length(Rows) / 2,
    Out = lists:filtermap(
        fun(Row = #{node := N, findings := Fs}) ->
            Figs = [#{figure => K, value => V, median => Med, mad => Mad, p10 => P10, p90 => P90,
                      z => float(Z)}
                    || {K, #{p50 := Med, mad := Mad, p10 := P10, p90 := P90}, Scale} <- Scales,
                       V <- [maps:get(K, Row)], Z <- [(V - Med) / Scale], Z >= ?Z_CUT],
            Own = lists:usort([Id || #{id := Id} <- Fs, maps:get(Id, Counts) < Half]),
            case Figs of
                [] ->
                    false;
                _ ->
                    Sorted = lists:sort(fun(#{z := A}, #{z := B}) -> A >= B end, Figs),
                    {true, #{node => N, figures => Sorted, own_findings => Own,
                             score => maps:get(z, hd(Sorted))}}
            end
        end,
        Rows),
    lists:sort(fun(#{score := A}, #{score := B}) -> A >= B end, Out).

%% The deviation scale of a figure: the MAD made comparable to a standard
%% deviation, never below the figure's floor.
scale({abs, F}, #{mad := Mad}) ->
    max(1.4826 * Mad, F);
scale({rel, F, Least}, #{mad := Mad, p50 := Med}) ->
    max(1.4826 * Mad, max(F * abs(Med), Least)).
