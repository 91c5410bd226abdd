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
    {Walked, Trunc} = walk(Pids, Skip, T0 + ?WALK_MS * 1000, ?ITEMS),
    Base = maps:from_list(Walked),
    %% The largest heaps and the longest queues (a flooded mailbox is the
    %% memory that grows).
    {Mem0, Est0} = memories(lists:usort(top_heaps(Walked, ?MEM_CANDIDATES) ++
                                        top_queues(Walked, ?TOP)), Base),
    T1 = erlang:monotonic_time(microsecond),
    #{
        mode => Mode,
        t0 => T0,
        reds0 => Reds0,
        count0 => Count,
        base => Base,
        mem0 => Mem0,
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
    element(1, report(S)).

%% @doc The report since the last walk, and the state that makes the end
%% walk the start of the next span: one walk per report (watch takes one
%% every few ticks).
-spec next(state()) -> {report(), state()}.
next(S) ->
    {Report, #{t1 := T1, reds1 := Reds1, count := Count, 'end' := End, mem1 := Mem1,
               walk_us := W, truncated := Trunc, estimated := Est}} = report(S),
    {Report, S#{t0 := T1, reds0 := Reds1, count0 := Count, estimated := Est,
                base := maps:from_list([{P, {element(1, T), element(2, T), element(3, T)}}
                                        || {P, T} <- End]),
                mem0 := Mem1, walk_us := W, truncated := Trunc}}.

%% The end walk: the report, and what the next span starts from.
report(S = #{mode := Mode, t0 := T0, reds0 := Reds0, base := Base, mem0 := Mem0, skip := Skip}) ->
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
    Items = case lists:any(fun(M) -> M >= ?LIKE_HEAP_BYTES end, maps:values(Mem0)) of
                true -> ?ITEMS ++ [initial_call];
                false -> ?ITEMS
            end,
    {Walked, Trunc} = walk(Pids, Skip, T1 + ?WALK_MS * 1000, Items),
    Rows = rows(Base, Walked),
    TopReds = top(fun({_, R, _, _}) -> R end, Rows, ?TOP),
    %% By growth over the window plus length at its end.
    Queues = top(fun({_, _, {Q0, Q1}, _}) -> max(0, Q1 - zero(Q0)) + Q1 end,
                 [Row || Row = {_, _, {Q0, Q1}, _} <- Rows, Q1 > 0 orelse zero(Q0) > 0], ?TOP),
    HeapPids = top_heaps(Walked, ?MEM_CANDIDATES),
    Named = [P || {P, _, _, _} <- TopReds ++ Queues],
    %% The end walk's figures by pid for the candidates only (a map of the
    %% whole walk costs more than the walk); only processes the end walk
    %% read (a walk cut short by its time limit may have missed some of the
    %% start's candidates).
    Candidates = maps:from_list([{P, true} || P <- HeapPids ++ maps:keys(Mem0) ++ Named]),
    End = maps:from_list([W || W = {P, _} <- Walked, is_map_key(P, Candidates)]),
    {Mem1, Est1} = memories(maps:keys(End), End),
    Est = maps:merge(maps:get(estimated, S, #{}), Est1),
    Heaps = top(fun({M, _}) -> M end, [{M, P} || {P, M} <- maps:to_list(Mem1)], ?TOP),
    Growth = top(fun({G, _}) -> G end,
                 [{M - start_memory(P, Mem0, Base), P} || {P, M} <- maps:to_list(Mem1),
                  M > start_memory(P, Mem0, Base)], ?TOP),
    T2 = erlang:monotonic_time(microsecond),
    Info = info_fun(End, Mem0, Mem1, Base, Est),
    Like = like_counts(Mode, [P || {_, P} <- Heaps], End, Walked),
    Report = #{
        mode => Mode,
        limit => maps:get(limit, S),
        span_ms => (T1 - T0) div 1000,
        reductions => max(0, Reds1 - Reds0),
        process_count => [maps:get(count0, S), Count],
        scanned => [map_size(Base), length(Walked)],
        walk_us => [maps:get(walk_us, S), T2 - T1],
        truncated => maps:get(truncated, S) orelse Trunc,
        top_reductions => entries([P || {P, _, _, _} <- TopReds], Info, #{}),
        queues => entries([P || {P, _, _, _} <- Queues], Info, #{}),
        heaps => entries([P || {_, P} <- Heaps], Info, Like),
        heap_growth => entries([P || {_, P} <- Growth], Info, #{})
    },
    {Report#{identify_us => erlang:monotonic_time(microsecond) - T2},
     #{t1 => T1, reds1 => Reds1, count => Count, 'end' => Walked, mem1 => Mem1, walk_us => T2 - T1,
       truncated => Trunc, estimated => Est1}}.

%% @doc A report from the start walk alone, in the shape `finish/1'
%% returns (no reductions over the window; queues and memory at the start
%% on both ends), marked `partial => start': what a capture cut short
%% keeps. Identifies at most 2 x ?TOP processes.
-spec snapshot(state()) -> report().
snapshot(S = #{mode := Mode, base := Base, mem0 := Mem0, count0 := Count}) ->
    Est = maps:get(estimated, S, #{}),
    Walked = maps:to_list(Base),
    Queues = [P || {P, _} <- top(fun({_, T}) -> element(2, T) end, Walked, ?TOP)],
    Heaps = [P || {_, P} <- top(fun({M, _}) -> M end,
                                [{M, P} || {P, M} <- maps:to_list(Mem0)], ?TOP)],
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
watch(#{base := Base}) ->
    [P || {P, _} <- top(fun({_, T}) -> element(2, T) end, maps:to_list(Base), ?TOP)].

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

%% One walk: {Pid, the items of the process as a tuple}; stops at the
%% deadline (checked every 1024 processes).
walk(Pids, Skip, Deadline, Items) ->
    walk(Pids, Skip, Deadline, Items, 0, []).

walk([], _Skip, _Deadline, _Items, _N, Acc) ->
    {Acc, false};
walk([P | Ps], Skip, Deadline, Items, N, Acc) ->
    case N band 1023 =:= 1023 andalso erlang:monotonic_time(microsecond) > Deadline of
        true ->
            {Acc, true};
        false ->
            Acc2 = case lists:member(P, Skip) of
                       true -> Acc;
                       false ->
                           case erlang:process_info(P, Items) of
                               L when is_list(L) -> [{P, list_to_tuple([V || {_, V} <- L])} | Acc];
                               _ -> Acc
                           end
                   end,
            walk(Ps, Skip, Deadline, Items, N + 1, Acc2)
    end.

%% {Pid, ReductionsInWindow, {QueueStart | null, QueueEnd}, HeapWordsEnd}
%% for every process alive at the end.
rows(Base, Walked) ->
    [{P, element(1, T) - R0, {Q0, element(2, T)}, element(3, T)}
     || {P, T} <- Walked,
        {R0, Q0} <- [case maps:find(P, Base) of
                         {ok, {R, Q, _}} -> {R, Q};
                         error -> {0, null}
                     end]].

zero(null) -> 0;
zero(N) -> N.

%% The N rows with the largest positive keys, largest first: one pass
%% that keeps the best N so far (no sort of the whole table).
top(Key, Rows, N) ->
    Best = lists:foldl(
        fun(R, Acc) ->
            case Key(R) of
                K when K > 0 -> keep({K, R}, Acc, N);
                _ -> Acc
            end
        end,
        {0, []},
        Rows),
    [R || {_, R} <- lists:reverse(element(2, Best))].

%% Acc is {Size, Kept}, Kept ascending by key (the smallest first).
keep(KR, {Size, Kept}, N) when Size < N ->
    {Size + 1, insert(KR, Kept)};
keep({K, _} = KR, {Size, [{Min, _} | Rest]}, _N) when K > Min ->
    {Size, insert(KR, Rest)};
keep(_, Acc, _N) ->
    Acc.

insert({K, _} = KR, [{K2, _} = H | T]) when K > K2 -> [H | insert(KR, T)];
insert(KR, L) -> [KR | L].

%% The pids with the largest young heaps, from a walk's tuples (the third
%% item is heap_size).
top_heaps(Walked, N) ->
    [P || {P, _} <- top(fun({_, T}) -> element(3, T) end, Walked, N)].

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

%% The pids with the longest queues, from a walk's tuples.
top_queues(Walked, N) ->
    [P || {P, _} <- top(fun({_, T}) -> element(2, T) end, Walked, N)].

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
