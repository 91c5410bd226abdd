%%% The data the HTML report's charts draw, from recorded captures, from a
%%% small ledger built by hand, and from a cluster report.
-module(beamdiag_html_chart_data_tests).

-include_lib("eunit/include/eunit.hrl").

data(Name) ->
    #{capture := C, ledger := L} = beamdiag:analyse(beamdiag_test_lib:fixture_capture(Name)),
    {C, L, beamdiag_html_chart_data:diagnosis(C, L)}.

%% Rounded to N decimals: no more digits than that.
rounded(X, N) ->
    Scale = math:pow(10, N),
    abs(X * Scale - round(X * Scale)) < 1.0e-6.

recorded_capture_test() ->
    {_C, L, D} = data("busy_wait"),
    Series = maps:get(series, L),
    ?assertMatch(#{kind := diagnosis}, D),
    States = beamdiag_ledger:states(),
    ?assertEqual([[S, beamdiag_ledger:state_name(S)] || S <- States], maps:get(states, D)),
    %% One tick end per interval, rising, the last at the window's end.
    T = maps:get(t, D),
    ?assertEqual(length(Series), length(T)),
    ?assertEqual(T, lists:usort(T)),
    ?assert(abs(lists:last(T) - maps:get(window_s, L)) < 0.01),
    ?assert(lists:all(fun(X) -> rounded(X, 3) end, T)),
    %% A series per type charted, a point per tick, a share per state.
    Ledger = maps:get(ledger, D),
    [begin
         ?assertEqual(length(Series), length(Points)),
         [begin
              ?assertEqual(length(States), length(P)),
              ?assert(lists:all(fun(X) -> X >= 0 andalso rounded(X, 4) end, P))
          end || P <- Points]
     end || #{points := Points} <- Ledger],
    %% The schedulers are charted, and their shares add up to the whole.
    [#{n := N, points := SchedPoints}] = [S || S = #{type := scheduler} <- Ledger],
    ?assert(N > 0),
    [?assert(abs(lists:sum(P) - 1.0) < 0.01) || P <- SchedPoints],
    Cpu = maps:get(cpu, D),
    ?assertEqual(length(Series), length(maps:get(node_cpus, Cpu))),
    ?assertEqual(length(Series), length(maps:get(sched_busy, Cpu))),
    ?assert(maps:get(available, Cpu) > 0).

outliers_test() ->
    {_C, L, D} = data("scheduler_imbalance"),
    Outliers = maps:get(outliers, D),
    ?assert(length(Outliers) =< 4),
    ?assertEqual([maps:get(name, R) || R <- beamdiag_ledger:outliers(L, 4)],
                 [maps:get(name, O) || O <- Outliers]),
    %% Each outlier's points are on the outlier ticks.
    N = length(maps:get(outlier_t, D)),
    [?assertEqual(N, length(Ps)) || #{points := Ps} <- Outliers].

msacc_test() ->
    {_C, L, D} = data("busy_wait"),
    #{by_type := ByType} = maps:get(msacc, L),
    Msacc = maps:get(msacc, D),
    ?assertEqual(map_size(ByType), length(Msacc)),
    [#{type := First} | _] = Msacc,
    ?assertEqual(scheduler, First),
    [?assert(lists:all(fun(X) -> rounded(X, 4) end, maps:values(Sh))) || #{shares := Sh} <- Msacc].

%% A ledger built by hand: two ticks, one scheduler type, msacc types out
%% of the usual order and one that is not a map.
hand_ledger() ->
    Row = fun(Run, Wall) -> #{n => 2, wall => Wall, on_cpu => Run, spin => 0.0, blocked => 0.0,
                              runq => 0.0, busy => Run} end,
    #{series => [#{t => 0.5, by_type => #{scheduler => Row(0.25, 1.0)}},
                 #{t => 0.25, by_type => #{scheduler => Row(1.0 / 3, 0.5),
                                           aux => Row(0.0, 0.5)}}],
      totals => #{cpus_available => 4},
      msacc => #{by_type => #{zeta => #{n => 1, shares => #{other => 0.123456}},
                              aux => #{n => 1, shares => #{aux => 1}},
                              scheduler => #{n => 2, shares => #{emulator => 0.5}},
                              broken => 1}}}.

hand_ledger_test() ->
    D = beamdiag_html_chart_data:diagnosis(#{samples => []}, hand_ledger()),
    ?assertEqual([0.5, 0.75], maps:get(t, D)),
    %% aux was never on CPU: not charted.
    ?assertMatch([#{type := scheduler, n := 2, points := [[0.25, 0.0, 0.0, 0.0, 0.75],
                                                          [0.6667, 0.0, 0.0, 0.0, 0.3333]]}],
                 maps:get(ledger, D)),
    ?assertEqual([], maps:get(outliers, D)),
    ?assertEqual([], maps:get(outlier_t, D)),
    #{node_cpus := NodeCpus, sched_busy := Busy, host_busy := [], available := 4.0} =
        maps:get(cpu, D),
    ?assertEqual([0.5, 1.333], NodeCpus),
    ?assertEqual([0.5, 1.333], Busy),
    ?assertEqual([#{type => scheduler, n => 2, shares => #{emulator => 0.5}},
                  #{type => aux, n => 1, shares => #{aux => 1.0}},
                  #{type => zeta, n => 1, shares => #{other => 0.1235}}],
                 maps:get(msacc, D)).

no_figures_test() ->
    D = beamdiag_html_chart_data:diagnosis(#{}, #{}),
    ?assertMatch(#{kind := diagnosis, t := [], ledger := [], outliers := [], msacc := [],
                   cpu := #{node_cpus := [], sched_busy := [], available := 0.0}}, D).

cluster_test() ->
    rand:seed(exsss, {1, 1, 1}),
    Row = fun(I, Busy) ->
              N = iolist_to_binary(["n", integer_to_list(I), "@h"]),
              #{row => #{node => N, window_start_ms => 0, window_s => 4.0, complete => true,
                         cpus_used => 0.02 + Busy, busy => 0.02 + rand:uniform() / 100 + Busy,
                         on_cpu => 0.01, spin => 0.0, runq => 0.01, sys => 0.0, blocked => 0.0,
                         reductions_per_s => 2.0e4 + I, findings => [], top_process => null},
                findings => []}
          end,
    A = beamdiag_cluster_analysis:analyse([Row(I, 0.0) || I <- lists:seq(1, 20)] ++ [Row(99, 0.9)]),
    #{kind := cluster, figures := Figures} = beamdiag_html_chart_data:cluster(A),
    ?assertEqual(beamdiag_outliers:figures(), [K || #{key := K} <- Figures]),
    [#{unit := BusyUnit, median := Median, outliers := Out, values := Values}] =
        [F || F = #{key := busy} <- Figures],
    ?assertEqual(<<"share of scheduler wall time">>, BusyUnit),
    ?assertEqual([<<"n99@h">>], Out),
    ?assertEqual(21, length(Values)),
    %% Largest first: the busy node leads.
    ?assertMatch([[<<"n99@h">>, _] | _], Values),
    Vs = [V || [_, V] <- Values],
    ?assertEqual(Vs, lists:reverse(lists:sort(Vs))),
    ?assertEqual(maps:get(p50, maps:get(busy, maps:get(spread, A))), Median),
    [#{unit := <<"CPUs">>}] = [F || F = #{key := cpus_used} <- Figures],
    [#{unit := <<"reductions/s">>}] = [F || F = #{key := reductions_per_s} <- Figures].

json_test() ->
    {_C, _L, D} = data("rabbitmq_backlog"),
    %% The page embeds it as JSON: every term in it must encode.
    ?assert(is_binary(iolist_to_binary(beamdiag_json:encode(D)))).
