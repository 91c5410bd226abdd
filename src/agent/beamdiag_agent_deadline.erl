%%% @doc Deadlines on the monotonic clock, in one place for the agent and
%%% the operator's side alike (it needs nothing but erts, so it loads on a
%%% target). A deadline is a monotonic time in a unit (milliseconds unless
%%% said), or `infinity'.
%%%
%%% ```
%%% 1> D = erlang:monotonic_time(millisecond) + 500.
%%% 2> beamdiag_agent_deadline:in_time(D).
%%% true
%%% 3> beamdiag_agent_deadline:left(D) =< 500.
%%% true
%%% '''
-module(beamdiag_agent_deadline).

-export([in_time/1, in_time/2, left/1, left/2, within/2]).

-export_type([deadline/0]).

-type deadline() :: integer() | infinity.

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Whether a deadline in milliseconds is still ahead.
-spec in_time(deadline()) -> boolean().
in_time(Deadline) ->
    in_time(Deadline, millisecond).

%% @doc Whether a deadline in `Unit' is still ahead.
-spec in_time(deadline(), erlang:time_unit()) -> boolean().
in_time(infinity, _Unit) -> true;
in_time(Deadline, Unit) -> erlang:monotonic_time(Unit) < Deadline.

%% @doc What is left of a deadline in milliseconds, never below 0: a
%% `receive ... after' timeout.
-spec left(deadline()) -> timeout().
left(Deadline) ->
    left(Deadline, millisecond).

%% @doc What is left of a deadline in `Unit', in that unit, never below 0.
-spec left(deadline(), erlang:time_unit()) -> timeout().
left(infinity, _Unit) -> infinity;
left(Deadline, Unit) -> max(0, Deadline - erlang:monotonic_time(Unit)).

%% @doc Runs F in a process of its own and waits at most Ms milliseconds
%% for its value (for a call that may wait on something else: a port, a
%% process): `{ok, Value}', `timeout' (the process is killed, a late value
%% dropped) or `{error, Reason}' (it died first).
-spec within(fun(() -> term()), non_neg_integer()) -> {ok, term()} | timeout | {error, term()}.
within(F, Ms) ->
    Self = self(),
    Ref = make_ref(),
    {Pid, MRef} = spawn_monitor(fun() -> Self ! {Ref, F()} end),
    receive
        {Ref, R} ->
            erlang:demonitor(MRef, [flush]),
            {ok, R};
        {'DOWN', MRef, process, Pid, Why} ->
            {error, Why}
    after Ms ->
        exit(Pid, kill),
        erlang:demonitor(MRef, [flush]),
        receive {Ref, _} -> ok after 0 -> ok end,
        timeout
    end.
