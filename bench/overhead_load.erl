%%% @doc The workload and probes `overhead.escript' runs on its peer nodes.
%%%
%%% `start/1' starts CPU-bound burners that count their work in a shared
%%% counter; `rate/1' measures the work done per second over a period on the
%%% node itself, so network latency does not enter the figure.
%%% `agent_memory/1' watches the beamdiag agent's memory for a while.
%%% `tick/2' times the agent's per-tick sample.
%%%
%%% ```
%%% 1> overhead_load:start(4).
%%% 2> overhead_load:rate(5000).
%%% 123456.0
%%% '''
-module(overhead_load).

-export([start/1, idle/1, rate/1, side_rate/1, msacc_pairs/2, tick_pairs/3, session_pairs/2, session_pairs/3, code_pairs/3, agent_memory/1, tick/2, cpu_us/0, cpu_ns/0]).

-define(KEY, {?MODULE, counter}).
-define(CHUNK, 2000).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Starts N burners under an owner process that lives until the node
%% stops.
-spec start(pos_integer()) -> ok.
start(N) ->
    C = counters:new(1, [write_concurrency]),
    persistent_term:put(?KEY, C),
    Self = self(),
    _ = spawn(fun() ->
        _ = [spawn_link(fun() -> burn(C, 1) end) || _ <- lists:seq(1, N)],
        Self ! started,
        receive
            stop -> ok
        end
    end),
    receive
        started -> ok
    end.

%% @doc N idle processes (each waiting in receive) under an owner that
%% lives until the node stops: the process table the agent's process
%% walks cover.
-spec idle(non_neg_integer()) -> ok.
idle(N) ->
    Self = self(),
    _ = spawn(fun() ->
        _ = [spawn_link(fun() -> receive stop -> ok end end) || _ <- lists:seq(1, N)],
        Self ! idle_started,
        receive
            stop -> ok
        end
    end),
    receive
        idle_started -> ok
    end.

%% @doc Work units per wall second and per CPU second of this node over the
%% next Ms milliseconds (CPU from the threads' schedstat, in nanoseconds). On a shared host the second is the steadier: a
%% neighbour taking CPUs away lowers both the work and the CPU time, while
%% the agent's own CPU time lowers only the work.
-spec rate(pos_integer()) -> {float(), float()}.
rate(Ms) ->
    C = persistent_term:get(?KEY),
    T0 = erlang:monotonic_time(nanosecond),
    Cpu0 = cpu_ns(),
    C0 = counters:get(C, 1),
    receive
    after Ms -> ok
    end,
    C1 = counters:get(C, 1),
    Cpu1 = cpu_ns(),
    T1 = erlang:monotonic_time(nanosecond),
    {(C1 - C0) * 1.0e9 / (T1 - T0), (C1 - C0) * 1.0e9 / max(1, Cpu1 - Cpu0)}.

%% @doc As rate/1, plus the CPU time per second of the threads other than
%% the normal schedulers (dirty I/O, aux, ...): where the agent's file reads
%% and the schedulers' answers to its statistics calls run. The burners
%% leave them idle.
-spec side_rate(pos_integer()) -> {float(), float(), float()}.
side_rate(Ms) ->
    S0 = side_ns(),
    T0 = erlang:monotonic_time(nanosecond),
    {W, C} = rate(Ms),
    T1 = erlang:monotonic_time(nanosecond),
    {W, C, (side_ns() - S0) * 1.0e9 / (T1 - T0)}.

%% @doc Microstate accounting on and off in alternating slices of Ms
%% (which goes first alternates too): for each pair, the work per CPU
%% second with it on over the same with it off. Puts the flag back.
-spec msacc_pairs(pos_integer(), pos_integer()) -> [float()].
msacc_pairs(Pairs, Ms) ->
    Was = erlang:system_flag(microstate_accounting, false),
    try
        [R || {R, _} <- pairs(Pairs, fun(On) ->
                                             _ = erlang:system_flag(microstate_accounting, On),
                                             receive after 20 -> ok end,
                                             {element(2, rate(Ms)), 0}
                                     end)]
    after
        erlang:system_flag(microstate_accounting, Was)
    end.

%% @doc The tick's cost amplified: alternating slices of Ms with the
%% agent's tick taken back to back by a high-priority process (each sample
%% sent to Sink, as the agent sends it to its caller) and without. For each
%% pair: the work per CPU second with the ticks over the same without, and
%% the ticks taken per second. scheduler_wall_time is on throughout, as in a
%% session, and put back afterwards.
-spec tick_pairs(pos_integer(), pos_integer(), pid()) -> [{float(), float()}].
tick_pairs(Pairs, Ms, Sink) ->
    _ = erlang:system_flag(scheduler_wall_time, true),
    Pid = os:getpid(),
    Cg = case beamdiag_agent_cgroup:locate("/proc", Pid) of
             {ok, L} -> L;
             {error, _} = E -> E
         end,
    %% Made in the worker, which owns the descriptors it opens and, as the
    %% agent does, the helper that reads the counters every scheduler must
    %% answer for (a message each way per tick).
    Init = fun() ->
               #{pid => Pid, proc_root => "/proc", msacc => false, cgroup_location => Cg,
                 status => false, held => beamdiag_agent_file:new(beamdiag_agent_file:budget("/proc")),
                 probe => beamdiag_agent_bounded_call:start(self()), interval_ms => 1000}
           end,
    %% A middle tick of a 1 s session reads the threads that ran in the
    %% interval before (and the others when the process's CPU time says
    %% they ran too), an idle thread's stat alone. Taken back to back,
    %% ticks a millisecond apart would find nearly every thread idle; each
    %% is set against the slice's first sample instead, so a thread that
    %% ran at all in the slice is read whole on every later tick (more
    %% reads than 1 s ticks make, not fewer).
    Tick = fun(State) ->
               {Sample, State2} = beamdiag_agent_tick:sample(State),
               Sink ! {tick, Sample},
               case State of
                   #{previous := First, process_cpu := FirstCpu} ->
                       State2#{previous := First, process_cpu := FirstCpu};
                   _ ->
                       State2
               end
           end,
    try
        per_second(pairs(Pairs, fun(On) -> slice(On, Init, Tick, Ms) end), Ms)
    after
        erlang:system_flag(scheduler_wall_time, false)
    end.

%% @doc A session's fixed cost amplified: alternating slices of Ms with
%% the shortest agent sessions run back to back (start, which turns on
%% scheduler_wall_time and msacc and locates the cgroup; the first and last
%% ticks, which read every file whole; the end, which puts the flags back)
%% and without. For each pair: the work per CPU second with the sessions
%% over the same without, and the sessions per second.
-spec session_pairs(pos_integer(), pos_integer()) -> [{float(), float()}].
session_pairs(Pairs, Ms) ->
    session_pairs(Pairs, Ms, #{}).

%% @doc As session_pairs/2, with more agent options (`procs => false': the
%% session without its process walks).
-spec session_pairs(pos_integer(), pos_integer(), map()) -> [{float(), float()}].
session_pairs(Pairs, Ms, Extra) ->
    Session = fun(none) ->
                  %% Three ticks 1 ms apart, microstate accounting
                  %% turned on at the last one and read there, on until the
                  %% session ends: as a default session turns it on for the
                  %% last slice of its window (its cost while on over that
                  %% slice is the budget's msacc part).
                  {ok, _, Ref} = beamdiag_agent:start(self(), maps:merge(
                                     #{duration_ms => 2, interval_ms => 1, msacc => true,
                                       msacc_ms => 1, locks => false, unload => []}, Extra)),
                  receive {beamdiag, Ref, {done, _}} -> ok end,
                  flush(Ref),
                  none
              end,
    per_second(pairs(Pairs, fun(On) -> slice(On, fun() -> none end, Session, Ms) end), Ms).

%% @doc The agent's code as a default session ships and removes it,
%% amplified: alternating slices of Ms with the agent's modules (Objects,
%% `{Module, File, Binary}') loaded from their binaries, then deleted and
%% purged (each purge asks every process whether it runs old code), back
%% to back, and without. For each pair: the work per CPU second with over
%% without, and the loads per second.
-spec code_pairs(pos_integer(), pos_integer(), [{module(), string(), binary()}]) ->
    [{float(), float()}].
code_pairs(Pairs, Ms, Objects) ->
    Cycle = fun(none) ->
                [{module, M} = code:load_binary(M, F, B) || {M, F, B} <- Objects],
                [begin true = code:delete(M), _ = code:purge(M) end || {M, _, _} <- Objects],
                none
            end,
    per_second(pairs(Pairs, fun(On) -> slice(On, fun() -> none end, Cycle, Ms) end), Ms).

%% Pairs of slices, on and off (which goes first alternates). Slice(On)
%% gives the work per CPU second and a count; each pair gives the ratio of
%% the first, on over off, and the count of the slice that was on.
pairs(Pairs, Slice) ->
    [begin
         Order = case I rem 2 of 0 -> [false, true]; 1 -> [true, false] end,
         R = [{On, Slice(On)} || On <- Order],
         {true, {OnRate, N}} = lists:keyfind(true, 1, R),
         {false, {OffRate, _}} = lists:keyfind(false, 1, R),
         {OnRate / OffRate, N}
     end || I <- lists:seq(1, Pairs)].

per_second(Rs, Ms) ->
    [{R, N * 1000 / Ms} || {R, N} <- Rs].

%% A slice of Ms: the work per CPU second, and how many times a
%% high-priority worker took Step (from Init's state) meanwhile; none
%% when the slice is off.
slice(false, _Init, _Step, Ms) ->
    {element(2, rate(Ms)), 0};
slice(true, Init, Step, Ms) ->
    Self = self(),
    Worker = spawn_opt(fun() -> steps(Step, Init(), Self, 0) end, [{priority, high}]),
    {_, C} = rate(Ms),
    Worker ! stop,
    receive {steps, Worker, N} -> {C, N} end.

steps(Step, State, Parent, N) ->
    receive
        stop -> Parent ! {steps, self(), N}
    after 0 ->
        steps(Step, Step(State), Parent, N + 1)
    end.

flush(Ref) ->
    receive {beamdiag, Ref, _} -> flush(Ref) after 0 -> ok end.

%% @doc Peak memory in bytes of the beamdiag agent process over Ms
%% milliseconds (0 when no agent ran), polled every 5 ms.
-spec agent_memory(pos_integer()) -> non_neg_integer().
agent_memory(Ms) ->
    Until = erlang:monotonic_time(millisecond) + Ms,
    watch(Until, undefined, 0).

%% @doc Times N agent samples taken Gap ms apart on this node: median wall
%% time in microseconds and OS CPU time of the whole node per sample: the
%% first and last ticks' (every file read whole, context switches too), and
%% every other tick's, read whole or through the descriptors the agent
%% keeps open.
-spec tick(pos_integer(), pos_integer()) -> map().
tick(N, Gap) ->
    _ = erlang:system_flag(scheduler_wall_time, true),
    _ = erlang:system_flag(microstate_accounting, true),
    Pid = os:getpid(),
    Cg = case beamdiag_agent_cgroup:locate("/proc", Pid) of
             {ok, L} -> L;
             {error, _} = E -> E
         end,
    State = #{pid => Pid, proc_root => "/proc", msacc => true, cgroup_location => Cg,
              held => beamdiag_agent_file:new(beamdiag_agent_file:budget("/proc"))},
    receive after Gap -> ok end,
    Full = measure(State#{held => beamdiag_agent_file:none()}, N, Gap),
    Whole = measure(State#{status => false, held => beamdiag_agent_file:none()}, N, Gap),
    Lean = measure(State#{status => false}, N, Gap),
    {ok, Tasks} = file:list_dir("/proc/" ++ Pid ++ "/task"),
    _ = erlang:system_flag(microstate_accounting, false),
    _ = erlang:system_flag(scheduler_wall_time, false),
    #{threads => length(Tasks), full => Full, whole => Whole, lean => Lean}.

%% @doc User plus system CPU time of this OS process, in microseconds
%% (10 ms resolution).
-spec cpu_us() -> non_neg_integer().
cpu_us() ->
    {ok, B} = file:read_file("/proc/self/stat"),
    [_, R] = binary:split(B, <<") ">>),
    F = binary:split(R, <<" ">>, [global]),
    (binary_to_integer(lists:nth(12, F)) + binary_to_integer(lists:nth(13, F))) * 10000.

%% @doc CPU time of this OS process in nanoseconds: the sum of its threads'
%% schedstat run times.
-spec cpu_ns() -> non_neg_integer().
cpu_ns() ->
    {ok, Tasks} = file:list_dir("/proc/self/task"),
    lists:sum([case file:read_file("/proc/self/task/" ++ T ++ "/schedstat") of
                   {ok, B} -> binary_to_integer(hd(binary:split(B, <<" ">>)));
                   {error, _} -> 0
               end || T <- Tasks]).

%%%===================================================================
%%% Internal
%%%===================================================================

side_ns() ->
    {ok, Tasks} = file:list_dir("/proc/self/task"),
    lists:sum([side_ns(T) || T <- Tasks]).

side_ns(T) ->
    Dir = "/proc/self/task/" ++ T,
    case {file:read_file(Dir ++ "/comm"), file:read_file(Dir ++ "/schedstat")} of
        {{ok, Name}, {ok, B}} ->
            case binary:match(Name, <<"_scheduler">>) of
                nomatch -> binary_to_integer(hd(binary:split(B, <<" ">>)));
                _ -> 0
            end;
        _ ->
            0
    end.

burn(C, X) ->
    X2 = spin(X, ?CHUNK),
    counters:add(C, 1, 1),
    burn(C, X2).

spin(X, 0) -> X;
spin(X, N) -> spin((X * 7 + 3) rem 1000003, N - 1).

watch(Until, Agent, Peak) ->
    case erlang:monotonic_time(millisecond) >= Until of
        true ->
            Peak;
        false ->
            A = case Agent of
                    undefined -> find_agent();
                    _ -> Agent
                end,
            M = case A of
                    undefined -> 0;
                    _ ->
                        case erlang:process_info(A, memory) of
                            {memory, Bytes} -> Bytes;
                            undefined -> 0
                        end
                end,
            receive after 5 -> ok end,
            Next = case M of 0 -> undefined; _ -> A end,
            watch(Until, Next, max(Peak, M))
    end.

%% Small bench nodes only: scans the process table.
find_agent() ->
    Agents = [P || P <- erlang:processes(),
                   {dictionary, D} <- [erlang:process_info(P, dictionary)],
                   lists:keyfind('$initial_call', 1, D) =:= {'$initial_call', {beamdiag_agent, init, 4}}],
    case Agents of
        [A | _] -> A;
        [] -> undefined
    end.

measure(State0, N, Gap) ->
    %% CPU is read across the sample and the gap after it (woken schedulers
    %% spin a while before they sleep again), less the same gap idle.
    Idle = [begin
                C0 = cpu_us(),
                receive after Gap -> ok end,
                cpu_us() - C0
            end || _ <- lists:seq(1, N)],
    %% One sample first opens the files the state holds.
    {_, State1} = beamdiag_agent_tick:sample(State0),
    {Runs, _} = lists:mapfoldl(
        fun(_, St) ->
            C0 = cpu_us(),
            {#{tick_cost_us := Us}, St2} = beamdiag_agent_tick:sample(St),
            receive after Gap -> ok end,
            {{Us, cpu_us() - C0}, St2}
        end,
        State1, lists:seq(1, N)),
    Walls = lists:sort([W || {W, _} <- Runs]),
    #{wall_us_median => lists:nth((N + 1) div 2, Walls),
      wall_us_max => lists:last(Walls),
      cpu_us_mean => max(0, (lists:sum([C || {_, C} <- Runs]) - lists:sum(Idle)) div N)}.
