%%% Shares whose denominator is near zero are left out of the exposition
%%% text, with the absolute figure beside them; on recorded captures.
-module(beamdiag_metrics_tests).

-include_lib("eunit/include/eunit.hrl").

ledger(Name) ->
    File = filename:join([filename:dirname(?FILE), "fixtures", "captures", Name ++ ".capture"]),
    {ok, [C]} = file:consult(File),
    beamdiag_ledger:build(C).

text(L) ->
    iolist_to_binary(beamdiag_metrics:text(L)).

has(Text, Line) ->
    binary:match(Text, Line) =/= nomatch.

%% Raw first: the idle node's schedulers were on CPU for under 0.05 CPUs,
%% the busy_wait node's for more; the share is there only for the latter,
%% the CPUs spinning for both.
busy_wait_share_needs_cpu_test() ->
    _ = [begin
         L = #{by_type := #{scheduler := S}, window_s := W} = ledger(Name),
         OnCpus = maps:get(on_cpu, S) / W,
         T = text(L),
         ?assertEqual(OnCpus >= 0.05, has(T, <<"\nbeamdiag_busy_wait_share{type=\"scheduler\"}">>)),
         ?assert(has(T, <<"\nbeamdiag_busy_wait_cpus{type=\"scheduler\"}">>))
     end || Name <- ["idle", "busy_wait", "busy_wait_off"]],
    #{by_type := #{scheduler := Idle}, window_s := Wi} = ledger("idle"),
    ?assert(maps:get(on_cpu, Idle) / Wi < 0.05),
    #{by_type := #{scheduler := Busy}, window_s := Wb} = ledger("busy_wait"),
    ?assert(maps:get(on_cpu, Busy) / Wb >= 0.05).

%% A share of CFS periods over a handful of periods is left out; the
%% throttled periods are counted either way.
throttled_share_needs_periods_test() ->
    L = #{cgroup := Cg} = ledger("cpu_throttling"),
    ?assert(maps:get(periods, Cg) >= 10),
    ?assert(has(text(L), <<"\nbeamdiag_cgroup_throttled_share ">>)),
    Few = text(L#{cgroup := Cg#{periods => 3, throttled_periods => 1, throttled_ratio => 0.33}}),
    ?assertNot(has(Few, <<"\nbeamdiag_cgroup_throttled_share ">>)),
    ?assert(has(Few, <<"\nbeamdiag_cgroup_throttled_periods 1\n">>)).
