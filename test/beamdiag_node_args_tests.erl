%%% EUnit tests of beamdiag_node_args on fixtures and on hostile text.
%%%
%%% test/fixtures/attach/proc/4242 is a node recorded on OTP 25 (its
%%% cmdline and environment as /proc gave them): started by erl with
%%% ERL_AFLAGS, ERL_ZFLAGS, RELEASE_* in its environment, `-boot' in its
%%% release and `-args_file' its vm.args, which names a second args file
%%% (the files are under its `root', as /proc/PID/root shows a container's).
-module(beamdiag_node_args_tests).
-include_lib("eunit/include/eunit.hrl").

fixture(F) ->
    {ok, B} = file:read_file(filename:join(beamdiag_test_lib:fixture_dir("attach/proc/4242"), F)),
    B.

%% Files of the recorded node, by their path on its file system.
reader() ->
    Root = filename:join(beamdiag_test_lib:fixture_dir("attach/proc/4242"), "root"),
    fun(P) -> file:read_file(filename:join(Root, string:trim(P, leading, "/"))) end.

env() ->
    maps:from_list([list_to_tuple(binary:split(E, <<"=">>))
                    || E <- binary:split(fixture("environ"), <<0>>, [global, trim_all])]).

recorded() ->
    Flags = beamdiag_node_args:flags(beamdiag_node_args:init_args(
                                       beamdiag_node_args:argv(fixture("cmdline"))), init),
    S = beamdiag_node_args:settings(Flags, 25),
    {Raw, Problems} = beamdiag_node_args:raw_sources(
                        env(), {beamdiag_node_args:vm_args_paths(S, env()), reader()}),
    ?assertEqual([], Problems),
    beamdiag_node_args:attribute(S, Raw).

%%%===================================================================
%%% The recorded node
%%%===================================================================

recorded_values_test() ->
    S = recorded(),
    ?assertMatch(#{value := <<"app">>, mode := shortnames}, maps:get(name, S)),
    ?assertMatch(#{value := [<<"inet_tls">>]}, maps:get(proto_dist, S)),
    ?assertMatch(#{value := <<"/tmp/app/ssl_dist.conf">>}, maps:get(ssl_dist_optfile, S)),
    ?assertMatch(#{value := 9100}, maps:get(inet_dist_listen_min, S)),
    ?assertMatch(#{value := 9100}, maps:get(inet_dist_listen_max, S)),
    ?assertMatch(#{value := {127, 0, 0, 1}}, maps:get(inet_dist_use_interface, S)),
    ?assertMatch(#{value := true}, maps:get(hidden, S)),
    ?assertMatch(#{value := <<"/tmp/app/home">>}, maps:get(home, S)),
    ?assertMatch(#{value := <<"/tmp/app/releases/1.0/start">>}, maps:get(boot, S)),
    ?assertNot(maps:is_key(setcookie, S)),
    ?assertEqual([], maps:get(notes, S)).

%% Each setting is traced to the source that holds it: vm.args, the args
%% file it names, ERL_ZFLAGS; what only the command line holds stays so.
recorded_origins_test() ->
    S = recorded(),
    VmArgs = {file, <<"/tmp/app/releases/1.0/vm.args">>},
    Dist = {file, <<"/tmp/app/releases/1.0/dist.args">>},
    ?assertEqual(VmArgs, maps:get(origin, maps:get(name, S))),
    ?assertEqual(VmArgs, maps:get(origin, maps:get(proto_dist, S))),
    ?assertEqual(Dist, maps:get(origin, maps:get(ssl_dist_optfile, S))),
    ?assertEqual(Dist, maps:get(origin, maps:get(inet_dist_use_interface, S))),
    ?assertEqual(VmArgs, maps:get(origin, maps:get(inet_dist_listen_min, S))),
    ?assertEqual({env, <<"ERL_ZFLAGS">>}, maps:get(origin, maps:get(hidden, S))),
    ?assertEqual(command_line, maps:get(origin, maps:get(boot, S))).

recorded_release_test() ->
    S = recorded(),
    ?assertEqual([<<"/tmp/app">>, <<"/usr/lib/erlang">>],
                 beamdiag_node_args:release_roots(S, env())),
    ?assertEqual([<<"/tmp/app/releases/1.0/vm.args">>, <<"/usr/lib/erlang/releases/1.0/vm.args">>],
                 beamdiag_node_args:vm_args_paths(S, env())),
    ?assertEqual({<<"/tmp/app/home">>, {env, <<"HOME">>}},
                 beamdiag_node_args:home(S, env(), {none, undefined})),
    ?assertEqual(#{home => [<<"/tmp/app/home/.erlang.cookie">>,
                            <<"/tmp/app/home/.config/erlang/.erlang.cookie">>],
                   release => [<<"/tmp/app/releases/COOKIE">>]},
                 beamdiag_node_args:cookie_files(<<"/tmp/app/home">>, env(), [<<"/tmp/app">>])).

%%%===================================================================
%%% erlexec's and init's rules
%%%===================================================================

tokens_test_() ->
    T = fun(B, C) -> beamdiag_node_args:tokens(B, C) end,
    [?_assertEqual([<<"-a">>, <<"b c">>, <<"d'e">>, <<"f g">>],
                   T(<<"  -a \"b c\" \"d'e\" f\\ g ">>, false)),
     ?_assertEqual([<<"-x">>, <<"1">>], T(<<"-x 1 # comment -y 2\n">>, true)),
     ?_assertEqual([<<"-x">>, <<"#1">>], T(<<"-x #1">>, false)),
     ?_assertEqual([<<"a">>], T(<<"a# no space before the comment">>, true)),
     ?_assertEqual([<<"'q'">>], T(<<"\"'q'\"">>, false)),
     ?_assertEqual([<<>>], T(<<"\"\"">>, false)),
     ?_assertEqual([], T(<<"\n\t  \r">>, true)),
     %% An unterminated quote runs to the end, as erlexec's does.
     ?_assertEqual([<<"-s">>, <<"open end">>], T(<<"-s \"open end">>, false)),
     ?_assertEqual([<<"a">>], T(<<"a\\">>, false))].

flags_test_() ->
    F = fun(L, M) -> [{N, V} || {N, V, _} <- beamdiag_node_args:flags(
                                                 beamdiag_node_args:tag(L, command_line), M)] end,
    [?_assertEqual([{<<"sname">>, [<<"a">>]}, {<<"kernel">>, [<<"k">>, <<"v">>]}],
                   F([<<"-sname">>, <<"a">>, <<"--">>, <<"-kernel">>, <<"k">>, <<"v">>], init)),
     %% `--' ends a flag's values; `-extra' ends the flags.
     ?_assertEqual([{<<"a">>, []}, {<<"b">>, [<<"x">>]}],
                   F([<<"-a">>, <<"--">>, <<"plain">>, <<"-b">>, <<"x">>, <<"-extra">>,
                      <<"-sname">>, <<"no">>], init)),
     %% `+' is a flag in raw sources only (init takes it as a value).
     ?_assertEqual([{<<"setcookie">>, [<<"+abc">>]}], F([<<"-setcookie">>, <<"+abc">>], init)),
     ?_assertEqual([{<<"setcookie">>, []}, {<<"+abc">>, []}],
                   F([<<"-setcookie">>, <<"+abc">>], raw))].

settings_rules_test_() ->
    S = fun(Args, Otp) ->
            beamdiag_node_args:settings(
              beamdiag_node_args:flags(beamdiag_node_args:tag(Args, command_line), init), Otp)
        end,
    [%% The first -sname, before any -name.
     ?_assertMatch(#{name := #{value := <<"a">>, mode := shortnames}},
                   S([<<"-name">>, <<"b@h.x">>, <<"-sname">>, <<"a">>, <<"-sname">>, <<"c">>], 25)),
     %% Two -setcookie: auth ignores both.
     ?_assertMatch(#{notes := [_]},
                   S([<<"-setcookie">>, <<"a">>, <<"-setcookie">>, <<"b">>], 25)),
     ?_assertNot(maps:is_key(setcookie, S([<<"-setcookie">>, <<"a">>, <<"-setcookie">>, <<"b">>],
                                          25))),
     %% -setcookie NODE COOKIE is another node's cookie.
     ?_assertMatch(#{setcookie := #{value := <<"own">>}},
                   S([<<"-setcookie">>, <<"other@h">>, <<"x">>, <<"-setcookie">>, <<"own">>], 25)),
     %% Two -proto_dist: none on OTP 25, the first later.
     ?_assertNot(maps:is_key(proto_dist, S([<<"-proto_dist">>, <<"inet_tls">>, <<"-proto_dist">>,
                                            <<"inet6_tcp">>], 25))),
     ?_assertMatch(#{proto_dist := #{value := [<<"inet_tls">>]}},
                   S([<<"-proto_dist">>, <<"inet_tls">>, <<"-proto_dist">>, <<"inet6_tcp">>], 29)),
     ?_assertMatch(#{erl_epmd_port := #{value := 9100}}, S([<<"-erl_epmd_port">>, <<"9100">>], 25)),
     ?_assertNot(maps:is_key(erl_epmd_port, S([<<"-erl_epmd_port">>, <<"91x0">>], 25))),
     ?_assertNot(maps:is_key(erl_epmd_port, S([<<"-erl_epmd_port">>, <<"1">>,
                                               <<"-erl_epmd_port">>, <<"2">>], 25))),
     %% The first value of a kernel parameter wins, as the node reads it.
     ?_assertMatch(#{inet_dist_listen_min := #{value := 100}},
                   S([<<"-kernel">>, <<"inet_dist_listen_min">>, <<"100">>, <<"-kernel">>,
                      <<"inet_dist_listen_min">>, <<"200">>], 25)),
     ?_assertMatch(#{kernel_epmd_module := #{value := my_epmd}},
                   S([<<"-kernel">>, <<"epmd_module">>, <<"my_epmd">>], 27)),
     ?_assertMatch(#{dist_listen := #{value := false}}, S([<<"-dist_listen">>, <<"false">>], 25)),
     ?_assertMatch(#{ssl_dist_opt := #{value := [{<<"client_certfile">>, <<"/c">>},
                                                 {<<"server_certfile">>, <<"/s">>}]}},
                   S([<<"-ssl_dist_opt">>, <<"client_certfile">>, <<"/c">>, <<"-ssl_dist_opt">>,
                      <<"server_certfile">>, <<"/s">>], 25))].

%% An -args_file on an emulator's own command line was not expanded by
%% erlexec: said, not followed.
unexpanded_args_file_test() ->
    S = beamdiag_node_args:settings(
          beamdiag_node_args:flags(beamdiag_node_args:tag([<<"-args_file">>, <<"/x">>], command_line),
                                   init), 25),
    ?assertEqual([<<"/x">>], maps:get(args_file, S)).

passwd_test_() ->
    P = <<"root:x:0:0:root:/root:/bin/bash\napp:x:1000:1000::/srv/app:/bin/sh\n"
          "broken line\nnohome:x:1001:1001:::/bin/sh\n">>,
    [?_assertEqual({ok, <<"/srv/app">>}, beamdiag_node_args:passwd_home(P, 1000)),
     ?_assertEqual(error, beamdiag_node_args:passwd_home(P, 1001)),
     ?_assertEqual(error, beamdiag_node_args:passwd_home(P, 7)),
     ?_assertEqual({<<"/srv/app">>, {passwd, 1000}},
                   beamdiag_node_args:home(#{}, #{}, {P, 1000})),
     ?_assertEqual(none, beamdiag_node_args:home(#{}, #{}, {none, 1000}))].

ssl_options_test_() ->
    O = fun(B) -> beamdiag_node_args:ssl_options(B) end,
    [?_assertMatch({ok, [{server, [_]}, {client, []}]},
                   O(<<"[{server, [{verify, verify_none}]}, {client, []}].">>)),
     ?_assertEqual({error, not_a_list}, O(<<"{server, []}.">>)),
     ?_assertEqual({error, not_server_client_lists}, O(<<"[{other, []}].">>)),
     %% Nothing is evaluated: a call is no term.
     ?_assertEqual({error, not_a_term}, O(<<"[{client, [{certfile, os:cmd(\"touch /x\")}]}].">>)),
     ?_assertEqual({error, not_a_term}, O(<<"[{client, []}]">>)),
     ?_assertEqual({error, not_a_term}, O(<<255, 0, 1>>)),
     ?_assertEqual({error, too_large}, O(binary:copy(<<" ">>, 70000)))].

%%%===================================================================
%%% Hostile input
%%%===================================================================

%% Args files that name each other, or themselves: followed once each,
%% the loop said.
args_file_loop_test() ->
    Files = #{<<"/a">> => <<"-x 1 -args_file /b">>, <<"/b">> => <<"-args_file /a -y 2">>},
    Reader = fun(P) -> case maps:find(P, Files) of {ok, B} -> {ok, B}; error -> {error, enoent} end end,
    {Args, Problems} = beamdiag_node_args:expand(
                         beamdiag_node_args:tag([<<"-args_file">>, <<"/a">>], command_line), Reader),
    ?assertEqual([<<"-x">>, <<"1">>, <<"-y">>, <<"2">>],
                 [A || {A, _} <- Args, A =/= <<"--">>]),
    ?assertEqual([{<<"/a">>, loop}], Problems).

args_file_depth_and_count_test() ->
    %% Each file names the next: the walk stops at 16 deep.
    Reader = fun(<<"/f", N/binary>>) ->
                     Next = integer_to_binary(binary_to_integer(N) + 1),
                     {ok, <<"-v ", N/binary, " -args_file /f", Next/binary>>}
             end,
    {Args, Problems} = beamdiag_node_args:expand(
                         beamdiag_node_args:tag([<<"-args_file">>, <<"/f0">>], command_line), Reader),
    ?assertEqual(16, length([A || {A, _} <- Args, A =:= <<"-v">>])),
    ?assertMatch([{_, too_deep}], Problems),
    %% A file naming itself many times: at most 64 files read.
    Self = fun(_) -> {ok, binary:copy(<<"-args_file /s ">>, 200)} end,
    {_, P2} = beamdiag_node_args:expand(
                beamdiag_node_args:tag([<<"-args_file">>, <<"/s">>], command_line), Self),
    ?assert(length(P2) =< 200),
    ?assertEqual([loop], lists:usort([W || {_, W} <- P2])).

args_file_errors_test() ->
    Reader = fun(_) -> {error, eacces} end,
    ?assertEqual({[], [{<<"/nope">>, eacces}]},
                 beamdiag_node_args:expand(
                   beamdiag_node_args:tag([<<"-args_file">>, <<"/nope">>], command_line), Reader)),
    ?assertEqual({[], [{<<"-args_file">>, no_file_name}]},
                 beamdiag_node_args:expand(
                   beamdiag_node_args:tag([<<"-args_file">>], command_line), Reader)).

%% A kernel value is read as a term and never run; a value that is no
%% term is said and left out.
kernel_values_test_() ->
    S = fun(V) ->
            beamdiag_node_args:settings(
              beamdiag_node_args:flags(
                beamdiag_node_args:tag([<<"-kernel">>, <<"inet_dist_use_interface">>, V],
                                       command_line), init), 25)
        end,
    [?_assertNot(maps:is_key(inet_dist_use_interface, S(<<"os:cmd(\"id\")">>))),
     ?_assertMatch(#{notes := [_]}, S(<<"{{{">>)),
     ?_assertMatch(#{inet_dist_use_interface := #{value := {0, 0, 0, 0, 0, 0, 0, 1}}},
                   S(<<"{0,0,0,0,0,0,0,1}">>)),
     ?_assertEqual({error, too_large}, beamdiag_node_args:kernel_term(binary:copy(<<"1">>, 70000)))].

%% Random bytes as a command line, an environment and an args file: no
%% crash, and what comes out is bounded.
random_bytes_test() ->
    rand:seed(exsss, {29, 25, 2026}),
    lists:foreach(
        fun(_) ->
            Bin = rand:bytes(rand:uniform(4000)),
            Mixed = iolist_to_binary([case rand:uniform(6) of
                                          1 -> <<0>>;
                                          2 -> <<"-sname">>;
                                          3 -> <<"-args_file">>;
                                          4 -> <<"-kernel inet_dist_listen_min">>;
                                          5 -> <<"\"">>;
                                          6 -> rand:bytes(5)
                                      end || _ <- lists:seq(1, 200)]),
            [begin
                 Argv = beamdiag_node_args:argv(B),
                 Flags = beamdiag_node_args:flags(beamdiag_node_args:init_args(Argv), init),
                 S = beamdiag_node_args:settings(Flags, 25),
                 ?assert(is_map(S)),
                 Toks = beamdiag_node_args:tokens(B, true),
                 ?assert(length(Toks) =< 100000),
                 {_, _} = beamdiag_node_args:expand(
                            beamdiag_node_args:tag(Toks, command_line),
                            fun(_) -> {ok, B} end),
                 {_, _} = beamdiag_node_args:raw_sources(#{<<"ERL_FLAGS">> => B},
                                                         {[<<"/v">>], fun(_) -> {ok, B} end})
             end || B <- [Bin, Mixed]]
        end, lists:seq(1, 40)).

%% A vector of many arguments is cut at 65536; a flag's values at 1024.
bounds_test() ->
    Argv = beamdiag_node_args:argv(binary:copy(<<"x", 0>>, 70000)),
    ?assertEqual(65536, length(Argv)),
    [{<<"a">>, Vs, _}] = beamdiag_node_args:flags(
                           beamdiag_node_args:tag([<<"-a">> | lists:duplicate(5000, <<"v">>)],
                                                  command_line), init),
    ?assertEqual(1024, length(Vs)).

origin_text_test_() ->
    [?_assertMatch(<<"the ", _/binary>>, beamdiag_node_args:origin_text(O))
     || O <- [command_line, default, {env, <<"ERL_FLAGS">>}, {file, <<"/a/vm.args">>},
              {passwd, 1000}]].
