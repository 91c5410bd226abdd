%%% EUnit tests of the agent's helper for calls with a deadline, on this
%%% node: a value, a raise as text, a late call given up (`timeout') and
%%% the calls made meanwhile refused (`busy'), its late answer dropped by
%%% the runtime, work cast without waiting, the clean-up funs run after
%%% the queued work when stopped or when the owner dies, and `reply/3'.
-module(beamdiag_agent_bounded_call_tests).

-include_lib("eunit/include/eunit.hrl").

bounded_call_test_() ->
    [{timeout, 30, T} || T <- [
        {"a value, in the helper", fun value/0},
        {"a raise, as text", fun raised/0},
        {"late: timeout, busy meanwhile, the late answer dropped", fun late/0},
        {"cast: run without waiting, in order", fun cast/0},
        {"stop: queued work, then the clean-ups, then the end", fun stop/0},
        {"the owner's death: the clean-ups, then the end", fun owner_down/0},
        {"reply/3", fun reply/0},
        {"once: a value, a raise, a late call's process killed", fun once/0},
        {"once: erlang:memory/1 behind a held scheduler", fun once_held/0}
    ]].

once() ->
    ?assertEqual({ok, 42}, beamdiag_agent_bounded_call:once(fun() -> 42 end)),
    ?assertEqual({error, <<"error:boom">>},
                 beamdiag_agent_bounded_call:once(fun() -> error(boom) end)),
    ?assertEqual({error, <<"exit:x">>}, beamdiag_agent_bounded_call:once(fun() -> exit(x) end)),
    Self = self(),
    {Us, R} = timer:tc(beamdiag_agent_bounded_call, once,
                       [fun() -> Self ! {running, self()}, timer:sleep(5000) end, 50]),
    ?assertEqual(timeout, R),
    ?assert(Us < 1000000),
    %% The late call's process is gone when once/2 returns.
    Pid = receive {running, P} -> P after 0 -> error(never_ran) end,
    ?assertNot(is_process_alive(Pid)),
    %% Nothing left in the caller's mailbox.
    ?assertEqual({messages, []}, erlang:process_info(self(), messages)).

%% The raw signal first: erlang:memory/1 waits for a scheduler held 800 ms
%% at a time (read from the other scheduler); then once/1 returns within
%% its wait, and its process does not outlive it.
once_held() ->
    case erlang:system_info(schedulers_online) >= 2 of
        false ->
            error({needs_two_schedulers, erlang:system_info(schedulers_online)});
        true ->
            {module, _} = code:ensure_loaded(beamdiag_agent_bounded_call),
            {Held, Clock} = beamdiag_test_lib:held_scheduler(),
            Name = {?MODULE, once_held},
            try
                %% Timed by the holder's clock: erlang:memory/1 returns only
                %% when the hold has ended, 800 ms after it began...
                Raw = beamdiag_test_lib:in_hold(Clock, fun() -> erlang:memory(binary) end, Name),
                %% ...and once/1 within its 100 ms, while the hold is on.
                Once = beamdiag_test_lib:in_hold(
                         Clock, fun() ->
                                        Procs = erlang:system_info(process_count),
                                        R = beamdiag_agent_bounded_call:once(
                                              fun() -> erlang:memory(binary) end),
                                        {R, Procs, erlang:system_info(process_count)}
                                end, Name),
                ?debugFmt("erlang:memory(binary) from ~b to ~b ms into an 800 ms hold; once/1 "
                          "from ~b to ~b ms: ~p",
                          [maps:get(start_ms, Raw), maps:get(end_ms, Raw), maps:get(start_ms, Once),
                           maps:get(end_ms, Once), maps:get(result, Once)]),
                ?assert(maps:get(end_ms, Raw) >= 795),
                #{result := {R, Procs0, Procs1}, start_ms := S, end_ms := E} = Once,
                ?assertEqual(timeout, R),
                ?assert(E < 800),
                ?assert(E - S < 300),
                ?assertEqual(Procs0, Procs1)
            after
                exit(Held, kill)
            end
    end.

value() ->
    P = beamdiag_agent_bounded_call:start(self()),
    Helper = beamdiag_agent_bounded_call:pid(P),
    ?assertEqual({ok, 42}, beamdiag_agent_bounded_call:call(P, fun() -> 42 end, 1000)),
    %% Run in the helper, a process at high priority.
    ?assertEqual({ok, Helper}, beamdiag_agent_bounded_call:call(P, fun erlang:self/0, 1000)),
    ?assertNotEqual(self(), Helper),
    ?assertEqual({priority, high}, erlang:process_info(Helper, priority)),
    %% The helper goes on after each call.
    ?assertEqual({ok, [a]}, beamdiag_agent_bounded_call:call(P, fun() -> [a] end, 1000)),
    stop_and_wait(P).

raised() ->
    P = beamdiag_agent_bounded_call:start(self()),
    ?assertEqual({error, <<"error:boom">>},
                 beamdiag_agent_bounded_call:call(P, fun() -> error(boom) end, 1000)),
    ?assertEqual({error, <<"throw:{a,1}">>},
                 beamdiag_agent_bounded_call:call(P, fun() -> throw({a, 1}) end, 1000)),
    ?assertEqual({error, <<"exit:x">>},
                 beamdiag_agent_bounded_call:call(P, fun() -> exit(x) end, 1000)),
    %% A huge reason is cut.
    {error, Text} = beamdiag_agent_bounded_call:call(
                      P, fun() -> error(lists:seq(1, 100000)) end, 5000),
    ?assert(byte_size(Text) < 400),
    ?assertMatch(<<"error:[1,2,3,", _/binary>>, Text),
    %% The helper survived each.
    ?assertEqual({ok, ok}, beamdiag_agent_bounded_call:call(P, fun() -> ok end, 1000)),
    stop_and_wait(P).

late() ->
    _ = mailbox(),
    P = beamdiag_agent_bounded_call:start(self()),
    Self = self(),
    Held = fun() ->
                   Self ! {holding, self()},
                   receive release -> late_value end
           end,
    ?assertEqual(timeout, beamdiag_agent_bounded_call:call(P, Held, 50)),
    receive {holding, _} -> ok after 5000 -> error(not_run) end,
    %% Refused at once while the held call runs: not queued behind it.
    T0 = erlang:monotonic_time(millisecond),
    ?assertEqual(busy, beamdiag_agent_bounded_call:call(P, fun() -> never end, 5000)),
    ?assert(erlang:monotonic_time(millisecond) - T0 < 1000),
    beamdiag_agent_bounded_call:pid(P) ! release,
    %% Free again once the late answer went (to an alias no longer active).
    ok = beamdiag_test_lib:await(
           fun() -> beamdiag_agent_bounded_call:call(P, fun() -> ok end, 1000) =:= {ok, ok} end,
           5000),
    ?assertEqual([], mailbox()),
    stop_and_wait(P).

cast() ->
    P = beamdiag_agent_bounded_call:start(self()),
    Self = self(),
    ok = beamdiag_agent_bounded_call:cast(P, fun() -> receive after 100 -> ok end,
                                                      Self ! {cast, 1} end),
    ok = beamdiag_agent_bounded_call:cast(P, fun() -> Self ! {cast, 2} end),
    %% A raise in cast work is dropped; the helper goes on.
    ok = beamdiag_agent_bounded_call:cast(P, fun() -> error(dropped) end),
    ok = beamdiag_agent_bounded_call:cast(P, fun() -> Self ! {cast, 3} end),
    ?assertEqual([1, 2, 3], [receive {cast, N} -> N after 5000 -> error(no_cast) end
                             || _ <- [1, 2, 3]]),
    stop_and_wait(P).

stop() ->
    P = beamdiag_agent_bounded_call:start(self()),
    Self = self(),
    Helper = beamdiag_agent_bounded_call:pid(P),
    MRef = erlang:monitor(process, Helper),
    Helper ! {on_exit, fun() -> Self ! {cleaned, first} end},
    Helper ! {on_exit, fun() -> error(a_cleanup_that_fails) end},
    Helper ! {on_exit, fun() -> Self ! {cleaned, second} end},
    ok = beamdiag_agent_bounded_call:cast(P, fun() -> receive after 100 -> ok end,
                                                      Self ! work_done end),
    ok = beamdiag_agent_bounded_call:stop(P),
    %% The work first, then every clean-up (the last registered first),
    %% the failing one included, then the helper ends.
    ?assertEqual([work_done, {cleaned, second}, {cleaned, first}],
                 [receive M -> M after 5000 -> error(nothing) end || _ <- [1, 2, 3]]),
    receive {'DOWN', MRef, process, Helper, Why} -> ?assertEqual(normal, Why)
    after 5000 -> error(not_ended) end.

owner_down() ->
    Self = self(),
    Owner = spawn(fun() -> receive stop -> ok end end),
    P = beamdiag_agent_bounded_call:start(Owner),
    Helper = beamdiag_agent_bounded_call:pid(P),
    MRef = erlang:monitor(process, Helper),
    Helper ! {on_exit, fun() -> Self ! cleaned end},
    ?assertEqual({ok, 1}, beamdiag_agent_bounded_call:call(P, fun() -> 1 end, 1000)),
    exit(Owner, kill),
    receive cleaned -> ok after 5000 -> error(not_cleaned) end,
    receive {'DOWN', MRef, process, Helper, _} -> ok after 5000 -> error(not_ended) end.

reply() ->
    _ = mailbox(),
    A1 = alias([reply]),
    self() ! {A1, answered},
    ?assertEqual(answered, beamdiag_agent_bounded_call:reply(A1, 0, none)),
    A2 = alias([reply]),
    ?assertEqual(none, beamdiag_agent_bounded_call:reply(A2, 10, none)),
    %% Given up: an answer sent later never arrives. Messages of one
    %% sender keep their order: the marker after it says it was dropped.
    A2 ! {A2, late},
    self() ! marker,
    ?assertEqual(marker, receive M1 -> M1 after 5000 -> none end),
    Self = self(),
    spawn(fun() -> A2 ! {A2, later}, Self ! marker end),
    ?assertEqual(marker, receive M2 -> M2 after 5000 -> none end).

%%% Helpers

stop_and_wait(P) ->
    Helper = beamdiag_agent_bounded_call:pid(P),
    MRef = erlang:monitor(process, Helper),
    ok = beamdiag_agent_bounded_call:stop(P),
    receive {'DOWN', MRef, process, Helper, _} -> ok after 5000 -> error(not_ended) end.

mailbox() ->
    receive M -> [M | mailbox()] after 0 -> [] end.
