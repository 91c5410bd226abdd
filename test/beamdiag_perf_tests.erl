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

%% What decides whether perf may run, read from the paranoid level and
%% /proc/self/status, and said in sentences.
access_test_() ->
    Root = <<"Name:\tbeam.smp\nCapEff:\t000001ffffffffff\nSeccomp:\t0\nSeccomp_filters:\t0\n">>,
    NoCaps = <<"Name:\tbeam.smp\nCapEff:\t0000000000000000\nSeccomp:\t2\n">>,
    PerfmonOnly = <<"CapEff:\t0000004000000000\nSeccomp:\t2\n">>,
    [?_assertEqual(#{paranoid => 2, perfmon => true, sys_admin => true, seccomp => off},
                   beamdiag_perf:access(<<"2\n">>, Root)),
     ?_assertEqual(#{paranoid => 3, perfmon => false, sys_admin => false, seccomp => filter},
                   beamdiag_perf:access(<<"3\n">>, NoCaps)),
     ?_assertEqual(#{paranoid => -1, perfmon => true, sys_admin => false, seccomp => filter},
                   beamdiag_perf:access(<<"-1">>, PerfmonOnly)),
     ?_assertEqual(#{paranoid => unknown, perfmon => unknown, sys_admin => unknown,
                     seccomp => unknown},
                   beamdiag_perf:access(<<>>, <<"junk">>))].

access_text_test() ->
    Msg = lists:flatten(io_lib:format("~ts", [beamdiag_perf:format_error(
              {not_permitted, beamdiag_perf:access(<<"3\n">>, <<"CapEff:\t0\nSeccomp:\t2\n">>),
               <<"Error: no\n">>})])),
    [?assertNotEqual(nomatch, string:find(Msg, W), W)
     || W <- ["perf_event_paranoid is 3", "neither CAP_PERFMON nor CAP_SYS_ADMIN",
              "seccomp filter", "perf said: Error: no", "NIFs", "+JPperf true"]],
    Missing = lists:flatten(io_lib:format("~ts", [beamdiag_perf:format_error(
                  {perf_missing, beamdiag_perf:access(<<"2">>, <<"CapEff:\t1fffeffffff\n">>)})])),
    [?assertNotEqual(nomatch, string:find(Missing, W), W)
     || W <- ["perf is not installed", "perf_event_paranoid is 2", "CAP_PERFMON or CAP_SYS_ADMIN",
              "on its host"]],
    ?assertEqual(nomatch, string:find(Missing, "seccomp")).
