-module(beamdiag_agent_host_tests).
-include_lib("eunit/include/eunit.hrl").

%% A fake /proc: a comm with spaces and parentheses, a malformed stat, a
%% non-numeric entry, an excluded pid.
fake_root() ->
    Root = filename:join("/tmp", "beamdiag_agent_host_" ++ os:getpid()),
    W = fun(Pid, Stat) ->
                Dir = filename:join(Root, integer_to_list(Pid)),
                ok = filelib:ensure_dir(filename:join(Dir, "x")),
                ok = file:write_file(filename:join(Dir, "stat"), Stat)
        end,
    W(10, <<"10 (beam.smp) S 1 10 10 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 30 0 1 2 3\n">>),
    W(11, <<"11 (a (b) c) R 1 11 11 0 -1 0 0 0 0 0 7 3 0 0 20 0 1 0 1 2 3\n">>),
    W(12, <<"12 (short) S 1\n">>),
    W(13, <<"13 (self) S 1 13 13 0 -1 0 0 0 0 0 9 9 0 0 20 0 1 0 1 2 3\n">>),
    ok = filelib:ensure_dir(filename:join([Root, "self", "x"])),
    ok = file:write_file(filename:join([Root, "self", "status"]),
                         <<"Name:\tbeam.smp\nCpus_allowed:\t3\nCpus_allowed_list:\t0-1\n">>),
    ok = filelib:ensure_dir(filename:join([Root, "sys", "x"])),
    Root.

cpu_by_process_test() ->
    Root = fake_root(),
    try
        #{procs := P, truncated := T} = beamdiag_agent_host:cpu_by_process(Root, [13], infinity),
        ?assertEqual(#{10 => {<<"beam.smp">>, 300}, 11 => {<<"a (b) c">>, 10}},
                     maps:map(fun(_, {C, Ticks, Ms}) when is_integer(Ms) -> {C, Ticks} end, P)),
        ?assertNot(T),
        ?assertEqual(#{cpus_allowed => <<"0-1">>}, beamdiag_agent_host:placement(Root))
    after
        os:cmd("rm -rf " ++ Root)
    end.

%% More processes than the readers: every share read and merged, and none
%% left out, with a deadline and without; a deadline already past reads
%% nothing and says so.
cpu_by_process_in_shares_test() ->
    Root = fake_root(),
    try
        Pids = lists:seq(100, 150),
        [begin
             Dir = filename:join(Root, integer_to_list(P)),
             ok = filelib:ensure_dir(filename:join(Dir, "x")),
             ok = file:write_file(filename:join(Dir, "stat"),
                                  io_lib:format("~b (w~b) S 1 1 1 0 -1 0 0 0 0 0 ~b 1 0 0 20 0 1 0 1 2 3~n",
                                                [P, P, P]))
         end || P <- Pids],
        Want = maps:from_list([{P, {iolist_to_binary(["w", integer_to_list(P)]), P + 1}} || P <- Pids]),
        Strip = fun(M) -> maps:map(fun(_, {C, Ticks, _}) -> {C, Ticks} end, maps:with(Pids, M)) end,
        #{procs := P1, truncated := false} = beamdiag_agent_host:cpu_by_process(Root, [13], infinity),
        ?assertEqual(Want, Strip(P1)),
        #{procs := P2, truncated := false} =
            beamdiag_agent_host:cpu_by_process(Root, [13], erlang:monotonic_time(millisecond) + 5000),
        ?assertEqual(Want, Strip(P2)),
        #{procs := P3, truncated := true} =
            beamdiag_agent_host:cpu_by_process(Root, [13], erlang:monotonic_time(millisecond) - 1),
        ?assertEqual(#{}, P3)
    after
        os:cmd("rm -rf " ++ Root)
    end.

%% The host as the node sees it: the kernel's boot id and the host name,
%% each the first line of its file, blanks cut; a file missing or empty
%% leaves its key out.
placement_host_test() ->
    Root = fake_root(),
    try
        Kernel = filename:join([Root, "sys", "kernel"]),
        ok = filelib:ensure_dir(filename:join([Kernel, "random", "x"])),
        ok = file:write_file(filename:join([Kernel, "random", "boot_id"]),
                             <<"6f1c2d9e-0b1a-4c3d-9e8f-2a3b4c5d6e7f\n">>),
        ok = file:write_file(filename:join(Kernel, "hostname"), <<"db1 \r\n">>),
        ?assertEqual(#{cpus_allowed => <<"0-1">>, boot_id => <<"6f1c2d9e-0b1a-4c3d-9e8f-2a3b4c5d6e7f">>,
                       hostname => <<"db1">>},
                     beamdiag_agent_host:placement(Root)),
        ok = file:write_file(filename:join(Kernel, "hostname"), <<"\n">>),
        ?assertEqual([boot_id, cpus_allowed],
                     lists:sort(maps:keys(beamdiag_agent_host:placement(Root))))
    after
        os:cmd("rm -rf " ++ Root)
    end.

missing_root_test() ->
    ?assertEqual(#{procs => #{}, truncated => false},
                 beamdiag_agent_host:cpu_by_process("/nonexistent_beamdiag", [], infinity)),
    ?assertEqual(#{}, beamdiag_agent_host:placement("/nonexistent_beamdiag")).

%% The real /proc: this node is left out when asked, and each value is a
%% comm and a tick count.
%% Every process of the host is read (no deadline): at a load average of
%% 25 that took over EUnit's default 5 s, so it has 60.
real_proc_test_() ->
    {timeout, 60, fun real_proc/0}.

real_proc() ->
    Self = list_to_integer(os:getpid()),
    #{procs := P} = beamdiag_agent_host:cpu_by_process("/proc", [Self], infinity),
    ?assertNot(is_map_key(Self, P)),
    ?assert(maps:size(P) > 0),
    [?assert(is_binary(C) andalso is_integer(T) andalso T >= 0) || {C, T, _} <- maps:values(P)].

%% The scanner reads at the start and again to end with the window; a
%% process that burns CPU meanwhile shows, in its own interval.
scanner_test_() ->
    {timeout, 30, fun() ->
        %% A CPU burner of this test's own. Its shell ends it when the port
        %% closes, so a test cut short (a timeout, a cancelled run) leaves
        %% no burner behind on the host.
        Burner = open_port({spawn, "sh -c 'yes >/dev/null 2>&1 & echo $!; read _; kill $!'"},
                           [{line, 64}, binary]),
        BPid = receive {Burner, {data, {eol, PidText}}} -> binary_to_integer(PidText)
               after 5000 -> error(no_burner)
               end,
        try
            End = erlang:monotonic_time(millisecond) + 1500,
            S = beamdiag_agent_host:start("/proc", [], End),
            %% The last scan, timed to end with the window, has read every
            %% process and waits to be asked.
            ok = beamdiag_test_lib:await(
                   fun() ->
                       process_info(S, [current_function, status]) =:=
                           [{current_function, {beamdiag_agent_host, last_scan, 5}},
                            {status, waiting}]
                   end, 20000),
            #{first := A, last := B} = beamdiag_agent_host:result(S, 2000),
            ?assertNot(is_process_alive(S)),
            {_, TA, MA} = maps:get(BPid, A),
            {_, TB, MB} = maps:get(BPid, B),
            ?assert(MB - MA >= 500),
            ?assert(TB > TA)
        after
            port_close(Burner)
        end
    end}.

%% On a quiet host the scanner reads nothing more after its first probe;
%% the agent's ticks then give it the host's and the node's CPU time, and a
%% tick showing the rest of the host busy starts the scans.
scanner_fed_by_ticks_test_() ->
    {timeout, 30, fun() ->
        Root = fake_root(),
        try
            {ok, Stat} = file:read_file(beamdiag_test_lib:fixture("proc/host_stat")),
            ok = file:write_file(filename:join(Root, "stat"), Stat),
            ok = file:write_file(filename:join([Root, "self", "stat"]),
                                 <<"13 (self) S 1 13 13 0 -1 0 0 0 0 0 9 9 0 0 20 0 1 0 1 2 3\n">>),
            {ok, #{cpu := Cpu}} = beamdiag_agent_procfs:cpu_times(Root),
            Busy = beamdiag_agent_host:busy(Cpu),
            End = erlang:monotonic_time(millisecond) + 5000,
            S = beamdiag_agent_host:start(Root, [13], End),
            %% The first probe found the files unchanged: the rest of the
            %% host idle, so it waits for the ticks.
            ok = beamdiag_test_lib:await(
                   fun() -> process_info(S, current_function) =:=
                                {current_function, {beamdiag_agent_host, probed, 6}} end, 5000),
            timer:sleep(100),
            Now = erlang:monotonic_time(millisecond),
            %% An older tick than the probe changes nothing; a tick with the
            %% host 50 clock ticks busier (the node's own unchanged) starts
            %% the scans.
            ok = beamdiag_agent_host:usage(S, {Now - 1000, Busy, 18}),
            %% Taken from the queue, and the scanner waits on.
            ok = beamdiag_test_lib:await(
                   fun() -> process_info(S, message_queue_len) =:= {message_queue_len, 0} end, 5000),
            ?assertEqual({current_function, {beamdiag_agent_host, probed, 6}},
                         process_info(S, current_function)),
            ?assertEqual({status, waiting}, process_info(S, status)),
            ok = beamdiag_agent_host:usage(S, {Now, Busy + 50, 18}),
            ok = beamdiag_test_lib:await(
                   fun() -> process_info(S, current_function) =/=
                                {current_function, {beamdiag_agent_host, probed, 6}} end, 5000),
            #{first := First} = beamdiag_agent_host:result(S, 2000),
            ?assert(is_map_key(10, First))
        after
            os:cmd("rm -rf " ++ Root)
        end
    end}.
