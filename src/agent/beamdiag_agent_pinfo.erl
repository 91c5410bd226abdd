%%% @doc `process_info/2' reads of many processes that never wait long on
%%% one of them. Runs on the target node (erts, kernel and stdlib only).
%%%
%%% A read of another process is answered by that process itself whenever
%%% it is running or has signals waiting (a mailbox that keeps receiving
%%% always has): the reader sends a request and waits until the process
%%% next handles its signals. A process held in a NIF answers when the NIF
%%% returns; a flooded one between its garbage collections, which copy its
%%% queued messages into its heap and take seconds once the queue holds
%%% millions (measured on OTP 25, 2 cores: reads of a consumer with 15 to
%%% 25 million queued messages waited 3.3 to 5.0 s). A walk that reads
%%% process after process waits as long.
%%%
%%% So the reads run in a reader process of their own, a chunk of pids at a
%%% time, and the reader says which process it is reading (an `atomics'
%%% index, one write a process). When the index has not moved for
%%% `stall_ms' (default 100 ms), that process is stalled: the reader is
%%% killed, the process is set aside with the time waited, and a new reader
%%% reads the rest of the chunk (the reads before it again: they were
%%% quick). Each reader is bound to the scheduler of the fold's caller,
%%% which waits for it: spawned plainly it may be queued on the held
%%% scheduler and not start until the hold ends (beamdiag_agent_spawn).
%%% Whoever waits gets the reads of every other process, and the list of
%%% those that did not answer, which are worth a look of their own.
%%%
%%% Cost: one spawn and one message a chunk (`chunk', default 256
%%% processes), one `atomics' write a process; the walks read 10,000
%%% processes in about the same time as before.
%%%
%%% ```
%%% 1> {Acc, Stalled, false} = beamdiag_agent_pinfo:fold(
%%%        fun(_P, [{_, Q}], N) -> N + Q end, 0, erlang:processes(), [message_queue_len], #{}).
%%% '''
-module(beamdiag_agent_pinfo).

-export([fold/5, read/3]).

-export_type([stalled/0, options/0]).

%% A process that did not answer, and how long it was waited for (ms).
-type stalled() :: {pid(), non_neg_integer()}.
%% How long a process may take to answer (ms), the processes a reader
%% reads before it sends them, and when the fold stops (monotonic us).
-type options() :: #{stall_ms => pos_integer(), chunk => pos_integer(),
                     deadline => integer() | infinity,
                     convert => fun((list()) -> term())}.

%% How long one process may take to answer.
-define(STALL_MS, 100).
%% Processes a reader reads before it sends what it read.
-define(CHUNK, 256).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Folds Fun(Pid, Info, Acc) over the processes that answered
%% `process_info(Pid, Items)' (gone ones are left out), in the order of
%% Pids. Options: `stall_ms', `chunk', `deadline' (monotonic microseconds,
%% or `infinity': past it the fold stops and says so), `convert' (applied
%% to each answer in the reader, so that only what it keeps is sent back:
%% Fun gets its result; a walk's four items as one tuple cut the reads'
%% cost by a third, measured on 10,000 idle processes). Returns the
%% accumulator, the processes that did not answer in time, and whether
%% the deadline cut the fold short.
-spec fold(fun((pid(), list(), Acc) -> Acc), Acc, [pid()], [atom() | tuple()], options()) ->
    {Acc, [stalled()], boolean()}.
fold(Fun, Acc0, Pids, Items, Opts) ->
    Cfg = #{stall => maps:get(stall_ms, Opts, ?STALL_MS),
            deadline => maps:get(deadline, Opts, infinity),
            chunk => maps:get(chunk, Opts, ?CHUNK),
            items => Items,
            convert => maps:get(convert, Opts, none),
            progress => atomics:new(1, [])},
    chunks(Fun, Acc0, Pids, Cfg, []).

%% @doc The answers of a few processes, by pid, and those that did not
%% answer in time.
-spec read([pid()], [atom() | tuple()], options()) -> {#{pid() => list()}, [stalled()]}.
read(Pids, Items, Opts) ->
    {Map, Stalled, _} = fold(fun(P, Info, M) -> M#{P => Info} end, #{}, Pids, Items, Opts),
    {Map, Stalled}.

%%%===================================================================
%%% Internal
%%%===================================================================

chunks(_Fun, Acc, [], _Cfg, Stalled) ->
    {Acc, lists:reverse(Stalled), false};
chunks(Fun, Acc, Pids, Cfg = #{chunk := N, deadline := Deadline}, Stalled) ->
    case not beamdiag_agent_deadline:in_time(Deadline, microsecond) of
        true ->
            {Acc, lists:reverse(Stalled), true};
        false ->
            {Chunk, Rest} = take(N, Pids, []),
            case chunk(Chunk, Cfg) of
                {ok, Results} ->
                    Acc2 = lists:foldl(fun({_, undefined}, A) -> A;
                                          ({P, Info}, A) -> Fun(P, Info, A)
                                       end, Acc, Results),
                    chunks(Fun, Acc2, Rest, Cfg, Stalled);
                {stalled, I, Waited} ->
                    {Before, [P | After]} = lists:split(I - 1, Chunk),
                    chunks(Fun, Acc, Before ++ After ++ Rest, Cfg, [{P, Waited} | Stalled]);
                deadline ->
                    {Acc, lists:reverse(Stalled), true}
            end
    end.

%% One chunk read by a reader of its own: its results, or the index of the
%% process it waited on too long.
chunk(Pids, Cfg = #{items := Items, progress := Progress, convert := Convert}) ->
    atomics:put(Progress, 1, 0),
    Self = self(),
    Ref = make_ref(),
    %% A reader never crashes (no error report on the target): a bad item
    %% comes back as the error it raised.
    %% Bound to this scheduler: placed on a held scheduler's queue, it
    %% would not start until the hold ended (beamdiag_agent_spawn).
    {Reader, MRef} = beamdiag_agent_spawn:here(
                       fun() ->
                               Self ! {Ref, try reads(Pids, Items, Convert, Progress, 1, [])
                                            catch error:Why -> {error, Why}
                                            end}
                       end, [monitor, {priority, high}]),
    Now = erlang:monotonic_time(millisecond),
    wait(Reader, MRef, Ref, Cfg, 0, Now).

wait(Reader, MRef, Ref, Cfg = #{stall := Stall, deadline := Deadline, progress := Progress},
     Index, Since) ->
    Timeout = case Deadline of
                  infinity -> Stall;
                  _ -> max(0, min(Stall, beamdiag_agent_deadline:left(Deadline, microsecond) div 1000))
              end,
    receive
        {Ref, {error, Why}} ->
            %% Items the node does not know: a caller's bug.
            erlang:demonitor(MRef, [flush]),
            erlang:error({beamdiag_agent_pinfo, Why});
        {Ref, Results} ->
            erlang:demonitor(MRef, [flush]),
            {ok, Results};
        {'DOWN', MRef, process, Reader, Why} ->
            %% Killed from outside.
            erlang:error({beamdiag_agent_pinfo, Why})
    after Timeout ->
        Now = erlang:monotonic_time(millisecond),
        case atomics:get(Progress, 1) of
            _ when Deadline =/= infinity, Timeout < Stall ->
                stop(Reader, MRef, Ref),
                deadline;
            Index when Index > 0, Now - Since >= Stall ->
                stop(Reader, MRef, Ref),
                {stalled, Index, Now - Since};
            Index ->
                wait(Reader, MRef, Ref, Cfg, Index, Since);
            Moved ->
                wait(Reader, MRef, Ref, Cfg, Moved, Now)
        end
    end.

%% Kills a reader and drops whatever it sent before it died (its answer
%% comes before its 'DOWN').
stop(Reader, MRef, Ref) ->
    exit(Reader, kill),
    receive
        {'DOWN', MRef, process, Reader, _} -> ok
    end,
    receive
        {Ref, _} -> ok
    after 0 -> ok
    end.

reads([], _Items, _Convert, _Progress, _I, Acc) ->
    lists:reverse(Acc);
reads([P | Ps], Items, Convert, Progress, I, Acc) ->
    atomics:put(Progress, 1, I),
    Info = case erlang:process_info(P, Items) of
               undefined -> undefined;
               Read when Convert =:= none -> Read;
               Read -> Convert(Read)
           end,
    reads(Ps, Items, Convert, Progress, I + 1, [{P, Info} | Acc]).

take(0, Rest, Acc) -> {lists:reverse(Acc), Rest};
take(_, [], Acc) -> {lists:reverse(Acc), []};
take(N, [P | Ps], Acc) -> take(N - 1, Ps, [P | Acc]).

