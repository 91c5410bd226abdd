%%% EUnit tests of held-open reads: the same bytes as a whole read, fresh
%%% content on every read, the budget respected, clear errors, and the
%%% budget taken from the open-file limit.
-module(beamdiag_agent_file_tests).

-include_lib("eunit/include/eunit.hrl").

%% On a loaded host a fixed amount of burning took over EUnit's default
%% 5 s: the burn goes on until a whole read shows utime moved (the
%% condition itself), within 60 s.
same_content_and_fresh_test_() ->
    {timeout, 60, fun same_content_and_fresh/0}.

same_content_and_fresh() ->
    H0 = beamdiag_agent_file:new(4),
    Path = "/proc/self/stat",
    {{ok, A}, H1} = beamdiag_agent_file:read(Path, 4096, H0),
    ?assertEqual(1, beamdiag_agent_file:held(H1)),
    %% Burn some CPU: this process's utime moves, and the held read sees it.
    burn_until_utime_moves(utime(A)),
    {{ok, B}, H2} = beamdiag_agent_file:read(Path, 4096, H1),
    ?assertEqual(1, beamdiag_agent_file:held(H2)),
    ?assertNotEqual(A, B),
    %% The same file as a whole read: pid, name and state agree.
    {ok, Whole} = file:read_file(Path),
    ?assertEqual(head(Whole), head(B)),
    ok = beamdiag_agent_file:close(H2).

budget_is_respected_test() ->
    H0 = beamdiag_agent_file:new(1),
    {{ok, _}, H1} = beamdiag_agent_file:read("/proc/self/stat", 4096, H0),
    {{ok, _}, H2} = beamdiag_agent_file:read("/proc/self/statm", 4096, H1),
    ?assertEqual(1, beamdiag_agent_file:held(H2)),
    {{ok, _}, H3} = beamdiag_agent_file:read("/proc/stat", 65536, beamdiag_agent_file:none()),
    ?assertEqual(0, beamdiag_agent_file:held(H3)),
    ok = beamdiag_agent_file:close(H2).

errors_test() ->
    H0 = beamdiag_agent_file:new(4),
    {{error, enoent}, H1} = beamdiag_agent_file:read("/proc/self/no_such_file", 4096, H0),
    ?assertEqual(0, beamdiag_agent_file:held(H1)),
    {{error, too_large}, H2} = beamdiag_agent_file:read("/proc/self/maps", 8, H1),
    ?assertEqual(0, beamdiag_agent_file:held(H2)),
    {{error, too_large}, _} = beamdiag_agent_file:read("/proc/self/maps", 8, beamdiag_agent_file:none()).

keep_closes_gone_files_test() ->
    H0 = beamdiag_agent_file:new(8),
    {{ok, _}, H1} = beamdiag_agent_file:read("/proc/self/stat", 4096, H0),
    {{ok, _}, H2} = beamdiag_agent_file:read("/proc/self/statm", 4096, H1),
    {{ok, _}, H3} = beamdiag_agent_file:read("/proc/stat", 65536, H2),
    H4 = beamdiag_agent_file:keep("/proc/self", ["/proc/self/stat"], H3),
    %% statm is gone; /proc/stat is not under the directory and stays.
    ?assertEqual(2, beamdiag_agent_file:held(H4)),
    ok = beamdiag_agent_file:close(H4).

budget_from_limits_test() ->
    Root = filename:join(tmp(), "beamdiag_agent_file_tests_" ++ os:getpid()),
    Self = filename:join(Root, "self"),
    ok = filelib:ensure_path(Self),
    try
        Status = fun(FdSize) ->
            ok = file:write_file(filename:join(Self, "status"),
                                 ["Name:\tbeam.smp\nFDSize:\t", FdSize, "\nGroups:\t\n"])
        end,
        Limits = fun(Soft) ->
            ok = file:write_file(filename:join(Self, "limits"),
                                 ["Limit                     Soft Limit           Hard Limit           Units\n"
                                  "Max open files            ", Soft, "                 4096                 files\n"])
        end,
        Status("64"),
        Limits("1024"),
        ?assertEqual((1024 - 64) div 4, beamdiag_agent_file:budget(Root)),
        Limits("68"),
        ?assertEqual(1, beamdiag_agent_file:budget(Root)),
        Limits("60"),
        ?assertEqual(0, beamdiag_agent_file:budget(Root)),
        Limits("unlimited"),
        ?assertEqual(512, beamdiag_agent_file:budget(Root)),
        Limits("junk"),
        ?assertEqual(0, beamdiag_agent_file:budget(Root)),
        Limits("1024"),
        Status("many"),
        ?assertEqual(0, beamdiag_agent_file:budget(Root)),
        ok = file:delete(filename:join(Self, "status")),
        ?assertEqual(0, beamdiag_agent_file:budget(Root)),
        ?assertEqual(0, beamdiag_agent_file:budget(filename:join(Root, "nothing_here"))),
        ?assert(beamdiag_agent_file:budget("/proc") > 0)
    after
        _ = os:cmd("rm -rf '" ++ Root ++ "'")
    end.

%% The held path gives the same threads and counters as whole reads.
proc_threads_held_test() ->
    Pid = os:getpid(),
    H0 = beamdiag_agent_file:new(beamdiag_agent_file:budget("/proc")),
    {{ok, T1}, H1} = beamdiag_agent_procfs:threads("/proc", Pid, #{status => false}, H0),
    ?assertEqual(2 * map_size(T1), beamdiag_agent_file:held(H1)),
    {{ok, T2}, H2} = beamdiag_agent_procfs:threads("/proc", Pid, #{status => true}, H1),
    {ok, T3} = beamdiag_agent_procfs:threads("/proc", Pid, #{status => true}),
    ?assertEqual(lists:sort(maps:keys(T3)), lists:sort(maps:keys(T2))),
    [?assertEqual(maps:keys(maps:get(Tid, T3)), maps:keys(maps:get(Tid, T2))) || Tid <- maps:keys(T2)],
    {{ok, _}, H3} = beamdiag_agent_procfs:host("/proc", #{loadavg => true}, H2),
    ?assertEqual(2 * map_size(T1) + 2, beamdiag_agent_file:held(H3)),
    ok = beamdiag_agent_file:close(H3).

head(Bin) ->
    [Name, _] = binary:split(Bin, <<") ">>),
    Name.

tmp() ->
    case os:getenv("TMPDIR") of
        false -> "/tmp";
        D -> D
    end.

burn_until_utime_moves(U0) ->
    _ = lists:sum([X * X || X <- lists:seq(1, 200000)]),
    {ok, Now} = file:read_file("/proc/self/stat"),
    case utime(Now) > U0 of
        true -> ok;
        false -> burn_until_utime_moves(U0)
    end.

%% utime (clock ticks), the 14th field of /proc/PID/stat.
utime(Stat) ->
    [_, After] = string:split(Stat, ")", trailing),
    binary_to_integer(lists:nth(12, string:lexemes(After, " "))).
