%%% EUnit tests of the ETS table watch on this node: a table filled after
%%% the first reading is named with its type, protection, objects, bytes
%%% at both ends and owner; a table that did not grow is not; tables born
%%% in number are grouped by name and owner. The owners sleep in
%%% timer:sleep/1: a process running this module's code would be taken for
%%% one of beamdiag's own helpers and left out.
-module(beamdiag_agent_tables_tests).
-include_lib("eunit/include/eunit.hrl").

grew_test() ->
    Self = self(),
    Owner = spawn(fun() ->
                          T = ets:new(beamdiag_test_cache, [set, public]),
                          Self ! {table, T},
                          timer:sleep(infinity)
                  end),
    T = receive {table, T0} -> T0 end,
    Quiet = ets:new(beamdiag_test_quiet, [bag]),
    ets:insert(Quiet, {a, 1}),
    try
        S0 = beamdiag_agent_tables:sizes(),
        ?assert(maps:is_key(T, S0)),
        [ets:insert(T, {K, binary:copy(<<"x">>, 40)}) || K <- lists:seq(1, 30000)],
        Words = ets:info(T, memory) * erlang:system_info(wordsize),
        ?assert(Words > 1048576),
        #{grew := [E], born := [], count := [N0, N1]} = beamdiag_agent_tables:grew(S0, #{}),
        ?assertEqual(N0, N1),
        ?assertMatch(#{name := <<"beamdiag_test_cache">>, type := <<"set">>,
                       protection := <<"public">>, objects := 30000}, E),
        [M0, M1] = maps:get(memory, E),
        ?assert(M0 < 10000),
        ?assert(abs(M1 - Words) < 65536),
        ?assertEqual(list_to_binary(pid_to_list(Owner)), maps:get(pid, maps:get(owner, E)))
    after
        exit(Owner, kill),
        ets:delete(Quiet)
    end.

born_test() ->
    S0 = beamdiag_agent_tables:sizes(),
    Self = self(),
    Maker = spawn(fun() ->
                          [ets:new(beamdiag_test_session, []) || _ <- lists:seq(1, 60)],
                          Self ! made,
                          timer:sleep(infinity)
                  end),
    receive made -> ok end,
    try
        #{born := [G | _], count := [N0, N1]} = beamdiag_agent_tables:grew(S0, #{}),
        ?assert(N1 - N0 >= 60),
        ?assertMatch(#{count := 60, name := <<"beamdiag_test_session">>}, G),
        ?assertEqual(list_to_binary(pid_to_list(Maker)), maps:get(pid, maps:get(owner, G)))
    after
        exit(Maker, kill)
    end.

%% A start that could not be read gives nothing to compare.
none_test() ->
    ?assertEqual(none, beamdiag_agent_tables:grew(none, #{})).
