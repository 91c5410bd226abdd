%%% @doc The agent: one process on the target node that samples for a window
%%% and streams each tick to its caller.
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
%%% The agent keeps its own cost bounded: the per-thread context-switch
%%% counts (one more /proc file per thread) are read on the first and last
%%% tick only, the only ones the ledger takes them from; a middle tick
%%% reads the threads that ran in the interval before and the process's
%%% own CPU time, and the other threads only when that time says they ran
%%% too (beamdiag_agent_procfs:tick_threads/4: about 11 reads a middle tick
%%% on a saturated 20-thread node, against 45 reading everything; the
%%% window's ends read everything, so its sums are exact); and when ticks
%%% take more than a quarter of the interval (thousands of threads on few
%%% cores) the agent skips ticks so that sampling stays under a quarter of
%%% the time. A tick's cost here is wall time, the least of the last three
%%% ticks': most of it is waiting, not work. Every /proc read is a trip to a
%%% dirty I/O thread and back, and on a saturated node each trip waits a few
%%% milliseconds for a CPU (measured on 2 busy cores: 100 ms of wall time
%%% for 2 ms of CPU per tick). The first and the last tick are always taken
%%% and counted like the others: a tick that would crowd the last one is
%%% skipped.
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

-export([start/2, stop/1, modules/0, take/1, error_text/2]).

%% Internal: the agent process entry point.
-export([init/4]).
%% Spawned by start/2 through proc_lib:spawn_opt/4 (and bench/overhead_load.erl).
-ignore_xref([{init, 4}]).

-ifdef(TEST).
-export([next_tick/5, hard_deadline/2, msacc_tick/3, queues/2]).
-endif.

-export_type([sample/0, opts/0, tick_state/0]).

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
%% What take/1 reads a sample with: the node's OS pid, the proc root,
%% whether to read microstate accounting, where the node's cgroup is; and
%% what it keeps for the next sample (the open files, the threads seen).
%% The agent's own state is one too, with keys of its own (probe,
%% interval_ms, ...).
-type tick_state() :: #{
    pid := string() | integer(),
    proc_root := file:filename(),
    msacc := boolean(),
    cgroup_location := beamdiag_agent_cgroup:location() | {error, term()},
    held => beamdiag_agent_file:held(),
    status => boolean(),
    previous => #{integer() => beamdiag_agent_procfs:thread()},
    cgroup_before => beamdiag_agent_cgroup:stat() | {error, term()},
    active => [integer()],
    process_cpu => non_neg_integer() | undefined,
    atom() => term()
}.
-type sample() :: #{
    t := integer(),
    vm := beamdiag_agent_vm:counters(),
    threads := #{integer() => beamdiag_agent_procfs:thread()} | {error, term()},
    host := beamdiag_agent_procfs:host() | {error, term()},
    cgroup := beamdiag_agent_cgroup:stat() | {error, term()},
    tick_cost_us := non_neg_integer(),
    limits => beamdiag_agent_limits:counts(),
    queue_reads => #{binary() => beamdiag_agent_queues:reading()}
}.

%% Past the window, the agent cleans up on its own after this long even if
%% nobody asked it to.
-define(GRACE_MS, 5000).
-define(MAX_GRACE_MS, 30000).
%% How long the end of a session waits for the host scan's last readings.
-define(HOST_SCAN_WAIT_MS, 300).
%% Above this many processes the agent does not purge its modules.
-define(PURGE_MAX_PROCESSES, 100000).
%% The longest a tick waits for the counters every scheduler must answer
%% for (less at short intervals: a quarter of the interval).
-define(SLOW_MS, 250).
%% The longest the start of a session waits for a flag every scheduler
%% must answer for (scheduler_wall_time, msacc).
-define(FLAG_MS, 1000).
%% The longest the end of a session waits for the end walk of the process
%% table (the walk stops itself at 500 ms) and for the long-schedule report.
-define(END_WALK_MS, 1500).
-define(SYSMON_MS, 300).
%% The longest the end of a session waits for its helpers to put their
%% flags back.
-define(HELPERS_MS, 500).
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
    [beamdiag_agent_code, ?MODULE, beamdiag_agent_file, beamdiag_agent_procfs,
     beamdiag_agent_cgroup, beamdiag_agent_vm, beamdiag_agent_host, beamdiag_agent_processes,
     beamdiag_agent_walker, beamdiag_agent_bounded_call, beamdiag_agent_sysmon,
     beamdiag_agent_held_sampler, beamdiag_agent_pinfo, beamdiag_agent_queues,
     beamdiag_agent_limits, beamdiag_agent_waits, beamdiag_agent_chains].

%% @doc One sample, and the state to take the next one with: the state's
%% `held' (a `beamdiag_agent_file:held()') keeps the /proc and cgroup files open
%% between samples, which costs a fraction of reading them whole.
-spec take(tick_state()) -> {sample(), tick_state()}.
take(State) ->
    {ok, Sample, State2} = take(State, infinity),
    {Sample, State2}.

%%%===================================================================
%%% Internal
%%%===================================================================

%% One sample, or `late' when the deadline (monotonic milliseconds) passes
%% between two reads: on a throttled node a tick can stall for seconds, and
%% the agent must not overrun its own deadline by a whole tick.
take(State = #{pid := OsPid, proc_root := Root, msacc := Msacc}, Deadline) ->
    T0 = erlang:monotonic_time(microsecond),
    Status = maps:get(status, State, true),
    H0 = maps:get(held, State, beamdiag_agent_file:none()),
    T = erlang:monotonic_time(nanosecond),
    Vm = vm(State, Msacc),
    %% A middle tick (no status file) reads the threads that ran in the
    %% interval before, the others only when the process's CPU time says
    %% they ran too, an idle thread's stat alone, the cgroup's counters
    %% without its quota, and no load (see beamdiag_agent_procfs:tick_threads/4):
    %% the window's ends are read whole.
    Previous = maps:get(previous, State, #{}),
    %% What the threads wait on in the kernel, on the last tick only (a
    %% dirty IO round trip a read: on a starved node the first tick would
    %% come seconds later), within the tick's deadline.
    ThreadOpts0 = #{status => Status, deadline => Deadline, previous => Previous,
                    waits => maps:get(status, State, false)},
    ThreadOpts = case {maps:get(active, State, undefined), maps:get(process_cpu, State, undefined)} of
                     {Active, Before} when is_list(Active), is_integer(Before) ->
                         ThreadOpts0#{active => Active, process => Before};
                     _ ->
                         ThreadOpts0
                 end,
    case in_time(Deadline) andalso beamdiag_agent_procfs:tick_threads(Root, OsPid, ThreadOpts, H0) of
        false ->
            late;
        {{error, {beamdiag_agent_procfs, deadline}}, _} ->
            late;
        {Read, H1} ->
            {Threads, ProcCpu} = case Read of
                                     {ok, Ts, C} -> {{ok, Ts}, C};
                                     {error, _} = E -> {E, undefined}
                                 end,
            case in_time(Deadline) andalso
                     beamdiag_agent_procfs:host(Root, #{loadavg => Status}, H1) of
                false ->
                    late;
                {Host, H2} ->
                    case in_time(Deadline) andalso cgroup(State, H2) of
                        false ->
                            late;
                        {Cgroup, H3} ->
                            Sample = queues(State, #{
                                t => T,
                                vm => Vm,
                                limits => beamdiag_agent_limits:counts(),
                                threads => ok_or_error(Threads),
                                host => ok_or_error(Host),
                                cgroup => Cgroup,
                                tick_cost_us => erlang:monotonic_time(microsecond) - T0
                            }),
                            New = previous(Threads),
                            {ok, Sample, State#{held => H3, previous => New,
                                                cgroup_before => Cgroup,
                                                active => active(Previous, New),
                                                process_cpu => ProcCpu}}
                    end
            end
    end.

previous({ok, Threads}) -> Threads;
previous(_) -> #{}.

%% The threads that used CPU time between two samples (every thread, after
%% the first).
active(Before, Now) ->
    [Tid || {Tid, #{utime := U, stime := S}} <- maps:to_list(Now),
            case maps:get(Tid, Before, undefined) of
                #{utime := U, stime := S} -> false;
                _ -> true
            end].

%% The VM counters; those every scheduler must answer for (scheduler wall
%% time, msacc) through the session's helper, with a deadline: a scheduler
%% held by a NIF answers late, and the tick goes on without them (`missing'
%% says which and why).
vm(#{probe := Probe, interval_ms := Interval}, Msacc) ->
    Vm0 = beamdiag_agent_vm:counters(#{msacc => false, swt => false}),
    Fun = fun() -> beamdiag_agent_vm:all_schedulers(#{msacc => Msacc}) end,
    case beamdiag_agent_bounded_call:call(Probe, Fun, slow_ms(Interval)) of
        {ok, M} ->
            maps:merge(Vm0, M);
        Why ->
            Items = [swt, garbage_collection | [msacc || Msacc]],
            Vm0#{missing => #{items => Items, why => missing_why(Why),
                              waited_ms => slow_ms(Interval)}}
    end;
vm(_State, Msacc) ->
    beamdiag_agent_vm:counters(#{msacc => Msacc}).

%% How long a tick waits for every scheduler's answer.
slow_ms(Interval) ->
    max(20, min(?SLOW_MS, Interval div 4)).

missing_why(timeout) -> timeout;
missing_why(busy) -> busy;
missing_why({error, _}) -> error.

%% With `end_wall_ms' (a system time in ms) the window ends then: a
%% cluster's agents, started over a few seconds, all end together. It
%% keeps at least two intervals and is never longer than `duration_ms'.
ends_at(Opts = #{end_wall_ms := EndWall, duration_ms := D, interval_ms := I}) ->
    Left = EndWall - erlang:system_time(millisecond),
    Opts#{duration_ms := max(min(2 * I, D), min(D, Left))};
ends_at(Opts) ->
    Opts.

%% The queue lengths of the processes the walker watches (the longest
%% queues at the window's start, and those that did not answer its walk):
%% the latest answer of each, with its time and its first answer, read
%% from the queue watch without asking any process (see
%% beamdiag_agent_queues): a flooded process answers only between its
%% garbage collections, which take seconds, and a held one when its NIF
%% returns; the tick never waits for either.
queues(#{watch := Watch}, Sample) ->
    case beamdiag_agent_queues:read(Watch) of
        Reads when map_size(Reads) > 0 -> Sample#{queue_reads => Reads};
        _ -> Sample
    end;
queues(_State, Sample) ->
    Sample.

in_time(infinity) -> true;
in_time(Deadline) -> erlang:monotonic_time(millisecond) < Deadline.

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
        probe => Probe, interval_ms => Interval, sysmon => Sysmon,
        cgroup_location => Cg, memory_location => MemLoc, held => beamdiag_agent_file:new(beamdiag_agent_file:budget(Root))
    },
    Helpers = [beamdiag_agent_bounded_call:pid(Probe) | [P || P <- [Sysmon], is_pid(P)]],
    %% What the start word says of the node, read before the window.
    Facts = #{
        agent => self(),
        node => atom_to_binary(node()),
        settings => maps:merge(beamdiag_agent_vm:settings(), beamdiag_agent_host:placement(Root)),
        cgroup_location => location_info(Cg),
        %% Read once now too: a capture cut short still has it.
        memory_room => maps:get(memory_room, memory_extras(State0), #{})
    },
    %% With `go', the window waits for the session's word (go/2).
    {Opts, State1} = go(State0, Helpers),
    #{duration_ms := Duration} = Opts,
    Restore0 = #{swt => Swt},
    {Restore, MsaccFrom} = msacc_plan(Opts, Restore0, Probe),
    State = State1#{opts := Opts, msacc => MsaccFrom =:= 0, msacc_from => MsaccFrom},
    Start = erlang:monotonic_time(millisecond),
    End = Start + Duration,
    Hard = hard_deadline(End, 0),
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
    case take(State, Hard) of
        {ok, First, State2} ->
            Caller ! {beamdiag, Ref, {tick, First}},
            ticked(State2#{procs => Procs, host_scan => HostScan}, First, 1, Clock);
        late ->
            finish(State#{procs => Procs, host_scan => HostScan}, {aborted, deadline})
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
    Caller ! {beamdiag, Ref, {deadline, ?GO_MS + maps:get(duration_ms, Opts) + ?GRACE_MS}},
    From ! {beamdiag_armed, self(), node()},
    GoRef = erlang:monitor(process, From),
    receive
        {beamdiag_go, EndWall} when is_integer(EndWall) ->
            erlang:demonitor(GoRef, [flush]),
            {ends_at(Opts#{end_wall_ms => EndWall}), State};
        {'DOWN', MRef, process, Caller, Reason} ->
            finish(State, {aborted, {caller_down, Reason}});
        {'DOWN', GoRef, process, From, _} ->
            finish(State, {aborted, no_go});
        {beamdiag_abort, _} ->
            finish(State, {aborted, caller_gave_up})
    after ?GO_MS ->
        finish(State, {aborted, no_go})
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
    Hard = max(Hard0, hard_deadline(End, Worst)),
    _ = case Hard =:= Hard0 of
            true -> ok;
            false -> Caller ! {beamdiag, Ref, {deadline, Hard - erlang:monotonic_time(millisecond)}}
        end,
    K2 = msacc_tick(State, K, next_tick(lists:min(Costs), Start, K, Interval, End)),
    loop(procs_tick(maps:remove(status, State), K), K2,
         Clock#{hard := Hard, worst := Worst, costs := Costs}).

loop(State = #{caller := Caller, ref := Ref, mref := MRef}, K,
     Clock = #{start := Start, interval := Interval, 'end' := End, hard := Hard}) ->
    Now = erlang:monotonic_time(millisecond),
    Next = min(Start + K * Interval, End),
    Wait = max(0, min(Next, Hard) - Now),
    receive
        {'DOWN', MRef, process, Caller, Reason} ->
            finish(State, {aborted, {caller_down, Reason}});
        {beamdiag_walk, Walker, Result} ->
            loop(walked(State, Walker, Result), K, Clock);
        {beamdiag_abort, _} ->
            %% The caller has what it needs and stopped waiting.
            finish(State, {aborted, caller_gave_up});
        {beamdiag_stop, _} ->
            case take(State, Hard) of
                {ok, Sample, State2} ->
                    Caller ! {beamdiag, Ref, {tick, Sample}},
                    finish(State2, done);
                late ->
                    finish(State, {aborted, deadline})
            end;
        {'EXIT', _, shutdown} ->
            finish(State, {aborted, shutdown})
    after Wait ->
        Last = Next >= End,
        State2 = msacc_slice(State, K),
        case in_time(Hard) andalso take(State2#{status => Last}, Hard) of
            {ok, Sample, State3} ->
                Caller ! {beamdiag, Ref, {tick, Sample}},
                case Last of
                    true ->
                        %% The window is answered; what follows is the
                        %% extras (msacc, the end walk).
                        Caller ! {beamdiag, Ref, finishing},
                        finish(State3, done);
                    false ->
                        ticked(State3, Sample, K + 1, Clock)
                end;
            _ ->
                finish(State2, {aborted, deadline})
        end
    end.

%% The hard deadline: past the window's end, the agent cleans up on its
%% own after the grace time, or after twice its costliest tick when ticks
%% cost more (a throttled node stalls whole: 2 to 3 s a tick at a fifth of
%% a CPU), never more than ?MAX_GRACE_MS.
hard_deadline(End, WorstMs) ->
    End + min(?MAX_GRACE_MS, max(?GRACE_MS, 2 * WorstMs)).

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

%% The next tick number: the one after K, or later when ticks take so long
%% (Cost, in microseconds) that the next one must wait for sampling to stay
%% under a quarter of the time. The last tick, at the window's end, counts
%% too: a tick that would leave it less than three of its costs of rest is
%% skipped, so the last tick comes next.
next_tick(Cost, Start, K, Interval, End) ->
    Now = erlang:monotonic_time(millisecond),
    CostMs = Cost div 1000,
    Earliest = Now + CostMs * 3,
    K2 = max(K, (Earliest - Start + Interval - 1) div Interval),
    case Start + K2 * Interval of
        At when At < End, At + CostMs * 4 > End -> last_tick(Start, Interval, End);
        _ -> K2
    end.

%% The tick that starts the microstate-accounting slice is never skipped:
%% its sample is the slice's baseline, and without it the slice would be
%% empty (on a loaded node the guard would otherwise skip to the last tick).
msacc_tick(#{msacc := false, msacc_from := From}, K, K2) when is_integer(From), From >= K ->
    min(K2, From);
msacc_tick(_State, _K, K2) ->
    K2.

%% The tick number whose time is the window's end (or past it).
last_tick(Start, Interval, End) ->
    (End - Start + Interval - 1) div Interval.

%% (State: the agent's own, a tick_state() with its caller and ref.)
-spec finish(tick_state(), done | {aborted, term()}) -> no_return().
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

%% Purging a module makes OTP's code purger check every process for
%% references to it, once or twice per module (measured: 14 to 30 s of
%% purger work for five modules on a node with a million processes). On a
%% node with more processes than the limit the agent leaves its modules
%% loaded, inert, and says so in the extras (`left_loaded'); the next
%% session reuses them, and beamdiag_loader:unload/2 removes them when the
%% node is quiet.
unload_plan([], Extras) ->
    {[], Extras};
unload_plan(Mods, Extras) ->
    case erlang:system_info(process_count) > ?PURGE_MAX_PROCESSES of
        true -> {[], Extras#{left_loaded => Mods}};
        false -> {Mods, Extras}
    end.

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
            #{procs => #{error => error_text(exit, Why)}}
    after max(0, Deadline - erlang:monotonic_time(millisecond)) ->
        exit(Walker, kill),
        erlang:demonitor(MRef, [flush]),
        #{procs_end_missing => iolist_to_binary(
            io_lib:format("the process walk at the window's end did not finish in ~b ms",
                          [?END_WALK_MS]))}
    end.

%% The memory the node can still take (host or cgroup), read once.
memory_extras(#{proc_root := Root, memory_location := MemLoc}) ->
    try #{memory_room => beamdiag_agent_cgroup:memory_room(Root, MemLoc)}
    catch _:_ -> #{}
    end.

%% The process report carries the memory room: the queue rule says when a
%% growing mailbox would exhaust it.
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

%% @doc A term caught on the target, as bounded text.
-spec error_text(atom(), term()) -> binary().
error_text(Class, Reason) ->
    iolist_to_binary(io_lib:format("~p:~p", [Class, Reason], [{chars_limit, 200}])).

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
    %% Their flags are back when they have ended: waited for (bounded), so
    %% that the caller finds them back when the last word comes, and the
    %% purge of the agent's modules does not cut them short. A helper held
    %% by a scheduler that does not answer finishes on its own later.
    wait_down(Sysmon ++ Probe, erlang:monotonic_time(millisecond) + ?HELPERS_MS),
    ok.

wait_down([], _Deadline) ->
    ok;
wait_down([MRef | More], Deadline) ->
    receive
        {'DOWN', MRef, process, _, _} -> wait_down(More, Deadline)
    after max(0, Deadline - erlang:monotonic_time(millisecond)) ->
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

cgroup(#{cgroup_location := {error, _} = E}, H) ->
    {E, H};
cgroup(State = #{cgroup_location := L}, H) ->
    %% A middle tick keeps the quota the tick before read.
    Before = case State of
                 #{status := false, cgroup_before := B} when is_map(B) -> B;
                 _ -> undefined
             end,
    {R, H2} = beamdiag_agent_cgroup:read(L, Before, H),
    {ok_or_error(R), H2}.

location_info({error, {beamdiag_agent_cgroup, R}}) ->
    #{error => iolist_to_binary(beamdiag_agent_cgroup:format_error(R))};
location_info(#{version := V, dir := D}) -> #{version => V, dir => iolist_to_binary(D)}.

ok_or_error({ok, V}) -> V;
ok_or_error({error, _} = E) -> E.
