%%% EUnit tests of compare's statistics: known values, identical
%%% distributions give no significant delta, shifted ones do.
-module(beamdiag_compare_tests).

-include_lib("eunit/include/eunit.hrl").

welch_known_value_test() ->
    %% Reference: R's t.test(c(1,2,3,4,5), c(2,3,4,5,6,7)) gives
    %% t = -1.4412, df = 8.9894, p-value = 0.1835.
    #{p := P, df := Df, delta := D} = beamdiag_stats:welch([1, 2, 3, 4, 5], [2, 3, 4, 5, 6, 7]),
    ?assert(abs(P - 0.1835) < 0.0005),
    ?assert(abs(Df - 8.9894) < 0.001),
    ?assertEqual(1.5, D).

t_quantile_test() ->
    ?assert(abs(beamdiag_stats:t_quantile(0.975, 10.0) - 2.2281) < 0.0005),
    ?assert(abs(beamdiag_stats:t_quantile(0.995, 1000.0) - 2.5808) < 0.0005),
    ?assert(abs(beamdiag_stats:t_quantile(0.025, 10.0) + 2.2281) < 0.0005).

welch_degenerate_test() ->
    ?assertMatch(#{p := undefined, ci := undefined}, beamdiag_stats:welch([1.0], [2.0, 3.0])),
    ?assertMatch(#{p := 1.0}, beamdiag_stats:welch([1.0, 1.0], [1.0, 1.0])),
    ?assertMatch(#{p := 0.0}, beamdiag_stats:welch([1.0, 1.0], [2.0, 2.0])).

%% Same distribution, 200 trials: the false-positive rate of the test alone
%% stays near alpha (0.01), and compare/2 with its floor reports nothing.
identical_distributions_test() ->
    S0 = rand:seed_s(exsss, {7, 8, 9}),
    {Ps, _} = lists:foldl(
        fun(_, {Acc, S}) ->
            {A, S1} = normal(30, 0.30, 0.03, S),
            {B, S2} = normal(30, 0.30, 0.03, S1),
            #{p := P} = beamdiag_stats:welch(A, B),
            {[P | Acc], S2}
        end, {[], S0}, lists:seq(1, 200)),
    FalsePositives = length([P || P <- Ps, P < 0.01]),
    ?assert(FalsePositives =< 8),
    {DA, S3} = diagnosis(20, #{spin => {0.30, 0.03}}, rand:seed_s(exsss, {1, 1, 1})),
    {DB, _} = diagnosis(20, #{spin => {0.30, 0.03}}, S3),
    C = beamdiag_compare:compare(DA, DB),
    ?assertEqual([], [K || #{key := K, significant := true} <- maps:get(metrics, C)]),
    ?assertMatch([_ | _], maps:get(metrics, C)).

shifted_distribution_test() ->
    {DA, S1} = diagnosis(20, #{spin => {0.30, 0.03}}, rand:seed_s(exsss, {4, 5, 6})),
    {DB, _} = diagnosis(20, #{spin => {0.10, 0.03}}, S1),
    C = beamdiag_compare:compare(DA, DB),
    [Spin] = [M || M = #{key := <<"scheduler.spin">>} <- maps:get(metrics, C)],
    ?assertMatch(#{significant := true}, Spin),
    #{ci := {Lo, Hi}, delta := D} = Spin,
    ?assert(Hi < 0),
    ?assert(Lo < D andalso D < Hi),
    %% A shift below the resolution floor is not reported, however many ticks.
    {DC, S2} = diagnosis(200, #{spin => {0.300, 0.001}}, rand:seed_s(exsss, {9, 9, 9})),
    {DD, _} = diagnosis(200, #{spin => {0.305, 0.001}}, S2),
    C2 = beamdiag_compare:compare(DC, DD),
    [Spin2] = [M || M = #{key := <<"scheduler.spin">>} <- maps:get(metrics, C2)],
    ?assertMatch(#{significant := false}, Spin2),
    ?assert(maps:get(p, Spin2) < 0.01).

findings_side_by_side_test() ->
    {DA, S} = diagnosis(5, #{}, rand:seed_s(exsss, {1, 2, 3})),
    {DB, _} = diagnosis(5, #{}, S),
    F = fun(Id, Sev) -> #{id => Id, severity => Sev} end,
    C = beamdiag_compare:compare(DA#{findings => [F(busy_wait, critical), F(cpu_saturated, info)]},
                                 DB#{findings => [F(cpu_saturated, warning), F(cpu_starvation, info)]}),
    ?assertEqual([#{id => busy_wait, a => critical, b => none, change => gone},
                  #{id => cpu_saturated, a => info, b => warning, change => worse},
                  #{id => cpu_starvation, a => none, b => info, change => new}],
                 maps:get(findings, C)),
    Text = lists:flatten(io_lib:format("~ts", [beamdiag_format_compare:text(C)])),
    ?assertNotEqual(nomatch, string:find(Text, "busy_wait")),
    Json = iolist_to_binary(beamdiag_json:encode(beamdiag_compare:document(C))),
    ?assertMatch(<<"{", _/binary>>, Json).

%% Names from capture files may hold anything: bytes that are not UTF-8
%% (255) and control characters in the node, the busy-wait setting and the
%% finding ids and severities (binaries when the atom did not exist) come
%% out as '?', and nothing crashes.
text_invalid_utf8_test() ->
    Bad = <<"n", 255, 27, "[2J", 16#9b, "x">>,
    {DA, S} = diagnosis(3, #{}, rand:seed_s(exsss, {1, 2, 3})),
    {DB, _} = diagnosis(3, #{}, S),
    Capture = maps:get(capture, DA),
    Weird = DA#{capture => Capture#{node => Bad, settings => #{sbwt => Bad}},
                findings => [#{id => Bad, severity => Bad}]},
    C = beamdiag_compare:compare(Weird, DB#{findings => [#{id => <<255>>, severity => info}]}),
    Text = unicode:characters_to_binary(beamdiag_format_compare:text(C)),
    ?assert(is_binary(Text)),
    ?assertEqual(nomatch, binary:match(Text, [<<27>>, <<255>>, <<16#9b/utf8>>])),
    ?assertNotEqual(nomatch, binary:match(Text, <<"A: n??[2J?x, ">>)),
    ?assertNotEqual(nomatch, binary:match(Text, <<"+sbwt n??[2J?x">>)),
    ?assertNotEqual(nomatch, binary:match(Text, <<"  n??[2J?x ">>)).

bootstrap_test() ->
    Pairs = [{10.0, 8.0}, {11.0, 8.5}, {9.0, 7.9}, {10.5, 8.2}, {10.2, 8.1}],
    #{estimate := E, ci := {Lo, Hi}} = beamdiag_stats:bootstrap_ratio(Pairs, 1000, {1, 2, 3}),
    ?assert(Lo =< E andalso E =< Hi),
    ?assert(Hi < 0),
    ?assertEqual(beamdiag_stats:bootstrap_ratio(Pairs, 1000, {1, 2, 3}),
                 beamdiag_stats:bootstrap_ratio(Pairs, 1000, {1, 2, 3})),
    Same = [{X, X} || X <- [1.0, 2.0, 3.0]],
    #{ci := {L2, H2}} = beamdiag_stats:bootstrap_ratio(Same, 500, {1, 2, 3}),
    ?assert(L2 =< 0 andalso H2 >= 0).

unknown_option_test() ->
    {D, _} = diagnosis(3, #{}, rand:seed_s(exsss, {1, 2, 3})),
    ?assertError({badarg, _}, beamdiag_compare:compare(D, D, #{nope => 1})).

%%% Helpers

normal(N, Mu, Sd, S) ->
    lists:foldl(fun(_, {Acc, S1}) ->
                        {X, S2} = rand:normal_s(S1),
                        {[Mu + Sd * X | Acc], S2}
                end, {[], S}, lists:seq(1, N)).

%% A synthetic diagnosis of N one-second ticks on 2 schedulers; Spec gives
%% the mean and sd of a field's share of wall time.
diagnosis(N, Spec, S0) ->
    Fields = [busy, on_cpu, sys, runq, spin, blocked],
    {Ticks, S} = lists:foldl(
        fun(_, {Acc, S1}) ->
            {Row, S3} = lists:foldl(
                fun(F, {R, S2}) ->
                    {Mu, Sd} = maps:get(F, Spec, {0.05, 0.005}),
                    {X, S2b} = rand:normal_s(S2),
                    {R#{F => max(0.0, Mu + Sd * X) * 2.0}, S2b}
                end, {#{wall => 2.0, n => 2}, S1}, Fields),
            {[#{t => 1.0, by_type => #{scheduler => Row}} | Acc], S3}
        end, {[], S0}, lists:seq(1, N)),
    Sum = fun(F) -> lists:sum([maps:get(F, maps:get(scheduler, B)) || #{by_type := B} <- Ticks]) end,
    Whole = maps:from_list([{F, Sum(F)} || F <- [wall | Fields]]),
    Samples = [#{t => I * 1000000000, vm => #{reductions => I * 1000}} || I <- lists:seq(0, N)],
    D = #{
        capture => #{node => <<"test@host">>, settings => #{sbwt => <<"medium">>},
                     samples => Samples, wall_start_ms => 0},
        ledger => #{window_s => float(N), by_type => #{scheduler => Whole#{n => 2}},
                    series => Ticks, totals => #{cpus_used => Sum(on_cpu) / N},
                    vm => #{reductions_per_s => 1000.0}},
        findings => []
    },
    {D, S}.
