%%% @doc Two diagnoses side by side: every ledger figure with its delta and
%%% whether the delta stands out from the run-to-run noise, and the
%%% findings that appeared, went or changed severity. Pure; the statistics
%%% helpers are exported for `beamdiag_experiment'.
%%%
%%% The noise comes from the captures themselves: the ledger's `series'
%%% holds every figure per tick, so each capture gives a sample of per-tick
%%% values. A delta is tested with Welch's t-test (unequal variances,
%%% Welch-Satterthwaite degrees of freedom) on those per-tick values and
%%% reported with its 99% confidence interval. It counts as significant
%%% when p < 0.01 and the delta is larger than the metric's resolution
%%% floor (one percentage point of wall time for shares, 0.02 CPUs, 5% for
%%% rates): the kernel counts thread time in 10 ms ticks, so smaller deltas
%%% are below what the ledger can resolve. Ticks of one window are not
%%% independent (a load that drifts within a window makes them correlated),
%%% which makes the test somewhat optimistic; the floor guards against that.
%%%
%%% ```
%%% 1> {ok, A} = beamdiag_capture:load("before.capture").
%%% 2> {ok, B} = beamdiag_capture:load("after.capture").
%%% 3> C = beamdiag_compare:compare(A, B).
%%% 4> [K || #{key := K, significant := true} <- maps:get(metrics, C)].
%%% [<<"scheduler.spin">>, <<"scheduler.on_cpu">>, <<"totals.cpus_used">>]
%%% 5> io:put_chars(beamdiag_compare:text(C)).
%%% '''
-module(beamdiag_compare).

-export([compare/2, compare/3, text/1, document/1, welch/2, mean/1, variance/1,
         percentile/2, bootstrap_ratio/3, t_quantile/2]).

-export_type([comparison/0, test/0]).

-type test() :: #{
    n_a := non_neg_integer(),
    n_b := non_neg_integer(),
    mean_a := float(),
    mean_b := float(),
    delta := float(),
    ci := {float(), float()} | undefined,
    p := float() | undefined,
    df := float() | undefined
}.
-type comparison() :: #{
    schema := binary(),
    a := map(),
    b := map(),
    method := binary(),
    alpha := float(),
    metrics := [map()],
    findings := [map()]
}.

-define(SCHEMA, <<"beamdiag.compare/1">>).
-define(DEFAULTS, #{alpha => 0.01}).
-define(TYPES, [scheduler, dirty_cpu, dirty_io]).
-define(FIELDS, [busy, on_cpu, sys, runq, spin, blocked]).
-define(SHARE_FLOOR, 0.01).
-define(CPU_FLOOR, 0.02).
-define(RATE_FLOOR, 0.05).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Compares two diagnoses with the default options.
-spec compare(beamdiag:diagnosis(), beamdiag:diagnosis()) -> comparison().
compare(A, B) ->
    compare(A, B, #{}).

%% @doc Compares two diagnoses. Options: `alpha' (0.01), the significance
%% level of each test. Unknown options raise `badarg'.
-spec compare(beamdiag:diagnosis(), beamdiag:diagnosis(), map()) -> comparison().
compare(A, B, Opts) when is_map(Opts) ->
    #{alpha := Alpha} = beamdiag_opts:merge(Opts, ?DEFAULTS, []),
    MA = metrics(A),
    MB = metrics(B),
    Keys = [K || {K, _} <- MA, lists:keymember(K, 1, MB)],
    Metrics = [metric(K, proplists:get_value(K, MA), proplists:get_value(K, MB), Alpha)
               || K <- Keys],
    #{
        schema => ?SCHEMA,
        a => about(A),
        b => about(B),
        method => <<"Welch's t-test over per-tick values; 99% CI of the delta">>,
        alpha => Alpha,
        metrics => Metrics,
        findings => findings(maps:get(findings, A), maps:get(findings, B))
    }.

%% @doc The comparison as text, 80 columns.
-spec text(comparison()) -> iolist().
text(#{a := A, b := B, metrics := Ms, findings := Fs, alpha := Alpha}) ->
    [
        io_lib:format("beamdiag compare~n  A: ~ts~n  B: ~ts~n", [about_line(A), about_line(B)]),
        io_lib:format("noise: Welch's t-test over per-tick values; a delta counts when p < ~ts~n"
                      "and it exceeds the resolution floor (1 pt of wall time, 0.02 CPUs, 5%)~n~n",
                      [float_to_list(float(Alpha), [short])]),
        io_lib:format("~-22s ~8s ~8s ~9s ~19s ~7s~n",
                      ["metric", "A", "B", "delta", "99% CI of delta", "p"]),
        [metric_line(M) || M <- Ms],
        "\nFINDINGS (A -> B)\n",
        case Fs of
            [] -> "  none in either\n";
            _ -> [io_lib:format("  ~-24ts ~-8ts -> ~-8ts ~ts~n",
                                [safe(Id), safe(SA), safe(SB), safe(C)])
                  || #{id := Id, a := SA, b := SB, change := C} <- Fs]
        end,
        summary(Ms)
    ].

%% @doc The comparison as the map its JSON encodes.
-spec document(comparison()) -> map().
document(C = #{metrics := Ms}) ->
    C#{metrics => [M#{ci => ci_list(maps:get(ci, M))} || M <- Ms]}.

%% @doc Welch's two-sample t-test: the delta of the means (B - A), its 99%
%% confidence interval and the two-sided p-value. With fewer than two values
%% on a side, `p', `ci' and `df' are undefined.
-spec welch([number()], [number()]) -> test().
welch(As, Bs) ->
    NA = length(As),
    NB = length(Bs),
    MA = mean(As),
    MB = mean(Bs),
    Base = #{n_a => NA, n_b => NB, mean_a => MA, mean_b => MB, delta => MB - MA},
    case NA >= 2 andalso NB >= 2 of
        false ->
            Base#{ci => undefined, p => undefined, df => undefined};
        true ->
            VA = variance(As) / NA,
            VB = variance(Bs) / NB,
            SE = math:sqrt(VA + VB),
            D = MB - MA,
            case SE of
                Z when Z == 0 ->
                    P = case D == 0 of true -> 1.0; false -> 0.0 end,
                    Base#{ci => {D, D}, p => P, df => float(NA + NB - 2)};
                _ ->
                    Df = (VA + VB) * (VA + VB) /
                         (sq(VA) / max(1, NA - 1) + sq(VB) / max(1, NB - 1)),
                    T = D / SE,
                    P = t_two_sided(T, Df),
                    Q = t_quantile(0.995, Df),
                    Base#{ci => {D - Q * SE, D + Q * SE}, p => P, df => Df}
            end
    end.

%% @doc The arithmetic mean (0.0 for an empty list).
-spec mean([number()]) -> float().
mean([]) -> 0.0;
mean(Xs) -> lists:sum(Xs) / length(Xs).

%% @doc The sample variance (n - 1; 0.0 below two values).
-spec variance([number()]) -> float().
variance(Xs) when length(Xs) < 2 -> 0.0;
variance(Xs) ->
    M = mean(Xs),
    lists:sum([sq(X - M) || X <- Xs]) / (length(Xs) - 1).

%% @doc The P-th percentile (0..100) by linear interpolation between closest
%% ranks; `undefined' for an empty list.
-spec percentile([number()], number()) -> float() | undefined.
percentile([], _) ->
    undefined;
percentile(Xs, P) ->
    S = list_to_tuple(lists:sort(Xs)),
    N = tuple_size(S),
    R = P / 100 * (N - 1),
    Lo = floor(R),
    Hi = min(N - 1, Lo + 1),
    F = R - Lo,
    float(element(Lo + 1, S) * (1 - F) + element(Hi + 1, S) * F).

%% @doc Paired bootstrap of `sum(B) / sum(A) - 1' over pairs of runs
%% (`[{A, B}]'): the point estimate and the central 95% interval of Iters
%% resamples. Deterministic: the resampling uses a fixed seed.
-spec bootstrap_ratio([{number(), number()}], pos_integer(), term()) ->
    #{estimate := float(), ci := {float(), float()}} | undefined.
bootstrap_ratio([], _Iters, _Seed) ->
    undefined;
bootstrap_ratio(Pairs, Iters, Seed) ->
    Est = rel(Pairs),
    T = list_to_tuple(Pairs),
    N = tuple_size(T),
    S0 = rand:seed_s(exsss, Seed),
    {Stats, _} = lists:foldl(
        fun(_, {Acc, S}) ->
            {Sample, S2} = resample(T, N, S),
            {[rel(Sample) | Acc], S2}
        end,
        {[], S0},
        lists:seq(1, Iters)),
    #{estimate => Est, ci => {percentile(Stats, 2.5), percentile(Stats, 97.5)}}.

%% @doc The P-quantile of Student's t distribution with Df degrees of
%% freedom (bisection on the CDF).
-spec t_quantile(float(), float()) -> float().
t_quantile(P, Df) when P > 0.5 ->
    bisect(fun(T) -> t_cdf(T, Df) - P end, 0.0, 1000.0, 80);
t_quantile(P, Df) when P < 0.5 ->
    -t_quantile(1 - P, Df);
t_quantile(_, _) ->
    0.0.

%%%===================================================================
%%% Internal
%%%===================================================================

about(#{capture := C, ledger := L, findings := F}) ->
    S = maps:get(settings, C, #{}),
    #{
        node => maps:get(node, C, <<"?">>),
        wall_start_ms => maps:get(wall_start_ms, C, 0),
        window_s => maps:get(window_s, L, 0.0),
        ticks => length(maps:get(series, L, [])),
        sbwt => maps:get(sbwt, S, null),
        findings => length(F)
    }.

about_line(#{node := N, window_s := W, ticks := T, sbwt := Sbwt}) ->
    io_lib:format("~ts, ~.1f s window, ~b ticks, +sbwt ~ts", [safe(N), float(W), T, safe(Sbwt)]).

%% Every metric of a diagnosis: {Key, {Unit, Whole, PerTick}}.
metrics(#{capture := C, ledger := L}) ->
    ByType = maps:get(by_type, L, #{}),
    Series = maps:get(series, L, []),
    Shares = [
        {iolist_to_binary([atom_to_list(T), ".", atom_to_list(F)]),
         {share, share(F, Row), [share(F, maps:get(T, TickTypes))
                                 || #{by_type := TickTypes} <- Series,
                                    is_map_key(T, TickTypes),
                                    is_number(maps:get(F, maps:get(T, TickTypes), undefined))]}}
     || T <- ?TYPES, {ok, Row} <- [maps:find(T, ByType)], F <- ?FIELDS,
        is_number(maps:get(F, Row, undefined))
    ],
    Totals = maps:get(totals, L, #{}),
    Cpus = [{<<"totals.cpus_used">>,
             {cpus, maps:get(cpus_used, Totals, 0.0),
              [cpus(Types, Dt) || #{by_type := Types, t := Dt} <- Series]}}
            || maps:is_key(cpus_used, Totals)],
    Vm = maps:get(vm, L, #{}),
    Red = [{<<"vm.reductions_per_s">>,
            {rate, maps:get(reductions_per_s, Vm), reductions(maps:get(samples, C, []))}}
           || maps:is_key(reductions_per_s, Vm)],
    Shares ++ Cpus ++ Red.

share(F, Row) ->
    case {maps:get(F, Row, undefined), maps:get(wall, Row, 0)} of
        {V, W} when is_number(V), W > 0 -> V / W;
        _ -> 0.0
    end.

%% All thread types count towards the node's CPUs (the series holds each
%% type's on-CPU seconds per tick).
cpus(Types, Dt) when Dt > 0 ->
    lists:sum([V || #{on_cpu := V} <- maps:values(Types), is_number(V)]) / Dt;
cpus(_, _) ->
    0.0.

reductions([#{t := TA, vm := #{reductions := RA}} |
            Rest = [#{t := TB, vm := #{reductions := RB}} | _]]) when TB > TA ->
    [(RB - RA) / ((TB - TA) / 1.0e9) | reductions(Rest)];
reductions([_ | Rest]) ->
    reductions(Rest);
reductions([]) ->
    [].

metric(Key, {Unit, WholeA, TicksA}, {_, WholeB, TicksB}, Alpha) ->
    W = welch(TicksA, TicksB),
    Delta = WholeB - WholeA,
    Floor = floor_of(Unit, WholeA, WholeB),
    Sig = case maps:get(p, W) of
              undefined -> false;
              P -> P < Alpha andalso abs(maps:get(delta, W)) >= Floor andalso abs(Delta) >= Floor
          end,
    #{
        key => Key,
        unit => Unit,
        a => WholeA,
        b => WholeB,
        delta => Delta,
        tick_delta => maps:get(delta, W),
        ci => maps:get(ci, W),
        p => maps:get(p, W),
        df => maps:get(df, W),
        ticks_a => maps:get(n_a, W),
        ticks_b => maps:get(n_b, W),
        floor => Floor,
        significant => Sig
    }.

floor_of(share, _, _) -> ?SHARE_FLOOR;
floor_of(cpus, _, _) -> ?CPU_FLOOR;
floor_of(rate, A, B) -> ?RATE_FLOOR * max(abs(A), abs(B)).

findings(FA, FB) ->
    Sev = fun(Fs) -> maps:from_list([{Id, S} || #{id := Id, severity := S} <- Fs]) end,
    SA = Sev(FA),
    SB = Sev(FB),
    Ids = lists:usort(maps:keys(SA) ++ maps:keys(SB)),
    [begin
         A = maps:get(Id, SA, none),
         B = maps:get(Id, SB, none),
         #{id => Id, a => A, b => B, change => change(A, B)}
     end || Id <- Ids].

change(S, S) -> same;
change(none, _) -> new;
change(_, none) -> gone;
change(A, B) ->
    case beamdiag_finding:severity_rank(B) < beamdiag_finding:severity_rank(A) of
        true -> worse;
        false -> better
    end.

metric_line(#{key := K, unit := U, a := A, b := B, delta := D, ci := CI, p := P,
              significant := Sig}) ->
    io_lib:format("~-22ts ~8s ~8s ~9s ~19s ~7s ~s~n",
                  [safe(K), value(U, A), value(U, B), delta(U, D), ci(U, CI), p(P),
                   case Sig of true -> "*"; false -> "" end]).

summary(Ms) ->
    case [K || #{key := K, significant := true} <- Ms] of
        [] -> "\nno ledger delta stands out from the per-tick noise\n";
        Ks -> ["\n* beyond noise: ", lists:join(", ", Ks), "\n"]
    end.

value(share, V) -> io_lib:format("~.1f%", [100 * V]);
value(cpus, V) -> io_lib:format("~.2f", [float(V)]);
value(rate, V) -> human(V).

delta(share, V) -> [signed(100 * V, 1), " pt"];
delta(cpus, V) -> signed(V, 2);
delta(rate, V) -> [sign(V), human(abs(V))].

ci(_, undefined) -> "-";
ci(share, {L, H}) -> ["[", signed(100 * L, 1), ", ", signed(100 * H, 1), "]"];
ci(cpus, {L, H}) -> ["[", signed(L, 2), ", ", signed(H, 2), "]"];
ci(rate, {L, H}) -> ["[", sign(L), human(abs(L)), ", ", sign(H), human(abs(H)), "]"].

ci_list(undefined) -> null;
ci_list({L, H}) -> [L, H].

p(undefined) -> "-";
p(P) when P < 0.001 -> "<0.001";
p(P) -> io_lib:format("~.3f", [P]).

signed(V, Prec) -> [sign(V), io_lib:format("~.*f", [Prec, abs(float(V))])].

sign(V) when V < 0 -> "-";
sign(_) -> "+".

human(V) when V >= 1.0e9 -> io_lib:format("~.2fG", [V / 1.0e9]);
human(V) when V >= 1.0e6 -> io_lib:format("~.2fM", [V / 1.0e6]);
human(V) when V >= 1.0e3 -> io_lib:format("~.1fk", [V / 1.0e3]);
human(V) -> io_lib:format("~.1f", [float(V)]).

safe(null) -> "?";
safe(T) -> beamdiag_text:safe(T, 80).

sq(X) -> X * X.

rel(Pairs) ->
    SA = lists:sum([A || {A, _} <- Pairs]),
    SB = lists:sum([B || {_, B} <- Pairs]),
    case SA == 0 of
        true -> 0.0;
        false -> SB / SA - 1
    end.

resample(T, N, S) ->
    lists:foldl(fun(_, {Acc, S1}) ->
                        {I, S2} = rand:uniform_s(N, S1),
                        {[element(I, T) | Acc], S2}
                end, {[], S}, lists:seq(1, N)).

%% Two-sided p-value of a t statistic.
t_two_sided(T, Df) ->
    X = Df / (Df + T * T),
    min(1.0, max(0.0, betai(Df / 2, 0.5, X))).

t_cdf(T, Df) ->
    P = betai(Df / 2, 0.5, Df / (Df + T * T)) / 2,
    case T >= 0 of
        true -> 1 - P;
        false -> P
    end.

bisect(_F, Lo, Hi, 0) ->
    (Lo + Hi) / 2;
bisect(F, Lo, Hi, N) ->
    Mid = (Lo + Hi) / 2,
    case F(Mid) > 0 of
        true -> bisect(F, Lo, Mid, N - 1);
        false -> bisect(F, Mid, Hi, N - 1)
    end.

%% The regularized incomplete beta function I_x(a, b) (continued fraction,
%% modified Lentz).
betai(_A, _B, X) when X =< 0 -> 0.0;
betai(_A, _B, X) when X >= 1 -> 1.0;
betai(A, B, X) ->
    Bt = math:exp(lgamma(A + B) - lgamma(A) - lgamma(B) + A * math:log(X) + B * math:log(1 - X)),
    case X < (A + 1) / (A + B + 2) of
        true -> Bt * betacf(A, B, X) / A;
        false -> 1 - Bt * betacf(B, A, 1 - X) / B
    end.

betacf(A, B, X) ->
    Tiny = 1.0e-300,
    QAB = A + B,
    QAP = A + 1,
    QAM = A - 1,
    C0 = 1.0,
    D0 = nz(1 - QAB * X / QAP, Tiny),
    betacf_loop(1, A, B, X, QAB, QAP, QAM, C0, 1 / D0, 1 / D0, Tiny).

betacf_loop(M, _A, _B, _X, _QAB, _QAP, _QAM, _C, _D, H, _Tiny) when M > 300 ->
    H;
betacf_loop(M, A, B, X, QAB, QAP, QAM, C, D, H, Tiny) ->
    M2 = 2 * M,
    AA = M * (B - M) * X / ((QAM + M2) * (A + M2)),
    D1 = 1 / nz(1 + AA * D, Tiny),
    C1 = nz(1 + AA / C, Tiny),
    H1 = H * D1 * C1,
    AB = -(A + M) * (QAB + M) * X / ((A + M2) * (QAP + M2)),
    D2 = 1 / nz(1 + AB * D1, Tiny),
    C2 = nz(1 + AB / C1, Tiny),
    Del = D2 * C2,
    H2 = H1 * Del,
    case abs(Del - 1) < 1.0e-12 of
        true -> H2;
        false -> betacf_loop(M + 1, A, B, X, QAB, QAP, QAM, C2, D2, H2, Tiny)
    end.

nz(V, Tiny) when abs(V) < Tiny -> Tiny;
nz(V, _) -> V.

%% Lanczos approximation of ln Gamma(x), x > 0.
lgamma(X) ->
    Cof = [76.18009172947146, -86.50532032941677, 24.01409824083091,
           -1.231739572450155, 0.1208650973866179e-2, -0.5395239384953e-5],
    Tmp0 = X + 5.5,
    Tmp = Tmp0 - (X + 0.5) * math:log(Tmp0),
    {Ser, _} = lists:foldl(fun(C, {S, Y}) -> {S + C / (Y + 1), Y + 1} end,
                           {1.000000000190015, X}, Cof),
    -Tmp + math:log(2.5066282746310005 * Ser / X).
