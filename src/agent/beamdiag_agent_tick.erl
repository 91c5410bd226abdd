%%% @doc One tick's sample, on the target (erts, kernel and stdlib only):
%%% the VM's counters, the node's threads and host from /proc, its cgroup,
%%% its memory (the VM's account and the OS's: beamdiag_agent_memory),
%%% its limits and the queue watch's latest readings, read within a
%%% deadline.
%%%
%%% A tick keeps its own cost bounded: the per-thread context-switch
%%% counts (one more /proc file per thread) are read on the first and last
%%% tick only (the state's `status'), the only ones the ledger takes them
%%% from; a middle tick reads the threads that ran in the interval before
%%% and the process's own CPU time, and the other threads only when that
%%% time says they ran too (beamdiag_agent_procfs:tick_threads/4: about 11
%%% reads a middle tick on a saturated 20-thread node, against 45 reading
%%% everything; the window's ends read everything, so its sums are exact).
%%% The open files (`held', a `beamdiag_agent_file:held()') stay open
%%% between samples, which costs a fraction of reading them whole. Every
%%% /proc read is a trip to a dirty I/O thread and back, and on a saturated
%%% node each trip waits a few milliseconds for a CPU (measured on 2 busy
%%% cores: 100 ms of wall time for 2 ms of CPU per tick): the deadline is
%%% checked between reads, and a tick that passes it is `late'.
%%%
%%% The counters every scheduler must answer for (scheduler wall time,
%%% msacc) are asked through the session's helper (beamdiag_agent_bounded_call)
%%% with a wait of a quarter of the interval, at most ?SLOW_MS: a scheduler
%%% held by a NIF answers late, and the tick goes on without them
%%% (`missing' in the VM counters says which and why).
%%%
%%% ```
%%% 1> Os = os:getpid(), {ok, Cg} = beamdiag_agent_cgroup:locate("/proc", Os).
%%% 2> S0 = #{pid => Os, proc_root => "/proc", msacc => false, cgroup_location => Cg}.
%%% 3> {#{t := _, vm := _, threads := _, tick_cost_us := Us}, S1} = beamdiag_agent_tick:sample(S0).
%%% '''
-module(beamdiag_agent_tick).

-export([sample/1, sample/2]).

-ifdef(TEST).
-export([queues/2]).
-endif.

-export_type([sample/0, tick_state/0]).

%% What sample/1 reads a sample with: the node's OS pid, the proc root,
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
    memory => beamdiag_agent_memory:reading(),
    queue_reads => #{binary() => beamdiag_agent_queues:reading()}
}.

%% The longest a tick waits for the counters every scheduler must answer
%% for (less at short intervals: a quarter of the interval).
-define(SLOW_MS, 250).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc One sample, and the state to take the next one with: the state's
%% `held' (a `beamdiag_agent_file:held()') keeps the /proc and cgroup files open
%% between samples, which costs a fraction of reading them whole.
-spec sample(tick_state()) -> {sample(), tick_state()}.
sample(State) ->
    {ok, Sample, State2} = sample(State, infinity),
    {Sample, State2}.

%% @doc One sample, or `late' when the deadline (monotonic milliseconds,
%% or `infinity') passes between two reads: on a throttled node a tick can
%% stall for seconds, and the agent must not overrun its own deadline by a
%% whole tick.
-spec sample(tick_state(), integer() | infinity) -> {ok, sample(), tick_state()} | late.
sample(State = #{pid := OsPid, proc_root := Root, msacc := Msacc}, Deadline) ->
    T0 = erlang:monotonic_time(microsecond),
    Status = maps:get(status, State, true),
    H0 = maps:get(held, State, beamdiag_agent_file:none()),
    T = erlang:monotonic_time(nanosecond),
    %% The memory ledger's VM part with the other every-scheduler counters,
    %% the allocators' on the window's ends.
    {Vm, Account} = vm(State, Msacc, Status =/= false),
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
    case beamdiag_agent_deadline:in_time(Deadline) andalso
             beamdiag_agent_procfs:tick_threads(Root, OsPid, ThreadOpts, H0) of
        false ->
            late;
        {{error, {beamdiag_agent_procfs, deadline}}, _} ->
            late;
        {Read, H1} ->
            {Threads, ProcStat} = case Read of
                                      {ok, Ts, C} -> {{ok, Ts}, C};
                                      {error, _} = E -> {E, undefined}
                                  end,
            ProcCpu = case ProcStat of
                          #{cpu := Cpu} -> Cpu;
                          undefined -> undefined
                      end,
            case beamdiag_agent_deadline:in_time(Deadline) andalso
                     beamdiag_agent_procfs:host(Root, #{loadavg => Status}, H1) of
                false ->
                    late;
                {Host, H2} ->
                    case beamdiag_agent_deadline:in_time(Deadline) andalso cgroup(State, H2) of
                        false ->
                            late;
                        {Cgroup, H3M} ->
                            %% The memory ledger's readings: the VM's
                            %% account and the OS's (statm, held open).
                            %% statm (the anonymous part) at the window's
                            %% ends; between them the resident memory from
                            %% the process's stat, read for its CPU time.
                            {Memory, H3} = case {Status, ProcStat} of
                                               {false, #{rss_pages := Rss}} ->
                                                   {beamdiag_agent_memory:read_vm(Rss, Account),
                                                    H3M};
                                               _ ->
                                                   beamdiag_agent_memory:read(Root, OsPid, H3M,
                                                                              Account)
                                           end,
                            Sample = queues(State, #{
                                memory => Memory,
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

%%%===================================================================
%%% Internal
%%%===================================================================

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

%% The VM counters, and the memory ledger's VM part (with the allocators'
%% when Alloc is true); those every scheduler must answer for (scheduler
%% wall time, msacc, erlang:memory/0, the allocators' sizes) with a
%% deadline: a scheduler held by a NIF answers late, and the tick goes on
%% without them (`missing' says which and why, the memory reading's
%% `vm_missing' why). The time ledger's counters and the memory account
%% are asked of two helpers at once and waited for together: behind
%% schedulers blocked 20 ms at a time, each every-scheduler request takes
%% 20 to 60 ms and the allocators' sizes twice that, so in one helper the
%% memory account made the window's ends late and lost their scheduler
%% wall time; a memory account still running when the next tick comes
%% makes only that tick's memory account `busy'.
vm(#{probe := Probe, interval_ms := Interval} = State, Msacc, Alloc) ->
    Vm0 = beamdiag_agent_vm:counters(#{msacc => false, swt => false}),
    Wait = slow_ms(Interval),
    Account = fun() -> beamdiag_agent_memory:vm_account(Alloc) end,
    {Asked, Inline} = case maps:find(memory_probe, State) of
                          {ok, MemProbe} -> {beamdiag_agent_bounded_call:ask(MemProbe, Account), none};
                          error -> {none, Account}
                      end,
    Until = erlang:monotonic_time(millisecond) + Wait,
    Time = fun() -> {beamdiag_agent_vm:all_schedulers(#{msacc => Msacc}),
                     case Inline of none -> none; F -> F() end}
           end,
    {Vm, InlineAccount} =
        case beamdiag_agent_bounded_call:call(Probe, Time, Wait) of
            {ok, {M, A}} ->
                {maps:merge(Vm0, M), A};
            Why ->
                Items = [swt, garbage_collection | [msacc || Msacc]] ++ [memory || Inline =/= none],
                {Vm0#{missing => #{items => Items, why => missing_why(Why), waited_ms => Wait}},
                 {missing, missing_why(Why)}}
        end,
    case Asked of
        none ->
            {Vm, InlineAccount};
        _ ->
            Left = beamdiag_agent_deadline:left(Until),
            case beamdiag_agent_bounded_call:answer(Asked, Left) of
                {ok, MemAccount} -> {Vm, MemAccount};
                Why2 -> {Vm, {missing, missing_why(Why2)}}
            end
    end;
vm(_State, Msacc, Alloc) ->
    {beamdiag_agent_vm:counters(#{msacc => Msacc}), beamdiag_agent_memory:vm_account(Alloc)}.

%% How long a tick waits for every scheduler's answer.
slow_ms(Interval) ->
    max(20, min(?SLOW_MS, Interval div 4)).

missing_why(timeout) -> timeout;
missing_why(busy) -> busy;
missing_why({error, _}) -> error.

%% The queue lengths of the processes the walker watches (the longest
%% queues at the window's start, and those that did not answer its walk):
%% the latest answer of each, with its time and its first answer, read
%% from the queue watch without asking any process (see
%% beamdiag_agent_queues): a flooded process answers only between its
%% garbage collections, which take seconds, and a held one when its NIF
%% returns; the tick never waits for either.
-spec queues(map(), sample() | map()) -> sample() | map().
queues(#{watch := Watch}, Sample) ->
    case beamdiag_agent_queues:read(Watch) of
        Reads when map_size(Reads) > 0 -> Sample#{queue_reads => Reads};
        _ -> Sample
    end;
queues(_State, Sample) ->
    Sample.

%% The cgroup's counters (its quota too, but on a middle tick).
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

ok_or_error({ok, V}) -> V;
ok_or_error({error, _} = E) -> E.
