%%% @doc cgroup v1 and v2: the CPU quota a process lives under and its
%%% throttling counters.
%%%
%%% `locate/2' finds the process's CPU cgroup directory once; `read/1' reads
%%% quota and counters from it each tick. Parsers are pure.
%%%
%%% ```
%%% 1> {ok, Cg} = beamdiag_agent_cgroup:locate("/proc", os:getpid()).
%%% {ok, #{version => 1, dir => "/sys/fs/cgroup/cpu/..."}}
%%% 2> beamdiag_agent_cgroup:read(Cg).
%%% {ok, #{quota_cpus => 2.0, nr_periods => 10, nr_throttled => 3, throttled_ns => ...}}
%%% '''
-module(beamdiag_agent_cgroup).

-export([locate/2, locate_both/2, read/1, read/3, memory_room/2]).
-export([format_error/1]).
%% Called by the tests only.
-ifdef(TEST).
-export([locate/3, parse_proc_cgroup/1, parse_mountinfo/1, parse_cpu_max/1, parse_cpu_stat/2]).
-endif.

-export_type([location/0, memory_location/0, stat/0, room/0]).

-type location() :: #{version := 1 | 2, dir := file:filename()}.
%% The memory cgroup's limit and usage files, or none.
-type memory_location() :: {file:filename(), file:filename()} | none.
-type stat() :: #{
    version := 1 | 2,
    quota_cpus := float() | unlimited,
    period_us => non_neg_integer(),
    nr_periods => non_neg_integer(),
    nr_throttled => non_neg_integer(),
    throttled_ns => non_neg_integer(),
    usage_ns => non_neg_integer()
}.

%% cpu.stat's counters, in common keys (nanoseconds).
-type cpu_counters() :: #{
    nr_periods => integer(),
    nr_throttled => integer(),
    throttled_ns => integer(),
    usage_ns => integer()
}.
%% memory_room/2: the host's memory (bytes), the memory cgroup's limit and
%% usage when it has a limit, and the smaller room with what bounds it.
-type room() :: #{
    mem_total => non_neg_integer(),
    mem_available => non_neg_integer(),
    limit => integer(),
    usage => integer(),
    room => non_neg_integer(),
    bound_by => host | cgroup
}.

%% Larger numbers in cgroup files are junk; dividing them would overflow.
%% cpu.stat and friends are a few lines.
-define(MAX_FILE, 65536).
-define(INT_MAX, (1 bsl 62)).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Finds the CPU cgroup of a process from /proc/PID/cgroup and
%% /proc/PID/mountinfo.
-spec locate(file:filename(), string() | integer()) ->
    {ok, location()} | {error, {beamdiag_agent_cgroup, term()}}.
locate(ProcRoot, Pid) ->
    locate(ProcRoot, Pid, "").

%% @doc As locate/2, with a prefix put before the mount points found (tests
%% point it at a recorded tree).
-spec locate(file:filename(), string() | integer(), file:filename()) ->
    {ok, location()} | {error, {beamdiag_agent_cgroup, term()}}.
locate(ProcRoot, Pid, Prefix) ->
    case hierarchy(ProcRoot, Pid) of
        {ok, Cgroups, Mounts} -> choose(Cgroups, Mounts, Prefix);
        {error, _} = E -> E
    end.

%% @doc As locate/2, and the memory cgroup's files (for memory_room/2),
%% from one read of /proc/PID/cgroup and /proc/PID/mountinfo.
-spec locate_both(file:filename(), string() | integer()) ->
    {{ok, location()} | {error, {beamdiag_agent_cgroup, term()}}, memory_location()}.
locate_both(ProcRoot, Pid) ->
    case hierarchy(ProcRoot, Pid) of
        {ok, Cgroups, Mounts} -> {choose(Cgroups, Mounts, ""), memory_location(Cgroups, Mounts)};
        {error, _} = E -> {E, none}
    end.

hierarchy(ProcRoot, Pid) ->
    PidDir = filename:join(ProcRoot, to_list(Pid)),
    case {read_file(filename:join(PidDir, "cgroup")), read_file(filename:join(PidDir, "mountinfo"))} of
        {{ok, CgBin}, {ok, MiBin}} ->
            {ok, parse_proc_cgroup(CgBin), parse_mountinfo(MiBin)};
        {{error, _}, _} ->
            {error, {beamdiag_agent_cgroup, no_cgroup}};
        {_, {error, _}} ->
            {error, {beamdiag_agent_cgroup, no_mountinfo}}
    end.

%% @doc Reads the quota and the throttling counters.
-spec read(location()) -> {ok, stat()} | {error, {beamdiag_agent_cgroup, term()}}.
read(L) ->
    element(1, read(L, undefined, beamdiag_agent_file:none())).

%% @doc As read/1, reading through (and updating) held descriptors; given
%% the quota of a sample before (its `quota_cpus' and
%% `period_us'), reads the throttling counters alone: one file instead of
%% two or three (the quota is read at the window's ends).
-spec read(location(), stat() | undefined, beamdiag_agent_file:held()) ->
    {{ok, stat()} | {error, {beamdiag_agent_cgroup, term()}}, beamdiag_agent_file:held()}.
read(#{version := V, dir := Dir}, #{quota_cpus := Q, period_us := P, version := V}, H0) ->
    stat(V, Dir, {Q, P}, H0);
read(#{version := 2, dir := Dir}, _Before, H0) ->
    {Quota, H1} =
        case read_file(filename:join(Dir, "cpu.max"), H0) of
            {{ok, Max}, H} -> {parse_cpu_max(Max), H};
            {{error, _}, H} -> {{unlimited, 100000}, H}
        end,
    stat(2, Dir, Quota, H1);
read(#{version := 1, dir := Dir}, _Before, H0) ->
    {Q, H1} = read_int(filename:join(Dir, "cpu.cfs_quota_us"), H0),
    {P, H2} = read_int(filename:join(Dir, "cpu.cfs_period_us"), H1),
    Quota =
        case {Q, P} of
            {{ok, Qi}, {ok, Pi}} when Qi > 0, Pi > 0, Qi < ?INT_MAX, Pi < ?INT_MAX -> {Qi / Pi, Pi};
            {_, {ok, Pi}} -> {unlimited, period(Pi)};
            _ -> {unlimited, 100000}
        end,
    stat(1, Dir, Quota, H2).

%% @doc Parses /proc/PID/cgroup into `{v2, Path}' and `{v1, Controllers, Path}' entries.
-spec parse_proc_cgroup(binary()) -> [{v2, binary()} | {v1, [binary()], binary()}].
parse_proc_cgroup(Bin) ->
    lists:filtermap(
        fun(Line) ->
            case binary:split(Line, <<":">>, [global]) of
                [<<"0">>, <<>>, Path] -> {true, {v2, Path}};
                [_, Ctrls, Path] when Ctrls =/= <<>> ->
                    {true, {v1, binary:split(Ctrls, <<",">>, [global]), Path}};
                _ -> false
            end
        end,
        binary:split(Bin, <<"\n">>, [global, trim_all])
    ).

%% @doc Parses /proc/PID/mountinfo into cgroup mounts:
%% `{Version, Root, MountPoint, SuperOptions}'.
-spec parse_mountinfo(binary()) -> [{1 | 2, binary(), binary(), [binary()]}].
parse_mountinfo(Bin) ->
    lists:filtermap(
        fun(Line) ->
            case binary:split(Line, <<" - ">>) of
                [Left, Right] ->
                    L = binary:split(Left, <<" ">>, [global, trim_all]),
                    R = binary:split(Right, <<" ">>, [global, trim_all]),
                    case {L, R} of
                        {[_, _, _, Root, Mount | _], [<<"cgroup2">>, _ | _]} ->
                            {true, {2, Root, Mount, []}};
                        {[_, _, _, Root, Mount | _], [<<"cgroup">>, _, Opts | _]} ->
                            {true, {1, Root, Mount, binary:split(Opts, <<",">>, [global])}};
                        _ ->
                            false
                    end;
                _ ->
                    false
            end
        end,
        binary:split(Bin, <<"\n">>, [global, trim_all])
    ).

%% @doc Parses cgroup v2 cpu.max ("max 100000" or "200000 100000") into
%% `{QuotaCpus | unlimited, PeriodUs}'.
-spec parse_cpu_max(binary()) -> {float() | unlimited, pos_integer()}.
parse_cpu_max(Bin) ->
    case binary:split(beamdiag_agent_procfs:trim(Bin), <<" ">>, [global, trim_all]) of
        [<<"max">>, P] -> {unlimited, period(to_int(P, 100000))};
        [Q, P] ->
            case {to_int(Q, 0), to_int(P, 0)} of
                {Qi, Pi} when Qi > 0, Pi > 0, Qi < ?INT_MAX, Pi < ?INT_MAX -> {Qi / Pi, Pi};
                _ -> {unlimited, 100000}
            end;
        _ -> {unlimited, 100000}
    end.

%% @doc Parses cpu.stat of either version into common keys (nanoseconds).
-spec parse_cpu_stat(1 | 2, binary()) -> cpu_counters().
parse_cpu_stat(Version, Bin) ->
    lists:foldl(
        fun(Line, Acc) ->
            case binary:split(Line, <<" ">>) of
                [K, V] ->
                    case {stat_key(Version, K), to_int(V, undefined)} of
                        {{Key, Mult}, I} when is_integer(I) -> Acc#{Key => I * Mult};
                        _ -> Acc
                    end;
                _ ->
                    Acc
            end
        end,
        #{},
        binary:split(Bin, <<"\n">>, [global, trim_all])
    ).

%% @doc Turns an error reason of this module into a sentence.
-spec format_error(term()) -> iolist().
format_error(no_cgroup) -> "no cgroup information (/proc/PID/cgroup unreadable)";
format_error(no_mountinfo) -> "no mount information (/proc/PID/mountinfo unreadable)";
format_error(no_cpu_controller) -> "no CPU cgroup controller mounted";
format_error({unreadable, Dir}) -> io_lib:format("cannot read the cgroup's cpu.stat in ~ts", [Dir]).

%% @doc The memory the node can still take, read once (at the window's
%% end): the host's `MemAvailable' and, when the node's memory cgroup has a
%% limit, the limit less the cgroup's usage (v2: memory.max and
%% memory.current; v1: memory.limit_in_bytes and memory.usage_in_bytes);
%% `room' is the smaller, `bound_by' says which. Bytes.
-spec memory_room(file:filename(), memory_location()) -> room().
memory_room(ProcRoot, MemLoc) ->
    Host = case read_file(filename:join(ProcRoot, "meminfo")) of
               {ok, Mi} -> parse_meminfo(Mi);
               {error, _} -> #{}
           end,
    Cg = cgroup_memory(MemLoc),
    Avail = maps:get(mem_available, Host, undefined),
    CgRoom = case Cg of
                 #{limit := L, usage := U} -> max(0, L - U);
                 _ -> undefined
             end,
    Base = maps:merge(Host, Cg),
    case {Avail, CgRoom} of
        {undefined, undefined} -> Base;
        {A, C} when C =:= undefined; is_integer(A), A =< C -> Base#{room => A, bound_by => host};
        {_, C} -> Base#{room => C, bound_by => cgroup}
    end.

%% @doc MemTotal and MemAvailable from /proc/meminfo, in bytes.
-spec parse_meminfo(binary()) -> #{mem_total => non_neg_integer(), mem_available => non_neg_integer()}.
parse_meminfo(Bin) ->
    maps:from_list(
      [{Key, list_to_integer(binary_to_list(N)) * 1024}
       || Line <- binary:split(Bin, <<"\n">>, [global]),
          [Name, N | _] <- [binary:split(Line, [<<" ">>], [global, trim_all])],
          {Want, Key} <- [{<<"MemTotal:">>, mem_total}, {<<"MemAvailable:">>, mem_available}],
          Name =:= Want,
          is_digits(N)]).

is_digits(<<>>) -> false;
is_digits(B) -> lists:all(fun(C) -> C >= $0 andalso C =< $9 end, binary_to_list(B)).

%% The memory cgroup's limit and usage files (v1 or v2).
memory_location(Cgroups, Mounts) ->
    V1 = [{filename:join(Dir, "memory.limit_in_bytes"), filename:join(Dir, "memory.usage_in_bytes")}
          || {v1, Ctrls, Path} <- Cgroups, lists:member(<<"memory">>, Ctrls),
             {1, Root, Mount, Opts} <- Mounts, lists:member(<<"memory">>, Opts),
             Dir <- [dir("", Mount, Root, Path)]],
    V2 = [{filename:join(Dir, "memory.max"), filename:join(Dir, "memory.current")}
          || {v2, Path} <- Cgroups, {2, Root, Mount, _} <- Mounts,
             Dir <- [dir("", Mount, Root, Path)]],
    case V1 ++ V2 of
        [Files | _] -> Files;
        [] -> none
    end.

%% The memory cgroup's limit and usage, when it has a limit.
cgroup_memory({LimitFile, UsageFile}) ->
    case {number_file(LimitFile), number_file(UsageFile)} of
        %% v1 writes a huge number for no limit.
        {L, U} when is_integer(L), is_integer(U), L < 1 bsl 60 -> #{limit => L, usage => U};
        _ -> #{}
    end;
cgroup_memory(none) ->
    #{}.

number_file(Path) ->
    case read_file(Path) of
        {ok, B} ->
            case string:to_integer(string:trim(binary_to_list(B))) of
                {N, []} -> N;
                _ -> undefined
            end;
        {error, _} ->
            undefined
    end.

%%%===================================================================
%%% Internal
%%%===================================================================

choose(Cgroups, Mounts, Prefix) ->
    V2 = [{Path, Root, Mount} || {v2, Path} <- Cgroups, {2, Root, Mount, _} <- Mounts],
    V1 = [{Path, Root, Mount}
          || {v1, Ctrls, Path} <- Cgroups,
             lists:member(<<"cpu">>, Ctrls),
             {1, Root, Mount, Opts} <- Mounts,
             lists:member(<<"cpu">>, Opts)],
    case {V1, V2} of
        {[{Path, Root, Mount} | _], _} ->
            {ok, #{version => 1, dir => dir(Prefix, Mount, Root, Path)}};
        {[], [{Path, Root, Mount} | _]} ->
            {ok, #{version => 2, dir => dir(Prefix, Mount, Root, Path)}};
        {[], []} ->
            {error, {beamdiag_agent_cgroup, no_cpu_controller}}
    end.

%% The cgroup path is relative to the hierarchy's root; the mount shows the
%% part of the hierarchy under Root, so strip Root from Path.
dir(Prefix, Mount, Root, Path) ->
    Rel =
        case {Root, Path} of
            {<<"/">>, _} -> Path;
            _ ->
                case binary:match(Path, Root) of
                    {0, N} -> binary:part(Path, N, byte_size(Path) - N);
                    _ -> <<"/">>
                end
        end,
    Full = filename:join([Prefix ++ binary_to_list(Mount), "." ++ binary_to_list(Rel)]),
    Clean = filename:join(filename:split(Full) -- ["."]),
    case prim_file:read_file_info(Clean) of
        {ok, _} -> Clean;
        %% In a container the cgroup path seen from outside is not mounted
        %% inside: the mount itself is the process's cgroup.
        {error, _} -> Prefix ++ binary_to_list(Mount)
    end.

%% A CFS period is a positive number of microseconds (at most a second in
%% practice); anything else is junk and gets the kernel's default.
period(P) when is_integer(P), P > 0, P < ?INT_MAX -> P;
period(_) -> 100000.

with_quota(Stat, {Quota, Period}, Version) ->
    Stat#{version => Version, quota_cpus => Quota, period_us => Period}.

stat_key(_, <<"nr_periods">>) -> {nr_periods, 1};
stat_key(_, <<"nr_throttled">>) -> {nr_throttled, 1};
stat_key(1, <<"throttled_time">>) -> {throttled_ns, 1};
stat_key(2, <<"throttled_usec">>) -> {throttled_ns, 1000};
stat_key(2, <<"usage_usec">>) -> {usage_ns, 1000};
stat_key(_, _) -> undefined.

stat(Version, Dir, Quota, H0) ->
    case read_file(filename:join(Dir, "cpu.stat"), H0) of
        {{ok, Bin}, H} -> {{ok, with_quota(parse_cpu_stat(Version, Bin), Quota, Version)}, H};
        {{error, _}, H} -> {{error, {beamdiag_agent_cgroup, {unreadable, Dir}}}, H}
    end.

read_file(File) ->
    element(1, read_file(File, beamdiag_agent_file:none())).

read_file(File, H) ->
    beamdiag_agent_file:read(File, ?MAX_FILE, H).

read_int(File, H0) ->
    case read_file(File, H0) of
        {{ok, Bin}, H} ->
            case to_int(beamdiag_agent_procfs:trim(Bin), undefined) of
                undefined -> {{error, bad}, H};
                I -> {{ok, I}, H}
            end;
        {E, H} ->
            {E, H}
    end.

to_int(B, Default) ->
    try binary_to_integer(beamdiag_agent_procfs:trim(B)) of
        I -> I
    catch
        error:badarg -> Default
    end.

to_list(P) when is_integer(P) -> integer_to_list(P);
to_list(P) when is_list(P) -> P.
