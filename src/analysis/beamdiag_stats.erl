%%% @doc Statistics shared by compare and experiment, in one place: Welch's
%%% two-sample t-test (with Student's t quantiles from the regularized
%%% incomplete beta function), a seeded paired bootstrap of a ratio of
%%% sums, and the mean, sample variance and percentile they rest on. Pure.
%%%
%%% ```
%%% 1> #{p := P} = beamdiag_stats:welch([1, 2, 3, 4, 5], [2, 3, 4, 5, 6, 7]).
%%% 2> P.
%%% 0.1835...
%%% 3> beamdiag_stats:bootstrap_ratio([{10.0, 8.0}, {11.0, 8.5}, {9.0, 7.9}], 1000, {1, 2, 3}).
%%% #{estimate => -0.19..., ci => {-0.21..., -0.15...}}
%%% '''
-module(beamdiag_stats).

-export([welch/2, mean/1, variance/1, percentile/2, bootstrap_ratio/3, share_lower/2]).
%% Called by the tests only.
-ifdef(TEST).
-export([t_quantile/2]).
-endif.

-export_type([test/0]).

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

%%%===================================================================
%%% API
%%%===================================================================

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

%% @doc The lower one-sided 95% bound of a share seen in N samples
%% (Wilson's score interval, z = 1.645): what the share is at least, given
%% that few samples. 0.0 without samples.
-spec share_lower(float(), non_neg_integer()) -> float().
share_lower(_Share, 0) ->
    0.0;
share_lower(Share, N) ->
    Z2 = 1.645 * 1.645,
    Centre = Share + Z2 / (2 * N),
    Spread = 1.645 * math:sqrt(Share * (1 - Share) / N + Z2 / (4 * N * N)),
    max(0.0, (Centre - Spread) / (1 + Z2 / N)).

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
