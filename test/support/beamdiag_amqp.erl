%%% @doc A minimal AMQP 0-9-1 client for loading a RabbitMQ node in the
%%% test suites: connect as guest on loopback, declare a queue, publish
%%% fixed-size messages (as fast as the socket takes them, or paced), and
%%% consume without acknowledgements. Only what the suites need; no
%%% heartbeats, no flow control beyond TCP's own.
%%%
%%% ```
%%% 1> {ok, C} = beamdiag_amqp:open(5699).
%%% 2> ok = beamdiag_amqp:declare(C, <<"q">>).
%%% 3> ok = beamdiag_amqp:publish(C, <<"q">>, 1000, 1024).
%%% '''
-module(beamdiag_amqp).

-export([open/1, declare/2, publish/4, paced/5, consume/3, close/1]).

-define(FRAME_END, 16#CE).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc A connection with channel 1 open, on 127.0.0.1:Port.
-spec open(inet:port_number()) -> {ok, gen_tcp:socket()} | {error, term()}.
open(Port) ->
    case gen_tcp:connect({127, 0, 0, 1}, Port, [binary, {active, false}, {packet, raw},
                                                  {nodelay, true}], 5000) of
        {ok, S} ->
            ok = gen_tcp:send(S, <<"AMQP", 0, 0, 9, 1>>),
            {ok, {10, 10}, _} = recv_method(S),
            Resp = <<0, "guest", 0, "guest">>,
            method(S, 0, 10, 11, [<<0:32>>, shortstr(<<"PLAIN">>), longstr(Resp),
                                  shortstr(<<"en_US">>)]),
            {ok, {10, 30}, <<ChMax:16, FrameMax:32, _Hb:16>>} = recv_method(S),
            method(S, 0, 10, 31, [<<ChMax:16, FrameMax:32, 0:16>>]),
            method(S, 0, 10, 40, [shortstr(<<"/">>), shortstr(<<>>), <<0>>]),
            {ok, {10, 41}, _} = recv_method(S),
            method(S, 1, 20, 10, [shortstr(<<>>)]),
            {ok, {20, 11}, _} = recv_method(S),
            {ok, S};
        Error ->
            Error
    end.

%% @doc Declares a non-durable queue.
-spec declare(gen_tcp:socket(), binary()) -> ok.
declare(S, Queue) ->
    method(S, 1, 50, 10, [<<0:16>>, shortstr(Queue), <<0>>, <<0:32>>]),
    {ok, {50, 11}, _} = recv_method(S),
    ok.

%% @doc Publishes N messages of Size bytes to Queue through the default
%% exchange, in batches written with one send each.
-spec publish(gen_tcp:socket(), binary(), non_neg_integer(), pos_integer()) -> ok.
publish(_S, _Queue, 0, _Size) ->
    ok;
publish(S, Queue, N, Size) ->
    Batch = min(N, 200),
    One = message(Queue, Size),
    ok = gen_tcp:send(S, lists:duplicate(Batch, One)),
    publish(S, Queue, N - Batch, Size).

%% @doc Publishes Rate messages a second of Size bytes until the calling
%% process is sent `stop', for at most MaxSeconds seconds.
-spec paced(gen_tcp:socket(), binary(), pos_integer(), pos_integer(), number()) -> ok.
paced(S, Queue, Rate, Size, MaxSeconds) ->
    PerTick = max(1, Rate div 10),
    Batch = lists:duplicate(PerTick, message(Queue, Size)),
    paced_until(S, Batch, erlang:monotonic_time(millisecond) + round(MaxSeconds * 1000)).

paced_until(S, Batch, Until) ->
    ok = gen_tcp:send(S, Batch),
    receive
        stop -> ok
    after 100 ->
        case erlang:monotonic_time(millisecond) >= Until of
            true -> ok;
            false -> paced_until(S, Batch, Until)
        end
    end.

%% @doc Starts consuming Queue without acknowledgements; a process linked
%% to the caller reads and drops the deliveries until the socket closes,
%% adding the bytes it read to the first counter of Received.
-spec consume(gen_tcp:socket(), binary(), counters:counters_ref()) -> pid().
consume(S, Queue, Received) ->
    method(S, 1, 60, 20, [<<0:16>>, shortstr(Queue), shortstr(<<>>), <<2>>, <<0:32>>]),
    {ok, {60, 21}, _} = recv_method(S),
    Pid = spawn_link(fun() -> drain(S, Received) end),
    ok = gen_tcp:controlling_process(S, Pid),
    Pid.

%% @doc Closes the socket (the broker drops the channel and connection).
-spec close(gen_tcp:socket()) -> ok.
close(S) ->
    gen_tcp:close(S).

%%%===================================================================
%%% Internal
%%%===================================================================

message(Queue, Size) ->
    Publish = frame(1, 1, [<<60:16, 40:16, 0:16>>, shortstr(<<>>), shortstr(Queue), <<0>>]),
    Header = frame(2, 1, <<60:16, 0:16, Size:64, 0:16>>),
    Body = frame(3, 1, binary:copy(<<"x">>, Size)),
    iolist_to_binary([Publish, Header, Body]).

method(S, Ch, Class, Method, Args) ->
    ok = gen_tcp:send(S, frame(1, Ch, [<<Class:16, Method:16>> | Args])).

frame(Type, Ch, Payload) ->
    P = iolist_to_binary(Payload),
    [<<Type, Ch:16, (byte_size(P)):32>>, P, <<?FRAME_END>>].

shortstr(B) -> <<(byte_size(B)), B/binary>>.
longstr(B) -> <<(byte_size(B)):32, B/binary>>.

recv_method(S) ->
    {ok, <<Type, _Ch:16, Size:32>>} = gen_tcp:recv(S, 7, 10000),
    {ok, <<Payload:Size/binary, ?FRAME_END>>} = gen_tcp:recv(S, Size + 1, 10000),
    case {Type, Payload} of
        {1, <<Class:16, Method:16, Args/binary>>} -> {ok, {Class, Method}, Args};
        _ -> recv_method(S)
    end.

drain(S, Received) ->
    case gen_tcp:recv(S, 0) of
        {ok, D} -> counters:add(Received, 1, byte_size(D)), drain(S, Received);
        {error, _} -> ok
    end.
