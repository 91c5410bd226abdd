%%% EUnit tests of beamdiag_agent_processes on this VM's own processes: a
%%% busy process tops the reductions, a growing mailbox tops the queues, a
%%% process born in the window is marked so, and every list is bounded.
-module(beamdiag_agent_processes_tests).

-include_lib("eunit/include/eunit.hrl").

%% Waits until P's queue holds at least N messages.
queue_at_least(P, N) ->
    case process_info(P, message_queue_len) of
        {message_queue_len, Q} when Q >= N -> ok;
        _ -> timer:sleep(5), queue_at_least(P, N)
    end.

window_test_() ->
    {timeout, 60, fun window/0}.

window() ->
    Self = self(),
    %% A mailbox that grows over the window: a process that never reads.
    Sink = spawn(beamdiag_test_loops, sink, []),
    S = beamdiag_agent_processes:start(#{skip => [Self]}),
    Busy = spawn(beamdiag_test_loops, busy, []),
    [Sink ! {m, I} || I <- lists:seq(1, 5000)],
    ok = queue_at_least(Sink, 5000),
    %% The busy process runs: its reductions over the window pass a
    %% million (read apart from the module under test).
    wait_reductions(Busy, 1000000),
    R = beamdiag_agent_processes:finish(S, #{}),
    Busy ! stop,
    exit(Sink, kill),
    B = list_to_binary(pid_to_list(Busy)),
    K = list_to_binary(pid_to_list(Sink)),
    #{top_reductions := Tops, queues := Queues, reductions := Total,
      process_count := [C0, C1], truncated := false} = R,
    %% The busy process is first by reductions, born in the window.
    [#{pid := B, born := true, reductions := BR} | _] = Tops,
    ?assert(BR >= 1000000),
    %% A share of the node's reductions, never more than the whole.
    ?assert(BR =< Total),
    %% The sink's queue went from 0 to 5000 over the window.
    [#{pid := K, queue := [Q0, Q1]} | _] = Queues,
    ?assertEqual(0, Q0),
    ?assertEqual(5000, Q1),
    %% Bounded lists; this test's own process left out.
    ?assert(length(Tops) =< 10 andalso length(Queues) =< 10),
    Me = list_to_binary(pid_to_list(Self)),
    ?assertEqual([], [E || E = #{pid := P} <- Tops ++ Queues, P =:= Me]),
    ?assert(C0 > 0 andalso C1 > 0).

wait_reductions(P, N) ->
    case process_info(P, reductions) of
        {reductions, R} when R >= N -> ok;
        _ -> timer:sleep(10), wait_reductions(P, N)
    end.

%% The walk lists every process up to its bound, and past it a sample.
pids_test() ->
    S = beamdiag_agent_processes:start(#{}),
    Pids = beamdiag_agent_processes:pids(S),
    ?assert(length(Pids) >= erlang:system_info(process_count) div 2),
    Small = beamdiag_agent_processes:start(#{walk_max => 10}),
    ?assert(length(beamdiag_agent_processes:pids(Small)) =< 10 + length(registered())).

%% A snapshot has the start walk's figures in the end report's shape.
snapshot_test() ->
    Snap = beamdiag_agent_processes:snapshot(beamdiag_agent_processes:start(#{})),
    ?assertMatch(#{top_reductions := _, queues := _, heaps := _, partial := _, word_bytes := _}, Snap),
    ?assertEqual(erlang:system_info(wordsize), maps:get(word_bytes, Snap)).
