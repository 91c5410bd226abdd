%%% @doc Process attribution over the window, on the target: which
%%% processes took the node's reductions, whose mailbox grew, whose heap is
%%% large or growing, and who waits on whom. Runs on the target node (erts,
%%% kernel and stdlib only).
%%%
%%% Two walks of the process table per window, one at its start and one at
%%% its end (beamdiag_agent_proc_walk: three cheap items per process, never
%%% a message's contents, only the queue's length), each ranking as it reads
%%% (beamdiag_agent_top: no list of every process is built and sorted); the
%%% walks' state stays in the process that took them
%%% (beamdiag_agent_walker), never copied. At 10,000 idle processes a walk
%%% costs about 5 ms of CPU on this project's 2-core test host (about 2 ms
%%% of it the `process_info/2' calls), a third of what ranking from lists
%%% cost. `memory' is read only for the candidates (the 32 largest heaps at
%%% each end, the longest queues, and the processes reported), and
%%% estimated for a flooded mailbox (beamdiag_agent_proc_memory: the entry
%%% says `memory_estimated => true'). The reported processes are identified
%%% last (beamdiag_agent_proc_identity).
%%%
%%% A process that does not answer. Every read goes through
%%% beamdiag_agent_pinfo: a process that takes more than 100 ms to answer
%%% (a flooded one in a long garbage collection, one held in a NIF) is set
%%% aside (`stalled') and the walk goes on without it. The start walk's
%%% stalled processes are watched with the longest queues (`watch/1',
%%% beamdiag_agent_queues): their queue lengths come from the watch's
%%% readers, which wait for their answers all through the window; the
%%% report takes a queue's two ends from the walks where they read it and
%%% from the watch where they did not, and then says over how long
%%% (`queue_ms'). Such an entry has `answered => false' when it could not
%%% be identified either.
%%%
%%% Bounds. Up to `?WALK_MAX' processes (50,000) both walks cover every
%%% process (`mode => all'); above it they read a sample or the registered
%%% processes (`mode => sampled' or `registered', see
%%% beamdiag_agent_proc_walk), and each walk stops at 500 ms of wall time
%%% (`truncated => true'). Every list in the report has at most `?TOP'
%%% entries; the agent's own process is left out.
%%%
%%% Identification, for the reported processes only: registered name,
%%% `proc_lib' initial call, the process label on OTP 27 and later, the
%%% current function, the number of monitors on it, and for the largest
%%% heaps the number of processes with the same initial call (counted only
%%% when the start walk found a heap of 1 MB or more: the end walk then
%%% also reads each process's initial call, which costs more than the
%%% other items).
%%%
%%% ```
%%% 1> S = beamdiag_agent_processes:start(#{}).
%%% 2> R = beamdiag_agent_processes:finish(S, #{}).
%%% 3> [maps:get(name, E) || E <- maps:get(top_reductions, R)].
%%% [<<"code_server">>, null, ...]
%%% '''
-module(beamdiag_agent_processes).

-export([start/1, finish/2, next/1, snapshot/1, watch/1, pids/1, wait_chains/2]).

-export_type([state/0, report/0, entry/0, stalled_entry/0, options/0]).

-type state() :: #{
    mode := beamdiag_agent_proc_walk:mode(),
    t0 := integer(),
    reds0 := non_neg_integer(),
    count0 := non_neg_integer(),
    base := #{pid() => beamdiag_agent_proc_walk:figures()},
    mem0 := #{pid() => non_neg_integer()},
    %% erlang:memory(binary) at the span's start.
    binary0 => non_neg_integer() | undefined,
    ports0 => non_neg_integer(),
    %% Each table's memory at the span's start (beamdiag_agent_tables).
    tables0 => beamdiag_agent_tables:sizes(),
    queues0 := [pid()],
    sample := [pid()] | all,
    walk_us := non_neg_integer(),
    truncated := boolean(),
    skip := [pid(), ...],
    limit := pos_integer(),
    estimated := #{pid() => true},
    stalled := [beamdiag_agent_pinfo:stalled()],
    suspended := {non_neg_integer(), [pid()]},
    look0 => beamdiag_agent_chains:look(),
    t0_ns := integer()
}.
%% One process in a report: its figures over the window (the start's
%% value `null' when the start walk did not read it) and its identity
%% (`answered => false' and `waited_ms' for one that did not answer;
%% `spawn_call', `label', `like' and `parent' are absent from a
%% snapshot's entries for the watched processes that did not answer the
%% start walk).
%% `current' is always set here but left optional: readers allow for
%% entries without it (beamdiag_format_procs' where/1).
-type entry() :: #{
    pid := binary(),
    name := binary() | null,
    reductions := integer(),
    queue := [non_neg_integer() | null],
    memory := [non_neg_integer() | null],
    memory_estimated := boolean(),
    heap_words := non_neg_integer() | null,
    born := boolean(),
    queue_ms => non_neg_integer(),
    initial_call := binary() | null,
    current => binary() | null,
    monitored_by := non_neg_integer(),
    status := binary(),
    spawn_call => binary() | null,
    label => binary() | null,
    like => pos_integer() | null,
    %% The process that spawned it, named from the registered names
    %% (null for init, and for one that did not answer).
    parent => #{pid := binary(), name := binary() | null} | null,
    %% The innermost frame of the user's code below a current function
    %% that is not theirs, and its file and line
    %% (beamdiag_agent_proc_identity).
    own => binary(),
    own_at => binary(),
    answered => false,
    waited_ms => non_neg_integer(),
    %% In `binaries': the reference-counted binaries it references.
    count => non_neg_integer(),
    bytes => non_neg_integer(),
    sole_bytes => non_neg_integer()
}.
%% A process that did not answer a read in time.
%% `memory_start': its memory at the window's start (bytes) when a walk
%% read it there (end reports only).
-type stalled_entry() :: #{pid := binary(), name := binary() | null,
                           waited_ms := non_neg_integer(),
                           memory_start => non_neg_integer() | null}.
%% What finish/2, next/1 and snapshot/1 build (pairs: start and end).
%% A snapshot has `t_ns', `word_bytes' and `partial'; an end report
%% `identify_us'; wait_chains/2 and the end walk add `waits'.
-type report() :: #{
    mode := beamdiag_agent_proc_walk:mode(),
    limit := pos_integer(),
    span_ms := integer(),
    reductions := non_neg_integer(),
    process_count := [non_neg_integer()],
    scanned := [non_neg_integer()],
    walk_us := [integer()],
    truncated := boolean(),
    top_reductions := [entry()],
    queues := [entry()],
    heaps := [entry()],
    heap_growth := [entry()],
    %% The candidates holding the most reference-counted binaries, with
    %% `count', `bytes' and `sole_bytes' (beamdiag_agent_proc_memory:binaries/3).
    binaries => [entry()],
    %% Who spawned the processes born over the window, when the count
    %% grew (beamdiag_agent_proc_born).
    born => beamdiag_agent_proc_born:born() | #{},
    %% Who holds the most ports, when their count grew
    %% (beamdiag_agent_ports:owners/2).
    port_owners => beamdiag_agent_ports:owners(),
    %% The ETS tables that grew, and who created the new ones
    %% (beamdiag_agent_tables).
    tables => beamdiag_agent_tables:report() | none,
    stalled := [stalled_entry()],
    identify_us => integer(),
    waits => #{start => beamdiag_agent_chains:look(), 'end' => beamdiag_agent_chains:look()},
    t_ns => integer(),
    word_bytes => pos_integer(),
    partial => start | start_and_ticks,
    %% Added by the agent and the collector at the window's end.
    memory_room => beamdiag_agent_cgroup:room()
}.
%% start/1's options: pids left out (the agent's own), and the walk's
%% bound (tests only).
-type options() :: #{skip => [pid()], walk_max => non_neg_integer()}.

%% Above this many processes the table is not listed.
-define(WALK_MAX, 50000).
%% Entries per list in the report.
-define(TOP, 10).
%% Binary memory growth over the window (bytes) past which the candidates'
%% binaries are read (a quarter of beamdiag_memory_rules' growth_min).
-define(BINARY_GROWTH_MIN, 4194304).
%% Processes whose `memory' is read at each end (by young heap size).
-define(MEM_CANDIDATES, 32).
%% A heap this large at the start (bytes) makes the end walk read every
%% process's initial call, to count the processes like it.
-define(LIKE_HEAP_BYTES, 1048576).
%% The processes watched at most, and of them at most this many that did
%% not answer the start walk.
-define(WATCH_STALLED, 4).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The walk at the window's start. Options: `skip', pids left out
%% (the agent's own; `self()' always is), `walk_max' (tests only).
-spec start(options()) -> state().
start(Opts) ->
    Skip = [self() | maps:get(skip, Opts, [])],
    Count = erlang:system_info(process_count),
    Max = maps:get(walk_max, Opts, ?WALK_MAX),
    T0 = erlang:monotonic_time(microsecond),
    T0Ns = erlang:monotonic_time(nanosecond),
    {Reds0, _} = erlang:statistics(reductions),
    {Mode, Pids} = beamdiag_agent_proc_walk:pids(Count, Max),
    %% (The subtraction runs in C: a few microseconds for a few pids.)
    {Walked, Tops, Trunc, Stalled} =
        beamdiag_agent_proc_walk:walk(Pids -- Skip, T0, beamdiag_agent_proc_walk:items(false), #{},
                                      #{}, true, #{queues => beamdiag_agent_top:new(?TOP),
                                              heaps => beamdiag_agent_top:new(?MEM_CANDIDATES)}),
    Base = maps:from_list(Walked),
    Queues = beamdiag_agent_top:pids(maps:get(queues, Tops)),
    %% The largest heaps and the longest queues (a flooded mailbox is the
    %% memory that grows).
    {Mem0, Est0, _} = beamdiag_agent_proc_memory:read(
                          lists:usort(beamdiag_agent_top:pids(maps:get(heaps, Tops)) ++ Queues),
                          Base, #{}),
    T1 = erlang:monotonic_time(microsecond),
    #{
        t0_ns => T0Ns,
        stalled => Stalled,
        suspended => maps:get(suspended, Tops),
        mode => Mode,
        t0 => T0,
        reds0 => Reds0,
        count0 => Count,
        base => Base,
        mem0 => Mem0,
        binary0 => binary_memory(),
        ports0 => erlang:system_info(port_count),
        tables0 => tables(Mode),
        queues0 => Queues,
        sample => case Mode of
                      all -> all;
                      _ -> maps:keys(Base)
                  end,
        walk_us => T1 - T0,
        truncated => Trunc,
        skip => Skip,
        limit => Max,
        estimated => Est0
    }.

%% @doc The walk at the window's end, and the report: bounded lists of
%% entries, binaries and numbers only. Reads: the queue watch's readings
%% (beamdiag_agent_queues:read/1), for the queues the walks could not read.
-spec finish(state(), #{binary() => beamdiag_agent_queues:reading()}) -> report().
finish(S, Reads) ->
    element(1, report(S#{reads => Reads}, false)).

%% @doc The report since the last walk, and the state that makes the end
%% walk the start of the next span: one walk per report (watch takes one
%% every few ticks).
-spec next(state()) -> {report(), state()}.
next(S) ->
    {Report, #{t1 := T1, reds1 := Reds1, count := Count, 'end' := End, mem1 := Mem1,
               walk_us := W, truncated := Trunc, estimated := Est, queues := Qs,
               stalled := Stalled, suspended := Susp}} = report(S, true),
    {Report, S#{t0 := T1, reds0 := Reds1, count0 := Count, estimated := Est, stalled := Stalled,
                suspended := Susp,
                t0_ns := T1 * 1000,
                base := maps:from_list([{P, {element(1, T), element(2, T), element(3, T)}}
                                        || {P, T} <- End]),
                mem0 := Mem1, binary0 => binary_memory(),
                ports0 => erlang:system_info(port_count), tables0 => tables(maps:get(mode, S)),
                queues0 := Qs, walk_us := W,
                truncated := Trunc}}.

%% The end walk: the report, and what the next span starts from (the end
%% walk's figures for every process only when Keep is true, or when they
%% are needed to count the processes like a large heap).
report(S = #{mode := Mode, t0 := T0, reds0 := Reds0, base := Base, mem0 := Mem0, skip := Skip},
       Keep) ->
    T1 = erlang:monotonic_time(microsecond),
    %% The next span's start (next/1), taken before its walk reads any process.
    {RedsNext, _} = erlang:statistics(reductions),
    Count = erlang:system_info(process_count),
    Pids = case maps:get(sample, S) of
               all -> erlang:processes();
               Sample -> Sample ++ beamdiag_agent_proc_walk:new_registered(Base)
           end,
    %% The initial call (for the count of processes like a large heap) only
    %% when a large heap was seen at the start: under load it costs more
    %% than the three other items together.
    Like = lists:any(fun(M) -> M >= ?LIKE_HEAP_BYTES end, maps:values(Mem0)),
    Items = beamdiag_agent_proc_walk:items(Like),
    ToWalk = Pids -- Skip,
    %% The processes the start walk could not read: their reductions and
    %% memory at the start are unknown, so neither is counted from zero.
    Unread = maps:from_list([X || X = {P, _} <- maps:get(stalled, S, []),
                                  not is_map_key(P, Base)]),
    {Walked, Tops0, Trunc, Stalled1} =
        beamdiag_agent_proc_walk:walk(ToWalk, T1, Items, Base, Unread, Keep orelse Like,
                                      #{reductions => beamdiag_agent_top:new(?TOP),
                                        queues => beamdiag_agent_top:new(?TOP),
                                        heaps => beamdiag_agent_top:new(?MEM_CANDIDATES)}),
    %% The node's total after every process was read (as its start before
    %% any was): a process's reductions over the window never exceed it
    %% (read before the end walk, a process that ran through the walk
    %% showed more than the whole node: a share over 100%).
    {Reds1, _} = erlang:statistics(reductions),
    %% The watched queues the end walk could not read: the watch's latest
    %% readings stand in (reductions unknown: none counted).
    Reads = reads_by_pid(maps:get(reads, S, #{})),
    Watched = [{P, {R0, Q, H}} || {P, _} <- Stalled1,
                                  #{queue := Q, heap_words := H} <- [maps:get(P, Reads, none)],
                                  R0 <- [case Base of #{P := BT} -> element(1, BT); _ -> 0 end]],
    Tops = Tops0#{queues := lists:foldl(fun({P, T}, Top) ->
                                                Key = beamdiag_agent_proc_walk:queue_key(P, T, Base),
                                                beamdiag_agent_top:consider(Key, P, T, Top)
                                        end, maps:get(queues, Tops0), Watched)},
    TopReds = beamdiag_agent_top:items(maps:get(reductions, Tops)),
    Queues = beamdiag_agent_top:items(maps:get(queues, Tops)),
    HeapRows = beamdiag_agent_top:items(maps:get(heaps, Tops)),
    %% The end walk's figures by pid for the candidates only (a map of the
    %% whole walk costs more than the walk): the tops' rows, and the start's
    %% candidates read again (a walk cut short by its time limit may have
    %% missed some; those gone since are left out).
    Rows = maps:from_list(TopReds ++ Queues ++ HeapRows),
    %% A process that did not answer once is not asked again in this
    %% report: each ask would wait as long.
    Known0 = maps:from_list(maps:get(stalled, S, []) ++ Stalled1),
    Again = [P || P <- maps:keys(Mem0), not is_map_key(P, Rows), not is_map_key(P, Known0)],
    {AgainRead, Stalled2} = beamdiag_agent_pinfo:read(Again, Items, #{}),
    End = maps:fold(fun(P, Info, Acc) -> Acc#{P => beamdiag_agent_proc_walk:to_tuple(Info)} end,
                    Rows, AgainRead),
    Known1 = maps:merge(Known0, maps:from_list(Stalled2)),
    {Mem1, Est1, Stalled3} = beamdiag_agent_proc_memory:read(maps:keys(End), End, Known1),
    Est = maps:merge(maps:get(estimated, S, #{}), Est1),
    Heaps = beamdiag_agent_top:largest_ids(maps:to_list(Mem1), ?TOP),
    Growth = beamdiag_agent_top:largest_ids(
               [{P, M - beamdiag_agent_proc_memory:at_start(P, Mem0, Base)}
                || {P, M} <- maps:to_list(Mem1),
                   is_map_key(P, Mem0) orelse not is_map_key(P, Unread)], ?TOP),
    T2 = erlang:monotonic_time(microsecond),
    Ends = #{t0_ns => maps:get(t0_ns, S, T0 * 1000), t1_ns => T1 * 1000,
             ended => maps:from_list(Watched)},
    Info = info_fun(End, Mem0, Mem1, Base, Unread, Est, Reads, Ends),
    LikeCounts = case Like of
                     true -> beamdiag_agent_proc_identity:like_counts(Mode, Heaps, End, Walked);
                     false -> #{}
                 end,
    Stalled = merge_stalled([maps:get(stalled, S, []), Stalled1, Stalled2, Stalled3]),
    Names = beamdiag_agent_proc_identity:names(),
    Ids = beamdiag_agent_proc_identity:read(
            lists:usort([P || {P, _} <- TopReds ++ Queues] ++ Heaps ++ Growth),
            maps:from_list(Stalled)),
    Report = #{
        mode => Mode,
        limit => maps:get(limit, S),
        span_ms => (T1 - T0) div 1000,
        reductions => max(0, Reds1 - Reds0),
        process_count => [maps:get(count0, S), Count],
        scanned => [map_size(Base), maps:get(walked, Tops)],
        walk_us => [maps:get(walk_us, S), T2 - T1],
        truncated => maps:get(truncated, S) orelse Trunc,
        top_reductions => entries([P || {P, _} <- TopReds], Info, #{}, Names, Ids),
        queues => entries([P || {P, _} <- Queues], Info, #{}, Names, Ids),
        heaps => entries(Heaps, Info, LikeCounts, Names, Ids),
        heap_growth => entries(Growth, Info, #{}, Names, Ids),
        binaries => binaries(maps:get(binary0, S, undefined), lists:usort(Heaps ++ Growth), Mem1,
                             Info, Names, Ids),
        born => beamdiag_agent_proc_born:read(Mode, ToWalk, maps:merge(Unread, Base),
                                              Count - maps:get(count0, S), Names),
        port_owners => beamdiag_agent_ports:owners(
                         erlang:system_info(port_count) - maps:get(ports0, S, 0), Names),
        tables => beamdiag_agent_tables:grew(maps:get(tables0, S, none), Names),
        stalled => beamdiag_agent_proc_identity:stalled_entries(
                     Stalled, Names, ?TOP,
                     fun(P) ->
                             case beamdiag_agent_proc_memory:at_start(P, Mem0, Base) of
                                 %% 0: read by neither walk.
                                 M when M > 0 -> M;
                                 _ -> null
                             end
                     end)
    },
    %% Who waits on whom now, with the servers the start's look followed.
    Look0 = maps:get(look0, S, none),
    Look1 = waits_look(Report, look_servers(Look0), maps:get(suspended, Tops0)),
    Waits = case Look0 of
                none -> #{'end' => Look1};
                _ -> #{start => Look0, 'end' => Look1}
            end,
    {Report#{identify_us => erlang:monotonic_time(microsecond) - T2, waits => Waits},
     #{t1 => T1, reds1 => RedsNext, count => Count, 'end' => Walked, mem1 => Mem1, walk_us => T2 - T1,
       truncated => Trunc, estimated => Est1, stalled => Stalled1,
       suspended => maps:get(suspended, Tops0),
       queues => [P || {P, T} <- Queues, element(2, T) > 0]}}.

%% The tables' sizes, on a node whose walks list every process only: on
%% a huge node nothing lists a whole table (ets:all/0 neither).
tables(all) -> beamdiag_agent_tables:sizes();
tables(_) -> none.

%% @doc A report from the start walk alone, in the shape `finish/1'
%% returns (no reductions over the window; queues and memory at the start
%% on both ends), marked `partial => start': what a capture cut short
%% keeps. Identifies at most 2 x ?TOP processes.
-spec snapshot(state()) -> report().
snapshot(S = #{mode := Mode, base := Base, mem0 := Mem0, count0 := Count}) ->
    Est = maps:get(estimated, S, #{}),
    Queues = maps:get(queues0, S),
    Heaps = beamdiag_agent_top:largest_ids(maps:to_list(Mem0), ?TOP),
    Info = fun(P) ->
                   T = maps:get(P, Base),
                   M = maps:get(P, Mem0, null),
                   #{reductions => 0, queue => [element(2, T), element(2, T)], memory => [M, M],
                     memory_estimated => is_map_key(P, Est), heap_words => element(3, T),
                     born => false}
           end,
    Names = beamdiag_agent_proc_identity:names(),
    Stalled = maps:get(stalled, S, []),
    Ids = beamdiag_agent_proc_identity:read(lists:usort(Queues ++ Heaps), maps:from_list(Stalled)),
    %% The watched processes that did not answer the start walk: their
    %% queue's ends come from the watch's readings (beamdiag_proc_forward).
    Unread = [E#{queue => [null, null], memory => [null, null], memory_estimated => true,
                 heap_words => null, reductions => 0, born => false, answered => false,
                 initial_call => <<"?">>, current => <<"?">>, status => <<"?">>,
                 monitored_by => 0}
              || E <- stalled_entries([X || X = {P, _} <- Stalled, lists:member(P, watch(S))],
                                      Names)],
    #{
        mode => Mode,
        limit => maps:get(limit, S),
        span_ms => 0,
        reductions => 0,
        process_count => [Count, Count],
        scanned => [map_size(Base), 0],
        walk_us => [maps:get(walk_us, S), 0],
        truncated => maps:get(truncated, S),
        top_reductions => [],
        queues => entries(Queues, Info, #{}, Names, Ids) ++ Unread,
        heaps => entries(Heaps, Info, #{}, Names, Ids),
        heap_growth => [],
        stalled => stalled_entries(Stalled, Names),
        t_ns => maps:get(t0_ns, S, 0),
        word_bytes => erlang:system_info(wordsize),
        partial => start
    }.

%% @doc The processes whose queue length the agent reads all through the
%% window (beamdiag_agent_queues): the longest queues at the start
%% (non-empty ones only) and those that did not answer the start walk (at
%% most ?WATCH_STALLED), ?TOP in all.
-spec watch(state()) -> [pid()].
watch(S = #{queues0 := Queues}) ->
    Stalled = [P || {P, _} <- lists:sublist(maps:get(stalled, S, []), ?WATCH_STALLED)],
    lists:sublist(Stalled ++ [P || P <- Queues, not lists:member(P, Stalled)], ?TOP).

%% @doc The wait chains at the window's start, who waits on whom
%% (beamdiag_agent_chains), from the start report's entries (Snapshot):
%% added to the start report (`waits => #{start => Chains}') and kept in
%% the state for the end report, which follows the same servers again.
-spec wait_chains(state(), report()) -> {report(), state()}.
wait_chains(S = #{suspended := Susp}, Snapshot) ->
    Look = waits_look(Snapshot, [], Susp),
    {Snapshot#{waits => #{start => Look}}, S#{look0 => Look}}.

%% A look from a report's entries, the servers of an earlier look first,
%% none that did not answer a read.
waits_look(Report, Also, {N, Susp}) ->
    Known = [to_pid(P) || #{pid := P} <- maps:get(stalled, Report, [])],
    Entries = lists:append([maps:get(K, Report, []) || K <- [queues, heaps, top_reductions]]),
    Servers = [P || P <- beamdiag_agent_chains:candidates(Entries, Also), not lists:member(P, Known)],
    beamdiag_agent_chains:look(#{servers => Servers, suspended => Susp, suspended_count => N}).

%% The servers an earlier look followed.
look_servers(#{chains := Chains}) ->
    [to_pid(P) || #{server := #{pid := P}} <- Chains];
look_servers(_) ->
    [].

to_pid(Text) ->
    list_to_pid(binary_to_list(Text)).

%% @doc The processes a walk would read now: every one up to ?WALK_MAX
%% processes, otherwise the start walk's sample (the agent's own left out).
-spec pids(state()) -> [pid()].
pids(#{mode := all, skip := Skip}) ->
    erlang:processes() -- Skip;
pids(#{base := Base}) ->
    maps:keys(Base).

%%%===================================================================
%%% Internal
%%%===================================================================

%% What the report says of a process beside its name. Reads: the queue
%% watch's readings by pid; Ends: the walks' times (nanoseconds) and the
%% rows the watch stood in for at the end (`ended').
info_fun(End, Mem0, Mem1, Base, Unread, Est, Reads,
         #{t0_ns := T0, t1_ns := T1, ended := Ended}) ->
    fun(P) ->
        Read = maps:get(P, Reads, none),
        T = maps:get(P, End),
        {R1, Q1, H1} = {element(1, T), element(2, T), element(3, T)},
        %% Unread at the start: its reductions before the window unknown,
        %% none counted (as for a queue the watch read).
        Unknown = case is_map_key(P, Unread) of
                      true -> R1;
                      false -> 0
                  end,
        {R0, Q0, Q0t} = case {maps:find(P, Base), Read} of
                            {{ok, {R, Q, _}}, _} -> {R, Q, T0};
                            {error, #{first := F, first_t := Ft}} -> {Unknown, F, Ft};
                            {error, none} -> {Unknown, null, T0}
                        end,
        Q1t = case {maps:is_key(P, Ended), Read} of
                  {true, #{t := Tl}} -> Tl;
                  _ -> T1
              end,
        M1 = case maps:find(P, Mem1) of
                 {ok, M} -> M;
                 error -> null
             end,
        M0 = case maps:find(P, Mem0) of
                 {ok, MM} -> MM;
                 error when M1 =:= null -> null;
                 error when is_map_key(P, Unread) -> null;
                 error -> beamdiag_agent_proc_memory:at_start(P, Mem0, Base)
             end,
        Born = not is_map_key(P, Base) andalso not is_map_key(P, Unread) andalso Read =:= none,
        Nums = #{reductions => R1 - R0, queue => [Q0, Q1], memory => [M0, M1],
                 memory_estimated => is_map_key(P, Est),
                 heap_words => H1, born => Born},
        case Q0t =:= T0 andalso Q1t =:= T1 of
            true -> Nums;
            false -> Nums#{queue_ms => max(0, (Q1t - Q0t) div 1000000)}
        end
    end.

%% The watch's readings by pid.
reads_by_pid(Reads) ->
    maps:from_list([{to_pid(Text), R} || {Text, R} <- maps:to_list(Reads)]).

merge_stalled(Lists) ->
    maps:to_list(lists:foldl(fun({P, W}, Acc) -> Acc#{P => max(W, maps:get(P, Acc, 0))} end,
                             #{}, lists:append(Lists))).

%% The processes that did not answer a read in time, as entries (the
%% longest waits first).
stalled_entries(Stalled, Names) ->
    beamdiag_agent_proc_identity:stalled_entries(Stalled, Names, ?TOP).

entries(Pids, Info, Like, Names, Ids) ->
    beamdiag_agent_proc_identity:entries(Pids, Info, Like, Names, Ids).

%% The candidates that hold the most reference-counted binaries (1 MiB or
%% more), each its entry with the count, bytes and bytes it alone holds;
%% asked only when the node's binary memory grew by ?BINARY_GROWTH_MIN
%% over the window (the memory rules name holders only then).
binaries(Binary0, Pids, Mem, Info, Names, Ids) when is_integer(Binary0) ->
    case binary_memory() of
        Binary1 when is_integer(Binary1), Binary1 - Binary0 >= ?BINARY_GROWTH_MIN ->
            Held = beamdiag_agent_proc_memory:binaries(Pids, Mem, 1048576),
            [maps:merge(E, maps:without([pid], H))
             || H = #{pid := P} <- Held, E <- entries([P], Info, #{}, Names, Ids)];
        _ ->
            []
    end;
binaries(_, _, _, _, _, _) ->
    [].

%% The node's binary memory, or `undefined' when it did not come within
%% beamdiag_agent_bounded_call:once/1's wait: erlang:memory/1 waits for every scheduler, and a
%% walk must not wait for a held one (measured: 775 ms behind a scheduler
%% held 800 ms at a time); the binaries are then not read.
binary_memory() ->
    case beamdiag_agent_bounded_call:once(fun() -> erlang:memory(binary) end) of
        {ok, B} -> B;
        _ -> undefined
    end.
