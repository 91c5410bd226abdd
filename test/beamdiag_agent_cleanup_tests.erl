%%% EUnit tests of the end of an agent's session: the words its caller
%%% gets for each way a session ends, the extras (the end walk's report,
%%% the memory room from a recorded /proc/meminfo), and the unload plan.
-module(beamdiag_agent_cleanup_tests).

-include_lib("eunit/include/eunit.hrl").

%% 2 GiB of memory, 512 MiB of it available (kB, as the kernel writes it).
-define(MEMINFO, <<"MemTotal:        2097152 kB\nMemFree:          100000 kB\n"
                   "MemAvailable:     524288 kB\n">>).

cleanup_test_() ->
    {setup, fun proc_root/0, fun(Root) -> file:del_dir_r(Root) end,
     fun(Root) ->
         [{"done: the last word carries the extras", fun() -> done(Root) end},
          {"aborted: the quick extras first, then why", fun() -> aborted(Root) end},
          {"the caller gave up: no last word", fun() -> gave_up(Root) end},
          {"the end walk's report, with the memory room", fun() -> end_walk(Root) end},
          {"a walk that failed: its error is the report", fun() -> walk_failed(Root) end},
          {"aborted: the walker is ended, not asked", fun() -> walker_killed(Root) end}]
     end}.

done(Root) ->
    {Pid, Ref} = finish(Root, #{}, done),
    ?assertEqual([{done, #{memory_room => room()}}], words(Ref)),
    ?assertEqual(normal, down(Pid)).

aborted(Root) ->
    {Pid, Ref} = finish(Root, #{}, {aborted, deadline}),
    ?assertEqual([{partial_extras, #{memory_room => room()}}, {aborted, deadline}], words(Ref)),
    ?assertEqual(normal, down(Pid)).

gave_up(Root) ->
    {_Pid, Ref} = finish(Root, #{}, {aborted, caller_gave_up}),
    ?assertEqual([{partial_extras, #{memory_room => room()}}], words(Ref)).

end_walk(Root) ->
    Walker = spawn(fun() ->
                       receive
                           {beamdiag_walk_finish, From, WRef} ->
                               From ! {WRef, {ok, #{queues => [], heaps => []}}}
                       end
                   end),
    {_, Ref} = finish(Root, #{procs => {ready, Walker}}, done),
    [{done, Extras}] = words(Ref),
    ?assertEqual(#{queues => [], heaps => [], memory_room => room()}, maps:get(procs, Extras)).

walk_failed(Root) ->
    {_, Ref} = finish(Root, #{procs => {error, <<"error:badarg">>}}, done),
    [{done, Extras}] = words(Ref),
    ?assertEqual(#{error => <<"error:badarg">>}, maps:get(procs, Extras)).

walker_killed(Root) ->
    Walker = spawn(fun() -> receive never -> ok end end),
    MRef = erlang:monitor(process, Walker),
    {_, Ref} = finish(Root, #{procs => {ready, Walker}}, {aborted, deadline}),
    ?assertMatch([{partial_extras, _}, {aborted, deadline}], words(Ref)),
    receive {'DOWN', MRef, process, Walker, Why} -> ?assertEqual(killed, Why)
    after 5000 -> error(walker_left)
    end.

memory_extras_test() ->
    %% Nothing to read: an empty room, not an error.
    ?assertEqual(#{memory_room => #{}},
                 beamdiag_agent_cleanup:memory_extras(#{proc_root => "/nonexistent",
                                                        memory_location => none})),
    Root = proc_root(),
    try
        ?assertEqual(#{memory_room => room()},
                     beamdiag_agent_cleanup:memory_extras(#{proc_root => Root,
                                                            memory_location => none}))
    after
        file:del_dir_r(Root)
    end.

%% A node of a few hundred processes purges its modules; no modules, no plan.
unload_plan_test() ->
    ?assertEqual({[], #{a => 1}}, beamdiag_agent_cleanup:unload_plan([], #{a => 1})),
    ?assertEqual({[m1, m2], #{}}, beamdiag_agent_cleanup:unload_plan([m1, m2], #{})).

%% The memory room goes into a process report that has queues.
with_room_test() ->
    Room = #{room => 10},
    ?assertEqual(#{procs => #{queues => [], memory_room => Room}, memory_room => Room},
                 beamdiag_agent_cleanup:with_room(#{procs => #{queues => []}, memory_room => Room})),
    Failed = #{procs => #{error => <<"x">>}, memory_room => Room},
    ?assertEqual(Failed, beamdiag_agent_cleanup:with_room(Failed)),
    ?assertEqual(#{procs => #{queues => []}},
                 beamdiag_agent_cleanup:with_room(#{procs => #{queues => []}})).

%%% Helpers

%% A session's end in a process of its own (finish/2 exits), as the agent.
finish(Root, Extra, How) ->
    Self = self(),
    Ref = make_ref(),
    State = maps:merge(#{caller => Self, ref => Ref, opts => #{}, proc_root => Root,
                         memory_location => none}, Extra),
    {Pid, _} = spawn_monitor(fun() -> beamdiag_agent_cleanup:finish(State, How) end),
    {Pid, Ref}.

down(Pid) ->
    receive {'DOWN', _, process, Pid, Why} -> Why after 5000 -> error(still_there) end.

%% The words that came for Ref within a short while, in order.
words(Ref) ->
    receive {beamdiag, Ref, W} -> [W | words(Ref)]
    after 300 -> []
    end.

room() ->
    #{mem_total => 2097152 * 1024, mem_available => 524288 * 1024, room => 524288 * 1024,
      bound_by => host}.

proc_root() ->
    Dir = filename:join(["/tmp", "beamdiag_cleanup_tests_" ++ os:getpid() ++ "_"
                         ++ integer_to_list(erlang:unique_integer([positive]))]),
    ok = filelib:ensure_dir(filename:join(Dir, "meminfo")),
    ok = file:write_file(filename:join(Dir, "meminfo"), ?MEMINFO),
    Dir.
