%%% @doc The data the HTML report's charts draw: the report embeds it as
%%% one JSON document and its script (priv/report.js) draws the charts as
%%% SVG from it. Plain terms, built from the capture and its ledger, or
%%% from a cluster report; shares are rounded to four decimals, times and
%%% CPUs to three, to keep the page small.
%%%
%%% For a diagnosis: the ledger's states, each thread type's state shares
%%% tick by tick, the scheduler threads that stand out most from their type
%%% (at most 4) tick by tick, CPUs per tick (the node's, its schedulers'
%%% busy time, the host's, the CPUs available) and the microstate shares.
%%% For a cluster: each figure's values across the nodes, sorted, with its
%%% median and the nodes that are outliers on it.
%%%
%%% ```
%%% 1> {ok, D} = beamdiag:diagnose(#{duration => 5}).
%%% 2> #{capture := C, ledger := L} = D.
%%% 3> maps:keys(beamdiag_html_chart_data:diagnosis(C, L)).
%%% [cpu,kind,ledger,msacc,outlier_t,outliers,states,t]
%%% '''
-module(beamdiag_html_chart_data).

-export([diagnosis/2, cluster/1]).

%% The scheduler threads charted tick by tick.
-define(OUTLIERS, 4).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The charts' data for a diagnosis, from its capture and ledger:
%% `kind' is `diagnosis'; `t' the end of each tick in seconds; `ledger'
%% a series per thread type shown (the schedulers, and each other type that
%% was on CPU), each point the ledger's state shares in `states' order;
%% `outliers' and `outlier_t' the outlier threads' points and their ticks;
%% `cpu' and `msacc' the figures for those charts.
-spec diagnosis(beamdiag_capture:capture(), beamdiag_ledger:ledger()) -> map().
diagnosis(C, L) ->
    Series = maps:get(series, L, []),
    Types = [T || T <- beamdiag_threads:types(), shown_type(T, Series)],
    Ends = ends(Series),
    Outliers = beamdiag_ledger:outliers(L, ?OUTLIERS),
    Ticks = beamdiag_ledger:ticks(C, [Tid || #{tid := Tid} <- Outliers]),
    #{
        kind => diagnosis,
        states => [[S, beamdiag_ledger:state_name(S)] || S <- beamdiag_ledger:states()],
        t => Ends,
        ledger => [#{type => T, n => type_n(T, Series),
                     points => [point(maps:get(T, maps:get(by_type, S), #{})) || S <- Series]}
                   || T <- Types],
        outliers => [#{name => Name, type => Ty,
                       points => [point(thread_in(Tid, Tick)) || Tick <- Ticks]}
                     || #{tid := Tid, name := Name, type := Ty} <- Outliers],
        outlier_t => ends(Ticks),
        cpu => cpu_data(Series, Ticks, L),
        msacc => msacc_data(maps:get(msacc, L, #{}))
    }.

%% @doc The charts' data for a cluster report (see `beamdiag_cluster'):
%% `kind' is `cluster'; `figures' one series per figure, every node's
%% value, largest first, the median and which nodes are outliers on it.
-spec cluster(beamdiag_cluster_analysis:cluster()) -> map().
cluster(#{nodes := Nodes, outliers := Out, spread := Spread}) ->
    #{kind => cluster,
      figures => [#{key => K, unit => cluster_unit(K), median => maps:get(p50, maps:get(K, Spread)),
                    outliers => [N || #{node := N, figures := Fs} <- Out,
                                      lists:any(fun(#{figure := F}) -> F =:= K end, Fs)],
                    values => [[N, V] || {V, N} <- lists:reverse(lists:sort(
                                                      [{float(maps:get(K, R)), N}
                                                       || R = #{node := N} <- Nodes]))]}
                  || K <- beamdiag_outliers:figures()]}.

%%%===================================================================
%%% Internal
%%%===================================================================

ends(Series) ->
    {_, Rev} = lists:foldl(fun(#{t := T}, {Acc, R}) -> {Acc + T, [Acc + T | R]} end, {0.0, []},
                           Series),
    [round3(X) || X <- lists:reverse(Rev)].

shown_type(T, Series) ->
    Rows = [R || #{by_type := B} <- Series, R <- [maps:get(T, B, undefined)], is_map(R)],
    Rows =/= [] andalso
        (beamdiag_threads:is_scheduler(T) orelse
         lists:any(fun(R) -> num(maps:get(on_cpu, R, 0)) > 0.001 end, Rows)).

type_n(T, [#{by_type := B} | _]) -> maps:get(n, maps:get(T, B, #{}), 0);
type_n(_, []) -> 0.

point(Row) ->
    P = beamdiag_ledger:state_shares(Row),
    [round4(maps:get(K, P)) || K <- beamdiag_ledger:states()].

thread_in(Tid, #{threads := Threads}) ->
    case [T || T = #{tid := X} <- Threads, X =:= Tid] of
        [T | _] -> T;
        [] -> #{}
    end.

cpu_data(Series, Ticks, L) ->
    Sum = fun(B, Types, K) ->
              lists:sum([num(maps:get(K, maps:get(T, B, #{}), 0)) || T <- Types])
          end,
    All = beamdiag_threads:types(),
    HostBusy = case length(Ticks) =:= length(Series) of
                   true -> [case H of
                                #{busy := Bu, ncpu := N} -> round3(Bu * N);
                                _ -> null
                            end || #{host := H} <- Ticks];
                   false -> []
               end,
    #{
        node_cpus => [round3(Sum(B, All, on_cpu) / max(1.0e-9, T)) || #{by_type := B, t := T} <- Series],
        sched_busy => [round3(Sum(B, [scheduler, dirty_cpu], busy) / max(1.0e-9, T))
                       || #{by_type := B, t := T} <- Series],
        host_busy => HostBusy,
        available => num(maps:get(cpus_available, maps:get(totals, L, #{}), 0))
    }.

msacc_data(#{by_type := ByType}) ->
    Order = [scheduler, dirty_cpu, dirty_io, aux, poll, async],
    Types = [T || T <- Order, maps:is_key(T, ByType)] ++
            lists:sort([T || T <- maps:keys(ByType), not lists:member(T, Order)]),
    [#{type => T, n => maps:get(n, V, 0),
       shares => maps:map(fun(_, X) -> round4(num(X)) end, maps:get(shares, V, #{}))}
     || T <- Types, V <- [maps:get(T, ByType)], is_map(V)];
msacc_data(_) ->
    [].

cluster_unit(cpus_used) -> <<"CPUs">>;
cluster_unit(reductions_per_s) -> <<"reductions/s">>;
cluster_unit(_) -> <<"share of scheduler wall time">>.

num(X) when is_number(X) -> float(X);
num(_) -> 0.0.

round3(X) -> round(X * 1000) / 1000.
round4(X) -> round(X * 10000) / 10000.
