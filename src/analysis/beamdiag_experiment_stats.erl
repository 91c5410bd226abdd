%%% @doc The statistics of an experiment's runs (pure): per arm the mean
%%% and standard deviation of each figure, and each arm against the first
%%% with a bootstrap interval of the relative change and a verdict.
%%%
%%% ```
%%% 1> #{arms := A, versus := V} = beamdiag_experiment_stats:summarise(Result).
%%% '''
-module(beamdiag_experiment_stats).

-export([metrics/0, summarise/1]).

-export_type([result/0, summary/0, versus/0]).

%% An experiment's result, as beamdiag_experiment:run/1 gives it.
-type result() :: #{kind := experiment, _ => _}.

%% summarise/1: each arm's mean and standard deviation per metric, and
%% each arm after the first against it.
-type summary() :: #{
    arms := [#{index := term(), stats := #{atom() => #{mean := float(), sd := float()}}}],
    versus := [#{index := term(), against := term(), metrics := [versus()]}]
}.
%% One metric of an arm against the first: the relative change's estimate
%% and bootstrap interval (`null' and `undefined' with no pairs).
-type versus() :: #{
    key := atom(),
    better := higher | lower | neutral,
    estimate := float() | null,
    ci := {float(), float()} | undefined,
    verdict := better | worse | higher | lower | no_difference | no_data,
    pairs := non_neg_integer()
}.

%% Metrics: key, label, which way is better.
-define(METRICS, [
    {throughput, "throughput (units/s)", higher},
    {cpu_us_per_unit, "OS CPU per unit (us)", lower},
    {cpus_used, "node CPUs used", lower},
    {sched_util, "scheduler utilization", neutral},
    {p50_us, "latency p50 (us)", lower},
    {p99_us, "latency p99 (us)", lower},
    {p999_us, "latency p99.9 (us)", lower}
]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The figures of a run an experiment compares: key, label, and which
%% way is better (`neutral': neither).
-spec metrics() -> [{atom(), string(), higher | lower | neutral}].
metrics() ->
    ?METRICS.

%% @doc Each arm against the first: means and standard deviations per arm,
%% and per metric the relative change with its bootstrap interval and
%% verdict.
%% (R: an experiment's result, result(): its arms, runs
%% and settings.)
-spec summarise(result()) -> summary().
summarise(#{arms := Arms, runs := Runs} = R) ->
    Iters = maps:get(bootstrap, maps:get(settings, R, #{}), 2000),
    ByArm = maps:groups_from_list(fun(#{arm := A}) -> A end, Runs),
    Stats = fun(Idx) ->
                Rs = maps:get(Idx, ByArm, []),
                maps:from_list([{K, #{mean => beamdiag_stats:mean(vals(K, Rs)),
                                      sd => math:sqrt(beamdiag_stats:variance(vals(K, Rs)))}}
                                || {K, _, _} <- ?METRICS])
            end,
    [#{index := Base} | Others] = Arms,
    BaseRuns = maps:get(Base, ByArm, []),
    #{
        arms => [#{index => I, stats => Stats(I)} || #{index := I} <- Arms],
        versus => [#{index => I, against => Base,
                     metrics => [versus(K, Dir, BaseRuns, maps:get(I, ByArm, []), Iters)
                                 || {K, _, Dir} <- ?METRICS]}
                   || #{index := I} <- Others]
    }.

%%%===================================================================
%%% Internal
%%%===================================================================

vals(K, Runs) -> [V || #{K := V} <- Runs, is_number(V)].

versus(K, Dir, BaseRuns, Runs, Iters) ->
    Pairs = [{maps:get(K, A), maps:get(K, B)}
             || {A, B} <- lists:zip(lists:sublist(sort_runs(BaseRuns), length(Runs)),
                                    lists:sublist(sort_runs(Runs), length(BaseRuns))),
                is_number(maps:get(K, A)), is_number(maps:get(K, B))],
    case beamdiag_stats:bootstrap_ratio(Pairs, Iters, {17, 42, 4711}) of
        undefined ->
            #{key => K, better => Dir, estimate => null, ci => undefined,
              verdict => no_data, pairs => 0};
        #{estimate := Est, ci := {Lo, Hi} = CI} ->
            Verdict = verdict_of(Dir, Lo, Hi),
            #{key => K, better => Dir, estimate => Est, ci => CI, verdict => Verdict,
              pairs => length(Pairs)}
    end.

verdict_of(higher, Lo, _) when Lo > 0 -> better;
verdict_of(higher, _, Hi) when Hi < 0 -> worse;
verdict_of(lower, Lo, _) when Lo > 0 -> worse;
verdict_of(lower, _, Hi) when Hi < 0 -> better;
verdict_of(neutral, Lo, _) when Lo > 0 -> higher;
verdict_of(neutral, _, Hi) when Hi < 0 -> lower;
verdict_of(_, _, _) -> no_difference.

sort_runs(Runs) -> lists:sort(fun(#{run := A}, #{run := B}) -> A =< B end, Runs).
