%%% @doc ERTS thread names to thread types and scheduler ids.
%%%
%%% The kernel cuts thread names to 15 bytes. OTP 25 names scheduler threads
%%% `1_scheduler', `1_dirty_cpu_sch', `1_dirty_io_sche'; OTP 26 and later
%%% `erts_sched_1', `erts_dcpus_1', `erts_dios_1'. Scheduler ids follow
%%% `scheduler_wall_time_all': normal 1..S, dirty CPU S+1..S+D, then dirty IO.
%%%
%%% ```
%%% 1> beamdiag_threads:classify(<<"2_dirty_cpu_sch">>).
%%% {dirty_cpu, 2}
%%% 2> beamdiag_threads:scheduler_id({dirty_cpu, 2}, #{schedulers => 8, dirty_cpu_schedulers => 8}).
%%% 10
%%% '''
-module(beamdiag_threads).

-export([classify/1, scheduler_id/2, types/0, is_scheduler/1]).

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

numbered(Type, N) ->
    case string:to_integer(N) of
        {I, <<>>} when is_integer(I), I >= 0 -> {Type, I};
        _ -> {Type, 0}
    end.
