%%% EUnit tests of the host-side reading of a node's settings
%%% (beamdiag_node_settings, beamdiag_host_locate's status and sockets) and
%%% of the plan made from them (beamdiag_attach_plan), on a recorded /proc tree:
%%% test/fixtures/attach/proc/4242 is an OTP 25 node in a mount and PID
%%% namespace of its own (its ns/mnt differs from self's; NSpid 4242 7),
%%% running as user 1000, whose files are read through its `root'.
-module(beamdiag_node_settings_tests).
-include_lib("eunit/include/eunit.hrl").
-include_lib("kernel/include/file.hrl").

root() -> beamdiag_test_lib:fixture_dir("attach/proc").

read() -> beamdiag_node_settings:read(4242, #{proc_root => root()}).

settings_test() ->
    S = read(),
    ?assertMatch(#{os_pid := 4242, otp := 25, uid := 1000, env_readable := true}, S),
    ?assertEqual({<<"/tmp/app/home">>, {env, <<"HOME">>}}, maps:get(home, S)),
    ?assertEqual([<<"/tmp/app">>, <<"/usr/lib/erlang">>], maps:get(release_roots, S)),
    %% Through the node's own root, as a container's.
    #{fs := #{root := FsRoot}} = S,
    ?assertEqual(iolist_to_binary(filename:join([root(), "4242", "root"])), FsRoot),
    Args = maps:get(args, S),
    ?assertEqual({file, <<"/tmp/app/releases/1.0/vm.args">>},
                 maps:get(origin, maps:get(proto_dist, Args))),
    ?assertEqual([], maps:get(notes, S)).

%% Its cookies, most likely first, each with where it was found: no
%% -setcookie and no RELEASE_COOKIE, so the release's file, then its home.
cookies_test() ->
    ?assertEqual([{<<"app_release_cookie">>, {release_file, <<"/tmp/app/releases/COOKIE">>}},
                  {<<"app_home_cookie">>, {home_file, <<"/tmp/app/home/.erlang.cookie">>}}],
                 maps:get(cookies, read())).

%% The client part of its TLS options, its files as this host reaches them.
tls_test() ->
    ?assertMatch(#{optfile := <<"/tmp/app/ssl_dist.conf">>,
                   origin := {file, <<"/tmp/app/releases/1.0/dist.args">>},
                   client := [{verify, verify_none}]},
                 maps:get(tls, read())).

listen_test() ->
    %% Of the two listening sockets in its namespace, it holds the first.
    ?assertEqual([{{127, 0, 0, 1}, 9100}], maps:get(listen, read())),
    ?assertEqual([{{127, 0, 0, 1}, 9100}], beamdiag_host_locate:listen_sockets(root(), 4242)).

status_test() ->
    ?assertEqual({ok, #{uid => 1000, ns_pid => [4242, 7]}},
                 beamdiag_host_locate:status(root(), 4242)),
    ?assertMatch({error, _}, beamdiag_host_locate:status(root(), 1)).

%% A pid given as the node sees itself in its namespace is the host's.
ns_pid_test_() ->
    [?_assertEqual({ok, #{os_pid => 4242, how => ns_pid, comm => <<"beam.smp">>, ns_pid => 7}},
                   beamdiag_host_locate:locate(7, #{proc_root => root()})),
     ?_assertMatch({ok, #{os_pid := 4242, how := given, ns_pid := 7}},
                   beamdiag_host_locate:locate(4242, #{proc_root => root()})),
     ?_assertEqual({error, {beamdiag_host_locate, {no_such_pid, 8}}},
                   beamdiag_host_locate:locate(8, #{proc_root => root()}))].

parse_listen_test() ->
    Tcp6 = <<"  sl  local_address                         remote_address st\n"
             "   0: 00000000000000000000000001000000:9C41 00000000000000000000000000000000:0000 0A "
             "00000000:00000000 00:00000000 00000000     0        0 999 1 0 100 0 0 10 0\n"
             "   1: 00000000000000000000000000000000:0050 00000000000000000000000000000000:0000 01 "
             "00000000:00000000 00:00000000 00000000     0        0 998 1 0 100 0 0 10 0\n"
             "   2: garbage\n">>,
    ?assertEqual([{{0, 0, 0, 0, 0, 0, 0, 1}, 40001, 999}], beamdiag_host_locate:parse_listen(Tcp6)),
    ?assertEqual([], beamdiag_host_locate:parse_listen(<<>>)),
    ?assertEqual([], beamdiag_host_locate:parse_listen(<<"header only\n">>)).

%% The plan made from the node's settings: its own name, protocol, TLS
%% options, cookies in order (then the user's own); a report shows each
%% setting's origin and never a cookie.
plan_test() ->
    {ok, Here} = inet:gethostname(),
    Given = "app@localhost",
    Located = {ok, #{os_pid => 4242, how => cmdline, comm => <<"beam.smp">>, epmd => no_answer}},
    {ok, P} = beamdiag_attach_plan:plan(Given, #{located => Located, proc_root => root(),
                                            probe_timeout => 1}),
    ?assertEqual(list_to_atom("app@" ++ hd(string:split(Here, "."))), maps:get(node, P)),
    ?assertMatch(#{mode := shortnames, proto := inet_tls, local := true}, P),
    ?assertMatch(#{tls := #{client := [{verify, verify_none}]}}, P),
    [{C1, {release_file, _}}, {C2, {home_file, _}} | _] = maps:get(cookies, P),
    ?assertEqual({app_release_cookie, app_home_cookie}, {C1, C2}),
    Pub = beamdiag_attach_plan:public(P, 2),
    Text = iolist_to_binary(io_lib:format("~p", [Pub])),
    ?assertEqual(nomatch, binary:match(Text, <<"app_release_cookie">>)),
    ?assertEqual(nomatch, binary:match(Text, <<"app_home_cookie">>)),
    ?assertMatch(#{cookie := #{from := <<"the cookie file in the home of the node's user, "
                                         "/tmp/app/home/.erlang.cookie">>}}, Pub),
    Rows = maps:get(settings, Pub),
    ?assertEqual([<<"-proto_dist in the file /tmp/app/releases/1.0/vm.args">>],
                 [F || #{setting := <<"distribution">>, from := F} <- Rows]),
    ?assertEqual([<<"-kernel inet_dist_use_interface in the file /tmp/app/releases/1.0/dist.args">>],
                 [F || #{setting := <<"inet_dist_use_interface">>, from := F} <- Rows]),
    %% The text report says the same.
    Lines = iolist_to_binary(beamdiag_format_text:attach(Pub)),
    ?assertMatch({_, _}, binary:match(Lines, <<"cookie ", (beamdiag_attach_plan:cookie_hash(C2))/binary>>)),
    ?assertEqual(nomatch, binary:match(Lines, <<"app_home_cookie">>)).

%% What this VM lacks to follow a TLS plan, and the flags to start it with.
missing_test() ->
    Located = {ok, #{os_pid => 4242, how => cmdline, comm => <<"beam.smp">>, epmd => no_answer}},
    {ok, P} = beamdiag_attach_plan:plan("app@localhost", #{located => Located, proc_root => root(),
                                                      probe_timeout => 1}),
    Missing = beamdiag_attach_relaunch:missing(P),
    ?assertEqual({"-proto_dist", ["inet_tls"]}, lists:keyfind("-proto_dist", 1, Missing)),
    ?assert(lists:keymember("-ssl_dist_optfile", 1, Missing)),
    {ok, Flags, Dir} = beamdiag_attach_relaunch:relaunch_flags(P),
    try
        [File] = [F || {"-ssl_dist_optfile", F} <- pairs(Flags)],
        ?assertEqual({ok, [[{client, [{verify, verify_none}]}]]}, file:consult(File)),
        {ok, #file_info{mode = Mode}} = file:read_file_info(File),
        ?assertEqual(8#600, Mode band 8#777)
    after
        file:del_dir_r(Dir)
    end.

pairs([F, V | T]) -> [{F, V} | pairs(T)];
pairs(_) -> [].

cookie_hash_test_() ->
    [?_assertMatch(<<"sha256:", _:8/binary>>, beamdiag_attach_plan:cookie_hash(<<"c">>)),
     ?_assertEqual(beamdiag_attach_plan:cookie_hash(c), beamdiag_attach_plan:cookie_hash(<<"c">>)),
     ?_assertNotEqual(beamdiag_attach_plan:cookie_hash(a), beamdiag_attach_plan:cookie_hash(b))].

format_error_test_() ->
    [?_test(beamdiag_test_lib:sentence(beamdiag_attach_plan:format_error(R)))
     || R <- [{unreadable_optfile, "/o", eacces}, {bad_optfile, "/o", not_a_list},
              {unreadable_tls_file, keyfile, "/k", enoent}, no_tls_options,
              {unknown_proto, "quic"}]] ++
    [?_test(beamdiag_test_lib:sentence(beamdiag_dist_probe:format_error(R)))
     || R <- [{tcp, econnrefused}, {tcp, timeout}, {tcp, ehostunreach}, not_distribution,
              {tls, {tls_alert, {certificate_required, "x"}}},
              {tls, {options, {keyfile, "/k", {error, eacces}}}}, {tls, closed},
              {tls, {no_ssl, x}}, {tls, other}, {crashed, x}]].

%% A Mix release that starts distribution itself: named by RELEASE_NODE
%% and RELEASE_DISTRIBUTION, its cookie RELEASE_COOKIE first.
release_env_test() ->
    S = beamdiag_node_settings:read(4343, #{proc_root => root()}),
    ?assertEqual(#{value => <<"shop">>, mode => shortnames, origin => {env, <<"RELEASE_NODE">>}},
                 maps:get(name, maps:get(args, S))),
    ?assertMatch([{<<"from_release_env">>, {env, <<"RELEASE_COOKIE">>}} | _], maps:get(cookies, S)).
