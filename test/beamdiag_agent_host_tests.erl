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
        #{procs := P, truncated := T} = beamdiag_agent_host:cpu_by_process(Root, [13]),
        ?assertEqual(#{10 => {<<"beam.smp">>, 300}, 11 => {<<"a (b) c">>, 10}}, P),
        ?assertNot(T),
        ?assertEqual(#{cpus_allowed => <<"0-1">>}, beamdiag_agent_host:placement(Root))
    after
        os:cmd("rm -rf " ++ Root)
    end.

missing_root_test() ->
    ?assertEqual(#{procs => #{}, truncated => false},
                 beamdiag_agent_host:cpu_by_process("/nonexistent_beamdiag", [])),
    ?assertEqual(#{}, beamdiag_agent_host:placement("/nonexistent_beamdiag")).

%% The real /proc: this node is left out when asked, and each value is a
%% comm and a tick count.
real_proc_test() ->
    Self = list_to_integer(os:getpid()),
    #{procs := P} = beamdiag_agent_host:cpu_by_process("/proc", [Self]),
    ?assertNot(is_map_key(Self, P)),
    ?assert(maps:size(P) > 0),
    [?assert(is_binary(C) andalso is_integer(T) andalso T >= 0) || {C, T} <- maps:values(P)].
