%%% Spawning bound to a scheduler: the caller's own, a given one, and
%%% plainly where the emulator refuses the binding.
-module(beamdiag_agent_spawn_tests).

-include_lib("eunit/include/eunit.hrl").

here_test() ->
    Self = self(),
    Sched = erlang:system_info(scheduler_id),
    {Pid, MRef} = beamdiag_agent_spawn:here(
                    fun() -> Self ! {ran, self(), erlang:system_info(scheduler_id)} end, [monitor]),
    ?assert(is_reference(MRef)),
    %% Bound: it runs where the caller ran when it spawned it, however busy
    %% the other schedulers are.
    ?assertEqual({ran, Pid, Sched}, receive {ran, Pid, S} -> {ran, Pid, S} after 5000 -> none end),
    receive {'DOWN', MRef, process, Pid, normal} -> ok after 5000 -> error(no_down) end.

bound_test() ->
    Self = self(),
    N = erlang:system_info(schedulers_online),
    _ = [beamdiag_agent_spawn:bound(S, fun() -> Self ! {ran, S, erlang:system_info(scheduler_id)} end, [])
         || S <- lists:seq(1, N)],
    ?assertEqual([{S, S} || S <- lists:seq(1, N)],
                 lists:sort([receive {ran, S, On} -> {S, On} after 5000 -> {S, none} end
                             || S <- lists:seq(1, N)])).

%% A scheduler the emulator does not have: spawned plainly, it still runs.
no_such_scheduler_test() ->
    Self = self(),
    Pid = beamdiag_agent_spawn:bound(erlang:system_info(schedulers) + 1,
                                     fun() -> Self ! {ran, self()} end, []),
    ?assert(is_pid(Pid)),
    ?assertEqual({ran, Pid}, receive {ran, Pid} -> {ran, Pid} after 5000 -> none end).
