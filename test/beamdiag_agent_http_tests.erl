%%% EUnit tests of the metrics responder on this node, spoken to over
%%% loopback TCP: the text set by its owner served at its path (GET, HEAD,
%%% a query string), every other request answered with its error and the
%%% connection closed, a request too large or too slow cut off, a port in
%%% use refused, and the responder's end (stop, its owner's death) with
%%% its port closed.
-module(beamdiag_agent_http_tests).

-include_lib("eunit/include/eunit.hrl").

-define(TYPE, "text/plain; version=0.0.4; charset=utf-8").

http_test_() ->
    {setup, fun start/0, fun(#{pid := Pid}) -> beamdiag_agent_http:stop(Pid) end,
     fun(Ctx) -> [{timeout, 30, T} || T <- [
         {"empty until set", fun() -> empty(Ctx) end},
         {"GET and HEAD of the text set", fun() -> get_head(Ctx) end},
         {"a query string is not part of the path", fun() -> query(Ctx) end},
         {"the errors", fun() -> errors(Ctx) end},
         {"a request too large", fun() -> too_large(Ctx) end},
         {"a request too slow is cut off", fun() -> too_slow(Ctx) end},
         {"a port in use", fun() -> in_use(Ctx) end}
     ]] end}.

start() ->
    {ok, Pid} = beamdiag_agent_http:start(#{owner => self(), port => 0, path => "/m"}),
    {ok, Port} = beamdiag_agent_http:port(Pid),
    ?assert(Port > 0),
    #{pid => Pid, port => Port}.

empty(#{port := Port}) ->
    ?assertEqual({200, [{"content-type", ?TYPE}, {"content-length", "0"},
                        {"connection", "close"}], <<>>},
                 request(Port, "GET /m HTTP/1.1\r\nHost: x\r\n\r\n")).

get_head(#{pid := Pid, port := Port}) ->
    Text = <<"beamdiag_up 1\n# a comment: ünïcödé\n"/utf8>>,
    %% Set as iodata, served as one binary.
    served(Pid, Port, "/m", [<<"beamdiag_up 1\n">>, "# a comment: ", <<"ünïcödé"/utf8>>, "\n"]),
    {200, Headers, Body} = request(Port, "GET /m HTTP/1.1\r\nHost: x\r\n\r\n"),
    ?assertEqual(Text, Body),
    ?assertEqual(integer_to_list(byte_size(Body)), proplists:get_value("content-length", Headers)),
    %% HEAD: the same headers, no body.
    ?assertEqual({200, Headers, <<>>}, request(Port, "HEAD /m HTTP/1.0\r\n\r\n")),
    served(Pid, Port, "/m", <<"v 2\n">>).


query(#{pid := Pid, port := Port}) ->
    served(Pid, Port, "/m", <<"q 1\n">>),
    ?assertMatch({200, _, <<"q 1\n">>}, request(Port, "GET /m?x=1&y HTTP/1.1\r\n\r\n")).

errors(#{port := Port}) ->
    ?assertMatch({404, _, <<"not found; try /m\n">>}, request(Port, "GET /metrics HTTP/1.1\r\n\r\n")),
    ?assertMatch({404, _, _}, request(Port, "GET /m/ HTTP/1.1\r\n\r\n")),
    ?assertMatch({405, _, <<"method not allowed\n">>}, request(Port, "POST /m HTTP/1.1\r\n\r\n")),
    ?assertMatch({405, _, _}, request(Port, "DELETE /other HTTP/1.1\r\n\r\n")),
    ?assertMatch({400, _, <<"bad request\n">>}, request(Port, "GET /m\r\n\r\n")),
    ?assertMatch({400, _, _}, request(Port, "GET /m SPDY/3\r\n\r\n")),
    ?assertMatch({400, _, _}, request(Port, "hello\r\n\r\n")),
    %% Each answer closes its connection, errors too.
    {_, Headers, _} = request(Port, "POST /m HTTP/1.1\r\n\r\n"),
    ?assertEqual("close", proplists:get_value("connection", Headers)).

too_large(#{port := Port}) ->
    %% 8 KB without the end of the head: refused, not read on.
    Big = ["GET /m HTTP/1.1\r\nX: ", lists:duplicate(9000, $a)],
    ?assertMatch({431, _, <<"request too large\n">>}, request(Port, Big)),
    %% The responder serves the next one.
    ?assertMatch({200, _, _}, request(Port, "GET /m HTTP/1.1\r\n\r\n")).

too_slow(#{port := Port}) ->
    %% Half a head, then nothing: the connection is closed unanswered
    %% after the read's bound (2 s).
    {ok, S} = gen_tcp:connect({127, 0, 0, 1}, Port, [binary, {active, false}], 5000),
    ok = gen_tcp:send(S, "GET /m HTTP/1.1\r\n"),
    T0 = erlang:monotonic_time(millisecond),
    ?assertEqual({error, closed}, gen_tcp:recv(S, 0, 10000)),
    ?assert(erlang:monotonic_time(millisecond) - T0 >= 1500),
    gen_tcp:close(S),
    ?assertMatch({200, _, _}, request(Port, "GET /m HTTP/1.1\r\n\r\n")).

in_use(#{port := Port}) ->
    R = beamdiag_agent_http:start(#{owner => self(), port => Port}),
    ?assertEqual({error, {beamdiag_agent_http, {listen, Port, eaddrinuse}}}, R),
    {error, {beamdiag_agent_http, Why}} = R,
    ?assertEqual(iolist_to_binary(io_lib:format("cannot serve metrics on port ~b: the port is in "
                                                "use", [Port])),
                 iolist_to_binary(beamdiag_agent_http:format_error(Why))).

%% Stopped, or its owner gone: the port is closed.
end_test_() ->
    [{timeout, 30, T} || T <- [
        {"stop closes the port", fun stopped/0},
        {"the owner's death ends it", fun owner_down/0},
        {"linked", fun linked/0},
        {"sentences", fun sentences/0}
    ]].

stopped() ->
    {ok, Pid} = beamdiag_agent_http:start(#{owner => self(), port => 0}),
    {ok, Port} = beamdiag_agent_http:port(Pid),
    %% The default path.
    served(Pid, Port, "/metrics", <<"d 1\n">>),
    ok = beamdiag_agent_http:stop(Pid),
    ?assertNot(is_process_alive(Pid)),
    ?assertEqual({error, econnrefused}, gen_tcp:connect({127, 0, 0, 1}, Port, [], 5000)),
    ?assertEqual({error, {beamdiag_agent_http, {gone, noproc}}}, beamdiag_agent_http:port(Pid)).

owner_down() ->
    Self = self(),
    Owner = spawn(fun() ->
                          Self ! {started, beamdiag_agent_http:start(#{owner => self(), port => 0})},
                          receive stop -> ok end
                  end),
    {ok, Pid} = receive {started, R} -> R after 5000 -> error(not_started) end,
    {ok, Port} = beamdiag_agent_http:port(Pid),
    MRef = erlang:monitor(process, Pid),
    exit(Owner, kill),
    receive {'DOWN', MRef, process, Pid, normal} -> ok after 5000 -> error(still_serving) end,
    ?assertEqual({error, econnrefused}, gen_tcp:connect({127, 0, 0, 1}, Port, [], 5000)).

linked() ->
    {ok, Pid} = beamdiag_agent_http:start_link(#{owner => self(), port => 0}),
    %% Its listening socket besides.
    ?assertEqual([self()], linked_pids(Pid)),
    {ok, Pid2} = beamdiag_agent_http:start(#{owner => self(), port => 0}),
    ?assertEqual([], linked_pids(Pid2)),
    ok = beamdiag_agent_http:stop(Pid),
    ok = beamdiag_agent_http:stop(Pid2).

sentences() ->
    ?assertEqual(<<"cannot serve metrics on port 80: eacces">>,
                 iolist_to_binary(beamdiag_agent_http:format_error({listen, 80, eacces}))),
    ?assertEqual(<<"the metrics responder is gone (timeout)">>,
                 iolist_to_binary(beamdiag_agent_http:format_error({gone, timeout}))).

%%% Helpers

%% The text set is served: set/2 is a message, and the responder may be
%% waiting in accept when it comes (up to 200 ms), so the text a request
%% gets is the new one from some request on.
served(Pid, Port, Path, Text) ->
    ok = beamdiag_agent_http:set(Pid, Text),
    Want = iolist_to_binary(Text),
    ok = beamdiag_test_lib:await(
           fun() -> element(3, request(Port, ["GET ", Path, " HTTP/1.1\r\n\r\n"])) =:= Want end,
           5000).

linked_pids(Pid) ->
    {links, Links} = erlang:process_info(Pid, links),
    [L || L <- Links, is_pid(L)].

%% One request on a connection of its own; the answer read until the
%% responder closes it: status, headers (names lower case), body.
request(Port, Request) ->
    {ok, S} = gen_tcp:connect({127, 0, 0, 1}, Port, [binary, {active, false}], 5000),
    ok = gen_tcp:send(S, Request),
    Bin = read_all(S, <<>>),
    gen_tcp:close(S),
    [Head, Body] = binary:split(Bin, <<"\r\n\r\n">>),
    [<<"HTTP/1.1 ", Code:3/binary, " ", _/binary>> | Lines] = binary:split(Head, <<"\r\n">>, [global]),
    Headers = [begin
                   [K, V] = binary:split(L, <<": ">>),
                   {string:lowercase(binary_to_list(K)), binary_to_list(V)}
               end || L <- Lines],
    {binary_to_integer(Code), Headers, Body}.

read_all(S, Acc) ->
    case gen_tcp:recv(S, 0, 10000) of
        {ok, D} -> read_all(S, <<Acc/binary, D/binary>>);
        {error, closed} -> Acc
    end.
