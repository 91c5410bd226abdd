%%% Shares whose denominator is near zero are left out of the exposition
%%% text, with the absolute figure beside them; on recorded captures.
-module(beamdiag_metrics_tests).

-include_lib("eunit/include/eunit.hrl").

ledger(Name) ->
    beamdiag_ledger:build(beamdiag_test_lib:fixture_capture(Name)).

text(L) ->
    iolist_to_binary(beamdiag_metrics:text(L)).

has(Text, Line) ->
    binary:match(Text, Line) =/= nomatch.

%% Raw first: the idle node's schedulers were on CPU for a hundredth of a
%% CPU, the busy_wait nodes' for a tenth and more; the share is there for
%% the latter only (each capture's answer is written out, not derived
%% from the exposition's own bound), the CPUs spinning for all.
busy_wait_share_needs_cpu_test() ->
    _ = [begin
         L = #{by_type := #{scheduler := S}, window_s := W} = ledger(Name),
         OnCpus = maps:get(on_cpu, S) / W,
         T = text(L),
         ?assert(OnCpus >= Lo andalso OnCpus < Hi),
         ?assertEqual({Name, Shown}, {Name, has(T, <<"\nbeamdiag_busy_wait_share{type=\"scheduler\"}">>)}),
         ?assert(has(T, <<"\nbeamdiag_busy_wait_cpus{type=\"scheduler\"}">>))
     end || {Name, Lo, Hi, Shown} <- [{"idle", 0.0, 0.02, false},
                                      {"busy_wait", 0.5, 2.0, true},
                                      {"busy_wait_off", 0.1, 0.2, true}]],
    ok.

%% A share of CFS periods over a handful of periods is left out; the
%% throttled periods are counted either way.
throttled_share_needs_periods_test() ->
    L = #{cgroup := Cg} = ledger("cpu_throttling"),
    ?assert(maps:get(periods, Cg) >= 10),
    ?assert(has(text(L), <<"\nbeamdiag_cgroup_throttled_share ">>)),
    Few = text(L#{cgroup := Cg#{periods => 3, throttled_periods => 1, throttled_ratio => 0.33}}),
    ?assertNot(has(Few, <<"\nbeamdiag_cgroup_throttled_share ">>)),
    ?assert(has(Few, <<"\nbeamdiag_cgroup_throttled_periods 1\n">>)).

%% The memory accounts at the later sample, and their change a second.
memory_metrics_test() ->
    S = fun(T, Rss, Bin) ->
                #{t => erlang:convert_time_unit(T * 1000000000, nanosecond, native),
                  memory => #{vm => #{total => 100 + Bin, binary => Bin, processes => 50},
                              os => #{rss => Rss, anon => Rss - 10}}}
        end,
    T = iolist_to_binary(beamdiag_metrics:memory_metrics(S(0, 1000, 20), S(2, 1400, 220))),
    [?assert(has(T, L)) || L <- [<<"beamdiag_memory_bytes{account=\"rss\"} 1400">>,
                                 <<"beamdiag_memory_bytes{account=\"vm_total\"} 320">>,
                                 <<"beamdiag_memory_bytes{account=\"binary\"} 220">>,
                                 <<"beamdiag_memory_growth_bytes_per_second{account=\"rss\"} 200">>,
                                 <<"beamdiag_memory_growth_bytes_per_second{account=\"binary\"} 100">>]],
    %% A sample without the OS's account: the VM's alone.
    Vm = iolist_to_binary(beamdiag_metrics:memory_metrics(
                            S(0, 1000, 20), (S(1, 0, 30))#{memory := #{vm => #{total => 130},
                                                                      os => {error, x}}})),
    ?assertNot(has(Vm, <<"account=\"rss\"">>)),
    ?assert(has(Vm, <<"beamdiag_memory_bytes{account=\"vm_total\"} 130">>)).
