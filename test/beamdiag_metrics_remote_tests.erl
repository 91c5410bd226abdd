%%% EUnit tests of the remote metrics endpoint's parts that need no
%%% target: options checked before any connection, the node's name and
%%% cookie refused before this VM starts distribution, and the sentence.
%%% Serving from a node is tested in beamdiag_metrics_SUITE; the
%%% responder itself in beamdiag_agent_http_tests.
-module(beamdiag_metrics_remote_tests).

-include_lib("eunit/include/eunit.hrl").

bad_options_test_() ->
    Bad = [{port, -1}, {port, 65536}, {port, "9568"}, {ip, "127.0.0.1"}, {ip, localhost},
           {path, "metrics"}, {path, ""}, {path, <<"/metrics">>}, {interval, 99},
           {interval, 60001}, {interval, 1000.0}, {duration, 0}, {duration, 86401},
           {duration, infinity}],
    %% The node is never reached: the options fail first, whatever it is.
    [?_assertError({badarg, {K, V}}, beamdiag_metrics_remote:run("app@127.0.0.1", #{K => V}))
     || {K, V} <- Bad] ++
    [?_assertError({badarg, {unknown_options, [prot], allowed, _}},
                   beamdiag_metrics_remote:run('app@127.0.0.1', #{prot => 9568})),
     ?_assertError({badarg, [{port, 1}]}, beamdiag_metrics_remote:run("app@127.0.0.1",
                                                                      [{port, 1}]))].

%% Good options pass (the defaults, each bound, an address tuple, `any'):
%% what stops the run is then the node's name.
good_options_test_() ->
    Good = [#{}, #{port => 0}, #{port => 65535}, #{ip => any}, #{ip => {10, 0, 0, 1}},
            #{ip => loopback}, #{path => "/"}, #{interval => 100}, #{interval => 60000},
            #{duration => 0.5}, #{duration => 86400}, #{cookie => "c"},
            #{cookie_file => "/c", started => fun(_) -> ok end}],
    [?_assertEqual({error, {beamdiag_node_name, {bad_node, "no-at-sign"}}},
                   beamdiag_metrics_remote:run("no-at-sign", O)) || O <- Good].

before_distribution_test() ->
    ?assertEqual({error, {beamdiag_node_name, {bad_node, "a b@c"}}},
                 beamdiag_metrics_remote:run(<<"a b@c">>, #{})),
    ?assertEqual({error, {beamdiag_remote, {bad_cookie, {length, 256}}}},
                 beamdiag_metrics_remote:run("app@127.0.0.1",
                                             #{cookie => lists:duplicate(256, $c)})),
    ?assertEqual(nonode@nohost, node()).

sentence_test() ->
    ?assertEqual(<<"cannot start the metrics responder on app@db1: {error,{undef,[]}}">>,
                 iolist_to_binary(beamdiag_metrics_remote:format_error(
                                    {responder, 'app@db1', {error, {undef, []}}}))).
