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
%%% sent its last tick is waited for while it gathers its extras, and a
%%% lock-counting session waits for its lock data, which comes last.
%%%
%%% ```
%%% 1> {ok, Capture} = beamdiag_collect:run(node(), #{duration_ms => 3000, interval_ms => 1000}).
%%% 2> length(maps:get(samples, Capture)).
%%% 4
%%% '''
-module(beamdiag_collect).

-export([run/2, format_error/1]).

-export_type([capture/0]).

%% samples and settings are all the ledger needs; the rest describes the run.
-type capture() :: #{
    samples := [beamdiag_agent:sample()],
    settings := map(),
    schema => binary(),
    node => binary(),
    interval_ms => non_neg_integer(),
    duration_ms => non_neg_integer(),
    wall_start_ms => integer(),
    extras => map(),
    complete => boolean(),
    notes => [binary()],
    cgroup_location => map(),
    msacc_was_on => boolean()
}.

-define(SCHEMA, <<"beamdiag.capture/1">>).
%% How long past the agent's own deadline we wait for its last word.
-define(LATE_MS, 2000).
%% The agent's least grace time past the window (beamdiag_agent).
-define(GRACE_MS, 5000).
-define(CALL_TIMEOUT, 5000).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Runs one window on Node. Options: `duration_ms', `interval_ms',
%% `msacc', `msacc_ms' (the end of the window msacc covers; default the
%% whole window), `locks', `unload' (modules the agent removes when done),
%% `ready_by' (monotonic ms, default `infinity': when the capture is due;
%% past it, two samples or more end the session as a partial capture),
%% `progress', a fun called with (ElapsedMs, DurationMs) after each tick, and
%% `on_sample', a fun called with each sample as it arrives (then only the
%% first and the last sample are kept in the capture).
-spec run(node(), map()) -> {ok, capture()} | {error, {beamdiag_collect, term()}}.
run(Node, Opts) ->
    %% beamdiag's own OS process is not one of the node's competitors.
    AgentOpts = maps:merge(#{exclude_pids => [list_to_integer(os:getpid())]},
                           maps:with([duration_ms, interval_ms, msacc, msacc_ms, locks, procs, host_scan,
                                      unload, proc_root], Opts)),
    Progress = maps:get(progress, Opts, fun(_, _) -> ok end),
    OnSample = maps:get(on_sample, Opts, undefined),
    case start_agent(Node, AgentOpts) of
        {ok, Agent, Ref} ->
            MRef = erlang:monitor(process, Agent),
            #{duration_ms := D} = AgentOpts,
            %% Until the agent says when its own deadline is: the window and
            %% the agent's least grace time, from now.
            Deadline = erlang:monotonic_time(millisecond) + D + ?GRACE_MS + ?LATE_MS,
            Result = gather(#{ref => Ref, mref => MRef, deadline => Deadline,
                              ready_by => maps:get(ready_by, Opts, infinity), agent => Agent,
                              finishing => false,
                              progress => Progress, duration => D, info => undefined,
                              samples => [], on_sample => OnSample}),
            erlang:demonitor(MRef, [flush]),
            flush(Ref),
            Result;
        {error, _} = E ->
            E
    end.

%% @doc Turns an error reason of this module into a sentence.
-spec format_error(term()) -> iolist().
format_error({agent_start, Node, Reason}) ->
    io_lib:format("cannot start the agent on ~s: ~p", [Node, Reason]);
format_error({target_down, Reason, #{samples := S}}) ->
    io_lib:format("the target went away mid-window (~p) after ~b samples; "
                  "the partial capture is kept", [Reason, length(S)]);
format_error({target_down, Reason, undefined}) ->
    io_lib:format("the target went away before the first sample (~p)", [Reason]);
format_error({agent_aborted, Why}) ->
    io_lib:format("the agent stopped early: ~p", [Why]);
format_error(timeout) ->
    "the agent did not finish in time".

%%%===================================================================
%%% Internal
%%%===================================================================

start_agent(Node, Opts) when Node =:= node() ->
    beamdiag_agent:start(self(), Opts);
start_agent(Node, Opts) ->
    try erpc:call(Node, beamdiag_agent, start, [self(), Opts], ?CALL_TIMEOUT) of
        {ok, _, _} = Ok -> Ok
    catch
        Class:Reason -> {error, {beamdiag_collect, {agent_start, Node, {Class, Reason}}}}
    end.

%% The deadline follows the agent's own: its start and each move of its
%% hard deadline (ticks that cost seconds push it out) say how long it may
%% still take, and the collector waits that long plus ?LATE_MS for transit.
gather(G = #{ready_by := ReadyBy, finishing := Finishing, duration := D, info := Info,
             samples := Samples}) ->
    Now = erlang:monotonic_time(millisecond),
    case ReadyBy =/= infinity andalso Now >= ReadyBy andalso not Finishing
             andalso due(Info, Samples) of
        true ->
            %% The report is due and two samples make a window: the agent
            %% ends now (flags back, modules gone) and what came is kept.
            maps:get(agent, G) ! {beamdiag_abort, self()},
            late(Info, Samples, D, due);
        false ->
            gather(G, Now)
    end.

gather(G = #{ref := Ref, mref := MRef, deadline := Deadline, ready_by := ReadyBy,
             progress := Progress, duration := D, info := Info, samples := Samples}, Now) ->
    Until = case ReadyBy of
        infinity -> Deadline;
        _ when ReadyBy > Now -> min(Deadline, ReadyBy);
        _ -> Deadline
    end,
    Wait = max(0, Until - Now),
    receive
        {beamdiag, Ref, {start, I}} ->
            gather(moved(G#{info := I}, maps:get(deadline_in_ms, I, undefined)));
        {beamdiag, Ref, {deadline, InMs}} ->
            gather(moved(G, InMs));
        {beamdiag, Ref, {tick, S}} ->
            Samples2 = keep(S, Samples, maps:get(on_sample, G)),
            report_progress(Progress, Samples2, D),
            gather(G#{samples := Samples2});
        {beamdiag, Ref, finishing} ->
            %% Every tick came: a late report now is the extras' cost, not
            %% a node too slow to answer; wait for them.
            gather(G#{finishing := true});
        {beamdiag, Ref, {done, Extras}} ->
            {ok, capture(Info, Samples, Extras, true, D)};
        {beamdiag, Ref, {aborted, Why}} ->
            late(Info, Samples, D, {agent_aborted, Why});
        {'DOWN', MRef, process, _, Reason} ->
            Partial = case Info of
                          undefined ->
                              undefined;
                          _ ->
                              C = capture(Info, Samples, #{}, false, D),
                              C#{notes => [iolist_to_binary(
                                  io_lib:format("partial capture: the target went away mid-window "
                                                "(~0P) after ~b samples", [Reason, 6, length(Samples)]))]}
                      end,
            {error, {beamdiag_collect, {target_down, Reason, Partial}}}
    after Wait ->
        case erlang:monotonic_time(millisecond) >= Deadline of
            true -> late(Info, Samples, D, timeout);
            false -> gather(G)
        end
    end.

%% Two samples make a window. A lock-counting session is the exception: its
%% lock data comes with the agent's last word (collecting it on the
%% lock-counting emulator takes seconds on a busy node), and a capture
%% without it would miss what the session is for.
due(#{locks := true}, _) -> false;
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

moved(G, InMs) when is_integer(InMs) ->
    G#{deadline := erlang:monotonic_time(millisecond) + InMs + ?LATE_MS};
moved(G, _) ->
    G.

%% The agent's last word came late or not at all: two samples are a window,
%% and what they show is kept, marked partial, with a note.
late(Info, Samples = [_, _ | _], D, Why) when Info =/= undefined ->
    C = capture(Info, Samples, #{}, false, D),
    #{samples := [#{t := T0} | _]} = C,
    #{t := T1} = hd(Samples),
    Note = iolist_to_binary(
             io_lib:format("partial capture: ~s; the ledger and findings cover the ~b samples "
                           "gathered over ~.1f s of the ~.1f s window",
                           [late_text(Why), length(Samples), (T1 - T0) / 1.0e9, D / 1000])),
    {ok, C#{notes => [Note]}};
late(_Info, _Samples, _D, Why) ->
    {error, {beamdiag_collect, Why}}.

late_text(timeout) -> "the agent's last word did not come in time";
late_text(due) -> "the node's ticks came too slowly for the report to be ready at the window's "
                  "end plus its slack, so the agent was stopped";
late_text({agent_aborted, deadline}) -> "the agent reached its deadline before its last tick";
late_text({agent_aborted, Why}) -> io_lib:format("the agent stopped early (~0p)", [Why]).

report_progress(Progress, [#{t := T} | _] = Samples, D) ->
    #{t := T0} = lists:last(Samples),
    Progress((T - T0) div 1000000, D).

capture(Info, RevSamples, Extras, Complete, D) ->
    Base = #{
        schema => ?SCHEMA,
        node => maps:get(node, Info),
        settings => maps:get(settings, Info),
        interval_ms => 0,
        duration_ms => D,
        wall_start_ms => maps:get(wall_start_ms, Info),
        samples => lists:reverse(RevSamples),
        extras => Extras,
        complete => Complete,
        notes => [],
        cgroup_location => maps:get(cgroup_location, Info),
        msacc_was_on => maps:get(msacc_was_on, Info)
    },
    Base#{interval_ms => interval(Base)}.

interval(#{samples := [#{t := A}, #{t := B} | _]}) -> max(1, (B - A) div 1000000);
interval(_) -> 1000.

flush(Ref) ->
    receive
        {beamdiag, Ref, _} -> flush(Ref)
    after 0 -> ok
    end.
