-module(beamdiag_agent_lcnt_tests).

-include_lib("eunit/include/eunit.hrl").

%% A histogram with N waits in bucket I (2^I..2^(I+1) ns).
hist(Buckets) ->
    list_to_tuple([proplists:get_value(I, Buckets, 0) || I <- lists:seq(0, 29)]).

stat(File, Line, Tries, Colls, WaitNs, Hist) ->
    {{File, Line}, {Tries, Colls, {WaitNs div 1000000000, WaitNs rem 1000000000, Colls}}, Hist}.

raw() ->
    [
        {duration, {2, 0}},
        {locks, [
            {db_hash_slot, hot_table, rw_mutex,
             [stat('beam/erl_db_hash.c', 100, 1000, 100, 500000000, hist([{10, 90}, {20, 10}])),
              stat('beam/erl_db_hash.c', 200, 500, 10, 100000000, hist([{12, 10}]))]},
            {db_hash_slot, hot_table, rw_mutex,
             [stat('beam/erl_db_hash.c', 100, 1000, 50, 400000000, hist([{10, 50}]))]},
            {proc_main, self(), proclock,
             [stat('beam/erl_process.c', 7, 300, 3, 3000, hist([{9, 3}]))]},
            {port_lock, hd(erlang:ports()), mutex,
             [stat('beam/io.c', 1, 10, 0, 0, hist([]))]},
            {alcu_allocator, eheap_alloc, mutex,
             [stat(undefined, 0, 50, 5, 2000000, hist([{18, 5}]))]},
            {run_queue, 1, mutex, []}
        ]}
    ].

summarise_groups_and_ranks_test() ->
    D = beamdiag_agent_lcnt:summarise(raw(), #{}),
    ?assertEqual(2000000000, maps:get(window_ns, D)),
    ?assertEqual(6, maps:get(lock_count, D)),
    [Top | Rest] = maps:get(locks, D),
    ?assertMatch(#{class := <<"db_hash_slot">>, id := <<"hot_table">>, instances := 2,
                   tries := 2500, collisions := 160, wait_ns := 1000000000}, Top),
    ?assertEqual(50.0, maps:get(wait_pct, Top)),
    ?assertEqual(6.4, maps:get(collision_pct, Top)),
    %% 140 waits in bucket 10, 10 in 12, 10 in 20: p50 in 10, p90 in 12.
    ?assertEqual(2048, maps:get(p50_wait_ns, Top)),
    ?assertEqual(8192, maps:get(p90_wait_ns, Top)),
    [L1, L2] = maps:get(locations, Top),
    ?assertMatch(#{location := <<"beam/erl_db_hash.c:100">>, tries := 2000,
                   wait_ns := 900000000}, L1),
    ?assertMatch(#{location := <<"beam/erl_db_hash.c:200">>}, L2),
    %% Uncontended locks are left out; ranked by wait.
    ?assertEqual([<<"alcu_allocator">>, <<"proc_main">>], [C || #{class := C} <- Rest]),
    [#{id := Alloc, locations := [#{location := Unknown}]}, #{id := Pid}] = Rest,
    ?assertEqual(<<"eheap_alloc">>, Alloc),
    ?assertEqual(<<"unknown">>, Unknown),
    ?assertEqual(list_to_binary(pid_to_list(self())), Pid).

summarise_class_totals_test() ->
    D = beamdiag_agent_lcnt:summarise(raw(), #{}),
    Classes = maps:get(classes, D),
    ?assertEqual([<<"db_hash_slot">>, <<"alcu_allocator">>, <<"proc_main">>, <<"port_lock">>],
                 [C || #{class := C} <- Classes]),
    [Db | _] = Classes,
    ?assertMatch(#{ids := 1, locks := 2, tries := 2500}, Db).

summarise_bounded_test() ->
    Locks = [{db_tab, list_to_atom("t" ++ integer_to_list(I)), rw_mutex,
              [stat(f, 1, 10, 1, I * 1000, hist([{5, 1}]))]} || I <- lists:seq(1, 80)],
    D = beamdiag_agent_lcnt:summarise([{duration, {1, 0}}, {locks, Locks}], #{top => 50}),
    ?assertEqual(50, length(maps:get(locks, D))),
    ?assertMatch([#{id := <<"t80">>} | _], maps:get(locks, D)),
    ?assertEqual(80, maps:get(contended_count, D)).

summarise_plain_data_test() ->
    D = beamdiag_agent_lcnt:summarise(raw(), #{}),
    ?assert(plain(D)).

summarise_empty_test() ->
    D = beamdiag_agent_lcnt:summarise([{duration, {0, 0}}, {locks, []}], #{}),
    ?assertMatch(#{locks := [], classes := []}, D).

recorded_raw_test() ->
    {ok, Bin} = file:read_file(beamdiag_test_lib:fixture("lcnt_ets_hot.raw.bin")),
    D = beamdiag_agent_lcnt:summarise(binary_to_term(Bin), #{}),
    ?assert(plain(D)),
    ?assert(length(maps:get(locks, D)) =< 50),
    ?assertMatch([#{class := <<"db_hash_slot">>, id := <<"beamdiag_hot_table">>} | _],
                 maps:get(locks, D)).

recorded_data_is_plain_test() ->
    [?assert(plain(D)) || D <- [fixture_term(F) || F <- fixtures()]].

available_test() ->
    ?assertEqual(erlang:system_info(build_type) =:= lcnt, beamdiag_agent_lcnt:available()).

start_on_plain_emulator_test() ->
    case beamdiag_agent_lcnt:available() of
        true ->
            ok;
        false ->
            {error, {M, R}} = beamdiag_agent_lcnt:start(#{}),
            ?assertMatch([_ | _], lists:flatten(io_lib:format("~ts", [M:format_error(R)])))
    end.

unknown_option_test() ->
    ?assertEqual({error, {beamdiag_agent_lcnt, {unknown_options, [bogus]}}},
                 beamdiag_agent_lcnt:start(#{bogus => 1})).

%% Only maps with atom or binary keys, lists, binaries and numbers.
plain(M) when is_map(M) ->
    lists:all(fun({K, V}) -> (is_atom(K) orelse is_binary(K)) andalso plain(V) end,
              maps:to_list(M));
plain(L) when is_list(L) -> lists:all(fun plain/1, L);
plain(B) when is_binary(B) -> true;
plain(N) when is_number(N) -> true;
plain(_) -> false.

fixtures() ->
    ["lcnt_ets_hot.term", "lcnt_ets_sharded.term", "lcnt_dirty_gc.term",
     "lcnt_dirty_gc_mdai.term", "lcnt_idle.term"].

fixture_term(Name) ->
    beamdiag_test_lib:fixture_term(Name).
