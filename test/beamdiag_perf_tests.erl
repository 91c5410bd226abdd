%%% Tests of beamdiag_perf's reading of the target and its choice of the
%%% call-graph mode.
-module(beamdiag_perf_tests).

-include_lib("eunit/include/eunit.hrl").

target(Over) ->
    maps:merge(#{perf_flag => none, perf_directory => undefined, ns_pid => 42,
                 perf_map => missing, frame_pointers => false, native_names => true}, Over).

choose_test_() ->
    [?_assertMatch({dwarf, _}, beamdiag_perf:choose_call_graph(target(#{}))),
     %% The JIT keeps frame pointers, but the emulator names its C
     %% functions: DWARF names them, up to the first JIT frame.
     ?_assertMatch({dwarf, _}, beamdiag_perf:choose_call_graph(
                                   target(#{perf_flag => <<"true">>, frame_pointers => true,
                                            perf_map => "/proc/1/root/tmp/perf-1.map"}))),
     %% A stripped emulator (sid's OTP 29): Erlang frames are what can be named.
     ?_assertMatch({fp, _}, beamdiag_perf:choose_call_graph(
                                target(#{perf_flag => <<"true">>, frame_pointers => true,
                                         perf_map => "/tmp/perf-1.map", native_names => false}))),
     %% No map: frame pointers would give unnamed frames only.
     ?_assertMatch({dwarf, _}, beamdiag_perf:choose_call_graph(
                                   target(#{perf_flag => <<"true">>, frame_pointers => true,
                                            native_names => false}))),
     ?_assertMatch({dwarf, _}, beamdiag_perf:choose_call_graph(
                                   target(#{perf_flag => <<"no_fp">>, native_names => false,
                                            perf_map => "/tmp/perf-1.map"})))].

%% This test VM runs without +JPperf: no flag, no map, its own pid.
target_of_self_test() ->
    Pid = list_to_integer(os:getpid()),
    T = beamdiag_perf:target(Pid),
    ?assertMatch(#{perf_flag := none, frame_pointers := false, ns_pid := Pid}, T),
    ?assertEqual(missing, maps:get(perf_map, T)).

record_args_test() ->
    Args = beamdiag_perf:record_args(7, "/d/perf.data", #{call_graph => dwarf, duration => 3}),
    ?assert(lists:member("-N", Args) andalso lists:member("-B", Args)),
    ?assert(lists:member("--no-bpf-event", Args)),
    ?assert(lists:member("dwarf,65528", Args)),
    ?assertError({badarg, _}, beamdiag_perf:record_args(7, "/d", #{call_graph => auto})),
    ?assertMatch({error, {beamdiag_perf, {bad_option, call_graph, lbr}}},
                 beamdiag_perf:record(1, #{call_graph => lbr})).
