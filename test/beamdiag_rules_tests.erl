-module(beamdiag_rules_tests).
-include_lib("eunit/include/eunit.hrl").

capture(Name) ->
    File = filename:join([filename:dirname(?FILE), "fixtures", "captures", Name ++ ".capture"]),
    {ok, [C]} = file:consult(File),
    C.

findings(Name) ->
    #{findings := F} = beamdiag:analyse(capture(Name)),
    F.

ids(Name) -> [Id || #{id := Id} <- findings(Name)].
serious(Name) -> [Id || F = #{id := Id} <- findings(Name), beamdiag_finding:at_least(F, warning)].

%% Each recorded pathology is named.
named_test_() ->
    [{N, ?_assert(lists:member(Id, serious(N)))} || {N, Id} <- [
        {"busy_wait", busy_wait},
        {"cpu_saturated", cpu_saturated},
        {"cpu_starvation", cpu_starvation},
        {"cpu_throttling", cpu_throttling},
        {"high_system_cpu", high_system_cpu},
        {"dirty_cpu_gc", dirty_cpu_gc},
        {"scheduler_blocking", scheduler_blocking},
        {"scheduler_imbalance", scheduler_imbalance}]].

%% Negative controls.
idle_flags_nothing_test() ->
    ?assertEqual([], serious("idle")).

busy_wait_off_is_not_busy_wait_test() ->
    ?assertNot(lists:member(busy_wait, ids("busy_wait_off"))).

saturated_is_not_blocked_test() ->
    ?assertNot(lists:member(scheduler_blocking, ids("cpu_saturated"))).

throttling_is_named_not_its_symptoms_test() ->
    Ids = ids("cpu_throttling"),
    ?assertNot(lists:member(cpu_starvation, Ids)),
    ?assertNot(lists:member(scheduler_blocking, Ids)).

findings_are_complete_and_sorted_test() ->
    F = findings("cpu_throttling"),
    Ranks = [beamdiag_finding:severity_rank(S) || #{severity := S} <- F],
    ?assertEqual(lists:sort(Ranks), Ranks),
    [begin
         ?assert(is_binary(Fix) andalso byte_size(Fix) > 20),
         ?assert(Ev =/= []),
         ?assert(lists:all(fun is_binary/1, Ev))
     end || #{fix := Fix, evidence := Ev} <- F].

%% Findings quote numbers the ledger measured.
evidence_has_numbers_test() ->
    [#{evidence := [E | _], metrics := M}] = [F || F = #{id := busy_wait} <- findings("busy_wait")],
    ?assertMatch({match, _}, re:run(E, "[0-9]+\\.[0-9]+")),
    ?assert(maps:get(spin_share, M) > 0.4).

no_busy_wait_when_flags_are_none_test() ->
    C = capture("busy_wait"),
    S = maps:get(settings, C),
    Off = C#{settings => S#{sbwt => <<"none">>, sbwtdcpu => <<"none">>, sbwtdio => <<"none">>}},
    #{findings := F} = beamdiag:analyse(Off),
    ?assertNot(lists:member(busy_wait, [Id || #{id := Id} <- F])).

schedulers_exceed_cpus_test() ->
    C = capture("idle"),
    S = maps:get(settings, C),
    More = C#{settings => S#{schedulers_online => 8, logical_processors_available => 2}},
    #{findings := F} = beamdiag:analyse(More),
    ?assert(lists:member(schedulers_exceed_cpus, [Id || #{id := Id} <- F])).

%% The ledger's spin estimate agrees with microstate accounting, which
%% counts busy-waiting inside 'other' on a default emulator.
msacc_cross_check_test() ->
    #{ledger := L, findings := F} = beamdiag:analyse(capture("busy_wait")),
    #{by_type := #{scheduler := S = #{wall := W}},
      msacc := #{by_type := #{scheduler := #{shares := Shares}}}} = L,
    Spin = maps:get(spin, S) / W,
    Other = maps:get(other, Shares),
    ?assert(abs(Spin - Other) < 0.10),
    [#{evidence := Ev}] = [X || X = #{id := busy_wait} <- F],
    ?assert(lists:any(fun(E) -> binary:match(E, <<"msacc">>) =/= nomatch end, Ev)).
