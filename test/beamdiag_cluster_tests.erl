-module(beamdiag_cluster_tests).
-include_lib("eunit/include/eunit.hrl").

%% A member's result as the collectors give it: figures near an idle
%% node's, with a seeded jitter, and the given findings.
result(I, Over, Findings) ->
    J = fun(Scale) -> Scale * (rand:uniform() - 0.5) end,
    Row = maps:merge(
        #{node => iolist_to_binary(["n", integer_to_list(I), "@h"]),
          window_start_ms => 1700000000000 + I, window_s => 10.0, complete => true,
          cpus_used => 0.02 + J(0.01), busy => 0.02 + J(0.01), on_cpu => 0.01 + J(0.01),
          spin => 0.005 + J(0.004), runq => 0.01 + J(0.01), sys => 0.003 + J(0.002),
          blocked => 0.0, reductions_per_s => 20000.0 + J(4000.0),
          findings => [#{id => Id, severity => S} || {Id, S} <- Findings],
          top_process => null},
        Over),
    #{row => Row,
      findings => [beamdiag_finding:new(Id, S, [<<"evidence">>], #{}) || {Id, S} <- Findings]}.

cluster(Results) ->
    A = beamdiag_cluster_analysis:analyse(Results),
    A#{schema => <<"beamdiag.cluster/2">>, seed => null, source => list,
       members => [N || #{node := N} <- maps:get(nodes, A)],
       window_s => 10.0,
       windows => #{first_start_ms => 0, start_spread_s => 0.2, overlap_s => 9.8},
       prepare_s => 2.8, total_s => 16.5,
       timing => #{prepare_ms => 2800, run_ms => 13400, cluster_analysis_ms => 300, cpu_ms => 1000,
                   connect_ms => #{median => 386, max => 853, sum => 77000},
                   load_ms => #{median => 302, max => 641, sum => 60000},
                   analyse_ms => #{median => 900, max => 1500, sum => 180000},
                   captured_ms => #{median => 12400, max => 13400, sum => 2480000},
                   analysed_ms => #{median => 13400, max => 13700, sum => 2680000}},
       errors => []}.

%% A member that could not be reached, with what this host showed of it.
stalled_error() ->
    View = #{os_pid => 4242, state => <<"T">>, span_s => 10.0, threads => [],
             rss => 31 * 1024 * 1024},
    #{node => <<"stopped@h">>, host => View,
      message => iolist_to_binary(["did not answer within 5.0 s while being connected and given "
                                   "the agent; ",
                                   beamdiag_host_glance:words(View)])}.

homogeneous_cluster_has_no_outlier_test() ->
    rand:seed(exsss, {1, 2, 3}),
    Results = [result(I, #{}, [{busy_wait, warning} || I rem 3 =:= 0]) || I <- lists:seq(1, 300)],
    #{outliers := Out, findings := F} = beamdiag_cluster_analysis:analyse(Results),
    ?assertEqual([], Out),
    ?assertEqual([], [N || {N, Fs} <- maps:to_list(F), #{id := cluster_outlier} <- Fs]).

odd_node_gets_a_finding_test() ->
    rand:seed(exsss, {4, 5, 6}),
    Odd = result(77, #{busy => 0.82, on_cpu => 0.80, cpus_used => 0.9,
                       reductions_per_s => 4.0e7}, [{cpu_saturated, warning}]),
    Results = [result(I, #{}, []) || I <- lists:seq(1, 199)] ++ [Odd],
    #{outliers := [First | _], findings := F} = beamdiag_cluster_analysis:analyse(Results),
    ?assertMatch(#{node := <<"n77@h">>}, First),
    [Finding] = [X || X = #{id := cluster_outlier} <- maps:get(<<"n77@h">>, F)],
    ?assertMatch(#{severity := warning}, Finding),
    [Head | _] = maps:get(evidence, Finding),
    %% The busy share leads, as a ratio against the median, with the spread.
    ?assertMatch({match, _}, re:run(Head, "schedulers are [0-9.]+x busier than the cluster's "
                                          "median \\(82.0% of scheduler wall time vs median")),
    ?assertMatch({match, _}, re:run(Head, "MAD .* p10-p90")),
    %% Its own finding is kept, and no other node is an outlier.
    ?assert(lists:any(fun(#{id := Id}) -> Id =:= cpu_saturated end, maps:get(<<"n77@h">>, F))),
    ?assertEqual(1, length([N || {N, Fs} <- maps:to_list(F), #{id := cluster_outlier} <- Fs])).

text_fits_one_screen_test() ->
    rand:seed(exsss, {7, 8, 9}),
    Odd = [result(1000 + I, #{busy => 0.5 + I / 10, on_cpu => 0.4 + I / 10, cpus_used => 0.5,
                              runq => 0.3}, [{cpu_starvation, critical}])
           || I <- lists:seq(1, 4)],
    Results = [result(I, #{}, [{busy_wait, warning} || I rem 2 =:= 0]) || I <- lists:seq(1, 300)]
        ++ Odd,
    C = (cluster(Results))#{errors => [stalled_error() |
                                       [#{node => iolist_to_binary(["gone", integer_to_list(I), "@h"]),
                                          message => <<"cannot reach it">>}
                                        || I <- lists:seq(1, 12)]]},
    Text = beamdiag_format_text:cluster(C, #{}),
    %% Where the time went, and what the host showed of the stopped member.
    ?assertMatch({match, _}, re:run(Text, "per member, median \\(max\\): connect 386 ms \\(853\\)")),
    ?assertMatch({match, _}, re:run(re:replace(Text, "\\s+", " ", [global]),
                                    "stopped@h: did not answer .* on this host: pid 4242, stopped")),
    Lines = binary:split(Text, <<"\n">>, [global, trim]),
    ?assert(length(Lines) =< 50),
    ?assertEqual([], [L || L <- Lines, string:length(L) > 80]),
    %% The outliers come first, the rest after.
    {O, _} = binary:match(Text, <<"OUTLIERS">>),
    {R, _} = binary:match(Text, <<"THE OTHER 300 NODES">>),
    ?assert(O < R),
    All = beamdiag_format_text:cluster(C, #{all => true}),
    ?assert(length(binary:split(All, <<"\n">>, [global, trim])) > 304).

json_and_html_test() ->
    rand:seed(exsss, {1, 1, 1}),
    Results = [result(I, #{}, []) || I <- lists:seq(1, 20)] ++ [result(99, #{busy => 0.9}, [])],
    C = (cluster(Results))#{errors => [stalled_error()]},
    Json = iolist_to_binary(beamdiag_format_json:cluster(C)),
    ?assertMatch({match, _}, re:run(Json, "\"cluster_outlier\"")),
    #{<<"timing">> := #{<<"connect_ms">> := #{<<"median">> := 386}},
      <<"errors">> := [#{<<"host">> := #{<<"os_pid">> := 4242, <<"state">> := <<"T">>}}]} =
        beamdiag_test_json:decode(Json),
    Html = iolist_to_binary(beamdiag_format_html:cluster(C)),
    ?assertMatch({match, _}, re:run(Html, "id=\"cluster-charts\"")),
    ?assertMatch({match, _}, re:run(Html, "\"kind\":\"cluster\"")).

%% The API's reader is the members file's (beamdiag_cluster_members_tests
%% has the parsing); its errors are this module's, put in words here.
read_nodes_test() ->
    F = filename:join("/tmp", "beamdiag_nodes_" ++ os:getpid()),
    ok = file:write_file(F, "a@h\n# db\nb@h\n"),
    ?assertEqual({ok, ['a@h', 'b@h']}, beamdiag_cluster:read_nodes(F)),
    ok = file:write_file(F, "a@h\nnot a node\n"),
    {error, {beamdiag_cluster, R}} = beamdiag_cluster:read_nodes(F),
    Msg = lists:flatten(io_lib:format("~ts", [beamdiag_cluster:format_error(R)])),
    ?assertMatch({match, _}, re:run(Msg, "line 2: 'not a node' is not a node name")),
    ok = file:delete(F).

too_many_nodes_changes_nothing_test() ->
    %% Refused before any connection: the list has more members than allowed.
    ?assertMatch({error, {beamdiag_cluster, {too_many_nodes, 3, 2}}},
                 beamdiag_cluster:diagnose(undefined, #{nodes => ["a@h", "b@h", "c@h"],
                                                        max_nodes => 2, cookie => x})),
    ?assertEqual([], nodes([visible, hidden])).

thread_outliers_test() ->
    T = fun(Tid, Run) -> #{tid => Tid, name => iolist_to_binary(["s", integer_to_list(Tid)]),
                           type => scheduler, wall => 1.0, busy => Run, on_cpu => Run,
                           user => Run, sys => 0.0, runq => 0.0, off_cpu => 0.0, spin => 0.0,
                           blocked => 0.0}
        end,
    Threads = [T(I, 0.2) || I <- lists:seq(1, 7)] ++ [T(8, 0.9)],
    ?assertMatch([#{tid := 8} | _], beamdiag_outliers:threads(Threads)),
    ?assertEqual([], beamdiag_outliers:threads([T(I, 0.2) || I <- lists:seq(1, 8)])),
    %% The ledger keeps them ranked; each report takes as many as it shows.
    %% (The mean of 22 is 0.245: the twenty at 0.2 lie within 5 points.)
    Two = [T(I, 0.2) || I <- lists:seq(1, 20)] ++ [T(21, 0.5), T(22, 0.9)],
    Ledger = #{outliers => beamdiag_outliers:threads(Two)},
    ?assertMatch([#{tid := 22}, #{tid := 21}], beamdiag_ledger:outliers(Ledger, 3)),
    ?assertMatch([#{tid := 22}], beamdiag_ledger:outliers(Ledger, 1)),
    ?assertEqual([], beamdiag_ledger:outliers(Ledger, 0)).
