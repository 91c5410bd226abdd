%%% @doc A comparison of two diagnoses (beamdiag_compare) as text, 80
%%% columns: each ledger figure with its delta, its 99% confidence interval
%%% and p, the findings that came, went or changed, and the processes.
%%%
%%% ```
%%% 1> io:put_chars(beamdiag_format_compare:text(beamdiag_compare:compare(A, B))).
%%% '''
-module(beamdiag_format_compare).

-export([text/1]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The comparison as text, 80 columns.
-spec text(beamdiag_compare:comparison()) -> iolist().
text(Cmp = #{a := A, b := B, metrics := Ms, findings := Fs, alpha := Alpha}) ->
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
        beamdiag_format_procs:compare_text(maps:get(processes, Cmp, [])),
        summary(Ms)
    ].

%%%===================================================================
%%% Internal
%%%===================================================================

about_line(#{node := N, window_s := W, ticks := T, sbwt := Sbwt}) ->
    io_lib:format("~ts, ~.1f s window, ~b ticks, +sbwt ~ts", [safe(N), float(W), T, safe(Sbwt)]).

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

value(share, V) -> beamdiag_units:pct(V);
value(cpus, V) -> io_lib:format("~.2f", [float(V)]);
value(rate, V) -> beamdiag_units:rate(V).

delta(share, V) -> [signed(100 * V, 1), " pt"];
delta(cpus, V) -> signed(V, 2);
delta(rate, V) -> [sign(V), beamdiag_units:rate(abs(V))].

ci(_, undefined) -> "-";
ci(share, {L, H}) -> ["[", signed(100 * L, 1), ", ", signed(100 * H, 1), "]"];
ci(cpus, {L, H}) -> ["[", signed(L, 2), ", ", signed(H, 2), "]"];
ci(rate, {L, H}) -> ["[", sign(L), beamdiag_units:rate(abs(L)), ", ", sign(H),
                      beamdiag_units:rate(abs(H)), "]"].

p(undefined) -> "-";
p(P) when P < 0.001 -> "<0.001";
p(P) -> io_lib:format("~.3f", [P]).

signed(V, Prec) -> [sign(V), io_lib:format("~.*f", [Prec, abs(float(V))])].

sign(V) when V < 0 -> "-";
sign(_) -> "+".


safe(null) -> "?";
safe(T) -> beamdiag_safe_text:safe(T, 80).

