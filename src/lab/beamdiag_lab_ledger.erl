%%% @doc Lab scenarios for the time ledger, and their workloads.
%%%
%%% The workload functions run on the lab node (this module is shipped
%%% there). Each starts its workers under one supervisor-less owner process
%%% that ends them all when its time bound passes. Scenarios with a `unit'
%%% also serve `beamdiag experiment': `unit/2' is one step of their load,
%%% which the experiment's driver calls in a closed loop.
%%%
%%% ```
%%% 1> [N || #{name := N} <- beamdiag_lab_ledger:scenarios()].
%%% [idle, busy_wait, busy_wait_off, cpu_saturated, ...]
%%% '''
-module(beamdiag_lab_ledger).

-export([scenarios/0]).
%% Units of work, called by the experiment's driver on its node.
-export([unit_context/1, unit/2]).
%% Workloads, called on the lab node.
-export([idle/1, wakeups/2, burn/2, burn_all/1, dev_zero/2, big_heap_gc/3, blocking/3]).
%% The workload owner, shared with the other lab modules' workloads.
-export([owner/2]).
%% Called on the lab node by beamdiag_agent_workload as Module:unit_context/1 and Module:unit/2.
-ignore_xref([{unit_context, 1}, {unit, 2}]).
%% Lab workloads: run on the lab node from the scenario's `load' MFA;
%% burn/2 also through peer:call/5 by beamdiag_lab.
-ignore_xref([{idle, 1}, {wakeups, 2}, {burn, 2}, {burn_all, 1}, {dev_zero, 2},
              {big_heap_gc, 3}, {blocking, 3}]).

-define(NO_SPIN, ["+sbwt", "none", "+sbwtdcpu", "none", "+sbwtdio", "none"]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The ledger scenarios.
-spec scenarios() -> [beamdiag_lab:scenario()].
scenarios() ->
    [
        #{name => idle, summary => <<"a node with nothing to do (negative control)">>,
          emu_args => [], load => {?MODULE, idle, ['$duration_ms']}, expect => []},
        #{name => busy_wait,
          summary => <<"short tasks woken every millisecond: schedulers spin between them">>,
          emu_args => ["+sbwt", "very_long", "+sbwtdcpu", "very_long", "+sbwtdio", "very_long"],
          load => {?MODULE, wakeups, ['$duration_ms', 40]}, expect => [busy_wait],
          unit => #{name => wakeup, concurrency => 40,
                    summary => <<"unit: sleep 1 ms, then hash 200 integers">>}},
        #{name => busy_wait_off,
          summary => <<"the busy_wait load with +sbwt none (negative control)">>,
          emu_args => ?NO_SPIN,
          load => {?MODULE, wakeups, ['$duration_ms', 40]}, expect => [],
          unit => #{name => wakeup, concurrency => 40,
                    summary => <<"the busy_wait unit with +sbwt none">>}},
        %% One scheduler on a host with more CPUs: saturated, with a core
        %% to spare so that it is not also starved.
        #{name => cpu_saturated,
          summary => <<"pure Erlang work on every scheduler: CPU bound, nothing wrong">>,
          emu_args => ["+S", "1:1"], load => {?MODULE, burn_all, ['$duration_ms']},
          expect => [cpu_saturated],
          unit => #{name => hash, concurrency => 8, summary => <<"unit: hash 20000 integers">>}},
        #{name => cpu_starvation,
          summary => <<"CPU-bound node sharing the host with a CPU-hungry competitor">>,
          emu_args => [], load => {?MODULE, burn_all, ['$duration_ms']},
          competitor => #{cpus => 2}, expect => [cpu_starvation]},
        #{name => cpu_throttling,
          summary => <<"CPU-bound node in a cgroup with a quota of a fifth of a CPU">>,
          emu_args => [], load => {?MODULE, burn_all, ['$duration_ms']},
          cgroup => #{quota_cpus => 0.2}, expect => [cpu_throttling]},
        #{name => high_system_cpu,
          summary => <<"workers reading /dev/zero in 1 MB chunks: the kernel does the work">>,
          emu_args => [], load => {?MODULE, dev_zero, ['$duration_ms', 4]},
          expect => [high_system_cpu]},
        #{name => dirty_cpu_gc,
          summary => <<"processes with large heaps collected again and again on dirty CPU schedulers">>,
          emu_args => [], load => {?MODULE, big_heap_gc, ['$duration_ms', 4, 400000]},
          expect => [dirty_cpu_gc]},
        #{name => scheduler_blocking,
          summary => <<"work that blocks its scheduler thread in the kernel, as a blocking NIF does">>,
          emu_args => [], load => {?MODULE, blocking, ['$duration_ms', 4, 20]},
          expect => [scheduler_blocking]}
    ].

%% @doc Nothing but a timer.
-spec idle(pos_integer()) -> ok.
idle(Ms) ->
    owner(Ms, fun() -> [] end).

%% @doc N processes, each woken every millisecond to do a little work. The
%% schedulers finish each task in microseconds and spin, waiting for the
%% next.
-spec wakeups(pos_integer(), pos_integer()) -> ok.
wakeups(Ms, N) ->
    owner(Ms, fun() ->
        [spawn_link(fun() -> wakeup_loop(I) end) || I <- lists:seq(1, N)]
    end).

%% @doc N processes spinning on pure Erlang arithmetic.
-spec burn(pos_integer(), pos_integer()) -> ok.
burn(Ms, N) ->
    owner(Ms, fun() -> [spawn_link(fun() -> burn_loop(0) end) || _ <- lists:seq(1, N)] end).

%% @doc Two burners per online scheduler.
-spec burn_all(pos_integer()) -> ok.
burn_all(Ms) ->
    burn(Ms, 2 * erlang:system_info(schedulers_online)).

%% @doc N processes reading /dev/zero in 1 MB chunks.
-spec dev_zero(pos_integer(), pos_integer()) -> ok.
dev_zero(Ms, N) ->
    owner(Ms, fun() ->
        [spawn_link(fun() ->
            {ok, F} = file:open("/dev/zero", [read, raw, binary]),
            dev_zero_loop(F)
         end) || _ <- lists:seq(1, N)]
    end).

%% @doc N processes each holding a list of Len elements and forcing major
%% collections of that heap, which run on dirty CPU schedulers.
-spec big_heap_gc(pos_integer(), pos_integer(), pos_integer()) -> ok.
big_heap_gc(Ms, N, Len) ->
    owner(Ms, fun() ->
        %% proc_lib records the fun as the initial call, so the workers can
        %% be told apart from other processes.
        [proc_lib:spawn_link(fun() -> gc_loop(lists:seq(1, Len), 0) end) || _ <- lists:seq(1, N)]
    end).

%% @doc N processes that put their scheduler thread to sleep in the kernel
%% for SleepMs at a time while the BEAM counts it busy: the signature of a
%% NIF that blocks.
-spec blocking(pos_integer(), pos_integer(), pos_integer()) -> ok.
blocking(Ms, N, SleepMs) ->
    owner(Ms, fun() ->
        _ = erts_debug:set_internal_state(available_internal_state, true),
        [spawn_link(fun() -> blocking_loop(SleepMs) end) || _ <- lists:seq(1, N)]
    end).

%% @doc The state a unit of work needs, made once per experiment run (none
%% for these units).
-spec unit_context(wakeup | hash) -> undefined.
unit_context(wakeup) -> undefined;
unit_context(hash) -> undefined.

%% @doc One unit of work: `wakeup' is one step of the busy_wait workers
%% (sleep 1 ms, then hash 200 integers), `hash' hashes 20000 integers.
-spec unit(wakeup | hash, undefined) -> ok.
unit(wakeup, _) -> wakeup(200);
unit(hash, _) -> work(20000).

%%%===================================================================
%%% Internal
%%%===================================================================

%% @doc Starts an owner process that starts the workers and kills them all
%% after Ms. The owner is unlinked from the caller (a short-lived call
%% process); the lab node itself dies with its session.
-spec owner(non_neg_integer(), fun(() -> [pid()])) -> ok.
owner(Ms, Start) ->
    Self = self(),
    Ref = make_ref(),
    _ = spawn(fun() ->
        process_flag(trap_exit, true),
        Workers = Start(),
        Self ! {Ref, started},
        receive
        after Ms -> [exit(W, kill) || W <- Workers]
        end
    end),
    receive
        {Ref, started} -> ok
    after 10000 -> ok
    end.

wakeup_loop(I) ->
    ok = wakeup(200 + I),
    wakeup_loop(I).

wakeup(Work) ->
    receive
    after 1 -> ok
    end,
    work(Work).

work(0) -> ok;
work(N) -> _ = erlang:phash2(N), work(N - 1).

burn_loop(N) ->
    burn_loop((N * 7 + 3) rem 1000003).

dev_zero_loop(F) ->
    {ok, _} = file:read(F, 1 bsl 20),
    dev_zero_loop(F).

gc_loop(Big, N) ->
    erlang:garbage_collect(),
    %% Some garbage between collections, and keep Big alive.
    _ = lists:seq(1, 1000),
    case N rem 1000 of
        0 -> gc_loop(Big, N + length(Big) rem 2 + 1);
        _ -> gc_loop(Big, N + 1)
    end.

blocking_loop(SleepMs) ->
    _ = erts_debug:set_internal_state(sleep, SleepMs),
    _ = work(2000),
    blocking_loop(SleepMs).
