%%% @doc What a BEAM's threads wait on in the kernel: for each thread that
%%% is not running, its `wchan' (the kernel function it sleeps in), the
%%% system call it sits in (/proc/PID/task/TID/syscall) and the file behind
%%% that call's descriptor or path argument.
%%%
%%% A descriptor resolves through the link /proc/PID/fd/N; a path argument
%%% (open, openat, stat...) lives in the process's memory and is read from
%%% /proc/PID/mem at the argument's address; a relative one is joined to
%%% the directory of its descriptor or to the thread's working directory.
%%% The mount that holds the file is the longest mount point of
%%% /proc/PID/mountinfo above it. No file is ever opened, read or stat'ed
%%% itself: a file on a hung mount would hang the reader too. The syscall
%%% file and the memory need ptrace's read access: the node's own user (the
%%% agent reads its own node) or root; without it a thread's `call' is
%%% `unknown' and only its state and `wchan' say what it waits on.
%%%
%%% Runs on the target node: `prim_file' only, a bounded number of reads.
%%%
%%% ```
%%% 1> beamdiag_agent_waits:read("/proc", "4242", [4250], #{}).
%%% #{4250 => #{wchan => <<"wait_for_partner">>,
%%%             call => #{name => <<"openat">>, nr => 257, args => [...]},
%%%             file => <<"/mnt/nfs/data/fifo">>,
%%%             mount => #{point => <<"/mnt/nfs">>, type => <<"nfs4">>, source => <<"srv:/x">>}}}
%%% '''
-module(beamdiag_agent_waits).

-export([read/4]).
%% Called by the tests only.
-ifdef(TEST).
-export([parse_syscall/1, parse_mountinfo/1, mount_of/2, syscall/2]).
-endif.

-export_type([wait/0, call/0, mount/0]).

-type call() :: #{name := binary(), nr := integer(), args := [non_neg_integer()]}.
-type mount() :: #{point := binary(), type := binary(), source := binary()}.
%% `call': the system call the thread sits in; `running' when the kernel
%% says it runs (it left the wait between two reads), `none' when it is
%% blocked outside a system call (a page fault), `unknown' when the
%% syscall file cannot be read.
-type wait() :: #{
    wchan := binary(),
    call := call() | running | none | unknown,
    file => binary(),
    mount => mount()
}.

%% Threads whose waits are read, at most.
-define(MAX_THREADS, 1024).
%% A /proc/.../wchan or syscall file: a line.
-define(MAX_SMALL, 512).
%% A path argument: PATH_MAX.
-define(MAX_PATH, 4096).
-define(PAGE, 4096).
%% /proc/PID/mountinfo, at most (a host with thousands of mounts).
-define(MAX_MOUNTINFO, 1048576).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The waits of the threads Tids of OS process Pid under /proc root
%% Root (at most 1024), by thread id; a thread that has gone is left out.
%% Options: `deadline' (monotonic milliseconds: the threads not read by
%% then are left out, and no file is resolved), `arch' (the system architecture, as
%% `erlang:system_info(system_architecture)' gives it; this VM's by
%% default), `resolve' (true: the file behind the call's argument and its
%% mount, for calls that have one).
-spec read(file:filename(), string() | integer(), [integer()],
           #{arch => string(), resolve => boolean(), deadline => integer() | infinity}) ->
    #{integer() => wait()}.
read(Root, Pid, Tids, Opts) ->
    P = filename:join(Root, to_list(Pid)),
    Arch = maps:get(arch, Opts, arch()),
    Resolve = maps:get(resolve, Opts, true),
    Deadline = maps:get(deadline, Opts, infinity),
    %% Within the deadline: the threads not read by then are left out.
    Waits = lists:foldl(fun(Tid, Acc) ->
                                case beamdiag_agent_deadline:in_time(Deadline) of
                                    true -> read_one(P, Tid, Arch, Acc);
                                    false -> Acc
                                end
                        end, #{}, lists:sublist(Tids, ?MAX_THREADS)),
    case Resolve andalso beamdiag_agent_deadline:in_time(Deadline) of
        true -> resolve(P, Waits, Arch);
        false -> Waits
    end.

%% One thread's wchan and system call.
read_one(P, Tid, Arch, Acc) ->
    Dir = filename:join([P, "task", integer_to_list(Tid)]),
    case small(filename:join(Dir, "wchan")) of
        {ok, W} ->
            Call = case small(filename:join(Dir, "syscall")) of
                       {ok, S} -> call(parse_syscall(S), Arch);
                       {error, _} -> unknown
                   end,
            Acc#{Tid => #{wchan => clean(W), call => Call}};
        {error, _} ->
            Acc
    end.

%% @doc Parses /proc/PID/task/TID/syscall: "NR ARG1 .. ARG6 SP PC" (hex
%% arguments), "-1 SP PC" (blocked outside a system call) or "running".
-spec parse_syscall(binary()) -> {ok, integer(), [non_neg_integer()]} | none | running | error.
parse_syscall(Bin) ->
    case binary:split(Bin, [<<" ">>, <<"\n">>], [global, trim_all]) of
        [<<"running">> | _] -> running;
        [<<"-1">> | _] -> none;
        [Nr, A1, A2, A3, A4, A5, A6 | _] ->
            try
                {ok, binary_to_integer(Nr), [hex(A) || A <- [A1, A2, A3, A4, A5, A6]]}
            catch
                error:badarg -> error
            end;
        _ ->
            error
    end.

%% @doc Parses /proc/PID/mountinfo into its mounts: mount point, file
%% system type and source (octal escapes such as `\040' undone).
-spec parse_mountinfo(binary()) -> [mount()].
parse_mountinfo(Bin) ->
    lists:append(
      [case binary:split(Line, <<" - ">>) of
           [Left, Right] ->
               case {binary:split(Left, <<" ">>, [global, trim_all]),
                     binary:split(Right, <<" ">>, [global, trim_all])} of
                   {[_Id, _Parent, _Dev, _Root, Point | _], [Type, Source | _]} ->
                       [#{point => unescape(Point), type => Type, source => unescape(Source)}];
                   _ ->
                       []
               end;
           _ ->
               []
       end || Line <- binary:split(Bin, <<"\n">>, [global, trim_all])]).

%% @doc The mount that holds an absolute path: the longest mount point
%% above it (the last one mounted there, when several are).
-spec mount_of(binary(), [mount()]) -> mount() | none.
mount_of(<<"/", _/binary>> = Path, Mounts) ->
    Above = [{byte_size(P), I, M} || {I, M = #{point := P}} <- lists:enumerate(Mounts),
                                     above(P, Path)],
    case lists:sort(Above) of
        [] -> none;
        Sorted -> element(3, lists:last(Sorted))
    end;
mount_of(_, _) ->
    none.

%% @doc A system call's name on an architecture, and which argument names
%% the file it works on: `{fd, I}' (a descriptor, argument I from 1),
%% `{path, I}' (a path), `{at, D, I}' (a path relative to descriptor
%% argument D), or `none'. Unknown numbers are named "syscall N".
-spec syscall(string(), integer()) ->
    {binary(), {fd, pos_integer()} | {path, pos_integer()} | {at, pos_integer(), pos_integer()}
               | none}.
syscall(Arch, Nr) ->
    Table = case Arch of
                "aarch64" ++ _ -> generic();
                "riscv64" ++ _ -> generic();
                _ -> x86_64()
            end,
    case lists:keyfind(Nr, 1, Table) of
        {_, Name, Target} -> {Name, Target};
        false -> {iolist_to_binary(["syscall ", integer_to_list(Nr)]), none}
    end.


%% This VM's system architecture.
arch() ->
    erlang:system_info(system_architecture).

%%%===================================================================
%%% Internal
%%%===================================================================

call({ok, Nr, Args}, Arch) ->
    {Name, _} = syscall(Arch, Nr),
    #{name => Name, nr => Nr, args => Args};
call(none, _) -> none;
call(running, _) -> running;
call(error, _) -> unknown.

%% The file behind each call's argument, and its mount (mountinfo read
%% once, only when a file was found).
resolve(P, Waits, Arch) ->
    %% The memory is opened only when a call has a path argument.
    Paths = [x || #{call := #{nr := Nr}} <- maps:values(Waits),
                  path_target(element(2, syscall(Arch, Nr)))],
    Mem = case Paths of
              [] -> none;
              _ -> memory_reader(P)
          end,
    Files = maps:map(fun(Tid, W = #{call := #{nr := Nr, args := Args}}) ->
                             case file(P, Tid, element(2, syscall(Arch, Nr)), Args, Mem) of
                                 {ok, F} -> W#{file => F};
                                 error -> W
                             end;
                        (_, W) ->
                             W
                     end, Waits),
    _ = close_mem(Mem),
    case [F || #{file := F = <<"/", _/binary>>} <- maps:values(Files)] of
        [] ->
            Files;
        _ ->
            Mounts = case read(filename:join(P, "mountinfo"), ?MAX_MOUNTINFO) of
                         {ok, B} -> parse_mountinfo(B);
                         {error, _} -> []
                     end,
            maps:map(fun(_, W = #{file := F}) ->
                             case mount_of(F, Mounts) of
                                 none -> W;
                                 M -> W#{mount => M}
                             end;
                        (_, W) ->
                             W
                     end, Files)
    end.

path_target({path, _}) -> true;
path_target({at, _, _}) -> true;
path_target(_) -> false.

file(P, _Tid, {fd, I}, Args, _Mem) ->
    fd_link(P, int32(lists:nth(I, Args)));
file(P, Tid, {path, I}, Args, Mem) ->
    relative(P, Tid, cwd, path(Mem, lists:nth(I, Args)));
file(P, Tid, {at, D, I}, Args, Mem) ->
    Dir = case int32(lists:nth(D, Args)) of
              -100 -> cwd;
              Fd -> {fd, Fd}
          end,
    relative(P, Tid, Dir, path(Mem, lists:nth(I, Args)));
file(_, _, none, _, _) ->
    error.

%% A path read from memory, made absolute: relative to the thread's
%% working directory, or to the directory of a descriptor.
relative(_P, _Tid, _Dir, error) ->
    error;
relative(_P, _Tid, _Dir, {ok, <<"/", _/binary>> = Path}) ->
    {ok, Path};
relative(P, Tid, Dir, {ok, Path}) ->
    Base = case Dir of
               cwd -> read_link(filename:join([P, "task", integer_to_list(Tid), "cwd"]));
               {fd, Fd} -> fd_link(P, Fd)
           end,
    case Base of
        {ok, <<"/", _/binary>> = B} -> {ok, iolist_to_binary([B, "/", Path])};
        _ -> {ok, Path}
    end.

fd_link(_P, Fd) when Fd < 0 ->
    error;
fd_link(P, Fd) ->
    read_link(filename:join([P, "fd", integer_to_list(Fd)])).

read_link(Path) ->
    case prim_file:read_link_all(Path) of
        {ok, L} when is_list(L) -> {ok, clean(unicode:characters_to_binary(L, unicode))};
        {ok, L} when is_binary(L) -> {ok, clean(L)};
        _ -> error
    end.

%% /proc/PID/mem, opened once for the paths of every thread of one read.
memory_reader(P) ->
    case prim_file:open(filename:join(P, "mem"), [read, binary]) of
        {ok, Fd} -> {ok, Fd};
        {error, _} -> none
    end.

close_mem({ok, Fd}) -> prim_file:close(Fd);
close_mem(none) -> ok.

%% A NUL-terminated string at Addr, read a page at a time (a read that
%% crosses into an unmapped page fails), at most PATH_MAX bytes.
path(none, _Addr) ->
    error;
path({ok, _}, 0) ->
    error;
path({ok, Fd}, Addr) ->
    path(Fd, Addr, <<>>).

path(_Fd, _Addr, Acc) when byte_size(Acc) >= ?MAX_PATH ->
    error;
path(Fd, Addr, Acc) ->
    Len = min(?PAGE - Addr rem ?PAGE, ?MAX_PATH - byte_size(Acc)),
    case prim_file:pread(Fd, Addr, Len) of
        {ok, Bin} ->
            case binary:split(Bin, <<0>>) of
                [Head, _] -> done(<<Acc/binary, Head/binary>>);
                [Head] when byte_size(Bin) =:= Len ->
                    path(Fd, Addr + Len, <<Acc/binary, Head/binary>>);
                _ -> error
            end;
        _ ->
            error
    end.

done(<<>>) -> error;
done(Path) -> {ok, clean(Path)}.

%% A descriptor argument: the low 32 bits, signed (an int in C).
int32(X) ->
    <<I:32/signed>> = <<(X band 16#ffffffff):32>>,
    I.

hex(<<"0x", H/binary>>) -> binary_to_integer(H, 16);
hex(H) -> binary_to_integer(H, 16).

small(Path) ->
    read(Path, ?MAX_SMALL).

read(Path, Max) ->
    element(1, beamdiag_agent_file:read(Path, Max, beamdiag_agent_file:none())).

above(<<"/">>, _) -> true;
above(Point, Path) ->
    N = byte_size(Point),
    case Path of
        Point -> true;
        <<Point:N/binary, "/", _/binary>> -> true;
        _ -> false
    end.

%% "\040" and the like, as the kernel escapes spaces, tabs, newlines and
%% backslashes in mountinfo.
unescape(B) ->
    unescape(B, <<>>).

unescape(<<"\\", A, B, C, Rest/binary>>, Acc)
  when A >= $0, A =< $3, B >= $0, B =< $7, C >= $0, C =< $7 ->
    unescape(Rest, <<Acc/binary, ((A - $0) * 64 + (B - $0) * 8 + (C - $0))>>);
unescape(<<X, Rest/binary>>, Acc) ->
    unescape(Rest, <<Acc/binary, X>>);
unescape(<<>>, Acc) ->
    Acc.

%% Printable ASCII, at most 4096 bytes: these names go into reports.
clean(B) ->
    T = beamdiag_agent_procfs:trim(binary:part(B, 0, min(byte_size(B), ?MAX_PATH))),
    << <<(case C of _ when C < 32; C > 126 -> $?; _ -> C end)>> || <<C>> <= T >>.

to_list(P) when is_integer(P) -> integer_to_list(P);
to_list(P) when is_list(P) -> P.

%% x86_64: {Number, Name, Target}. The calls a thread of a BEAM may sit in
%% for a long time, and those that work on a file.
x86_64() ->
    [{0, <<"read">>, {fd, 1}}, {1, <<"write">>, {fd, 1}}, {2, <<"open">>, {path, 1}},
     {3, <<"close">>, {fd, 1}}, {4, <<"stat">>, {path, 1}}, {5, <<"fstat">>, {fd, 1}},
     {6, <<"lstat">>, {path, 1}}, {7, <<"poll">>, none}, {8, <<"lseek">>, {fd, 1}},
     {16, <<"ioctl">>, {fd, 1}}, {17, <<"pread64">>, {fd, 1}}, {18, <<"pwrite64">>, {fd, 1}},
     {19, <<"readv">>, {fd, 1}}, {20, <<"writev">>, {fd, 1}}, {21, <<"access">>, {path, 1}},
     {23, <<"select">>, none}, {34, <<"pause">>, none}, {35, <<"nanosleep">>, none},
     {40, <<"sendfile">>, {fd, 2}}, {42, <<"connect">>, {fd, 1}}, {43, <<"accept">>, {fd, 1}},
     {44, <<"sendto">>, {fd, 1}}, {45, <<"recvfrom">>, {fd, 1}}, {46, <<"sendmsg">>, {fd, 1}},
     {47, <<"recvmsg">>, {fd, 1}}, {61, <<"wait4">>, none}, {72, <<"fcntl">>, {fd, 1}},
     {73, <<"flock">>, {fd, 1}}, {74, <<"fsync">>, {fd, 1}}, {75, <<"fdatasync">>, {fd, 1}},
     {76, <<"truncate">>, {path, 1}}, {77, <<"ftruncate">>, {fd, 1}},
     {78, <<"getdents">>, {fd, 1}}, {79, <<"getcwd">>, none}, {80, <<"chdir">>, {path, 1}},
     {82, <<"rename">>, {path, 1}}, {83, <<"mkdir">>, {path, 1}}, {84, <<"rmdir">>, {path, 1}},
     {85, <<"creat">>, {path, 1}}, {86, <<"link">>, {path, 1}}, {87, <<"unlink">>, {path, 1}},
     {88, <<"symlink">>, {path, 2}}, {89, <<"readlink">>, {path, 1}},
     {90, <<"chmod">>, {path, 1}}, {92, <<"chown">>, {path, 1}},
     {137, <<"statfs">>, {path, 1}}, {138, <<"fstatfs">>, {fd, 1}}, {162, <<"sync">>, none},
     {187, <<"readahead">>, {fd, 1}}, {202, <<"futex">>, none},
     {217, <<"getdents64">>, {fd, 1}}, {230, <<"clock_nanosleep">>, none},
     {232, <<"epoll_wait">>, none}, {257, <<"openat">>, {at, 1, 2}},
     {258, <<"mkdirat">>, {at, 1, 2}}, {262, <<"newfstatat">>, {at, 1, 2}},
     {263, <<"unlinkat">>, {at, 1, 2}}, {264, <<"renameat">>, {at, 1, 2}},
     {267, <<"readlinkat">>, {at, 1, 2}}, {269, <<"faccessat">>, {at, 1, 2}},
     {270, <<"pselect6">>, none}, {271, <<"ppoll">>, none}, {275, <<"splice">>, {fd, 1}},
     {277, <<"sync_file_range">>, {fd, 1}}, {281, <<"epoll_pwait">>, none},
     {285, <<"fallocate">>, {fd, 1}}, {288, <<"accept4">>, {fd, 1}},
     {295, <<"preadv">>, {fd, 1}}, {296, <<"pwritev">>, {fd, 1}}, {306, <<"syncfs">>, {fd, 1}},
     {316, <<"renameat2">>, {at, 1, 2}}, {326, <<"copy_file_range">>, {fd, 1}},
     {327, <<"preadv2">>, {fd, 1}}, {328, <<"pwritev2">>, {fd, 1}},
     {332, <<"statx">>, {at, 1, 2}}, {437, <<"openat2">>, {at, 1, 2}},
     {439, <<"faccessat2">>, {at, 1, 2}}, {441, <<"epoll_pwait2">>, none}].

%% The generic table (arm64, riscv64).
generic() ->
    [{17, <<"getcwd">>, none}, {22, <<"epoll_pwait">>, none}, {25, <<"fcntl">>, {fd, 1}},
     {29, <<"ioctl">>, {fd, 1}}, {32, <<"flock">>, {fd, 1}}, {34, <<"mkdirat">>, {at, 1, 2}},
     {35, <<"unlinkat">>, {at, 1, 2}}, {38, <<"renameat">>, {at, 1, 2}},
     {43, <<"statfs">>, {path, 1}}, {44, <<"fstatfs">>, {fd, 1}}, {45, <<"truncate">>, {path, 1}},
     {46, <<"ftruncate">>, {fd, 1}}, {47, <<"fallocate">>, {fd, 1}},
     {48, <<"faccessat">>, {at, 1, 2}}, {49, <<"chdir">>, {path, 1}},
     {56, <<"openat">>, {at, 1, 2}}, {57, <<"close">>, {fd, 1}},
     {61, <<"getdents64">>, {fd, 1}}, {62, <<"lseek">>, {fd, 1}}, {63, <<"read">>, {fd, 1}},
     {64, <<"write">>, {fd, 1}}, {65, <<"readv">>, {fd, 1}}, {66, <<"writev">>, {fd, 1}},
     {67, <<"pread64">>, {fd, 1}}, {68, <<"pwrite64">>, {fd, 1}},
     {71, <<"sendfile">>, {fd, 2}}, {72, <<"pselect6">>, none}, {73, <<"ppoll">>, none},
     {76, <<"splice">>, {fd, 1}}, {78, <<"readlinkat">>, {at, 1, 2}},
     {79, <<"newfstatat">>, {at, 1, 2}}, {80, <<"fstat">>, {fd, 1}}, {81, <<"sync">>, none},
     {82, <<"fsync">>, {fd, 1}}, {83, <<"fdatasync">>, {fd, 1}},
     {84, <<"sync_file_range">>, {fd, 1}}, {98, <<"futex">>, none},
     {101, <<"nanosleep">>, none}, {115, <<"clock_nanosleep">>, none},
     {202, <<"accept">>, {fd, 1}}, {203, <<"connect">>, {fd, 1}},
     {206, <<"sendto">>, {fd, 1}}, {207, <<"recvfrom">>, {fd, 1}},
     {211, <<"sendmsg">>, {fd, 1}}, {212, <<"recvmsg">>, {fd, 1}},
     {213, <<"readahead">>, {fd, 1}}, {242, <<"accept4">>, {fd, 1}},
     {260, <<"wait4">>, none}, {267, <<"syncfs">>, {fd, 1}},
     {276, <<"renameat2">>, {at, 1, 2}}, {285, <<"copy_file_range">>, {fd, 1}},
     {291, <<"statx">>, {at, 1, 2}}, {437, <<"openat2">>, {at, 1, 2}},
     {439, <<"faccessat2">>, {at, 1, 2}}, {441, <<"epoll_pwait2">>, none}].
