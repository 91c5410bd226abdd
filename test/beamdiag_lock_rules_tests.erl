-module(beamdiag_lock_rules_tests).

-include_lib("eunit/include/eunit.hrl").

%%% On lock data recorded from lab nodes running the lock-counting emulator

ets_hot_names_the_table_test() ->
    D = fixture("lcnt_ets_hot.term"),
    Fs = findings(D),
    [F] = [F || F = #{id := ets_contention} <- Fs],
    ?assert(beamdiag_finding:at_least(F, warning)),
    #{metrics := M, evidence := Ev, fix := Fix} = F,
    ?assertEqual(<<"beamdiag_hot_table">>, maps:get(table, M)),
    ?assert(maps:get(wait_pct, M) >= 10),
    Text = iolist_to_binary(lists:join("\n", Ev)),
    [?assertNotEqual(nomatch, binary:match(Text, W))
     || W <- [<<"beamdiag_hot_table">>, <<"owner: ">>, <<"write_concurrency=true">>,
              <<"decentralized_counters=">>, <<"db_hash_slot">>]],
    %% The table has write_concurrency: the fix is fitted to that, and never
    %% advises it.
    ?assertNotEqual(nomatch, binary:match(Fix, <<"one table per scheduler">>)),
    ?assertEqual(nomatch, binary:match(Fix, <<"{write_concurrency, true}">>)).

ets_sharded_has_no_ets_finding_test() ->
    Fs = findings(fixture("lcnt_ets_sharded.term")),
    ?assertEqual([], [F || F = #{id := ets_contention} <- Fs,
                           beamdiag_finding:at_least(F, warning)]).

dirty_gc_allocator_test() ->
    Fs = findings(fixture("lcnt_dirty_gc.term")),
    [F] = [F || F = #{id := allocator_contention, metrics := #{allocator := <<"eheap_alloc">>}}
                    <- Fs],
    ?assert(beamdiag_finding:at_least(F, info)),
    ?assertNotEqual(nomatch, binary:match(iolist_to_binary(maps:get(evidence, F)), <<"+Mdai max">>)).

%% Spread process-lock wait (schedulers meeting processes in dirty GC) is
%% no more than info, and names no single process.
dirty_gc_process_locks_test() ->
    Fs = findings(fixture("lcnt_dirty_gc.term")),
    ?assertEqual([], [F || F = #{id := single_process_bottleneck} <- Fs]),
    ?assertEqual([], [F || F = #{id := lock_contention} <- Fs,
                           beamdiag_finding:at_least(F, warning)]).

%% With +Mdai max the dirty schedulers have their own instances; a finding
%% on eheap_alloc then must not advise +Mdai max again.
dirty_gc_mdai_max_test() ->
    D = fixture("lcnt_dirty_gc_mdai.term"),
    ?assertEqual(4, maps:get(dirty_alloc_instances, D)),
    Fs = findings(D),
    %% The recorded window has the allocator finding (the list checked is
    %% not empty), and it does not advise +Mdai max.
    Alloc = [F || F = #{id := allocator_contention} <- Fs],
    ?assertMatch([_ | _], Alloc),
    [?assertEqual(nomatch, binary:match(iolist_to_binary(maps:get(evidence, F)), <<"+Mdai max">>))
     || F <- Alloc].

idle_node_is_healthy_test() ->
    Fs = findings(fixture("lcnt_idle.term")),
    ?assertEqual([], [F || F <- Fs, beamdiag_finding:at_least(F, warning)]).

recorded_findings_are_well_formed_test() ->
    [well_formed(F) || Name <- fixtures(), F <- findings(fixture(Name))].

%%% On synthetic lock data

single_process_bottleneck_test() ->
    D = data([lock(<<"proc_msgq">>, <<"my_server">>, 2000, 800, 30),
              lock(<<"proc_main">>, <<"my_server">>, 1000, 200, 5),
              lock(<<"proc_main">>, <<"<0.99.0>">>, 1000, 10, 0.5)]),
    [F] = findings(D),
    ?assertMatch(#{id := single_process_bottleneck, severity := critical,
                   metrics := #{process := <<"my_server">>}}, F).

process_wait_spread_is_generic_test() ->
    Locks = [lock(<<"proc_main">>, iolist_to_binary(io_lib:format("<0.~b.0>", [I])), 1000, 100, 2)
             || I <- lists:seq(1, 10)],
    Fs = findings(data(Locks)),
    ?assertEqual([lock_contention], [I || #{id := I} <- Fs]),
    ?assertEqual([], [F || F = #{id := single_process_bottleneck} <- Fs]).

class_ids_test_() ->
    [
        ?_assertMatch([#{id := Id}], findings(data([lock(Class, <<"1">>, 10000, 1000, 8)])))
     || {Class, Id} <- [{<<"run_queue">>, run_queue_contention},
                        {<<"process_table">>, process_table_contention},
                        {<<"erts_mmap">>, lock_contention},
                        {<<"port_lock">>, lock_contention},
                        {<<"drv_ev_state">>, lock_contention},
                        {<<"pix_lock">>, lock_contention},
                        {<<"atom_tab">>, lock_contention},
                        {<<"some_new_lock">>, lock_contention}]
    ].

class_specific_text_test() ->
    [F] = findings(data([lock(<<"erts_mmap">>, <<"1">>, 10000, 1000, 8)])),
    ?assertNotEqual(nomatch, binary:match(iolist_to_binary(maps:get(evidence, F)), <<"+MMscs">>)).

%% A fix never advises an allocator flag the node already has.
fitted_to_settings_test() ->
    Text = fun(Class, Settings) ->
        %% Lock data that does not say how many instances the dirty
        %% schedulers have: the settings decide.
        D = maps:remove(dirty_alloc_instances, data([lock(Class, <<"1">>, 10000, 1000, 8)])),
        [F] = beamdiag_lock_rules:findings(D, Settings),
        iolist_to_binary([maps:get(evidence, F), maps:get(fix, F)])
    end,
    Has = fun(T, W) -> binary:match(T, W) =/= nomatch end,
    ?assert(Has(Text(<<"erts_mmap">>, #{mmscs => <<"0">>}), <<"preallocate a super carrier">>)),
    Set = Text(<<"erts_mmap">>, #{mmscs => <<"2048">>}),
    ?assert(Has(Set, <<"already reserved (+MMscs 2048 MB)">>)),
    ?assertNot(Has(Set, <<"preallocate">>)),
    ?assert(Has(Text(<<"mseg">>, #{mmscs => <<"512">>}), <<"already reserved (+MMscs 512 MB)">>)),
    ?assert(Has(Text(<<"alcu_allocator">>, #{mdai => <<"0">>}), <<"with +Mdai max">>)),
    %% The allocator finding's fix is the fitted advice, not the catalogue's.
    ?assertNot(Has(Text(<<"alcu_allocator">>, #{mdai => <<"max">>}),
                   <<"gives each dirty scheduler its own">>)),
    Dai = Text(<<"alcu_allocator">>, #{mdai => <<"max">>}),
    ?assert(Has(Dai, <<"already have their own allocator instances (+Mdai max)">>)),
    ?assertNot(Has(Dai, <<"with +Mdai max">>)),
    %% Settings come from the target: junk is not printed.
    ?assertNot(Has(Text(<<"erts_mmap">>, #{mmscs => <<"1; rm">>}), <<"rm">>)).

%% Before OTP 28 the fix is the upgrade; on 28 and later (work stealing
%% reworked) it must not advise upgrading to what the node runs.
run_queue_advice_by_release_test_() ->
    Fix = fun(Rel) ->
        D = (data([lock(<<"run_queue">>, <<"1">>, 100000, 5000, 30)]))#{otp_release => Rel},
        [#{id := run_queue_contention, evidence := Ev}] = findings(D),
        iolist_to_binary(Ev)
    end,
    Has = fun(Text, Word) -> binary:match(Text, Word) =/= nomatch end,
    [
        ?_assert(Has(Fix(<<"25">>), <<"upgrade to OTP 28">>)),
        ?_assert(Has(Fix(<<"27">>), <<"upgrade to OTP 28">>)),
        ?_assertNot(Has(Fix(<<"28">>), <<"upgrade">>)),
        ?_assert(Has(Fix(<<"29">>), <<"without waiting on busy run queues">>)),
        ?_assertNot(Has(Fix(<<"29">>), <<"upgrade">>)),
        ?_assert(Has(Fix(<<"x">>), <<"OTP 28 or later">>))
    ].

%% Tree nodes of an ordered_set made while counting carry no table name
%% (OTP 25 and 27): still an ETS finding, saying why it has no name.
catree_unnamed_test() ->
    D = data([lock(<<"erl_db_catree_base_node">>, <<"[]">>, 50000, 1300, 7)]),
    [F] = findings(D),
    ?assertMatch(#{id := ets_contention, severity := warning}, F),
    ?assertNotEqual(nomatch, binary:match(iolist_to_binary(maps:get(evidence, F)),
                                          <<"ordered_set with write_concurrency">>)).

thresholds_test_() ->
    One = fun(Wait, Colls) -> findings(data([lock(<<"run_queue">>, <<"1">>, 100000, Colls, Wait)])) end,
    [
        ?_assertEqual([], One(0.5, 500)),
        ?_assertMatch([#{severity := info}], One(1.5, 1000)),
        ?_assertMatch([#{severity := warning}], One(6, 1000)),
        ?_assertMatch([#{severity := critical}], One(30, 1000)),
        %% One long wait is not contention.
        ?_assertEqual([], One(30, 5))
    ].

ets_without_write_concurrency_advice_test() ->
    D0 = data([lock(<<"db_tab">>, <<"t">>, 10000, 1000, 40)]),
    D = D0#{tables => [#{name => <<"t">>, owner => <<"me">>, type => <<"set">>,
                        protection => <<"public">>, write_concurrency => <<"false">>,
                        read_concurrency => <<"false">>, decentralized_counters => <<"false">>}]},
    [F] = findings(D),
    ?assertMatch(#{id := ets_contention, severity := critical}, F),
    ?assertNotEqual(nomatch, binary:match(maps:get(fix, F), <<"{write_concurrency, true}">>)).

allocator_with_mdai_test() ->
    D = (data([lock(<<"alcu_allocator">>, <<"eheap_alloc">>, 10000, 1000, 10)]))#{
        dirty_alloc_instances => 2},
    [F] = findings(D),
    ?assertEqual(nomatch, binary:match(iolist_to_binary(maps:get(evidence, F)), <<"+Mdai max">>)).

own_span_test() ->
    D = data([lock(<<"run_queue">>, <<"1">>, 10000, 1000, 10)]),
    %% The same wait over a reading ten times longer is a tenth of the share.
    ?assertMatch([#{severity := info}],
                 beamdiag_lock_rules:findings(D#{window_ns := 10000000000, window_s := 10.0}, #{})),
    %% A reading over half the report's window (an earlier reading standing
    %% in for a late last one) keeps its share of what it covers: the
    %% report's window plays no part.
    ?assertMatch([#{severity := warning}], beamdiag_lock_rules:findings(D, #{})).

empty_test() ->
    ?assertEqual([], beamdiag_lock_rules:findings(#{}, #{})).

%%% Helpers

findings(D) ->
    beamdiag_lock_rules:findings(D, #{}).

%% A one-second window.
data(Locks) ->
    Classes = maps:values(lists:foldl(
        fun(L = #{class := C}, Acc) ->
            Prev = maps:get(C, Acc, #{class => C, ids => 0, locks => 0, tries => 0,
                                      collisions => 0, wait_ns => 0}),
            Acc#{C => Prev#{ids := maps:get(ids, Prev) + 1,
                            locks := maps:get(locks, Prev) + 1,
                            tries := maps:get(tries, Prev) + maps:get(tries, L),
                            collisions := maps:get(collisions, Prev) + maps:get(collisions, L),
                            wait_ns := maps:get(wait_ns, Prev) + maps:get(wait_ns, L)}}
        end, #{}, Locks)),
    #{window_ns => 1000000000, window_s => 1.0, locks => Locks,
      classes => [C#{wait_pct => W / 1.0e7, collision_pct => 100 * Co / T}
                  || C = #{wait_ns := W, collisions := Co, tries := T} <- Classes],
      tables => [], dirty_alloc_instances => 0}.

lock(Class, Id, Tries, Colls, WaitPct) ->
    #{class => Class, id => Id, type => <<"mutex">>, instances => 1, tries => Tries,
      collisions => Colls, collision_pct => 100 * Colls / Tries,
      wait_ns => round(WaitPct * 1.0e7), wait_pct => WaitPct, waits => Colls,
      p50_wait_ns => 2048, p90_wait_ns => 8192,
      locations => [#{location => <<"beam/x.c:1">>, tries => Tries, collisions => Colls,
                      wait_ns => round(WaitPct * 1.0e7)}]}.

well_formed(#{id := Id, severity := S, evidence := Ev, metrics := M, title := T}) ->
    ?assert(lists:member(Id, beamdiag_catalogue:ids())),
    ?assert(lists:member(S, [info, warning, critical])),
    ?assert(is_binary(T)),
    ?assert(lists:all(fun is_binary/1, Ev)),
    ?assert(lists:all(fun(V) -> is_number(V) orelse is_binary(V) end, maps:values(M))).

fixtures() ->
    ["lcnt_ets_hot.term", "lcnt_ets_sharded.term", "lcnt_dirty_gc.term",
     "lcnt_dirty_gc_mdai.term", "lcnt_idle.term"].

fixture(Name) ->
    beamdiag_test_lib:fixture_term(Name).
