%%% @doc A minimal XMPP client for loading an ejabberd node: connect on
%%% loopback without TLS, log in with SASL PLAIN, bind a resource, send
%%% presence, then chat messages to another user, paced or as fast as the
%%% socket takes them. Only what a load needs: no XML parser (the server's
%%% answers are matched as text), no TLS, no roster.
%%%
%%% ```
%%% 1> {ok, C} = beamdiag_xmpp:open(5299, <<"localhost">>, <<"u1">>, <<"pw">>).
%%% 2> ok = beamdiag_xmpp:chat(C, <<"u2@localhost">>, 1000, 200).
%%% '''
-module(beamdiag_xmpp).

-export([open/4, chat/4, drain/1, close/1]).

-define(TIMEOUT, 10000).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc A session logged in as User@Domain with a bound resource and its
%% presence sent, on 127.0.0.1:Port.
-spec open(inet:port_number(), binary(), binary(), binary()) ->
    {ok, gen_tcp:socket()} | {error, term()}.
open(Port, Domain, User, Password) ->
    case gen_tcp:connect({127, 0, 0, 1}, Port, [binary, {active, false}, {packet, raw},
                                                  {nodelay, true}], ?TIMEOUT) of
        {ok, S} ->
            try
                stream(S, Domain),
                {ok, _} = until(S, <<"</stream:features>">>),
                Plain = base64:encode(<<0, User/binary, 0, Password/binary>>),
                ok = gen_tcp:send(S, [<<"<auth xmlns='urn:ietf:params:xml:ns:xmpp-sasl' "
                                        "mechanism='PLAIN'>">>, Plain, <<"</auth>">>]),
                case until(S, <<"success">>) of
                    {ok, _} -> ok;
                    {error, Why} -> throw({login, Why})
                end,
                stream(S, Domain),
                {ok, _} = until(S, <<"</stream:features>">>),
                ok = gen_tcp:send(S, <<"<iq type='set' id='b1'><bind xmlns='urn:ietf:params:xml:"
                                       "ns:xmpp-bind'><resource>load</resource></bind></iq>">>),
                {ok, _} = until(S, <<"</iq>">>),
                ok = gen_tcp:send(S, <<"<presence/>">>),
                {ok, S}
            catch
                throw:Reason -> gen_tcp:close(S), {error, Reason};
                error:{badmatch, E} -> gen_tcp:close(S), {error, E}
            end;
        Error ->
            Error
    end.

%% @doc Sends N chat messages of Bytes bytes to To; PerSecond paces them
%% (`infinity': as fast as the socket takes them).
-spec chat(gen_tcp:socket(), binary(), pos_integer(), pos_integer() | infinity) -> ok.
chat(S, To, N, PerSecond) ->
    Body = binary:copy(<<"x">>, 64),
    Msg = [<<"<message type='chat' to='">>, To, <<"'><body>">>, Body, <<"</body></message>">>],
    T0 = erlang:monotonic_time(millisecond),
    chat(S, Msg, N, PerSecond, T0, 0).

%% @doc Reads and drops what the server sends until the socket closes (the
%% receiving user's messages), so that its queue does not back up.
-spec drain(gen_tcp:socket()) -> ok.
drain(S) ->
    case gen_tcp:recv(S, 0) of
        {ok, _} -> drain(S);
        {error, _} -> ok
    end.

-spec close(gen_tcp:socket()) -> ok.
close(S) ->
    _ = gen_tcp:send(S, <<"</stream:stream>">>),
    gen_tcp:close(S).

%%%===================================================================
%%% Internal
%%%===================================================================

stream(S, Domain) ->
    ok = gen_tcp:send(S, [<<"<?xml version='1.0'?><stream:stream to='">>, Domain,
                          <<"' xmlns='jabber:client' xmlns:stream='http://etherx.jabber.org/"
                            "streams' version='1.0'>">>]).

%% Reads until Pattern has come; a SASL failure or a stream error ends it.
until(S, Pattern) ->
    until(S, Pattern, <<>>).

until(S, Pattern, Acc) ->
    case binary:match(Acc, Pattern) of
        {_, _} ->
            {ok, Acc};
        nomatch ->
            case binary:match(Acc, [<<"<failure">>, <<"<stream:error">>]) of
                {_, _} ->
                    {error, Acc};
                nomatch ->
                    case gen_tcp:recv(S, 0, ?TIMEOUT) of
                        {ok, More} -> until(S, Pattern, <<Acc/binary, More/binary>>);
                        {error, Why} -> {error, Why}
                    end
            end
    end.

chat(_S, _Msg, 0, _PerSecond, _T0, _Sent) ->
    ok;
chat(S, Msg, N, PerSecond, T0, Sent) ->
    ok = gen_tcp:send(S, Msg),
    case PerSecond of
        infinity ->
            ok;
        _ ->
            Due = T0 + (Sent + 1) * 1000 div PerSecond,
            Wait = Due - erlang:monotonic_time(millisecond),
            Wait > 0 andalso timer:sleep(Wait)
    end,
    chat(S, Msg, N - 1, PerSecond, T0, Sent + 1).
