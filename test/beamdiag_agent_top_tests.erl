%%% EUnit tests of the top-N keeping: the largest positive keys only, in
%%% order, against a sort of everything, on random inputs.
-module(beamdiag_agent_top_tests).

-include_lib("eunit/include/eunit.hrl").

keeps_largest_test() ->
    T = lists:foldl(fun({P, K}, A) -> beamdiag_agent_top:consider(K, P, {item, P}, A) end,
                    beamdiag_agent_top:new(2), [{a, 3}, {b, 0}, {c, 7}, {d, 5}, {e, -1}]),
    ?assertEqual([{c, {item, c}}, {d, {item, d}}], beamdiag_agent_top:items(T)),
    ?assertEqual([c, d], beamdiag_agent_top:pids(T)).

%% Keys of zero or less never enter, even in a top with room.
positive_only_test() ->
    T = lists:foldl(fun({P, K}, A) -> beamdiag_agent_top:consider(K, P, K, A) end,
                    beamdiag_agent_top:new(10), [{a, 0}, {b, -4}, {c, 1}]),
    ?assertEqual([c], beamdiag_agent_top:pids(T)),
    ?assertEqual([], beamdiag_agent_top:items(beamdiag_agent_top:new(3))).

%% A key equal to the smallest of a full top does not displace it.
ties_test() ->
    T = lists:foldl(fun({P, K}, A) -> beamdiag_agent_top:consider(K, P, K, A) end,
                    beamdiag_agent_top:new(2), [{a, 5}, {b, 3}, {c, 3}]),
    ?assertEqual([a, b], beamdiag_agent_top:pids(T)).

largest_test() ->
    ?assertEqual([c, d], beamdiag_agent_top:largest_ids([{a, 3}, {c, 7}, {d, 5}], 2)),
    ?assertEqual([], beamdiag_agent_top:largest_ids([], 4)),
    ?assertEqual([x], beamdiag_agent_top:largest_ids([{x, 1}, {y, 0}], 4)).

%% On random keys (distinct, so the order is defined): the same as sorting
%% everything and taking the first N positive ones.
random_test() ->
    _ = rand:seed(exsss, {1, 2, 3}),
    [begin
         Keys = lists:usort([rand:uniform(2000) - 500 || _ <- lists:seq(1, rand:uniform(300))]),
         Pairs = [{K, K} || K <- shuffle(Keys)],
         N = rand:uniform(40),
         Want = lists:sublist(lists:reverse([K || K <- Keys, K > 0]), N),
         ?assertEqual(Want, beamdiag_agent_top:largest_ids(Pairs, N))
     end || _ <- lists:seq(1, 200)].

shuffle(L) ->
    [X || {_, X} <- lists:sort([{rand:uniform(), X} || X <- L])].

sorted_largest_test() ->
    ?assertEqual([{b, 9}, {c, 5}], beamdiag_agent_top:largest(2, 2, [{a, 3}, {b, 9}, {c, 5}])),
    ?assertEqual([9, 5], beamdiag_agent_top:largest(2, [3, 9, 5])),
    ?assertEqual([], beamdiag_agent_top:largest(0, [3])),
    %% Equal keys: the later first (a stable sort, reversed).
    ?assertEqual([{y, 1}, {x, 1}], beamdiag_agent_top:largest(2, 2, [{x, 1}, {y, 1}])).
