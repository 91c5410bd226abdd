%%% EUnit tests of reaching a node: node names parsed and their name mode
%%% inferred, every error reason said as a sentence, the errors a plan
%%% holds returned before this VM starts distribution, and, between two
%%% peers (the test node stays undistributed), a connection made hidden and
%%% not listening, a wrong cookie and a name no epmd knows.
-module(beamdiag_remote_tests).

-include_lib("eunit/include/eunit.hrl").

-define(N, 'a@127.0.0.1').

%%%===================================================================
%%% Names
%%%===================================================================

parse_node_test_() ->
    [
        ?_assertEqual({ok, 'app@host', shortnames}, beamdiag_node_name:parse("app@host")),
        ?_assertEqual({ok, 'app@host', shortnames}, beamdiag_node_name:parse(<<"app@host">>)),
        ?_assertEqual({ok, 'app@db1.example.com', longnames},
                      beamdiag_node_name:parse("app@db1.example.com")),
        ?_assertEqual({ok, 'app@10.0.0.7', longnames}, beamdiag_node_name:parse("app@10.0.0.7")),
        %% An IPv6 address has colons, no dot.
        ?_assertEqual({ok, 'app@::1', longnames}, beamdiag_node_name:parse("app@::1")),
        ?_assertEqual({ok, 'my_app-2@h-1', shortnames}, beamdiag_node_name:parse("my_app-2@h-1"))
    ].

bad_node_test_() ->
    Long = lists:duplicate(251, $a) ++ "@host",
    [?_assertEqual({error, {beamdiag_node_name, {bad_node, S}}}, beamdiag_node_name:parse(S))
     || S <- ["app", "@host", "app@", "", "a@b@c", "my app@host", "app@ho st", "app@host\n",
              "nœd@host", "a;rm -rf@host", Long]] ++
    [?_assertEqual(256, length(Long))].

%% A name refused is never made an atom.
bad_node_no_atom_test() ->
    S = "no such node " ++ integer_to_list(erlang:unique_integer([positive])) ++ "@host",
    {error, _} = beamdiag_node_name:parse(S),
    ?assertError(badarg, list_to_existing_atom(S)).

%%%===================================================================
%%% Sentences
%%%===================================================================

sentences_test_() ->
    [
        ?_assertEqual(<<"'x y' is not a node name: expected name@host">>,
                      iolist_to_binary(beamdiag_node_name:format_error({bad_node, "x y"}))),
        %% Control characters are not let through to the terminal.
        ?_assertEqual(<<"'a?[31mb?c' is not a node name: expected name@host">>,
                      iolist_to_binary(beamdiag_node_name:format_error({bad_node, "a\e[31mb\nc"}))),
        ?_assertEqual(<<"cannot read the cookie file /x/c: no such file or directory">>,
                      text({cookie_file, "/x/c", enoent})),
        ?_assertEqual(<<"the cookie is not valid UTF-8">>, text({bad_cookie, not_utf8})),
        ?_assertEqual(<<"the cookie has 300 characters; a cookie has 1 to 255">>,
                      text({bad_cookie, {length, 300}})),
        ?_assertMatch(<<"no cookie: give --cookie-file FILE, set BEAMDIAG_COOKIE", _/binary>>,
                      text(no_cookie)),
        ?_assertEqual(<<"cannot reach a@127.0.0.1: no node of that name is registered on its host "
                        "(registered there: b, c)">>,
                      text({unreachable, ?N, not_registered, ["b", "c"]})),
        ?_assertEqual(<<"cannot reach a@127.0.0.1: no node of that name is registered on its host "
                        "(registered there: none)">>,
                      text({unreachable, ?N, not_registered, []})),
        ?_assertEqual(<<"cannot reach a@127.0.0.1: no epmd answers on its host (is the node "
                        "running?)">>,
                      text({unreachable, ?N, no_epmd})),
        ?_assertMatch(<<"cannot reach a@127.0.0.1: the node is running but refused", _/binary>>,
                      text({unreachable, ?N, refused})),
        ?_assertEqual(<<"cannot reach a@127.0.0.1: its distribution port 4000 on 127.0.0.1 is "
                        "closed (connection refused)">>,
                      text({unreachable, ?N, {port_closed, {127, 0, 0, 1}, 4000}})),
        ?_assertMatch({_, _}, binary:match(text({unreachable, ?N, {port_closed,
                                                                   {0, 0, 0, 0, 0, 0, 0, 1}, 9}}),
                                           <<"port 9 on ::1 is closed">>)),
        ?_assertEqual(<<"cannot reach a@127.0.0.1: its port 4000 speaks TLS distribution, and "
                        "this connection was plain TCP; give --proto-dist inet_tls "
                        "--ssl-dist-optfile FILE">>,
                      text({unreachable, ?N, {speaks_tls, 4000}})),
        ?_assertEqual(<<"cannot reach a@127.0.0.1: its port 4000 speaks plain TCP distribution, "
                        "not TLS; give --proto-dist inet_tcp">>,
                      text({unreachable, ?N, {speaks_plain, 4000}})),
        ?_assertEqual(<<"cannot reach a@127.0.0.1: port 22 does not speak Erlang distribution">>,
                      text({unreachable, ?N, {not_distribution, 22}})),
        ?_assertMatch({_, _}, binary:match(text({unreachable, ?N, {status, <<"not_allowed">>}}),
                                           <<"(status not_allowed: it allows only some nodes">>)),
        ?_assertMatch({_, _}, binary:match(text({unreachable, ?N, {unknown_name, ["b"]}}),
                                           <<"name unknown: no Erlang VM on this host was started "
                                             "with that name, and epmd knows none of it "
                                             "(registered there: b)">>)),
        ?_assertMatch({_, _}, binary:match(text({unreachable, ?N, {no_port, []}}),
                                           <<"(registered: none); give --dist-port PORT">>)),
        ?_assertEqual(<<"cannot reach a@127.0.0.1: the node is registered but did not finish the "
                        "connection within 10 s (overloaded, or its distribution port filtered?)">>,
                      text({unreachable, ?N, {no_answer, 10400}})),
        ?_assertEqual(<<"cannot reach a@127.0.0.1 from this VM: it is distributed already with "
                        "the other name mode (long names wanted)">>,
                      text({own_mode, ?N, longnames})),
        ?_assertMatch({_, _}, binary:match(text({own_mode, ?N, shortnames}),
                                           <<"(short names wanted)">>)),
        ?_assertMatch(<<"cannot start distribution on this machine: ", _/binary>>,
                      text({no_distribution, {'EXIT', nodistribution}}))
    ].

%% Only the first ten names registered on the host are listed.
names_bounded_test() ->
    Names = ["n" ++ integer_to_list(I) || I <- lists:seq(1, 12)],
    T = text({unreachable, ?N, not_registered, Names}),
    ?assertMatch({_, _}, binary:match(T, <<"n1, n2, n3, n4, n5, n6, n7, n8, n9, n10)">>)),
    ?assertEqual(nomatch, binary:match(T, <<"n11">>)).

%% The cookies tried are named by where they came from and their hash,
%% never by their value.
wrong_cookie_test() ->
    Tried = [{{cli, "--cookie-file"}, <<"sha256:0a1b2c3d">>},
             {{env, <<"BEAMDIAG_COOKIE">>}, <<"sha256:11111111">>},
             {{env, <<"RELEASE_COOKIE">>}, <<"sha256:22222222">>},
             {{setcookie, secret}, <<"sha256:33333333">>},
             {{home_file, <<"/home/app/.erlang.cookie">>}, <<"sha256:44444444">>},
             {{release_file, <<"/srv/app/releases/COOKIE">>}, <<"sha256:55555555">>},
             {{cli_home, <<"/root/.erlang.cookie">>}, <<"sha256:66666666">>}],
    T = text({unreachable, ?N, {wrong_cookie, Tried}}),
    ?assertMatch({_, _}, binary:match(T, <<"(tried: beamdiag's --cookie-file, sha256:0a1b2c3d; "
                                           "BEAMDIAG_COOKIE, sha256:11111111; "
                                           "the node's RELEASE_COOKIE, sha256:22222222; "
                                           "the node's -setcookie, sha256:33333333; "
                                           "the node's user's /home/app/.erlang.cookie, "
                                           "sha256:44444444; "
                                           "the release's /srv/app/releases/COOKIE, "
                                           "sha256:55555555; "
                                           "your own cookie file /root/.erlang.cookie, "
                                           "sha256:66666666); give the node's cookie with "
                                           "--cookie-file FILE">>)),
    ?assertEqual(nomatch, binary:match(T, <<"secret">>)),
    ?assertMatch({_, _}, binary:match(text({unreachable, ?N, {wrong_cookie, []}}),
                                      <<"(tried: none)">>)).

own_dist_test() ->
    ?assertEqual(<<"cannot reach a@127.0.0.1 from this VM: its distribution would need "
                   "-proto_dist inet_tls -ssl_dist_optfile FILE; the beamdiag escript starts "
                   "itself so, a VM of your own must be started with those flags">>,
                 text({own_dist, ?N, [{"-proto_dist", ["inet_tls"]}, {"-ssl_dist_optfile", []}]})),
    ?assertMatch({_, _}, binary:match(text({own_dist, ?N, [{"-epmd_module", ["beamdiag_epmd"]}]}),
                                      <<"would need -epmd_module beamdiag_epmd;">>)).

%% The TLS reasons are said by the modules that know them.
tls_sentences_test() ->
    ?assertEqual(iolist_to_binary(["cannot reach a@127.0.0.1 over TLS: ",
                                   beamdiag_attach_plan:format_error(no_tls_options)]),
                 text({unreachable, ?N, {tls_options, {beamdiag_attach_plan, no_tls_options}}})),
    Alert = {tls_alert, {certificate_required, "required\n"}},
    ?assertEqual(iolist_to_binary(["cannot reach a@127.0.0.1: TLS refused: ",
                                   beamdiag_dist_probe:format_error({tls, Alert})]),
                 text({unreachable, ?N, {tls, Alert}})).

%%%===================================================================
%%% Errors before any distribution
%%%===================================================================

%% Each of these is found before this VM would start distribution: it
%% stays undistributed.
before_distribution_test_() ->
    {foreach, fun() -> ok end, fun(_) -> ?assertEqual(nonode@nohost, node()) end, [
        ?_assertEqual({error, {beamdiag_node_name, {bad_node, "no-at-sign"}}},
                      beamdiag_remote:connect("no-at-sign", #{})),
        ?_assertEqual({error, {beamdiag_node_name, {bad_node, "a b@c"}}},
                      beamdiag_remote:connect(<<"a b@c">>, #{cookie => "c"})),
        ?_assertEqual({error, {beamdiag_node_name, {bad_node, "x"}}},
                      beamdiag_remote:attach("x", #{})),
        ?_assertEqual({error, {beamdiag_node_name, {bad_node, "x"}}},
                      beamdiag_remote:distribute("x")),
        ?_assertEqual({error, {beamdiag_remote, {bad_cookie, {length, 300}}}},
                      beamdiag_remote:connect("app@127.0.0.1",
                                              #{cookie => lists:duplicate(300, $a)})),
        ?_assertEqual({error, {beamdiag_remote, {cookie_file, "/nonexistent/cookie", enoent}}},
                      beamdiag_remote:connect("app@127.0.0.1",
                                              #{cookie_file => "/nonexistent/cookie"})),
        ?_assertEqual({error, {beamdiag_remote,
                               {unreachable, 'app@127.0.0.1',
                                {tls_options, {beamdiag_attach_plan, {unknown_proto, "bogus"}}}}}},
                      beamdiag_remote:connect("app@127.0.0.1", #{cookie => "c", host => false,
                                                                 proto_dist => "bogus"})),
        ?_assertEqual({error, {beamdiag_remote,
                               {unreachable, 'app@127.0.0.1',
                                {tls_options, {beamdiag_attach_plan, no_tls_options}}}}},
                      beamdiag_remote:attach("app@127.0.0.1", #{cookie => "c", host => false,
                                                                proto_dist => "inet_tls"})),
        %% This VM speaks inet_tcp: a node of another protocol needs it
        %% started again with the flag.
        ?_assertEqual({error, {beamdiag_remote, {own_dist, 'app@127.0.0.1',
                                                 [{"-proto_dist", ["inet6_tcp"]}]}}},
                      beamdiag_remote:attach("app@127.0.0.1", #{cookie => "c", host => false,
                                                                proto_dist => "inet6_tcp"})),
        %% A plan given whole is followed as it is.
        ?_assertEqual({error, {beamdiag_remote, no_cookie}},
                      beamdiag_remote:attach("ignored@host",
                                             #{plan => plan(#{cookie_error => no_cookie})})),
        ?_assertEqual({error, {beamdiag_attach_plan, no_tls_options}},
                      beamdiag_remote:attach("ignored@host",
                                             #{plan => plan(#{cookie_error =>
                                                                  {beamdiag_attach_plan,
                                                                   no_tls_options}})})),
        ?_assertEqual(ok, beamdiag_remote:disconnect(node()))
    ]}.

%%%===================================================================
%%% Two peers: the operator (undistributed at first) and the target
%%%===================================================================

peers_test_() ->
    {setup, fun start_peers/0, fun stop_peers/1,
     fun(Ctx) ->
         [{timeout, 60, T} || T <- [
             {"a wrong cookie is said so, by its origin and hash", fun() -> wrong(Ctx) end},
             {"the right cookie: hidden, not listening", fun() -> right(Ctx) end},
             {"a name no epmd knows", fun() -> unknown(Ctx) end}
         ]]
     end}.

start_peers() ->
    Ebin = filename:dirname(code:which(beamdiag_remote)),
    %% Both over standard_io: the test node stays undistributed.
    {ok, T, TNode} = peer:start(#{name => peer:random_name(), connection => standard_io,
                                  args => ["-setcookie", "right"]}),
    {ok, Op, nonode@nohost} = peer:start(#{connection => standard_io, args => ["-pa", Ebin]}),
    #{target => T, target_node => TNode, op => Op}.

stop_peers(#{target := T, op := Op}) ->
    peer:stop(Op),
    peer:stop(T).

wrong(#{op := Op, target_node := TNode}) ->
    R = peer:call(Op, beamdiag_remote, connect, [atom_to_list(TNode), #{cookie => "wrong"}], 30000),
    ?assertEqual({error, {beamdiag_remote,
                          {unreachable, TNode,
                           {wrong_cookie, [{{cli, "--cookie"},
                                            beamdiag_attach_plan:cookie_hash(wrong)}]}}}},
                 R),
    ?assertEqual([], peer:call(Op, erlang, nodes, [connected])).

right(#{op := Op, target := T, target_node := TNode}) ->
    ?assertEqual({ok, TNode}, peer:call(Op, beamdiag_remote, connect,
                                        [atom_to_list(TNode), #{cookie => "right"}], 30000)),
    OpNode = peer:call(Op, erlang, node, []),
    ?assertMatch("beamdiag_" ++ _, atom_to_list(OpNode)),
    %% Hidden: the target lists it only among its hidden nodes.
    ?assertEqual([], peer:call(T, erlang, nodes, [])),
    ?assertEqual([OpNode], peer:call(T, erlang, nodes, [hidden])),
    %% Not listening: no epmd knows the operator.
    [Name, Host] = string:split(atom_to_list(OpNode), "@"),
    {ok, Names} = net_adm:names(Host),
    ?assertNot(lists:keymember(Name, 1, Names)),
    ?assertEqual(ok, peer:call(Op, beamdiag_remote, disconnect, [TNode])),
    ok = beamdiag_test_lib:await(fun() -> peer:call(Op, erlang, nodes, [hidden]) =:= [] end, 5000).

unknown(#{op := Op, target_node := TNode}) ->
    [TName, Host] = string:split(atom_to_list(TNode), "@"),
    Node = "nosuch_" ++ integer_to_list(erlang:unique_integer([positive])) ++ "@" ++ Host,
    {error, {beamdiag_remote, Why}} =
        peer:call(Op, beamdiag_remote, connect, [Node, #{cookie => "right"}], 30000),
    %% Registered there: the target among them, whatever else runs on the
    %% host.
    Names = case Why of
                {unreachable, _, {unknown_name, Ns}} -> Ns;
                {unreachable, _, not_registered, Ns} -> Ns
            end,
    ?assertEqual(list_to_atom(Node), element(2, Why)),
    ?assert(lists:member(TName, Names)).

%%% Helpers

text(Reason) ->
    iolist_to_binary(beamdiag_remote:format_error(Reason)).

%% A plan by hand, as beamdiag_attach_plan:plan/2 makes them.
plan(Extra) ->
    maps:merge(#{node => 'app@127.0.0.1', given => "app@127.0.0.1", mode => longnames,
                 local => true, cookies => [], proto => inet_tcp, proto_origin => default,
                 direct => false, rows => [], notes => []}, Extra).
