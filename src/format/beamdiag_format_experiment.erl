%%% @doc Experiment results as text and as the map their JSON (and HTML)
%%% encodes: the arms, every run's figures, each arm's means and each arm
%%% against the first with its bootstrap interval and verdict. Pure. The
%%% workloads and flags come from the command line or a saved file (which
%%% `beamdiag report' reads): the text prints them through
%%% `beamdiag_safe_text', one line each.
%%%
%%% ```
%%% 1> {ok, R} = beamdiag_experiment:run(#{workloads => [{lab, busy_wait}], runs => 3}).
%%% 2> io:put_chars(beamdiag_format_experiment:text(R)).
%%% '''
-module(beamdiag_format_experiment).

-export([text/1, document/1]).

-export_type([document/0]).

%% What document/1 builds: the result's own keys it has (the session's
%% settings and arms, shown as they are), its runs without their
%% diagnoses, and the summary with each interval as a list (`null': none).
-type document() :: #{
    schema => binary(),
    started_ms => integer(),
    elapsed_s => number(),
    settings => term(),
    arms => term(),
    runs := [map()],
    summary := #{arms := list(),
                 versus := [#{metrics := [#{ci := [float()] | null, atom() => term()}],
                              atom() => term()}]}
}.

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The results as text: arms, per-run figures, each arm against the
%% first.
-spec text(beamdiag_experiment_stats:result()) -> iolist().
text(R = #{arms := Arms, runs := Runs, settings := S}) ->
    #{arms := ArmStats, versus := Versus} = maps:get(summary, R, beamdiag_experiment_stats:summarise(R)),
    Letter = fun(I) -> [$A + I - 1] end,
    [
        io_lib:format("beamdiag experiment: ~b arms x ~b runs (alternated), ~ts s windows "
                      "after ~ts s warm-up~n",
                      [length(Arms), maps:get(runs, S), num(maps:get(duration, S)),
                       num(maps:get(warmup, S))]),
        [io_lib:format("  ~s  ~ts, flags: ~ts, concurrency ~b~n",
                       [Letter(I), beamdiag_safe_text:safe(W), beamdiag_safe_text:safe(V), C])
         || #{index := I, workload := W, variant := V, concurrency := C} <- Arms],
        "\nRUNS (in the order they ran)\n",
        io_lib:format("  ~-4s ~3s ~10s ~9s ~6s ~6s ~9s ~9s ~9s~n",
                      ["arm", "run", "units/s", "cpu us/u", "cpus", "sched", "p50 us",
                       "p99 us", "p99.9 us"]),
        [io_lib:format("  ~-4s ~3b ~10s ~9s ~6s ~6s ~9s ~9s ~9s~n",
                       [Letter(A), N, num(T), num(Cu), num(Cpus), beamdiag_units:pct(Su), num(P50), num(P99),
                        num(P999)])
         || #{arm := A, run := N, throughput := T, cpu_us_per_unit := Cu, cpus_used := Cpus,
              sched_util := Su, p50_us := P50, p99_us := P99, p999_us := P999} <- Runs],
        "\nMEANS (sd over runs)\n",
        io_lib:format("  ~-24s~ts~n", ["", [io_lib:format("~20s", [Letter(I)])
                                             || #{index := I} <- ArmStats]]),
        [io_lib:format("  ~-24s~ts~n",
                       [Label, [io_lib:format("~20s", [mean_sd(maps:get(K, St))])
                                || #{stats := St} <- ArmStats]])
         || {K, Label, _} <- beamdiag_experiment_stats:metrics()],
        [[io_lib:format("~n~s vs ~s (paired bootstrap over runs, 95% CI of the relative change)~n",
                        [Letter(I), Letter(B)]),
          [io_lib:format("  ~-24s ~8s  ~-19s ~s~n",
                         [label(K), rel(Est), ci(CI), verdict(V)])
           || #{key := K, estimate := Est, ci := CI, verdict := V} <- Ms]]
         || #{index := I, against := B, metrics := Ms} <- Versus],
        "\n",
        [io_lib:format("~s vs ~s: ~ts~n", [Letter(I), Letter(B), plain(Ms)])
         || #{index := I, against := B, metrics := Ms} <- Versus]
    ].

%% @doc The results as the map their JSON encodes (without the raw
%% captures).
-spec document(beamdiag_experiment_stats:result()) -> document().
document(R = #{runs := Runs}) ->
    Doc = maps:with([schema, started_ms, elapsed_s, settings, arms], R),
    Summary = maps:get(summary, R, beamdiag_experiment_stats:summarise(R)),
    Doc#{
        runs => [maps:without([diagnosis], X) || X <- Runs],
        summary => Summary#{versus => [V#{metrics => [M#{ci => ci_list(maps:get(ci, M))}
                                                      || M <- Ms]}
                                       || V = #{metrics := Ms} <- maps:get(versus, Summary)]}
    }.

%%%===================================================================
%%% Internal
%%%===================================================================

mean_sd(#{mean := M, sd := Sd}) -> [num(M), " (", num(Sd), ")"].

label(K) -> element(2, lists:keyfind(K, 1, beamdiag_experiment_stats:metrics())).

verdict(better) -> "better";
verdict(worse) -> "worse";
verdict(higher) -> "higher (neither better nor worse)";
verdict(lower) -> "lower (neither better nor worse)";
verdict(no_difference) -> "no difference at this noise";
verdict(no_data) -> "no data".

plain(Ms) ->
    Say = fun(V) -> [label(K) || #{key := K, verdict := X} <- Ms, X =:= V] end,
    Parts = [[Word, ": ", lists:join(", ", Ks)]
             || {Word, Ks} <- [{"better", Say(better)}, {"worse", Say(worse)},
                               {"higher", Say(higher)}, {"lower", Say(lower)},
                               {"no difference at this noise", Say(no_difference)}],
                Ks =/= []],
    lists:join("; ", Parts).

rel(null) -> "-";
rel(X) -> [case X < 0 of true -> "-"; false -> "+" end, beamdiag_units:pct(abs(X))].

ci(undefined) -> "-";
ci({L, H}) -> ["[", rel(L), ", ", rel(H), "]"].

ci_list(undefined) -> null;
ci_list({L, H}) -> [L, H].


num(undefined) -> "-";
num(X) when is_integer(X) -> num(float(X));
num(X) when abs(X) >= 1.0e6 -> io_lib:format("~.2fM", [X / 1.0e6]);
num(X) when abs(X) >= 1.0e4 -> io_lib:format("~.1fk", [X / 1.0e3]);
num(X) when abs(X) >= 100 -> integer_to_list(round(X));
num(X) when abs(X) >= 1 -> io_lib:format("~.2f", [X]);
num(X) -> io_lib:format("~.3f", [X]).
