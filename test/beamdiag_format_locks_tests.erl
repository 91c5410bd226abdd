-module(beamdiag_format_locks_tests).

-include_lib("eunit/include/eunit.hrl").

fits_80_columns_test_() ->
    [
        {Name, fun() ->
            Lines = lines(fixture(Name)),
            [?assert(string:length(L) =< 80) || L <- Lines]
        end}
     || Name <- ["lcnt_ets_hot.term", "lcnt_ets_sharded.term", "lcnt_dirty_gc.term",
                 "lcnt_dirty_gc_mdai.term", "lcnt_idle.term"]
    ].

ets_hot_ranks_the_table_first_test() ->
    Lines = lines(fixture("lcnt_ets_hot.term")),
    [_Header, First | _] = lists:dropwhile(fun(L) -> string:prefix(L, "Top locks") =:= nomatch end,
                                           Lines),
    ?assertNotEqual(nomatch, string:prefix(First, "db_hash_slot")),
    ?assertNotEqual(nomatch, string:find(First, "beamdiag_hot_table")),
    ?assert(lists:any(fun(L) -> string:find(L, "owner") =/= nomatch end, Lines)).

empty_data_test() ->
    Text = unicode:characters_to_list(beamdiag_format_locks:text(#{})),
    ?assertNotEqual(nomatch, string:find(Text, "No lock was taken")).

long_ids_are_cut_test() ->
    Long = binary:copy(<<"x">>, 200),
    D = #{window_ns => 1000000000, lock_count => 1, contended_count => 1,
          classes => [#{class => Long, locks => 1, tries => 10, collision_pct => 1.0,
                        wait_ns => 10, wait_pct => 0.0}],
          locks => [#{class => Long, id => Long, tries => 10, collision_pct => 1.0,
                      wait_pct => 0.0, p50_wait_ns => 1024, p90_wait_ns => 1 bsl 30,
                      instances => 3,
                      locations => [#{location => Long, tries => 1, collisions => 1,
                                      wait_ns => 1}]}],
          tables => [#{name => Long, owner => Long, type => <<"set">>}]},
    [?assert(string:length(L) =< 80) || L <- lines(D)].

%% Names with bytes that are not UTF-8 and control characters: printable,
%% no crash.
hostile_names_test() ->
    Bad = <<"t", 255, 27, "[2J">>,
    D = #{window_ns => 1000000000, lock_count => 1, contended_count => 1,
          classes => [#{class => Bad, locks => 1, tries => 10, collision_pct => 1.0,
                        wait_ns => 10, wait_pct => 0.0}],
          locks => [#{class => Bad, id => Bad, tries => 10, collision_pct => 1.0,
                      wait_pct => 0.0, p50_wait_ns => 1024, p90_wait_ns => 2048,
                      instances => 1,
                      locations => [#{location => Bad, tries => 1, collisions => 1,
                                      wait_ns => 1}]}],
          tables => [#{name => Bad, owner => Bad, type => <<"set">>}]},
    Text = unicode:characters_to_binary(beamdiag_format_locks:text(D)),
    ?assertEqual(nomatch, binary:match(Text, [<<27>>, <<255>>])),
    ?assertNotEqual(nomatch, binary:match(Text, <<"t??[2J">>)).

lines(D) ->
    string:split(unicode:characters_to_list(beamdiag_format_locks:text(D)), "\n", all).

fixture(Name) ->
    beamdiag_test_lib:fixture_term(Name).
