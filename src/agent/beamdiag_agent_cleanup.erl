%%% @doc The end of an agent's session, on the target (erts, kernel and
%%% stdlib only): the last extras (the end walk of the process table, the
%%% host scan's readings, the long schedules, the memory room), every flag
%%% put back as it was found, the last word to the caller, and the
%%% session's modules removed.
%%%
%%% When the agent was loaded over distribution it unloads its modules at
%%% the end, so nothing of beamdiag stays on the target; on a node with
%%% more than ?PURGE_MAX_PROCESSES processes it leaves them loaded instead
%%% (purging checks every process) and reports `left_loaded' in the extras.
%%% Each wait here is bounded: the end walk ?END_WALK_MS, the long-schedule
%%% report ?SYSMON_MS, the host scan ?HOST_SCAN_WAIT_MS, the helpers putting
%%% their flags back ?HELPERS_MS.
%%%
%%% ```
%%% 1> Ref = make_ref(), Self = self().
%%% 2> State = #{caller => Self, ref => Ref, opts => #{}, proc_root => "/proc",
%%%              memory_location => none}.
%%% 3> spawn(fun() -> beamdiag_agent_cleanup:finish(State, done) end).
%%% 4> flush().
%%% Shell got {beamdiag, Ref, {done, #{memory_room => #{mem_available => ..., ...}}}}
%%% '''
-module(beamdiag_agent_cleanup).

-export([finish/2, memory_extras/1]).

-ifdef(TEST).
-export([unload_plan/2, with_room/1]).
-endif.

%% How long the end of a session waits for the host scan's last readings.
-define(HOST_SCAN_WAIT_MS, 300).
%% Above this many processes the agent does not purge its modules.
-define(PURGE_MAX_PROCESSES, 100000).
%% The longest the end of a session waits for the end walk of the process
%% table (the walk stops itself at 500 ms) and for the long-schedule report.
-define(END_WALK_MS, 1500).
-define(SYSMON_MS, 300).
%% The longest the end of a session waits for its helpers to put their
%% flags back.
-define(HELPERS_MS, 500).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Ends the session of the agent whose state is State (a
%% `beamdiag_agent_tick:tick_state()' with its caller, ref, options and
%% memory location, and its helpers when it started them): How is `done' when the window
%% ended as planned. The caller gets `{partial_extras, Quick}' first when
%% the session was aborted, then `{done, Extras}' or `{aborted, Reason}'
%% (nothing more when it gave up); then the modules go and the process
%% exits.
-spec finish(beamdiag_agent_tick:tick_state(), done | {aborted, term()}) -> no_return().
finish(State = #{caller := Caller, ref := Ref}, How) ->
    %% The end walk starts, in a process of its own.
    Walk = end_walk(State, How),
    %% What the collector can keep even when it stopped waiting: the long
    %% schedules and the start walk's figures.
    Quick = maps:merge(sysmon_extras(State), memory_extras(State)),
    _ = case How of
            {aborted, _} -> Caller ! {beamdiag, Ref, {partial_extras, Quick}};
            done -> ok
        end,
    Extras = with_room(maps:merge(maps:merge(procs_extras(Walk), host_extras(State, How)), Quick)),
    restore(State),
    {Unload, Extras2} = unload_plan(maps:get(unload, maps:get(opts, State), []), Extras),
    Last = case How of
               done -> {done, Extras2};
               {aborted, _} = A -> A
           end,
    _ = case How of
        {aborted, caller_gave_up} -> ok;
        _ -> Caller ! {beamdiag, Ref, Last}
    end,
    unload(Unload),
    exit(normal).

%% @doc The memory the node can still take (host or cgroup), read once,
%% as extras (`memory_room'); none when it cannot be read.
-spec memory_extras(#{proc_root := file:filename(),
                      memory_location := beamdiag_agent_cgroup:memory_location(),
                      atom() => term()}) -> #{memory_room => beamdiag_agent_cgroup:room()}.
memory_extras(#{proc_root := Root, memory_location := MemLoc}) ->
    try #{memory_room => beamdiag_agent_cgroup:memory_room(Root, MemLoc)}
    catch _:_ -> #{}
    end.

%%%===================================================================
%%% Internal
%%%===================================================================

%% Purging a module makes OTP's code purger check every process for
%% references to it, once or twice per module (measured: 14 to 30 s of
%% purger work for five modules on a node with a million processes). On a
%% node with more processes than the limit the agent leaves its modules
%% loaded, inert, and says so in the extras (`left_loaded'); the next
%% session reuses them, and beamdiag_loader:unload/2 removes them when the
%% node is quiet.
-spec unload_plan([module()], map()) -> {[module()], map()}.
unload_plan([], Extras) ->
    {[], Extras};
unload_plan(Mods, Extras) ->
    case erlang:system_info(process_count) > ?PURGE_MAX_PROCESSES of
        true -> {[], Extras#{left_loaded => Mods}};
        false -> {Mods, Extras}
    end.

%% The walk at the window's end, when the window ended as planned: asked
%% of the walker, waited for at most ?END_WALK_MS (the collector has the
%% start walk's report either way).
end_walk(#{procs := {error, Text}}, done) ->
    {extras, #{procs => #{error => Text}}};
end_walk(#{procs := {Ready, Walker}}, done) when Ready =:= ready; Ready =:= busy ->
    Ref = make_ref(),
    MRef = erlang:monitor(process, Walker),
    beamdiag_agent_walker:finish(Walker, Ref),
    {walking, Walker, MRef, Ref, erlang:monotonic_time(millisecond) + ?END_WALK_MS};
end_walk(#{procs := {walking, Walker}}, done) ->
    %% The start walk had not finished when the window did: no process
    %% figures, and the capture says so.
    exit(Walker, kill),
    {extras, #{procs_missing => <<"the process walk at the window's start had not finished "
                                  "by its end">>}};
end_walk(#{procs := {_, Walker}}, _) ->
    exit(Walker, kill),
    {extras, #{}};
end_walk(_, _) ->
    {extras, #{}}.

procs_extras({extras, E}) ->
    E;
procs_extras({walking, Walker, MRef, Ref, Deadline}) ->
    receive
        {Ref, {ok, Report}} ->
            erlang:demonitor(MRef, [flush]),
            #{procs => Report};
        {Ref, {error, Text}} ->
            erlang:demonitor(MRef, [flush]),
            #{procs => #{error => Text}};
        {'DOWN', MRef, process, Walker, Why} ->
            #{procs => #{error => beamdiag_agent:error_text(exit, Why)}}
    after beamdiag_agent_deadline:left(Deadline) ->
        exit(Walker, kill),
        erlang:demonitor(MRef, [flush]),
        #{procs_end_missing => iolist_to_binary(
            io_lib:format("the process walk at the window's end did not finish in ~b ms",
                          [?END_WALK_MS]))}
    end.

%% The process report carries the memory room: the queue rule says when a
%% growing mailbox would exhaust it.
-spec with_room(map()) -> map().
with_room(Extras = #{procs := P = #{queues := _}, memory_room := Room}) ->
    Extras#{procs := P#{memory_room => Room}};
with_room(Extras) ->
    Extras.

%% The long schedules seen over the window (see beamdiag_agent_sysmon).
sysmon_extras(#{sysmon := Pid}) when is_pid(Pid) ->
    case beamdiag_agent_sysmon:report(Pid, ?SYSMON_MS) of
        undefined -> #{};
        R -> #{long_schedules => R}
    end;
sysmon_extras(_) ->
    #{}.

%% What the scans read, when the window ended as planned; the scanner is
%% ended either way.
host_extras(#{host_scan := Pid}, done) when is_pid(Pid) ->
    case beamdiag_agent_host:result(Pid, ?HOST_SCAN_WAIT_MS) of
        undefined -> #{};
        Scan -> #{host_scan => Scan}
    end;
host_extras(#{host_scan := Pid}, _) when is_pid(Pid) ->
    unlink(Pid),
    exit(Pid, kill),
    #{};
host_extras(_, _) ->
    #{}.

%% Puts every flag back as it was found. The helper puts msacc back and
%% drops its scheduler_wall_time reference (counted per process: it stays
%% on for anybody else who had turned it on) when it stops, after any work
%% still waiting for a held scheduler; the long-schedule watcher frees the
%% system monitor if it took it.
restore(State) ->
    Sysmon = case maps:get(sysmon, State, undefined) of
                 Pid when is_pid(Pid) ->
                     beamdiag_agent_sysmon:stop(Pid),
                     [erlang:monitor(process, Pid)];
                 _ ->
                     []
             end,
    Probe = case maps:find(probe, State) of
                {ok, P} ->
                    beamdiag_agent_bounded_call:cast(
                      P, fun() -> erlang:system_flag(scheduler_wall_time, false) end),
                    beamdiag_agent_bounded_call:stop(P),
                    [erlang:monitor(process, beamdiag_agent_bounded_call:pid(P))];
                error ->
                    []
            end,
    MemProbe = case maps:find(memory_probe, State) of
                   {ok, MP} ->
                       beamdiag_agent_bounded_call:stop(MP),
                       [erlang:monitor(process, beamdiag_agent_bounded_call:pid(MP))];
                   error ->
                       []
               end,
    %% Their flags are back when they have ended: waited for (bounded), so
    %% that the caller finds them back when the last word comes, and the
    %% purge of the agent's modules does not cut them short. A helper held
    %% by a scheduler that does not answer finishes on its own later.
    wait_down(Sysmon ++ Probe ++ MemProbe, erlang:monotonic_time(millisecond) + ?HELPERS_MS),
    ok.

wait_down([], _Deadline) ->
    ok;
wait_down([MRef | More], Deadline) ->
    receive
        {'DOWN', MRef, process, _, _} -> wait_down(More, Deadline)
    after beamdiag_agent_deadline:left(Deadline) ->
        erlang:demonitor(MRef, [flush]),
        wait_down(More, Deadline)
    end.

%% Removes modules loaded for this session, with the BIFs the code server
%% itself calls (the session loaded them so too, beamdiag_loader): the code
%% server is a process at normal priority, and on a saturated node each of
%% its requests waits behind every runnable process (measured: 0.5 s for a
%% code:delete/1 and 5.2 s for a code:purge/1 on a lock-counting node with
%% 64 runnable writers on 2 schedulers). The deletes are done here, before
%% the agent lets go of its registered name, so that a session starting
%% meanwhile does not reuse the modules (a session loads only where no old
%% code is left, so each delete succeeds); the purges, which wait for every
%% process to say whether it runs the old code (3.1 s each on that node),
%% run in processes of their own with no code of ours, and the one of this
%% module ends the agent if it is still there, which has nothing left to do.
unload([]) ->
    ok;
unload(Mods) ->
    beamdiag_agent_code:unload(Mods).
