%%% EUnit tests of the first step of a handshake made by hand
%%% (beamdiag_dist_probe), against listeners on loopback that answer as a
%%% node does, as something else does, or not at all; and of the CLI's
%%% epmd module (beamdiag_epmd) answering for a node it was told of.
-module(beamdiag_dist_probe_tests).
-include_lib("eunit/include/eunit.hrl").

%% A listener that reads one message (2-byte length) and answers Reply
%% (framed the same way), or closes, or stays silent: its port.
listener(Reply) ->
    Self = self(),
    spawn_link(fun() ->
        {ok, L} = gen_tcp:listen(0, [binary, {ip, {127, 0, 0, 1}}, {active, false},
                                     {packet, 2}]),
        {ok, Port} = inet:port(L),
        Self ! {port, self(), Port},
        case gen_tcp:accept(L, 5000) of
            {ok, S} ->
                case gen_tcp:recv(S, 0, 5000) of
                    {ok, Msg} ->
                        Self ! {got, self(), Msg},
                        case Reply of
                            close -> gen_tcp:close(S);
                            silent -> timer:sleep(3000);
                            Bin -> _ = gen_tcp:send(S, Bin), timer:sleep(500)
                        end;
                    {error, _} ->
                        ok
                end;
            {error, _} ->
                ok
        end
    end),
    receive {port, _, P} -> P end.

status_ok_test() ->
    Port = listener(<<"sok">>),
    ?assertEqual({ok, <<"ok">>},
                 beamdiag_dist_probe:probe({127, 0, 0, 1}, Port, #{mode => shortnames})),
    %% The name message: 'N', flags (hidden: not published), creation, name.
    receive
        {got, _, <<$N, Flags:64, _Creation:32, Len:16, Name:Len/binary>>} ->
            ?assertEqual(0, Flags band 1),
            ?assertNotEqual(0, Flags band 16#01000000),
            ?assertMatch(<<"beamdiag_probe_", _/binary>>, Name)
    after 5000 -> error(no_message)
    end.

status_refused_test() ->
    Port = listener(<<"snot_allowed">>),
    ?assertEqual({ok, <<"not_allowed">>},
                 beamdiag_dist_probe:probe({127, 0, 0, 1}, Port, #{mode => longnames})).

not_distribution_test_() ->
    [?_assertEqual({error, not_distribution},
                   beamdiag_dist_probe:probe({127, 0, 0, 1}, listener(close),
                                             #{mode => shortnames})),
     ?_assertEqual({error, not_distribution},
                   beamdiag_dist_probe:probe({127, 0, 0, 1}, listener(<<"HTTP/1.1 400">>),
                                             #{mode => shortnames}))].

silent_port_test() ->
    Port = listener(silent),
    T0 = erlang:monotonic_time(millisecond),
    ?assertEqual({error, {tcp, timeout}},
                 beamdiag_dist_probe:probe({127, 0, 0, 1}, Port, #{mode => shortnames,
                                                                   timeout => 300})),
    ?assert(erlang:monotonic_time(millisecond) - T0 < 1500).

closed_port_test() ->
    {ok, L} = gen_tcp:listen(0, [{ip, {127, 0, 0, 1}}]),
    {ok, Port} = inet:port(L),
    ok = gen_tcp:close(L),
    ?assertEqual({error, {tcp, econnrefused}},
                 beamdiag_dist_probe:probe({127, 0, 0, 1}, Port, #{mode => shortnames})).

%% A key file that cannot be read is said by its name, before any byte
%% is sent.
tls_key_unreadable_test() ->
    Port = listener(close),
    R = beamdiag_dist_probe:probe({127, 0, 0, 1}, Port,
                                  #{mode => shortnames,
                                    tls => [{certfile, "/nonexistent/c.pem"},
                                            {keyfile, "/nonexistent/k.pem"},
                                            {verify, verify_none}]}),
    ?assertMatch({error, {tls, _}}, R),
    {error, Why} = R,
    Text = iolist_to_binary(beamdiag_dist_probe:format_error(Why)),
    ?assertMatch({_, _}, binary:match(Text, <<"/nonexistent/">>)).

%% beamdiag_epmd answers for a node it was told of, in the family asked,
%% and leaves every other to erl_epmd.
epmd_test() ->
    Node = list_to_atom("beamdiag_epmd_test_" ++ os:getpid() ++ "@somehost"),
    ok = beamdiag_epmd:set(Node, {127, 0, 0, 1}, 40123),
    Name = hd(string:split(atom_to_list(Node), "@")),
    ?assertEqual({ok, {127, 0, 0, 1}, 40123, 6},
                 beamdiag_epmd:address_please(Name, "somehost", inet)),
    ?assertEqual({ok, {127, 0, 0, 1}, 40123, 6},
                 beamdiag_epmd:address_please(list_to_atom(Name), "somehost", inet)),
    %% Another family, or host: asked as OTP would.
    ?assertEqual(erl_epmd:address_please(Name, "localhost", inet),
                 beamdiag_epmd:address_please(Name, "localhost", inet)),
    ?assertMatch({error, _}, beamdiag_epmd:address_please(Name, "somehost", inet6)).
