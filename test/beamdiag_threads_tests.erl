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

%% Every thread of a real OTP 27.3.4.1 node (Debian trixie, default flags),
%% as /proc/PID/task/*/comm gave them, and a NIF's threads added: one that
%% inherited a scheduler's name from the scheduler that started it, one
%% named past the node's schedulers, one with a name of its own.
otp27_node() ->
    [{29832, <<"beam.smp">>}, {29840, <<"erts_ssig_disp">>}, {29841, <<"erts_smsg_disp">>},
     {29842, <<"erts_async_1">>}, {29851, <<"erts_sched_1">>}, {29854, <<"erts_sched_2">>},
     {29855, <<"erts_dcpus_1">>}, {29856, <<"erts_dcpus_2">>}]
    ++ [{29856 + N, <<"erts_dios_", (integer_to_binary(N))/binary>>} || N <- lists:seq(1, 10)]
    ++ [{29867, <<"erts_aux_1">>}, {29868, <<"erts_poll_0">>}].

settings() ->
    #{schedulers => 2, dirty_cpu_schedulers => 2, dirty_io_schedulers => 10}.

real_otp27_node_test() ->
    K = beamdiag_threads:classify_all(otp27_node(), settings()),
    Types = lists:sort([T || {T, _} <- maps:values(K)]),
    ?assertEqual([async, aux, dirty_cpu, dirty_cpu] ++ lists:duplicate(10, dirty_io)
                 ++ [main, poll, scheduler, scheduler, sys, sys], Types),
    ?assertEqual({scheduler, 2}, maps:get(29854, K)),
    ?assertEqual({dirty_io, 10}, maps:get(29866, K)).

nif_threads_are_not_schedulers_test() ->
    Nif = [{31000, <<"erts_sched_2">>}, {31001, <<"erts_sched_9">>},
           {31002, <<"erts_dcpus_3">>}, {31003, <<"erts_sched_x">>}, {31004, <<"my_nif_pool">>}],
    K = beamdiag_threads:classify_all(Nif ++ otp27_node(), settings()),
    ?assertEqual({scheduler, 2}, maps:get(29854, K)),
    [?assertEqual({other, 0}, maps:get(T, K)) || {T, _} <- Nif],
    ?assertEqual(2, length([x || {scheduler, _} <- maps:values(K)])).

%% OTP 25 names: a thread started from 1_scheduler inherits its name.
otp25_inherited_name_test() ->
    Ts = [{100, <<"beam.smp">>}, {110, <<"1_scheduler">>}, {111, <<"2_scheduler">>},
          {112, <<"1_dirty_cpu_sch">>}, {113, <<"1_dirty_io_sche">>}, {200, <<"1_scheduler">>}],
    K = beamdiag_threads:classify_all(Ts, #{schedulers => 2, dirty_cpu_schedulers => 1,
                                            dirty_io_schedulers => 1}),
    ?assertEqual({scheduler, 1}, maps:get(110, K)),
    ?assertEqual({other, 0}, maps:get(200, K)).

%% Without counts (an old capture), only duplicates are caught.
no_counts_test() ->
    K = beamdiag_threads:classify_all([{1, <<"erts_sched_7">>}, {2, <<"erts_sched_7">>}], #{}),
    ?assertEqual(#{1 => {scheduler, 7}, 2 => {other, 0}}, K).
