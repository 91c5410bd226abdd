-module(beamdiag_agent_vm_tests).
-include_lib("eunit/include/eunit.hrl").

defaults_test() ->
    F = beamdiag_agent_vm:parse_flags([]),
    ?assertEqual(<<"medium">>, maps:get(sbwt, F)),
    ?assertEqual(<<"short">>, maps:get(sbwtdcpu, F)),
    ?assertEqual(<<"short">>, maps:get(sbwtdio, F)),
    ?assertEqual(<<"0">>, maps:get(mdai, F)).

separate_and_joined_values_last_wins_test() ->
    F = beamdiag_agent_vm:parse_flags(["/usr/bin/beam.smp", "--", "-sbwt", "none", "-sbwtdcpunone",
                                 "-sbwtdio", "very_long", "-sbwt", "long", "-Mdai", "max",
                                 "-setcookie", "secret"]),
    ?assertEqual(<<"long">>, maps:get(sbwt, F)),
    ?assertEqual(<<"none">>, maps:get(sbwtdcpu, F)),
    ?assertEqual(<<"very_long">>, maps:get(sbwtdio, F)),
    ?assertEqual(<<"max">>, maps:get(mdai, F)),
    %% Only known flags come out: the cookie does not.
    ?assertNot(lists:member(<<"secret">>, maps:values(F))).

settings_are_live_test() ->
    S = beamdiag_agent_vm:settings(),
    ?assertEqual(erlang:system_info(schedulers), maps:get(schedulers, S)),
    ?assert(is_binary(maps:get(sbwt, S))).

counters_test() ->
    C = beamdiag_agent_vm:counters(#{msacc => false}),
    ?assertEqual(erlang:system_info(schedulers) + 2, length(maps:get(run_queues, C))),
    ?assertNot(maps:is_key(msacc, C)).
