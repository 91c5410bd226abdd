-module(beamdiag_cluster_pool_tests).
-include_lib("eunit/include/eunit.hrl").

-define(P, beamdiag_cluster_pool).

arm() -> fun(M, Node, Loaded) -> {M, Node, Loaded} end.

%% A member's work that takes Ms and then gives Result.
after_ms(Ms, Result) ->
    fun(M) ->
            timer:sleep(Ms),
            case Result of
                ok -> {{ok, {loaded, M}}, #{connect_ms => 1, load_ms => 2}, M};
                _ -> {Result, #{}, M}
            end
    end.

%% Results come in member order, what was armed in the order the members
%% were prepared; only the prepared have times.
order_test() ->
    Sleep = #{'a@h' => 300, 'b@h' => 150, 'c@h' => 0},
    Work = fun(M) -> (after_ms(maps:get(M, Sleep), ok))(M) end,
    {Result, Late, Times, Armed} = ?P:run(['a@h', 'b@h', 'c@h'], 3, Work, arm(), 5000),
    ?assertEqual([{'a@h', {ok, {loaded, 'a@h'}}}, {'b@h', {ok, {loaded, 'b@h'}}},
                  {'c@h', {ok, {loaded, 'c@h'}}}], Result),
    ?assertEqual([{'c@h', 'c@h', {loaded, 'c@h'}}, {'b@h', 'b@h', {loaded, 'b@h'}},
                  {'a@h', 'a@h', {loaded, 'a@h'}}], Armed),
    ?assertEqual([], Late),
    ?assertEqual(#{connect_ms => 1, load_ms => 2}, maps:get('b@h', Times)),
    ?assertEqual(3, map_size(Times)).

%% An error is the member's result, not armed, without times.
error_test() ->
    Work = fun('bad@h') -> {{error, {beamdiag_remote, nope}}, #{}, 'bad@h'};
              (M) -> (after_ms(0, ok))(M)
           end,
    {Result, [], Times, Armed} = ?P:run(['ok@h', 'bad@h'], 2, Work, arm(), 5000),
    ?assertEqual({error, {beamdiag_remote, nope}}, proplists:get_value('bad@h', Result)),
    ?assertEqual(['ok@h'], maps:keys(Times)),
    ?assertEqual(['ok@h'], [M || {M, _, _} <- Armed]).

%% No more than K workers at a time.
bound_test() ->
    C = counters:new(1, []),
    Work = fun(M) ->
                   counters:add(C, 1, 1),
                   Seen = counters:get(C, 1),
                   timer:sleep(200),
                   counters:sub(C, 1, 1),
                   {{ok, Seen}, #{connect_ms => 0, load_ms => 0}, M}
           end,
    Members = [list_to_atom("m" ++ integer_to_list(I) ++ "@h") || I <- lists:seq(1, 6)],
    {Result, [], _, _} = ?P:run(Members, 2, Work, arm(), 5000),
    Seen = [S || {_, {ok, S}} <- Result],
    ?assertEqual(6, length(Seen)),
    ?assert(lists:all(fun(S) -> S =< 2 end, Seen)),
    ?assertEqual(2, lists:max(Seen)).

%% A member past its bound is given up and kept for settle/1; the others
%% do not wait for it. Told `late', its worker sends nothing and ends.
late_test() ->
    Work = fun('slow@h') -> (after_ms(400, {error, slow}))('slow@h');
              (M) -> (after_ms(0, ok))(M)
           end,
    T0 = erlang:monotonic_time(millisecond),
    {Result, Late, Times, _} = ?P:run(['slow@h', 'fast@h'], 2, Work, arm(), 100),
    ?assert(erlang:monotonic_time(millisecond) - T0 < 400),
    ?assertEqual({error, {beamdiag_cluster, {prepare_timeout, 100}}},
                 proplists:get_value('slow@h', Result)),
    ?assertEqual({ok, {loaded, 'fast@h'}}, proplists:get_value('fast@h', Result)),
    ?assertEqual(['fast@h'], maps:keys(Times)),
    [{Pid, MRef, 'slow@h'}] = Late,
    receive {'DOWN', MRef, process, Pid, Why} -> ?assertEqual(normal, Why)
    after 5000 -> ?assert(false)
    end,
    ?assertEqual(nothing, receive {_, Pid, _} -> sent after 0 -> nothing end).

%% A worker whose member is not connected is ended at once, not waited for.
settle_test() ->
    Work = fun(M) -> (after_ms(60000, {error, slow}))(M) end,
    {_, Late, _, _} = ?P:run(['gone@nowhere'], 1, Work, arm(), 50),
    [{Pid, _, 'gone@nowhere'}] = Late,
    ?assert(is_process_alive(Pid)),
    T0 = erlang:monotonic_time(millisecond),
    ?assertEqual(ok, ?P:settle(Late)),
    ?assert(erlang:monotonic_time(millisecond) - T0 < 1000),
    ?assertNot(is_process_alive(Pid)).

crash_test() ->
    Work = fun('boom@h') -> exit({boom, here});
              (M) -> (after_ms(0, ok))(M)
           end,
    {Result, [], _, Armed} = ?P:run(['boom@h', 'ok@h'], 1, Work, arm(), 5000),
    ?assertMatch({error, {beamdiag_cluster, {crashed, {boom, _}}}},
                 proplists:get_value('boom@h', Result)),
    ?assertEqual(['ok@h'], [M || {M, _, _} <- Armed]).
