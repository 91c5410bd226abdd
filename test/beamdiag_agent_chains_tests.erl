%%% The walker's look at who waits on whom, on this node's own processes:
%%% a plain file:open of a FIFO nobody writes (the file server waits on the
%%% opener's io server, in a NIF; callers wait on the file server), and two
%%% processes waiting on each other.
-module(beamdiag_agent_chains_tests).
-include_lib("eunit/include/eunit.hrl").

fifo_test_() ->
    {timeout, 30, fun fifo/0}.

fifo() ->
    Dir = filename:join("/tmp", "beamdiag_waits_" ++ os:getpid()),
    ok = file:make_dir(Dir),
    Fifo = filename:join(Dir, "fifo"),
    "ok\n" = os:cmd("mkfifo '" ++ Fifo ++ "' && echo ok"),
    FS = whereis(file_server_2),
    Opener = spawn(fun() -> _ = file:open(Fifo, [read]) end),
    %% The callers come once the file server is held in the open: spawned
    %% beside the opener, they may run first and be served (a run's
    %% queue never reached 5 in 2.5 s).
    Held = fun() -> erlang:process_info(FS, current_function) =:=
                        {current_function, {file_io_server, do_start, 4}} end,
    HeldFirst = wait_until(Held),
    Callers = [spawn(fun() -> _ = file:read_file_info(Dir) end) || _ <- lists:seq(1, 5)],
    try
        %% Raw signal: the file server waits with the callers queued on it.
        ok = HeldFirst,
        ok = wait_until(fun() -> element(2, erlang:process_info(FS, message_queue_len)) >= 5 end),
        true = Held(),
        [S] = beamdiag_agent_chains:candidates(
                [#{pid => list_to_binary(pid_to_list(FS)), monitored_by => 6, queue => [0, 5]},
                 #{pid => list_to_binary(pid_to_list(self())), monitored_by => 0,
                   queue => [0, 1]}], []),
        ?assertEqual(FS, S),
        #{chains := [C]} = beamdiag_agent_chains:look(#{servers => [S], suspended => []}),
        ?debugFmt("~p", [C]),
        #{server := Server, callers := #{count := N, read := Read}, waits_on := [Hop]} = C,
        ?assertEqual(<<"file_server_2">>, maps:get(name, Server)),
        ?assertEqual(<<"waiting">>, maps:get(kind, Server)),
        ?assert(N >= 6),
        ?assert(lists:all(fun(#{current := Cur}) -> Cur =:= <<"gen:do_call/4">> end, Read)),
        ?assertMatch(#{ends := nif, current := <<"prim_file:open_nif/2">>}, Hop)
    after
        _ = os:cmd("timeout 2 sh -c 'echo > \"" ++ Fifo ++ "\"'"),
        [exit(P, kill) || P <- [Opener | Callers]],
        _ = file:delete(Fifo),
        _ = file:del_dir(Dir)
    end.

%% Two servers idle in their own loop, each monitoring the other (a
%% queue and its channel), with four more idle servers monitoring the
%% first: no cycle, the chain ends at the first in a receive, and every
%% caller read is idle.
idle_loops_test() ->
    {ok, A} = gen_server:start(beamdiag_test_monitor_server, [], []),
    {ok, B} = gen_server:start(beamdiag_test_monitor_server, [], []),
    Cs = [element(2, {ok, _} = gen_server:start(beamdiag_test_monitor_server, [], []))
          || _ <- lists:seq(1, 4)],
    try
        [ok = gen_server:call(X, {monitor, A}) || X <- [B | Cs]],
        ok = gen_server:call(A, {monitor, B}),
        %% Raw signal: each waits in gen_server:loop, A with five monitors on it.
        ?assertEqual([{current_function, {gen_server, loop, 7}}],
                     lists:usort([erlang:process_info(X, current_function) || X <- [A, B | Cs]])),
        {monitored_by, On} = erlang:process_info(A, monitored_by),
        ?assertEqual(5, length([P || P <- On, is_pid(P)])),
        #{chains := [C]} = beamdiag_agent_chains:look(#{servers => [A], suspended => []}),
        ?debugFmt("~p", [C]),
        #{server := Server, callers := #{count := 5, read := Read}, waits_on := Hops} = C,
        ?assertEqual([], Hops),
        ?assertMatch(#{ends := 'receive', idle := true}, Server),
        ?assertEqual([true], lists:usort([I || #{idle := I} <- Read])),
        ?assertEqual([], [F || F = #{id := wait_chain} <- beamdiag_chain_rules:findings(
                                                         #{waits => #{'end' => #{t_ns => 0,
                                                                                 chains => [C],
                                                                                 suspended => #{count => 0, read => [], dist => [], dist_buf_busy_limit => 1048576}}}})])
    after
        [gen_server:stop(X) || X <- [A, B | Cs]]
    end.

%% Two processes, each waiting with a monitor on the other: a cycle.
cycle_test() ->
    Self = self(),
    A = spawn(fun() -> receive {peer, B} -> erlang:monitor(process, B), Self ! ready,
                                            receive never -> ok end end end),
    B = spawn(fun() -> receive {peer, P} -> erlang:monitor(process, P), Self ! ready,
                                            receive never -> ok end end end),
    A ! {peer, B},
    B ! {peer, A},
    receive ready -> ok end,
    receive ready -> ok end,
    #{chains := [#{waits_on := Hops}]} =
        beamdiag_agent_chains:look(#{servers => [A], suspended => []}),
    [exit(P, kill) || P <- [A, B]],
    ?assertMatch([#{pid := _}, #{ends := cycle}], Hops).

wait_until(F) ->
    wait_until(F, 50).

wait_until(_F, 0) ->
    timeout;
wait_until(F, N) ->
    case F() of
        true -> ok;
        false -> timer:sleep(50), wait_until(F, N - 1)
    end.
