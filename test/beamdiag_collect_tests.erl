%%% EUnit tests of a collection session on this node: a whole window, the
%%% progress and on_sample funs, a report due before the window's end (a
%%% partial capture, or the caller's fallback asked once), a window cut
%%% short by `end_wall_ms', an agent killed before and during its window
%%% (held with `go'), an agent that gives up before its window, a node
%%% that cannot be reached, and the error sentences.
-module(beamdiag_collect_tests).

-include_lib("eunit/include/eunit.hrl").

%% No msacc (each change of the flag waits for every thread), no process
%% walks, no host scan: the window alone.
-define(BASE, #{duration_ms => 300, interval_ms => 100, msacc => false, procs => false,
                host_scan => false}).

collect_test_() ->
    [{timeout, 120, T} || T <- [
        {"a whole window", fun whole_window/0},
        {"progress after each tick", fun progress/0},
        {"on_sample: every sample to the fun, the first and the last kept", fun on_sample/0},
        {"due before the window's end: two samples, marked partial", fun due_partial/0},
        {"due, on this host: the host's processes read from here", fun() -> due_read_here(false) end},
        {"due, on this host, the agent's own scan asked before its last: read from here",
         fun() -> due_read_here(true) end},
        {"a fallback that explains the slowness ends the session at once",
         fun fallback_explains/0},
        {"a fallback that does not: asked once, the samples waited for",
         fun fallback_does_not/0},
        {"end_wall_ms cuts the window short", fun end_wall/0},
        {"the agent killed before its first sample", fun killed_before_window/0},
        {"the agent killed mid-window: the partial capture is kept", fun killed_mid_window/0},
        {"the agent gives up before its window (its go process left)", fun no_go/0},
        {"a node that cannot be reached", fun unreachable/0},
        {"sentences", fun sentences/0}
    ]].

whole_window() ->
    T0 = erlang:monotonic_time(millisecond),
    {ok, C} = beamdiag_collect:run(node(), ?BASE),
    Took = erlang:monotonic_time(millisecond) - T0,
    #{samples := Samples} = C,
    ?assertEqual(true, maps:get(complete, C)),
    ?assertEqual(atom_to_binary(node()), maps:get(node, C)),
    ?assertEqual(300, maps:get(duration_ms, C)),
    ?assertEqual([], partial_notes(C)),
    ?assert(is_map(maps:get(extras, C))),
    ?assert(is_map(maps:get(settings, C))),
    %% A tick at the start, at each interval and at the end: 4 at most; the
    %% first and the last are always taken.
    N = length(Samples),
    ?assert(N >= 2 andalso N =< 4),
    Ts = [T || #{t := T} <- Samples],
    ?assertEqual(Ts, lists:usort(Ts)),
    %% The samples' span lies within the call (ns against ms).
    Span = lists:last(Ts) - hd(Ts),
    ?assert(Span > 0 andalso Span =< Took * 1000000),
    [?assertMatch(#{vm := _, threads := _, host := _, cgroup := _, tick_cost_us := _}, S)
     || S <- Samples],
    agent_ended().

progress() ->
    _ = mailbox(),
    Self = self(),
    {ok, #{samples := Samples}} =
        beamdiag_collect:run(node(), ?BASE#{progress => fun(E, D) -> Self ! {progress, E, D} end}),
    Calls = [{E, D} || {progress, E, D} <- mailbox()],
    %% Once a tick, with the window asked for and the time since the first.
    ?assertEqual(length(Samples), length(Calls)),
    ?assertEqual([300], lists:usort([D || {_, D} <- Calls])),
    Es = [E || {E, _} <- Calls],
    ?assertEqual(0, hd(Es)),
    ?assertEqual(Es, lists:sort(Es)),
    #{t := TFirst} = hd(Samples),
    #{t := TLast} = lists:last(Samples),
    ?assertEqual((TLast - TFirst) div 1000000, lists:last(Es)).

on_sample() ->
    _ = mailbox(),
    Self = self(),
    {ok, C} = beamdiag_collect:run(node(), ?BASE#{on_sample => fun(S) -> Self ! {sample, S} end}),
    Seen = [S || {sample, S} <- mailbox()],
    ?assert(length(Seen) >= 2 andalso length(Seen) =< 4),
    ?assertEqual([hd(Seen), lists:last(Seen)], maps:get(samples, C)),
    ?assertEqual(true, maps:get(complete, C)).

due_partial() ->
    %% A minute's window, due at once: the agent is stopped at two samples.
    T0 = erlang:monotonic_time(millisecond),
    {ok, C} = beamdiag_collect:run(node(), ?BASE#{duration_ms => 60000,
                                                  ready_by => erlang:monotonic_time(millisecond)}),
    ?assert(erlang:monotonic_time(millisecond) - T0 < 20000),
    ?assertEqual(false, maps:get(complete, C)),
    ?assertEqual(60000, maps:get(duration_ms, C)),
    ?assertEqual(2, length(maps:get(samples, C))),
    [Note] = partial_notes(C),
    ?assertMatch({_, _}, binary:match(Note, <<"the node's ticks came too slowly">>)),
    ?assertMatch({_, _}, binary:match(Note, <<"cover the 2 samples">>)),
    ?assertMatch({_, _}, binary:match(Note, <<"of the 60.0 s window">>)),
    agent_ended().

due_read_here(AgentScan) ->
    %% A shell that burns a CPU, beside a window cut short after 0.8 s
    %% without the agent's own host scan, or with it (its scanner, asked
    %% then, has its first scan alone: its last is due at the end of the
    %% 60 s window): the collector's two scans from here hold the shell,
    %% its CPU time grown between them as /proc says.
    Port = open_port({spawn_executable, "/bin/sh"},
                     [{args, ["-c", "echo $$; i=0; while [ $i -lt 100000000 ]; do i=$((i+1)); done"]},
                      binary, {line, 64}, exit_status]),
    Sh = receive {Port, {data, {eol, P}}} -> binary_to_integer(P) after 5000 -> error(no_shell) end,
    try
        Ticks0 = stat_ticks(Sh),
        {ok, C} = beamdiag_collect:run(node(), ?BASE#{duration_ms => 60000, host_scan => AgentScan,
                                                      ready_by => erlang:monotonic_time(millisecond) + 800,
                                                      here_scan => #{root => "/proc", exclude => []}}),
        Ticks1 = stat_ticks(Sh),
        ?assertEqual(false, maps:get(complete, C)),
        ?assert(Ticks1 - Ticks0 >= 20),
        #{host_scan := #{first := A, last := B, read_here := true}} = maps:get(extras, C),
        {_, TA, MA} = maps:get(Sh, A),
        {_, TB, MB} = maps:get(Sh, B),
        ?assert(MB - MA >= 500),
        ?assert(TB - TA >= 20),
        %% This VM is never its own competitor.
        ?assertNot(maps:is_key(list_to_integer(os:getpid()), B))
    after
        catch port_close(Port),
        os:cmd("kill " ++ integer_to_list(Sh))
    end,
    agent_ended().

stat_ticks(Pid) ->
    {ok, Bin} = file:read_file("/proc/" ++ integer_to_list(Pid) ++ "/stat"),
    [_, After] = string:split(Bin, ") ", trailing),
    F = string:lexemes(After, " "),
    binary_to_integer(lists:nth(12, F)) + binary_to_integer(lists:nth(13, F)).

fallback_explains() ->
    _ = mailbox(),
    Self = self(),
    Fallback = fun() -> Self ! fallback_asked, true end,
    R = beamdiag_collect:run(node(), ?BASE#{duration_ms => 60000,
                                            ready_by => erlang:monotonic_time(millisecond),
                                            fallback => Fallback}),
    %% Asked before any word of the agent came: nothing to keep.
    ?assertEqual({error, {beamdiag_collect, {due, #{info => undefined, extras => #{}}}}}, R),
    ?assertEqual(1, length([x || fallback_asked <- mailbox()])),
    agent_ended().

fallback_does_not() ->
    _ = mailbox(),
    Self = self(),
    Fallback = fun() -> Self ! fallback_asked, false end,
    {ok, C} = beamdiag_collect:run(node(), ?BASE#{duration_ms => 60000,
                                                  ready_by => erlang:monotonic_time(millisecond),
                                                  fallback => Fallback}),
    ?assertEqual(1, length([x || fallback_asked <- mailbox()])),
    ?assertEqual(false, maps:get(complete, C)),
    ?assertEqual(2, length(maps:get(samples, C))),
    agent_ended().

end_wall() ->
    %% A minute asked for, ending 250 ms from now: the window is what was
    %% left when the agent started, and never under two intervals.
    T0 = erlang:monotonic_time(millisecond),
    {ok, C} = beamdiag_collect:run(node(), ?BASE#{duration_ms => 60000, interval_ms => 50,
                                                  end_wall_ms => erlang:system_time(millisecond)
                                                                     + 250}),
    ?assert(erlang:monotonic_time(millisecond) - T0 < 20000),
    D = maps:get(duration_ms, C),
    ?assert(D >= 100 andalso D =< 250),
    ?assertEqual(true, maps:get(complete, C)),
    agent_ended().

killed_before_window() ->
    Collector = collector(?BASE#{go => self()}),
    Agent = receive {beamdiag_armed, A, Node} -> ?assertEqual(node(), Node), A
            after 10000 -> error(not_armed) end,
    exit(Agent, kill),
    R = result(Collector),
    ?assertEqual({error, {beamdiag_collect, {target_down, killed, undefined}}}, R),
    {error, {beamdiag_collect, Why}} = R,
    ?assertEqual(<<"the target went away before the first sample (the agent was killed)">>,
                 iolist_to_binary(beamdiag_collect:format_error(Why))).

killed_mid_window() ->
    Self = self(),
    Collector = collector(?BASE#{duration_ms => 60000, go => self(),
                                 progress => fun(E, _) -> Self ! {ticked, E} end}),
    Agent = receive {beamdiag_armed, A, _} -> A after 10000 -> error(not_armed) end,
    Agent ! {beamdiag_go, erlang:system_time(millisecond) + 60000},
    [receive {ticked, _} -> ok after 10000 -> error(no_tick) end || _ <- [1, 2]],
    exit(Agent, kill),
    {error, {beamdiag_collect, Why = {target_down, killed, Partial}}} = result(Collector),
    #{samples := Samples, complete := false, notes := [Note | _]} = Partial,
    N = length(Samples),
    ?assert(N >= 2),
    ?assertEqual(iolist_to_binary(io_lib:format("partial capture: the target went away "
                                                "mid-window (killed) after ~b samples", [N])),
                 Note),
    ?assertEqual(iolist_to_binary(io_lib:format("the target went away mid-window (the agent was "
                                                "killed) after ~b samples; the partial capture "
                                                "is kept", [N])),
                 iolist_to_binary(beamdiag_collect:format_error(Why))).

no_go() ->
    Self = self(),
    %% The go process forwards the agent's word and ends: the agent, left
    %% without a go, gives up before its window.
    Go = spawn(fun() -> receive {beamdiag_armed, _, _} = M -> Self ! M end end),
    Collector = collector(?BASE#{go => Go}),
    receive {beamdiag_armed, _, _} -> ok after 10000 -> error(not_armed) end,
    R = result(Collector),
    ?assertEqual({error, {beamdiag_collect, {agent_aborted, no_go}}}, R),
    ?assertEqual(<<"the agent stopped early (no_go)">>,
                 iolist_to_binary(beamdiag_collect:format_error({agent_aborted, no_go}))),
    agent_ended().

unreachable() ->
    %% This node is not distributed: the start fails at once.
    Node = 'nobody@nowhere.invalid',
    R = beamdiag_collect:run(Node, ?BASE),
    ?assertEqual({error, {beamdiag_collect, {agent_start, Node, {error, {erpc, noconnection}}}}},
                 R),
    {error, {beamdiag_collect, Why}} = R,
    ?assertEqual(<<"nobody@nowhere.invalid went away while the agent was starting "
                   "(the connection dropped)">>,
                 iolist_to_binary(beamdiag_collect:format_error(Why))).

sentences() ->
    ?assertEqual(<<"the agent did not finish in time">>,
                 iolist_to_binary(beamdiag_collect:format_error(timeout))),
    ?assertMatch(<<"the node's first samples did not come before the report was due", _/binary>>,
                 iolist_to_binary(beamdiag_collect:format_error({due, #{}}))),
    ?assertEqual(<<"the target went away mid-window (the connection dropped) after 3 samples; "
                   "the partial capture is kept">>,
                 iolist_to_binary(beamdiag_collect:format_error(
                                    {target_down, noconnection, #{samples => [a, b, c]}}))),
    ?assertEqual(<<"the agent stopped early (its caller went away)">>,
                 iolist_to_binary(beamdiag_collect:format_error(
                                    {agent_aborted, {caller_down, normal}}))),
    Start = {agent_start, 'n@h', {error, {exception, undef, []}}},
    ?assertEqual(iolist_to_binary(beamdiag_client:format_error(Start)),
                 iolist_to_binary(beamdiag_collect:format_error(Start))),
    ?assertEqual(<<"the agent's code is not loaded on n@h">>,
                 iolist_to_binary(beamdiag_collect:format_error(Start))).

%%% Helpers

%% The notes a capture cut short gets.
partial_notes(#{notes := Notes}) ->
    [N || N <- Notes, binary:match(N, <<"partial capture">>) =/= nomatch].

%% A session run in a process of its own, for a test that holds the agent.
collector(Opts) ->
    Self = self(),
    spawn_link(fun() -> Self ! {collected, self(), beamdiag_collect:run(node(), Opts)} end).

result(Collector) ->
    receive {collected, Collector, R} -> R after 30000 -> error(no_result) end.

%% The agent's name is free again: it ended (it unregisters when it
%% ends; the name is best effort, and this is the only session here).
agent_ended() ->
    ok = beamdiag_test_lib:await(fun() -> whereis(beamdiag_agent) =:= undefined end, 10000).

mailbox() ->
    receive M -> [M | mailbox()] after 0 -> [] end.
