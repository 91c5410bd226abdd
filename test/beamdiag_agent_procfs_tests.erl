-module(beamdiag_agent_procfs_tests).
-include_lib("eunit/include/eunit.hrl").

fixture(Name) ->
    {ok, B} = file:read_file(beamdiag_test_lib:fixture(filename:join("proc", Name))),
    B.

stat_fixture_test() ->
    {ok, T} = beamdiag_agent_procfs:parse_stat(fixture("task/stat")),
    ?assertEqual(<<"1_scheduler">>, maps:get(name, T)),
    %% Fields 10..15 of the recorded line: minflt 2500, majflt 0, utime 201, stime 3.
    ?assertEqual(2500, maps:get(minflt, T)),
    ?assertEqual(0, maps:get(majflt, T)),
    ?assertEqual(201, maps:get(utime, T)),
    ?assertEqual(3, maps:get(stime, T)).

stat_name_with_spaces_and_parens_test() ->
    Line = <<"42 (a (b) c) S 1 1 1 0 -1 0 7 0 3 0 11 12 0 0 20 0 1 0 0 0 0\n">>,
    {ok, T} = beamdiag_agent_procfs:parse_stat(Line),
    ?assertEqual(<<"a (b) c">>, maps:get(name, T)),
    ?assertEqual({7, 3, 11, 12}, {maps:get(minflt, T), maps:get(majflt, T),
                                  maps:get(utime, T), maps:get(stime, T)}).

stat_control_characters_in_name_are_replaced_test() ->
    {ok, T} = beamdiag_agent_procfs:parse_stat(<<"1 (x\ny\e) S 1 1 1 0 -1 0 7 0 3 0 11 12 0">>),
    ?assertEqual(<<"x?y?">>, maps:get(name, T)).

stat_malformed_test_() ->
    [?_assertMatch({error, {beamdiag_agent_procfs, _}}, beamdiag_agent_procfs:parse_stat(B))
     || B <- [<<>>, <<"garbage">>, <<"1 (x) S 1 2">>, <<"1 (x) S 1 1 1 0 -1 0 a b c d e f">>,
              <<"1 x) S">>, <<"1 (x S 1 1 1 0 -1 0 7 0 3 0 11 12">>,
              <<"1 (x) S 1 1 1 0 -1 0 -7 0 3 0 11 12">>]].

schedstat_fixture_test() ->
    ?assertEqual({ok, #{run_ns => 2048220318, wait_ns => 78806601}},
                 beamdiag_agent_procfs:parse_schedstat(fixture("task/schedstat"))),
    ?assertMatch({error, _}, beamdiag_agent_procfs:parse_schedstat(<<"12">>)),
    ?assertMatch({error, _}, beamdiag_agent_procfs:parse_schedstat(<<"a b c">>)).

status_fixture_test() ->
    {ok, S} = beamdiag_agent_procfs:parse_status(fixture("task/status")),
    ?assert(is_integer(maps:get(nvcsw, S))),
    ?assert(is_integer(maps:get(nivcsw, S))),
    ?assertEqual({ok, #{}}, beamdiag_agent_procfs:parse_status(<<"junk\n\n">>)).

host_stat_fixture_test() ->
    {ok, #{cpu := Cpu, ncpu := N}} = beamdiag_agent_procfs:parse_host_stat(fixture("host_stat")),
    ?assertEqual(2, N),
    ?assert(maps:get(idle, Cpu) > 0),
    ?assert(maps:is_key(steal, Cpu)),
    ?assertMatch({error, _}, beamdiag_agent_procfs:parse_host_stat(<<"intr 1 2 3\n">>)).

loadavg_fixture_test() ->
    {ok, {A, B, C}} = beamdiag_agent_procfs:parse_loadavg(fixture("loadavg")),
    ?assert(A >= 0.0 andalso B >= 0.0 andalso C >= 0.0),
    ?assertMatch({error, _}, beamdiag_agent_procfs:parse_loadavg(<<"1 2">>)).

%% Against this very process: a live /proc, when there is one.
live_threads_test() ->
    case filelib:is_dir("/proc/self/task") of
        true ->
            {ok, Threads} = beamdiag_agent_procfs:threads("/proc", os:getpid()),
            Names = [N || #{name := N} <- maps:values(Threads)],
            ?assert(lists:member(<<"1_scheduler">>, Names) orelse
                    lists:member(<<"erts_sched_1">>, Names)),
            [T | _] = maps:values(Threads),
            ?assert(maps:is_key(run_ns, T));
        false ->
            ok
    end.

missing_proc_is_an_error_value_test() ->
    ?assertMatch({error, {beamdiag_agent_procfs, {list_dir, _, enoent}}},
                 beamdiag_agent_procfs:threads("/nonexistent-proc-root", "1")),
    {error, {M, R}} = beamdiag_agent_procfs:threads("/nonexistent-proc-root", "1"),
    Text = beamdiag_test_lib:sentence(M:format_error(R)),
    ?assertNotEqual(nomatch, binary:match(Text, <<"/nonexistent-proc-root">>)).
