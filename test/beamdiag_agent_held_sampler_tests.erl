%%% Tests of beamdiag_agent_held_sampler's aggregate: held samples, runs in the
%%% same function, the longest answer and the spacing-based total.
-module(beamdiag_agent_held_sampler_tests).
-include_lib("eunit/include/eunit.hrl").

-define(F, {worker, call_loop, 3}).

%% A row as a sampler sends it: the answer's wait in microseconds, the
%% time it came (ms) and the process's minor collections.
row(P, Us, Fun, At) ->
    row(P, Us, Fun, At, 0).

row(P, Us, Fun, At, Gcs) ->
    {P, Us, Fun, [], {erlang, apply, 2}, At, Gcs}.

fold(Rows) ->
    lists:foldl(fun(R, A) -> beamdiag_agent_held_sampler:add({samples, 100, [R]}, A) end,
                beamdiag_agent_held_sampler:new(), Rows).

held_runs_test() ->
    P = self(),
    %% held, held, quick, held, held, held (one in another function), held.
    Rows = [row(P, 80000, ?F, 1000), row(P, 40000, ?F, 1100), row(P, 500, ?F, 1200),
            row(P, 20000, ?F, 1300), row(P, 30000, ?F, 1350), row(P, 95000, {a, b, 0}, 1450),
            row(P, 15000, ?F, 1700)],
    [E] = beamdiag_agent_held_sampler:entries(fold(Rows)),
    ?assertEqual(7, maps:get(samples, E)),
    ?assertEqual(6, maps:get(count, E)),
    ?assertEqual(2, maps:get(consecutive, E)),
    ?assertEqual(95, maps:get(longest_ms, E)),
    %% 100 (first) + 100 + 100 + 50 + 100 + 100 (the 250 ms gap, capped).
    ?assertEqual(550, maps:get(total_ms, E)),
    ?assertEqual(#{?F => 5, {a, b, 0} => 1}, maps:get(where, E)),
    %% Watched from its first sample to its last.
    ?assertEqual(700, maps:get(watched_ms, E)),
    ?assertEqual(0, maps:get(collected, E)).

%% A late answer after a garbage collection (the minor count moved since
%% the sample before) is counted apart, not as held; one with the count
%% unchanged is held.
collected_not_held_test() ->
    P = self(),
    Rows = [row(P, 500, ?F, 1000, 4), row(P, 60000, ?F, 1100, 5), row(P, 60000, ?F, 1200, 5),
            row(P, 60000, ?F, 1300, 0), row(P, 400, ?F, 1400, 1)],
    [E] = beamdiag_agent_held_sampler:entries(fold(Rows)),
    ?assertEqual(5, maps:get(samples, E)),
    ?assertEqual(1, maps:get(count, E)),
    ?assertEqual(2, maps:get(collected, E)),
    ?assertEqual(60, maps:get(longest_ms, E)).

%% A process that always answers at once is never an entry.
quick_only_test() ->
    Agg = fold([row(self(), 300, ?F, T) || T <- [0, 100, 200]]),
    ?assertEqual([], beamdiag_agent_held_sampler:entries(Agg)),
    ?assertEqual(3, maps:get(samples, beamdiag_agent_held_sampler:info(Agg))),
    ?assertNot(beamdiag_agent_held_sampler:found({samples, 100, [row(self(), 300, ?F, 0)]})),
    ?assert(beamdiag_agent_held_sampler:found({samples, 100, [row(self(), 30000, ?F, 0)]})).

%% Walks add candidates up to the bound, the earlier ones kept.
candidates_bounded_test() ->
    Pids = [list_to_pid("<0.1." ++ integer_to_list(I) ++ ">") || I <- lists:seq(1, 12)],
    A1 = beamdiag_agent_held_sampler:add({walked, #{read => 10}, lists:sublist(Pids, 3)},
                                 beamdiag_agent_held_sampler:new()),
    A2 = beamdiag_agent_held_sampler:add({walked, #{read => 10}, lists:nthtail(2, Pids)}, A1),
    Cs = beamdiag_agent_held_sampler:candidates(A2),
    ?assertEqual(8, length(Cs)),
    ?assertEqual(lists:sublist(Pids, 8), Cs),
    ?assertEqual(2, length(maps:get(walks, beamdiag_agent_held_sampler:info(A2)))).
