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
%%% 2> R = beamdiag_agent_processes:finish(S).
%%% 3> [maps:get(name, E) || E <- maps:get(top_reductions, R)].
%%% [<<"code_server">>, null, ...]
%%% '''
-module(beamdiag_agent_processes).

-export([start/1, finish/1, next/1, snapshot/1, watch/1, advance/3]).

-export_type([state/0, report/0, entry/0]).

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
    estimated := #{pid() => true}
}.
-type entry() :: #{atom() => term()}.
-type report() :: #{atom() => term()}.

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

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The walk at the window's start. Options: `skip', pids left out
%% (the agent's own; `self()' always is), `walk_max' (tests only).
-spec start(map()) -> state().
start(Opts) ->
    Skip = [self() | maps:get(skip, Opts, [])],
    Count = erlang:system_info(process_count),
    Max = maps:get(walk_max, Opts, ?WALK_MAX),
    T0 = erlang:monotonic_time(microsecond),
    {Reds0, _} = erlang:statistics(reductions),
    {Mode, Pids} = pids(Count, Max),
    %% (The subtraction runs in C: a few microseconds for a few pids.)
    {Walked, Tops, Trunc} = walk(Pids -- Skip, T0 + ?WALK_MS * 1000, ?ITEMS, #{}, true,
                                 #{queues => top_new(?TOP), heaps => top_new(?MEM_CANDIDATES)}),
    Base = maps:from_list(Walked),
    Queues = top_pids(maps:get(queues, Tops)),
    %% The largest heaps and the longest queues (a flooded mailbox is the
    %% memory that grows).
    {Mem0, Est0} = memories(lists:usort(top_pids(maps:get(heaps, Tops)) ++ Queues), Base),
    T1 = erlang:monotonic_time(microsecond),
    #{
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
%% entries, binaries and numbers only.
-spec finish(state()) -> report().
finish(S) ->
    element(1, report(S, false)).

%% @doc The report since the last walk, and the state that makes the end
%% walk the start of the next span: one walk per report (watch takes one
%% every few ticks).
-spec next(state()) -> {report(), state()}.
next(S) ->
    {Report, #{t1 := T1, reds1 := Reds1, count := Count, 'end' := End, mem1 := Mem1,
               walk_us := W, truncated := Trunc, estimated := Est, queues := Qs}} = report(S, true),
    {Report, S#{t0 := T1, reds0 := Reds1, count0 := Count, estimated := Est,
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
    {Walked, Tops, Trunc} =
        walk(Pids -- Skip, T1 + ?WALK_MS * 1000, Items, Base, Keep orelse Like,
             #{reductions => top_new(?TOP), queues => top_new(?TOP),
               heaps => top_new(?MEM_CANDIDATES)}),
    TopReds = top_items(maps:get(reductions, Tops)),
    Queues = top_items(maps:get(queues, Tops)),
    HeapRows = top_items(maps:get(heaps, Tops)),
    %% The end walk's figures by pid for the candidates only (a map of the
    %% whole walk costs more than the walk): the tops' rows, and the start's
    %% candidates read again (a walk cut short by its time limit may have
    %% missed some; those gone since are left out).
    Rows = maps:from_list(TopReds ++ Queues ++ HeapRows),
    End = maps:fold(fun(P, _, Acc) when is_map_key(P, Acc) -> Acc;
                       (P, _, Acc) ->
                            case items(P, Items) of
                                gone -> Acc;
                                T -> Acc#{P => T}
                            end
                    end, Rows, Mem0),
    {Mem1, Est1} = memories(maps:keys(End), End),
    Est = maps:merge(maps:get(estimated, S, #{}), Est1),
    Heaps = top(maps:to_list(Mem1), ?TOP),
    Growth = top([{P, M - start_memory(P, Mem0, Base)} || {P, M} <- maps:to_list(Mem1)], ?TOP),
    T2 = erlang:monotonic_time(microsecond),
    Info = info_fun(End, Mem0, Mem1, Base, Est),
    LikeCounts = case Like of
                     true -> like_counts(Mode, Heaps, End, Walked);
                     false -> #{}
                 end,
    Report = #{
        mode => Mode,
        limit => maps:get(limit, S),
        span_ms => (T1 - T0) div 1000,
        reductions => max(0, Reds1 - Reds0),
        process_count => [maps:get(count0, S), Count],
        scanned => [map_size(Base), maps:get(walked, Tops)],
        walk_us => [maps:get(walk_us, S), T2 - T1],
        truncated => maps:get(truncated, S) orelse Trunc,
        top_reductions => entries([P || {P, _} <- TopReds], Info, #{}),
        queues => entries([P || {P, _} <- Queues], Info, #{}),
        heaps => entries(Heaps, Info, LikeCounts),
        heap_growth => entries(Growth, Info, #{})
    },
    {Report#{identify_us => erlang:monotonic_time(microsecond) - T2},
     #{t1 => T1, reds1 => Reds1, count => Count, 'end' => Walked, mem1 => Mem1, walk_us => T2 - T1,
       truncated => Trunc, estimated => Est1,
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
        queues => entries(Queues, Info, #{}),
        heaps => entries(Heaps, Info, #{}),
        heap_growth => [],
        partial => start
    }.

%% @doc The processes whose queue length the agent reads each tick: the
%% longest queues at the start (at most ?TOP, non-empty ones only).
-spec watch(state()) -> [pid()].
watch(#{queues0 := Queues}) ->
    Queues.

%% @doc A start-walk report (`snapshot/1') brought forward with the queue
%% lengths read at a later tick (pid text => length) SpanMs after the
%% walk: the queue entries' end lengths and the span.
-spec advance(report(), #{binary() => non_neg_integer()}, non_neg_integer()) -> report().
advance(R = #{queues := Qs}, Lengths, SpanMs) ->
    Qs2 = [case maps:find(Pid, Lengths) of
               {ok, Q1} -> forward_memory(E#{queue := [Q0, Q1]}, Q1 - Q0);
               error -> E
           end || E = #{pid := Pid, queue := [Q0, _]} <- Qs],
    R#{queues := Qs2, span_ms := SpanMs, partial := start_and_ticks};
advance(R, _, _) ->
    R.

%% An estimated memory grows with the queue.
forward_memory(E = #{memory_estimated := true, memory := [M0, _]}, Dq) when is_integer(M0) ->
    E#{memory := [M0, max(0, M0 + Dq * ?MSG_BYTES)]};
forward_memory(E, _) ->
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
%% add initial_call): {Walked, Tops, Truncated}. Walked, only when Keep is
%% true: {Pid, the items as a tuple} for every process. Tops: the largest
%% keys of the kinds asked for in Tops0 (reductions: over the window, from
%% Base, the start walk's figures; queues: at the start the length, at the
%% end its growth plus its length; heaps: the young heap), kept as
%% {Pid, items} in one pass (no list of every process to rank), and
%% `walked', the count read. Stops at Deadline (checked every 1024
%% processes).
walk(Pids, Deadline, Items, Base, Keep, Tops0) ->
    Reds = maps:get(reductions, Tops0, none),
    #{queues := Qs, heaps := Hs} = Tops0,
    walk(Pids, Deadline, Items, Base, Keep, Reds, Qs, Hs, 0, []).

walk([], _Deadline, _Items, _Base, _Keep, Reds, Qs, Hs, N, Acc) ->
    {Acc, tops(Reds, Qs, Hs, N), false};
walk([P | Ps], Deadline, Items, Base, Keep, Reds, Qs, Hs, N, Acc) ->
    case N band 1023 =:= 1023 andalso erlang:monotonic_time(microsecond) > Deadline of
        true ->
            {Acc, tops(Reds, Qs, Hs, N), true};
        false ->
            T = items(P, Items),
            case T of
                gone ->
                    walk(Ps, Deadline, Items, Base, Keep, Reds, Qs, Hs, N, Acc);
                _ when Reds =:= none ->
                    %% The start walk: queues by length.
                    walk(Ps, Deadline, Items, Base, Keep, Reds,
                         consider(element(2, T), P, T, Qs), consider(element(3, T), P, T, Hs),
                         N + 1, kept(Keep, P, T, Acc));
                _ ->
                    {R0, Q0} = case Base of
                                   #{P := {BR, BQ, _}} -> {BR, BQ};
                                   _ -> {0, 0}
                               end,
                    Q1 = element(2, T),
                    %% Queues by growth over the window plus length at its end.
                    QKey = case Q1 > 0 orelse Q0 > 0 of
                               true -> max(0, Q1 - Q0) + Q1;
                               false -> 0
                           end,
                    walk(Ps, Deadline, Items, Base, Keep, consider(element(1, T) - R0, P, T, Reds),
                         consider(QKey, P, T, Qs), consider(element(3, T), P, T, Hs),
                         N + 1, kept(Keep, P, T, Acc))
            end
    end.

%% A process's items as a tuple, or `gone'. The match follows ?ITEMS:
%% reductions, message_queue_len, heap_size, then the initial call when it
%% was asked for.
items(P, Items) ->
    case erlang:process_info(P, Items) of
        [{_, R}, {_, Q}, {_, H}] -> {R, Q, H};
        [{_, R}, {_, Q}, {_, H}, {_, I}] -> {R, Q, H, I};
        _ -> gone
    end.

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
%% the walk's figures, Walked: pid => tuple) is beyond the bound: the map,
%% and the pids whose memory is an estimate.
memories(Pids, Walked) ->
    W = erlang:system_info(wordsize),
    lists:foldl(
        fun(P, {Mem, Est}) ->
            case maps:find(P, Walked) of
                {ok, T} when element(2, T) > ?QUEUE_BOUND ->
                    {Mem#{P => element(3, T) * W + element(2, T) * ?MSG_BYTES}, Est#{P => true}};
                _ ->
                    case erlang:process_info(P, memory) of
                        {memory, M} -> {Mem#{P => M}, Est};
                        _ -> {Mem, Est}
                    end
            end
        end,
        {#{}, #{}}, Pids).

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

info_fun(End, Mem0, Mem1, Base, Est) ->
    fun(P) ->
        {R0, Q0} = case maps:find(P, Base) of
                       {ok, {R, Q, _}} -> {R, Q};
                       error -> {0, null}
                   end,
        T = maps:get(P, End),
        {R1, Q1, H1} = {element(1, T), element(2, T), element(3, T)},
        M1 = case maps:find(P, Mem1) of
                 {ok, M} -> M;
                 error -> null
             end,
        M0 = case maps:find(P, Mem0) of
                 {ok, MM} -> MM;
                 error when M1 =:= null -> null;
                 error -> start_memory(P, Mem0, Base)
             end,
        #{reductions => R1 - R0, queue => [Q0, Q1], memory => [M0, M1],
          memory_estimated => is_map_key(P, Est),
          heap_words => H1, born => not is_map_key(P, Base)}
    end.

entries(Pids, Info, Like) ->
    lists:append([identify(P, Info(P), Like) || P <- Pids]).

%% What names a process to a person; beamdiag's own helpers on the target
%% (the sampler, the lock-counting guard: running code of beamdiag_agent*
%% modules) are left out, as the agent itself is.
identify(P, Nums, Like) ->
    Items = erlang:process_info(P, ?IDENTITY),
    case Items of
        [_, _, {_, {M, _, _}}, _, _] when is_atom(M) ->
            case lists:prefix("beamdiag_agent", atom_to_list(M)) of
                true -> [];
                false -> identified(P, Nums, Like, Items)
            end;
        _ ->
            identified(P, Nums, Like, Items)
    end.

identified(P, Nums, Like, Items) ->
    case Items of
        [{_, Name}, {_, Init}, {_, Cur}, {_, Mons}, {_, Status}] ->
            Ic = proc_lib_initial_call(P, Init),
            [Nums#{
                pid => list_to_binary(pid_to_list(P)),
                name => case Name of
                            [] -> null;
                            _ -> atom_to_binary(Name, utf8)
                        end,
                initial_call => mfa(Ic),
                spawn_call => mfa(Init),
                label => label(P),
                current => mfa(Cur),
                monitored_by => length(Mons),
                status => atom_to_binary(Status, utf8),
                like => maps:get(mfa(Ic), Like, null)
            }];
        _ ->
            []
    end.

%% The initial call proc_lib recorded, or the spawn's.
proc_lib_initial_call(P, Init = {proc_lib, init_p, _}) ->
    case dict_value(P, '$initial_call') of
        {ok, {M, F, A}} when is_atom(M), is_atom(F), is_integer(A) -> {M, F, A};
        _ -> Init
    end;
proc_lib_initial_call(_P, Init) ->
    Init.

%% One key of a process's dictionary: read alone where the emulator allows
%% it (OTP 26.2 and later), otherwise from the whole dictionary.
dict_value(P, Key) ->
    %% (erts 14.2's item, unknown to the OTP 25 contract.)
    try dynamic(erlang, process_info, [P, {dictionary, Key}]) of
        {{dictionary, Key}, undefined} -> error;
        {{dictionary, Key}, V} -> {ok, V};
        _ -> error
    catch
        error:badarg ->
            case erlang:process_info(P, dictionary) of
                {dictionary, D} ->
                    case lists:keyfind(Key, 1, D) of
                        {Key, V} -> {ok, V};
                        false -> error
                    end;
                _ -> error
            end
    end.

%% proc_lib:get_label/1 exists from OTP 27.
label(P) ->
    case erlang:function_exported(proc_lib, get_label, 1) of
        true ->
            try dynamic(proc_lib, get_label, [P]) of
                undefined -> null;
                L -> iolist_to_binary(io_lib:format("~0tp", [L], [{chars_limit, 80}]))
            catch
                _:_ -> null
            end;
        false ->
            null
    end.

%% For the largest heaps: how many processes share each one's initial
%% call, from the end walk (proc_lib's initial call, for proc_lib
%% processes: read for at most ?LIKE_READS of them). A sampled or
%% registered walk has no count.
like_counts(all, Pids, End, Walked) ->
    Wanted = lists:usort([Ic || P <- Pids, is_map_key(P, End),
                                tuple_size(maps:get(P, End)) =:= 4,
                                Ic <- [proc_lib_initial_call(P, element(4, maps:get(P, End)))],
                                likeable(Ic)]),
    case Wanted of
        [] -> #{};
        _ -> count_like(Walked, Wanted, ?LIKE_READS, #{})
    end;
like_counts(_, _, _, _) ->
    #{}.

count_like([], _Wanted, _Left, Acc) ->
    Acc;
count_like([{P, {_, _, _, Init = {proc_lib, init_p, _}}} | Ps], Wanted, Left, Acc) when Left > 0 ->
    count_like(Ps, Wanted, Left - 1, bump(proc_lib_initial_call(P, Init), Wanted, Acc));
count_like([{_, {_, _, _, Init}} | Ps], Wanted, Left, Acc) ->
    count_like(Ps, Wanted, Left, bump(Init, Wanted, Acc));
count_like([_ | Ps], Wanted, Left, Acc) ->
    count_like(Ps, Wanted, Left, Acc).

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
