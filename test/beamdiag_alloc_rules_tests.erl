%%% EUnit tests of the allocator rules on hand-made memory ledgers: a
%%% binary allocator left fragmented by a burst is named with its figures
%%% and the fix fitted to the node's release and flags; a full allocator, a
%%% small one, and a node without the allocators' account get nothing.
-module(beamdiag_alloc_rules_tests).
-include_lib("eunit/include/eunit.hrl").

-define(MIB, 1048576).

memory(Types) ->
    #{allocators => [#{type => T, carriers => C, blocks => B} || {T, C, B} <- Types],
      accounts => #{rss => #{last => 700 * ?MIB}, total => #{last => 160 * ?MIB}}}.

capture(Settings) -> #{settings => Settings}.

ids(M, S) -> [Id || #{id := Id} <- beamdiag_alloc_rules:findings(M, capture(S))].

fragmented_binary_test() ->
    M = memory([{binary_alloc, 600 * ?MIB, 60 * ?MIB}, {eheap_alloc, 40 * ?MIB, 30 * ?MIB}]),
    [F] = beamdiag_alloc_rules:findings(M, capture(#{otp_release => <<"27">>})),
    ?assertEqual(allocator_fragmentation, maps:get(id, F)),
    ?assertEqual(warning, maps:get(severity, F)),
    #{allocator := <<"binary_alloc">>, free_bytes := Free} = maps:get(metrics, F),
    ?assertEqual(540 * ?MIB, Free),
    Ev = iolist_to_binary(lists:join("\n", maps:get(evidence, F))),
    ?assertMatch({_, _}, binary:match(Ev, <<"binary_alloc's carriers hold 629.1 MB, its blocks in "
                                             "use 62.9 MB (10% of them): 566.2 MB mapped that no "
                                             "block uses">>)),
    ?assertMatch({_, _}, binary:match(Ev, <<"resident memory 734.0 MB">>)),
    ?assertEqual(nomatch, binary:match(Ev, <<"eheap_alloc">>)),
    Fix = maps:get(fix, F),
    ?assertMatch({_, _}, binary:match(Fix, <<"+MBacful de">>)),
    ?assertMatch({_, _}, binary:match(Fix, <<"+MBlmbcs">>)).

%% On OTP 25 the flag does not exist: named as later, never advised.
release_gates_acful_test() ->
    M = memory([{binary_alloc, 600 * ?MIB, 60 * ?MIB}]),
    [F] = beamdiag_alloc_rules:findings(M, capture(#{otp_release => <<"25">>})),
    Fix = maps:get(fix, F),
    ?assertEqual(nomatch, binary:match(Fix, <<"Start the node with +MBacful">>)),
    ?assertMatch({_, _}, binary:match(Fix, <<"it came in OTP 26">>)).

%% Flags the node has are named as set.
flags_already_set_test() ->
    M = memory([{ets_alloc, 300 * ?MIB, 20 * ?MIB}]),
    [F] = beamdiag_alloc_rules:findings(M, capture(#{otp_release => <<"27">>,
                                                     meacful => <<"de">>,
                                                     melmbcs => <<"1024">>})),
    Fix = maps:get(fix, F),
    ?assertMatch({_, _}, binary:match(Fix, <<"+MEacful de is already set">>)),
    ?assertMatch({_, _}, binary:match(Fix, <<"+MElmbcs 1024 is already set">>)),
    ?assertEqual(nomatch, binary:match(Fix, <<"Start the node">>)).

%% Both types fragmented: the most free first, the other beside it.
two_types_test() ->
    M = memory([{binary_alloc, 600 * ?MIB, 60 * ?MIB}, {eheap_alloc, 300 * ?MIB, 10 * ?MIB}]),
    [F] = beamdiag_alloc_rules:findings(M, capture(#{})),
    ?assertEqual(830 * ?MIB, maps:get(free_bytes, maps:get(metrics, F))),
    ?assertMatch({_, _}, binary:match(iolist_to_binary(maps:get(evidence, F)),
                                      <<"eheap_alloc's carriers too">>)).

healthy_test_() ->
    [?_assertEqual([], ids(memory([{binary_alloc, 600 * ?MIB, 400 * ?MIB}]), #{})),
     ?_assertEqual([], ids(memory([{binary_alloc, 100 * ?MIB, 5 * ?MIB}]), #{})),
     ?_assertEqual([], ids(#{accounts => #{}}, #{})),
     ?_assertEqual([], ids(memory([]), #{}))].

%% Every flag the fix advises is a row of the flag table.
advised_flags_in_the_table_test() ->
    Options = [O || #{option := O} <- beamdiag_flags:table()],
    [begin
         M = memory([{T, 600 * ?MIB, 60 * ?MIB}]),
         [F] = beamdiag_alloc_rules:findings(M, capture(#{otp_release => <<"27">>})),
         {match, Ms} = re:run(maps:get(fix, F), "\\+(M[A-Z][a-z]+)", [global, {capture, [1], binary}]),
         [?assert(lists:member(O, Options)) || [O] <- Ms]
     end || T <- [binary_alloc, ets_alloc, eheap_alloc, std_alloc, driver_alloc, fix_alloc,
                  sl_alloc]].
