-module(beamdiag_agent_cgroup_tests).
-include_lib("eunit/include/eunit.hrl").

dir() -> beamdiag_test_lib:fixture_dir("proc").
fixture(Name) ->
    {ok, B} = file:read_file(filename:join(dir(), Name)),
    B.

proc_cgroup_fixture_test() ->
    L = beamdiag_agent_cgroup:parse_proc_cgroup(fixture("cgroup_in_child")),
    ?assert(lists:member({v2, <<"/">>}, L)),
    [Path] = [P || {v1, Ctrls, P} <- L, lists:member(<<"cpu">>, Ctrls)],
    ?assertMatch(<<"/beamdiag_fixture_", _/binary>>, Path).

mountinfo_fixture_test() ->
    M = beamdiag_agent_cgroup:parse_mountinfo(fixture("mountinfo")),
    ?assert(lists:any(fun({1, _, Mount, Opts}) -> lists:member(<<"cpu">>, Opts) andalso
                                                  Mount =/= <<>>;
                         (_) -> false end, M)).

cpu_stat_v1_throttled_fixture_test() ->
    S = beamdiag_agent_cgroup:parse_cpu_stat(1, fixture("cpu_stat_v1_throttled")),
    ?assertEqual(#{nr_periods => 21, nr_throttled => 20, throttled_ns => 3342524771}, S).

cpu_stat_v2_fixture_test() ->
    S = beamdiag_agent_cgroup:parse_cpu_stat(2, fixture("cpu_stat_v2")),
    ?assert(is_integer(maps:get(usage_ns, S))).

%% cpu.max as the kernel documents it (cgroup-v2.rst).
cpu_max_test_() ->
    [?_assertEqual({unlimited, 100000}, beamdiag_agent_cgroup:parse_cpu_max(<<"max 100000\n">>)),
     ?_assertEqual({1.5, 100000}, beamdiag_agent_cgroup:parse_cpu_max(<<"150000 100000\n">>)),
     ?_assertEqual({unlimited, 100000}, beamdiag_agent_cgroup:parse_cpu_max(<<"junk">>)),
     ?_assertEqual({unlimited, 100000}, beamdiag_agent_cgroup:parse_cpu_max(<<"-5 0">>))].

%% A recorded process in a throttled v1 cgroup, laid out under a temporary
%% root: locate/3 finds the directory, read/1 the quota and the counters.
locate_and_read_v1_test() ->
    Root = filename:join(["/tmp", "beamdiag_cg_" ++ os:getpid() ++ integer_to_list(erlang:unique_integer([positive]))]),
    try
        ProcDir = filename:join([Root, "proc", "7"]),
        ok = filelib:ensure_dir(filename:join(ProcDir, "x")),
        ok = file:write_file(filename:join(ProcDir, "cgroup"), fixture("cgroup_in_child")),
        ok = file:write_file(filename:join(ProcDir, "mountinfo"), fixture("mountinfo")),
        [Path] = [P || {v1, C, P} <- beamdiag_agent_cgroup:parse_proc_cgroup(fixture("cgroup_in_child")),
                       lists:member(<<"cpu">>, C)],
        CgDir = Root ++ "/sys/fs/cgroup/cpu" ++ binary_to_list(Path),
        ok = filelib:ensure_dir(filename:join(CgDir, "x")),
        ok = file:write_file(filename:join(CgDir, "cpu.stat"), fixture("cpu_stat_v1_throttled")),
        ok = file:write_file(filename:join(CgDir, "cpu.cfs_quota_us"), fixture("cpu_cfs_quota_us")),
        ok = file:write_file(filename:join(CgDir, "cpu.cfs_period_us"), fixture("cpu_cfs_period_us")),
        {ok, Loc} = beamdiag_agent_cgroup:locate(filename:join(Root, "proc"), 7, Root),
        ?assertEqual(#{version => 1, dir => CgDir}, Loc),
        {ok, Stat} = beamdiag_agent_cgroup:read(Loc),
        ?assertEqual(0.2, maps:get(quota_cpus, Stat)),
        ?assertEqual(20, maps:get(nr_throttled, Stat)),
        %% A middle tick keeps the quota read before and reads the counters
        %% alone: with the quota files gone, the quota is the one before.
        ok = file:delete(filename:join(CgDir, "cpu.cfs_quota_us")),
        ok = file:delete(filename:join(CgDir, "cpu.cfs_period_us")),
        {{ok, Mid}, _} = beamdiag_agent_cgroup:read(Loc, Stat, beamdiag_agent_file:none()),
        ?assertEqual({0.2, 20}, {maps:get(quota_cpus, Mid), maps:get(nr_throttled, Mid)}),
        {{ok, Whole}, _} = beamdiag_agent_cgroup:read(Loc, undefined, beamdiag_agent_file:none()),
        ?assertEqual(unlimited, maps:get(quota_cpus, Whole))
    after
        os:cmd("rm -rf " ++ Root)
    end.

no_cgroup_is_an_error_value_test() ->
    ?assertMatch({error, {beamdiag_agent_cgroup, no_cgroup}},
                 beamdiag_agent_cgroup:locate("/nonexistent", 1)).
