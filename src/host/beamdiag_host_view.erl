%%% @doc The host-side view of a node: what this host's /proc and cgroup
%%% files say about a BEAM's OS process, read from this VM without asking
%%% the node anything.
%%%
%%% `start/2' starts a sampler linked to the caller that reads, each tick,
%%% every thread's CPU counters (/proc/PID/task, through
%%% `beamdiag_agent_procfs'), the host's CPU times, MemAvailable, the node's
%%% resident memory, and the cgroup's CPU quota, throttling counters and
%%% memory limit and use (`beamdiag_agent_cgroup'). The samples have the
%%% shape of the agent's, without the VM's own figures, so
%%% `beamdiag_ledger' builds the same per-thread ledger from them. A node
%%% whose schedulers are all held by native code cannot stop this.
%%%
%%% ```
%%% 1> S = beamdiag_host_view:start(4242, #{interval_ms => 1000}).
%%% 2> timer:sleep(3000), Samples = beamdiag_host_view:stop(S).
%%% 3> length(Samples).
%%% 5
%%% '''
-module(beamdiag_host_view).

-export([start/2, snapshot/1, pause/1, stop/1, settings/1, tell/3, told/1]).

-export_type([sample/0, memory/0, settings/0]).

-type sample() :: #{
    t := integer(),
    threads := #{integer() => beamdiag_agent_procfs:thread()} | {error, term()},
    host := beamdiag_agent_procfs:host() | {error, term()},
    cgroup := beamdiag_agent_cgroup:stat() | {error, term()},
    memory := memory(),
    vm := beamdiag_agent_vm:counters(),
    tick_cost_us := non_neg_integer()
}.

%% The node's memory as the host sees it (bytes): the host's total and
%% available, the node's resident set, and on cgroup v2 its memory
%% cgroup's limit and usage (`max': no limit).
-type memory() :: #{
    mem_total => non_neg_integer(),
    mem_available => non_neg_integer(),
    rss => non_neg_integer(),
    cgroup_max => integer() | max,
    cgroup_current => integer() | max
}.
%% settings/1: the schedulers the threads' names show, and the host's CPUs.
-type settings() :: #{
    schedulers := pos_integer(),
    schedulers_online := pos_integer(),
    dirty_cpu_schedulers := non_neg_integer(),
    dirty_io_schedulers := non_neg_integer(),
    logical_processors_available := pos_integer()
}.

%% At most this many samples are kept (an hour at one a second).
-define(MAX_SAMPLES, 3600).
-define(CALL_TIMEOUT, 5000).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Starts sampling OS process OsPid now and every `interval_ms'
%% (1000) milliseconds; `proc_root' ("/proc") for recorded trees. The
%% sampler is linked to the caller and ends with it.
-spec start(pos_integer(), #{interval_ms => pos_integer(), proc_root => file:filename()}) ->
    pid().
start(OsPid, Opts) ->
    Root = maps:get(proc_root, Opts, "/proc"),
    Interval = maps:get(interval_ms, Opts, 1000),
    spawn_link(fun() ->
        Cg = case beamdiag_agent_cgroup:locate(Root, OsPid) of
                 {ok, L} -> L;
                 {error, _} = E -> E
             end,
        loop(#{root => Root, os_pid => OsPid, cgroup => Cg, interval => Interval},
             [sample(Root, OsPid, Cg)])
    end).

%% @doc The samples so far, the last one taken now, oldest first; the
%% sampler goes on.
-spec snapshot(pid()) -> [sample()].
snapshot(Pid) ->
    call(Pid, snapshot).

%% @doc No more samples each interval (a view kept in reserve costs
%% nothing); `snapshot/1' and `stop/1' still take one.
-spec pause(pid()) -> ok.
pause(Pid) ->
    Pid ! pause,
    ok.

%% @doc Keeps a fact about the node with the view (what perf found), for
%% whoever asks the view later (`told/1').
-spec tell(pid(), atom(), term()) -> ok.
tell(Pid, Key, Value) ->
    Pid ! {tell, Key, Value},
    ok.

%% @doc The facts told so far.
-spec told(pid()) -> #{atom() => term()}.
told(Pid) ->
    call(Pid, told).

%% @doc A last sample now, then the sampler ends: every sample, oldest first.
-spec stop(pid()) -> [sample()].
stop(Pid) ->
    Samples = call(Pid, stop),
    unlink(Pid),
    Samples.

%% @doc One sample of OS process OsPid under /proc root Root, with its CPU
%% cgroup's location (or the error locating it).
-spec sample(file:filename(), pos_integer(), beamdiag_agent_cgroup:location() | {error, term()}) ->
    sample().
sample(Root, OsPid, Cg) ->
    %% Every sample reads what the threads that are not running wait on
    %% (the call, and the file behind it when this VM may read the
    %% node's memory: root, or the node's user).
    Threads = beamdiag_agent_procfs:threads(Root, OsPid, #{status => true, waits => true}),
    Host = beamdiag_agent_procfs:host(Root),
    CgStat = case Cg of
                 #{dir := _} -> beamdiag_agent_cgroup:read(Cg);
                 {error, _} = E -> E
             end,
    #{
        t => erlang:monotonic_time(nanosecond),
        threads => value(Threads),
        host => value(Host),
        cgroup => value(CgStat),
        memory => memory(Root, OsPid, Cg),
        %% No figures from the VM: the node is not asked.
        vm => #{swt => undefined, run_queues => [], reductions => 0, gcs => 0, gc_words => 0,
                context_switches => 0, process_count => 0},
        tick_cost_us => 0
    }.

%% @doc The node's settings as its threads' names show them: its
%% schedulers, dirty CPU and dirty IO schedulers, and the host's CPUs.
-spec settings([sample()]) -> settings().
settings(Samples) ->
    Names = case [T || #{threads := T} <- lists:reverse(Samples), is_map(T)] of
                [T | _] -> [{Tid, N} || {Tid, #{name := N}} <- maps:to_list(T)];
                [] -> []
            end,
    Kinds = maps:values(beamdiag_threads:classify_all(Names, #{})),
    Count = fun(Type) -> length([x || {Ty, _} <- Kinds, Ty =:= Type]) end,
    Ncpu = case [N || #{host := #{ncpu := N}} <- Samples] of
               [N | _] -> N;
               [] -> 1
           end,
    #{schedulers => max(1, Count(scheduler)), schedulers_online => max(1, Count(scheduler)),
      dirty_cpu_schedulers => Count(dirty_cpu), dirty_io_schedulers => Count(dirty_io),
      logical_processors_available => Ncpu}.

%% @doc Parses /proc/meminfo: MemTotal and MemAvailable, in bytes.
-spec parse_meminfo(binary()) -> #{mem_total => non_neg_integer(),
                                   mem_available => non_neg_integer()}.
parse_meminfo(Bin) ->
    lists:foldl(
        fun(Line, Acc) ->
            case binary:split(Line, <<":">>) of
                [<<"MemTotal">>, V] -> kb(mem_total, V, Acc);
                [<<"MemAvailable">>, V] -> kb(mem_available, V, Acc);
                _ -> Acc
            end
        end,
        #{}, binary:split(Bin, <<"\n">>, [global, trim_all])).

%%%===================================================================
%%% Internal
%%%===================================================================

loop(S = #{root := Root, os_pid := OsPid, cgroup := Cg, interval := Interval}, Acc) ->
    receive
        {From, Ref, snapshot} ->
            Acc2 = keep([sample(Root, OsPid, Cg) | Acc]),
            From ! {Ref, lists:reverse(Acc2)},
            loop(S, Acc2);
        {From, Ref, stop} ->
            From ! {Ref, lists:reverse(keep([sample(Root, OsPid, Cg) | Acc]))};
        pause ->
            loop(S#{interval := infinity}, Acc);
        {tell, Key, Value} ->
            loop(S#{told => (maps:get(told, S, #{}))#{Key => Value}}, Acc);
        {From, Ref, told} ->
            From ! {Ref, maps:get(told, S, #{})},
            loop(S, Acc)
    after Interval ->
        loop(S, keep([sample(Root, OsPid, Cg) | Acc]))
    end.

keep(Acc) when length(Acc) > ?MAX_SAMPLES -> lists:sublist(Acc, ?MAX_SAMPLES);
keep(Acc) -> Acc.

call(Pid, What) ->
    Ref = monitor(process, Pid),
    Pid ! {self(), Ref, What},
    receive
        {Ref, Samples} ->
            demonitor(Ref, [flush]),
            Samples;
        {'DOWN', Ref, process, Pid, Why} ->
            erlang:error({host_sampler_down, Why})
    after ?CALL_TIMEOUT ->
        demonitor(Ref, [flush]),
        erlang:error(host_sampler_timeout)
    end.

value({ok, V}) -> V;
value({error, _} = E) -> E.

%% MemAvailable and MemTotal of the host, the node's resident set, and the
%% cgroup's memory limit and use (cgroup v2, where memory sits beside cpu).
memory(Root, OsPid, Cg) ->
    Host = case read(filename:join(Root, "meminfo")) of
               {ok, B} -> parse_meminfo(B);
               {error, _} -> #{}
           end,
    Rss = case read(filename:join([Root, integer_to_list(OsPid), "status"])) of
              {ok, S} ->
                  case [V || L <- binary:split(S, <<"\n">>, [global]),
                             [<<"VmRSS">>, V] <- [binary:split(L, <<":">>)]] of
                      [V | _] -> kb(rss, V, #{});
                      [] -> #{}
                  end;
              {error, _} ->
                  #{}
          end,
    Cgroup = case Cg of
                 #{version := 2, dir := Dir} ->
                     maps:from_list(
                         [{K, V} || {K, F} <- [{cgroup_max, "memory.max"},
                                               {cgroup_current, "memory.current"}],
                                    {ok, V} <- [cg_int(filename:join(Dir, F))]]);
                 _ ->
                     #{}
             end,
    maps:merge(maps:merge(Host, Rss), Cgroup).

cg_int(File) ->
    case read(File) of
        {ok, B} ->
            case beamdiag_agent_procfs:trim(B) of
                <<"max">> -> {ok, max};
                T -> try {ok, binary_to_integer(T)} catch error:badarg -> error end
            end;
        {error, _} ->
            error
    end.

kb(Key, V, Acc) ->
    case string:to_integer(string:trim(V)) of
        {N, _} when is_integer(N), N >= 0 -> Acc#{Key => N * 1024};
        _ -> Acc
    end.

read(Path) ->
    beamdiag_host_locate:read(Path).
