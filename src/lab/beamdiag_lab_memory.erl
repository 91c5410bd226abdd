%%% @doc Lab scenarios for the memory ledger: a node whose memory grows at
%%% a steady rate, in one of the VM's parts.
%%%
%%% <ul>
%%% <li>`binary_leak': a relay receives payloads (`bytes', default 1 MiB,
%%% made fresh by a producer, `rate' a second) and passes each on to a
%%% sink, keeping a reference to every one in its state: the binaries stay
%%% alive off the heaps, and the node's binary memory grows by
%%% bytes × rate a second.</li>
%%% <li>`heap_leak': a session store keeps every event (`bytes' of a list
%%% of small tuples, `rate' a second) in its state: its heap grows, its
%%% mailbox stays short.</li>
%%% <li>`ets_leak_rows': a cache table (`table' set or bag) written without
%%% eviction, `rate' rows of `bytes' each a second.</li>
%%% <li>`alloc_burst': `mb' MiB of binaries of `bytes' each made at once,
%%% every `keep'-th kept and the rest collected, before the window: the
%%% carriers stay mapped, a `keep'-th of them used.</li>
%%% <li>`static_heap' (negative control): one process holds a heap of `mb'
%%% MiB (default 400), built and collected before the window, and then
%%% only waits: a large heap that stays the same size.</li>
%%% </ul>
%%%
%%% The binary and heap leaks take `growers' (default 1): that many relays
%%% or stores, the payloads dealt out in turn, so that the node grows at
%%% the same rate by many processes, each growing `growers' times slower.
%%%
%%% Each stops growing at `stop_mb' (default 1,500 MiB) so that a lab node
%%% never runs the host out of memory; the workload's time bound ends it
%%% too.
%%%
%%% ```
%%% 1> {ok, Lab} = beamdiag_lab:start(binary_leak, #{duration => 60, params => #{rate => 40}}).
%%% '''
-module(beamdiag_lab_memory).

-export([scenarios/0, params/1]).
%% Workloads, called on the lab node.
-export([leak/3]).
-ignore_xref([{leak, 3}, {params, 1}]).

-export_type([params/0]).

-type params() :: #{
    rate => 1..100000,
    bytes => 16..16777216,
    table => set | bag,
    stop_mb => 16..8192,
    mb => 16..4096,
    keep => 2..1000,
    growers => 1..64
}.

%% Batches a second, at most (a rate below it sends one at a time, more
%% slowly).
-define(TICKS, 20).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The memory scenarios.
-spec scenarios() -> [beamdiag_lab:scenario()].
scenarios() ->
    Base = #{modules => [beamdiag_lab_ledger], warmup_ms => 1000, emu_args => []},
    [Base#{name => binary_leak,
           summary => <<"a relay keeps every 1 MiB payload it passes on, 40 a second: binary "
                        "memory grows by 40 MiB/s (params: rate, bytes, stop_mb)">>,
           load => {?MODULE, leak, ['$duration_ms', binary, '$params']},
           params => #{rate => 40, bytes => 1048576, stop_mb => 1500},
           expect => [memory_growth]},
     Base#{name => heap_leak,
           summary => <<"a session store keeps every event in its state, 15 MiB a second: its "
                        "heap grows, its mailbox stays short (params: rate, bytes, stop_mb)">>,
           load => {?MODULE, leak, ['$duration_ms', heap, '$params']},
           params => #{rate => 60, bytes => 262144, stop_mb => 1500},
           expect => [memory_growth]},
     Base#{name => ets_leak_rows,
           summary => <<"a cache table written without eviction, 20 MiB a second (params: "
                        "rate, bytes, table, stop_mb)">>,
           load => {?MODULE, leak, ['$duration_ms', ets, '$params']},
           params => #{rate => 2000, bytes => 10240, table => set, stop_mb => 1500},
           expect => [memory_growth]},
     Base#{name => alloc_burst,
           summary => <<"a burst of 400 MiB of 1 KiB binaries, one in 20 kept: the binary "
                        "allocator's carriers stay mapped, a twentieth used (params: mb, bytes, "
                        "keep)">>,
           warmup_ms => 3000,
           load => {?MODULE, leak, ['$duration_ms', burst, '$params']},
           params => #{mb => 400, bytes => 1024, keep => 20},
           expect => [allocator_fragmentation]},
     Base#{name => static_heap,
           summary => <<"one process holds a 400 MiB heap that stays the same size (negative "
                        "control; params: mb)">>,
           warmup_ms => 3000,
           load => {?MODULE, leak, ['$duration_ms', static, '$params']},
           params => #{mb => 400},
           expect => []}].

%% @doc The variation checked.
-spec params(beamdiag_lab:params()) -> {ok, params()} | {error, {beamdiag_lab, term()}}.
params(P) ->
    Bad = maps:filter(fun(rate, R) -> not (is_integer(R) andalso R >= 1 andalso R =< 100000);
                         (bytes, B) -> not (is_integer(B) andalso B >= 16 andalso B =< 16777216);
                         (table, T) -> not lists:member(T, [set, bag]);
                         (stop_mb, S) -> not (is_integer(S) andalso S >= 16 andalso S =< 8192);
                         (mb, M) -> not (is_integer(M) andalso M >= 16 andalso M =< 4096);
                         (keep, K) -> not (is_integer(K) andalso K >= 2 andalso K =< 1000);
                         (growers, G) -> not (is_integer(G) andalso G >= 1 andalso G =< 64);
                         (_, _) -> true
                      end, P),
    case map_size(Bad) of
        0 -> {ok, P};
        _ -> {error, {beamdiag_lab, {params, memory, Bad}}}
    end.

%% @doc The growing part's processes for Ms milliseconds.
-spec leak(pos_integer(), binary | heap | ets | burst | static, params()) -> ok.
leak(Ms, What, P) ->
    Growers = maps:get(growers, P, 1),
    %% The stop is the node's: each of many growers stops at its share.
    Stop = maps:get(stop_mb, P, 1500) * 1048576 div Growers,
    Bytes = maps:get(bytes, P, 1024),
    Pace = pace(maps:get(rate, P, 1)),
    beamdiag_lab_ledger:owner(Ms, fun() ->
        case What of
            binary ->
                Sink = spawn_link(fun sink/0),
                Relays = [spawn_link(fun() -> relay(Sink, [], 0, Stop) end)
                          || _ <- lists:seq(1, Growers)],
                Producer = spawn_link(fun() -> produce(Relays, Pace, Bytes) end),
                [Producer, Sink | Relays];
            heap ->
                Stores = [spawn_link(fun() -> store([], 0, Stop) end) || _ <- lists:seq(1, Growers)],
                Producer = spawn_link(fun() -> events(Stores, Pace, Bytes) end),
                [Producer | Stores];
            static ->
                Holder = spawn_link(fun() ->
                                        Heap = lists:seq(1, maps:get(mb, P, 400) * 1048576 div 16),
                                        erlang:garbage_collect(),
                                        hold(Heap)
                                    end),
                [Holder];
            ets ->
                Writer = spawn_link(fun() ->
                                        T = ets:new(beamdiag_lab_cache_rows,
                                                    [maps:get(table, P, set), public]),
                                        write(T, Pace, Bytes, 0, Stop)
                                    end),
                [Writer];
            burst ->
                Holder = spawn_link(fun() ->
                                        Kept = burst(maps:get(mb, P, 400) * 1048576 div Bytes,
                                                     Bytes, maps:get(keep, P, 20)),
                                        hold(Kept)
                                    end),
                [Holder]
        end
    end).

%%%===================================================================
%%% Internal
%%%===================================================================

sink() ->
    receive _ -> sink() end.

%% N fresh binaries of Bytes at once, every Keep-th kept, the rest dropped
%% and collected: the blocks kept are spread over all the carriers the
%% burst mapped.
burst(N, Bytes, Keep) ->
    All = [fresh_binary(Bytes) || _ <- lists:seq(1, N)],
    Kept = [B || {I, B} <- lists:zip(lists:seq(1, N), All), I rem Keep =:= 0],
    erlang:garbage_collect(),
    Kept.

hold(Kept) ->
    receive _ -> hold(Kept) end.

%% A rate a second as a batch and the time between batches (ms): a batch
%% every 1/?TICKS s, or one at a time for a rate below ?TICKS.
pace(Rate) when Rate >= ?TICKS ->
    {Rate div ?TICKS, 1000 div ?TICKS};
pace(Rate) ->
    {1, 1000 div Rate}.

%% Fresh payloads at the pace, dealt out to the relays in turn.
produce(Relays, Pace, Bytes) ->
    produce(Relays, [], Pace, Bytes).

produce(Relays, [], Pace, Bytes) ->
    produce(Relays, Relays, Pace, Bytes);
produce(Relays, Next, Pace = {Batch, Ms}, Bytes) ->
    Rest = deal(Relays, Next, Batch, fun() -> {payload, fresh_binary(Bytes)} end),
    receive after Ms -> ok end,
    produce(Relays, Rest, Pace, Bytes).

%% N messages made by Make, sent to To's processes in turn from Next on
%% (To again when Next runs out): the turn after the last one.
deal(_To, Next, 0, _Make) ->
    Next;
deal(To, [], N, Make) ->
    deal(To, To, N, Make);
deal(To, [P | Next], N, Make) ->
    P ! Make(),
    deal(To, Next, N - 1, Make).

%% A binary of Bytes made here (not shared with the last one).
fresh_binary(Bytes) ->
    binary:copy(<<(erlang:unique_integer()):64>>, Bytes div 8).

%% Passes each payload on and keeps it (below the stop), as a relay that
%% logs what it forwarded does.
relay(Sink, Kept, Size, Stop) ->
    receive
        {payload, B} ->
            Sink ! B,
            case Size < Stop of
                true -> relay(Sink, [B | Kept], Size + byte_size(B), Stop);
                false -> relay(Sink, Kept, Size, Stop)
            end
    end.

events(Stores, Pace, Bytes) ->
    events(Stores, [], Pace, Bytes).

events(Stores, [], Pace, Bytes) ->
    events(Stores, Stores, Pace, Bytes);
events(Stores, Next, Pace = {Batch, Ms}, Bytes) ->
    N = max(1, Bytes div 48),
    Rest = deal(Stores, Next, Batch,
                fun() -> {event, [{I, erlang:unique_integer()} || I <- lists:seq(1, N)]} end),
    receive after Ms -> ok end,
    events(Stores, Rest, Pace, Bytes).

%% Keeps every event (below the stop); `{size, From}' asks how many bytes
%% of events it holds (its live data, which its heap's size only follows
%% in steps), so that a test reads the leak's rate apart from beamdiag.
store(Events, Size, Stop) ->
    receive
        {event, E} ->
            case Size < Stop of
                true -> store([E | Events], Size + erts_debug:flat_size(E) * 8, Stop);
                false -> store(Events, Size, Stop)
            end;
        {size, From} ->
            From ! {store_size, self(), Size},
            store(Events, Size, Stop)
    end.

write(T, Pace = {Batch, Ms}, Bytes, N, Stop) ->
    %% A list, copied into the table: the table's own memory grows (a
    %% large binary would be held off it, in binary memory).
    _ = N * Bytes < Stop andalso
        ets:insert(T, [{N + I, lists:duplicate(max(1, Bytes div 16), 0)} || I <- lists:seq(1, Batch)]),
    receive after Ms -> ok end,
    write(T, Pace, Bytes, N + Batch, Stop).
