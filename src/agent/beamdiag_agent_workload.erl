%%% @doc The experiment's load driver: runs on the experiment's lab node
%%% (shipped there by `beamdiag_experiment'), so it calls erts, kernel and
%%% stdlib only, and the workload's own module.
%%%
%%% A closed loop: `concurrency' workers each call the unit of work again
%%% and again, counting completions with `counters' and keeping latency
%%% samples in a bounded reservoir. `measure(start)' opens the measured
%%% window, `measure(stop)' closes it and returns the units done, the
%%% seconds between and the latency percentiles. The driver stops by itself
%%% after its time bound.
%%%
%%% Units: `{lab, Module, Name}' is a lab scenario's unit of work
%%% (`Module:unit_context(Name)' once, then `Module:unit(Name, Context)' per
%%% unit: the lab's own load, one step at a time); `{mfa, Module, Function}'
%%% a function of arity 0.
%%%
%%% ```
%%% 1> beamdiag_agent_workload:start(#{unit => {lab, beamdiag_lab_ledger, wakeup},
%%%        concurrency => 40, bound_ms => 60000, reservoir => 20000}).
%%% ok
%%% 2> beamdiag_agent_workload:measure(start), timer:sleep(5000),
%%%    beamdiag_agent_workload:measure(stop).
%%% #{units => 151234, elapsed_s => 5.0, latency_us => #{p50 => 1093.0, ...}}
%%% '''
-module(beamdiag_agent_workload).

-export([start/1, measure/1, modules/0]).
%% Called on the lab node by beamdiag_experiment: start/1 as the scenario's
%% load MFA, measure/1 through peer:call/5.
-ignore_xref([{start, 1}, {measure, 1}]).

-export_type([unit/0, measured/0]).

-type unit() :: {lab, module(), atom()} | {mfa, module(), atom()}.
%% measure(stop): the units done in the window, its length, and the
%% latency percentiles (us; `undefined' with no samples).
-type measured() :: #{
    units := integer(),
    elapsed_s := float(),
    latency_us := #{n := non_neg_integer(), p50 := float() | undefined,
                    p99 := float() | undefined, p999 := float() | undefined}
}.

-define(DRIVER, beamdiag_experiment_driver).
-define(STOP_TIMEOUT, 15000).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The modules the driver needs on the lab node, itself first.
-spec modules() -> [module()].
modules() ->
    [?MODULE, beamdiag_agent_deadline].

%% @doc Starts the closed-loop driver on this node (the workload's module
%% is loaded already, shipped with the driver), starts `concurrency'
%% workers and returns. The driver stops by itself after `bound_ms'.
-spec start(#{unit := unit(), concurrency := pos_integer(), bound_ms := pos_integer(),
              reservoir := pos_integer()}) -> ok.
start(#{unit := Unit, concurrency := C, bound_ms := Bound, reservoir := Res}) ->
    Self = self(),
    Ref = make_ref(),
    Pid = spawn(fun() -> driver(Self, Ref, Unit, C, Bound, Res) end),
    receive
        {Ref, ok} -> ok;
        {Ref, Error} -> erlang:error({driver, Error})
    after 10000 ->
        exit(Pid, kill),
        erlang:error({driver, start_timeout})
    end.

%% @doc `start' opens the measured window, `stop' closes it and returns
%% the units done, the seconds between and the latency percentiles.
-spec measure(start | stop) -> ok | measured().
measure(What) ->
    Ref = make_ref(),
    case whereis(?DRIVER) of
        undefined ->
            erlang:error({driver, not_running});
        Pid ->
            MRef = erlang:monitor(process, Pid),
            Pid ! {What, self(), Ref},
            receive
                {Ref, Reply} ->
                    erlang:demonitor(MRef, [flush]),
                    Reply;
                {'DOWN', MRef, process, _, Why} ->
                    erlang:error({driver, {down, Why}})
            after ?STOP_TIMEOUT + 5000 ->
                erlang:error({driver, timeout})
            end
    end.

%%%===================================================================
%%% Internal
%%%===================================================================

%% The driver's coordinator: owns the tables and the counter, starts the
%% workers, opens and closes the window, gathers the reservoirs.
driver(Starter, Ref, Unit, C, Bound, Res) ->
    try register(?DRIVER, self()) of
        true -> ok
    catch
        error:badarg -> Starter ! {Ref, already_running}, exit(normal)
    end,
    process_flag(trap_exit, true),
    Count = counters:new(1, [write_concurrency]),
    Phase = atomics:new(1, []),
    Ctx = unit_context(Unit),
    PerWorker = max(50, Res div C),
    Workers = [spawn_link(fun() -> worker(Unit, Ctx, Count, Phase, PerWorker) end)
               || _ <- lists:seq(1, C)],
    Starter ! {Ref, ok},
    erlang:send_after(Bound, self(), bound),
    driver_loop(Workers, Count, Phase, undefined).

driver_loop(Workers, Count, Phase, Start) ->
    receive
        {start, From, Ref} ->
            atomics:put(Phase, 1, 1),
            From ! {Ref, ok},
            driver_loop(Workers, Count, Phase,
                        {counters:get(Count, 1), erlang:monotonic_time(microsecond)});
        {stop, From, Ref} ->
            atomics:put(Phase, 1, 2),
            T1 = erlang:monotonic_time(microsecond),
            N1 = counters:get(Count, 1),
            {N0, T0} = case Start of undefined -> {N1, T1}; _ -> Start end,
            Reservoirs = gather(Workers, erlang:monotonic_time(millisecond) + ?STOP_TIMEOUT, []),
            From ! {Ref, #{units => N1 - N0, elapsed_s => (T1 - T0) / 1.0e6,
                           latency_us => latency(Reservoirs)}},
            exit(normal);
        bound ->
            exit(normal);
        {'EXIT', _, _} ->
            driver_loop(Workers, Count, Phase, Start)
    end.

gather([], _Deadline, Acc) ->
    Acc;
gather(Workers, Deadline, Acc) ->
    Wait = beamdiag_agent_deadline:left(Deadline),
    receive
        {reservoir, W, Seen, Samples} ->
            gather(lists:delete(W, Workers), Deadline, [{Seen, Samples} | Acc])
    after Wait ->
        Acc
    end.

%% Latency percentiles over the workers' reservoirs, each sample weighted by
%% the completions its reservoir stands for.
latency(Reservoirs) ->
    Weighted = lists:sort(lists:append(
        [[{L, Seen / map_size(S)} || L <- maps:values(S)]
         || {Seen, S} <- Reservoirs, map_size(S) > 0])),
    Total = lists:sum([W || {_, W} <- Weighted]),
    P = fun(Q) -> weighted_percentile(Weighted, Q * Total, 0.0) end,
    #{n => length(Weighted), p50 => P(0.5), p99 => P(0.99), p999 => P(0.999)}.

weighted_percentile([], _Target, _Acc) -> undefined;
weighted_percentile([{L, _}], _Target, _Acc) -> float(L);
weighted_percentile([{L, W} | Rest], Target, Acc) ->
    case Acc + W >= Target of
        true -> float(L);
        false -> weighted_percentile(Rest, Target, Acc + W)
    end.

unit_context({lab, M, Name}) -> M:unit_context(Name);
unit_context({mfa, _, _}) -> undefined.

worker(Unit, Ctx, Count, Phase, K) ->
    worker(Unit, Ctx, Count, Phase, K, 0, #{}).

worker(Unit, Ctx, Count, Phase, K, Seen, Res) ->
    case atomics:get(Phase, 1) of
        2 ->
            ?DRIVER ! {reservoir, self(), Seen, Res},
            ok;
        Ph ->
            T0 = erlang:monotonic_time(),
            _ = unit(Unit, Ctx),
            T1 = erlang:monotonic_time(),
            counters:add(Count, 1, 1),
            case Ph of
                1 ->
                    Us = erlang:convert_time_unit(T1 - T0, native, microsecond),
                    S1 = Seen + 1,
                    Res1 = case S1 =< K of
                               true -> Res#{S1 => Us};
                               false ->
                                   J = rand:uniform(S1),
                                   case J =< K of
                                       true -> Res#{J => Us};
                                       false -> Res
                                   end
                           end,
                    worker(Unit, Ctx, Count, Phase, K, S1, Res1);
                _ ->
                    worker(Unit, Ctx, Count, Phase, K, Seen, Res)
            end
    end.

unit({lab, M, Name}, Ctx) ->
    M:unit(Name, Ctx);
unit({mfa, M, F}, _) ->
    M:F().
