%%% @doc The agent: one process on the target node that samples for a window
%%% and streams each tick to its caller. This module is its session: the
%%% start, the wait for a cluster's word, the loop between ticks, and the
%%% helpers beside them; a tick's sample is beamdiag_agent_tick's, when
%%% ticks come beamdiag_agent_clock's, the end beamdiag_agent_cleanup's.
%%%
%%% The agent turns on what it needs (scheduler_wall_time, microstate
%%% accounting), remembers what it
%%% found, and puts everything back when the window ends, when its caller
%%% dies or its connection drops (it monitors the caller), or when its own
%%% hard deadline passes. When it was loaded over distribution it then
%%% unloads its modules, so nothing of beamdiag stays on the target; on a
%%% node with more than 100,000 processes it leaves them loaded instead
%%% (purging checks every process) and reports `left_loaded' in the extras.
%%%
%%% Microstate accounting costs the whole node something at every state
%%% change of every thread (measured: about 0.7% of a CPU-bound node's
%%% throughput), so the agent keeps it on only for the last `msacc_ms' of
%%% the window (default: the whole window); the samples of that span carry
%%% the msacc counters and the ledger reads them over that span alone. The
%%% flag is set when the span starts (each change of it waits for every
%%% thread), and the value it had is put back at the end: a node that
%%% already runs msacc keeps it on.
%%%
%%% The agent keeps its own cost bounded: a middle tick reads less than the
%%% window's first and last (beamdiag_agent_tick), and when ticks take more
%%% than a quarter of the interval the agent skips ticks so that sampling
%%% stays under a quarter of the time (beamdiag_agent_clock).
%%%
%%% The agent's hard deadline is the window's end plus a grace time (5 s,
%%% or twice the costliest tick so far, at most 30 s: a throttled node
%%% stalls whole, and a tick there costs seconds). It is checked between
%%% reads, not only between ticks; a tick the deadline interrupts is
%%% dropped and the agent ends with `{aborted, deadline}'. The caller learns
%%% the deadline with `start' (`deadline_in_ms') and each time it moves
%%% (`{deadline, InMs}').
%%%
%%% Messages to the caller, all `{beamdiag, Ref, Event}':
%%% `{start, Info}', `{tick, Sample}' every interval, `{deadline, InMs}'
%%% when the hard deadline moves, `{procs, Report}' every `procs_every'
%%% ticks when asked for, `{done, Extras}' at the end, or
%%% `{aborted, Reason}'.
%%%
%%% ```
%%% 1> {ok, Pid, Ref} = beamdiag_agent:start(self(), #{duration_ms => 2000, interval_ms => 1000}).
%%% 2> flush().
%%% Shell got {beamdiag, Ref, {start, #{...}}}
%%% Shell got {beamdiag, Ref, {tick, #{t => ..., threads => ..., vm => ...}}}
%%% '''
-module(beamdiag_agent).

-export([start/2, stop/1, modules/0, error_text/2]).

%% Internal: the agent process entry point.
-export([init/4]).
%% Spawned by start/2 through proc_lib:spawn_opt/4 (and bench/overhead_load.erl).
-ignore_xref([{init, 4}]).

-export_type([opts/0]).

-type opts() :: #{
    duration_ms := pos_integer(),
    interval_ms := pos_integer(),
    msacc => boolean(),
    msacc_ms => pos_integer(),
    sampler => boolean(),
    procs => boolean(),
    procs_every => pos_integer(),
    unload => [module()],
    proc_root => file:filename(),
    exclude_pids => [integer()],
    host_scan => boolean(),
    end_wall_ms => integer(),
    go => pid()
}.

%% The longest the start of a session waits for a flag every scheduler
%% must answer for (scheduler_wall_time, msacc).
-define(FLAG_MS, 1000).
%% How long an agent started with `go' waits for the word that starts its
%% window.
-define(GO_MS, 30000).
%% How long such an agent waits for its start walk before it says it is
%% ready (the walk goes on beside the window past that).
-define(GO_WALK_MS, 1000).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Starts an agent that reports to Caller. Runs on the target node
%% (called locally or over erpc); returns at once.
-spec start(pid(), opts()) -> {ok, pid(), reference()}.
start(Caller, Opts = #{duration_ms := D, interval_ms := I}) when
    is_pid(Caller), is_integer(D), D > 0, is_integer(I), I > 0
->
    Ref = make_ref(),
    %% High priority from the first reduction: on an overloaded node a
    %% normal process waits behind every busy one.
    Pid = proc_lib:spawn_opt(?MODULE, init, [Caller, Ref, Opts, self()], [{priority, high}]),
    {ok, Pid, Ref}.

%% @doc Ends the window early; the agent sends `{done, Extras}' and cleans up.
-spec stop(pid()) -> ok.
stop(Pid) ->
    Pid ! {beamdiag_stop, self()},
    ok.

%% @doc The modules the agent needs on the target.
-spec modules() -> [module()].
modules() ->
    [beamdiag_agent_code, ?MODULE, beamdiag_agent_tick, beamdiag_agent_clock,
     beamdiag_agent_cleanup, beamdiag_agent_file, beamdiag_agent_procfs,
     beamdiag_agent_cgroup, beamdiag_agent_vm, beamdiag_agent_host, beamdiag_agent_processes,
     beamdiag_agent_proc_walk, beamdiag_agent_top, beamdiag_agent_proc_memory,
     beamdiag_agent_proc_identity, beamdiag_agent_walker, beamdiag_agent_bounded_call,
     beamdiag_agent_sysmon, beamdiag_agent_held_sampler, beamdiag_agent_pinfo,
     beamdiag_agent_queues, beamdiag_agent_limits, beamdiag_agent_waits,
     beamdiag_agent_chains, beamdiag_agent_deadline, beamdiag_agent_memory,
     beamdiag_agent_proc_born, beamdiag_agent_ports, beamdiag_agent_tables,
     beamdiag_agent_spawn].

%% @doc A term caught on the target, as bounded text.
-spec error_text(atom(), term()) -> binary().
error_text(Class, Reason) ->
    iolist_to_binary(io_lib:format("~p:~p", [Class, Reason], [{chars_limit, 200}])).

%%%===================================================================
%%% Internal
%%%===================================================================

%% @private
-spec init(pid(), reference(), opts(), pid()) -> no_return().
init(Caller, Ref, Opts0, _Starter) ->
    %% Started over erpc, the agent inherits the caller's group leader, and
    %% whatever it or its helpers print or log would reach the caller's
    %% terminal: it takes the target's own, that of init, before anything.
    case erlang:process_info(whereis(init), group_leader) of
        {group_leader, Gl} -> true = group_leader(Gl, self());
        undefined -> ok
    end,
    process_flag(trap_exit, true),
    process_flag(priority, high),
    %% The name says a session runs here until its modules are deleted
    %% (the agent ends after the delete): a session starting meanwhile
    %% waits before it trusts modules it finds loaded (beamdiag_loader).
    %% Best effort: a second session on the same node runs without it.
    _ = catch register(?MODULE, self()),
    MRef = erlang:monitor(process, Caller),
    Root = maps:get(proc_root, Opts0, "/proc"),
    OsPid = os:getpid(),
    Interval = maps:get(interval_ms, Opts0),
    %% The helper for calls every scheduler must answer; it owns the
    %% session's scheduler_wall_time reference and puts msacc back.
    Probe = beamdiag_agent_bounded_call:start(self()),
    %% A second helper for the memory account, asked beside the first each
    %% tick: its slower reads never make the time ledger's late.
    MemProbe = beamdiag_agent_bounded_call:start(self()),
    Swt = beamdiag_agent_bounded_call:call(
            Probe, fun() -> erlang:system_flag(scheduler_wall_time, true) end, ?FLAG_MS),
    Sysmon = case maps:get(long_schedules, Opts0, true) of
                 true -> beamdiag_agent_sysmon:start(self(), #{notify => {Caller, Ref}});
                 false -> undefined
             end,
    {Located, MemLoc} = beamdiag_agent_cgroup:locate_both(Root, OsPid),
    Cg = case Located of
             {ok, L} -> L;
             {error, _} = E -> E
         end,
    State0 = #{
        caller => Caller, ref => Ref, mref => MRef, opts => Opts0,
        pid => OsPid, proc_root => Root,
        probe => Probe, memory_probe => MemProbe, interval_ms => Interval, sysmon => Sysmon,
        cgroup_location => Cg, memory_location => MemLoc, held => beamdiag_agent_file:new(beamdiag_agent_file:budget(Root))
    },
    Helpers = [beamdiag_agent_bounded_call:pid(Pr) || Pr <- [Probe, MemProbe]] ++ [P || P <- [Sysmon], is_pid(P)],
    %% What the start word says of the node, read before the window.
    Facts = #{
        agent => self(),
        node => atom_to_binary(node()),
        settings => maps:merge(beamdiag_agent_vm:settings(), beamdiag_agent_host:placement(Root)),
        cgroup_location => location_info(Cg),
        %% Read once now too: a capture cut short still has it.
        memory_room => maps:get(memory_room, beamdiag_agent_cleanup:memory_extras(State0), #{})
    },
    %% With `go', the window waits for the session's word (go/2).
    {Opts, State1} = go(State0, Helpers),
    #{duration_ms := Duration} = Opts,
    Restore0 = #{swt => Swt},
    {Restore, MsaccFrom} = msacc_plan(Opts, Restore0, Probe),
    State = State1#{opts := Opts, msacc => MsaccFrom =:= 0, msacc_from => MsaccFrom},
    Start = erlang:monotonic_time(millisecond),
    End = Start + Duration,
    Hard = beamdiag_agent_clock:hard_deadline(End, 0),
    HostScan = start_host_scan(Opts, Root, OsPid, End),
    %% Whether msacc was on is known when msacc covers the whole window
    %% (learnt at its start); otherwise when its slice starts.
    WasOn = case maps:find(msacc, Restore) of
                {ok, V} when is_boolean(V) -> #{msacc_was_on => V};
                _ -> #{}
            end,
    %% The common end the window holds to, when it has one (`end_wall_ms'),
    %% in the session's own clock: the session's due time counts from it.
    EndWall = maps:with([end_wall_ms], Opts),
    Caller ! {beamdiag, Ref, {start, (maps:merge(maps:merge(Facts, WasOn), EndWall))#{
        wall_start_ms => erlang:system_time(millisecond),
        %% The window asked for, or what was left of it (`end_wall_ms').
        duration_ms => Duration,
        deadline_in_ms => Hard - Start
    }}},
    Clock = #{start => Start, interval => Interval, 'end' => End, hard => Hard, worst => 0,
              costs => []},
    %% The start walk runs beside the first tick (which reads every
    %% thread's files and on a starved host takes a second or more),
    %% unless it ran before the window (go/2).
    Procs = case State of
                #{procs := Early} -> Early;
                _ -> start_procs(Opts, Helpers ++ [HostScan || is_pid(HostScan)], {Caller, Ref})
            end,
    case beamdiag_agent_tick:sample(State, Hard) of
        {ok, First, State2} ->
            Caller ! {beamdiag, Ref, {tick, First}},
            ticked(State2#{procs => Procs, host_scan => HostScan}, First, 1, Clock);
        late ->
            beamdiag_agent_cleanup:finish(State#{procs => Procs, host_scan => HostScan},
                                          {aborted, deadline})
    end.

%% With `go' (a pid: a cluster session), the set-up and the start walk
%% (waited for, ?GO_WALK_MS at most) are done before the window, so that
%% none of it falls inside it: the agent tells that process it is ready
%% (`{beamdiag_armed, Agent, Node}') and waits for `{beamdiag_go,
%% EndWallMs}', the wall-clock end of the window every member shares; the
%% window starts on that word. Meanwhile its caller is told how long it
%% may wait (a `deadline' word). It ends without a window when its caller
%% or that process goes away, when told to abort, or when no word comes
%% within ?GO_MS. Without `go', the window starts now (and ends at
%% `end_wall_ms' when given).
go(State0 = #{opts := Opts = #{go := From}, caller := Caller, ref := Ref, mref := MRef}, Helpers)
  when is_pid(From) ->
    State = walked(State0#{procs => start_procs(Opts, Helpers, {Caller, Ref})}),
    %% (The longest wait for the word and the window, and the grace time
    %% after them.)
    Caller ! {beamdiag, Ref, {deadline, beamdiag_agent_clock:hard_deadline(
                                            ?GO_MS + maps:get(duration_ms, Opts), 0)}},
    From ! {beamdiag_armed, self(), node()},
    GoRef = erlang:monitor(process, From),
    receive
        {beamdiag_go, EndWall} when is_integer(EndWall) ->
            erlang:demonitor(GoRef, [flush]),
            {ends_at(Opts#{end_wall_ms => EndWall}), State};
        {'DOWN', MRef, process, Caller, Reason} ->
            beamdiag_agent_cleanup:finish(State, {aborted, {caller_down, Reason}});
        {'DOWN', GoRef, process, From, _} ->
            beamdiag_agent_cleanup:finish(State, {aborted, no_go});
        {beamdiag_abort, _} ->
            beamdiag_agent_cleanup:finish(State, {aborted, caller_gave_up})
    after ?GO_MS ->
        beamdiag_agent_cleanup:finish(State, {aborted, no_go})
    end;
go(State = #{opts := Opts}, _Helpers) ->
    {ends_at(Opts), State}.

%% The start walk's report, waited for at most ?GO_WALK_MS.
walked(State = #{procs := {walking, Walker}}) ->
    receive
        {beamdiag_walk, Walker, Result} -> walked(State, Walker, Result)
    after ?GO_WALK_MS ->
        State
    end;
walked(State) ->
    State.

%% After tick K-1's sample: counts its cost (every tick, the first and the
%% last included), moves the hard deadline when ticks have grown costly and
%% tells the caller, then waits for the next tick.
ticked(State = #{caller := Caller, ref := Ref}, Sample = #{tick_cost_us := CostUs}, K,
       Clock = #{start := Start, interval := Interval, 'end' := End, hard := Hard0,
                 worst := Worst0, costs := Costs0}) ->
    usage_to_scan(State, Sample),
    Costs = lists:sublist([CostUs | Costs0], 3),
    Worst = max(Worst0, CostUs div 1000),
    Hard = max(Hard0, beamdiag_agent_clock:hard_deadline(End, Worst)),
    _ = case Hard =:= Hard0 of
            true -> ok;
            false -> Caller ! {beamdiag, Ref, {deadline, Hard - erlang:monotonic_time(millisecond)}}
        end,
    K2 = beamdiag_agent_clock:msacc_tick(
           State, K, beamdiag_agent_clock:next_tick(lists:min(Costs), Start, K, Interval, End)),
    loop(procs_tick(maps:remove(status, State), K), K2,
         Clock#{hard := Hard, worst := Worst, costs := Costs}).

loop(State = #{caller := Caller, ref := Ref, mref := MRef}, K,
     Clock = #{start := Start, interval := Interval, 'end' := End, hard := Hard}) ->
    Now = erlang:monotonic_time(millisecond),
    Next = min(Start + K * Interval, End),
    Wait = max(0, min(Next, Hard) - Now),
    receive
        {'DOWN', MRef, process, Caller, Reason} ->
            beamdiag_agent_cleanup:finish(State, {aborted, {caller_down, Reason}});
        {beamdiag_walk, Walker, Result} ->
            loop(walked(State, Walker, Result), K, Clock);
        {beamdiag_abort, _} ->
            %% The caller has what it needs and stopped waiting.
            beamdiag_agent_cleanup:finish(State, {aborted, caller_gave_up});
        {beamdiag_stop, _} ->
            case beamdiag_agent_tick:sample(State, Hard) of
                {ok, Sample, State2} ->
                    Caller ! {beamdiag, Ref, {tick, Sample}},
                    beamdiag_agent_cleanup:finish(State2, done);
                late ->
                    beamdiag_agent_cleanup:finish(State, {aborted, deadline})
            end;
        {'EXIT', _, shutdown} ->
            beamdiag_agent_cleanup:finish(State, {aborted, shutdown})
    after Wait ->
        Last = Next >= End,
        State2 = msacc_slice(State, K),
        case beamdiag_agent_deadline:in_time(Hard) andalso
                 beamdiag_agent_tick:sample(State2#{status => Last}, Hard) of
            {ok, Sample, State3} ->
                Caller ! {beamdiag, Ref, {tick, Sample}},
                case Last of
                    true ->
                        %% The window is answered; what follows is the
                        %% extras (msacc, the end walk).
                        Caller ! {beamdiag, Ref, finishing},
                        beamdiag_agent_cleanup:finish(State3, done);
                    false ->
                        ticked(State3, Sample, K + 1, Clock)
                end;
            _ ->
                beamdiag_agent_cleanup:finish(State2, {aborted, deadline})
        end
    end.

%% With `end_wall_ms' (a system time in ms) the window ends then: a
%% cluster's agents, started over a few seconds, all end together. It
%% keeps at least two intervals and is never longer than `duration_ms'.
ends_at(Opts = #{end_wall_ms := EndWall, duration_ms := D, interval_ms := I}) ->
    Left = EndWall - erlang:system_time(millisecond),
    Opts#{duration_ms := max(min(2 * I, D), min(D, Left))};
ends_at(Opts) ->
    Opts.

%% Which tick microstate accounting starts at (0: from the start, or never
%% when it is not wanted), and the flag to put back. msacc is turned on only
%% when the slice starts, and the value it had is learnt by setting it
%% then (msacc_slice/2): each change of the flag waits for every thread of
%% the node, so learning it at the start (on, then straight back off)
%% would cost two more. A slice that is the whole window starts here.
msacc_plan(Opts = #{duration_ms := Duration, interval_ms := Interval}, Restore, Probe) ->
    Span = maps:get(msacc_ms, Opts, Duration),
    Later = max(0, (Duration - Span) div Interval),
    case maps:get(msacc, Opts, true) of
        false ->
            {Restore, never};
        true when Later > 0 ->
            {Restore, Later};
        true ->
            %% In the helper, under a deadline (every thread must answer);
            %% the helper puts the flag back when the session ends, also
            %% when the answer came too late for the agent.
            case beamdiag_agent_bounded_call:call(Probe, fun msacc_on/0, ?FLAG_MS) of
                {ok, Was} -> {Restore#{msacc => Was}, 0};
                _ -> {Restore#{msacc_missing => true}, never}
            end
    end.

%% Turns microstate accounting on when tick K reaches the slice, before the
%% tick's sample, so that sample is the slice's baseline; the helper puts
%% back the value the flag had when the session ends.
msacc_slice(State = #{msacc := false, msacc_from := From, probe := Probe}, K)
  when is_integer(From), K >= From ->
    beamdiag_agent_bounded_call:cast(Probe, fun msacc_on/0),
    State#{msacc := true};
msacc_slice(State, _K) ->
    State.

%% Run in the helper: turns msacc on and has the helper put back, when it
%% stops, the value the flag had; returns that value.
msacc_on() ->
    Was = erlang:system_flag(microstate_accounting, true),
    self() ! {on_exit, fun() -> erlang:system_flag(microstate_accounting, Was) end},
    Was.

%% The process walks (see beamdiag_agent_processes), unless turned off:
%% in a process of their own that keeps the walk's state
%% (beamdiag_agent_walker); the start walk's report alone and the queue
%% watch's readings go to the caller from the walker, at once (a capture
%% cut short keeps them).
start_procs(Opts, Helpers, To) ->
    case maps:get(procs, Opts, true) of
        true -> {walking, beamdiag_agent_walker:start(self(), Helpers, To)};
        false -> undefined
    end.

%% What the walker sent: the start walk's report, or a middle one (watch).
walked(State = #{procs := {_, Walker}, caller := Caller, ref := Ref}, Walker, Result) ->
    case Result of
        {started, _Snapshot, Watch} ->
            State#{procs := {ready, Walker}, watch => Watch};
        {next, Report} ->
            Caller ! {beamdiag, Ref, {procs, Report}},
            State#{procs := {ready, Walker}};
        {error, Text} ->
            _ = case State of
                    #{procs := {busy, _}} -> Caller ! {beamdiag, Ref, {procs, #{error => Text}}};
                    _ -> ok
                end,
            State#{procs := {error, Text}}
    end;
walked(State, _Walker, _Result) ->
    State.

%% With `procs_every' (watch), every that many ticks: the walker is asked
%% for the process report since the last one (one walk; see
%% beamdiag_agent_processes:next/1), which comes back as a message; none
%% is asked while the last is still being taken.
procs_tick(State = #{procs := {ready, Walker}, opts := #{procs_every := N}}, K)
  when K rem N =:= 0 ->
    beamdiag_agent_walker:next(Walker),
    State#{procs := {busy, Walker}};
procs_tick(State, _K) ->
    State.

%% The scans of the host's other processes, beside the ticks (see
%% beamdiag_agent_host), unless turned off.
%% The host scan's probe takes the tick's host and node CPU figures.
usage_to_scan(#{host_scan := Scan, process_cpu := Node}, #{t := T, host := #{cpu := Cpu}})
  when is_pid(Scan), is_integer(Node) ->
    beamdiag_agent_host:usage(Scan, {erlang:convert_time_unit(T, nanosecond, millisecond),
                                      beamdiag_agent_host:busy(Cpu), Node});
usage_to_scan(_State, _Sample) ->
    ok.

start_host_scan(Opts, Root, OsPid, End) ->
    case maps:get(host_scan, Opts, true) of
        true ->
            Exclude = [list_to_integer(OsPid) | maps:get(exclude_pids, Opts, [])],
            beamdiag_agent_host:start(Root, Exclude, End);
        false ->
            undefined
    end.

location_info({error, {beamdiag_agent_cgroup, R}}) ->
    #{error => iolist_to_binary(beamdiag_agent_cgroup:format_error(R))};
location_info(#{version := V, dir := D}) -> #{version => V, dir => iolist_to_binary(D)}.
