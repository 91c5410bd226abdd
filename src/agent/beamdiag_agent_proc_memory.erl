%%% @doc Process memory for the process walks, read or estimated, on the
%%% target (erts, kernel and stdlib only; `estimate/3' and `grown/2' are
%%% pure and also serve the operator's side, beamdiag_proc_forward).
%%%
%%% `memory' is read only for the candidates a walk names (the largest
%%% heaps at each end, the longest queues, the processes reported), never
%%% for every process. A flooded mailbox: `process_info(P, memory)' walks
%%% P's whole message queue (measured on OTP 25: 90 to 250 ms for 8 million
%%% queued messages, on a busy node more), so for a process whose queue
%%% holds more than `?QUEUE_BOUND' messages it is not asked: its memory is
%%% estimated as its young heap (`heap_size' words) plus `?MSG_BYTES' a
%%% queued message (a small message's measured cost on OTP 25; larger
%%% messages hold more), and the report says so (`memory_estimated').
%%% `messages' is never read. A process that did not answer a read before
%%% is estimated too: asking again would wait as long.
%%%
%%% ```
%%% 1> beamdiag_agent_proc_memory:estimate(233, 20000, 8).
%%% 2241864
%%% 2> {Mem, Est, []} = beamdiag_agent_proc_memory:read([self()], #{self() => {0, 0, 233}}, #{}).
%%% 3> {maps:get(self(), Mem) > 0, Est}.
%%% {true,#{}}
%%% '''
-module(beamdiag_agent_proc_memory).

-export([read/3, at_start/3, estimate/3, grown/2, binaries/3, binaries_memory_max/0]).

%% Above this many queued messages a process's memory is estimated, not read.
-define(QUEUE_BOUND, 10000).
%% Above this much memory a process's binaries are not listed: the list
%% process_info(P, binary) returns has an entry per reference-counted
%% binary it points to, each a few words on its heap, so a heap this size
%% bounds it (about 130,000 entries).
-define(BINARIES_MEMORY_MAX, 8388608).
%% The holders reported, at most.
-define(BINARIES_TOP, 10).

%% Bytes a small queued message holds beyond its data (measured on OTP 25:
%% 112 bytes for a 3-word tuple, of which 88 outside the heap).
-define(MSG_BYTES, 112).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The reference-counted binaries a few processes hold (Pids: the
%% walks' candidates; Mem: their memory, bytes): for each, how many
%% binaries it references, their bytes, and the bytes of those it alone
%% references (a reference count of 1), the largest holders first, at most
%% ?BINARIES_TOP, and none below MinBytes. A process above
%% ?BINARIES_MEMORY_MAX of memory is not asked (its list would be too
%% long), nor one with a long queue (Walked, as for read/3), and the reads
%% are those of beamdiag_agent_pinfo (a process that does not answer is
%% left out).
-spec binaries([pid()], #{pid() => non_neg_integer()}, non_neg_integer()) ->
    [#{pid := pid(), count := non_neg_integer(), bytes := non_neg_integer(),
       sole_bytes := non_neg_integer()}].
binaries(Pids, Mem, MinBytes) ->
    Ask = [P || P <- Pids, maps:get(P, Mem, ?BINARIES_MEMORY_MAX + 1) =< ?BINARIES_MEMORY_MAX],
    {Held, _Stalled, _} =
        beamdiag_agent_pinfo:fold(
          fun(P, [{binary, Bins}], Acc) when is_list(Bins) ->
                  {N, B, Sole} = lists:foldl(fun({_, Size, 1}, {N0, B0, S0}) -> {N0 + 1, B0 + Size, S0 + Size};
                                                ({_, Size, _}, {N0, B0, S0}) -> {N0 + 1, B0 + Size, S0}
                                             end, {0, 0, 0}, Bins),
                  case B >= MinBytes of
                      true -> [#{pid => P, count => N, bytes => B, sole_bytes => Sole} | Acc];
                      false -> Acc
                  end;
             (_, _, Acc) ->
                  Acc
          end, [], lists:usort(Ask), [binary], #{}),
    lists:sublist(lists:reverse(lists:sort(fun(#{bytes := A}, #{bytes := B}) -> A =< B end, Held)),
                  ?BINARIES_TOP).

%% @doc The memory (bytes) above which a process's binaries are not
%% listed by binaries/3: the rules name such processes apart.
-spec binaries_memory_max() -> pos_integer().
binaries_memory_max() ->
    ?BINARIES_MEMORY_MAX.

%% @doc The memory of each of Pids, read, or estimated when its queue
%% (from a walk's figures, Walked: pid => figures tuple) is beyond the bound
%% or it did not answer a read before (Known: pid => ms waited): the map
%% (bytes), the pids whose memory is an estimate, and those that did not
%% answer the read. A pid known not to answer and absent from Walked is
%% left out.
-spec read([pid()], #{pid() => tuple()}, #{pid() => term()}) ->
          {#{pid() => non_neg_integer()}, #{pid() => true}, [beamdiag_agent_pinfo:stalled()]}.
read(Pids, Walked, Known) ->
    W = erlang:system_info(wordsize),
    {Est, Ask} = lists:partition(fun(P) ->
                                         case maps:find(P, Walked) of
                                             {ok, T} -> element(2, T) > ?QUEUE_BOUND orelse
                                                            is_map_key(P, Known);
                                             error -> false
                                         end
                                 end, [P || P <- Pids, is_map_key(P, Walked) orelse
                                                           not is_map_key(P, Known)]),
    Estimated = maps:from_list([{P, estimate(element(3, T), element(2, T), W)}
                                || P <- Est, T <- [maps:get(P, Walked)]]),
    {Read, Stalled} = beamdiag_agent_pinfo:read(Ask, [memory], #{}),
    Mem = maps:fold(fun(P, [{memory, M}], Acc) -> Acc#{P => M} end, Estimated, Read),
    {Mem, maps:from_list([{P, true} || P <- Est]), Stalled}.

%% @doc A process's memory at the start of a span: measured (Mem0) for the
%% start's candidates, otherwise its young heap then (from Base, the start
%% walk's figures: a small process's heap is mostly young), 0 for one the
%% start walk did not read.
-spec at_start(pid(), #{pid() => non_neg_integer()}, #{pid() => tuple()}) -> non_neg_integer().
at_start(P, Mem0, Base) ->
    case maps:find(P, Mem0) of
        {ok, M} -> M;
        error ->
            case maps:find(P, Base) of
                {ok, {_, _, H}} -> H * erlang:system_info(wordsize);
                error -> 0
            end
    end.

%% @doc The memory estimate of a process with HeapWords of young heap and
%% Queue messages waiting, on a node of WordBytes words (bytes).
-spec estimate(non_neg_integer(), non_neg_integer(), pos_integer()) -> non_neg_integer().
estimate(HeapWords, Queue, WordBytes) ->
    HeapWords * WordBytes + Queue * ?MSG_BYTES.

%% @doc An estimated memory M0 after its queue grew by Dq messages (or
%% shrank, Dq negative; never below 0).
-spec grown(non_neg_integer(), integer()) -> non_neg_integer().
grown(M0, Dq) ->
    max(0, M0 + Dq * ?MSG_BYTES).
