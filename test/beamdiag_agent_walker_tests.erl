%%% EUnit tests of the process walks' own process on this node, with this
%%% test process as the agent: the start walk's report to the agent and
%%% the caller, a process with a long queue watched all through the
%%% window and its readings sent as they change, the atom table's growth
%%% looked into, a walk in the middle, the end walk's report, and the
%%% walker's end (after the end walk, with the agent) with its queue
%%% watch; pids skipped; nothing sent to a caller that is `none'.
-module(beamdiag_agent_walker_tests).

-include_lib("eunit/include/eunit.hrl").

walker_test_() ->
    [{timeout, 60, T} || T <- [
        {"a window: start, queue readings, atoms, next, finish", fun window/0},
        {"skipped pids are not walked", fun skipped/0},
        {"no caller: nothing but the agent's words", fun no_caller/0},
        {"the walker ends with its agent", fun agent_down/0}
    ]].

window() ->
    Flooded = queued(200),
    FKey = key(Flooded),
    Ref = make_ref(),
    W = beamdiag_agent_walker:start(self(), [], {self(), Ref}),
    {Snapshot, Watch} = started(W),
    %% The start walk: every process read, the flooded one's queue at both
    %% ends of a start-only report; neither the agent nor the walker in it.
    ?assertMatch(#{mode := all, partial := start, top_reductions := []}, Snapshot),
    [Q] = [E || E = #{pid := P} <- maps:get(queues, Snapshot), P =:= FKey],
    ?assertEqual([200, 200], maps:get(queue, Q)),
    ?assertEqual([], [E || K <- [queues, heaps], E = #{pid := P} <- maps:get(K, Snapshot),
                           P =:= key(self()) orelse P =:= key(W)]),
    %% The caller gets the start report too (again with who waits on whom).
    #{queues := CallerQueues} = event(Ref, procs_start),
    ?assert(lists:any(fun(#{pid := P}) -> P =:= FKey end, CallerQueues)),
    %% The flooded process is watched; the readings go to the caller.
    ok = beamdiag_test_lib:await(fun() -> maps:is_key(FKey, beamdiag_agent_queues:read(Watch)) end,
                                 5000),
    ?assertMatch(#{queue := 200}, maps:get(FKey, reads_until(Ref, FKey, 200))),
    %% It grows, and the atom table does.
    [Flooded ! {filler, N} || N <- lists:seq(1, 50)],
    U = integer_to_list(erlang:unique_integer([positive])),
    _ = [list_to_atom("beamdiag_walker_test_" ++ U ++ "_" ++ integer_to_list(I))
         || I <- lists:seq(1, 200)],
    Atoms = erlang:system_info(atom_count),
    #{first := 200, queue := 250} = maps:get(FKey, reads_until(Ref, FKey, 250)),
    #{atoms := [A0, A1], processes := Sources} = event(Ref, atom_sources),
    ?assert(A0 >= Atoms andalso A1 >= A0),
    ?assert(is_list(Sources)),
    %% A walk in the middle, when the agent asks.
    ok = beamdiag_agent_walker:next(W),
    Next = receive {beamdiag_walk, W, {next, R}} -> R after 10000 -> error(no_next) end,
    ?assert(lists:any(fun(#{pid := P, queue := [_, 250]}) -> P =:= FKey;
                         (_) -> false
                      end, maps:get(queues, Next))),
    %% The end walk: its report to whoever asked, then the walker ends, and
    %% its queue watch with it.
    MRef = erlang:monitor(process, W),
    Fin = make_ref(),
    ok = beamdiag_agent_walker:finish(W, Fin),
    {ok, End} = receive {Fin, Rep} -> Rep after 10000 -> error(no_end) end,
    ?assertMatch(#{waits := #{suspended_samples := []}, queues := [_ | _]}, End),
    receive {'DOWN', MRef, process, W, normal} -> ok after 5000 -> error(walker_on) end,
    readers_ended(Watch),
    %% What else it told the caller (the start report again, readings).
    _ = mailbox(),
    exit(Flooded, kill).

skipped() ->
    Flooded = queued(300),
    Other = queued(50),
    W = beamdiag_agent_walker:start(self(), [Flooded], none),
    {Snapshot, Watch} = started(W),
    ?assertEqual([], [E || E = #{pid := P} <- maps:get(queues, Snapshot), P =:= key(Flooded)]),
    Watched = watched(Watch),
    ?assert(lists:member(Other, Watched)),
    ?assertNot(lists:member(Flooded, Watched)),
    finish(W),
    [exit(P, kill) || P <- [Flooded, Other]].

no_caller() ->
    _ = mailbox(),
    Flooded = queued(100),
    W = beamdiag_agent_walker:start(self(), [], none),
    {_, Watch} = started(W),
    ?assert(lists:member(Flooded, watched(Watch))),
    finish(W),
    %% The walker's words to a caller would have come before its last.
    ?assertEqual([], [M || M = {beamdiag, _, _} <- mailbox()]),
    exit(Flooded, kill).

agent_down() ->
    Self = self(),
    Agent = spawn(fun() ->
                          receive {beamdiag_walk, _, {started, _, Watch}} -> Self ! {watch, Watch}
                          end,
                          receive stop -> ok end
                  end),
    Flooded = queued(100),
    W = beamdiag_agent_walker:start(Agent, [], none),
    Watch = receive {watch, Wa} -> Wa after 10000 -> error(not_started) end,
    MRef = erlang:monitor(process, W),
    exit(Agent, kill),
    receive {'DOWN', MRef, process, W, normal} -> ok after 5000 -> error(walker_on) end,
    readers_ended(Watch),
    exit(Flooded, kill).

%%% Helpers

%% A process that holds N messages and takes none. It waits in OTP's
%% code: the walks leave out processes in beamdiag_agent* modules (the
%% agent's own helpers), and this module is one by its name.
queued(N) ->
    P = spawn(timer, sleep, [infinity]),
    [P ! {filler, I} || I <- lists:seq(1, N)],
    P.

key(P) ->
    list_to_binary(pid_to_list(P)).

started(W) ->
    receive {beamdiag_walk, W, {started, Snapshot, Watch}} -> {Snapshot, Watch}
    after 10000 -> error(not_started)
    end.

event(Ref, Tag) ->
    receive {beamdiag, Ref, {Tag, V}} -> V after 10000 -> error({no_event, Tag}) end.

%% The caller's readings, until the process's queue is Len.
reads_until(Ref, Key, Len) ->
    receive
        {beamdiag, Ref, {queue_reads, T, Reads}} ->
            ?assert(T =< erlang:monotonic_time(nanosecond)),
            case Reads of
                #{Key := #{queue := Len}} -> Reads;
                _ -> reads_until(Ref, Key, Len)
            end
    after 10000 ->
        error({no_reading, Len})
    end.

%% The watched pids, once every reader has read its process.
watched(Watch) ->
    N = length(beamdiag_agent_queues:readers(Watch)),
    ?assert(N > 0),
    ok = beamdiag_test_lib:await(fun() -> map_size(beamdiag_agent_queues:read(Watch)) =:= N end,
                                 5000),
    [list_to_pid(binary_to_list(K)) || K <- maps:keys(beamdiag_agent_queues:read(Watch))].

finish(W) ->
    Fin = make_ref(),
    ok = beamdiag_agent_walker:finish(W, Fin),
    receive {Fin, {ok, _}} -> ok after 10000 -> error(no_end) end.

readers_ended(Watch) ->
    ok = beamdiag_test_lib:await(
           fun() -> not lists:any(fun erlang:is_process_alive/1,
                                  beamdiag_agent_queues:readers(Watch)) end, 5000).

mailbox() ->
    receive M -> [M | mailbox()] after 0 -> [] end.
