%%% EUnit tests of beamdiag_node_name: node names parsed and split.
-module(beamdiag_node_name_tests).

-include_lib("eunit/include/eunit.hrl").

split_test_() ->
    [?_assertEqual({"app", "db1"}, beamdiag_node_name:split('app@db1')),
     ?_assertEqual({"app", "db1"}, beamdiag_node_name:split("app@db1")),
     ?_assertEqual({<<"app">>, <<"db1">>}, beamdiag_node_name:split(<<"app@db1">>)),
     %% At the first @, as the distribution splits.
     ?_assertEqual({"a", "b@c"}, beamdiag_node_name:split("a@b@c")),
     ?_assertEqual(error, beamdiag_node_name:split("nohost")),
     ?_assertEqual("db1", beamdiag_node_name:host('app@db1')),
     ?_assertEqual("", beamdiag_node_name:host("nohost")),
     ?_assertEqual(<<>>, beamdiag_node_name:host(<<"nohost">>))].

parse_test_() ->
    [?_assertEqual({ok, 'app@db1.example', longnames}, beamdiag_node_name:parse("app@db1.example")),
     ?_assertEqual({ok, 'app@db1', shortnames}, beamdiag_node_name:parse(<<"app@db1">>)),
     ?_assertEqual({error, {beamdiag_node_name, {bad_node, "@db1"}}}, beamdiag_node_name:parse("@db1")),
     ?_assertEqual({error, {beamdiag_node_name, {bad_node, "a b@c"}}}, beamdiag_node_name:parse("a b@c"))].

short_host_test() ->
    {ok, H} = inet:gethostname(),
    S = beamdiag_node_name:short_host(),
    ?assert(lists:prefix(S, H)),
    ?assertEqual(nomatch, string:find(S, ".")).
