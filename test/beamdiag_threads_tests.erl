-module(beamdiag_threads_tests).
-include_lib("eunit/include/eunit.hrl").

otp25_names_test_() ->
    [?_assertEqual(E, beamdiag_threads:classify(N)) || {N, E} <- [
        {<<"1_scheduler">>, {scheduler, 1}},
        {<<"12_scheduler">>, {scheduler, 12}},
        {<<"2_dirty_cpu_sch">>, {dirty_cpu, 2}},
        {<<"10_dirty_cpu_sc">>, {dirty_cpu, 10}},
        {<<"100_dirty_cpu_s">>, {dirty_cpu, 100}},
        {<<"1_dirty_io_sche">>, {dirty_io, 1}},
        {<<"10_dirty_io_sch">>, {dirty_io, 10}},
        {<<"1_aux">>, {aux, 1}},
        {<<"0_poller">>, {poll, 0}},
        {<<"async_1">>, {async, 1}},
        {<<"sys_sig_dispatc">>, {sys, 0}},
        {<<"beam.smp">>, {main, 0}}]].

otp26_names_test_() ->
    [?_assertEqual(E, beamdiag_threads:classify(N)) || {N, E} <- [
        {<<"erts_sched_1">>, {scheduler, 1}},
        {<<"erts_sched_128">>, {scheduler, 128}},
        {<<"erts_dcpus_3">>, {dirty_cpu, 3}},
        {<<"erts_dios_10">>, {dirty_io, 10}},
        {<<"erts_aux_1">>, {aux, 1}},
        {<<"erts_poll_0">>, {poll, 0}},
        {<<"erts_runq_sup">>, {sys, 0}},
        {<<"erts_ssig_disp">>, {sys, 0}},
        {<<"whatever">>, {other, 0}}]].

scheduler_ids_test() ->
    S = #{schedulers => 8, dirty_cpu_schedulers => 4},
    ?assertEqual(3, beamdiag_threads:scheduler_id({scheduler, 3}, S)),
    ?assertEqual(10, beamdiag_threads:scheduler_id({dirty_cpu, 2}, S)),
    ?assertEqual(13, beamdiag_threads:scheduler_id({dirty_io, 1}, S)),
    ?assertEqual(undefined, beamdiag_threads:scheduler_id({aux, 1}, S)).
