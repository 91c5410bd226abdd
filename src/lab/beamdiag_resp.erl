%%% @doc A tiny RESP (Redis protocol) client for the cache lab, loopback only.
%%%
%%% Enough for the lab and its benchmark: connect to a Redis server on
%%% 127.0.0.1, send a command, read one reply. Replies: `{ok, binary()}'
%%% for simple and bulk strings, `{ok, integer()}', `{ok, undefined}' for a
%%% null, `{ok, [reply()]}' for arrays, `{error, {beamdiag_resp, {redis,
%%% Message}}}' for an error reply.
%%%
%%% ```
%%% 1> {ok, C} = beamdiag_resp:connect(6379, 1000).
%%% 2> beamdiag_resp:command(C, [<<"SET">>, <<"k">>, <<"v">>]).
%%% {ok, <<"OK">>}
%%% 3> beamdiag_resp:command(C, [<<"GET">>, <<"k">>]).
%%% {ok, <<"v">>}
%%% '''
-module(beamdiag_resp).

-export([connect/2, command/2, command/3, close/1, format_error/1]).
%% Called by the tests only.
-ifdef(TEST).
-export([encode/1, decode/1]).
-endif.

-export_type([conn/0, reply/0]).

%% One reply per command: Redis sends nothing unasked, so no buffer is kept
%% between commands.
-opaque conn() :: gen_tcp:socket().
-type reply() :: binary() | integer() | undefined | [reply()] | {redis_error, binary()}.

-define(TIMEOUT, 5000).
-define(MAX_BULK, 512 * 1024 * 1024).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Connects to a Redis server on 127.0.0.1:Port.
-spec connect(inet:port_number(), timeout()) -> {ok, conn()} | {error, {?MODULE, term()}}.
connect(Port, Timeout) ->
    case gen_tcp:connect({127, 0, 0, 1}, Port,
                         [binary, {active, false}, {packet, raw}, {nodelay, true}], Timeout) of
        {ok, S} ->
            {ok, S};
        {error, Why} ->
            {error, {?MODULE, {connect, Port, Why}}}
    end.

%% @doc Sends one command and reads its reply (5 s timeout).
-spec command(conn(), [iodata() | integer()]) -> {ok, reply()} | {error, {?MODULE, term()}}.
command(Conn, Args) ->
    command(Conn, Args, ?TIMEOUT).

%% @doc Sends one command and reads its reply.
-spec command(conn(), [iodata() | integer()], timeout()) ->
    {ok, reply()} | {error, {?MODULE, term()}}.
command(S, Args, Timeout) ->
    case gen_tcp:send(S, encode(Args)) of
        ok ->
            read_reply(S, <<>>, Timeout);
        {error, Why} ->
            {error, {?MODULE, {send, Why}}}
    end.

%% @doc Closes the connection.
-spec close(conn()) -> ok.
close(S) ->
    gen_tcp:close(S).

%% @doc A command as a RESP array of bulk strings.
-spec encode([iodata() | integer()]) -> iodata().
encode(Args) ->
    [$*, integer_to_binary(length(Args)), <<"\r\n">>,
     [begin
          B = if is_integer(A) -> integer_to_binary(A); true -> iolist_to_binary(A) end,
          [$$, integer_to_binary(byte_size(B)), <<"\r\n">>, B, <<"\r\n">>]
      end || A <- Args]].

%% @doc Decodes one reply from the front of a buffer: `{ok, Reply, Rest}',
%% `more' when the buffer holds only part of it, or `{error, Reason}'.
-spec decode(binary()) -> {ok, reply(), binary()} | more | {error, term()}.
decode(<<$+, R/binary>>) -> line(R, fun(L) -> L end);
decode(<<$-, R/binary>>) -> line(R, fun(L) -> {redis_error, L} end);
decode(<<$:, R/binary>>) -> int_line(R, fun(I) -> {value, I} end);
decode(<<$$, R/binary>>) ->
    case int_line(R, fun(I) -> {len, I} end) of
        {ok, {len, -1}, Rest} -> {ok, undefined, Rest};
        {ok, {len, N}, _} when N < 0; N > ?MAX_BULK -> {error, {bad_length, N}};
        {ok, {len, N}, Rest} ->
            case Rest of
                <<B:N/binary, "\r\n", Rest2/binary>> -> {ok, B, Rest2};
                _ when byte_size(Rest) < N + 2 -> more;
                _ -> {error, bad_bulk}
            end;
        Other -> Other
    end;
decode(<<$*, R/binary>>) ->
    case int_line(R, fun(I) -> {len, I} end) of
        {ok, {len, -1}, Rest} -> {ok, undefined, Rest};
        {ok, {len, N}, Rest} when N >= 0 -> array(N, Rest, []);
        {ok, {len, N}, _} -> {error, {bad_length, N}};
        Other -> Other
    end;
decode(<<>>) -> more;
decode(<<C, _/binary>>) -> {error, {bad_type, C}}.

%% @doc Turns an error reason into a sentence.
-spec format_error(term()) -> iolist().
format_error({connect, Port, Why}) ->
    io_lib:format("cannot connect to Redis on 127.0.0.1:~b: ~p", [Port, Why]);
format_error({redis, Msg}) ->
    ["Redis replied with an error: ", Msg];
format_error(Other) ->
    io_lib:format("Redis connection failed: ~p", [Other]).

%%%===================================================================
%%% Internal
%%%===================================================================

read_reply(S, Buf, Timeout) ->
    case decode(Buf) of
        {ok, {redis_error, Msg}, _} ->
            {error, {?MODULE, {redis, Msg}}};
        {ok, Reply, _} ->
            {ok, Reply};
        more ->
            case gen_tcp:recv(S, 0, Timeout) of
                {ok, Data} -> read_reply(S, <<Buf/binary, Data/binary>>, Timeout);
                {error, Why} -> {error, {?MODULE, {recv, Why}}}
            end;
        {error, Why} ->
            {error, {?MODULE, {protocol, Why}}}
    end.

line(R, Wrap) ->
    case binary:match(R, <<"\r\n">>) of
        {P, 2} ->
            <<L:P/binary, "\r\n", Rest/binary>> = R,
            {ok, Wrap(L), Rest};
        nomatch ->
            more
    end.

int_line(R, Wrap) ->
    case line(R, fun(L) -> L end) of
        {ok, L, Rest} ->
            try binary_to_integer(L) of
                I -> case Wrap(I) of {value, V} -> {ok, V, Rest}; T -> {ok, T, Rest} end
            catch
                error:badarg -> {error, {bad_integer, L}}
            end;
        more ->
            more
    end.

array(0, Rest, Acc) ->
    {ok, lists:reverse(Acc), Rest};
array(N, Buf, Acc) ->
    case decode(Buf) of
        {ok, V, Rest} -> array(N - 1, Rest, [V | Acc]);
        Other -> Other
    end.
