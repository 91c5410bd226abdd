-module(beamdiag_lock_advice_tests).
-include_lib("eunit/include/eunit.hrl").

%% The ledger's note and `beamdiag emu-type' give the same words.
one_emulator_advice_test() ->
    S = #{otp_release => <<"27">>, otp_version => <<"27.3.4">>, erts_version => <<"15.2.7">>,
          lock_counting => false},
    A = beamdiag_lock_advice:emulator(S),
    ?assertEqual(A, beamdiag_emu_type:advice(S)),
    ?assertMatch({_, _}, binary:match(A, <<"--otp-src otp_src_27.3.4.tar.gz">>)).

%% An allocator the node already relieves is not advised again.
allocator_fitted_to_mdai_test() ->
    ?assertMatch({_, _}, binary:match(beamdiag_lock_advice:allocator(unknown, #{}),
                                      <<"+Mdai max">>)),
    Have = beamdiag_lock_advice:allocator(unknown, #{mdai => <<"max">>}),
    ?assertEqual(nomatch, binary:match(Have, <<"start the node with +Mdai max">>)),
    ?assertMatch({_, _}, binary:match(Have, <<"already have their own">>)),
    ?assertEqual(nomatch, binary:match(beamdiag_lock_advice:allocator(4, #{}), <<"+Mdai max">>)).

%% A super carrier in place is not advised again.
super_carrier_fitted_test() ->
    {_, Fix} = beamdiag_lock_advice:class(<<"erts_mmap">>),
    ?assertEqual(Fix, beamdiag_lock_advice:class(<<"erts_mmap">>, 27, #{}, Fix)),
    Have = beamdiag_lock_advice:class(<<"erts_mmap">>, 27, #{mmscs => <<"4096">>}, Fix),
    ?assertMatch({_, _}, binary:match(Have, <<"already reserved (+MMscs 4096 MB)">>)),
    ?assertEqual(nomatch, binary:match(Have, <<"preallocate">>)).

%% ETS advice follows the table's options.
ets_fitted_to_options_test() ->
    ?assertMatch({_, _}, binary:match(beamdiag_lock_advice:ets(#{write_concurrency => <<"false">>}),
                                      <<"{write_concurrency, true}">>)),
    ?assertEqual(nomatch, binary:match(beamdiag_lock_advice:ets(#{write_concurrency => <<"true">>}),
                                       <<"create the table with">>)).
