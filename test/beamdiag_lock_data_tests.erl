%%% The lock data from raw lock-counter readings: grouping, ranking, the
%%% span between two readings, and the tables' entries.
-module(beamdiag_lock_data_tests).

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
    D = beamdiag_lock_data:summarise(raw(), none, #{}),
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
    D = beamdiag_lock_data:summarise(raw(), none, #{}),
    Classes = maps:get(classes, D),
    ?assertEqual([<<"db_hash_slot">>, <<"alcu_allocator">>, <<"proc_main">>, <<"port_lock">>],
                 [C || #{class := C} <- Classes]),
    [Db | _] = Classes,
    ?assertMatch(#{ids := 1, locks := 2, tries := 2500}, Db).

summarise_bounded_test() ->
    Locks = [{db_tab, list_to_atom("t" ++ integer_to_list(I)), rw_mutex,
              [stat(f, 1, 10, 1, I * 1000, hist([{5, 1}]))]} || I <- lists:seq(1, 80)],
    D = beamdiag_lock_data:summarise([{duration, {1, 0}}, {locks, Locks}], none, #{top => 50}),
    ?assertEqual(50, length(maps:get(locks, D))),
    ?assertMatch([#{id := <<"t80">>} | _], maps:get(locks, D)),
    ?assertEqual(80, maps:get(contended_count, D)).

summarise_plain_data_test() ->
    D = beamdiag_lock_data:summarise(raw(), none, #{}),
    ?assert(plain(D)).

summarise_empty_test() ->
    D = beamdiag_lock_data:summarise([{duration, {0, 0}}, {locks, []}], none, #{}),
    ?assertMatch(#{locks := [], classes := []}, D).

recorded_raw_test() ->
    {ok, Bin} = file:read_file(beamdiag_test_lib:fixture("lcnt_ets_hot.raw.bin")),
    D = beamdiag_lock_data:summarise(binary_to_term(Bin), none, #{}),
    ?assert(plain(D)),
    ?assert(length(maps:get(locks, D)) =< 50),
    ?assertMatch([#{class := <<"db_hash_slot">>, id := <<"beamdiag_hot_table">>} | _],
                 maps:get(locks, D)).

recorded_data_is_plain_test() ->
    [?assert(plain(D)) || D <- [fixture_term(F) || F <- fixtures()]].

%% A later reading less the baseline: the counts, waits and histogram of
%% the span only, and the span's own length.
span_between_readings_test() ->
    Start = [{duration, {1, 0}},
             {locks, [{db_hash_slot, hot_table, rw_mutex,
                       [stat('beam/erl_db_hash.c', 100, 400, 40, 100000000, hist([{10, 40}]))]},
                      {db_hash_slot, hot_table, rw_mutex,
                       [stat('beam/erl_db_hash.c', 100, 100, 10, 50000000, hist([{10, 10}]))]}]}],
    End = [{duration, {3, 0}},
           {locks, [{db_hash_slot, hot_table, rw_mutex,
                     [stat('beam/erl_db_hash.c', 100, 1400, 140, 700000000, hist([{10, 90}, {20, 50}]))]},
                    {db_hash_slot, hot_table, rw_mutex,
                     [stat('beam/erl_db_hash.c', 100, 600, 60, 450000000, hist([{10, 60}]))]}]}],
    D = beamdiag_lock_data:summarise(End, Start, #{}),
    ?assertEqual(2000000000, maps:get(window_ns, D)),
    ?assertEqual(<<"baseline">>, maps:get(since, D)),
    [L] = maps:get(locks, D),
    %% (1400 + 600) - (400 + 100) tries, (140 + 60) - (40 + 10) collisions,
    %% 1.15 s - 0.15 s of wait: half of the 2 s span.
    ?assertMatch(#{instances := 2, tries := 1500, collisions := 150, wait_ns := 1000000000,
                   wait_pct := 50.0}, L),
    %% 150 - 50 waits in bucket 10, 50 in 20: p50 in 10, p90 in 20.
    ?assertEqual(2048, maps:get(p50_wait_ns, L)),
    ?assertEqual(2097152, maps:get(p90_wait_ns, L)).

%% A lock created in the span counts whole; one gone by its end counts
%% nothing; a count that went down (an instance ended) never goes below 0.
span_new_and_gone_locks_test() ->
    Pid = list_to_pid("<0.1.0>"),
    Start = [{duration, {1, 0}},
             {locks, [{proc_main, Pid, proclock, [stat(f, 1, 500, 50, 5000000, hist([{9, 50}]))]},
                      {db_tab, gone_table, rw_mutex, [stat(f, 2, 10, 1, 1000, hist([{5, 1}]))]}]}],
    End = [{duration, {2, 0}},
           {locks, [{proc_main, Pid, proclock, [stat(f, 1, 100, 5, 1000000, hist([{9, 5}]))]},
                    {db_tab, new_table, rw_mutex, [stat(f, 2, 300, 30, 200000000, hist([{12, 30}]))]}]}],
    D = beamdiag_lock_data:summarise(End, Start, #{}),
    ?assertMatch([#{id := <<"new_table">>, tries := 300, collisions := 30, wait_pct := 20.0}],
                 maps:get(locks, D)),
    ?assertEqual([], [L || L = #{class := <<"proc_main">>} <- maps:get(locks, D)]),
    ?assertEqual([], [L || L = #{id := <<"gone_table">>} <- maps:get(locks, D)]).

%% Counters cleared after the baseline (a shorter duration): the later
%% reading is taken whole, since that clear, and says so.
cleared_since_baseline_test() ->
    Start = [{duration, {5, 0}},
             {locks, [{db_tab, t, rw_mutex, [stat(f, 1, 9000, 900, 4000000000, hist([{10, 900}]))]}]}],
    End = [{duration, {1, 0}},
           {locks, [{db_tab, t, rw_mutex, [stat(f, 1, 100, 10, 100000000, hist([{10, 10}]))]}]}],
    D = beamdiag_lock_data:summarise(End, Start, #{}),
    ?assertEqual(<<"clear">>, maps:get(since, D)),
    ?assertEqual(1000000000, maps:get(window_ns, D)),
    ?assertMatch([#{tries := 100, wait_pct := 10.0}], maps:get(locks, D)).

%% The tables to look up: ETS lock ids, most waited first, each once, at
%% most five.
table_names_test() ->
    Locks = [{db_hash_slot, list_to_atom("t" ++ integer_to_list(I)), rw_mutex,
              [stat(f, 1, 10, 1, I * 1000, hist([{5, 1}]))]} || I <- lists:seq(1, 8)] ++
            [{db_tab, t8, rw_mutex, [stat(f, 2, 10, 1, 1, hist([{5, 1}]))]},
             {alcu_allocator, eheap_alloc, mutex, [stat(f, 3, 10, 1, 99999, hist([{5, 1}]))]}],
    D = beamdiag_lock_data:summarise([{duration, {1, 0}}, {locks, Locks}], none, #{}),
    ?assertEqual([<<"t8">>, <<"t7">>, <<"t6">>, <<"t5">>, <<"t4">>],
                 beamdiag_lock_data:table_names(D)).

%% A table's entry from ets:info/1 and its owner's name; a table not found.
table_entry_test() ->
    Info = [{id, make_ref()}, {name, hot}, {type, set}, {protection, public},
            {write_concurrency, false}, {read_concurrency, false},
            {decentralized_counters, false}, {named_table, true}, {owner, self()}, {size, 1}],
    ?assertMatch(#{name := <<"hot">>, type := <<"set">>, write_concurrency := <<"false">>,
                   owner := <<"my_owner">>, tables_with_name := 1},
                 beamdiag_lock_data:table(<<"hot">>, {Info, {registered_name, my_owner}})),
    Pid = list_to_binary(pid_to_list(self())),
    ?assertMatch(#{owner := Pid}, beamdiag_lock_data:table(<<"hot">>, {Info, []})),
    ?assertMatch(#{owner := <<"gone">>, tables_with_name := 0},
                 beamdiag_lock_data:table(<<"hot">>, {undefined, undefined})).

%% What the node says of itself joins the data: +Mdai's instances counted
%% from eheap_alloc's (one global, one per scheduler, then the dirty ones).
with_node_test() ->
    D = beamdiag_lock_data:summarise(raw(), none, #{}),
    Alloc = [{instance, I, []} || I <- lists:seq(0, 2 + 4)],
    N = beamdiag_lock_data:with_node(D, #{facts => #{schedulers => 2, schedulers_online => 2,
                                                      dirty_cpu_schedulers_online => 4,
                                                      otp_release => "27", version => "15.2.7",
                                                      eheap_alloc => Alloc},
                                          tables => []}),
    ?assertMatch(#{dirty_alloc_instances := 4, otp_release := <<"27">>,
                   erts_version := <<"15.2.7">>, schedulers_online := 2, tables := []}, N),
    ?assert(plain(N)).

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
