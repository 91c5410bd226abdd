%%% EUnit tests of the CLI's epmd module: a node set with `set/3' is
%%% answered with its address, port and protocol version, for its address
%%% family only; every other question goes to OTP's erl_epmd (checked
%%% against a name this test registers with the host's epmd itself, for
%%% as long as its connection stays open); and `use/0' says whether
%%% distribution started later would use it, on this release.
-module(beamdiag_epmd_tests).

-include_lib("eunit/include/eunit.hrl").

%%%===================================================================
%%% Nodes set by hand
%%%===================================================================

set_test_() ->
    {setup, fun() -> ok end, fun(_) -> forget() end, [
        {"an IPv4 node", fun ipv4/0},
        {"an IPv6 node", fun ipv6/0},
        {"set again: the new port", fun overwrite/0},
        {"a node not set goes to erl_epmd", fun not_set/0}
    ]}.

ipv4() ->
    ok = beamdiag_epmd:set(node_name("svc", "127.0.0.1"), {127, 0, 0, 1}, 4370),
    ?assertEqual({ok, {127, 0, 0, 1}, 4370, 6},
                 beamdiag_epmd:address_please("svc" ++ suffix(), "127.0.0.1", inet)),
    %% The name as an atom too, as the distribution layer may pass it.
    ?assertEqual({ok, {127, 0, 0, 1}, 4370, 6},
                 beamdiag_epmd:address_please(list_to_atom("svc" ++ suffix()), "127.0.0.1", inet)),
    %% Asked for IPv6, an IPv4 address is not an answer: erl_epmd's is.
    ?assertEqual(erl_epmd:address_please("svc" ++ suffix(), "127.0.0.1", inet6),
                 beamdiag_epmd:address_please("svc" ++ suffix(), "127.0.0.1", inet6)),
    %% Known by its name and host as its name writes them.
    ?assertNotEqual({ok, {127, 0, 0, 1}, 4370, 6},
                    beamdiag_epmd:address_please("svc" ++ suffix(), "localhost", inet)),
    ?assertEqual(erl_epmd:address_please("svc" ++ suffix(), "localhost", inet),
                 beamdiag_epmd:address_please("svc" ++ suffix(), "localhost", inet)).

ipv6() ->
    Ip = {0, 0, 0, 0, 0, 0, 0, 1},
    ok = beamdiag_epmd:set(node_name("six", "::1"), Ip, 5000),
    ?assertEqual({ok, Ip, 5000, 6}, beamdiag_epmd:address_please("six" ++ suffix(), "::1", inet6)),
    ?assertEqual(erl_epmd:address_please("six" ++ suffix(), "::1", inet),
                 beamdiag_epmd:address_please("six" ++ suffix(), "::1", inet)).

overwrite() ->
    Node = node_name("again", "127.0.0.1"),
    ok = beamdiag_epmd:set(Node, {127, 0, 0, 1}, 4000),
    ok = beamdiag_epmd:set(Node, {127, 0, 0, 1}, 4000),
    ?assertEqual({ok, {127, 0, 0, 1}, 4000, 6},
                 beamdiag_epmd:address_please("again" ++ suffix(), "127.0.0.1", inet)),
    ok = beamdiag_epmd:set(Node, {127, 0, 0, 2}, 4001),
    ?assertEqual({ok, {127, 0, 0, 2}, 4001, 6},
                 beamdiag_epmd:address_please("again" ++ suffix(), "127.0.0.1", inet)).

not_set() ->
    Name = "never" ++ suffix(),
    R = beamdiag_epmd:address_please(Name, "127.0.0.1", inet),
    ?assertEqual(erl_epmd:address_please(Name, "127.0.0.1", inet), R),
    %% erl_epmd resolves the host only; the port comes from epmd later.
    ?assertEqual({ok, {127, 0, 0, 1}}, R),
    %% A host that is not a string is not looked up here.
    ?assertEqual(erl_epmd:address_please(Name, '127.0.0.1', inet),
                 beamdiag_epmd:address_please(Name, '127.0.0.1', inet)).

%%%===================================================================
%%% Through erl_epmd, against the host's epmd
%%%===================================================================

epmd_test_() ->
    {setup, fun register_fake/0, fun unregister_fake/1,
     fun(Ctx) -> [
         {"port_please: the port registered", fun() -> port_please(Ctx) end},
         {"names: the name registered", fun() -> names(Ctx) end},
         {"listen_port_please as erl_epmd", fun listen_port/0}
     ] end}.

%% Registers a name with epmd as a node does (ALIVE2_REQ): it stays
%% registered while the connection is open.
register_fake() ->
    Name = "beamdiag_epmd_test_" ++ os:getpid() ++ suffix(),
    Port = 40000 + erlang:phash2(Name, 20000),
    {ok, S} = connect_epmd(),
    NameBin = list_to_binary(Name),
    Body = <<120, Port:16, 77, 0, 6:16, 5:16, (byte_size(NameBin)):16, NameBin/binary, 0:16>>,
    ok = gen_tcp:send(S, <<(byte_size(Body)):16, Body/binary>>),
    {ok, <<Tag, 0, _/binary>>} = gen_tcp:recv(S, 0, 5000),
    true = lists:member(Tag, [118, 121]),
    #{socket => S, name => Name, port => Port}.

unregister_fake(#{socket := S}) ->
    gen_tcp:close(S).

port_please(#{name := Name, port := Port}) ->
    ?assertEqual({port, Port, 6}, beamdiag_epmd:port_please(Name, "127.0.0.1")),
    ?assertEqual({port, Port, 6}, beamdiag_epmd:port_please(list_to_atom(Name), "127.0.0.1", 5000)),
    ?assertEqual(noport, beamdiag_epmd:port_please("nosuch" ++ suffix(), "127.0.0.1", 5000)).

names(#{name := Name, port := Port}) ->
    {ok, Names} = beamdiag_epmd:names("127.0.0.1"),
    ?assertEqual({Name, Port}, lists:keyfind(Name, 1, Names)).

listen_port() ->
    ?assertEqual(erl_epmd:listen_port_please("x", "127.0.0.1"),
                 beamdiag_epmd:listen_port_please("x", "127.0.0.1")).

%%%===================================================================
%%% use/0
%%%===================================================================

use_test() ->
    Before = application:get_env(kernel, epmd_module),
    Flag = init:get_argument(epmd_module),
    Otp = list_to_integer(erlang:system_info(otp_release)),
    InUse = case Flag of
                {ok, [["beamdiag_epmd" | _] | _]} -> true;
                {ok, _} -> false;
                error -> Before =:= {ok, beamdiag_epmd}
            end,
    try
        Got = beamdiag_epmd:use(),
        %% In use already, or made so: from OTP 26, undistributed, no flag.
        Expected = InUse orelse (Otp >= 26 andalso Flag =:= error andalso node() =:= nonode@nohost),
        ?assertEqual(Expected, Got),
        case Got andalso not InUse of
            true -> ?assertEqual({ok, beamdiag_epmd}, application:get_env(kernel, epmd_module));
            false -> ?assertEqual(Before, application:get_env(kernel, epmd_module))
        end,
        %% Asked again, the same.
        ?assertEqual(Got, beamdiag_epmd:use())
    after
        case Before of
            undefined -> application:unset_env(kernel, epmd_module);
            {ok, V} -> application:set_env(kernel, epmd_module, V)
        end
    end.

%%% Helpers

%% Names of this run's own, so that nothing set here meets another's.
suffix() ->
    "_" ++ os:getpid().

node_name(Name, Host) ->
    list_to_atom(Name ++ suffix() ++ "@" ++ Host).

forget() ->
    _ = [persistent_term:erase(K) || {K = {beamdiag_epmd, Name, _}, _} <- persistent_term:get(),
                                     lists:suffix(suffix(), Name)],
    ok.

%% The host's epmd, started as a node's first `-sname' starts it when none
%% runs yet (a fresh machine has none before any node was started).
connect_epmd() ->
    Connect = fun() -> gen_tcp:connect({127, 0, 0, 1}, epmd_port(),
                                       [binary, {active, false}, {packet, raw}], 5000) end,
    case Connect() of
        {ok, S} ->
            {ok, S};
        {error, econnrefused} ->
            Erts = filename:join([code:root_dir(), "erts-" ++ erlang:system_info(version), "bin",
                                  "epmd"]),
            Epmd = case filelib:is_regular(Erts) of
                       true -> Erts;
                       false -> os:find_executable("epmd")
                   end,
            _ = os:cmd(Epmd ++ " -daemon -port " ++ integer_to_list(epmd_port())),
            beamdiag_test_lib:poll(fun() ->
                                           case Connect() of
                                               {ok, S} -> {true, S};
                                               E -> {false, E}
                                           end
                                   end, 10000)
    end.

epmd_port() ->
    case os:getenv("ERL_EPMD_PORT") of
        false -> 4369;
        P -> list_to_integer(P)
    end.
