%%% @doc ERTS thread names to thread types and scheduler ids.
%%%
%%% The kernel cuts thread names to 15 bytes. OTP 25 names scheduler threads
%%% `1_scheduler', `1_dirty_cpu_sch', `1_dirty_io_sche'; OTP 26 and later
%%% `erts_sched_1', `erts_dcpus_1', `erts_dios_1'. Scheduler ids follow
%%% `scheduler_wall_time_all': normal 1..S, dirty CPU S+1..S+D, then dirty IO.
%%%
%%% A name alone does not make a scheduler: a thread a NIF starts with
%%% `pthread_create' inherits the name of the thread that started it (a
%%% scheduler's, say), and a NIF may name its threads anything.
%%% `classify_all/2' sees every thread of the node at once: a scheduler
%%% name whose number is outside the node's count, or that a thread with a
%%% lower id already holds, is `other'. The VM starts its own threads at
%%% boot, before any NIF can, so the lowest thread id of a name is the
%%% VM's.
%%%
%%% ```
%%% 1> beamdiag_threads:classify(<<"2_dirty_cpu_sch">>).
%%% {dirty_cpu, 2}
%%% 2> beamdiag_threads:scheduler_id({dirty_cpu, 2}, #{schedulers => 8, dirty_cpu_schedulers => 8}).
%%% 10
%%% '''
-module(beamdiag_threads).

-export([classify_all/2, scheduler_id/2, types/0, is_scheduler/1]).
%% Called by the tests only.
-ifdef(TEST).
-export([classify/1]).
-endif.

-export_type([type/0]).

-type type() :: scheduler | dirty_cpu | dirty_io | aux | poll | async | sys | main | other.

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The thread type and its number (0 when the type has none).
-spec classify(binary()) -> {type(), non_neg_integer()}.
classify(<<"erts_sched_", N/binary>>) -> numbered(scheduler, N);
classify(<<"erts_dcpus_", N/binary>>) -> numbered(dirty_cpu, N);
classify(<<"erts_dios_", N/binary>>) -> numbered(dirty_io, N);
classify(<<"erts_aux_", N/binary>>) -> numbered(aux, N);
classify(<<"erts_poll_", N/binary>>) -> numbered(poll, N);
classify(<<"erts_async_", N/binary>>) -> numbered(async, N);
classify(<<"async_", N/binary>>) -> numbered(async, N);
classify(<<"erts_", _/binary>>) -> {sys, 0};
classify(<<"sys_", _/binary>>) -> {sys, 0};
classify(<<"beam.smp">>) -> {main, 0};
classify(<<"beam.lcnt.smp">>) -> {main, 0};
classify(<<"beam", _/binary>>) -> {main, 0};
classify(Name) ->
    case string:to_integer(Name) of
        {N, <<"_scheduler">>} when is_integer(N) -> {scheduler, N};
        {N, <<"_dirty_cpu_", _/binary>>} when is_integer(N) -> {dirty_cpu, N};
        {N, <<"_dirty_io_", _/binary>>} when is_integer(N) -> {dirty_io, N};
        {N, <<"_aux">>} when is_integer(N) -> {aux, N};
        {N, <<"_poller">>} when is_integer(N) -> {poll, N};
        %% Long numbers push the suffix past 15 bytes: "10_dirty_cpu_sc".
        {N, <<"_dirty_c", _/binary>>} when is_integer(N) -> {dirty_cpu, N};
        {N, <<"_dirty_i", _/binary>>} when is_integer(N) -> {dirty_io, N};
        {N, <<"_dirty", _/binary>>} when is_integer(N) -> {other, 0};
        {N, <<"_sched", _/binary>>} when is_integer(N) -> {scheduler, N};
        _ -> {other, 0}
    end.

%% @doc Every thread of a node at once, by thread id: `classify/1' of its
%% name, except that a numbered VM thread (scheduler, dirty, aux, poll,
%% async) whose number is out of the node's range or taken by a lower
%% thread id is `{other, 0}'. Counts not in `Settings' are not checked.
%% (Settings: a capture's, beamdiag_agent_vm:settings(); #{} checks no count.)
-spec classify_all([{integer(), binary()}], beamdiag_agent_vm:settings() | #{}) ->
    #{integer() => {type(), non_neg_integer()}}.
classify_all(Threads, Settings) ->
    {Map, _} = lists:foldl(
        fun({Tid, Name}, {Acc, Seen}) ->
            TI = classify(Name),
            case numbered_type(TI) andalso
                (maps:is_key(TI, Seen) orelse not in_range(TI, Settings)) of
                true -> {Acc#{Tid => {other, 0}}, Seen};
                false -> {Acc#{Tid => TI}, Seen#{TI => Tid}}
            end
        end,
        {#{}, #{}}, lists:keysort(1, Threads)),
    Map.

%% @doc The scheduler id of a scheduler thread, as used by
%% `scheduler_wall_time_all', or `undefined' for other threads.
-spec scheduler_id({type(), non_neg_integer()}, #{schedulers := pos_integer(),
                                                 dirty_cpu_schedulers := non_neg_integer(),
                                                 _ => _}) ->
    pos_integer() | undefined.
scheduler_id({scheduler, N}, _) when N > 0 -> N;
scheduler_id({dirty_cpu, N}, #{schedulers := S}) when N > 0 -> S + N;
scheduler_id({dirty_io, N}, #{schedulers := S, dirty_cpu_schedulers := D}) when N > 0 -> S + D + N;
scheduler_id(_, _) -> undefined.

%% @doc Thread types in report order.
-spec types() -> [type()].
types() ->
    [scheduler, dirty_cpu, dirty_io, aux, poll, async, sys, main, other].

%% @doc True for the three scheduler types.
-spec is_scheduler(type()) -> boolean().
is_scheduler(T) ->
    T =:= scheduler orelse T =:= dirty_cpu orelse T =:= dirty_io.

%%%===================================================================
%%% Internal
%%%===================================================================

%% A number that is not all digits ("erts_sched_1x") is not the VM's name.
numbered(Type, N) ->
    case string:to_integer(N) of
        {I, <<>>} when is_integer(I), I >= 0 -> {Type, I};
        _ -> {other, 0}
    end.

numbered_type({T, _}) ->
    lists:member(T, [scheduler, dirty_cpu, dirty_io, aux, poll, async]).

%% Scheduler threads are numbered from 1 up to their count (every
%% scheduler has a thread, online or not); the others are not checked.
in_range({T, N}, Settings) ->
    Key = case T of
              scheduler -> schedulers;
              dirty_cpu -> dirty_cpu_schedulers;
              dirty_io -> dirty_io_schedulers;
              _ -> none
          end,
    case maps:get(Key, Settings, undefined) of
        Count when is_integer(Count) -> N >= 1 andalso N =< Count;
        _ -> true
    end.
