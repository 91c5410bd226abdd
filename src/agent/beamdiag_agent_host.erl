%%% @doc The rest of the host, as the target's own /proc shows it: the CPU
%%% time of every other process (to name what competes with the node for
%%% CPUs) and the CPUs the node may run on. Runs on the target node.
%%%
%%% The scan reads one stat file per process, at most `?MAX_PROCS' of them,
%%% through `prim_file' (never the file server, a normal-priority process
%%% that waits behind every busy process of an overloaded node). Each read
%%% is a dirty IO job, and on a starved node every one waits for a CPU: a
%%% scan of 150 processes took 3 s there, one file after another. So a scan
%%% reads in eight processes at once, and the scans run in a process of
%%% their own, beside the agent's ticks, and only once the rest of the host
%%% is seen using CPU (probed from /proc/stat): one then, one timed to end
%%% with the window, each process's reading stamped with its
%%% own time, so that its CPU share is taken over its own interval
%%% whatever the scans took.
%%%
%%% ```
%%% 1> S = beamdiag_agent_host:start("/proc", [], erlang:monotonic_time(millisecond) + 2000).
%%% 2> beamdiag_agent_host:result(S, 500).
%%% #{first => #{1 => {<<"init">>, 1234, -576460750123}, ...}, last => #{...}, ...}
%%% 3> beamdiag_agent_host:placement("/proc").
%%% #{cpus_allowed => <<"0-1">>}
%%% '''
-module(beamdiag_agent_host).

-export([start/3, result/2, usage/2, busy/1, placement/1, cpu_by_process/3]).

-export_type([scan/0, readings/0]).

%% Processes read per scan; a host with more is read in part (the first
%% ones /proc lists) and says so.
-define(MAX_PROCS, 1000).
%% The scans start once the rest of the host uses this many CPUs, probed
%% this long after the start and then this often, while this much of the
%% window is left.
-define(BUSY_CPUS, 0.1).
-define(FIRST_PROBE_MS, 300).
-define(PROBE_MS, 1000).
-define(SCAN_MIN_MS, 1000).
%% Processes reading the stat files at once, and how long after its
%% deadline a reader still reading is ended.
-define(READERS, 8).
-define(READER_GRACE_MS, 200).

%% Pid => {comm, CPU time in clock ticks (utime + stime), monotonic ms}.
-type readings() :: #{integer() => {binary(), non_neg_integer(), integer()}}.
%% truncated: the host had more processes than a scan reads, or the last
%% scan was asked for its readings before it had read them all.
-type scan() :: #{first := readings(), last := readings(), truncated := boolean()}.

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Gives the scanner a tick's figures: the monotonic time in ms, the
%% host's busy CPU time (/proc/stat) and the node's own (its stat), both
%% in clock ticks; the scanner uses them while it waits for the rest of
%% the host to be busy, and ignores them after.
-spec usage(pid(), {integer(), non_neg_integer(), non_neg_integer()}) -> ok.
usage(Scanner, U = {_, _, _}) ->
    Scanner ! {usage, U},
    ok.

%% @doc The host's busy CPU time (user, nice, system, irq and softirq,
%% summed over CPUs, clock ticks) of /proc/stat's figures.
-spec busy(#{atom() => non_neg_integer()}) -> non_neg_integer().
busy(Cpu) ->
    lists:sum([maps:get(K, Cpu, 0) || K <- [user, nice, system, irq, softirq]]).

%% @doc Starts the scans, linked to the caller: the first now, the last
%% timed to end at End (monotonic milliseconds), leaving out the given
%% pids.
-spec start(file:filename(), [integer()], integer()) -> pid().
start(Root, Exclude, End) ->
    Owner = self(),
    spawn_opt(fun() -> scanner(Owner, Root, Exclude, End) end, [link, {priority, high}]).

%% @doc What the scans gathered, waiting up to Timeout milliseconds for
%% the last scan to end; a scan still running answers with what it has
%% read. `undefined' when the scanner is gone.
-spec result(pid(), non_neg_integer()) -> scan() | undefined.
result(Pid, Timeout) ->
    MRef = erlang:monitor(process, Pid),
    Pid ! {result, self(), MRef, erlang:monotonic_time(millisecond) + Timeout},
    receive
        {MRef, Scan} ->
            erlang:demonitor(MRef, [flush]),
            unlink(Pid),
            exit(Pid, kill),
            Scan;
        {'DOWN', MRef, process, Pid, _} ->
            undefined
    after Timeout + 200 ->
        erlang:demonitor(MRef, [flush]),
        unlink(Pid),
        exit(Pid, kill),
        undefined
    end.

%% @doc One scan: each process's comm, CPU time and when it was read,
%% stopping at Deadline (monotonic milliseconds, or `infinity'); processes
%% that end between listing and reading are skipped.
-spec cpu_by_process(file:filename(), [integer()], integer() | infinity) ->
    #{procs := readings(), truncated := boolean()}.
cpu_by_process(Root, Exclude, Deadline) ->
    Pids = case prim_file:list_dir(Root) of
               {ok, Names} -> [P || N <- Names, P <- pid(N), not lists:member(P, Exclude)];
               {error, _} -> []
           end,
    {Procs, Left} = read_pids(Root, lists:sublist(Pids, ?MAX_PROCS), Deadline, #{}),
    #{procs => Procs, truncated => length(Pids) > ?MAX_PROCS orelse Left}.

%% @doc Where this node runs: the CPUs it may run on (its affinity, set by
%% a cpuset or taskset), from /proc/self/status, and its host as it sees
%% it: the kernel's boot id (the same for every process of one running
%% kernel, containers included) and the host name, from /proc/sys/kernel.
%% A file that cannot be read leaves its key out.
-spec placement(file:filename()) ->
    #{cpus_allowed => binary(), boot_id => binary(), hostname => binary()}.
placement(Root) ->
    Cpus = case prim_file:read_file(filename:join([Root, "self", "status"])) of
               {ok, Bin} ->
                   case re:run(Bin, "^Cpus_allowed_list:\\s*(\\S+)", [multiline, {capture, [1], binary}]) of
                       {match, [L]} -> #{cpus_allowed => L};
                       nomatch -> #{}
                   end;
               {error, _} ->
                   #{}
           end,
    maps:merge(Cpus, maps:from_list(
                       [{K, V} || {K, File} <- [{boot_id, ["sys", "kernel", "random", "boot_id"]},
                                                {hostname, ["sys", "kernel", "hostname"]}],
                                  V <- first_line(filename:join([Root | File]))])).

%%%===================================================================
%%% Internal
%%%===================================================================

%% The scans wait for the rest of the host to use ?BUSY_CPUS or more
%% (the host's busy CPU time less the node's own, from /proc/stat and
%% /proc/self/stat, where a scan reads a file per process on the host, two
%% hundred dirty-IO jobs on a small host and the most costly part of a
%% session when nothing else runs there, and then there is nothing to
%% name). The first probe reads them itself, ?FIRST_PROBE_MS after the
%% start (two reads); the later ones take the same figures from the agent's
%% ticks (usage/2: the agent reads both every tick anyway), while the
%% window has ?SCAN_MIN_MS left for two scans.
scanner(Owner, Root, Exclude, End) ->
    U0 = usage(Root),
    receive
        {result, From, Ref, _} ->
            From ! {Ref, #{first => #{}, last => #{}, truncated => false}}
    after ?FIRST_PROBE_MS ->
        probed(Owner, Root, Exclude, End, U0, usage(Root))
    end.

probed(Owner, Root, Exclude, End, U0, U1) ->
    case rest_cpus(U0, U1) of
        Rest when is_float(Rest), Rest >= ?BUSY_CPUS ->
            scan(Owner, Root, Exclude, End);
        _ ->
            Left = beamdiag_agent_deadline:left(End) >= ?SCAN_MIN_MS + ?PROBE_MS,
            receive
                {result, From, Ref, _} ->
                    From ! {Ref, #{first => #{}, last => #{}, truncated => false}};
                {usage, U2} when Left ->
                    probed(Owner, Root, Exclude, End, newer(U1, U0), U2)
            end
    end.

%% The baseline for the next probe: the later of two usages (a tick's may
%% be older than the scanner's own first probe), or the one that could be
%% read.
newer({T1, _, _} = U1, {T0, _, _}) when T1 > T0 -> U1;
newer(U1, undefined) -> U1;
newer(_U1, U0) -> U0.

%% When, the host's busy CPU time (user, nice, system, irq and softirq,
%% summed over CPUs) and the node's own, in clock ticks; `undefined' when
%% either cannot be read.
usage(Root) ->
    case {beamdiag_agent_procfs:cpu_times(Root), read_stat(filename:join([Root, "self", "stat"]))} of
        {{ok, #{cpu := Cpu}}, {ok, {_, Node}}} ->
            {erlang:monotonic_time(millisecond), busy(Cpu), Node};
        _ ->
            undefined
    end.

%% The CPUs the rest of the host used between two usages.
rest_cpus({T0, B0, N0}, {T1, B1, N1}) when T1 > T0 ->
    max(0, (B1 - B0) - (N1 - N0)) / beamdiag_agent_procfs:clock_ticks() / ((T1 - T0) / 1000);
rest_cpus(_, _) ->
    undefined.

scan(Owner, Root, Exclude, End) ->
    T0 = erlang:monotonic_time(millisecond),
    #{procs := First, truncated := T1} = cpu_by_process(Root, Exclude, End),
    Took = erlang:monotonic_time(millisecond) - T0,
    %% The last scan starts so as to end with the window, as long as the
    %% first one took.
    Wait = beamdiag_agent_deadline:left(End - Took),
    receive
        {result, From, Ref, _} ->
            From ! {Ref, #{first => First, last => #{}, truncated => true}}
    after Wait ->
        last_scan(Owner, Root, First, T1)
    end.

%% The last scan reads the processes of the first, in the same order, and
%% answers whenever asked (with what it has by then and the rest read at
%% once, until the asker's deadline).
last_scan(_Owner, Root, First, T1) ->
    Pids = lists:sort(maps:keys(First)),
    last_scan(Root, Pids, First, T1, #{}).

last_scan(Root, Pids, First, T1, Acc) ->
    receive
        {result, From, Ref, Until} ->
            {Last, Left} = read_pids(Root, Pids, Until, Acc),
            From ! {Ref, #{first => First, last => Last, truncated => T1 orelse Left}}
    after 0 ->
        case Pids of
            [] ->
                receive
                    {result, From, Ref, _} ->
                        From ! {Ref, #{first => First, last => Acc, truncated => T1}}
                end;
            [P | Rest] ->
                last_scan(Root, Rest, First, T1, read_one(Root, P, Acc))
        end
    end.

%% Reads the processes' stat files in ?READERS processes at once, each
%% over its share of Pids, stopping at Until: each read is a dirty IO job,
%% and on a host whose CPUs are all taken every one waits for a CPU in
%% turn (measured with three busy loops on two cores: 74 files in 112 to
%% 435 ms one after the other, 1 to 36 ms in eight readers). A reader
%% still reading ?READER_GRACE_MS after Until is ended, and its share
%% counts as not read.
read_pids(Root, Pids, Until, Acc) when length(Pids) =< ?READERS ->
    read_all(Root, Pids, Until, Acc);
read_pids(Root, Pids, Until, Acc) ->
    Self = self(),
    Ref = make_ref(),
    Readers = [spawn_monitor(fun() -> Self ! {Ref, self(), read_all(Root, Share, Until, #{})} end)
               || Share <- shares(Pids, ?READERS)],
    gather_reads(Readers, Ref, Until, Acc, false).

gather_reads([], _Ref, _Until, Acc, Left) ->
    {Acc, Left};
gather_reads([{Pid, MRef} | Rest], Ref, Until, Acc, Left) ->
    Wait = case Until of
               infinity -> infinity;
               _ -> beamdiag_agent_deadline:left(Until + ?READER_GRACE_MS)
           end,
    receive
        {Ref, Pid, {Read, L}} ->
            erlang:demonitor(MRef, [flush]),
            gather_reads(Rest, Ref, Until, maps:merge(Acc, Read), Left orelse L);
        {'DOWN', MRef, process, Pid, _} ->
            gather_reads(Rest, Ref, Until, Acc, true)
    after Wait ->
        exit(Pid, kill),
        erlang:demonitor(MRef, [flush]),
        receive {Ref, Pid, _} -> ok after 0 -> ok end,
        gather_reads(Rest, Ref, Until, Acc, true)
    end.

%% Pids dealt into N shares, round robin.
shares(Pids, N) ->
    {_, Dealt} = lists:foldl(fun(P, {I, M}) -> {(I + 1) rem N, M#{I => [P | maps:get(I, M, [])]}} end,
                             {0, #{}}, Pids),
    maps:values(Dealt).

read_all(_Root, [], _Until, Acc) ->
    {Acc, false};
read_all(Root, [P | Rest], Until, Acc) ->
    case Until =/= infinity andalso erlang:monotonic_time(millisecond) > Until of
        true -> {Acc, true};
        false -> read_all(Root, Rest, Until, read_one(Root, P, Acc))
    end.

read_one(Root, P, Acc) ->
    case read_stat(filename:join([Root, integer_to_list(P), "stat"])) of
        {ok, {Comm, Ticks}} -> Acc#{P => {Comm, Ticks, erlang:monotonic_time(millisecond)}};
        error -> Acc
    end.

pid(Name) ->
    try [list_to_integer(Name)]
    catch error:badarg -> []
    end.

%% /proc/PID/stat: the comm, and utime plus stime (fields 14 and 15 of
%% proc(5), the 12th and 13th after the comm).
read_stat(File) ->
    case prim_file:read_file(File) of
        {ok, Bin} ->
            case beamdiag_agent_procfs:stat_fields(Bin) of
                {ok, Comm, Fields} when length(Fields) >= 13 ->
                    try
                        U = binary_to_integer(lists:nth(12, Fields)),
                        S = binary_to_integer(lists:nth(13, Fields)),
                        {ok, {Comm, U + S}}
                    catch error:badarg -> error
                    end;
                _ -> error
            end;
        {error, _} ->
            error
    end.

%% The first line of a small file, trimmed and at most 255 bytes; none
%% when it cannot be read or is empty.
first_line(File) ->
    case prim_file:read_file(File) of
        {ok, Bin} ->
            Line = hd(binary:split(Bin, <<"\n">>)),
            case binary:part(Line, 0, min(255, trimmed(Line, byte_size(Line)))) of
                <<>> -> [];
                Part -> [Part]
            end;
        {error, _} ->
            []
    end.

%% The length of a line less its trailing blanks.
trimmed(Line, N) when N > 0 ->
    case binary:at(Line, N - 1) of
        C when C =:= $\s; C =:= $\t; C =:= $\r -> trimmed(Line, N - 1);
        _ -> N
    end;
trimmed(_Line, 0) ->
    0.
