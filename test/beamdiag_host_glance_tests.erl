%%% EUnit tests for beamdiag_host_glance: the state read from a stat line
%%% (names with spaces and parentheses) and the view in words.
-module(beamdiag_host_glance_tests).

-include_lib("eunit/include/eunit.hrl").

parse_state_test_() ->
    [?_assertEqual(<<"T">>, beamdiag_host_glance:parse_state(
                               <<"4242 (beam.smp) T 1 4242 4242 0 -1 4194560 1 0">>)),
     ?_assertEqual(<<"R">>, beamdiag_host_glance:parse_state(<<"7 (a (b) c) R 1 2">>)),
     ?_assertEqual(unknown, beamdiag_host_glance:parse_state(<<"garbage">>))].

words_test_() ->
    Stopped = #{os_pid => 4242, state => <<"T">>, span_s => 2.0, threads => [],
                rss => 45 * 1024 * 1024},
    Busy = #{os_pid => 7, state => <<"R">>, span_s => 3.0,
             threads => [#{name => <<"1_scheduler">>, user => 0.98, sys => 0.02},
                         #{name => <<"aux">>, user => 0.05, sys => 0.0}],
             rss => 3 * 1024 * 1024 * 1024 div 2},
    [?_assertEqual(<<"on this host: pid 4242, stopped by a signal (state T: SIGSTOP, or job "
                     "control); no thread above 1% of a CPU in 2.0 s; 45 MiB resident">>,
                   iolist_to_binary(beamdiag_host_glance:words(Stopped))),
     ?_assertEqual(<<"on this host: pid 7, running (state R); 1_scheduler 98% user + 2% kernel, "
                     "aux 5% user over 3.0 s; 1.5 GiB resident">>,
                   iolist_to_binary(beamdiag_host_glance:words(Busy)))].

%% A node of another host is not looked for here.
other_host_test() ->
    ?assertMatch({error, {beamdiag_host_glance, {other_host, "elsewhere.invalid"}}},
                 beamdiag_host_glance:start('app@elsewhere.invalid', #{})).
