%%% EUnit tests of the port reads on this VM: a process that holds 60 UDP
%%% sockets is the largest group of owners, named; a growth under the
%%% bound reads nothing; a port program that never reads its input is the
%%% busiest port, with its OS pid and what it sleeps in.
-module(beamdiag_agent_ports_tests).
-include_lib("eunit/include/eunit.hrl").

owners_test() ->
    Self = self(),
    Holder = spawn(fun() ->
                       register(beamdiag_ports_test_holder, self()),
                       Socks = [element(2, gen_udp:open(0)) || _ <- lists:seq(1, 60)],
                       Self ! {opened, length(Socks)},
                       timer:sleep(infinity)
                   end),
    receive {opened, 60} -> ok end,
    try
        Names = beamdiag_agent_proc_identity:names(),
        [G | _] = beamdiag_agent_ports:owners(60, Names),
        ?assertMatch(#{count := 60, name := <<"udp_inet">>,
                       owner := #{name := <<"beamdiag_ports_test_holder">>}}, G),
        ?assertEqual([], beamdiag_agent_ports:owners(49, Names))
    after
        exit(Holder, kill)
    end.

busiest_test() ->
    Port = open_port({spawn, "sleep 30"}, [binary]),
    {os_pid, OsPid} = erlang:port_info(Port, os_pid),
    Self = self(),
    Writer = spawn(fun() -> Self ! wrote, [erlang:port_command(Port, binary:copy(<<0>>, 4096))
                                           || _ <- lists:seq(1, 40)] end),
    receive wrote -> ok end,
    try
        ok = wait_queued(Port, 50),
        [B | _] = beamdiag_agent_ports:busiest(#{}),
        ?assertMatch(#{name := <<"sleep 30">>, os_pid := OsPid}, B),
        ?assert(maps:get(queue_size, B) > 0),
        %% As root, or as the program's own user, the kernel says what it does.
        ?assertMatch(#{program := #{wchan := _}}, B)
    after
        exit(Writer, kill),
        catch port_close(Port),
        os:cmd("kill " ++ integer_to_list(OsPid))
    end.

%% Until the port's driver holds bytes (the pipe full), 100 ms apart.
wait_queued(_Port, 0) ->
    error(nothing_queued);
wait_queued(Port, N) ->
    case erlang:port_info(Port, queue_size) of
        {queue_size, Q} when Q > 0 -> ok;
        _ -> timer:sleep(100), wait_queued(Port, N - 1)
    end.
