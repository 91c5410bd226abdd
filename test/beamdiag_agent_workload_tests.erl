%%% EUnit tests of the experiment's load driver on this node, with units
%%% of work of this module that count their calls in a table: the units
%%% done in the measured window agree with the calls made in it (within
%%% the work in flight), the latency percentiles are ordered and bounded by
%%% the reservoir, a lab unit gets its context, a window never opened
%%% counts nothing, one driver at a time, the driver gone after `stop' or
%%% its bound.
-module(beamdiag_agent_workload_tests).

-include_lib("eunit/include/eunit.hrl").

%% The units of work: a function of arity 0, and a lab module's pair.
-export([unit/0, unit_context/1, unit/2]).

-define(TAB, beamdiag_agent_workload_tests).
-define(DRIVER, beamdiag_experiment_driver).

workload_test_() ->
    {setup, fun table/0, fun drop_table/1,
     [{timeout, 60, T} || T <- [
         {"a measured window", fun window/0},
         {"a lab unit gets its context", fun lab_unit/0},
         {"a window never opened", fun never_opened/0},
         {"one driver at a time", fun one_driver/0},
         {"the driver stops at its bound", fun bound/0},
         {"no driver", fun no_driver/0}
     ]]}.

window() ->
    Opts = #{unit => {mfa, ?MODULE, unit}, concurrency => 2, bound_ms => 30000,
             reservoir => 100},
    ok = beamdiag_agent_workload:start(Opts),
    T0 = erlang:monotonic_time(microsecond),
    A0 = calls(),
    ok = beamdiag_agent_workload:measure(start),
    S = calls(),
    ok = beamdiag_test_lib:await(fun() -> calls() >= S + 100 end, 10000),
    M = beamdiag_agent_workload:measure(stop),
    A1 = calls(),
    T1 = erlang:monotonic_time(microsecond),
    #{units := Units, elapsed_s := El, latency_us := Lat} = M,
    %% The calls made while the window was open, give or take the two in
    %% flight at each end.
    ?assert(Units >= 100 - 2),
    ?assert(Units =< A1 - A0 + 2),
    ?assert(El > 0 andalso El =< (T1 - T0) / 1.0e6),
    #{n := N, p50 := P50, p99 := P99, p999 := P999} = Lat,
    %% Each worker keeps max(50, 100 div 2) samples at most.
    ?assert(N > 0 andalso N =< 100 andalso N =< Units + 2),
    ?assert(0.0 =< P50 andalso P50 =< P99 andalso P99 =< P999),
    %% A unit sampled started after the window opened and ended before
    %% its worker handed its samples over.
    ?assert(P999 =< T1 - T0),
    %% The workers (two) end with the window.
    ?assertEqual(2, length(ets:match(?TAB, {{worker, '_'}}))),
    workers_ended(),
    driver_gone().

lab_unit() ->
    ok = beamdiag_agent_workload:start(#{unit => {lab, ?MODULE, my_unit}, concurrency => 3,
                                         bound_ms => 30000, reservoir => 100}),
    ok = beamdiag_agent_workload:measure(start),
    ok = beamdiag_test_lib:await(fun() -> calls() >= 10 end, 10000),
    #{units := Units} = beamdiag_agent_workload:measure(stop),
    ?assert(Units > 0),
    %% The context made once, by the driver; every call got it.
    ?assertEqual([{contexts, 1}], ets:lookup(?TAB, contexts)),
    ?assertEqual([[{ctx, my_unit}]], ets:match(?TAB, {seen, '$1'})),
    driver_gone().

never_opened() ->
    ok = beamdiag_agent_workload:start(#{unit => {mfa, ?MODULE, unit}, concurrency => 1,
                                         bound_ms => 30000, reservoir => 100}),
    ok = beamdiag_test_lib:await(fun() -> calls() >= 10 end, 10000),
    ?assertEqual(#{units => 0, elapsed_s => 0.0,
                   latency_us => #{n => 0, p50 => undefined, p99 => undefined,
                                   p999 => undefined}},
                 beamdiag_agent_workload:measure(stop)),
    driver_gone().

one_driver() ->
    Opts = #{unit => {mfa, ?MODULE, unit}, concurrency => 1, bound_ms => 30000,
             reservoir => 100},
    ok = beamdiag_agent_workload:start(Opts),
    Driver = whereis(?DRIVER),
    ?assertError({driver, already_running}, beamdiag_agent_workload:start(Opts)),
    ?assertEqual(Driver, whereis(?DRIVER)),
    _ = beamdiag_agent_workload:measure(stop),
    driver_gone().

bound() ->
    ok = beamdiag_agent_workload:start(#{unit => {mfa, ?MODULE, unit}, concurrency => 1,
                                         bound_ms => 100, reservoir => 100}),
    Driver = whereis(?DRIVER),
    MRef = erlang:monitor(process, Driver),
    receive {'DOWN', MRef, process, Driver, Why} -> ?assertEqual(normal, Why)
    after 10000 -> error(driver_on) end,
    ?assertError({driver, not_running}, beamdiag_agent_workload:measure(stop)),
    %% Its worker, linked to a driver that ended normally, is not ended
    %% by it: the unit ends it here.
    stop_workers().

no_driver() ->
    ?assertEqual(undefined, whereis(?DRIVER)),
    ?assertError({driver, not_running}, beamdiag_agent_workload:measure(start)),
    ?assertError({driver, not_running}, beamdiag_agent_workload:measure(stop)).

%%% The units

unit() ->
    case ets:member(?TAB, stop) of
        true ->
            exit(stopped);
        false ->
            ets:insert(?TAB, {{worker, self()}}),
            ets:update_counter(?TAB, calls, 1)
    end.

unit_context(Name) ->
    ets:update_counter(?TAB, contexts, 1, {contexts, 0}),
    {ctx, Name}.

unit(my_unit, Ctx) ->
    ets:insert(?TAB, {seen, Ctx}),
    unit().

%%% Helpers

%% The table lives in a process of its own: the units' calls outlive any
%% one test's process.
table() ->
    Self = self(),
    Owner = spawn(fun() ->
                          ?TAB = ets:new(?TAB, [named_table, public, {write_concurrency, true}]),
                          Self ! table,
                          receive stop -> ok end
                  end),
    receive table -> ok end,
    reset(),
    Owner.

drop_table(Owner) ->
    stop_workers(),
    Owner ! stop.

reset() ->
    ets:delete_all_objects(?TAB),
    ets:insert(?TAB, {calls, 0}).

calls() ->
    ets:lookup_element(?TAB, calls, 2).

%% The driver ended, and its workers with the window: the table is reset
%% for the next test.
driver_gone() ->
    ok = beamdiag_test_lib:await(fun() -> whereis(?DRIVER) =:= undefined end, 10000),
    reset().

%% Workers left without a driver end at their next unit.
stop_workers() ->
    ets:insert(?TAB, {stop}),
    workers_ended(),
    reset().

%% Every process that ran a unit has ended.
workers_ended() ->
    Workers = [P || [P] <- ets:match(?TAB, {{worker, '$1'}})],
    ok = beamdiag_test_lib:await(
           fun() -> not lists:any(fun erlang:is_process_alive/1, Workers) end, 10000).
