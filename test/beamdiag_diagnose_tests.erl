%%% EUnit tests of the diagnosis' options: the names that carry their unit
%%% and the older ones are one option each.
-module(beamdiag_diagnose_tests).
-include_lib("eunit/include/eunit.hrl").

unit_names_test() ->
    ?assertMatch(#{duration := 4, interval := 250},
                 beamdiag:options(#{duration_s => 4, interval_ms => 250})),
    ?assertMatch(#{duration := 4, interval := 250},
                 beamdiag:options(#{duration => 4, interval => 250})),
    ?assertNot(maps:is_key(duration_s, beamdiag:options(#{duration_s => 4}))),
    %% Both spellings: the same value, or an error naming both.
    ?assertMatch(#{duration := 4}, beamdiag:options(#{duration_s => 4, duration => 4})),
    ?assertError({badarg, {duration_s, 4, duration, 5}},
                 beamdiag:options(#{duration_s => 4, duration => 5})),
    %% The bounds hold whatever the name.
    ?assertError({badarg, {interval, 5}}, beamdiag:options(#{interval_ms => 5})),
    ?assertError({badarg, {duration, 0}}, beamdiag:options(#{duration_s => 0})).
