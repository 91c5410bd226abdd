%%% @doc Linux /proc: the OS's view of a BEAM's threads and of the host.
%%%
%%% Readers take the /proc root as an argument (so tests can point them at
%%% recorded fixtures) and return plain terms; the parsers are pure and
%%% reject malformed text with `{error, {beamdiag_agent_procfs, Reason}}'. This module
%%% runs on the target node: it uses `prim_file' directly, never the file
%%% server, and reads each file once per tick. The `/4' and `/2' forms with
%%% a `beamdiag_agent_file:held()' keep the files open between ticks, which costs
%%% a fraction of reading them whole each time.
%%%
%%% ```
%%% 1> beamdiag_agent_procfs:threads("/proc", os:getpid(), #{status => true}).
%%% {ok, #{12345 => #{name => <<"1_scheduler">>, utime => 42, ...}, ...}}
%%% '''
-module(beamdiag_agent_procfs).

-export([threads/3, tick_threads/4, host/1, host/3, cpu_times/1, clock_ticks/0]).
-export([stat_fields/1, trim/1, format_error/1]).
%% Called as Module:format_error/1 on an {error, {Module, Reason}} value.
-ignore_xref([{format_error, 1}]).
%% Called by the tests only.
-ifdef(TEST).
-export([threads/2, threads/4, process_stat/3, parse_stat/1, parse_schedstat/1, parse_status/1,
         parse_host_stat/1,
         parse_loadavg/1]).
-endif.

-export_type([thread/0, host/0]).

%% Per-thread counters, cumulative since the thread started. CPU times in
%% clock ticks (see clock_ticks/0), schedstat times in nanoseconds.
%% `carried': a middle tick kept the schedstat figures (or all of them) of
%% the sample before instead of reading them (tick_threads/4).
-type thread() :: #{
    name := binary(),
    %% proc(5)'s state letter: R running, S sleeping, D uninterruptible
    %% (waiting on I/O)...
    state => binary(),
    %% What it waits on in the kernel (read with `waits => true', for the
    %% threads not running): beamdiag_agent_waits.
    wait => beamdiag_agent_waits:wait(),
    utime := non_neg_integer(),
    stime := non_neg_integer(),
    minflt := non_neg_integer(),
    majflt := non_neg_integer(),
    run_ns => non_neg_integer(),
    wait_ns => non_neg_integer(),
    nvcsw => non_neg_integer(),
    nivcsw => non_neg_integer(),
    carried => true
}.
%% Host-wide CPU times (clock ticks, summed over CPUs) and load.
-type host() :: #{
    cpu := #{atom() => non_neg_integer()},
    ncpu := pos_integer(),
    loadavg => {float(), float(), float()}
}.

-define(MAX_THREADS, 4096).
-define(MAX_FILE, 65536).
%% A thread's stat or schedstat, /proc/loadavg: a line.
-define(MAX_SMALL, 4096).
%% A middle tick reads the threads that were idle in the interval before
%% when the process's CPU time exceeds what the active ones used by this
%% many clock ticks (10 ms each) or more: each figure is rounded down to a
%% clock tick, and read side by side on a saturated node they differed by
%% 1 to 2.
-define(UNACCOUNTED_TICKS, 3).

%%%===================================================================
%%% API
%%%===================================================================

-ifdef(TEST).
%% @doc All threads of an OS process (bounded at 4096), with their counters.
-spec threads(file:filename(), string() | integer()) ->
    {ok, #{integer() => thread()}} | {error, {beamdiag_agent_procfs, term()}}.
threads(Root, Pid) ->
    threads(Root, Pid, #{status => true}).
-endif.

%% @doc As threads/2; `#{status => false}' skips the per-thread status file
%% (context switches), one read per thread fewer.
-spec threads(file:filename(), string() | integer(), #{status => boolean(), waits => boolean()}) ->
    {ok, #{integer() => thread()}} | {error, {beamdiag_agent_procfs, term()}}.
threads(Root, Pid, Opts) ->
    element(1, threads(Root, Pid, Opts, beamdiag_agent_file:none())).

%% @doc As threads/3, reading through (and updating) held descriptors; the
%% descriptors of threads that have gone are closed. With `deadline' (a
%% monotonic time in milliseconds) in the options, gives
%% `{error, {beamdiag_agent_procfs, deadline}}' when it passes between two
%% threads' reads. Every thread is read whole; the agent's ticks read less
%% (tick_threads/4).
%% With `waits' (false), the threads that are not running also get what
%% they wait on in the kernel (`beamdiag_agent_waits:read/4': two more
%% reads a thread, and the file behind a blocked call).
-spec threads(file:filename(), string() | integer(),
              #{status => boolean(), deadline => integer() | infinity, waits => boolean()},
              beamdiag_agent_file:held()) ->
    {{ok, #{integer() => thread()}} | {error, {beamdiag_agent_procfs, term()}}, beamdiag_agent_file:held()}.
threads(Root, Pid, Opts, Held) ->
    TaskDir = filename:join([Root, to_list(Pid), "task"]),
    case tids(TaskDir, #{}) of
        {ok, Tids} ->
            Deadline = maps:get(deadline, Opts, infinity),
            try read_threads(TaskDir, Tids, maps:get(status, Opts, true), #{}, Deadline,
                             {[], [], Held}) of
                Acc -> {{ok, waits(Root, Pid, threads_of(Acc), Opts)}, kept(TaskDir, Acc)}
            catch
                throw:{deadline, H} -> {{error, {beamdiag_agent_procfs, deadline}}, H}
            end;
        {error, Reason} ->
            {{error, {beamdiag_agent_procfs, {list_dir, TaskDir, Reason}}}, Held}
    end.

%% @doc A tick's threads, as threads/4 (`waits' on a tick that reads the
%% status file only), and the whole process's CPU time
%% (utime plus stime, clock ticks: `process_stat/3') read right after the
%% threads that run most.
%%
%% With `previous' (the threads of the sample before, on a tick that does
%% not read the status file), the task directory is not listed again (the
%% previous sample's threads are read; a thread that has gone drops out, a
%% new one waits for the next full read), and a thread whose `stat' shows
%% no CPU time since (the same utime and stime) keeps its previous
%% schedstat figures rather than reading the file: idle threads (most
%% dirty I/O schedulers, the poller, the signal dispatchers) cost one read
%% instead of two.
%%
%% On a middle tick given `active' (the threads that ran in the interval
%% before) and `process' (the process's CPU time at the sample before),
%% only the active threads are read, then the process's CPU time, and the
%% other threads only when the process used ?UNACCOUNTED_TICKS clock ticks
%% or more beyond what the active ones did: an idle thread that woke up is
%% read on the tick it used a CPU; the others keep the previous sample's
%% figures. The busiest threads are read last, just before the process's
%% own figure, so that the two are read a few microseconds apart and the
%% comparison holds on a saturated node. Sums over the window stay exact
%% (the last tick reads every file); only the split between middle ticks
%% moves, by less than ?UNACCOUNTED_TICKS clock ticks of CPU time a tick.
-spec tick_threads(file:filename(), string() | integer(),
                   #{status => boolean(), deadline => integer() | infinity,
                     previous => #{integer() => thread()}, active => [integer()],
                     process => non_neg_integer(), waits => boolean()},
                   beamdiag_agent_file:held()) ->
    {{ok, #{integer() => thread()}, #{cpu := non_neg_integer(), rss_pages => non_neg_integer()}
                                    | undefined}
     | {error, {beamdiag_agent_procfs, term()}}, beamdiag_agent_file:held()}.
tick_threads(Root, Pid, Opts, Held) ->
    TaskDir = filename:join([Root, to_list(Pid), "task"]),
    WantStatus = maps:get(status, Opts, true),
    Previous = previous(Opts),
    Deadline = maps:get(deadline, Opts, infinity),
    case {tids(TaskDir, Previous), maps:get(active, Opts, all), maps:get(process, Opts, undefined)} of
        {{error, Reason}, _, _} ->
            {{error, {beamdiag_agent_procfs, {list_dir, TaskDir, Reason}}}, Held};
        {{ok, Tids}, Active, Before} when is_list(Active), is_integer(Before), map_size(Previous) > 0 ->
            Read = busiest_last([T || T <- Active, is_map_key(T, Previous)], Previous),
            Rest = [T || T <- Tids, not lists:member(T, Read)],
            try
                A1 = read_threads(TaskDir, Read, WantStatus, Previous, Deadline, {[], [], Held}),
                {Now, H1} = process_cpu_or_undefined(Root, Pid, element(3, A1)),
                A2 = setelement(3, A1, H1),
                A3 = case is_map(Now) andalso
                              maps:get(cpu, Now) - Before - ran(element(1, A2), Previous)
                                  < ?UNACCOUNTED_TICKS of
                         true -> carry(TaskDir, Rest, Previous, A2);
                         false -> read_threads(TaskDir, Rest, WantStatus, Previous, Deadline, A2)
                     end,
                {{ok, tick_waits(Root, Pid, threads_of(A3), Opts), Now}, kept(TaskDir, A3)}
            catch
                throw:{deadline, H} -> {{error, {beamdiag_agent_procfs, deadline}}, H}
            end;
        {{ok, Tids}, _, _} ->
            try read_threads(TaskDir, busiest_last(Tids, Previous), WantStatus, Previous, Deadline,
                             {[], [], Held}) of
                Acc ->
                    {Now, H1} = process_cpu_or_undefined(Root, Pid, element(3, Acc)),
                    Acc2 = setelement(3, Acc, H1),
                    {{ok, tick_waits(Root, Pid, threads_of(Acc2), Opts), Now},
                     kept(TaskDir, Acc2)}
            catch
                throw:{deadline, H} -> {{error, {beamdiag_agent_procfs, deadline}}, H}
            end
    end.

%% @doc The whole process's CPU time (`cpu': utime plus stime, clock
%% ticks, all its threads, those gone included) and its resident memory in
%% pages (proc(5)'s field 24, `rss_pages') from /proc/PID/stat: one read.
-spec process_stat(file:filename(), string() | integer(), beamdiag_agent_file:held()) ->
    {{ok, #{cpu := non_neg_integer(), rss_pages => non_neg_integer()}}
     | {error, {beamdiag_agent_procfs, term()}}, beamdiag_agent_file:held()}.
process_stat(Root, Pid, Held) ->
    case read(filename:join([Root, to_list(Pid), "stat"]), ?MAX_SMALL, Held) of
        {{ok, Bin}, H1} ->
            %% The line split once, for the CPU time and the resident memory.
            case stat_fields(Bin) of
                {ok, Name, Fields} ->
                    case stat_map(Name, Fields) of
                        {ok, #{utime := U, stime := S}} ->
                            Stat = #{cpu => U + S},
                            {{ok, case rss_pages(Fields) of
                                      {ok, R} -> Stat#{rss_pages => R};
                                      error -> Stat
                                  end}, H1};
                        Error ->
                            {Error, H1}
                    end;
                error ->
                    {{error, {beamdiag_agent_procfs, {bad_stat, no_name}}}, H1}
            end;
        {Error, H1} ->
            {Error, H1}
    end.

%% Field 24 of proc(5), rss: the 22nd after the name.
rss_pages(Fields) when length(Fields) >= 22 ->
    case string:to_integer(lists:nth(22, Fields)) of
        {R, <<>>} when is_integer(R), R >= 0 -> {ok, R};
        _ -> error
    end;
rss_pages(_) ->
    error.

%% @doc Host CPU times from /proc/stat and load from /proc/loadavg.
-spec host(file:filename()) -> {ok, host()} | {error, {beamdiag_agent_procfs, term()}}.
host(Root) ->
    element(1, host(Root, #{loadavg => true}, beamdiag_agent_file:none())).

%% @doc As host/1, reading through (and updating) held descriptors;
%% `#{loadavg => false}' reads /proc/stat alone (the load
%% is wanted at the window's ends only).
-spec host(file:filename(), #{loadavg => boolean()}, beamdiag_agent_file:held()) ->
    {{ok, host()} | {error, {beamdiag_agent_procfs, term()}}, beamdiag_agent_file:held()}.
host(Root, #{loadavg := false}, Held) ->
    cpu_times(Root, Held);
host(Root, _Opts, Held) ->
    case cpu_times(Root, Held) of
        {{ok, Host}, H1} ->
            case read(filename:join(Root, "loadavg"), ?MAX_SMALL, H1) of
                {{ok, L}, H2} ->
                    case parse_loadavg(L) of
                        {ok, Load} -> {{ok, Host#{loadavg => Load}}, H2};
                        {error, _} -> {{ok, Host}, H2}
                    end;
                {{error, _}, H2} ->
                    {{ok, Host}, H2}
            end;
        Error ->
            Error
    end.

%% @doc Host CPU times from /proc/stat alone, without the load: one read.
-spec cpu_times(file:filename()) -> {ok, host()} | {error, {beamdiag_agent_procfs, term()}}.
cpu_times(Root) ->
    element(1, cpu_times(Root, beamdiag_agent_file:none())).

cpu_times(Root, Held) ->
    case read(filename:join(Root, "stat"), ?MAX_FILE, Held) of
        {{ok, Bin}, H1} -> {parse_host_stat(Bin), H1};
        {Error, H1} -> {Error, H1}
    end.

%% @doc Clock ticks per second for utime and stime: USER_HZ, 100 on every
%% Linux architecture the BEAM runs on.
-spec clock_ticks() -> pos_integer().
clock_ticks() ->
    100.

%% @doc The name and the fields of a /proc/PID/stat or
%% /proc/PID/task/TID/stat line, the one reading of that format for every
%% module: the name sits in parentheses and may itself hold spaces and
%% parentheses, so the fields are counted from the last closing
%% parenthesis. The fields start with the state (field 3 of proc(5)).
-spec stat_fields(binary()) -> {ok, binary(), [binary()]} | error.
stat_fields(Bin) when is_binary(Bin) ->
    case {binary:match(Bin, <<"(">>), last_paren(Bin)} of
        {{Open, 1}, Close} when is_integer(Close), Close > Open ->
            Name = binary:part(Bin, Open + 1, Close - Open - 1),
            Rest = binary:part(Bin, Close + 1, byte_size(Bin) - Close - 1),
            {ok, Name, binary:split(Rest, [<<" ">>, <<"\n">>], [global, trim_all])};
        _ ->
            error
    end.

%% @doc Parses /proc/PID/task/TID/stat (`stat_fields/1').
-spec parse_stat(binary()) -> {ok, thread()} | {error, {beamdiag_agent_procfs, term()}}.
parse_stat(Bin) when is_binary(Bin) ->
    case stat_fields(Bin) of
        {ok, Name, Fields} ->
            stat_map(Name, Fields);
        error ->
            {error, {beamdiag_agent_procfs, {bad_stat, no_name}}}
    end.

%% A stat line's fields after the name, as parse_stat/1 returns them.
stat_map(Name, Fields) ->
    case Fields of
        %% Fields 3.. of proc(5): state ppid pgrp session tty tpgid flags
        %% minflt cminflt majflt cmajflt utime stime ...
        [State, _, _, _, _, _, _, MinFlt, _, MajFlt, _, UTime, STime | _] ->
            case ints([MinFlt, MajFlt, UTime, STime]) of
                {ok, [Mi, Ma, U, S]} ->
                    {ok, #{name => sanitize_name(Name), state => state_letter(State),
                           utime => U, stime => S, minflt => Mi, majflt => Ma}};
                error ->
                    {error, {beamdiag_agent_procfs, {bad_stat, non_numeric}}}
            end;
        _ ->
            {error, {beamdiag_agent_procfs, {bad_stat, too_few_fields}}}
    end.

%% @doc Parses /proc/PID/task/TID/schedstat: nanoseconds on CPU, nanoseconds
%% runnable waiting for a CPU, number of time slices.
-spec parse_schedstat(binary()) ->
    {ok, #{run_ns := non_neg_integer(), wait_ns := non_neg_integer()}}
    | {error, {beamdiag_agent_procfs, term()}}.
parse_schedstat(Bin) when is_binary(Bin) ->
    case binary:split(Bin, [<<" ">>, <<"\n">>], [global, trim_all]) of
        [Run, Wait | _] ->
            case ints([Run, Wait]) of
                {ok, [R, W]} -> {ok, #{run_ns => R, wait_ns => W}};
                error -> {error, {beamdiag_agent_procfs, {bad_schedstat, non_numeric}}}
            end;
        _ ->
            {error, {beamdiag_agent_procfs, {bad_schedstat, too_few_fields}}}
    end.

%% @doc Parses the context switch counts out of /proc/PID/task/TID/status.
-spec parse_status(binary()) ->
    {ok, #{nvcsw => non_neg_integer(), nivcsw => non_neg_integer()}}.
parse_status(Bin) when is_binary(Bin) ->
    Lines = binary:split(Bin, <<"\n">>, [global]),
    {ok, lists:foldl(fun status_line/2, #{}, Lines)}.

%% @doc Parses /proc/stat: the aggregate `cpu' line and the number of `cpuN'
%% lines.
-spec parse_host_stat(binary()) -> {ok, host()} | {error, {beamdiag_agent_procfs, term()}}.
parse_host_stat(Bin) when is_binary(Bin) ->
    Lines = binary:split(Bin, <<"\n">>, [global]),
    NCpu = length([L || <<"cpu", D, _/binary>> = L <- Lines, D >= $0, D =< $9]),
    case [L || <<"cpu ", _/binary>> = L <- Lines] of
        [<<"cpu ", Fields/binary>> | _] when NCpu > 0 ->
            Keys = [user, nice, system, idle, iowait, irq, softirq, steal, guest, guest_nice],
            Values = binary:split(Fields, <<" ">>, [global, trim_all]),
            case ints(lists:sublist(Values, length(Keys))) of
                {ok, Ints} when length(Ints) >= 4 ->
                    Cpu = maps:from_list(lists:zip(lists:sublist(Keys, length(Ints)), Ints)),
                    {ok, #{cpu => Cpu, ncpu => NCpu}};
                _ ->
                    {error, {beamdiag_agent_procfs, {bad_host_stat, non_numeric}}}
            end;
        _ ->
            {error, {beamdiag_agent_procfs, {bad_host_stat, no_cpu_line}}}
    end.

%% @doc Parses /proc/loadavg.
-spec parse_loadavg(binary()) -> {ok, {float(), float(), float()}} | {error, {beamdiag_agent_procfs, term()}}.
parse_loadavg(Bin) when is_binary(Bin) ->
    case binary:split(Bin, [<<" ">>, <<"\n">>], [global, trim_all]) of
        [A, B, C | _] ->
            try
                {ok, {binary_to_float(A), binary_to_float(B), binary_to_float(C)}}
            catch
                error:badarg -> {error, {beamdiag_agent_procfs, bad_loadavg}}
            end;
        _ ->
            {error, {beamdiag_agent_procfs, bad_loadavg}}
    end.

%% @doc Turns an error reason of this module into a sentence.
-spec format_error(term()) -> iolist().
format_error({list_dir, Dir, enoent}) ->
    ["no such process directory ", Dir, " (not Linux, or the process is gone)"];
format_error({list_dir, Dir, eacces}) ->
    ["no permission to read ", Dir];
format_error({list_dir, Dir, Reason}) ->
    io_lib:format("cannot list ~ts: ~p", [Dir, Reason]);
format_error(deadline) ->
    "the sampling deadline passed before every thread was read";
format_error({read, File, Reason}) ->
    io_lib:format("cannot read ~ts: ~p", [File, Reason]);
format_error({too_large, File}) ->
    ["file too large: ", File];
format_error({Kind, Why}) when is_atom(Kind), is_atom(Why) ->
    io_lib:format("malformed /proc data (~p: ~p)", [Kind, Why]);
format_error(Other) ->
    io_lib:format("malformed /proc data (~p)", [Other]).

%%%===================================================================
%%% Internal
%%%===================================================================

%% The waits of the threads that are not running, with `waits'.
waits(Root, Pid, Threads, Opts = #{waits := true}) ->
    Waiting = [Tid || {Tid, #{state := St}} <- maps:to_list(Threads), St =/= <<"R">>],
    Waits = beamdiag_agent_waits:read(Root, Pid, lists:sort(Waiting),
                                      maps:with([deadline], Opts)),
    maps:map(fun(Tid, T) ->
                     case maps:find(Tid, Waits) of
                         {ok, W} -> T#{wait => W};
                         error -> T
                     end
             end, Threads);
waits(_Root, _Pid, Threads, _Opts) ->
    Threads.

%% A tick reads the waits when asked and it reads the status file (the
%% agent asks on the window's last tick).
tick_waits(Root, Pid, Threads, Opts = #{status := true}) ->
    waits(Root, Pid, Threads, Opts);
tick_waits(_Root, _Pid, Threads, _Opts) ->
    Threads.

%% One letter of proc(5)'s states; anything else as `?'.
state_letter(<<C>>) when C >= $A, C =< $Z; C >= $a, C =< $z -> <<C>>;
state_letter(_) -> <<"?">>.

%% Reads the threads Tids (stat, and schedstat unless idle since Previous),
%% adding to {Threads, Paths, Held}.
read_threads(TaskDir, Tids, WantStatus, Previous, Deadline, Acc0) ->
    lists:foldl(
      fun(Tid, {Acc, Ps, H}) ->
              beamdiag_agent_deadline:in_time(Deadline) orelse throw({deadline, H}),
              Dir = filename:join(TaskDir, integer_to_list(Tid)),
              Stat = filename:join(Dir, "stat"),
              Sched = filename:join(Dir, "schedstat"),
              Before = maps:get(Tid, Previous, undefined),
              case thread(Dir, Stat, Sched, WantStatus, Before, H) of
                  {{ok, T}, H2} -> {[{Tid, T} | Acc], [Stat, Sched | Ps], H2};
                  {{error, _}, H2} -> {Acc, [Stat, Sched | Ps], H2}
              end
      end,
      Acc0, Tids).

%% The threads not read keep their previous figures (their files stay
%% held), marked `carried': a thread that waited for a CPU without
%% running may have more wait time than they say.
carry(TaskDir, Tids, Previous, {Acc, Ps, H}) ->
    lists:foldl(
      fun(Tid, {A, P, H1}) ->
              Dir = filename:join(TaskDir, integer_to_list(Tid)),
              {[{Tid, (maps:remove(wait, maps:get(Tid, Previous)))#{carried => true}} | A],
               [filename:join(Dir, "stat"), filename:join(Dir, "schedstat") | P], H1}
      end,
      {Acc, Ps, H}, Tids).

previous(Opts) ->
    case {maps:get(previous, Opts, #{}), maps:get(status, Opts, true)} of
        {P, false} when is_map(P) -> P;
        _ -> #{}
    end.

threads_of({Threads, _Paths, _Held}) ->
    maps:from_list(Threads).

kept(TaskDir, {_Threads, Paths, Held}) ->
    beamdiag_agent_file:keep(TaskDir, Paths, Held).

%% Tids ordered by their CPU time so far (the previous sample's), the
%% busiest last; as they are when there is no previous sample.
busiest_last(Tids, Previous) when map_size(Previous) =:= 0 ->
    Tids;
busiest_last(Tids, Previous) ->
    Cpu = fun(T) -> case maps:get(T, Previous, #{}) of
                        #{utime := U, stime := S} -> U + S;
                        _ -> 0
                    end
          end,
    [T || {_, T} <- lists:sort([{Cpu(T), T} || T <- Tids])].

process_cpu_or_undefined(Root, Pid, H) ->
    case process_stat(Root, Pid, H) of
        {{ok, Stat}, H1} -> {Stat, H1};
        {{error, _}, H1} -> {undefined, H1}
    end.

%% The CPU time (clock ticks) the threads read used since Previous.
ran(Read, Previous) ->
    lists:sum([U + S - (PU + PS) || {Tid, #{utime := U, stime := S}} <- Read,
                                    #{utime := PU, stime := PS} <- [maps:get(Tid, Previous, #{})]]).

%% The thread ids to read: the task directory's, or the previous sample's.
tids(_TaskDir, Previous) when map_size(Previous) > 0 ->
    {ok, lists:sort(maps:keys(Previous))};
tids(TaskDir, _) ->
    case prim_file:list_dir(TaskDir) of
        {ok, Names} ->
            {ok, lists:sublist(lists:sort([T || N <- Names, {T, ""} <- [string:to_integer(N)]]),
                               ?MAX_THREADS)};
        {error, _} = Error ->
            Error
    end.

thread(Dir, Stat, Sched, WantStatus, Before, H0) ->
    case read(Stat, ?MAX_SMALL, H0) of
        {{ok, StatBin}, H1} ->
            case parse_stat(StatBin) of
                {ok, T0} ->
                    {T1, H2} = case idle_since(T0, Before) of
                                   {true, Kept} -> {maps:merge(T0, Kept), H1};
                                   false -> merge_optional(T0, Sched, ?MAX_SMALL,
                                                           fun parse_schedstat/1, H1)
                               end,
                    case WantStatus of
                        true ->
                            %% Read whole: it is wanted on the first and last
                            %% ticks only.
                            {T2, _} = merge_optional(T1, filename:join(Dir, "status"), ?MAX_FILE,
                                                     fun parse_status/1, beamdiag_agent_file:none()),
                            {{ok, T2}, H2};
                        false ->
                            {{ok, T1}, H2}
                    end;
                Error ->
                    {Error, H1}
            end;
        {Error, H1} ->
            %% The thread exited between listing and reading.
            {Error, H1}
    end.

%% A thread with no CPU time since the previous sample keeps that sample's
%% schedstat figures, marked `carried' (its wait for a CPU may have grown
%% while it ran less than a clock tick).
idle_since(#{utime := U, stime := S}, #{utime := U, stime := S, run_ns := R, wait_ns := W}) ->
    {true, #{run_ns => R, wait_ns => W, carried => true}};
idle_since(_, _) ->
    false.

merge_optional(T, File, Max, Parse, H) ->
    case read(File, Max, H) of
        {{ok, Bin}, H2} ->
            case Parse(Bin) of
                {ok, M} -> {maps:merge(T, M), H2};
                {error, _} -> {T, H2}
            end;
        {{error, _}, H2} ->
            {T, H2}
    end.

read(File, Max, H) ->
    case beamdiag_agent_file:read(File, Max, H) of
        {{ok, _}, _} = Ok -> Ok;
        {{error, too_large}, H2} -> {{error, {beamdiag_agent_procfs, {too_large, File}}}, H2};
        {{error, Reason}, H2} -> {{error, {beamdiag_agent_procfs, {read, File, Reason}}}, H2}
    end.

last_paren(Bin) ->
    case binary:matches(Bin, <<")">>) of
        [] -> undefined;
        Ms -> element(1, lists:last(Ms))
    end.

status_line(<<"voluntary_ctxt_switches:", V/binary>>, Acc) ->
    put_int(nvcsw, V, Acc);
status_line(<<"nonvoluntary_ctxt_switches:", V/binary>>, Acc) ->
    put_int(nivcsw, V, Acc);
status_line(_, Acc) ->
    Acc.

put_int(K, V, Acc) ->
    case ints([trim(V)]) of
        {ok, [I]} -> Acc#{K => I};
        error -> Acc
    end.

%% @doc ASCII whitespace off both ends, byte by byte: /proc and cgroup
%% text need not be valid UTF-8, which string:trim/1 rejects.
-spec trim(binary()) -> binary().
trim(B) ->
    trim_trailing(trim_leading(B)).

trim_leading(<<C, R/binary>>) when C =:= $\s; C =:= $\t; C =:= $\n; C =:= $\r -> trim_leading(R);
trim_leading(B) -> B.

trim_trailing(B) ->
    case byte_size(B) of
        0 -> B;
        N ->
            case binary:last(B) of
                C when C =:= $\s; C =:= $\t; C =:= $\n; C =:= $\r -> trim_trailing(binary:part(B, 0, N - 1));
                _ -> B
            end
    end.

ints(Bins) ->
    try
        {ok, [non_neg(binary_to_integer(B)) || B <- Bins]}
    catch
        error:badarg -> error
    end.

non_neg(I) when I >= 0 -> I;
non_neg(_) -> error(badarg).

%% Thread names are at most 15 bytes in the kernel; keep printable ASCII only.
sanitize_name(Name) ->
    << <<(case C of _ when C < 32; C > 126 -> $?; _ -> C end)>> || <<C>> <= binary:part(Name, 0, min(byte_size(Name), 64)) >>.

to_list(P) when is_integer(P) -> integer_to_list(P);
to_list(P) when is_list(P) -> P.

