%%% @doc Lab scenario `mailbox_flood': a mailbox that floods, and its
%%% workload, with the variation as parameters.
%%%
%%% Producers send to one registered consumer as fast as they can (or as
%%% fast as the pace allows); the consumer takes one message at a time and
%%% works on each. Its queue grows by thousands to hundreds of thousands of
%%% messages a second, which is what makes `process_info(P, memory)' (it
%%% walks the whole queue) stall a caller, and what makes the consumer's
%%% garbage collections (they copy the queued messages into its heap) long.
%%%
%%% The variation (`params' of `beamdiag_lab:start/2', merged over the
%%% scenario's):
%%% <ul>
%%% <li>`producers': how many senders (1 to 16; default 8).</li>
%%% <li>`message': `small' (a 3-tuple, about 112 bytes queued), `{binary,
%%% Bytes}' (a fresh binary each message, as read from a socket) or
%%% `{tuple, Elements}' (a tuple of that many integers, copied at each
%%% send); default `small'.</li>
%%% <li>`work': what the consumer does per message: `none', `{sleep_ms, N}'
%%% (it waits, as a consumer of a slow service does) or `{busy_us, N}' (it
%%% computes for N microseconds); default `{sleep_ms, 1}'.</li>
%%% <li>`cap_bytes': the queue's bound, in bytes (default 1.6 GB);
%%% producers pause above it. `fill_s': the queue reaches the bound in
%%% about that many seconds at the most (default 20): producers are paced
%%% to CapBytes / FillS bytes a second, so that a flood of large messages
%%% still grows through a diagnosis window.</li>
%%% </ul>
%%%
%%% The flood is capped for a shared machine: the producers count what they
%%% sent and the consumer what it took (one `atomics' array), and every
%%% producer pauses while the queue is above the bound. The workers end at
%%% the workload's time bound, and with the node when the lab stops.
%%%
%%% ```
%%% 1> {ok, Lab} = beamdiag_lab:start(mailbox_flood, #{duration => 60,
%%%        params => #{producers => 16, message => {binary, 10240}, work => {busy_us, 100}}}).
%%% 2> beamdiag:diagnose(beamdiag_lab:node(Lab), #{cookie => beamdiag_lab:cookie(Lab)}).
%%% 3> beamdiag_lab:stop(Lab).
%%% '''
-module(beamdiag_lab_flood).

-export([scenarios/0, params/1, label/1]).
%% Workloads, called on the lab node.
-export([flood/2]).
%% Lab workloads: run on the lab node from the scenario's `load' MFA.
-ignore_xref([{flood, 2}]).
%% Called as Module:params/1 by beamdiag_lab; label/1 by the benches.
-ignore_xref([{params, 1}, {label, 1}]).

-export_type([params/0]).

-type params() :: #{
    producers => 1..64,
    message => small | {binary, pos_integer()} | {tuple, pos_integer()},
    work => none | {sleep_ms, pos_integer()} | {busy_us, pos_integer()},
    cap_bytes => pos_integer(),
    fill_s => pos_integer()
}.

-define(CONSUMER, beamdiag_lab_flooded).
%% Sends between two looks at the counters: at most this many, and about
%% ?BATCH_BYTES of messages (large messages in smaller batches, so that
%% the flow is steady).
-define(BATCH, 1000).
-define(BATCH_BYTES, 100000).
%% Bytes a small queued message holds (measured on OTP 25).
-define(SMALL_BYTES, 112).
%% Beyond its data, a queued message's header and fragment (about).
-define(MSG_OVERHEAD, 100).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The flood scenario.
-spec scenarios() -> [beamdiag_lab:scenario()].
scenarios() ->
    [#{name => mailbox_flood,
       summary => <<"producers flood one slow consumer (default: 8 producers, small messages, "
                    "a message a millisecond; capped at about 1.6 GB); params: producers, "
                    "message, work">>,
       emu_args => ["+S", "2:2"], load => {?MODULE, flood, ['$duration_ms', '$params']},
       params => defaults(),
       modules => [beamdiag_lab_ledger],
       warmup_ms => 500,
       expect => [message_queue_growth]}].

%% @doc The variation with the defaults filled in; unknown keys or values
%% are an error value.
-spec params(beamdiag_lab:params()) -> {ok, params()} | {error, {beamdiag_lab, term()}}.
params(P) when is_map(P) ->
    All = maps:merge(defaults(), P),
    case [K || {K, V} <- maps:to_list(All), not valid(K, V)] of
        [] -> {ok, All};
        Bad -> {error, {beamdiag_lab, {params, mailbox_flood, maps:with(Bad, All)}}}
    end.

%% @doc A short name for a variation, for tables: `p8-small-sleep1ms'.
-spec label(params()) -> string().
label(P) ->
    #{producers := N, message := M, work := W} = maps:merge(defaults(), P),
    lists:flatten(io_lib:format("p~b-~s-~s", [N, message_label(M), work_label(W)])).

%% @doc A registered consumer and its producers, for Ms milliseconds.
-spec flood(pos_integer(), params()) -> ok.
flood(Ms, P0) ->
    {ok, P} = params(P0),
    #{producers := N, message := Msg, work := Work, cap_bytes := CapBytes, fill_s := FillS} = P,
    Cap = max(1000, CapBytes div message_bytes(Msg)),
    %% Messages a millisecond all producers together may send at most.
    PerMs = max(1, Cap div (FillS * 1000)),
    beamdiag_lab_ledger:owner(Ms, fun() ->
        %% 1: messages sent, 2: messages taken.
        Counts = atomics:new(2, [{signed, false}]),
        persistent_term:put({?MODULE, counts}, Counts),
        C = spawn_link(fun() -> consumer(Counts, Work) end),
        true = register(?CONSUMER, C),
        T0 = erlang:monotonic_time(millisecond),
        Batch = max(10, min(?BATCH, ?BATCH_BYTES div message_bytes(Msg))),
        Pace = {T0, PerMs, Cap, Batch},
        [C | [spawn_link(fun() -> producer(C, Counts, Pace, Msg, I) end)
              || I <- lists:seq(1, N)]]
    end).

%%%===================================================================
%%% Internal
%%%===================================================================

defaults() ->
    #{producers => 8, message => small, work => {sleep_ms, 1}, cap_bytes => 1600000000,
      fill_s => 20}.

valid(producers, N) -> is_integer(N) andalso N >= 1 andalso N =< 64;
valid(message, small) -> true;
valid(message, {binary, B}) -> is_integer(B) andalso B >= 64 andalso B =< 1048576;
valid(message, {tuple, E}) -> is_integer(E) andalso E >= 1 andalso E =< 100000;
valid(work, none) -> true;
valid(work, {sleep_ms, N}) -> is_integer(N) andalso N >= 1 andalso N =< 1000;
valid(work, {busy_us, N}) -> is_integer(N) andalso N >= 1 andalso N =< 100000;
valid(cap_bytes, B) -> is_integer(B) andalso B >= 1000000 andalso B =< 8000000000;
valid(fill_s, S) -> is_integer(S) andalso S >= 1 andalso S =< 3600;
valid(_, _) -> false.

message_label(small) -> "small";
message_label({binary, B}) -> io_lib:format("bin~b", [B]);
message_label({tuple, E}) -> io_lib:format("tuple~b", [E]).

work_label(none) -> "none";
work_label({sleep_ms, N}) -> io_lib:format("sleep~bms", [N]);
work_label({busy_us, N}) -> io_lib:format("busy~bus", [N]).

%% What a queued message holds, about.
message_bytes(small) -> ?SMALL_BYTES;
message_bytes({binary, B}) -> B + ?MSG_OVERHEAD;
message_bytes({tuple, E}) -> 8 * (E + 1) + ?MSG_OVERHEAD.

%% Each message is handled as a real consumer does, with a little garbage
%% (a 16-element list), so the consumer collects its heap now and then:
%% each collection moves the messages queued since the last one into its
%% heap, and a major one copies the whole queue.
consumer(Counts, Work) ->
    receive
        Msg ->
            atomics:add(Counts, 2, 1),
            _ = handle(Msg),
            work(Work)
    end,
    consumer(Counts, Work).

handle(Msg) ->
    erlang:phash2(lists:seq(erlang:phash2(Msg, 100), erlang:phash2(Msg, 100) + 15)).

work(none) ->
    ok;
work({sleep_ms, N}) ->
    receive
    after N -> ok
    end;
work({busy_us, N}) ->
    spin(erlang:monotonic_time(microsecond) + N).

spin(Until) ->
    case erlang:monotonic_time(microsecond) >= Until of
        true -> ok;
        false -> spin(Until)
    end.

%% Sends a batch while the queue is under the cap and the producers
%% together are not ahead of the pace; otherwise waits a little.
producer(C, Counts, Pace = {T0, PerMs, Cap, Batch}, Msg, I) ->
    Sent = atomics:get(Counts, 1),
    Allowed = (erlang:monotonic_time(millisecond) - T0 + 1) * PerMs,
    case Sent - atomics:get(Counts, 2) >= Cap orelse Sent >= Allowed of
        true ->
            receive
            after 5 -> ok
            end;
        false ->
            send(C, Batch, Msg, I),
            atomics:add(Counts, 1, Batch)
    end,
    producer(C, Counts, Pace, Msg, I).

send(_C, 0, _Msg, _I) ->
    ok;
send(C, K, small, I) ->
    C ! {item, K},
    send(C, K - 1, small, I);
send(C, K, {binary, B} = Msg, I) ->
    %% A fresh binary each message (one the producer built, as a socket's
    %% reader does).
    C ! <<I:32, K:32, 0:((B - 8) * 8)>>,
    send(C, K - 1, Msg, I);
send(C, K, {tuple, E} = Msg, I) ->
    C ! erlang:make_tuple(E, K),
    send(C, K - 1, Msg, I).
