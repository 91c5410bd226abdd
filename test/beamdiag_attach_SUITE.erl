%%% Attaching to nodes as production runs them, on OTP 25 (this host) and
%%% OTP 29 (sid's root, a mount namespace of its own, as a container): the
%%% built escript diagnoses each node given its name alone, and the JSON
%%% report says how it was reached and where each setting came from.
%%%
%%% Nodes (one per set-up, started at once per group and shared): TLS
%%% distribution from ERL_FLAGS with verify_none, mutual TLS
%%% (verify_peer, fail_if_no_peer_cert) from the command line, an epmd
%%% module that registers nowhere, -erl_epmd_port with no epmd to register
%%% in, -proto_dist inet6_tcp named on ::1, long names on 127.0.0.1, a
%%% cookie only in the release's releases/COOKIE, and one only in the home
%%% of the user the node runs as. The certificates are made here
%%% (openssl). Each case asserts the raw signal first (the agent ran on
%%% that node: its OTP release and samples), then the attach section: the
%%% node's name, the cookie's origin and hash (the hash of the node's own
%%% cookie, which never appears in the output), the protocol, the port and
%%% their origins.
%%%
%%% On OTP 25 also: each error has its own sentence, exit 3 and the
%%% host-only report (a wrong cookie, TLS refused, the port closed, a key
%%% that cannot be read); a name no node has exits 3 without a report;
%%% `diagnose' without a node lists the VMs of a host with several and
%%% diagnoses the one of a PID namespace with one; and an OTP 29 VM
%%% reaches the epmd-less node through beamdiag_epmd set at run time (the
%%% CLI side on 29: the kernel's epmd_module parameter).
-module(beamdiag_attach_SUITE).
-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0, groups/0, suite/0, init_per_suite/1, end_per_suite/1,
         init_per_group/2, end_per_group/2]).
-export([tls_verify_none/1, tls_mutual/1, no_epmd_module/1, erl_epmd_port/1, ipv6/1,
         long_names/1, release_cookie/1, home_cookie/1]).
-export([wrong_cookie/1, tls_refused/1, port_closed/1, key_unreadable/1, name_unknown/1,
         dist_port_by_hand/1,
         no_node_several/1, no_node_one/1, cli29_epmd_module/1]).

-define(WINDOW, "2").
%% The node kinds, each a case of the same name.
-define(KINDS, [tls_verify_none, tls_mutual, no_epmd_module, erl_epmd_port, ipv6, long_names,
                release_cookie, home_cookie]).

suite() -> [{timetrap, {minutes, 4}}].

all() ->
    [{group, otp25}, {group, otp29}].

%% The nodes of a release are started once; their cases run three at a
%% time (eight diagnoses at once, each starting a VM and loading the
%% agent, starved this 2-core host of the CPU their reports need), with
%% at most one TLS node in a batch (each starts its VM again with TLS:
%% three relaunching diagnoses at once, the TLS one's report came 4.5 s
%% after the call, its agent's samples late).
groups() ->
    Batches = fun(Rel) ->
                  [{group, list_to_atom(lists:concat(["batch", Rel, "_", I]))} || I <- [1, 2, 3]]
              end,
    Batch = fun(Rel, I, Cases) -> {list_to_atom(lists:concat(["batch", Rel, "_", I])), [parallel],
                                   Cases} end,
    [{otp25, [], [{group, nodes25}, {group, errors}, no_node_several, no_node_one]},
     {nodes25, [], Batches(25)},
     Batch(25, 1, [tls_verify_none, erl_epmd_port, long_names]),
     Batch(25, 2, [tls_mutual, release_cookie, home_cookie]),
     Batch(25, 3, [no_epmd_module, ipv6]),
     {errors, [parallel], [wrong_cookie, tls_refused, port_closed, key_unreadable, name_unknown,
                           dist_port_by_hand]},
     {otp29, [], [{group, nodes29}, cli29_epmd_module]},
     {nodes29, [], Batches(29)},
     Batch(29, 1, [tls_verify_none, erl_epmd_port, long_names]),
     Batch(29, 2, [tls_mutual, release_cookie, home_cookie]),
     Batch(29, 3, [no_epmd_module, ipv6])].

init_per_suite(Config) ->
    case {beamdiag_test_lib:escript(), os:find_executable("openssl")} of
        {{ok, E}, O} when O =/= false ->
            Certs = filename:join(?config(priv_dir, Config), "certs"),
            ok = make_certs(Certs),
            [{escript, E}, {certs, Certs} | Config];
        {error, _} ->
            beamdiag_test_lib:missing("the escript is not built (rebar3 escriptize)");
        {_, false} ->
            beamdiag_test_lib:missing("openssl is missing (scripts/setup.sh installs it)")
    end.

end_per_suite(_Config) ->
    ok.

init_per_group(otp25, Config) ->
    [{release, 25} | Config];
init_per_group(otp29, Config) ->
    case beamdiag_test_lib:otp_exec(29) of
        {ok, _} ->
            {ok, Root} = beamdiag_test_lib:otp_root(29),
            [{release, 29}, {root, Root} | Config];
        Skip ->
            Skip
    end;
init_per_group(G, Config) when G =:= nodes25; G =:= nodes29 ->
    Dir = work_dir(Config),
    T0 = erlang:monotonic_time(millisecond),
    Nodes = start_nodes(Dir, Config),
    ct:pal("OTP ~b: ~b nodes started in ~b ms: ~p",
           [?config(release, Config), length(Nodes), erlang:monotonic_time(millisecond) - T0,
            [{K, maps:get(node, N)} || {K, N} <- Nodes]]),
    [{work, Dir}, {nodes, Nodes} | Config];
init_per_group(errors, Config) ->
    %% The nodes the errors are made against.
    Dir = work_dir(Config),
    Kinds = [tls_mutual, long_names, home_cookie],
    Nodes = start_nodes(Dir, [{kinds, Kinds} | Config]),
    [{work, Dir}, {nodes, Nodes} | Config];
init_per_group(_, Config) ->
    Config.

end_per_group(G, Config) when G =:= nodes25; G =:= nodes29; G =:= errors ->
    _ = [beamdiag_test_lib:stop_node(P) || {_, #{peer := P}} <- ?config(nodes, Config)],
    _ = os:cmd("rm -rf '" ++ host_path(Config, ?config(work, Config)) ++ "'"),
    ok;
end_per_group(_, _Config) ->
    ok.

%%%===================================================================
%%% Cases: the set-ups, each diagnosed by its name alone
%%%===================================================================

tls_verify_none(Config) ->
    {J, A} = diagnose_kind(tls_verify_none, Config),
    _ = J,
    ?assertEqual(<<"inet_tls">>, value(A, <<"distribution">>)),
    from(A, <<"distribution">>, <<"-proto_dist in the node's environment variable ERL_FLAGS">>),
    from(A, <<"TLS options">>, <<"-ssl_dist_optfile in the node's environment variable ERL_FLAGS">>),
    cookie_from(A, <<"-setcookie on the command line">>),
    port_from(A, <<"epmd">>).

tls_mutual(Config) ->
    {_J, A} = diagnose_kind(tls_mutual, Config),
    ?assertEqual(<<"inet_tls">>, value(A, <<"distribution">>)),
    from(A, <<"distribution">>, <<"-proto_dist on the command line">>),
    from(A, <<"TLS options">>, <<"-ssl_dist_optfile on the command line">>),
    ?assertMatch({_, _}, binary:match(value(A, <<"TLS options">>), <<"tls_mutual.conf">>)),
    cookie_from(A, <<"-setcookie on the command line">>).

no_epmd_module(Config) ->
    {_J, A} = diagnose_kind(no_epmd_module, Config),
    ?assertEqual(<<"beamdiag_noepmd">>, value(A, <<"epmd module">>)),
    from(A, <<"epmd module">>, <<"-epmd_module on the command line">>),
    port_from(A, <<"the socket the node listens on (it is registered in no epmd)">>),
    #{<<"port">> := #{<<"confirmed">> := true, <<"epmd">> := false}} = A.

erl_epmd_port(Config) ->
    #{port := Port} = node_of(erl_epmd_port, Config),
    {_J, A} = diagnose_kind(erl_epmd_port, Config),
    from(A, <<"port">>, <<"-erl_epmd_port on the command line, confirmed by a handshake">>),
    ?assertEqual(integer_to_binary(Port), hd(binary:split(value(A, <<"port">>), <<" ">>))),
    #{<<"port">> := #{<<"confirmed">> := true, <<"epmd">> := false}} = A.

ipv6(Config) ->
    {_J, A} = diagnose_kind(ipv6, Config),
    ?assertEqual(<<"inet6_tcp">>, value(A, <<"distribution">>)),
    ?assertEqual(<<"longnames">>, maps:get(<<"mode">>, A)),
    #{<<"port">> := #{<<"address">> := <<"::1">>}} = A.

long_names(Config) ->
    {_J, A} = diagnose_kind(long_names, Config),
    ?assertEqual(<<"longnames">>, maps:get(<<"mode">>, A)),
    from(A, <<"name">>, <<"-name on the command line">>),
    port_from(A, <<"epmd">>).

release_cookie(Config) ->
    #{dir := Dir} = node_of(release_cookie, Config),
    {_J, A} = diagnose_kind(release_cookie, Config),
    cookie_from(A, iolist_to_binary(["the release's cookie file ", Dir,
                                     "/rel/releases/COOKIE"])).

home_cookie(Config) ->
    #{dir := Dir} = node_of(home_cookie, Config),
    {_J, A} = diagnose_kind(home_cookie, Config),
    cookie_from(A, iolist_to_binary(["the cookie file in the home of the node's user, ", Dir,
                                     "/home_c/.erlang.cookie"])),
    from(A, <<"home">>, <<"HOME in the node's environment">>).

%%%===================================================================
%%% Cases: errors, each its own sentence, exit 3 and the host's report
%%%===================================================================

wrong_cookie(Config) ->
    Wrong = filename:join(?config(priv_dir, Config), "wrong.cookie"),
    ok = file:write_file(Wrong, <<"not_the_cookie">>),
    N = node_of(home_cookie, Config),
    {J, Err} = unreached(N, ["--cookie-file", Wrong], Config),
    sentence(Err, <<"wrong cookie">>),
    ?assertMatch({_, _}, binary:match(Err, <<"the file ", (list_to_binary(Wrong))/binary>>)),
    ?assertEqual(nomatch, binary:match(Err, <<"not_the_cookie">>)),
    _ = J.

tls_refused(Config) ->
    N = node_of(tls_mutual, Config),
    %% A client with no certificate: the node demands one.
    {_J, Err} = unreached(N, ["--ssl-dist-optfile", conf(Config, "tls_none.conf")], Config),
    sentence(Err, <<"TLS refused">>),
    ?assertMatch({_, _}, re:run(Err, <<"client certificate|certificate_required|handshake">>)),
    ?assertEqual(nomatch, binary:match(Err, <<"cookie">>)).

port_closed(Config) ->
    N = node_of(long_names, Config),
    Closed = integer_to_list(closed_port()),
    {_J, Err} = unreached(N, ["--dist-port", Closed], Config),
    sentence(Err, iolist_to_binary(["distribution port ", Closed, " on 127.0.0.1 is closed"])).

key_unreadable(Config) ->
    N = node_of(tls_mutual, Config),
    Conf = filename:join(?config(priv_dir, Config), "missing_key.conf"),
    Key = filename:join(?config(priv_dir, Config), "no_such.key"),
    ok = file:write_file(Conf, io_lib:format("~p.~n", [[{client, [{certfile, cert(Config, "node.pem")},
                                                                 {keyfile, Key}]}]])),
    {_J, Err} = unreached(N, ["--ssl-dist-optfile", Conf], Config),
    sentence(Err, iolist_to_binary(["cannot read the TLS key file ", Key])).

%% The port given by hand (as for a node on another host): reached there,
%% without epmd, and the report says so.
dist_port_by_hand(Config) ->
    #{node := Node, os_pid := OsPid, cookie := Cookie} = node_of(long_names, Config),
    [{_, Port}] = beamdiag_host_locate:listen_sockets("/proc", list_to_integer(OsPid)),
    {Code, Out, Err} = escript(Config, ["diagnose", atom_to_list(Node), "--json", "--duration",
                                        ?WINDOW, "--dist-port", integer_to_list(Port)], []),
    ct:pal("exit ~b~n~ts", [Code, Err]),
    ?assertEqual(0, Code),
    J = beamdiag_test_json:decode(Out),
    agent_ran(dist_port_by_hand, J),
    ?assertEqual(<<"25">>, maps:get(<<"otp_release">>, J)),
    A = maps:get(<<"attach">>, J),
    ?assertMatch(#{<<"port">> := #{<<"port">> := Port, <<"epmd">> := false,
                                   <<"from">> := <<"beamdiag's --dist-port">>}}, A),
    ?assertEqual(beamdiag_attach_plan:cookie_hash(Cookie),
                 maps:get(<<"hash">>, maps:get(<<"cookie">>, A))).

name_unknown(Config) ->
    Ghost = "attach_ghost_" ++ os:getpid() ++ "@localhost",
    {Code, Out, Err} = escript(Config, ["diagnose", Ghost, "--duration", ?WINDOW], []),
    ct:pal("exit ~b~n~ts", [Code, Err]),
    ?assertEqual(3, Code),
    ?assertEqual(<<>>, Out),
    ?assertNotEqual(nomatch, string:find(Err, "name unknown: no Erlang VM on this host was "
                                              "started with that name")).

%%%===================================================================
%%% Cases: no node given
%%%===================================================================

%% This host runs several VMs (this one, and a peer started here so that
%% the case does not depend on what else the host runs): they are listed,
%% with how to pick one, and exit 2.
no_node_several(Config) ->
    {ok, Peer, _} = peer:start_link(#{name => peer:random_name(), connection => standard_io}),
    try
        no_node_several(Config, list_to_integer(peer:call(Peer, os, getpid, [])))
    after
        peer:stop(Peer)
    end.

no_node_several(Config, PeerPid) ->
    %% The raw fact: the beams this host runs, from /proc.
    Beams = [P || {P, _} <- beamdiag_host_locate:beams("/proc")],
    ?assert(lists:member(PeerPid, Beams)),
    ?assert(length(Beams) >= 2),
    {Code, Out, Err} = escript(Config, ["diagnose", "--duration", ?WINDOW], []),
    ct:pal("exit ~b~n~ts", [Code, Err]),
    ?assertEqual(2, Code),
    ?assertEqual(<<>>, Out),
    Me = list_to_integer(os:getpid()),
    %% This VM is one of them (it started the escript, but is no escript).
    ?assertMatch({match, _}, re:run(Err, ["\\s", integer_to_list(Me), "\\s+25\\s"])),
    ?assertNotEqual(nomatch, string:find(Err, "pick one: beamdiag diagnose NAME")).

%% A PID namespace with one node (and the escript): that node is diagnosed.
no_node_one(Config) ->
    Name = "attach_solo_" ++ os:getpid(),
    Cookie = "solo_" ++ integer_to_list(erlang:unique_integer([positive])),
    Script = lists:flatten(io_lib:format(
        "erl -noshell -sname ~s -setcookie ~s -eval 'timer:sleep(60000), halt().' & "
        "node=$!; for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do "
        "epmd -names | grep -q ' ~s ' && break; sleep 0.25; done; "
        "'~ts' diagnose --json --duration ~s; code=$?; kill $node; exit $code",
        [Name, Cookie, Name, ?config(escript, Config), ?WINDOW])),
    {Code, Out, Err} = beamdiag_test_lib:run_exe("/usr/bin/unshare",
                                                 ["--pid", "--fork", "--mount-proc", "/bin/sh",
                                                  "-c", Script],
                                                 [{"BEAMDIAG_COOKIE", false}]),
    ct:pal("exit ~b~n~ts", [Code, Err]),
    ?assertEqual(0, Code),
    J = beamdiag_test_json:decode(Out),
    ?assertEqual(<<"25">>, maps:get(<<"otp_release">>, J)),
    ?assert(maps:get(<<"samples">>, J) >= 2),
    {ok, Host} = inet:gethostname(),
    ?assertEqual(list_to_binary(Name ++ "@" ++ Host), maps:get(<<"node">>, maps:get(<<"attach">>, J))),
    ?assertNotEqual(nomatch, string:find(Err, "the only Erlang VM on this host")).

%% The CLI side on OTP 29: a VM of that release, not distributed, takes
%% beamdiag_epmd as its epmd module at run time (the kernel parameter) and
%% reaches the epmd-less node of OTP 29 at the port the plan found.
cli29_epmd_module(Config) ->
    Root = ?config(root, Config),
    Dir = work_dir(Config),
    HostDir = Root ++ Dir,
    ok = filelib:ensure_dir(filename:join(HostDir, "x")),
    %% The epmd module and the node names it splits with.
    _ = [begin
             Src = filename:join([beamdiag_test_lib:top(), "src", Folder, File]),
             {ok, _} = file:copy(Src, filename:join(HostDir, File)),
             ok = compile_in_root(Dir, File)
         end || {Folder, File} <- [{"host", "beamdiag_epmd.erl"}, {"base", "beamdiag_node_name.erl"}]],
    Nodes = start_nodes(Dir, [{kinds, [no_epmd_module]}, {work, Dir} | Config]),
    #{node := Target, cookie := Cookie} = proplists:get_value(no_epmd_module, Nodes),
    try
        {ok, Plan} = beamdiag_attach_plan:plan(atom_to_list(Target), #{cookie => Cookie}),
        #{direct := true, port := #{ip := Ip, port := Port}} = Plan,
        {ok, Exec} = beamdiag_test_lib:otp_exec(29),
        {ok, Cli, _} = peer:start(#{connection => standard_io, exec => Exec,
                                    args => ["-pa", Dir], wait_boot => 60000}),
        try
            ?assertEqual("29", peer:call(Cli, erlang, system_info, [otp_release])),
            ?assert(peer:call(Cli, beamdiag_epmd, use, [])),
            {ok, _} = peer:call(Cli, net_kernel, start,
                                [beamdiag_cli29, #{name_domain => shortnames,
                                                              hidden => true,
                                                              dist_listen => false}]),
            ok = peer:call(Cli, beamdiag_epmd, set, [Target, Ip, Port]),
            true = peer:call(Cli, erlang, set_cookie, [Target, Cookie]),
            ?assert(peer:call(Cli, net_kernel, connect_node, [Target])),
            ?assertEqual("29", peer:call(Cli, erpc, call, [Target, erlang, system_info,
                                                           [otp_release]]))
        after
            beamdiag_test_lib:stop_node(Cli)
        end
    after
        _ = [beamdiag_test_lib:stop_node(P) || {_, #{peer := P}} <- Nodes],
        os:cmd("rm -rf '" ++ HostDir ++ "'")
    end.

%%%===================================================================
%%% Helpers: nodes
%%%===================================================================

%% The group's folder as the nodes see it: under the priv folder on OTP
%% 25, under the root's /root on OTP 29 (the root's own file system).
work_dir(Config) ->
    Tag = "beamdiag_attach_" ++ os:getpid() ++ "_" ++ integer_to_list(erlang:unique_integer([positive])),
    case ?config(release, Config) of
        25 -> filename:join(?config(priv_dir, Config), Tag);
        _ -> filename:join("/root", Tag)
    end.

host_path(Config, Dir) ->
    case ?config(release, Config) of
        25 -> Dir;
        _ -> ?config(root, Config) ++ Dir
    end.

%% Starts every node kind of the group at once, each in a process of its
%% own (an OTP 29 node boots in seconds): [{Kind, Node}].
start_nodes(Dir, Config) ->
    Host = host_path(Config, Dir),
    ok = filelib:ensure_dir(filename:join(Host, "x")),
    ok = prepare(Dir, Config),
    Kinds = proplists:get_value(kinds, Config, ?KINDS),
    Self = self(),
    Pids = [{K, spawn(fun() -> Self ! {self(), catch start_node(K, Dir, Config)} end)}
            || K <- Kinds],
    Started = [{K, receive {P, R} -> R end} || {K, P} <- Pids],
    case [{K, R} || {K, R} <- Started, not is_map(R)] of
        [] -> Started;
        Bad ->
            _ = [beamdiag_test_lib:stop_node(P) || {_, #{peer := P}} <- Started],
            ct:fail({nodes_not_started, Bad})
    end.

start_node(Kind, Dir, Config) ->
    Rel = ?config(release, Config),
    Tag = atom_to_list(Kind) ++ "_" ++ os:getpid(),
    Cookie = list_to_atom("attach_" ++ integer_to_list(erlang:unique_integer([positive])) ++ "_"
                          ++ integer_to_list(rand:uniform(1 bsl 30))),
    C = atom_to_list(Cookie),
    {ok, Here} = inet:gethostname(),
    Short = Tag ++ "@" ++ Here,
    {Args, Env, Home, NodeName, Extra} =
        case Kind of
            tls_verify_none ->
                {["-sname", Tag, "-setcookie", C],
                 [{"ERL_FLAGS", "-proto_dist inet_tls -ssl_dist_optfile " ++
                                    filename:join(Dir, "tls_none.conf")}], none, Short, #{}};
            tls_mutual ->
                {["-sname", Tag, "-setcookie", C, "-proto_dist", "inet_tls",
                  "-ssl_dist_optfile", filename:join(Dir, "tls_mutual.conf")], [], none, Short, #{}};
            no_epmd_module ->
                {["-sname", Tag, "-setcookie", C, "-start_epmd", "false",
                  "-epmd_module", "beamdiag_noepmd", "-pa", Dir], [], none, Short, #{}};
            erl_epmd_port ->
                Port = free_port(),
                %% ERL_EPMD_PORT points at a closed port: there is no epmd to
                %% register in, as on a host that runs none.
                {["-sname", Tag, "-setcookie", C, "-start_epmd", "false",
                  "-erl_epmd_port", integer_to_list(Port)],
                 [{"ERL_EPMD_PORT", integer_to_list(closed_port())}], none, Short, #{port => Port}};
            ipv6 ->
                {["-proto_dist", "inet6_tcp", "-name", Tag ++ "@::1", "-setcookie", C], [], none,
                 Tag ++ "@::1", #{}};
            long_names ->
                {["-name", Tag ++ "@127.0.0.1", "-setcookie", C], [], none,
                 Tag ++ "@127.0.0.1", #{}};
            release_cookie ->
                %% The release's start script would pass it on; this node
                %% reads it at boot, so that nothing but the file holds it.
                File = filename:join(Dir, "rel/releases/COOKIE"),
                Eval = lists:flatten(io_lib:format(
                         "{ok, B} = file:read_file(\"~ts\"), "
                         "erlang:set_cookie(list_to_atom(string:trim(binary_to_list(B))))",
                         [File])),
                {["-boot", filename:join(Dir, "rel/releases/1.0/start"), "-sname", Tag,
                  "-eval", Eval], [], filename:join(Dir, "home_empty"), Short, #{}};
            home_cookie ->
                {["-sname", Tag], [], filename:join(Dir, "home_c"), Short, #{}}
        end,
    Cookie2 = case Kind of
                  release_cookie -> release_cookie_value();
                  home_cookie -> home_cookie_value();
                  _ -> Cookie
              end,
    Exec = exec(Rel, Home),
    EnvHome = case {Rel, Home} of
                  {25, none} -> [];
                  {25, H} -> [{"HOME", H}];
                  _ -> []
              end,
    {ok, Peer, _} = peer:start(#{connection => standard_io, exec => Exec, args => Args,
                                 env => Env ++ EnvHome, wait_boot => 90000}),
    OsPid = peer:call(Peer, os, getpid, [], 30000),
    %% The node is up and distributed as asked, with the cookie meant (the
    %% release's is set by its -eval, at the end of the boot).
    Node = list_to_atom(NodeName),
    Node = peer:call(Peer, erlang, node, [], 30000),
    {ok, Cookie2} = beamdiag_test_lib:poll(
                      fun() ->
                              case peer:call(Peer, erlang, get_cookie, [], 30000) of
                                  Cookie2 -> {true, Cookie2};
                                  Other -> {false, Other}
                              end
                      end, 10000),
    maps:merge(Extra, #{peer => Peer, node => Node, cookie => Cookie2, os_pid => OsPid,
                        dir => list_to_binary(Dir)}).

exec(25, _Home) ->
    {os:find_executable("erl"), []};
exec(29, none) ->
    {ok, E} = beamdiag_test_lib:otp_exec(29),
    E;
exec(29, Home) ->
    %% HOME inside the root (otp-run.sh sets /root).
    {Script, [Suite, "erl"]} = element(2, beamdiag_test_lib:otp_exec(29)),
    {Script, [Suite, "env", "HOME=" ++ Home, "erl"]}.

%% The files the nodes read, in the group's folder: TLS options (paths as
%% the nodes see them), the certificates, the epmd module compiled by the
%% group's OTP, a release with its own boot file and releases/COOKIE, and
%% the homes.
prepare(Dir, Config) ->
    Host = host_path(Config, Dir),
    Certs = ?config(certs, Config),
    _ = [{ok, _} = file:copy(filename:join(Certs, F), filename:join(Host, F))
         || F <- ["ca.pem", "node.pem", "node.key"]],
    In = fun(F) -> filename:join(Dir, F) end,
    ok = write_term(filename:join(Host, "tls_none.conf"),
                    [{server, [{certfile, In("node.pem")}, {keyfile, In("node.key")},
                               {verify, verify_none}]},
                     {client, [{verify, verify_none}]}]),
    ok = write_term(filename:join(Host, "tls_mutual.conf"),
                    [{server, [{certfile, In("node.pem")}, {keyfile, In("node.key")},
                               {cacertfile, In("ca.pem")}, {verify, verify_peer},
                               {fail_if_no_peer_cert, true}]},
                     {client, [{certfile, In("node.pem")}, {keyfile, In("node.key")},
                               {cacertfile, In("ca.pem")}, {verify, verify_peer}]}]),
    {ok, _} = file:copy(beamdiag_test_lib:fixture("attach/beamdiag_noepmd.erl.src"),
                        filename:join(Host, "beamdiag_noepmd.erl")),
    ok = case ?config(release, Config) of
             25 ->
                 {ok, _} = compile:file(filename:join(Host, "beamdiag_noepmd.erl"),
                                        [{outdir, Host}]),
                 ok;
             _ ->
                 compile_in_root(Dir, "beamdiag_noepmd.erl")
         end,
    Boot = case ?config(release, Config) of
               25 -> filename:join([code:root_dir(), "releases", "25", "start_clean.boot"]);
               R -> filename:join([?config(root, Config), "usr/lib/erlang/releases",
                                   integer_to_list(R), "start_clean.boot"])
           end,
    ok = filelib:ensure_dir(filename:join(Host, "rel/releases/1.0/x")),
    {ok, _} = file:copy(Boot, filename:join(Host, "rel/releases/1.0/start.boot")),
    ok = file:write_file(filename:join(Host, "rel/releases/COOKIE"),
                         [atom_to_list(release_cookie_value()), "\n"]),
    ok = filelib:ensure_dir(filename:join(Host, "home_empty/x")),
    ok = filelib:ensure_dir(filename:join(Host, "home_c/x")),
    HomeCookie = filename:join(Host, "home_c/.erlang.cookie"),
    ok = file:write_file(HomeCookie, atom_to_list(home_cookie_value())),
    ok = file:change_mode(HomeCookie, 8#400),
    ok.

release_cookie_value() -> list_to_atom("attach_release_" ++ os:getpid()).

home_cookie_value() -> list_to_atom("attach_home_" ++ os:getpid()).

compile_in_root(Dir, File) ->
    {Code, Out, Err} = beamdiag_test_lib:run_exe(beamdiag_test_lib:script("otp-run.sh"),
                                                 ["sid", "erlc", "-o", Dir,
                                                  filename:join(Dir, File)], []),
    case Code of
        0 -> ok;
        _ -> ct:fail({erlc_in_root, Out, Err})
    end.

write_term(File, Term) ->
    file:write_file(File, io_lib:format("~p.~n", [Term])).

conf(Config, F) ->
    filename:join(host_path(Config, ?config(work, Config)), F).

cert(Config, F) ->
    filename:join(?config(certs, Config), F).

node_of(Kind, Config) ->
    proplists:get_value(Kind, ?config(nodes, Config)).

%% A CA and a certificate for this host signed by it (names and
%% addresses the nodes use), made with openssl.
make_certs(Dir) ->
    ok = filelib:ensure_dir(filename:join(Dir, "x")),
    {ok, Host} = inet:gethostname(),
    Cmd = lists:flatten(io_lib:format(
        "cd '~ts' && "
        "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=beamdiag-test-ca "
        "-keyout ca.key -out ca.pem && "
        "openssl req -newkey rsa:2048 -nodes -subj /CN=~s -keyout node.key -out node.csr && "
        "printf 'subjectAltName=DNS:~s,DNS:localhost,IP:127.0.0.1,IP:::1\\n' > ext.cnf && "
        "openssl x509 -req -in node.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
        "-extfile ext.cnf -out node.pem && chmod 644 node.key",
        [Dir, Host, Host])),
    case beamdiag_test_lib:sh(["(", Cmd, ")"], 60000) of
        {0, _} -> ok;
        {_, Out} -> ct:fail({openssl, Out})
    end.

%% A port nothing listens on (bound, then closed).
closed_port() ->
    {ok, S} = gen_tcp:listen(0, [{ip, {127, 0, 0, 1}}]),
    {ok, P} = inet:port(S),
    ok = gen_tcp:close(S),
    P.

free_port() ->
    closed_port().

%%%===================================================================
%%% Helpers: the CLI
%%%===================================================================

escript(Config, Args, Env) ->
    %% No cookie from the test's own environment: the node's settings
    %% give it.
    T0 = erlang:monotonic_time(millisecond),
    Cpu0 = beamdiag_test_lib:host_cpu(),
    {Code, Out, Err} = beamdiag_test_lib:run_exe(?config(escript, Config), Args,
                                                 [{"BEAMDIAG_COOKIE", false} | Env]),
    %% The host's CPUs over the run, read by the test from /proc/stat: what
    %% excuses a late agent (agent_ran/2), never the report's own figure.
    put(host_busy, beamdiag_test_lib:host_busy_since(Cpu0)),
    ct:pal("~ts: exit ~b in ~b ms; the host's CPUs ~.2f busy", [lists:join(" ", Args), Code,
                                     erlang:monotonic_time(millisecond) - T0, get(host_busy)]),
    {Code, Out, list_to_binary(Err)}.

%% Diagnoses the node of a kind by its name alone: the raw signal (the
%% agent ran there: its release, its samples), no secret in the output,
%% the name, and the cookie's hash that of the node's own cookie.
diagnose_kind(Kind, Config) ->
    #{node := Node, cookie := Cookie} = node_of(Kind, Config),
    {Code, Out, Err} = escript(Config, ["diagnose", atom_to_list(Node), "--json",
                                        "--duration", ?WINDOW], []),
    ct:pal("~p exit ~b~n~ts", [Kind, Code, Err]),
    ?assertEqual(0, Code),
    J = beamdiag_test_json:decode(Out),
    agent_ran(Kind, J),
    ?assertEqual(integer_to_binary(?config(release, Config)), maps:get(<<"otp_release">>, J)),
    ?assert(maps:get(<<"samples">>, J) >= 2),
    ?assertEqual(nomatch, binary:match(<<Out/binary, Err/binary>>, atom_to_binary(Cookie))),
    A = maps:get(<<"attach">>, J),
    ct:pal("attach: ~p", [A]),
    ?assertEqual(atom_to_binary(Node), maps:get(<<"node">>, A)),
    #{<<"cookie">> := #{<<"hash">> := Hash}} = A,
    ?assertEqual(beamdiag_attach_plan:cookie_hash(Cookie), Hash),
    {J, A}.

%% The agent ran on the node. A node reached, whose agent's first samples
%% had not come by the time the report was due, gets the host's report:
%% on a host this busy (0.85 of its CPUs or more over the run, measured by
%% the test from /proc/stat, escript/3) it is a skip with the numbers,
%% never a pass; on a host with CPU to spare, a failure.
agent_ran(Kind, J = #{<<"host_only">> := true}) ->
    View = maps:get(<<"host_view">>, J),
    Busy = get(host_busy),
    case Busy >= 0.85 of
        true ->
            beamdiag_test_lib:starved("~p: reached, but the agent's samples came after the "
                                      "report was due (~ts); the host's CPUs ~.2f busy over the run",
                                      [Kind, maps:get(<<"why">>, View, <<>>), Busy]);
        false ->
            ct:fail({not_diagnosed_by_the_agent, Kind, View, Busy})
    end;
agent_ran(_Kind, _J) ->
    ok.

%% A node that cannot be reached as asked: exit 3, the sentence on
%% standard error, and the host-only report, the node's settings in it.
unreached(#{node := Node, os_pid := OsPid}, Extra, Config) ->
    {Code, Out, Err} = escript(Config, ["diagnose", atom_to_list(Node), "--json",
                                        "--duration", ?WINDOW | Extra], []),
    ct:pal("exit ~b~n~ts", [Code, Err]),
    ?assertEqual(3, Code),
    ?assertEqual(nomatch, binary:match(Err, <<"wrong cookie?">>)),
    J = beamdiag_test_json:decode(Out),
    #{<<"host_only">> := true, <<"host_view">> := V} = J,
    ?assertEqual(list_to_integer(OsPid), maps:get(<<"os_pid">>, V)),
    ?assertEqual(<<"unreachable">>, maps:get(<<"reason">>, V)),
    ?assert(maps:get(<<"samples">>, J) >= 2),
    #{<<"attach">> := #{<<"node">> := N}} = V,
    ?assertEqual(atom_to_binary(Node), N),
    {J, Err}.

sentence(Err, Words) ->
    ?assertMatch({_, _}, binary:match(Err, Words)).

value(A, Setting) ->
    case [V || #{<<"setting">> := S, <<"value">> := V} <- maps:get(<<"settings">>, A), S =:= Setting] of
        [V | _] -> V;
        [] -> ct:fail({no_setting, Setting, A})
    end.

from(A, Setting, Want) ->
    case [F || #{<<"setting">> := S, <<"from">> := F} <- maps:get(<<"settings">>, A), S =:= Setting] of
        [Want | _] -> ok;
        Got -> ct:fail({from, Setting, Want, Got})
    end.

cookie_from(A, Want) ->
    ?assertEqual(Want, maps:get(<<"from">>, maps:get(<<"cookie">>, A))).

port_from(A, Want) ->
    ?assertEqual(Want, maps:get(<<"from">>, maps:get(<<"port">>, A))).
