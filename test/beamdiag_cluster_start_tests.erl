-module(beamdiag_cluster_start_tests).
-include_lib("eunit/include/eunit.hrl").

-define(S, beamdiag_cluster_start).

%% A member's diagnosis as the agent runs it: after Delay it tells the
%% starter it is ready, waits for the word and gives the end it was told.
agent(Starter, Node, Delay) ->
    #{pid := Go} = Starter,
    fun() ->
            timer:sleep(Delay),
            Go ! {beamdiag_armed, self(), Node},
            receive {beamdiag_go, EndWall} -> {ok, {Node, EndWall}}
            after 10000 -> {error, {test, no_go}}
            end
    end.

with_starter(Fun) ->
    S = ?S:starter(),
    try Fun(S) after ?S:stop_starter(S) end.

%% Every agent ready: the windows open at once, all with one end.
all_ready_test() ->
    with_starter(
      fun(S) ->
              Tag = make_ref(),
              Cs = [?S:collector(N, N, Tag, agent(S, N, 0)) || N <- ['a@h', 'b@h', 'c@h']],
              {Results, Marks} = ?S:run_all(Cs, S, #{duration => 0.1, slack => 1.0}),
              ?assertEqual(['a@h', 'b@h', 'c@h'], [M || {M, _} <- Results]),
              Ends = lists:usort([E || {_, {ok, {_, E}}} <- Results]),
              ?assertMatch([_], Ends),
              #{armed := A, go := Go, window_end := End, ready := Ready} = Marks,
              ?assertEqual(3, Ready),
              ?assert(Go - A < 2000),
              ?assertEqual(Go + 100, End)
      end).

%% One agent ready past the wait: the others' windows do not wait for it,
%% and it is told the same end.
late_ready_test_() ->
    {timeout, 30,
     fun() ->
             with_starter(
               fun(S) ->
                       Tag = make_ref(),
                       Cs = [?S:collector('a@h', 'a@h', Tag, agent(S, 'a@h', 0)),
                             ?S:collector('b@h', 'b@h', Tag, agent(S, 'b@h', 2500))],
                       {Results, #{armed := A, go := Go, ready := Ready}} =
                           ?S:run_all(Cs, S, #{duration => 1.0, slack => 2.0}),
                       ?assertEqual(1, Ready),
                       ?assert(Go - A >= 2000),
                       [{'a@h', {ok, {'a@h', E1}}}, {'b@h', {ok, {'b@h', E2}}}] = Results,
                       ?assertEqual(E1, E2)
               end)
     end}.

%% A collector that ends before it is ready keeps its result and is not
%% waited for; one that crashes is listed.
early_end_and_crash_test() ->
    with_starter(
      fun(S) ->
              Tag = make_ref(),
              Cs = [?S:collector('a@h', 'a@h', Tag, agent(S, 'a@h', 0)),
                    ?S:collector('b@h', 'b@h', Tag, fun() -> {error, {beamdiag_remote, x}} end),
                    ?S:collector('c@h', 'c@h', Tag, fun() -> exit(boom) end)],
              {Results, #{armed := A, go := Go, ready := Ready}} =
                  ?S:run_all(Cs, S, #{duration => 0.1, slack => infinity}),
              ?assertEqual(1, Ready),
              ?assert(Go - A < 2000),
              ?assertMatch({ok, {'a@h', _}}, proplists:get_value('a@h', Results)),
              ?assertEqual({error, {beamdiag_remote, x}}, proplists:get_value('b@h', Results)),
              ?assertEqual({error, {beamdiag_cluster, {crashed, boom}}},
                           proplists:get_value('c@h', Results))
      end).

%% A collector with no answer 4 s past the report's due time is ended.
no_answer_test_() ->
    {timeout, 30,
     fun() ->
             with_starter(
               fun(S) ->
                       Tag = make_ref(),
                       Stuck = fun() -> (agent(S, 'a@h', 0))(), timer:sleep(60000) end,
                       [C = #{pid := Pid}] = [?S:collector('a@h', 'a@h', Tag, Stuck)],
                       {[{'a@h', R}], #{go := Go}} =
                           ?S:run_all([C], S, #{duration => 0.1, slack => 0}),
                       ?assertEqual({error, {beamdiag_cluster, {no_answer, 4000}}}, R),
                       ?assert(erlang:monotonic_time(millisecond) - Go >= 4100),
                       ?assertNot(is_process_alive(Pid))
               end)
     end}.

no_collectors_test() ->
    with_starter(
      fun(S) ->
              ?assertMatch({[], #{ready := 0}}, ?S:run_all([], S, #{duration => 5, slack => 1}))
      end).

%% Stopped, the starter is gone and its words are not left behind.
stop_starter_test() ->
    S = #{pid := Pid, tag := STag} = ?S:starter(),
    Pid ! {beamdiag_armed, self(), 'a@h'},
    %% The word is passed on: wait until it is here, then stop.
    receive {STag, armed, 'a@h'} = W -> self() ! W after 5000 -> ?assert(false) end,
    ?assertEqual(ok, ?S:stop_starter(S)),
    ?assertNot(is_process_alive(Pid)),
    ?assertEqual(none, receive {STag, _, _} -> left after 0 -> none end).
