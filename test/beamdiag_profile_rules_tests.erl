%%% Tests of the profile knowledge base on real perf captures and on
%%% synthetic folded stacks, one per family.
-module(beamdiag_profile_rules_tests).

-include_lib("eunit/include/eunit.hrl").

fold(Name) ->
    {ok, P} = beamdiag_fold:fold_file(beamdiag_test_lib:fixture(filename:join("perf", Name)), #{}),
    P.

family(#{metrics := #{family := F}}) -> F;
family(_) -> undefined.

atom_decode_capture_test() ->
    Findings = beamdiag_profile_rules:findings(fold("dwarf_atom_decode.txt"), #{}),
    [F | _] = [X || X <- Findings, family(X) =:= <<"atom_decode">>],
    ?assertMatch(#{id := hot_function, severity := critical}, F),
    #{evidence := [E | _], metrics := #{share := Share}} = F,
    ?assert(Share > 0.5),
    ?assertMatch({_, _}, binary:match(E, <<"erts_atom_put">>)),
    %% hash_get sits under erts_atom_put: no separate finding for it.
    ?assertEqual([], [X || X = #{metrics := #{function := <<"hash_get">>}} <- Findings,
                           family(X) =:= undefined]).

redis_cache_capture_test() ->
    Findings = beamdiag_profile_rules:findings(fold("dwarf_redis_cache.txt"), #{}),
    Fams = [family(F) || F <- Findings],
    ?assert(lists:member(<<"atom_decode">>, Fams)).

thin_profile_test() ->
    P = beamdiag_fold:from_counts(#{[<<"scheduler">>, <<"erts_atom_put">>] => 10}),
    ?assertEqual([], beamdiag_profile_rules:findings(P, #{})),
    ?assertMatch([_ | _], beamdiag_profile_rules:findings(P, #{min_samples => 1})).

families_test_() ->
    Cases = [
        {<<"zlib_deflate">>, [<<"$erlang:term_to_binary/2">>, <<"term_to_binary_2">>,
                              <<"erl_zlib_deflate_chunk">>, <<"deflate">>, <<"longest_match">>]},
        {<<"ets_copy">>, [<<"$ets:lookup/2">>, <<"ets_lookup_2">>, <<"db_get_hash">>,
                          <<"copy_struct_x">>]},
        {<<"gc">>, [<<"erts_garbage_collect_nobump">>, <<"[beam.smp]">>]},
        {<<"regex_compile">>, [<<"$re:run/3">>, <<"re_run_3">>, <<"erts_pcre_compile2">>]},
        {<<"memcpy">>, [<<"binary_to_list_1">>, <<"__memcpy_avx_unaligned_erms">>]},
        {<<"native_locks">>, [<<"erts_db_lookup">>, <<"ethr_mutex_lock_wait__">>]},
        {<<"busy_wait">>, [<<"$global::process_main">>, <<"erts_schedule">>, <<"scheduler_wait">>,
                           <<"sched_spin_wait">>]},
        {<<"atom_decode">>, [<<"$global::call_light_bif_shared">>, <<"binary_to_term_1">>,
                             <<"erts_atom_put">>]}
    ],
    [{Fam, fun() ->
          P = beamdiag_fold:from_counts(#{[<<"scheduler">> | Stack] => 40,
                                          [<<"scheduler">>, <<"$app:work/1">>, <<"$lists:map/2">>] => 60}),
          Findings = beamdiag_profile_rules:findings(P, #{}),
          [F] = [X || X <- Findings, family(X) =:= Fam],
          #{severity := Sev, evidence := [E | _], metrics := #{share := S}, title := Title,
            fix := Fix} = F,
          ?assertEqual(0.4, S),
          ?assertMatch({_, _}, binary:match(E, <<"40.0%">>)),
          %% 40% is critical only for costs that are no node's job.
          Want = case lists:member(Fam, [<<"gc">>, <<"memcpy">>, <<"native_locks">>,
                                         <<"busy_wait">>, <<"ets_copy">>]) of
              true -> warning;
              false -> critical
          end,
          ?assertEqual(Want, Sev),
          %% A family's title and fix are its own: Redis and binary_to_term
          %% are named only for the atom decoding family.
          ?assertEqual(nomatch, binary:match(Title, <<"single function">>)),
          case Fam of
              <<"atom_decode">> -> ?assertMatch({_, _}, binary:match(Fix, <<"Redis">>));
              _ -> ?assertEqual(nomatch, binary:match(Fix, [<<"Redis">>, <<"binary_to_term">>]))
          end
      end} || {Fam, Stack} <- Cases].

%% GC on a node whose job makes garbage (a broker) is a warning with its
%% own title and fix, however large its share.
gc_is_not_critical_test() ->
    P = beamdiag_fold:from_counts(#{[<<"scheduler">>, <<"erts_garbage_collect_nobump">>,
                                     <<"[beam.smp]">>] => 90,
                                    [<<"scheduler">>, <<"$rabbit_amqqueue_process:handle_cast/2">>] => 10}),
    [F] = beamdiag_profile_rules:findings(P, #{}),
    ?assertMatch(#{severity := warning, title := <<"Garbage collection takes", _/binary>>}, F),
    #{fix := Fix, evidence := Ev} = F,
    ?assertEqual(nomatch, binary:match(Fix, [<<"Redis">>, <<"binary_to_term">>])),
    ?assertMatch([_, _], Ev).

%% The Erlang sampler sees binary_to_term only by its Erlang names (the BIF,
%% or its trap continuation for large terms): the finding names it and its
%% caller, but claims nothing about atoms, which it did not see.
by_name_only_test() ->
    P = beamdiag_fold:from_counts(#{[<<"erlang">>, <<"app:loop/1">>,
                                     <<"erts_internal:binary_to_term_trap/1">>] => 50,
                                    [<<"erlang">>, <<"app:loop/1">>] => 10,
                                    [<<"erlang">>, <<"app:other/0">>] => 40}),
    [F] = [X || X <- beamdiag_profile_rules:findings(P, #{}), family(X) =:= <<"atom_decode">>],
    #{title := Title, fix := Fix, evidence := [E1, E2 | _], metrics := #{share := S}} = F,
    ?assertEqual(0.5, S),
    ?assertEqual(<<"Decoding terms with binary_to_term takes a large share of the CPU">>, Title),
    ?assertMatch({_, _}, binary:match(E1, <<"binary_to_term: 50.0% of samples">>)),
    ?assertEqual(<<"Called from app:loop/1 (50.0% of samples; on the stack in 60.0% in all)">>,
                 iolist_to_binary(E2)),
    ?assertEqual(nomatch, binary:match(Fix, <<"under its lock">>)),
    %% With the C frames that show the atoms, the atom title and its caller.
    P2 = beamdiag_fold:from_counts(#{[<<"scheduler">>, <<"$app:loop/1">>, <<"$erlang:binary_to_term/1">>,
                                      <<"binary_to_term_1">>, <<"erts_atom_put">>] => 50,
                                     [<<"scheduler">>, <<"$app:other/0">>] => 50}),
    [F2] = [X || X <- beamdiag_profile_rules:findings(P2, #{}), family(X) =:= <<"atom_decode">>],
    ?assertMatch(#{title := <<"Decoding atom-heavy terms", _/binary>>,
                   evidence := [_, <<"Called from app:loop/1 (50.0% of samples; on the stack in 50.0% in all)">>
                               | _]},
                 F2#{evidence := [iolist_to_binary(E) || E <- maps:get(evidence, F2)]}).

no_double_count_test() ->
    %% A stack with several frames of one family counts once.
    P = beamdiag_fold:from_counts(#{[<<"scheduler">>, <<"binary_to_term_1">>, <<"erts_atom_put">>,
                                     <<"erts_atom_put_index">>] => 100}),
    [#{metrics := #{share := S}}] = [F || F <- beamdiag_profile_rules:findings(P, #{}),
                                          family(F) =:= <<"atom_decode">>],
    ?assertEqual(1.0, S).

unknown_hot_function_test() ->
    P = beamdiag_fold:from_counts(#{[<<"scheduler">>, <<"$app:work/1">>, <<"$app:crunch/2">>] => 70,
                                    [<<"scheduler">>, <<"$app:idle/0">>] => 10,
                                    [<<"scheduler">>, <<"$app:other/0">>] => 10,
                                    [<<"scheduler">>, <<"$app:more/0">>] => 10}),
    [F] = beamdiag_profile_rules:findings(P, #{}),
    ?assertMatch(#{id := hot_function, metrics := #{function := <<"$app:crunch/2">>},
                   severity := warning, title := <<"One function takes a large share of the CPU">>},
                 F),
    #{evidence := [E | _]} = F,
    ?assertMatch({_, _}, binary:match(E, <<"70.0%">>)).

%% An unnamed frame ([beam.smp], an unnamed JIT frame) is no function to
%% name, however hot.
unnamed_leaf_is_no_hot_function_test() ->
    P = beamdiag_fold:from_counts(#{[<<"scheduler">>, <<"[beam.smp]">>] => 70,
                                    [<<"scheduler">>, <<"[unknown] (/memfd:vmem (deleted))">>] => 20,
                                    [<<"scheduler">>, <<"$app:other/0">>] => 10}),
    ?assertEqual([], beamdiag_profile_rules:findings(P, #{})).
