%%% @doc Spawning an agent process on a scheduler that is free to run it.
%%% Runs on the target node (erts only).
%%%
%%% A process spawned plainly is not always run by the scheduler that
%%% spawned it: the runtime's load balancing may put it on another
%%% scheduler's run queue, and a scheduler held in a NIF looks idle to it.
%%% The process then waits for the NIF to return. Measured on OTP 25 with
%%% 2 schedulers, scheduler 1 held 800 ms at a time, inside a VM that had
%%% been busy (rebar3's): a process spawned from scheduler 2 ran on
%%% scheduler 1, 692 ms later, every time; bound to scheduler 2 it ran at
%%% once. So a short-lived helper whose spawner waits for it (a reader of
%%% other processes) is bound to the spawner's own scheduler, which is
%%% running the spawner and so is not held.
%%%
%%% ```
%%% 1> Self = self(), Here = erlang:system_info(scheduler_id),
%%% 1> beamdiag_agent_spawn:here(fun() -> Self ! erlang:system_info(scheduler_id) end, []),
%%% 1> receive S -> S =:= Here end.
%%% true
%%% '''
-module(beamdiag_agent_spawn).

-export([here/2, bound/3]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc F spawned with Opts (`spawn_opt/2''s), bound to the scheduler
%% running the caller.
-spec here(fun(() -> term()), [term()]) -> pid() | {pid(), reference()}.
here(F, Opts) ->
    bound(erlang:system_info(scheduler_id), F, Opts).

%% @doc F spawned with Opts, bound to scheduler Sched where the emulator
%% allows (the `scheduler' option, called through apply: it is not in
%% spawn_opt's documented type), plainly where it does not.
-spec bound(pos_integer(), fun(() -> term()), [term()]) -> pid() | {pid(), reference()}.
bound(Sched, F, Opts) ->
    try erlang:apply(erlang, spawn_opt, [F, [{scheduler, Sched} | Opts]])
    catch
        error:badarg -> erlang:apply(erlang, spawn_opt, [F, Opts])
    end.
