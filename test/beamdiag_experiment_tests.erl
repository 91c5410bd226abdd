%%% EUnit tests of the experiment's parts that start no node: workloads
%%% parsed from the command line (lab scenarios with a unit of work, a
%%% module's function of arity 0, no atom made for a name that is not
%%% there), options checked before anything runs, arms refused (a variant
%%% that is not emulator flags, a module without object code) before the
%%% first lab node starts, and the sentences. The runs themselves are
%%% tested in beamdiag_lab_SUITE.
-module(beamdiag_experiment_tests).

-include_lib("eunit/include/eunit.hrl").

%% A workload of this module, for workload/1 to find.
-export([unit/0]).

unit() ->
    ok.

%%%===================================================================
%%% Workloads
%%%===================================================================

%% Every lab scenario with a unit of work is a workload; one without is
%% not.
lab_workloads_test() ->
    Scenarios = beamdiag_lab:scenarios(),
    With = [N || S = #{name := N} <- Scenarios, maps:is_key(unit, S)],
    Without = [N || S = #{name := N} <- Scenarios, not maps:is_key(unit, S)],
    ?assert(lists:member(busy_wait, With)),
    ?assert(lists:member(idle, Without)),
    [?assertEqual({ok, {lab, N}}, beamdiag_experiment:workload("lab:" ++ atom_to_list(N)))
     || N <- With],
    [?assertEqual({error, {beamdiag_experiment, {unknown_lab, atom_to_list(N)}}},
                  beamdiag_experiment:workload("lab:" ++ atom_to_list(N)))
     || N <- Without].

mfa_workloads_test_() ->
    [
        ?_assertEqual({ok, {mfa, os, getpid}}, beamdiag_experiment:workload("os:getpid")),
        ?_assertEqual({ok, {mfa, ?MODULE, unit}},
                      beamdiag_experiment:workload(atom_to_list(?MODULE) ++ ":unit")),
        %% Arity 0 only.
        ?_assertEqual({error, {beamdiag_experiment, {no_function, "lists", "reverse"}}},
                      beamdiag_experiment:workload("lists:reverse")),
        ?_assertEqual({error, {beamdiag_experiment, {no_function, "os", "unit"}}},
                      beamdiag_experiment:workload("os:unit"))
    ].

bad_workloads_test_() ->
    [?_assertEqual({error, {beamdiag_experiment, {bad_workload, S}}},
                   beamdiag_experiment:workload(S))
     || S <- ["lists", ":f", "m:", "", "a:b:c", "my mod:f", "m:f()", "m-x:f", "m:f/0",
              "m:" ++ lists:duplicate(254, $f)]].

%% A module that is not on the code path, a function no module has: said
%% so, and neither name becomes an atom.
no_new_atoms_test() ->
    U = integer_to_list(erlang:unique_integer([positive])),
    Mod = "beamdiag_no_such_module_" ++ U,
    ?assertEqual({error, {beamdiag_experiment, {no_module, Mod}}},
                 beamdiag_experiment:workload(Mod ++ ":f")),
    ?assertError(badarg, list_to_existing_atom(Mod)),
    Fun = "beamdiag_no_such_function_" ++ U,
    ?assertEqual({error, {beamdiag_experiment, {no_function, "lists", Fun}}},
                 beamdiag_experiment:workload("lists:" ++ Fun)),
    ?assertError(badarg, list_to_existing_atom(Fun)).

%%%===================================================================
%%% Options and arms: refused before any node starts
%%%===================================================================

-define(W, [{lab, busy_wait}]).

bad_options_test_() ->
    Bad = [{workloads, []}, {workloads, busy_wait}, {variants, []}, {variants, "default"},
           {variants, [<<"default">>]}, {variants, [[0]]},
           {runs, 0}, {runs, 101}, {runs, 2.0}, {duration, 0.5}, {duration, 3601},
           {duration, "5"}, {warmup, -1}, {warmup, 601}, {concurrency, 0},
           {concurrency, 100001}, {concurrency, 2.5}, {reservoir, 99}, {reservoir, 1000001},
           {bootstrap, 99}, {bootstrap, 100001}],
    [?_assertError({badarg, {K, V}}, beamdiag_experiment:run((#{workloads => ?W})#{K => V}))
     || {K, V} <- Bad] ++
    [?_assertError({badarg, {workloads, []}}, beamdiag_experiment:run(#{})),
     ?_assertError({badarg, {unknown_options, [runz], allowed, _}},
                   beamdiag_experiment:run(#{workloads => ?W, runz => 3})),
     ?_assertError({badarg, [{workloads, ?W}]}, beamdiag_experiment:run([{workloads, ?W}]))].

%% Every arm is made before the first run: one bad arm, and nothing runs
%% (no progress event, no lab node).
bad_arms_test_() ->
    Bad = fun(Opts, Why) ->
              fun() ->
                  Self = self(),
                  R = beamdiag_experiment:run(Opts#{progress => fun(E) -> Self ! {event, E} end}),
                  ?assertEqual({error, {beamdiag_experiment, Why}}, R),
                  receive {event, E} -> error({ran, E}) after 0 -> ok end
              end
          end,
    Many = lists:flatten(lists:join(" ", lists:duplicate(41, "+sbt"))),
    Long = "+" ++ lists:duplicate(200, $a),
    [
        {"a variant not of flags",
         Bad(#{workloads => ?W, variants => ["default", "sbwt none"]}, {bad_variant, "sbwt none"})},
        {"an empty variant", Bad(#{workloads => ?W, variants => [" "]}, {bad_variant, " "})},
        {"41 flags", Bad(#{workloads => ?W, variants => [Many]}, {bad_variant, Many})},
        {"a flag of 201 characters", Bad(#{workloads => ?W, variants => [Long]}, {bad_variant, Long})},
        {"a module without object code",
         Bad(#{workloads => [{lab, busy_wait}, {mfa, beamdiag_no_such_module, f}]},
             {no_module, "beamdiag_no_such_module"})}
    ].

%%%===================================================================
%%% Sentences
%%%===================================================================

sentences_test_() ->
    Known = lists:sort([atom_to_list(N) || S = #{name := N} <- beamdiag_lab:scenarios(),
                                           maps:is_key(unit, S)]),
    [
        ?_assertEqual(iolist_to_binary(["no lab workload 'nope' with a unit of work; known: ",
                                        lists:join(", ", Known)]),
                      text({unknown_lab, "nope"})),
        ?_assertEqual(<<"'a b' is not a workload: give lab:NAME or Module:Function">>,
                      text({bad_workload, "a b"})),
        %% Hostile text reaches no terminal as it is.
        ?_assertEqual(<<"'a?[2Jb' is not a workload: give lab:NAME or Module:Function">>,
                      text({bad_workload, "a\e[2Jb"})),
        ?_assertEqual(<<"no module mymod on the code path (add its directory with --pa)">>,
                      text({no_module, "mymod"})),
        ?_assertEqual(<<"lists does not export nope/0">>, text({no_function, "lists", "nope"})),
        ?_assertEqual(<<"variant 'sbwt' is not a list of emulator flags">>,
                      text({bad_variant, "sbwt"})),
        ?_assertEqual(<<"run 2 of arm 3 failed: 'x' is not a node name: expected name@host">>,
                      text({run_failed, 2, 3, {beamdiag_node_name, {bad_node, "x"}}})),
        ?_assertEqual(<<"run 1 of arm 1 failed: boom">>, text({run_failed, 1, 1, boom})),
        ?_assertEqual(<<"the load driver failed: {driver,not_running}">>,
                      text({driver, {driver, not_running}}))
    ].

%%% Helpers

text(Reason) ->
    iolist_to_binary(beamdiag_experiment:format_error(Reason)).
