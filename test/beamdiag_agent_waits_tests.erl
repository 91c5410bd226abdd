%%% EUnit tests of beamdiag_agent_waits: the parsers of the syscall and
%%% mountinfo files, the system call tables, and the reader over a /proc
%%% tree made in a temporary folder (its `mem' a sparse file whose offset
%%% is the address of the path argument, its descriptors symbolic links).
-module(beamdiag_agent_waits_tests).
-include_lib("eunit/include/eunit.hrl").

parse_syscall_test_() ->
    [?_assertEqual(running, beamdiag_agent_waits:parse_syscall(<<"running\n">>)),
     ?_assertEqual(none, beamdiag_agent_waits:parse_syscall(<<"-1 0x7ffd3b4c 0x7f11aa00\n">>)),
     ?_assertEqual({ok, 257, [16#ffffff9c, 16#7fd0dee44cf0, 0, 0, 0, 16#fa0]},
                   beamdiag_agent_waits:parse_syscall(
                     <<"257 0xffffff9c 0x7fd0dee44cf0 0x0 0x0 0x0 0xfa0 0x7fd0df158b60 "
                       "0x7fd122316090\n">>)),
     ?_assertEqual(error, beamdiag_agent_waits:parse_syscall(<<"257 0xzz 0x0 0x0 0x0 0x0 0x0">>)),
     ?_assertEqual(error, beamdiag_agent_waits:parse_syscall(<<"257 0x1">>)),
     ?_assertEqual(error, beamdiag_agent_waits:parse_syscall(<<>>))].

%% Real lines (proc(5)'s example and this host's), an escaped space, and
%% a line without the separator.
parse_mountinfo_test() ->
    Bin = <<"36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 - ext3 /dev/root rw,errors=continue\n"
            "22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
            "40 22 0:35 / /mnt/my\\040data rw - nfs4 srv:/export\\040x rw,vers=4.2\n"
            "garbage line\n">>,
    ?assertEqual([#{point => <<"/mnt/parent">>, type => <<"ext3">>, source => <<"/dev/root">>},
                  #{point => <<"/">>, type => <<"ext4">>, source => <<"/dev/vda">>},
                  #{point => <<"/mnt/my data">>, type => <<"nfs4">>, source => <<"srv:/export x">>}],
                 beamdiag_agent_waits:parse_mountinfo(Bin)).

mount_of_test() ->
    Ms = beamdiag_agent_waits:parse_mountinfo(
           <<"1 0 0:1 / / rw - ext4 /dev/vda rw\n"
             "2 1 0:2 / /mnt/nfs rw - nfs4 srv:/a rw\n"
             "3 1 0:3 / /mnt/nfsx rw - tmpfs tmpfs rw\n"
             "4 2 0:4 / /mnt/nfs rw - nfs4 srv:/b rw\n">>),
    Point = fun(P) -> case beamdiag_agent_waits:mount_of(P, Ms) of
                          none -> none;
                          #{point := Pt, source := S} -> {Pt, S}
                      end
            end,
    %% The longest mount point above the path, the last mounted there.
    ?assertEqual({<<"/mnt/nfs">>, <<"srv:/b">>}, Point(<<"/mnt/nfs/data/f">>)),
    ?assertEqual({<<"/mnt/nfs">>, <<"srv:/b">>}, Point(<<"/mnt/nfs">>)),
    %% A prefix of the name is not a parent folder.
    ?assertEqual({<<"/mnt/nfsx">>, <<"tmpfs">>}, Point(<<"/mnt/nfsx/f">>)),
    ?assertEqual({<<"/">>, <<"/dev/vda">>}, Point(<<"/mnt/nf">>)),
    ?assertEqual(none, Point(<<"pipe:[123]">>)).

syscall_tables_test_() ->
    [?_assertEqual({<<"openat">>, {at, 1, 2}}, beamdiag_agent_waits:syscall("x86_64-pc-linux-gnu", 257)),
     ?_assertEqual({<<"openat">>, {at, 1, 2}},
                   beamdiag_agent_waits:syscall("aarch64-unknown-linux-gnu", 56)),
     ?_assertEqual({<<"fsync">>, {fd, 1}}, beamdiag_agent_waits:syscall("x86_64-pc-linux-gnu", 74)),
     ?_assertEqual({<<"fsync">>, {fd, 1}},
                   beamdiag_agent_waits:syscall("aarch64-unknown-linux-gnu", 82)),
     ?_assertEqual({<<"futex">>, none}, beamdiag_agent_waits:syscall("x86_64-pc-linux-gnu", 202)),
     ?_assertEqual({<<"syscall 9999">>, none},
                   beamdiag_agent_waits:syscall("x86_64-pc-linux-gnu", 9999))].

%% Every number appears once per table, and every name is a name.
syscall_tables_well_formed_test() ->
    [begin
         Names = [element(1, beamdiag_agent_waits:syscall(Arch, N)) || N <- lists:seq(0, 500)],
         Known = [N || N <- Names, binary:match(N, <<"syscall ">>) =:= nomatch],
         ?assert(length(Known) > 40),
         ?assertEqual(length(Known), length(lists:usort(Known)))
     end || Arch <- ["x86_64-pc-linux-gnu", "aarch64-unknown-linux-gnu"]].

%% A /proc tree: thread 11 blocked in openat of a relative path under its
%% working directory, 12 in read of descriptor 5, 13 in futex (no file),
%% 14 gone between the listing and the read, 15 with an unreadable
%% syscall file (no access), 16 in openat of an absolute path at an
%% address near a page's end.
reader_test() ->
    Root = tmp(),
    try
        P = filename:join(Root, "77"),
        Task = fun(Tid, Wchan, Syscall) ->
                   D = filename:join([P, "task", integer_to_list(Tid)]),
                   ok = filelib:ensure_dir(filename:join(D, "x")),
                   ok = file:write_file(filename:join(D, "wchan"), Wchan),
                   _ = case Syscall of
                           none -> ok;
                           _ -> file:write_file(filename:join(D, "syscall"), Syscall)
                       end,
                   D
               end,
        D11 = Task(11, <<"wait_for_partner">>,
                   <<"257 0xffffff9c 0x2000 0x0 0x0 0x0 0xfa0 0x0 0x0\n">>),
        ok = file:make_symlink("/srv/data", filename:join(D11, "cwd")),
        Task(12, <<"rpc_wait_bit_killable">>, <<"0 0x5 0x7f00 0x1000 0x0 0x0 0x0 0x0 0x0\n">>),
        Task(13, <<"futex_do_wait">>, <<"202 0x55b4 0x80 0x0 0x0 0x0 0x0 0x0 0x0\n">>),
        Task(15, <<"pipe_read">>, none),
        Task(16, <<"wait_for_partner">>,
             <<"257 0xffffff9c 0x2ff8 0x0 0x0 0x0 0x0 0x0 0x0\n">>),
        ok = filelib:ensure_dir(filename:join([P, "fd", "x"])),
        ok = file:make_symlink("/mnt/nfs/db/wal.log", filename:join([P, "fd", "5"])),
        %% The process's memory: the relative path at 0x2000, an absolute
        %% one crossing the page boundary at 0x3000.
        {ok, Mem} = file:open(filename:join(P, "mem"), [write, raw, binary]),
        ok = file:pwrite(Mem, 16#2000, <<"spool/fifo", 0, "junk">>),
        ok = file:pwrite(Mem, 16#2ff8, <<"/mnt/nfs/x/y", 0>>),
        ok = file:close(Mem),
        ok = file:write_file(filename:join(P, "mountinfo"),
                             <<"1 0 0:1 / / rw - ext4 /dev/vda rw\n"
                               "2 1 0:2 / /mnt/nfs rw - nfs4 srv:/a rw\n">>),
        W = beamdiag_agent_waits:read(Root, 77, [11, 12, 13, 14, 15, 16],
                                      #{arch => "x86_64-pc-linux-gnu"}),
        ?assertEqual([11, 12, 13, 15, 16], lists:sort(maps:keys(W))),
        ?assertMatch(#{call := #{name := <<"openat">>, nr := 257},
                       file := <<"/srv/data/spool/fifo">>, wchan := <<"wait_for_partner">>,
                       mount := #{point := <<"/">>}}, maps:get(11, W)),
        ?assertMatch(#{call := #{name := <<"read">>}, file := <<"/mnt/nfs/db/wal.log">>,
                       mount := #{point := <<"/mnt/nfs">>, type := <<"nfs4">>,
                                  source := <<"srv:/a">>}}, maps:get(12, W)),
        ?assertEqual(#{call => #{name => <<"futex">>, nr => 202, args => [16#55b4, 16#80, 0, 0, 0, 0]},
                       wchan => <<"futex_do_wait">>}, maps:get(13, W)),
        ?assertEqual(#{call => unknown, wchan => <<"pipe_read">>}, maps:get(15, W)),
        ?assertMatch(#{file := <<"/mnt/nfs/x/y">>}, maps:get(16, W)),
        %% Without resolving, no file is looked for.
        W2 = beamdiag_agent_waits:read(Root, "77", [12], #{resolve => false,
                                                          arch => "x86_64-pc-linux-gnu"}),
        ?assertNot(maps:is_key(file, maps:get(12, W2)))
    after
        file:del_dir_r(Root)
    end.

%% This VM's own threads, read as the agent reads its node: every thread
%% not running has a wchan and a call (the same user may read its own).
own_threads_test() ->
    {ok, Names} = file:list_dir("/proc/self/task"),
    Tids = [list_to_integer(N) || N <- Names],
    W = beamdiag_agent_waits:read("/proc", os:getpid(), Tids, #{}),
    ?assert(map_size(W) >= length(Tids) - 1),
    ?assert(lists:any(fun(#{call := #{name := <<"futex">>}}) -> true; (_) -> false end,
                      maps:values(W))).

tmp() ->
    D = filename:join(case os:getenv("TMPDIR") of false -> "/tmp"; T -> T end,
                      "beamdiag_waits_" ++ os:getpid() ++ "_" ++
                          integer_to_list(erlang:unique_integer([positive]))),
    ok = filelib:ensure_dir(filename:join(D, "x")),
    D.
