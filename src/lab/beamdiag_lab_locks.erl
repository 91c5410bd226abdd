%%% @doc Lab scenarios that produce (or avoid) VM lock contention.
%%%
%%% Each scenario runs on a peer node started with the lock-counting
%%% emulator (`emu_type => lcnt') and the scenario's extra emulator flags.
%%% The lab loads this module onto the peer and calls the scenario's `load'
%%% there (the lab replaces `'$duration_ms'' in the arguments with the
%%% time bound); `run/2' starts the workload and returns at once. The workload
%%% stops by itself after `duration_s' seconds (default 120), when
%%% `stop/1' is called, when the group leader of the process that started
%%% it goes down (the session that started it, usually on another node,
%%% went away; the starting process itself is a short-lived call process)
%%% or when an optional `owner' pid goes down.
%%%
%%% ```
%%% 1> [S | _] = beamdiag_lab_locks:scenarios(), maps:get(name, S).
%%% ets_hot
%%% 2> {ok, Pid} = beamdiag_lab_locks:run(ets_hot, #{duration_s => 30}).
%%% 3> exit(Pid, shutdown).
%%% true
%%% '''
%%%
%%% The workloads:
%%% <ul>
%%% <li>`ets_hot': 4 writers per scheduler bump 4 counters in one public
%%%   table, `beamdiag_hot_table' (write_concurrency on, as a metrics
%%%   library would create it). Every writer hits the same few hash-slot
%%%   locks. It varies (`beamdiag lab ets_hot --vary writers=64,table=bag'):
%%%   the writers, the table's type (a bag's writers insert and delete
%%%   objects, the others bump counters), write_concurrency, the keys and
%%%   the schedulers.</li>
%%% <li>`ets_sharded': the same writers and counters over one table per
%%%   scheduler (`beamdiag_shard_N'); a writer bumps the table of the
%%%   scheduler it runs on.</li>
%%% <li>`dirty_gc_alloc' and `dirty_gc_alloc_mdai': 4 processes per dirty CPU
%%%   scheduler (4 of them, on 4 schedulers) keep 100k to 400k words live
%%%   each and collect garbage in a loop; collections of heaps that large
%%%   run on the dirty CPU schedulers, which by default share one eheap_alloc
%%%   instance. The second scenario runs with +Mdai max.</li>
%%% </ul>
-module(beamdiag_lab_locks).

-export([scenarios/0, run/2, run/3]).
%% Units of work, called by the experiment's driver on its node.
-export([unit_context/1, unit/2]).
%% Lab workloads: run on the lab node from the scenario's `load' MFA.
-ignore_xref([{run, 2}, {run, 3}]).
%% Called on the lab node by beamdiag_agent_workload as Module:unit_context/1 and Module:unit/2.
-ignore_xref([{unit_context, 1}, {unit, 2}]).

-export_type([scenario/0]).

%% The coordinator never returns: it exits, taking its linked workers along.
-dialyzer({no_return, run_load/2}).

-define(HOT_TABLE, beamdiag_hot_table).
%% Keys are drawn with rand: erlang:unique_integer/1 encodes the scheduler
%% in its low bits, so `rem' over it would shard the keys by scheduler.
-define(KEYS, 4).
%% The schedulers by default: the writers must outnumber a small host's
%% cores (see scenarios/0).
-define(ETS_SCHEDULERS, 4).
-define(WRITERS_PER_SCHEDULER, 4).
-define(GC_WORKERS_PER_DIRTY, 4).
%% Writes per unit of work in an experiment.
-define(UNIT_WRITES, 100).
%% Dirty schedulers outnumber the cores of a small machine, so that
%% collections overlap even on two cores.
-define(GC_EMU_ARGS, ["+S", "4:4", "+SDcpu", "4:4"]).

-type scenario() :: #{
    name := atom(),
    summary := binary(),
    emu_args := [string()],
    emu_type => lcnt,
    load := {module(), atom(), [term()]},
    unit => #{name := atom(), concurrency := pos_integer(), summary := binary()},
    vary => #{atom() => beamdiag_lab:vary_spec()},
    expect => [atom()]
}.
-type run_opts() :: #{duration_s => pos_integer(), owner => pid(), vary => vary()}.
%% The ets_hot load's variation (the lab's schedulers aside).
-type vary() :: #{writers => auto | pos_integer(), table => ets:table_type(),
                  write_concurrency => boolean(), keys => pos_integer(), atom() => term()}.

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The lock scenarios, for the lab.
-spec scenarios() -> [scenario()].
scenarios() ->
    [
        %% Four schedulers, whatever the host: on a small host the writers
        %% must outnumber the cores for a lock holder to lose its CPU in the
        %% middle of a write, which a many-core host gets from sheer
        %% concurrency. Measured on 2 idle cores: 3% of the window waited
        %% with 2 schedulers, 200-300% with 4.
        #{
            name => ets_hot,
            summary =>
                <<"Many writers on all schedulers bump a few counters in one public ETS "
                  "table (beamdiag_hot_table): expect ets_contention naming it.">>,
            emu_args => [],
            emu_type => lcnt,
            load => {?MODULE, run, [ets_hot, '$duration_ms', '$vary']},
            vary => ets_vary(),
            expect => [ets_contention],
            unit => #{name => ets_hot, concurrency => 8,
                      summary => <<"unit: 100 of the writers' update_counter calls on the "
                                   "one shared table">>}
        },
        #{
            name => ets_sharded,
            summary =>
                <<"The same writers over one ETS table per scheduler: expect no ETS "
                  "lock finding.">>,
            emu_args => [],
            emu_type => lcnt,
            load => {?MODULE, run, [ets_sharded, '$duration_ms']},
            vary => maps:with([schedulers], ets_vary()),
            expect => [],
            unit => #{name => ets_sharded, concurrency => 8,
                      summary => <<"unit: 100 of the writers' update_counter calls on the "
                                   "table of the scheduler it runs on">>}
        },
        #{
            name => dirty_gc_alloc,
            summary =>
                <<"Large heaps collected on the dirty CPU schedulers, which share one "
                  "eheap_alloc instance by default: expect allocator_contention.">>,
            emu_args => ?GC_EMU_ARGS,
            emu_type => lcnt,
            load => {?MODULE, run, [dirty_gc, '$duration_ms']},
            expect => [allocator_contention]
        },
        #{
            name => dirty_gc_alloc_mdai,
            summary =>
                <<"The dirty GC load with +Mdai max (an allocator instance per dirty "
                  "scheduler): expect fewer eheap_alloc collisions and no advice to set "
                  "+Mdai max.">>,
            emu_args => ?GC_EMU_ARGS ++ ["+Mdai", "max"],
            emu_type => lcnt,
            load => {?MODULE, run, [dirty_gc, '$duration_ms']}
        }
    ].

%% @doc Starts a workload on this node and returns its coordinator at once.
%% The second argument is the time bound in milliseconds (the lab passes
%% it for `'$duration_ms'') or a map of options: `duration_s' (default 120)
%% and `owner'.
-spec run(ets_hot | ets_sharded | dirty_gc, pos_integer() | run_opts()) -> {ok, pid()}.
run(Load, DurationMs) when is_integer(DurationMs), DurationMs > 0 ->
    run(Load, #{duration_s => max(1, DurationMs div 1000)});
run(Load, Opts) when
    (Load =:= ets_hot orelse Load =:= ets_sharded orelse Load =:= dirty_gc), is_map(Opts)
->
    run_load(Load, Opts).

%% @doc As `run/2', with the lab's variation of the load (`'$vary'').
-spec run(ets_hot, pos_integer(), vary()) -> {ok, pid()}.
run(Load, DurationMs, Vary) when is_integer(DurationMs), DurationMs > 0, is_map(Vary) ->
    run_load(Load, #{duration_s => max(1, DurationMs div 1000), vary => Vary}).

run_load(Load, Opts) ->
    Starter = self(),
    {group_leader, GL} = erlang:process_info(Starter, group_leader),
    DurationMs = 1000 * maps:get(duration_s, Opts, 120),
    Owner = maps:get(owner, Opts, undefined),
    Ref = make_ref(),
    Vary = maps:merge(ets_defaults(), maps:get(vary, Opts, #{})),
    Pid = spawn(fun() -> coordinator(Load, Vary, Starter, GL, Owner, DurationMs, Ref) end),
    receive
        {Ref, started} -> {ok, Pid}
    after 10000 ->
        exit(Pid, kill),
        error({workload_start_timeout, Load})
    end.

%% @doc The tables a unit of work writes to, made as the lab's load makes
%% them, once per experiment run.
-spec unit_context(ets_hot | ets_sharded) -> ets:table() | {tuple(), pos_integer()}.
unit_context(ets_hot) ->
    hot_table();
unit_context(ets_sharded) ->
    N = erlang:system_info(schedulers_online),
    {shard_tables(N), N}.

%% @doc One unit of work: 100 steps of the lab's writers.
-spec unit(ets_hot | ets_sharded, ets:table() | {tuple(), pos_integer()}) -> ok.
unit(ets_hot, T) ->
    repeat(fun() -> hot_write(T) end, ?UNIT_WRITES);
unit(ets_sharded, {Tables, N}) ->
    repeat(fun() -> sharded_write(Tables, N) end, ?UNIT_WRITES).

%%%===================================================================
%%% Internal
%%%===================================================================

-spec coordinator(atom(), vary(), pid(), pid(), pid() | undefined, pos_integer(), reference()) ->
    no_return().
coordinator(Load, Vary, Starter, GL, Owner, DurationMs, Ref) ->
    %% The starter itself is usually a short-lived call process (erpc,
    %% peer:call) whose exit says nothing; its group leader lives as long as
    %% the session that started the workload.
    _ = erlang:monitor(process, GL),
    _ =
        case Owner of
            undefined -> ok;
            _ -> erlang:monitor(process, Owner)
        end,
    %% The workers are linked: when this process exits, they do too.
    ok = start_load(Load, Vary),
    Starter ! {Ref, started},
    TRef = erlang:start_timer(DurationMs, self(), done),
    receive
        {'DOWN', _, process, _, Reason} ->
            exit({shutdown, {owner_down, Reason}});
        {timeout, TRef, done} ->
            exit({shutdown, done})
    end.

-spec start_load(atom(), vary()) -> ok.
start_load(ets_hot, Vary = #{writers := W, table := Type, keys := Keys}) ->
    T = hot_table(Vary),
    Writers = case W of
                  auto -> ?WRITERS_PER_SCHEDULER * erlang:system_info(schedulers_online);
                  N -> N
              end,
    _ = [spawn_link(fun() -> hot_writer(T, Type, Keys) end) || _ <- lists:seq(1, Writers)],
    ok;
start_load(ets_sharded, _Vary) ->
    N = erlang:system_info(schedulers_online),
    Tables = shard_tables(N),
    Writers = ?WRITERS_PER_SCHEDULER * N,
    _ = [spawn_link(fun() -> sharded_writer(Tables, N) end) || _ <- lists:seq(1, Writers)],
    ok;
start_load(dirty_gc, _Vary) ->
    Workers = ?GC_WORKERS_PER_DIRTY * max(1, erlang:system_info(dirty_cpu_schedulers_online)),
    _ = [spawn_link(fun() -> gc_worker(I) end) || I <- lists:seq(1, Workers)],
    ok.

-spec hot_table() -> ets:table().
hot_table() ->
    hot_table(ets_defaults()).

%% The hot table of a variation: its type and write_concurrency, a counter
%% per key (a bag starts empty: its writers add and remove objects).
-spec hot_table(vary()) -> ets:table().
hot_table(#{table := Type, write_concurrency := WC, keys := Keys}) ->
    T = ets:new(?HOT_TABLE, [Type, public, named_table, {write_concurrency, WC},
                             {read_concurrency, false}]),
    _ = case Type of
            set -> ets:insert(T, [{K, 0} || K <- lists:seq(1, Keys)]);
            ordered_set -> ets:insert(T, [{K, 0} || K <- lists:seq(1, Keys)]);
            _ -> true
        end,
    T.

%% What ets_hot varies, with the lab's defaults.
ets_vary() ->
    #{writers => #{values => [{integer, 1, 4096}], default => auto,
                   help => <<"writing processes (auto: 4 per scheduler)">>},
      table => #{values => [set, ordered_set, bag, duplicate_bag], default => set,
                 help => <<"the table's type">>},
      write_concurrency => #{values => [true, false], default => true,
                             help => <<"the table's write_concurrency">>},
      keys => #{values => [{integer, 1, 1000000}], default => ?KEYS,
                help => <<"distinct keys the writers share">>},
      schedulers => #{values => [host, {integer, 1, 1024}], default => ?ETS_SCHEDULERS,
                      help => <<"schedulers (host: one per core)">>}}.

ets_defaults() ->
    maps:map(fun(_, #{default := D}) -> D end, maps:without([schedulers], ets_vary())).

-spec shard_tables(pos_integer()) -> tuple().
shard_tables(N) ->
    list_to_tuple([
        begin
            Name = list_to_atom("beamdiag_shard_" ++ integer_to_list(I)),
            T = ets:new(Name, table_opts()),
            true = ets:insert(T, [{K, 0} || K <- lists:seq(1, ?KEYS)]),
            T
        end
     || I <- lists:seq(1, N)
    ]).

-spec table_opts() -> [term()].
table_opts() ->
    [set, public, named_table, {write_concurrency, true}, {read_concurrency, false}].

-spec hot_writer(ets:table(), ets:table_type(), pos_integer()) -> no_return().
hot_writer(T, Type, Keys) when Type =:= bag; Type =:= duplicate_bag ->
    K = rand:uniform(Keys),
    true = ets:insert(T, {K, rand:uniform(8)}),
    true = ets:delete_object(T, {K, rand:uniform(8)}),
    hot_writer(T, Type, Keys);
hot_writer(T, Type, Keys) ->
    _ = ets:update_counter(T, rand:uniform(Keys), 1),
    hot_writer(T, Type, Keys).

hot_write(T) ->
    _ = ets:update_counter(T, rand:uniform(?KEYS), 1),
    ok.

-spec sharded_writer(tuple(), pos_integer()) -> no_return().
sharded_writer(Tables, N) ->
    sharded_write(Tables, N),
    sharded_writer(Tables, N).

sharded_write(Tables, N) ->
    Shard = min(N, erlang:system_info(scheduler_id)),
    _ = ets:update_counter(element(Shard, Tables), rand:uniform(?KEYS), 1),
    ok.

repeat(_, 0) -> ok;
repeat(F, N) -> F(), repeat(F, N - 1).

%% Keeps a large live heap (100k to 400k words, so that heap sizes differ
%% and carriers are not simply reused) and collects it in a loop, with some
%% fresh garbage in between so that every collection has work to do.
-spec gc_worker(pos_integer()) -> no_return().
gc_worker(I) ->
    Live = [{I, X} || X <- lists:seq(1, 20000 + rand:uniform(60000))],
    gc_loop(Live).

-spec gc_loop(list()) -> no_return().
gc_loop(Live) ->
    _ = lists:seq(1, 20000),
    true = erlang:garbage_collect(),
    gc_loop(Live).
