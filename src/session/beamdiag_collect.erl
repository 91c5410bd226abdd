%%% @doc A collection session: starts the agent on a node (this one or a
%%% connected one), gathers its ticks for the window and returns the capture.
%%%
%%% If the target dies mid-window the ticks gathered so far are kept and
%%% returned with the error, so the caller can still show them. If the
%%% agent's last word is late (a throttled node stalls whole for seconds)
%%% or it stops early, two samples or more are returned as a capture marked
%%% `complete => false' with a note saying what is missing. With `ready_by'
%%% (a monotonic time in ms) the collector does not wait past it once it
%%% holds two samples while the agent is still behind on its ticks: the
%%% report is due then, and the agent is told to end. An agent that has
%%% sent its last tick is waited for while it gathers its extras.
%%% It talks to the agent through `beamdiag_client', as the live view does,
%%% and builds the capture with `beamdiag_capture:new/3'.
%%%
%%% ```
%%% 1> {ok, Capture} = beamdiag_collect:run(node(), #{duration_ms => 3000, interval_ms => 1000}).
%%% 2> length(maps:get(samples, Capture)).
%%% 4
%%% '''
-module(beamdiag_collect).

-export([run/2, format_error/1]).
%% Called as Module:format_error/1 on an {error, {Module, Reason}} value.
-ignore_xref([{format_error, 1}]).

-export_type([options/0]).

%% run/2's options (see there): the agent's (beamdiag_agent:opts()) and
%% the session's own. Open: callers' other keys (`locks', `tag') are not
%% read.
-type options() :: #{
    duration_ms := pos_integer(),
    interval_ms => pos_integer(),
    msacc => boolean(),
    msacc_ms => pos_integer(),
    procs => boolean(),
    host_scan => boolean(),
    unload => [module()],
    proc_root => file:filename(),
    end_wall_ms => integer(),
    go => pid(),
    ready_by => integer() | infinity,
    ready_after_ms => non_neg_integer() | undefined,
    fallback => false | fun(() -> boolean()),
    progress => fun((non_neg_integer(), pos_integer()) -> term()),
    on_sample => fun((beamdiag_agent_tick:sample()) -> term()) | undefined,
    here_scan => #{root := file:filename(), exclude := [pos_integer()]},
    atom() => term()
}.

%% How long past the agent's own deadline we wait for its last word.
-define(LATE_MS, 2000).
%% The agent's least grace time past the window (beamdiag_agent).
-define(GRACE_MS, 5000).
%% How long a collector that stopped waiting gives the agent for its
%% last word's quick extras, at most.
-define(QUICK_MS, 300).
%% Past the time the report is due, the collector waits at most this long
%% for anything (the quick extras, the extras of an agent
%% that answered the whole window): the report is printed by the window
%% plus 2 s with the default slack (1.5 s), analysis included.
-define(CEILING_MS, 250).
%% How long one scan of the host's processes from here may take at the
%% end, and the first, at the start, beside the window.
-define(HERE_SCAN_MS, 150).
%% A last scan from here past the due time: ended this long before the
%% ceiling (its readers answer that soon after their deadline unless a
%% read itself hangs), and given this long at least.
-define(HERE_SCAN_MIN_MS, 40).
-define(HERE_GRACE_MS, 30).
-define(HERE_FIRST_MS, 1000).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Runs one window on Node. Options: `duration_ms', `interval_ms',
%% `msacc', `msacc_ms' (the end of the window msacc covers; default the
%% whole window), `unload' (modules the agent removes when done),
%% `ready_by' (monotonic ms, default `infinity': when the capture is due;
%% past it, two samples or more end the session as a partial capture),
%% `ready_after_ms' (the capture is due that long after the end of the
%% window the agent runs, from its start: for an agent whose window
%% starts later, `go'), `go' (a pid: the agent gets ready, tells that
%% process, and starts its window when it says so: beamdiag_agent),
%% `fallback' (false; or, when the caller has a view of the node of its
%% own to fall back on, the host's, a fun that says whether that view
%% explains the node's slowness: asked once, when the report is due and
%% fewer than two samples have come; if it does, the agent is stopped and
%% the session ends with `{error, {beamdiag_collect, {due, #{info,
%% extras}}}}', what the agent sent; if not, the samples are waited for,
%% within the agent's own deadline),
%% `here_scan' (the node runs on this host: the /proc to read and the OS
%% pids that are not its competitors; the collector scans the host's
%% processes at the start and, when the capture is cut short without the
%% agent's own host scan, at its end, so that a starved node's report
%% still names who took the CPUs),
%% `progress', a fun called with (ElapsedMs, DurationMs) after each tick, and
%% `on_sample', a fun called with each sample as it arrives (then only the
%% first and the last sample are kept in the capture).
-spec run(node(), options()) -> {ok, beamdiag_capture:capture()} | {error, {beamdiag_collect, term()}}.
run(Node, Opts) ->
    %% beamdiag's own OS process is not one of the node's competitors.
    AgentOpts = maps:merge(#{exclude_pids => [list_to_integer(os:getpid())]},
                           maps:with([duration_ms, interval_ms, msacc, msacc_ms, procs, host_scan,
                                      unload, proc_root, end_wall_ms, go], Opts)),
    Progress = maps:get(progress, Opts, fun(_, _) -> ok end),
    OnSample = maps:get(on_sample, Opts, undefined),
    case beamdiag_client:start(Node, AgentOpts) of
        {ok, Client} ->
            #{duration_ms := D} = AgentOpts,
            %% Until the agent says when its own deadline is: the window and
            %% the agent's least grace time, from now.
            Deadline = erlang:monotonic_time(millisecond) + D + ?GRACE_MS + ?LATE_MS,
            Here = here_first(maps:get(here_scan, Opts, undefined)),
            Result = gather(#{client => Client, deadline => Deadline,
                              ready_by => maps:get(ready_by, Opts, infinity),
                              ready_after => maps:get(ready_after_ms, Opts, undefined),
                              fallback => maps:get(fallback, Opts, false),
                              finishing => false,
                              progress => Progress, duration => D, info => undefined,
                              samples => [], on_sample => OnSample,
                              here => Here}),
            beamdiag_client:close(Client),
            here_end(Here),
            Result;
        {error, {beamdiag_client, Why}} ->
            {error, {?MODULE, Why}}
    end.

%% @doc Turns an error reason of this module into a sentence.
-spec format_error(term()) -> iolist().
format_error({agent_start, _, _} = Why) ->
    beamdiag_client:format_error(Why);
format_error({target_down, Reason, #{samples := S}}) ->
    io_lib:format("the target went away mid-window (~ts) after ~b samples; "
                  "the partial capture is kept", [down_text(Reason), length(S)]);
format_error({target_down, Reason, undefined}) ->
    io_lib:format("the target went away before the first sample (~ts)", [down_text(Reason)]);
format_error({agent_aborted, Why}) ->
    io_lib:format("the agent stopped early (~ts)", [beamdiag_client:ended({aborted, Why})]);
format_error({due, _}) ->
    "the node's first samples did not come before the report was due: it is overloaded or a "
    "scheduler is held";
format_error(timeout) ->
    "the agent did not finish in time".

%%%===================================================================
%%% Internal
%%%===================================================================

down_text(R) -> beamdiag_client:ended({down, R}).

%% The deadline follows the agent's own: its start and each move of its
%% hard deadline (ticks that cost seconds push it out) say how long it may
%% still take, and the collector waits that long plus ?LATE_MS for transit.
gather(G = #{finishing := Finishing, duration := D, info := Info, samples := Samples}) ->
    Now = erlang:monotonic_time(millisecond),
    ReadyBy = ready_by(G),
    Due = ReadyBy =/= infinity andalso Now >= ReadyBy,
    case Due andalso due(Info, Samples) of
        true when Finishing ->
            %% Every tick came and the extras did not, by the ceiling: what
            %% came is kept (the start walk brought forward, the long
            %% schedules), and the capture says the
            %% rest is missing.
            beamdiag_client:abort(maps:get(client, G)),
            late(here_last(partial_extras(G), G, ceiling(G)), Info, Samples, D, extras_due);
        true ->
            %% The report is due and two samples make a window: the agent
            %% ends now (flags back, modules gone) and what came is kept.
            beamdiag_client:abort(maps:get(client, G)),
            late(here_last(quick_extras(G), G, ceiling(G)), Info, Samples, D, due);
        false when Due, is_function(map_get(fallback, G), 0) ->
            %% Fewer, with a view to fall back on: when it explains the
            %% slowness, or what the agent sent already names what is wrong
            %% (a queue's growth from the start walk and the queue watch,
            %% who waits on whom), the caller reports from it, with what the
            %% agent sent (its settings, the start walk, the long
            %% schedules), not waited for; when not, the samples are
            %% worth the wait (a blocked scheduler shows only in the VM's
            %% figures).
            Fallback = map_get(fallback, G),
            case Fallback() orelse procs_named(G) of
                true ->
                    beamdiag_client:abort(maps:get(client, G)),
                    {error, {beamdiag_collect, {due, #{info => Info,
                                                       extras => partial_extras(G)}}}};
                false ->
                    gather(G#{fallback := false}, Now)
            end;
        false ->
            gather(G, Now)
    end.

gather(G = #{client := Client, deadline := Deadline,
             progress := Progress, duration := D, info := Info, samples := Samples}, Now) ->
    ReadyBy = ready_by(G),
    Until = case ReadyBy of
        infinity -> Deadline;
        _ when ReadyBy > Now -> min(Deadline, ReadyBy);
        _ -> Deadline
    end,
    Wait = max(0, Until - Now),
    case beamdiag_client:next(Client, Wait) of
        {event, {start, I}} ->
            gather(moved(due_after(G#{info := I}), maps:get(deadline_in_ms, I, undefined)));
        {event, {deadline, InMs}} ->
            gather(moved(G, InMs));
        {event, {tick, S}} ->
            Samples2 = keep(S, Samples, maps:get(on_sample, G)),
            report_progress(Progress, Samples2, D),
            gather(G#{samples := Samples2});
        {event, {procs_start, Snapshot}} ->
            %% The start walk's report: kept for a capture cut short.
            gather(G#{procs_start => Snapshot});
        {event, {atom_sources, Sources}} ->
            %% Which processes were running when the atom table grew.
            gather(G#{atom_sources => Sources});
        {event, {queue_reads, T, Reads}} ->
            %% The queue watch's latest readings (from the walker, beside
            %% the ticks): kept to bring the start walk's report forward.
            gather(G#{queue_reads => #{t => T, queue_reads => Reads}});
        {event, {partial_extras, Quick}} ->
            gather(G#{quick => Quick});
        {event, {long_schedules, LS}} ->
            %% The long schedules so far (sent while events come).
            gather(G#{long_schedules => LS});
        {event, finishing} ->
            %% Every tick came: a late report now is the extras' cost, not
            %% a node too slow to answer; wait for them.
            gather(G#{finishing := true});
        {event, {done, Extras}} ->
            {ok, capture(Info, Samples, atom_sources(end_walk(Extras, G), G), true, D)};
        {event, {aborted, Why}} ->
            late(here_last(partial_extras(G), G, infinity), Info, Samples, D, {agent_aborted, Why});
        {event, _} ->
            %% A word a window does not ask for (the live view's walks).
            gather(G);
        {down, Reason} ->
            Partial = case Info of
                          undefined ->
                              undefined;
                          _ ->
                              C = capture(Info, Samples, partial_extras(G), false, D),
                              C#{notes => [iolist_to_binary(
                                  io_lib:format("partial capture: the target went away mid-window "
                                                "(~0P) after ~b samples", [Reason, 6, length(Samples)]))
                                           | maps:get(notes, C)]}
                      end,
            {error, {beamdiag_collect, {target_down, Reason, Partial}}};
        timeout ->
            case not beamdiag_agent_deadline:in_time(Deadline) of
                true -> late(here_last(partial_extras(G), G, infinity), Info, Samples, D, timeout);
                false -> gather(G)
            end
    end.

%% The host's processes read from here, when the node runs on this host
%% (`here_scan'): the first scan starts now, in a process of its own,
%% bounded by ?HERE_FIRST_MS (on a host whose CPUs are all taken, this
%% VM waits for a CPU too: a first scan bounded by 150 ms was seen to read
%% none of 71 processes).
here_first(#{root := Root, exclude := Exclude}) ->
    Own = list_to_integer(os:getpid()),
    Until = erlang:monotonic_time(millisecond) + ?HERE_FIRST_MS,
    Self = self(),
    Ref = make_ref(),
    {Pid, MRef} = spawn_monitor(fun() ->
                                    Self ! {Ref, beamdiag_agent_host:cpu_by_process(Root, [Own | Exclude], Until)}
                                end),
    #{root => Root, exclude => [Own | Exclude], first => {Pid, MRef, Ref}};
here_first(undefined) ->
    undefined.

%% The first scan from here, when it has ended by Wait ms from now;
%% `undefined' when it has not (it is ended) or there is none.
here_first_scan(Here = #{first := {Pid, MRef, Ref}}, Wait) ->
    receive
        {Ref, Scan} -> Scan;
        {'DOWN', MRef, process, Pid, _} -> undefined
    after Wait ->
        here_end(Here),
        undefined
    end.

%% The first scan from here is ended, and its word dropped, whatever came
%% of the session.
here_end(#{first := {Pid, MRef, Ref}}) ->
    exit(Pid, kill),
    erlang:demonitor(MRef, [flush]),
    receive {Ref, _} -> ok after 0 -> ok end;
here_end(undefined) ->
    ok.

%% A capture cut short keeps the agent's host scan when it came with its
%% last readings; without them (the node was too starved to finish its
%% own: asked early, its scanner answers with its first scan alone, or
%% none), the last scan is read from here, over the same processes, and
%% makes the pair the ledger reads.
here_last(Extras = #{host_scan := #{last := Last}}, _G, _Until) when map_size(Last) > 0 ->
    Extras;
here_last(Extras, #{here := Here = #{root := Root, exclude := Exclude}}, Until) ->
    %% Past the report's due time both scans share what is left of the
    %% ceiling: the first is taken when it has ended (it started with the
    %% window), the last is read for what is left less its readers' grace,
    %% ?HERE_SCAN_MIN_MS at least.
    FirstWait = case Until of
                    infinity -> ?HERE_SCAN_MS;
                    _ -> min(?HERE_SCAN_MS, beamdiag_agent_deadline:left(Until))
                end,
    case here_first_scan(Here, FirstWait) of
        #{procs := A, truncated := TA} ->
            LastMs = case Until of
                         infinity -> ?HERE_SCAN_MS;
                         _ -> max(?HERE_SCAN_MIN_MS, min(?HERE_SCAN_MS, beamdiag_agent_deadline:left(Until)
                                                                           - ?HERE_GRACE_MS))
                     end,
            #{procs := B, truncated := TB} =
                beamdiag_agent_host:cpu_by_process(Root, Exclude,
                                                   erlang:monotonic_time(millisecond) + LastMs),
            Extras#{host_scan => #{first => A, last => B, truncated => TA orelse TB,
                                   read_here => true}};
        undefined ->
            Extras
    end;
here_last(Extras, _G, _Until) ->
    Extras.

%% The latest the collector waits for anything once the report is due.
ceiling(#{ready_by := ReadyBy}) when is_integer(ReadyBy) -> ReadyBy + ?CEILING_MS;
ceiling(_) -> infinity.

%% Whether the process data the agent sent so far names a finding on its
%% own (no ledger needed): on a node too slow for two ticks before the
%% report is due, that is worth reporting on time.
procs_named(G) ->
    case maps:find(procs, partial_extras(G)) of
        {ok, Procs} -> beamdiag_proc_rules:named(Procs);
        error -> false
    end.

%% Two samples make a window.
due(Info, [_, _ | _]) -> Info =/= undefined;
due(_, _) -> false.

%% With an on_sample fun, each sample goes to it as it arrives and only the
%% first and the last are kept: a long window stays small.
keep(S, Samples, undefined) ->
    [S | Samples];
keep(S, Samples, OnSample) ->
    _ = OnSample(S),
    case Samples of
        [] -> [S];
        _ -> [S, lists:last(Samples)]
    end.

%% With `ready_after_ms', the report is due that long after the end of
%% the window the agent says it runs (its start word): the common end it
%% holds to (`end_wall_ms', a time of this node's clock, which set it),
%% else its window from when the word came.
due_after(G = #{ready_after := After, info := #{end_wall_ms := EndWall}}) when is_integer(After) ->
    Now = erlang:monotonic_time(millisecond),
    G#{ready_by := Now + max(0, EndWall - erlang:system_time(millisecond)) + After};
due_after(G = #{ready_after := After, info := #{duration_ms := D}}) when is_integer(After) ->
    G#{ready_by := erlang:monotonic_time(millisecond) + D + After};
due_after(G) ->
    G.

%% When the report is due.
ready_by(#{ready_by := infinity}) ->
    infinity;
ready_by(G = #{finishing := true}) ->
    %% The extras of a window answered whole are worth the wait, up to the
    %% ceiling.
    ceiling(G);
ready_by(#{ready_by := ReadyBy}) ->
    ReadyBy.

moved(G, InMs) when is_integer(InMs) ->
    G#{deadline := erlang:monotonic_time(millisecond) + InMs + ?LATE_MS};
moved(G, _) ->
    G.

%% What a capture cut short keeps beside its samples: the long schedules
%% the agent sent with its last word, and the start walk's process report
%% brought forward with the queue lengths of the last tick.
partial_extras(G) ->
    Quick0 = case {maps:get(quick, G, #{}), maps:find(long_schedules, G)} of
                 {Q = #{long_schedules := _}, _} -> Q;
                 {Q, {ok, LS}} -> Q#{long_schedules => LS};
                 {Q, error} -> Q
             end,
    %% The memory room the agent read at its start, when its last word
    %% did not bring a fresher one.
    Quick = case {Quick0, maps:get(info, G, undefined)} of
                {#{memory_room := _}, _} -> Quick0;
                {_, #{memory_room := StartRoom}} when map_size(StartRoom) > 0 ->
                    Quick0#{memory_room => StartRoom};
                _ -> Quick0
            end,
    Quick2 = atom_sources(Quick, G),
    case maps:find(procs_start, G) of
        {ok, Snapshot} ->
            Procs = forward(Snapshot, G),
            Quick2#{procs => case Quick2 of
                                 #{memory_room := Room} -> Procs#{memory_room => Room};
                                 _ -> Procs
                             end};
        error -> Quick2
    end.

%% The processes the walker found running when the atom table grew, if it
%% looked.
atom_sources(Extras, #{atom_sources := Sources}) -> Extras#{atom_sources => Sources};
atom_sources(Extras, _G) -> Extras.

%% The agent was told to end because the report is due: its long-schedule
%% report comes with its last word, waited for briefly.
quick_extras(G = #{client := Client}) ->
    Wait = min(?QUICK_MS, beamdiag_agent_deadline:left(ceiling(G))),
    case beamdiag_client:await(Client, partial_extras, Wait) of
        {ok, Quick} -> partial_extras(G#{quick => Quick});
        timeout -> partial_extras(G)
    end.

%% A finished capture whose end walk did not finish in time keeps the start
%% walk's report, brought forward.
end_walk(Extras = #{procs_end_missing := _}, G = #{procs_start := Snapshot}) ->
    case maps:is_key(procs, Extras) of
        true -> Extras;
        false ->
            Procs = forward(Snapshot, G),
            Extras#{procs => case Extras of
                                 #{memory_room := Room} -> Procs#{memory_room => Room};
                                 _ -> Procs
                             end}
    end;
end_walk(Extras, _G) ->
    Extras.

%% The start walk's report brought forward with the queue watch's latest
%% readings: the walker's own, or a tick's when it is newer (samples are
%% newest first; the walk was taken just after the first).
forward(Snapshot, G = #{samples := Samples}) ->
    case maps:find(queue_reads, G) of
        {ok, R = #{t := T}} ->
            Newer = [S || S = #{t := ST} <- Samples, ST >= T],
            beamdiag_proc_forward:forward(Snapshot, Newer ++ [R | Samples -- Newer]);
        error ->
            beamdiag_proc_forward:forward(Snapshot, Samples)
    end.

%% The agent's last word came late or not at all: two samples are a window,
%% and what they show is kept, marked partial, with a note, and with what
%% the agent sent before (the start walk, the long schedules).
late(Extras, Info, Samples = [_, _ | _], D, Why) when Info =/= undefined ->
    C = capture(Info, Samples, Extras, false, D),
    #{samples := [#{t := T0} | _]} = C,
    #{t := T1} = hd(Samples),
    Note = iolist_to_binary(
             io_lib:format("partial capture: ~s; the ledger and findings cover the ~b samples "
                           "gathered over ~.1f s of the ~.1f s window",
                           [late_text(Why), length(Samples), (T1 - T0) / 1.0e9, D / 1000])),
    {ok, C#{notes => [Note | maps:get(notes, C)]}};
late(_Extras, _Info, _Samples, _D, Why) ->
    {error, {beamdiag_collect, Why}}.

late_text(timeout) -> "the agent's last word did not come in time";
late_text(extras_due) -> "every tick came, but the agent's end-of-window extras (the end walk, "
                         "the host scan) did not come by the report's due time";
late_text(due) -> "the node's ticks came too slowly for the report to be ready at the window's "
                  "end plus its slack, so the agent was stopped";
late_text({agent_aborted, deadline}) -> "the agent reached its deadline before its last tick";
late_text({agent_aborted, Why}) -> io_lib:format("the agent stopped early (~0p)", [Why]).

report_progress(Progress, [#{t := T} | _] = Samples, D) ->
    #{t := T0} = lists:last(Samples),
    Progress((T - T0) div 1000000, D).

capture(Info, RevSamples, Extras, Complete, D) ->
    beamdiag_capture:new(Info, lists:reverse(RevSamples),
                         #{duration_ms => asked(Info, D), extras => Extras, complete => Complete,
                           notes => extras_notes(Extras)}).

%% The window the agent ran: the one asked for, or what was left of a
%% common window (`end_wall_ms') when it started.
asked(#{duration_ms := Ms}, _) -> Ms;
asked(_, D) -> D.

%% What the extras say is missing: the long schedules when the node's
%% system monitor was taken, the end walk when it did not finish in time.
extras_notes(Extras) ->
    Sched = case maps:find(long_schedules, Extras) of
                {ok, LS = #{}} ->
                    case beamdiag_sched_rules:note(LS) of
                        none -> [];
                        N -> [N]
                    end;
                _ -> []
            end,
    Walk = case maps:find(procs_end_missing, Extras) of
               {ok, W} when is_binary(W) ->
                   [<<W/binary, ": the process figures are the start walk's, with the queue "
                      "lengths of the last tick">>];
               _ -> []
           end,
    Missing = case maps:find(procs_missing, Extras) of
                  {ok, M} when is_binary(M) -> [<<M/binary, ": the report has no process figures">>];
                  _ -> []
              end,
    Sched ++ Walk ++ Missing.
