%%% Property test: every figure of every finding, on every recorded capture
%%% (lab scenarios and real servers) and on random stretches of them, is
%%% within its physical bound in its own unit, and no evidence line reads
%%% "X s of Y s" or "X of Y CPUs" with X above Y.
-module(beamdiag_figures_tests).
-include_lib("eunit/include/eunit.hrl").

-define(EPS, 1.0e-6).
-define(STRETCHES, 6).

captures() ->
    Dir = beamdiag_test_lib:fixture_dir("captures"),
    Files = filelib:wildcard(filename:join(Dir, "*.capture")),
    [{filename:basename(F, ".capture"), C} || F <- Files, {ok, [C]} <- [file:consult(F)]].

%% The recorded real servers are among the captures the property runs on.
real_servers_recorded_test() ->
    Names = [N || {N, _} <- captures()],
    ?assert(length([N || N <- Names, lists:prefix("rabbitmq_", N)]) >= 2),
    ?assert(length([N || N <- Names, lists:prefix("yaws_", N)]) >= 2).

bounds_test_() ->
    {timeout, 120, fun() ->
        rand:seed(exsss, {13, 2, 5}),
        Checked = lists:sum([check_capture(N, C) || {N, C} <- captures()]),
        %% The property is not vacuous: figures were checked.
        ?assert(Checked > 100)
    end}.

%% Findings that quote figures carry them: every ledger finding on every
%% capture has figures.
ledger_findings_carry_figures_test() ->
    Ledger = [Id || #{id := Id, area := ledger} <- beamdiag_catalogue:entries()],
    [?assertNotEqual({N, Id, []}, {N, Id, Figs})
     || {N, C} <- captures(), #{id := Id, figures := Figs} <- findings(C),
        lists:member(Id, Ledger)].

%% The case from the field: dirty GC on a RabbitMQ whose queues backed up,
%% where msacc's wall time over its span reads more "CPUs" than the whole
%% node used. At least one recorded backlog has that trap; on each, the
%% finding's CPU figure is below the node's CPU and its wall figure below
%% the threads' wall time.
backed_up_rabbitmq_dirty_gc_within_node_cpu_test() ->
    Traps = [{N, L, F} || {N = "rabbitmq_backlog" ++ _, C} <- captures(),
                          #{ledger := L, findings := F} <- [beamdiag:analyse(C)],
                          trap(L)],
    ?assertNotEqual([], Traps),
    [begin
         [Figs] = [Figs || #{id := dirty_cpu_gc, figures := Figs} <- F],
         V = maps:from_list([{K, X} || #{name := K, value := X} <- Figs]),
         %% Against the node's CPUs over the same span as msacc's.
         ?assert(maps:get(dirty_gc_cpus, V) =< maps:get(span_cpus_used, V) + ?EPS),
         ?assert(maps:get(span_cpus_used, V) =< ncpu(L) + ?EPS),
         ?assert(maps:get(dirty_gc_wall_s, V) =< maps:get(msacc_wall_s, V))
     end || {_, L, F} <- Traps].

trap(#{totals := #{cpus_used := Used},
       msacc := #{by_type := #{dirty_cpu := #{seconds := Secs}}, span_s := Span}}) ->
    maps:get(gc, Secs, 0) / Span > Used;
trap(_) ->
    false.

%%% Helpers

check_capture(Name, C = #{samples := Samples}) ->
    Whole = check(Name, C),
    N = length(Samples),
    Stretches = [begin
                     I = rand:uniform(N - 1),
                     J = I + rand:uniform(N - I),
                     check({Name, I, J}, C#{samples := lists:sublist(Samples, I, J - I + 1)})
                 end || N >= 3, _ <- lists:seq(1, ?STRETCHES)],
    Whole + lists:sum(Stretches).

findings(C) ->
    maps:get(findings, beamdiag:analyse(C)).

check(Name, C) ->
    #{ledger := L, findings := F} = beamdiag:analyse(C),
    lists:sum([check_finding(Name, L, X) || X <- F]).

check_finding(Name, L, #{id := Id, figures := Figs, evidence := Ev}) ->
    ByName = maps:from_list([{K, V} || #{name := K, value := V} <- Figs]),
    [begin
         Where = {Name, Id, Fig},
         ?assertEqual({Where, true}, {Where, within(Fig, L)}),
         case maps:find(part_of, Fig) of
             {ok, Whole} ->
                 ?assertMatch({Where, {ok, _}}, {Where, maps:find(Whole, ByName)}),
                 ?assertEqual({Where, true}, {Where, V =< maps:get(Whole, ByName) + ?EPS});
             error ->
                 ok
         end
     end || Fig = #{value := V} <- Figs],
    [text_bounds(Name, Id, E) || E <- Ev],
    length(Figs).

within(#{value := V}, _L) when not is_number(V); V < -?EPS ->
    false;
within(#{unit := share, value := V}, _L) ->
    V =< 1.0 + ?EPS;
within(#{unit := cpus, scope := node, name := cpus_used, value := V}, L) ->
    V =< ncpu(L) + ?EPS;
within(#{unit := cpus, scope := span, value := V}, L) ->
    V =< ncpu(L) + ?EPS;
within(#{unit := cpus, scope := node, value := V}, #{totals := #{cpus_used := Used}}) ->
    V =< Used + ?EPS;
within(#{unit := cpus, value := V}, L) ->
    V =< ncpu(L) + ?EPS;
within(#{unit := cpu_s, scope := node, value := V}, #{totals := #{on_cpu := On}}) ->
    V =< On + ?EPS;
within(#{unit := cpu_s, value := V}, L = #{window_s := W}) ->
    V =< W * ncpu(L) + ?EPS;
within(#{unit := wall_s, scope := window, value := V}, #{window_s := W}) ->
    V =< W + ?EPS;
within(#{unit := wall_s, scope := host, value := V}, L = #{window_s := W}) ->
    V =< W * ncpu(L) + ?EPS;
within(#{unit := wall_s, value := V}, #{window_s := W, threads := Threads}) ->
    V =< W * length(Threads) + ?EPS;
within(#{unit := Unit}, _L) ->
    lists:member(Unit, [count, per_s]).

ncpu(#{host := #{ncpu := N}}) -> N;
ncpu(#{totals := #{cpus_available := A}}) -> A.

%% "X s of Y s", "X of Y CPUs", "X CPU-seconds of Y": X is never above Y.
text_bounds(Name, Id, E) ->
    Res = ["([0-9]+\\.[0-9]+) s of (?:their )?([0-9]+\\.[0-9]+) s",
           "([0-9]+\\.[0-9]+) of (?:its |the )?([0-9]+\\.[0-9]+) CPUs",
           "([0-9]+\\.[0-9]+) CPU-seconds of ([0-9]+\\.[0-9]+)",
           "([0-9]+\\.[0-9]+) CPUs of the ([0-9]+\\.[0-9]+)"],
    [?assertEqual({Name, Id, E, true}, {Name, Id, E, binary_to_float(X) =< binary_to_float(Y)})
     || Re <- Res,
        {match, Ms} <- [re:run(E, Re, [global, {capture, all_but_first, binary}])],
        [X, Y] <- Ms].
