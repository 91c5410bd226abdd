%%% EUnit tests of the queue watch on this node: a watched process's
%%% queue length and heap, its first answer kept as the queue grows, a
%%% process gone keeps its last reading, one never answered is left out,
%%% each process watched once, the messages never taken, and the readers
%%% ended by `stop/1' or with the process that started them.
-module(beamdiag_agent_queues_tests).

-include_lib("eunit/include/eunit.hrl").

-define(PERIOD, #{period_ms => 10}).

queues_test_() ->
    [{timeout, 30, T} || T <- [
        {"a queue read, and its growth", fun growth/0},
        {"a process gone keeps its last reading", fun gone/0},
        {"a process never answered is left out", fun never/0},
        {"each process once; none", fun once/0},
        {"stop ends the readers", fun stop/0},
        {"the readers end with their starter", fun starter_down/0}
    ]].

growth() ->
    P = queued(5),
    Key = key(P),
    W = beamdiag_agent_queues:start([P], ?PERIOD),
    #{Key := R1} = reading(W, fun(#{queue := Q}) -> Q =:= 5 end),
    ?assertMatch(#{queue := 5, first := 5}, R1),
    {heap_size, Heap} = erlang:process_info(P, heap_size),
    ?assertEqual(Heap, maps:get(heap_words, R1)),
    ?assert(maps:get(t, R1) >= maps:get(first_t, R1)),
    ?assert(maps:get(t, R1) =< erlang:monotonic_time(nanosecond)),
    [P ! {filler, N} || N <- lists:seq(1, 10)],
    #{Key := R2} = reading(W, fun(#{queue := Q}) -> Q =:= 15 end),
    %% The first answer stays; the latest moves on.
    ?assertEqual({5, maps:get(first_t, R1)}, {maps:get(first, R2), maps:get(first_t, R2)}),
    ?assert(maps:get(t, R2) > maps:get(t, R1)),
    %% Read, never taken.
    ?assertEqual({message_queue_len, 15}, erlang:process_info(P, message_queue_len)),
    beamdiag_agent_queues:stop(W),
    exit(P, kill).

gone() ->
    P = queued(3),
    Key = key(P),
    W = beamdiag_agent_queues:start([P], ?PERIOD),
    #{Key := R} = reading(W, fun(#{queue := Q}) -> Q =:= 3 end),
    [Reader] = beamdiag_agent_queues:readers(W),
    MRef = erlang:monitor(process, Reader),
    exit(P, kill),
    %% Its reader finds it gone and ends; its reading stays as it was
    %% (`t' included: no answer came after).
    receive {'DOWN', MRef, process, Reader, normal} -> ok after 5000 -> error(reader_on) end,
    #{Key := Last} = beamdiag_agent_queues:read(W),
    ?assertEqual(maps:get(queue, R), maps:get(queue, Last)),
    ?assert(maps:get(t, Last) >= maps:get(t, R)),
    ?assertEqual(Last, maps:get(Key, beamdiag_agent_queues:read(W))).

never() ->
    {Dead, DRef} = spawn_monitor(fun() -> ok end),
    receive {'DOWN', DRef, process, Dead, _} -> ok end,
    Live = queued(1),
    W = beamdiag_agent_queues:start([Dead, Live], ?PERIOD),
    Readers = beamdiag_agent_queues:readers(W),
    ?assertEqual(2, length(Readers)),
    _ = reading(W, fun(#{queue := Q}) -> Q =:= 1 end),
    %% The dead one's reader ends without an answer.
    ok = beamdiag_test_lib:await(
           fun() -> length([R || R <- Readers, is_process_alive(R)]) =:= 1 end, 5000),
    ?assertEqual([key(Live)], maps:keys(beamdiag_agent_queues:read(W))),
    beamdiag_agent_queues:stop(W),
    exit(Live, kill).

once() ->
    P = queued(2),
    W = beamdiag_agent_queues:start([P, P, P], ?PERIOD),
    ?assertEqual(1, length(beamdiag_agent_queues:readers(W))),
    _ = reading(W, fun(#{queue := Q}) -> Q =:= 2 end),
    ?assertEqual([key(P)], maps:keys(beamdiag_agent_queues:read(W))),
    beamdiag_agent_queues:stop(W),
    None = beamdiag_agent_queues:start([], #{}),
    ?assertEqual([], beamdiag_agent_queues:readers(None)),
    ?assertEqual(#{}, beamdiag_agent_queues:read(None)),
    ok = beamdiag_agent_queues:stop(None),
    exit(P, kill).

stop() ->
    Ps = [queued(N) || N <- [1, 2, 3]],
    W = beamdiag_agent_queues:start(Ps, ?PERIOD),
    Readers = beamdiag_agent_queues:readers(W),
    ?assertEqual(3, length(Readers)),
    [?assertEqual({priority, high}, erlang:process_info(R, priority)) || R <- Readers],
    MRefs = [erlang:monitor(process, R) || R <- Readers],
    ok = beamdiag_agent_queues:stop(W),
    [receive {'DOWN', M, process, _, Why} -> ?assertEqual(killed, Why)
     after 5000 -> error(reader_on) end || M <- MRefs],
    %% Stopping them did not kill this process (they were unlinked first).
    ?assert(is_process_alive(self())),
    [exit(P, kill) || P <- Ps].

starter_down() ->
    Self = self(),
    P = queued(1),
    Starter = spawn(fun() ->
                            W = beamdiag_agent_queues:start([P], ?PERIOD),
                            Self ! {readers, beamdiag_agent_queues:readers(W)},
                            receive stop -> ok end
                    end),
    Readers = receive {readers, Rs} -> Rs after 5000 -> error(no_readers) end,
    MRefs = [erlang:monitor(process, R) || R <- Readers],
    exit(Starter, kill),
    [receive {'DOWN', M, process, _, _} -> ok after 5000 -> error(reader_on) end || M <- MRefs],
    exit(P, kill).

%%% Helpers

%% A process that holds N messages and takes none.
queued(N) ->
    P = spawn(fun() -> receive never_sent -> ok end end),
    [P ! {filler, I} || I <- lists:seq(1, N)],
    P.

key(P) ->
    list_to_binary(pid_to_list(P)).

%% The readings, once the watched processes' reading satisfies Ok.
reading(W, Ok) ->
    {ok, R} = beamdiag_test_lib:poll(
                fun() ->
                        R = beamdiag_agent_queues:read(W),
                        case map_size(R) > 0 andalso lists:all(Ok, maps:values(R)) of
                            true -> {true, R};
                            false -> {false, R}
                        end
                end, 5000),
    R.
