%%% @doc Process attribution over the window, on the target: which
%%% processes took the node's reductions, whose mailbox grew, whose heap is
%%% large or growing. Runs on the target node (erts, kernel and stdlib only).
%%%
%%% Two walks of the process table per window, one at its start and one at
%%% its end, each reading three cheap items per process (`reductions',
%%% `message_queue_len', `heap_size': constant time, about 0.5 us each;
%%% not `total_heap_size', which counts the message fragments in the queue
%%% and so walks it: measured on OTP 25, 4 times the walk's cost at 10,000
%%% idle processes and 20 ms for one queue of 3 million). `memory' is read
%%% only for the candidates: the 32 largest heaps at each end, the longest
%%% queues, and the processes reported. Never a message's contents: only
%%% the queue's length.
%%%
%%% A flooded mailbox. `process_info(P, memory)' walks P's whole message
%%% queue (measured on OTP 25: 90 to 250 ms for 8 million queued messages,
%%% on a busy node more), so for a process whose queue holds more than
%%% `?QUEUE_BOUND' messages it is not asked: its memory is estimated as its
%%% young heap (`heap_size' words) plus `?MSG_BYTES' a queued message (a
%%% small message's measured cost on OTP 25; larger messages hold more), and
%%% the entry says so (`memory_estimated => true'). `messages' is never
%%% read.
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
%%% Each walk ranks as it reads: the tops it reports are kept in one pass
%%% (no list of every process is built and sorted), and the walks' state
%%% stays in the process that took them (beamdiag_agent_walker), never
%%% copied. At 10,000 idle processes a walk costs about 5 ms of CPU on
%%% this project's 2-core test host (about 2 ms of it the
%%% `process_info/2' calls), a third of what ranking from lists cost.
%%%
%%% Bounds. Up to `?WALK_MAX' processes (50,000) both walks cover every
%%% process (`mode => all'). Above it the table is not listed: on OTP 28
%%% and later `erlang:processes_iterator/0' walks it one process at a time
%%% and keeps every k-th process as the sample read at both ends
%%% (`mode => sampled'); before OTP 28, where the only listing is
%%% `erlang:processes/0', only the registered processes are read
%%% (`mode => registered'). Each walk also stops at `?WALK_MS' of wall
%%% time (`truncated => true'). Every list in the report has at most
%%% `?TOP' entries; the agent's own process is left out.
%%%
%%% Identification, for the reported processes only: registered name,
%%% `proc_lib' initial call (from the process dictionary's
%%% `$initial_call' key, read alone where the emulator allows, OTP 26.2
%%% and later), the process label on OTP 27 and later
%%% (`proc_lib:get_label/1', called only where it exists), the current
%%% function, the number of monitors on it (callers of `gen:call' monitor
%%% the server while they wait), and for the largest heaps the number of
%%% processes with the same initial call (counted only when the start walk
%%% found a heap of 1 MB or more: the end walk then also reads each
%%% process's initial call, which costs more than the other items).
%%%
%%% ```
%%% 1> S = beamdiag_agent_processes:start(#{}).
%%% 2> R = beamdiag_agent_processes:finish(S, #{}).
%%% 3> [maps:get(name, E) || E <- maps:get(top_reductions, R)].
%%% [<<"code_server">>, null, ...]
%%% '''
-module(beamdiag_agent_processes).

-export([start/1, finish/2, next/1, snapshot/1, watch/1, forward/2, pids/1, look/2]).

-export_type([state/0, report/0, entry/0, stalled_entry/0, options/0]).

-type state() :: #{
    mode := all | sampled | registered,
    t0 := integer(),
    reds0 := non_neg_integer(),
    count0 := non_neg_integer(),
    base := #{pid() => tuple()},
    mem0 := #{pid() => non_neg_integer()},
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
%% `spawn_call', `label' and `like' are absent from a snapshot's entries
%% for the watched processes that did not answer the start walk).
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
    answered => false,
    waited_ms => non_neg_integer()
}.
%% A process that did not answer a read in time.
-type stalled_entry() :: #{pid := binary(), name := binary() | null,
                           waited_ms := non_neg_integer()}.
%% What finish/2, next/1 and snapshot/1 build (pairs: start and end).
%% A snapshot has `t_ns', `word_bytes' and `partial'; an end report
%% `identify_us'; look/2 and the end walk add `waits'.
-type report() :: #{
    mode := all | sampled | registered,
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
%% A walk stops after this long (wall time).
-define(WALK_MS, 500).
%% Entries per list in the report.
-define(TOP, 10).
%% Processes whose `memory' is read at each end (by young heap size).
-define(MEM_CANDIDATES, 32).
%% A heap this large at the start (bytes) makes the end walk read every
%% process's initial call, to count the processes like it.
-define(LIKE_HEAP_BYTES, 1048576).
%% Dictionary reads when counting the processes like a large one.
-define(LIKE_READS, 2000).
%% The items every walk reads, in this order: items/2 matches them by
%% position.
-define(ITEMS, [reductions, message_queue_len, heap_size]).
%% Above this many queued messages a process's memory is estimated, not read.
-define(QUEUE_BOUND, 10000).
%% Bytes a small queued message holds beyond its data (measured on OTP 25:
%% 112 bytes for a 3-word tuple, of which 88 outside the heap).
-define(MSG_BYTES, 112).
-define(IDENTITY, [registered_name, initial_call, current_function, monitored_by, status]).
%% The processes watched at most, and of them at most this many that did
%% not answer the start walk.
-define(WATCH_STALLED, 4).
%% Suspended processes kept by a walk (all are counted).
-define(SUSPENDED, 16).

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
    {Mode, Pids} = pids(Count, Max),
    %% (The subtraction runs in C: a few microseconds for a few pids.)
    {Walked, Tops, Trunc, Stalled} =
        walk(Pids -- Skip, T0 + ?WALK_MS * 1000, ?ITEMS, #{}, true,
             #{queues => top_new(?TOP), heaps => top_new(?MEM_CANDIDATES)}),
    Base = maps:from_list(Walked),
    Queues = top_pids(maps:get(queues, Tops)),
    %% The largest heaps and the longest queues (a flooded mailbox is the
    %% memory that grows).
    {Mem0, Est0, _} = memories(lists:usort(top_pids(maps:get(heaps, Tops)) ++ Queues), Base, #{}),
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
                mem0 := Mem1, queues0 := Qs, walk_us := W, truncated := Trunc}}.

%% The end walk: the report, and what the next span starts from (the end
%% walk's figures for every process only when Keep is true, or when they
%% are needed to count the processes like a large heap).
report(S = #{mode := Mode, t0 := T0, reds0 := Reds0, base := Base, mem0 := Mem0, skip := Skip},
       Keep) ->
    T1 = erlang:monotonic_time(microsecond),
    {Reds1, _} = erlang:statistics(reductions),
    Count = erlang:system_info(process_count),
    Pids = case maps:get(sample, S) of
               all -> erlang:processes();
               Sample -> Sample ++ new_registered(Base)
           end,
    %% The initial call (for the count of processes like a large heap) only
    %% when a large heap was seen at the start: under load it costs more
    %% than the three other items together.
    Like = lists:any(fun(M) -> M >= ?LIKE_HEAP_BYTES end, maps:values(Mem0)),
    Items = case Like of
                true -> ?ITEMS ++ [initial_call];
                false -> ?ITEMS
            end,
    {Walked, Tops0, Trunc, Stalled1} =
        walk(Pids -- Skip, T1 + ?WALK_MS * 1000, Items, Base, Keep orelse Like,
             #{reductions => top_new(?TOP), queues => top_new(?TOP),
               heaps => top_new(?MEM_CANDIDATES)}),
    %% The watched queues the end walk could not read: the watch's latest
    %% readings stand in (reductions unknown: none counted).
    Reads = reads_by_pid(maps:get(reads, S, #{})),
    Watched = [{P, {R0, Q, H}} || {P, _} <- Stalled1,
                                  #{queue := Q, heap_words := H} <- [maps:get(P, Reads, none)],
                                  R0 <- [case Base of #{P := BT} -> element(1, BT); _ -> 0 end]],
    Tops = Tops0#{queues := lists:foldl(fun({P, T}, Top) ->
                                                consider(queue_key(P, T, Base), P, T, Top)
                                        end, maps:get(queues, Tops0), Watched)},
    TopReds = top_items(maps:get(reductions, Tops)),
    Queues = top_items(maps:get(queues, Tops)),
    HeapRows = top_items(maps:get(heaps, Tops)),
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
    End = maps:fold(fun(P, Info, Acc) -> Acc#{P => to_tuple(Info)} end, Rows, AgainRead),
    Known1 = maps:merge(Known0, maps:from_list(Stalled2)),
    {Mem1, Est1, Stalled3} = memories(maps:keys(End), End, Known1),
    Est = maps:merge(maps:get(estimated, S, #{}), Est1),
    Heaps = top(maps:to_list(Mem1), ?TOP),
    Growth = top([{P, M - start_memory(P, Mem0, Base)} || {P, M} <- maps:to_list(Mem1)], ?TOP),
    T2 = erlang:monotonic_time(microsecond),
    Ends = #{t0_ns => maps:get(t0_ns, S, T0 * 1000), t1_ns => T1 * 1000,
             ended => maps:from_list(Watched)},
    Info = info_fun(End, Mem0, Mem1, Base, Est, Reads, Ends),
    LikeCounts = case Like of
                     true -> like_counts(Mode, Heaps, End, Walked);
                     false -> #{}
                 end,
    Stalled = merge_stalled([maps:get(stalled, S, []), Stalled1, Stalled2, Stalled3]),
    Names = registered_names(),
    Ids = identities(lists:usort([P || {P, _} <- TopReds ++ Queues] ++ Heaps ++ Growth),
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
        stalled => stalled_entries(Stalled, Names)
    },
    %% Who waits on whom now, with the servers the start's look followed.
    Look0 = maps:get(look0, S, none),
    Look1 = waits_look(Report, look_servers(Look0), maps:get(suspended, Tops0)),
    Waits = case Look0 of
                none -> #{'end' => Look1};
                _ -> #{start => Look0, 'end' => Look1}
            end,
    {Report#{identify_us => erlang:monotonic_time(microsecond) - T2, waits => Waits},
     #{t1 => T1, reds1 => Reds1, count => Count, 'end' => Walked, mem1 => Mem1, walk_us => T2 - T1,
       truncated => Trunc, estimated => Est1, stalled => Stalled1,
       suspended => maps:get(suspended, Tops0),
       queues => [P || {P, T} <- Queues, element(2, T) > 0]}}.

%% @doc A report from the start walk alone, in the shape `finish/1'
%% returns (no reductions over the window; queues and memory at the start
%% on both ends), marked `partial => start': what a capture cut short
%% keeps. Identifies at most 2 x ?TOP processes.
-spec snapshot(state()) -> report().
snapshot(S = #{mode := Mode, base := Base, mem0 := Mem0, count0 := Count}) ->
    Est = maps:get(estimated, S, #{}),
    Queues = maps:get(queues0, S),
    Heaps = top(maps:to_list(Mem0), ?TOP),
    Info = fun(P) ->
                   T = maps:get(P, Base),
                   M = maps:get(P, Mem0, null),
                   #{reductions => 0, queue => [element(2, T), element(2, T)], memory => [M, M],
                     memory_estimated => is_map_key(P, Est), heap_words => element(3, T),
                     born => false}
           end,
    Names = registered_names(),
    Stalled = maps:get(stalled, S, []),
    Ids = identities(lists:usort(Queues ++ Heaps), maps:from_list(Stalled)),
    %% The watched processes that did not answer the start walk: their
    %% queue's ends come from the watch's readings (forward/2).
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

%% @doc Who waits on whom at the window's start (beamdiag_agent_chains),
%% from the start report's entries (Snapshot), kept for the end report
%% and added to the start report.
-spec look(state(), report()) -> {report(), state()}.
look(S = #{suspended := Susp}, Snapshot) ->
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

%% @doc A start-walk report (`snapshot/1') brought forward with the queue
%% watch's readings of the latest sample that has them (Samples newest
%% first, as a collector keeps them): each watched queue's end is its
%% latest reading, and its start the walk's length or, for a process that
%% did not answer the walk, its first reading; `queue_ms' is the time
%% between the two. Samples of earlier agents carry plain lengths
%% (`queues'), read at the sample's time.
%% (Samples: beamdiag_agent:sample(), or an earlier agent's, which had
%% `queues' instead of `queue_reads'.)
-spec forward(report(), [#{t := integer(),
                           queue_reads => #{binary() => beamdiag_agent_queues:reading()},
                           queues => #{binary() => non_neg_integer()},
                           atom() => term()}]) -> report().
forward(R = #{queues := Qs}, Samples = [_ | _]) ->
    T0 = case R of
             #{t_ns := TN} when is_integer(TN), TN =/= 0 -> TN;
             _ -> maps:get(t, lists:last(Samples))
         end,
    W = maps:get(word_bytes, R, 8),
    case [S || S = #{queue_reads := _} <- Samples] of
        [#{queue_reads := Reads, t := T} | _] ->
            Qs2 = [forward_entry(E, maps:find(Pid, Reads), T0, W) || E = #{pid := Pid} <- Qs],
            R#{queues := Qs2, span_ms := max(0, (T - T0) div 1000000),
               partial := start_and_ticks};
        [] ->
            case [S || S = #{queues := _} <- Samples] of
                [#{queues := Lengths, t := T} | _] ->
                    SpanMs = max(0, (T - T0) div 1000000),
                    Qs2 = [case maps:find(Pid, Lengths) of
                               {ok, Q1} when is_integer(Q0) ->
                                   forward_memory(E#{queue := [Q0, Q1]}, Q1 - Q0, W);
                               _ -> E
                           end || E = #{pid := Pid, queue := [Q0, _]} <- Qs],
                    R#{queues := Qs2, span_ms := SpanMs, partial := start_and_ticks};
                [] ->
                    R
            end
    end;
forward(R, _) ->
    R.

forward_entry(E = #{queue := [Q0, _]}, {ok, #{queue := Q1, t := T1, heap_words := H} = Rd}, T0, W) ->
    {Start, StartT} = case Q0 of
                          _ when is_integer(Q0) -> {Q0, T0};
                          _ -> {maps:get(first, Rd), maps:get(first_t, Rd)}
                      end,
    E2 = E#{queue := [Start, Q1], queue_ms => max(0, (T1 - StartT) div 1000000)},
    case E of
        #{memory := [null, _]} ->
            %% Not read at the start: the estimate from the readings alone.
            M = H * W + Q1 * ?MSG_BYTES,
            E2#{memory := [null, M], heap_words => H, memory_estimated := true};
        _ ->
            forward_memory(E2, Q1 - Start, W)
    end;
forward_entry(E, _, _, _) ->
    E.

%% An estimated memory grows with the queue.
forward_memory(E = #{memory_estimated := true, memory := [M0, _]}, Dq, _W) when is_integer(M0) ->
    E#{memory := [M0, max(0, M0 + Dq * ?MSG_BYTES)]};
forward_memory(E, _, _) ->
    E.

%%%===================================================================
%%% Internal
%%%===================================================================

pids(Count, Max) when Count =< Max ->
    {all, erlang:processes()};
pids(Count, Max) ->
    case erlang:function_exported(erlang, processes_iterator, 0) of
        true -> {sampled, stride(Count, Max) ++ registered_pids()};
        false -> {registered, registered_pids()}
    end.

%% Every k-th process from the iterator (OTP 28+), at most Max of them.
stride(Count, Max) ->
    K = max(1, (Count + Max - 1) div Max),
    Iter = dynamic(erlang, processes_iterator, []),
    stride(Iter, K, 0, Max, []).

stride(_Iter, _K, _I, 0, Acc) ->
    Acc;
stride(Iter, K, I, Left, Acc) ->
    case dynamic(erlang, processes_next, [Iter]) of
        none -> Acc;
        {P, Iter2} when I rem K =:= 0 -> stride(Iter2, K, I + 1, Left - 1, [P | Acc]);
        {_, Iter2} -> stride(Iter2, K, I + 1, Left, Acc)
    end.

registered_pids() ->
    [P || N <- erlang:registered(), P <- [erlang:whereis(N)], is_pid(P)].

%% Processes registered since the start (a sampled walk reads the same
%% processes at both ends, and the registered ones).
new_registered(Base) ->
    [P || P <- registered_pids(), not is_map_key(P, Base)].

%% One walk over Pids, reading Items, which start with ?ITEMS (and may
%% add initial_call): {Walked, Tops, Truncated, Stalled}. Walked, only when
%% Keep is true: {Pid, the items as a tuple} for every process. Tops: the
%% largest keys of the kinds asked for in Tops0 (reductions: over the
%% window, from Base, the start walk's figures; queues: at the start the
%% length, at the end its growth plus its length; heaps: the young heap),
%% kept as {Pid, items} in one pass (no list of every process to rank),
%% and `walked', the count read. Stops at Deadline; a process that does
%% not answer is left out and listed in Stalled (beamdiag_agent_pinfo).
walk(Pids, Deadline, Items, Base, Keep, Tops0) ->
    Reds0 = maps:get(reductions, Tops0, none),
    #{queues := Qs0, heaps := Hs0} = Tops0,
    Fun = fun(P, Info, {Reds, Qs, Hs, N, Acc, Susp}) ->
                  {T, Status} = to_tuple(Info),
                  Susp2 = case Status of
                              suspended -> suspended(P, Susp);
                              _ -> Susp
                          end,
                  case Reds of
                      none ->
                          %% The start walk: queues by length.
                          {Reds, consider(element(2, T), P, T, Qs),
                           consider(element(3, T), P, T, Hs), N + 1, kept(Keep, P, T, Acc), Susp2};
                      _ ->
                          R0 = case Base of
                                   #{P := BT} -> element(1, BT);
                                   _ -> 0
                               end,
                          {consider(element(1, T) - R0, P, T, Reds),
                           consider(queue_key(P, T, Base), P, T, Qs),
                           consider(element(3, T), P, T, Hs), N + 1, kept(Keep, P, T, Acc), Susp2}
                  end
          end,
    {{Reds, Qs, Hs, N, Acc, {SuspN, SuspPids}}, Stalled, Trunc} =
        beamdiag_agent_pinfo:fold(Fun, {Reds0, Qs0, Hs0, 0, [], {0, []}}, Pids, Items ++ [status],
                                  #{deadline => Deadline}),
    {Acc, (tops(Reds, Qs, Hs, N))#{suspended => {SuspN, lists:reverse(SuspPids)}}, Trunc,
     Stalled}.

%% The processes found suspended (on a busy port, or by
%% erlang:suspend_process/1): all counted, the first ?SUSPENDED kept.
suspended(P, {N, Ps}) when N < ?SUSPENDED -> {N + 1, [P | Ps]};
suspended(_P, {N, Ps}) -> {N + 1, Ps}.

%% At the end: queues by growth over the window plus length at its end.
queue_key(P, T, Base) ->
    Q0 = case Base of
             #{P := BT} -> element(2, BT);
             _ -> 0
         end,
    Q1 = element(2, T),
    case Q1 > 0 orelse Q0 > 0 of
        true -> max(0, Q1 - Q0) + Q1;
        false -> 0
    end.

%% A process's items as a tuple, and its status. The match follows
%% ?ITEMS: reductions, message_queue_len, heap_size, then the initial call
%% when it was asked for, then the status (read by the walks only).
to_tuple([{_, R}, {_, Q}, {_, H}, {status, S}]) -> {{R, Q, H}, S};
to_tuple([{_, R}, {_, Q}, {_, H}, {_, I}, {status, S}]) -> {{R, Q, H, I}, S};
to_tuple([{_, R}, {_, Q}, {_, H}]) -> {R, Q, H};
to_tuple([{_, R}, {_, Q}, {_, H}, {_, I}]) -> {R, Q, H, I}.

tops(none, Qs, Hs, N) -> #{queues => Qs, heaps => Hs, walked => N};
tops(Reds, Qs, Hs, N) -> #{reductions => Reds, queues => Qs, heaps => Hs, walked => N}.

kept(true, P, T, Acc) -> [{P, T} | Acc];
kept(false, _P, _T, Acc) -> Acc.

%% A top: {Capacity, Size, Kept}, Kept ascending by key (the smallest
%% first); only positive keys enter.
top_new(Capacity) ->
    {Capacity, 0, []}.

%% Pid P with items T, under key K (the entry kept is {P, T}).
consider(K, _P, _T, Top) when K =< 0 ->
    Top;
consider(K, _P, _T, Top = {Cap, Cap, [{Min, _} | _]}) when K =< Min ->
    Top;
consider(K, P, T, {Cap, Size, Kept}) when Size < Cap ->
    {Cap, Size + 1, insert({K, {P, T}}, Kept)};
consider(K, P, T, {Cap, Size, [_ | Rest]}) ->
    {Cap, Size, insert({K, {P, T}}, Rest)}.

insert({K, _} = KI, [{K2, _} = H | T]) when K > K2 -> [H | insert(KI, T)];
insert(KI, L) -> [KI | L].

%% A top's items ({Pid, items} for a walk's), largest first.
top_items({_, _, Kept}) ->
    [I || {_, I} <- lists:reverse(Kept)].

top_pids(Top) ->
    [P || {P, _} <- top_items(Top)].

%% Of {Pid, Key} pairs, the pids of the N largest positive keys, largest
%% first.
top(Pairs, N) ->
    [P || {P, _} <- top_items(lists:foldl(fun({P, K}, Top) -> consider(K, P, K, Top) end,
                                          top_new(N), Pairs))].

%% The memory of each process, read, or estimated when its queue (from
%% the walk's figures, Walked: pid => tuple) is beyond the bound or it did
%% not answer a read before (Known): the map, the pids whose memory is an
%% estimate, and those that did not answer.
memories(Pids, Walked, Known) ->
    W = erlang:system_info(wordsize),
    {Est, Ask} = lists:partition(fun(P) ->
                                         case maps:find(P, Walked) of
                                             {ok, T} -> element(2, T) > ?QUEUE_BOUND orelse
                                                            is_map_key(P, Known);
                                             error -> false
                                         end
                                 end, [P || P <- Pids, is_map_key(P, Walked) orelse
                                                           not is_map_key(P, Known)]),
    Estimated = maps:from_list([{P, element(3, T) * W + element(2, T) * ?MSG_BYTES}
                                || P <- Est, T <- [maps:get(P, Walked)]]),
    {Read, Stalled} = beamdiag_agent_pinfo:read(Ask, [memory], #{}),
    Mem = maps:fold(fun(P, [{memory, M}], Acc) -> Acc#{P => M} end, Estimated, Read),
    {Mem, maps:from_list([{P, true} || P <- Est]), Stalled}.

%% Memory at the start: measured for the start's largest heaps, otherwise
%% the young heap then (a small process's heap is mostly young).
start_memory(P, Mem0, Base) ->
    case maps:find(P, Mem0) of
        {ok, M} -> M;
        error ->
            case maps:find(P, Base) of
                {ok, {_, _, H}} -> H * erlang:system_info(wordsize);
                error -> 0
            end
    end.

%% What the report says of a process beside its name. Reads: the queue
%% watch's readings by pid; Ends: the walks' times (nanoseconds) and the
%% rows the watch stood in for at the end (`ended').
info_fun(End, Mem0, Mem1, Base, Est, Reads, #{t0_ns := T0, t1_ns := T1, ended := Ended}) ->
    fun(P) ->
        Read = maps:get(P, Reads, none),
        {R0, Q0, Q0t} = case {maps:find(P, Base), Read} of
                            {{ok, {R, Q, _}}, _} -> {R, Q, T0};
                            {error, #{first := F, first_t := Ft}} -> {0, F, Ft};
                            {error, none} -> {0, null, T0}
                        end,
        T = maps:get(P, End),
        {R1, Q1, H1} = {element(1, T), element(2, T), element(3, T)},
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
                 error -> start_memory(P, Mem0, Base)
             end,
        Nums = #{reductions => R1 - R0, queue => [Q0, Q1], memory => [M0, M1],
                 memory_estimated => is_map_key(P, Est),
                 heap_words => H1, born => not is_map_key(P, Base) andalso Read =:= none},
        case Q0t =:= T0 andalso Q1t =:= T1 of
            true -> Nums;
            false -> Nums#{queue_ms => max(0, (Q1t - Q0t) div 1000000)}
        end
    end.

%% The watch's readings by pid.
reads_by_pid(Reads) ->
    maps:from_list([{to_pid(Text), R} || {Text, R} <- maps:to_list(Reads)]).

%% Registered names by pid (no process is asked: the name table is the
%% runtime's).
registered_names() ->
    maps:from_list([{P, N} || N <- erlang:registered(), P <- [erlang:whereis(N)], is_pid(P)]).

merge_stalled(Lists) ->
    maps:to_list(lists:foldl(fun({P, W}, Acc) -> Acc#{P => max(W, maps:get(P, Acc, 0))} end,
                             #{}, lists:append(Lists))).

%% The processes that did not answer a read in time, as entries: the pid,
%% the registered name (the runtime's table, not the process, says it) and
%% the longest wait.
stalled_entries(Stalled, Names) ->
    [#{pid => list_to_binary(pid_to_list(P)), name => name(maps:get(P, Names, [])),
       waited_ms => W} || {P, W} <- lists:sublist(lists:reverse(lists:keysort(2, Stalled)), ?TOP)].

%% The identities of the processes reported, in one guarded read (and,
%% for proc_lib processes on releases without the `{dictionary, Key}'
%% item, a second one), leaving out those known not to answer (Known: pid
%% => ms waited): {answers, their dictionaries, pid => ms waited}.
identities(Pids, Known) ->
    Dict = dict_items(),
    Items = ?IDENTITY ++ [{dictionary, K} || Dict, K <- ['$initial_call', '$process_label']],
    {Read, Stalled} = beamdiag_agent_pinfo:read([P || P <- Pids, not is_map_key(P, Known)],
                                                Items, #{}),
    %% Before OTP 26.2: the whole dictionary of proc_lib processes.
    PlDicts = case Dict of
                  true -> #{};
                  false ->
                      Pl = [P || {P, [_, {initial_call, {proc_lib, init_p, _}} | _]}
                                     <- maps:to_list(Read)],
                      element(1, beamdiag_agent_pinfo:read(Pl, [dictionary], #{}))
              end,
    {Read, PlDicts, maps:merge(Known, maps:from_list(Stalled))}.

%% The entries of the processes, from their identities; a process that did
%% not answer gets what the runtime knows without it (`answered => false').
entries(Pids, Info, Like, Names, {Read, PlDicts, Stalled}) ->
    lists:append([case maps:find(P, Read) of
                      {ok, Items1} -> identify(P, Info(P), Like, Items1, maps:get(P, PlDicts, none));
                      error ->
                          case maps:find(P, Stalled) of
                              {ok, W} -> [unanswered(P, Info(P), Names, W)];
                              error -> []   % gone
                          end
                  end || P <- Pids]).

unanswered(P, Nums, Names, Waited) ->
    Nums#{pid => list_to_binary(pid_to_list(P)), name => name(maps:get(P, Names, [])),
          initial_call => <<"?">>, spawn_call => <<"?">>, label => null, current => <<"?">>,
          monitored_by => 0, status => <<"?">>, like => null, answered => false,
          waited_ms => Waited}.

%% What names a process to a person; beamdiag's own helpers on the target
%% (the sampler, the lock-counting guard: running code of beamdiag_agent*
%% modules) are left out, as the agent itself is.
identify(P, Nums, Like, Items, PlDict) ->
    case Items of
        [_, _, {_, {M, _, _}} | _] when is_atom(M) ->
            case lists:prefix("beamdiag_agent", atom_to_list(M)) of
                true -> [];
                false -> identified(P, Nums, Like, Items, PlDict)
            end;
        _ ->
            identified(P, Nums, Like, Items, PlDict)
    end.

identified(P, Nums, Like, Items, PlDict) ->
    [{_, Name}, {_, Init}, {_, Cur}, {_, Mons}, {_, Status} | DictItems] = Items,
    {IcVal, LabelVal} = case DictItems of
                            [{_, I}, {_, L}] -> {I, L};
                            [] ->
                                case PlDict of
                                    [{dictionary, D}] -> {proplists:get_value('$initial_call', D),
                                                          undefined};
                                    _ -> {undefined, undefined}
                                end
                        end,
    Ic = case {Init, IcVal} of
             {{proc_lib, init_p, _}, {M, F, A}} when is_atom(M), is_atom(F), is_integer(A) ->
                 {M, F, A};
             _ -> Init
         end,
    [Nums#{
        pid => list_to_binary(pid_to_list(P)),
        name => name(Name),
        initial_call => mfa(Ic),
        spawn_call => mfa(Init),
        label => label(LabelVal),
        current => mfa(Cur),
        monitored_by => length(Mons),
        status => atom_to_binary(Status, utf8),
        like => maps:get(mfa(Ic), Like, null)
    }].

name([]) -> null;
name(N) when is_atom(N) -> atom_to_binary(N, utf8).

%% Whether process_info takes `{dictionary, Key}' (erts 14.2, OTP 26.2,
%% unknown to the OTP 25 contract: tried on the caller itself).
dict_items() ->
    try dynamic(erlang, process_info, [self(), [{dictionary, '$initial_call'}]]) of
        [_] -> true;
        _ -> false
    catch
        error:badarg -> false
    end.

%% A process label (proc_lib:set_label/1, OTP 27) as bounded text.
label(undefined) -> null;
label(L) -> iolist_to_binary(io_lib:format("~0tp", [L], [{chars_limit, 80}])).

%% For the largest heaps: how many processes share each one's initial
%% call, from the end walk (proc_lib's initial call, for proc_lib
%% processes: read for at most ?LIKE_READS of them). A sampled or
%% registered walk has no count.
like_counts(all, Pids, End, Walked) ->
    Heaps = [{P, element(4, maps:get(P, End))} || P <- Pids, is_map_key(P, End),
                                                   tuple_size(maps:get(P, End)) =:= 4],
    Pl = lists:sublist([P || {P, {_, _, _, {proc_lib, init_p, _}}} <- Walked], ?LIKE_READS),
    PlCalls = proc_lib_calls(lists:usort(Pl ++ [P || {P, {proc_lib, init_p, _}} <- Heaps])),
    Wanted = lists:usort([Ic || {P, Init} <- Heaps,
                                Ic <- [maps:get(P, PlCalls, Init)], likeable(Ic)]),
    case Wanted of
        [] -> #{};
        _ -> count_like(Walked, Wanted, PlCalls, #{})
    end;
like_counts(_, _, _, _) ->
    #{}.

count_like([], _Wanted, _PlCalls, Acc) ->
    Acc;
count_like([{P, {_, _, _, Init}} | Ps], Wanted, PlCalls, Acc) ->
    count_like(Ps, Wanted, PlCalls, bump(maps:get(P, PlCalls, Init), Wanted, Acc));
count_like([_ | Ps], Wanted, PlCalls, Acc) ->
    count_like(Ps, Wanted, PlCalls, Acc).

%% The initial calls proc_lib recorded, by pid, in one guarded read.
proc_lib_calls(Pids) ->
    Items = case dict_items() of
                true -> [{dictionary, '$initial_call'}];
                false -> [dictionary]
            end,
    {Read, _} = beamdiag_agent_pinfo:read(Pids, Items, #{}),
    maps:fold(fun(P, [{_, V}], Acc) ->
                      Ic = case V of
                               D when is_list(D) -> proplists:get_value('$initial_call', D);
                               _ -> V
                           end,
                      case Ic of
                          {M, F, A} when is_atom(M), is_atom(F), is_integer(A) -> Acc#{P => Ic};
                          _ -> Acc
                      end
              end, #{}, Read).

%% A process spawned from a fun shows erlang:apply/2 as its initial call,
%% which says nothing about what it is: no count for it.
likeable({erlang, apply, 2}) -> false;
likeable({_, _, _}) -> true;
likeable(_) -> false.

bump(Ic, Wanted, Acc) ->
    case lists:member(Ic, Wanted) of
        true -> maps:update_with(mfa(Ic), fun(N) -> N + 1 end, 1, Acc);
        false -> Acc
    end.

%% A call to a function that exists only on some OTP releases (checked by
%% the caller with erlang:function_exported/3): not resolved at compile
%% time, so the module loads on every release.
dynamic(M, F, A) ->
    erlang:apply(M, F, A).

mfa({M, F, A}) when is_atom(M), is_atom(F), is_integer(A) ->
    iolist_to_binary([atom_to_binary(M, utf8), $:, atom_to_binary(F, utf8), $/,
                      integer_to_list(A)]);
mfa(_) ->
    <<"undefined">>.
