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

%% The state letter (field 3); anything but a letter is `?'.
stat_state_test_() ->
    [?_assertMatch({ok, #{state := <<"D">>}},
                   beamdiag_agent_procfs:parse_stat(<<"1 (x) D 1 1 1 0 -1 0 7 0 3 0 11 12 0">>)),
     ?_assertMatch({ok, #{state := <<"R">>}}, beamdiag_agent_procfs:parse_stat(fixture("task/stat"))),
     ?_assertMatch({ok, #{state := <<"?">>}},
                   beamdiag_agent_procfs:parse_stat(<<"1 (x) SS 1 1 1 0 -1 0 7 0 3 0 11 12 0">>))].

%% With `waits', the threads of this VM that are not running say what
%% they wait on; without, none does; a tick reads them with the status
%% file only.
waits_test() ->
    {ok, With} = beamdiag_agent_procfs:threads("/proc", os:getpid(), #{waits => true}),
    Waiting = [T || T = #{state := St} <- maps:values(With), St =/= <<"R">>],
    ?assert(length(Waiting) >= 2),
    ?assert(lists:all(fun(T) -> maps:is_key(wait, T) end, Waiting)),
    {ok, Without} = beamdiag_agent_procfs:threads("/proc", os:getpid(), #{}),
    ?assertEqual([], [T || T = #{wait := _} <- maps:values(Without)]),
    H = beamdiag_agent_file:none(),
    {{ok, Middle, _}, _} = beamdiag_agent_procfs:tick_threads(
                             "/proc", os:getpid(), #{status => false, waits => true, previous => With},
                             H),
    ?assertEqual([], [T || T = #{wait := _} <- maps:values(Middle)]),
    {{ok, Last, _}, _} = beamdiag_agent_procfs:tick_threads(
                           "/proc", os:getpid(), #{status => true, waits => true}, H),
    ?assertMatch([_ | _], [T || T = #{wait := _} <- maps:values(Last)]).

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

%% Against this very process: a live /proc (beamdiag runs on Linux; a host
%% without one is not one the tests pass on).
live_threads_test() ->
    ?assert(filelib:is_dir("/proc/self/task")),
    {ok, Threads} = beamdiag_agent_procfs:threads("/proc", os:getpid()),
    Names = [N || #{name := N} <- maps:values(Threads)],
    ?assert(lists:member(<<"1_scheduler">>, Names) orelse lists:member(<<"erts_sched_1">>, Names)),
    [T | _] = maps:values(Threads),
    ?assert(maps:is_key(run_ns, T)).

missing_proc_is_an_error_value_test() ->
    ?assertMatch({error, {beamdiag_agent_procfs, {list_dir, _, enoent}}},
                 beamdiag_agent_procfs:threads("/nonexistent-proc-root", "1")),
    {error, {M, R}} = beamdiag_agent_procfs:threads("/nonexistent-proc-root", "1"),
    Text = beamdiag_test_lib:sentence(M:format_error(R)),
    ?assertNotEqual(nomatch, binary:match(Text, <<"/nonexistent-proc-root">>)).

%% A middle tick (tick_threads/4, `previous' given, no status file): the previous sample's
%% threads are read without listing the task directory; a thread whose stat
%% shows no CPU time since keeps its previous schedstat, one whose stat moved
%% has its schedstat read; a thread that has gone drops out, a new one waits
%% for the next full read, which reads every schedstat again.
middle_tick_reads_idle_threads_once_test() ->
    Root = scratch_root(),
    Task = filename:join([Root, "77", "task"]),
    Stat = fun stat_line/3,
    Put = fun(Tid, File, Text) -> put_file(filename:join(Task, integer_to_list(Tid)), File, Text) end,
    try
        Put(1, "stat", Stat("1_scheduler", 100, 5)),
        Put(1, "schedstat", "1000 10 1\n"),
        Put(2, "stat", Stat("1_dirty_io_sch", 3, 1)),
        Put(2, "schedstat", "2000 20 1\n"),
        Put(3, "stat", Stat("aux", 1, 1)),
        Put(3, "schedstat", "3000 30 1\n"),
        {{ok, First}, H1} = beamdiag_agent_procfs:threads(Root, 77, #{status => true},
                                                         beamdiag_agent_file:none()),
        ?assertEqual([1, 2, 3], lists:sort(maps:keys(First))),
        %% Thread 1 ran; 2 did not (its schedstat moved below one clock
        %% tick); 3 has gone; 4 is new.
        Put(1, "stat", Stat("1_scheduler", 180, 6)),
        Put(1, "schedstat", "900001000 11 2\n"),
        Put(2, "schedstat", "2500 20 2\n"),
        ok = file:del_dir_r(filename:join(Task, "3")),
        Put(4, "stat", Stat("2_dirty_io_sch", 0, 0)),
        Put(4, "schedstat", "4000 40 1\n"),
        {{ok, Mid, _}, H2} = beamdiag_agent_procfs:tick_threads(Root, 77,
                                                               #{status => false, previous => First}, H1),
        ?assertEqual([1, 2], lists:sort(maps:keys(Mid))),
        ?assertEqual(900001000, maps:get(run_ns, maps:get(1, Mid))),
        ?assertEqual({2000, 20}, {maps:get(run_ns, maps:get(2, Mid)), maps:get(wait_ns, maps:get(2, Mid))}),
        %% Kept, and marked so: its wait for a CPU may have grown.
        ?assertEqual({true, false}, {maps:is_key(carried, maps:get(2, Mid)),
                                     maps:is_key(carried, maps:get(1, Mid))}),
        %% The full read at the end lists the directory and reads every
        %% schedstat: thread 2's time below a clock tick is counted there.
        {{ok, Last, _}, _} = beamdiag_agent_procfs:tick_threads(Root, 77, #{status => true, previous => Mid},
                                                                H2),
        ?assertEqual([1, 2, 4], lists:sort(maps:keys(Last))),
        ?assertEqual(2500, maps:get(run_ns, maps:get(2, Last))),
        ?assertNot(maps:is_key(carried, maps:get(2, Last)))
    after
        file:del_dir_r(Root)
    end.

%% A middle tick with `active' and `process' (tick_threads/4): the active
%% threads are read, then the process's own CPU time (utime plus stime of
%% /proc/PID/stat), and an idle thread only when the process used 3 clock
%% ticks or more beyond what the active ones did.
middle_tick_reads_idle_threads_when_the_process_says_so_test() ->
    Root = scratch_root(),
    Task = filename:join([Root, "78", "task"]),
    Stat = fun stat_line/3,
    Put = fun put_file/3,
    Proc = fun(U, S) -> Put(filename:join(Root, "78"), "stat", Stat("beam.smp", U, S)) end,
    T = fun(Tid) -> filename:join(Task, integer_to_list(Tid)) end,
    try
        Proc(110, 10),
        Put(T(1), "stat", Stat("1_scheduler", 100, 5)),
        Put(T(1), "schedstat", "1000 10 1\n"),
        Put(T(2), "stat", Stat("aux", 3, 1)),
        Put(T(2), "schedstat", "2000 20 1\n"),
        ?assertMatch({{ok, #{cpu := 120}}, _},
                     beamdiag_agent_procfs:process_stat(Root, 78, beamdiag_agent_file:none())),
        {{ok, First, #{cpu := 120, rss_pages := 0}}, H1} = beamdiag_agent_procfs:tick_threads(Root, 78, #{status => true},
                                                                   beamdiag_agent_file:none()),
        %% The scheduler ran 80 ticks, aux 1: the process's 81 are
        %% accounted for within 3, so aux is not read.
        Proc(190, 11),
        Put(T(1), "stat", Stat("1_scheduler", 180, 5)),
        Put(T(1), "schedstat", "801000 10 2\n"),
        Put(T(2), "stat", Stat("aux", 4, 1)),
        Put(T(2), "schedstat", "12000 20 2\n"),
        Mid = #{status => false, previous => First, active => [1], process => 120},
        {{ok, A, #{cpu := 201}}, H2} = beamdiag_agent_procfs:tick_threads(Root, 78, Mid, H1),
        ?assertEqual(180, maps:get(utime, maps:get(1, A))),
        ?assertEqual(801000, maps:get(run_ns, maps:get(1, A))),
        ?assertEqual((maps:get(2, First))#{carried => true}, maps:get(2, A)),
        %% Aux ran 30 ticks more: 30 of the process's are not accounted
        %% for, and aux is read.
        Proc(220, 11),
        Put(T(2), "stat", Stat("aux", 34, 1)),
        {{ok, B, #{cpu := 231}}, _} = beamdiag_agent_procfs:tick_threads(Root, 78, Mid, H2),
        ?assertEqual(34, maps:get(utime, maps:get(2, B))),
        ?assertEqual(12000, maps:get(run_ns, maps:get(2, B)))
    after
        file:del_dir_r(Root)
    end.

%% A fresh directory to lay out a /proc tree under.
scratch_root() ->
    filename:join("/tmp", "beamdiag_procfs_" ++ os:getpid() ++ "_" ++
                      integer_to_list(erlang:unique_integer([positive]))).

%% A thread's (or process's) stat line with its name, utime and stime.
stat_line(Name, U, S) ->
    io_lib:format("1 (~s) S 1 1 1 0 -1 0 7 0 3 0 ~b ~b 0 0 20 0 1 0 0 0 0\n", [Name, U, S]).

put_file(Dir, File, Text) ->
    ok = filelib:ensure_dir(filename:join(Dir, "x")),
    ok = file:write_file(filename:join(Dir, File), Text).

%% The one reading of a stat line: fields from the last closing
%% parenthesis, so a name holding ") " (which a process may give itself)
%% does not shift them.
stat_fields_test_() ->
    [?_assertEqual({ok, <<"beam.smp">>, [<<"S">>, <<"1">>, <<"42">>]},
                   beamdiag_agent_procfs:stat_fields(<<"4242 (beam.smp) S 1 42\n">>)),
     ?_assertEqual({ok, <<"a) b (c">>, [<<"R">>, <<"7">>]},
                   beamdiag_agent_procfs:stat_fields(<<"9 (a) b (c) R 7">>)),
     ?_assertEqual(error, beamdiag_agent_procfs:stat_fields(<<"no name here">>)),
     ?_assertEqual(error, beamdiag_agent_procfs:stat_fields(<<"9 ) (x">>))].

%% The process's resident memory from its stat (field 24, pages), with its
%% CPU time, from one read.
process_stat_rss_test() ->
    Root = scratch_root(),
    try
        put_file(filename:join(Root, "79"), "stat",
                 "79 (beam.smp) S 1 1 1 0 -1 0 7 0 3 0 40 2 0 0 20 0 30 0 5 900000 12345 0\n"),
        ?assertMatch({{ok, #{cpu := 42, rss_pages := 12345}}, _},
                     beamdiag_agent_procfs:process_stat(Root, 79, beamdiag_agent_file:none()))
    after
        file:del_dir_r(Root)
    end.
