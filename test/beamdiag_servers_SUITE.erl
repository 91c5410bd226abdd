%%% Real servers as the judge: Debian's RabbitMQ, started by
%%% scripts/rabbitmq-lab.sh on loopback with its own node name, ports and
%%% data, loaded by a small AMQP client (beamdiag_amqp), and Debian's Yaws,
%%% started by scripts/yaws-lab.sh and loaded over HTTP on loopback; both
%%% stopped at the end (and on their own after a time limit). Each case
%%% asserts the raw signal first (queue depth from rabbitmqctl, the node's
%%% CPU, msacc), then the diagnosis, including what must not be said: no
%%% busy-wait advice to a node with +sbwt none, no flag the node has, no
%%% figure beyond its bound.
%%%
%%% BEAMDIAG_RECORD=1 writes each case's capture to test/fixtures/captures/
%%% (rabbitmq_CASE.capture) for the property test.
-module(beamdiag_servers_SUITE).
-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0, groups/0, suite/0, init_per_group/2, end_per_group/2]).
-export([rabbitmq_idle/1, rabbitmq_paced/1, rabbitmq_backlog/1, yaws_paced/1, yaws_flat_out/1]).

%% Thread names (OTP 25, and OTP 26 and later).
-define(SCHED_OR_DIRTY_CPU, "^([0-9]+_(scheduler|dirty_cpu_)|erts_(sched|dcpus)_[0-9])").
-define(WINDOW, 4).
-define(PORT, 5699).
%% Queues that back up: a few, not dozens (the machine is shared).
-define(BACKLOG_QUEUES, [<<"backlog_1">>, <<"backlog_2">>]).
-define(BACKLOG_MSGS, 250000).
-define(MSG_SIZE, 1024).
-define(YAWS_PORT, 8099).

suite() -> [{timetrap, {minutes, 6}}].

all() ->
    [{group, rabbitmq}, {group, yaws}].

groups() ->
    [{rabbitmq, [sequence], [rabbitmq_idle, rabbitmq_paced, rabbitmq_backlog]},
     {yaws, [sequence], [yaws_paced, yaws_flat_out]}].

init_per_group(yaws, Config) ->
    case filelib:is_dir("/usr/lib/yaws/ebin") of
        false ->
            beamdiag_test_lib:missing("yaws is not installed (scripts/setup.sh test)");
        true ->
            Dir = "/tmp/beamdiag_yaws_" ++ os:getpid(),
            Script = script("yaws-lab.sh"),
            %% Stops on its own after 20 min, or at end_per_group.
            {0, _} = sh([Script, " start ", Dir, " 1200"]),
            case sh([Script, " wait ", Dir]) of
                {0, _} ->
                    {ok, Host} = inet:gethostname(),
                    {ok, Cookie} = file:read_file(filename:join(Dir, "cookie")),
                    [{yaws_dir, Dir},
                     {yaws_node, list_to_atom("beamdiag_yaws@" ++ hd(string:split(Host, ".")))},
                     {yaws_cookie, binary_to_atom(string:trim(Cookie))} | Config];
                {_, Out} ->
                    _ = sh([Script, " stop ", Dir]),
                    ct:fail({yaws_did_not_start, Out})
            end
    end;
init_per_group(rabbitmq, Config) ->
    case os:find_executable("rabbitmqctl") of
        false ->
            beamdiag_test_lib:missing("rabbitmq-server is not installed (scripts/setup.sh test)");
        _ ->
            Dir = "/tmp/beamdiag_rabbit_" ++ os:getpid(),
            Script = script(),
            %% Stops on its own after 20 min (the group's cases' timetraps)
            %% whatever happens to this suite; end_per_group stops it.
            {0, _} = sh([Script, " start ", Dir, " 1200"]),
            case sh([Script, " wait ", Dir]) of
                {0, _} ->
                    {ok, Host} = inet:gethostname(),
                    Node = list_to_atom("beamdiag_rabbit@" ++ hd(string:split(Host, "."))),
                    {ok, Cookie} = file:read_file("/var/lib/rabbitmq/.erlang.cookie"),
                    [{rabbit_dir, Dir}, {rabbit_node, Node},
                     {rabbit_cookie, binary_to_atom(string:trim(Cookie))} | Config];
                {_, Out} ->
                    _ = sh([Script, " stop ", Dir]),
                    ct:fail({rabbitmq_did_not_start, Out})
            end
    end.

end_per_group(yaws, Config) ->
    case ?config(yaws_dir, Config) of
        undefined -> ok;
        Dir ->
            {0, _} = sh([script("yaws-lab.sh"), " stop ", Dir]),
            {_, Left} = sh(["pgrep -f 'sname [b]eamdiag_yaws' || true"]),
            _ = sh(["rm -rf ", Dir]),
            ?assertEqual(<<>>, string:trim(Left))
    end;
end_per_group(rabbitmq, Config) ->
    case ?config(rabbit_dir, Config) of
        undefined -> ok;
        Dir ->
            %% The server's processes: the time limit's (setsid) and the
            %% session su made for the server, its emulator's. Read before
            %% the stop, which comes whatever the reading found.
            Sids = catch server_sessions(Config),
            Ours = catch lists:append([session_processes(S) || S <- Sids]),
            ct:pal("the server's sessions ~p before the stop: ~p", [Sids, Ours]),
            {0, _} = sh([script(), " stop ", Dir]),
            %% Nothing of the server is left running (its command line
            %% does not name the node).
            Left = lists:append([session_processes(S) || S <- Sids]),
            _ = sh(["rm -rf ", Dir]),
            ?assert(length(Ours) >= 3),
            ?assertEqual([], Left)
    end.

%%% Cases

rabbitmq_idle(Config) ->
    %% Raw signal: no messages anywhere, the node nearly idle.
    ?assertEqual(0, lists:sum([N || {_, N} <- depths(Config)])),
    {L, F, Cap = #{settings := S}} = diagnose3(Config, rabbitmq_idle),
    Used = node_cpus(Cap),
    ct:pal("idle: node ~.3f CPUs", [Used]),
    ?assert(Used < 0.3),
    %% RabbitMQ 3.10 as Debian ships it: busy waiting off, schedulers bound.
    ?assertEqual([<<"none">>, <<"none">>, <<"none">>],
                 [maps:get(K, S) || K <- [sbwt, sbwtdcpu, sbwtdio]]),
    ?assertNotEqual(<<"unbound">>, maps:get(bind_type, S)),
    nothing_the_node_has(F, S),
    ?assertEqual([], [Id || X = #{id := Id} <- F, beamdiag_finding:at_least(X, warning),
                           Id =/= cpu_starvation]),
    %% Starvation may be said of an idle node only with its raw signal: its
    %% schedulers waited for a CPU while the rest of the host used 0.3 CPUs
    %% or more (the bound lab_SUITE's cpu_saturated holds it to).
    Starved = [X || X = #{id := cpu_starvation} <- F, beamdiag_finding:at_least(X, warning)],
    {Runq, Rest} = {runq_share(Cap), external_cpus(Cap)},
    ct:pal("idle: run-queue wait ~.3f of the schedulers' wall time; rest of the host ~.2f CPUs; "
           "starvation said: ~p", [Runq, Rest, Starved =/= []]),
    Starved =:= [] orelse ?assert(Runq >= 0.02 andalso Rest >= 0.30),
    within_bounds(L, F).

rabbitmq_paced(Config) ->
    Q = <<"paced">>,
    {ok, C} = beamdiag_amqp:open(?PORT),
    ok = beamdiag_amqp:declare(C, Q),
    {ok, P} = beamdiag_amqp:open(?PORT),
    Received = counters:new(1, []),
    _ = beamdiag_amqp:consume(C, Q, Received),
    Self = self(),
    %% Publishes until stopped below (at most 300 s).
    Pub = spawn_link(fun() ->
                             beamdiag_amqp:paced(P, Q, 3000, ?MSG_SIZE, 300),
                             Self ! {paced, done}
                     end),
    %% The raw signal before the window: the consumer is receiving the
    %% messages (a second's worth).
    ok = beamdiag_test_lib:await(fun() -> counters:get(Received, 1) >= 3000 * ?MSG_SIZE end,
                                 30000),
    {L, F, S} = diagnose3(Config, rabbitmq_paced),
    #{reductions_per_s := RedsPerS} = beamdiag_test_lib:raw_shares(S),
    Pub ! stop,
    receive {paced, done} -> ok after 30000 -> ct:fail(publisher_stuck) end,
    %% Raw signal: the consumer kept up (the queue did not back up) and the
    %% node worked more than when idle.
    Depth = proplists:get_value(Q, depths(Config)),
    Used = node_cpus(S),
    ct:pal("paced: depth ~p, node ~.3f CPUs, ~b reductions/s", [Depth, Used, round(RedsPerS)]),
    ?assert(Depth < 30000),
    ?assert(RedsPerS > 100000),
    ?assertNot(lists:member(busy_wait, [Id || #{id := Id} <- F])),
    nothing_the_node_has(F, maps:get(settings, S)),
    within_bounds(L, F),
    beamdiag_amqp:close(C),
    beamdiag_amqp:close(P).

rabbitmq_backlog(Config) ->
    {ok, C} = beamdiag_amqp:open(?PORT),
    [ok = beamdiag_amqp:declare(C, Q) || Q <- ?BACKLOG_QUEUES],
    [ok = beamdiag_amqp:publish(C, Q, ?BACKLOG_MSGS, ?MSG_SIZE) || Q <- ?BACKLOG_QUEUES],
    wait_depth(Config, ?BACKLOG_QUEUES, ?BACKLOG_MSGS, 120000),
    %% More messages into the queues that already hold a backlog, for the
    %% whole window (a fixed count was all in before the msacc slice at the
    %% window's end on a quiet host): each queue process collects its large
    %% heap as it grows.
    Self = self(),
    %% Each publisher runs until stopped below (at most 300 s).
    Pubs = [spawn_link(fun() ->
                               {ok, P} = beamdiag_amqp:open(?PORT),
                               ok = publish_until_stopped(P, Q, 300000, 150000),
                               beamdiag_amqp:close(P),
                               Self ! {published, Q}
                       end) || Q <- ?BACKLOG_QUEUES],
    %% The raw signal before the window: the queues take more than their
    %% backlog.
    wait_depth(Config, ?BACKLOG_QUEUES, ?BACKLOG_MSGS + 1, 60000),
    %% The server's dirty CPU scheduler threads as the kernel counts them,
    %% read by the test around the diagnosis (for dirty_starved/2).
    Dirty0 = beamdiag_test_lib:sched_stat(rabbit_os_pid(Config), dirty_cpu),
    {L, F, Cap = #{settings := S}} = diagnose3(Config, rabbitmq_backlog),
    Dirty = beamdiag_test_lib:sched_wait_since(Dirty0),
    [Pub ! stop || Pub <- Pubs],
    [receive {published, Q} -> ok after 60000 -> ct:fail(publisher_stuck) end
     || Q <- ?BACKLOG_QUEUES],
    %% Raw signal: the queues hold their backlog, and the dirty CPU
    %% schedulers collected garbage (msacc) while the node took page faults.
    Depths = depths(Config),
    [?assert(proplists:get_value(Q, Depths) >= ?BACKLOG_MSGS) || Q <- ?BACKLOG_QUEUES],
    %% (From the capture's raw counters, apart from the ledger.)
    GcWall = beamdiag_test_lib:raw_msacc(Cap, dirty_cpu_scheduler, [gc, gc_full]),
    #{minflt := MinFlt, majflt := MajFlt} = beamdiag_test_lib:raw_threads(Cap, "."),
    Faults = MinFlt + MajFlt,
    Used = node_cpus(Cap),
    ct:pal("backlog: depths ~p; node ~.3f CPUs; dirty gc ~.3f s wall; ~b page faults",
           [Depths, Used, GcWall, Faults]),
    %% No dirty GC in the slice: a skip only if the dirty schedulers were
    %% starved of CPU (their run-queue wait), a failure otherwise.
    GcWall > 0.05 orelse beamdiag_test_lib:dirty_starved(Dirty, [Id || #{id := Id} <- F]),
    ?assert(GcWall > 0.05),
    ?assert(Faults > 1000),
    %% The diagnosis names dirty GC, within the node's CPU. A host that
    %% starved the dirty schedulers (they waited for a CPU, their threads'
    %% counters say) cannot show it: a skip with those numbers.
    Figs = case [Fg || #{id := dirty_cpu_gc, figures := Fg} <- F] of
               [Fg] -> Fg;
               [] -> beamdiag_test_lib:dirty_starved(Dirty, [Id || #{id := Id} <- F])
           end,
    ct:pal("dirty_cpu_gc figures ~p", [Figs]),
    %% Within the node's CPUs over the same span (msacc's slice).
    ByName = maps:from_list([{K, X} || #{name := K, value := X} <- Figs]),
    ?assert(maps:get(dirty_gc_cpus, ByName) =< maps:get(span_cpus_used, ByName) + 1.0e-6),
    ?assertNot(lists:member(busy_wait, [Id || #{id := Id} <- F])),
    %% The memory: the queue processes hold their backlog (their memory,
    %% read by RabbitMQ itself), and the memory finding names them, with
    %% their memory: as what grew (the processes' part), or as what holds
    %% the binaries (the binary part: the payloads are cut from the
    %% channels' socket reads, so the binaries the channels reference are
    %% the queues' too).
    Queues = queue_pids(Config),
    ct:pal("the queues' processes, by rabbitmqctl: ~p", [Queues]),
    [?assert(Mem > 8 * 1048576) || {Q, _, Mem} <- Queues, lists:member(Q, ?BACKLOG_QUEUES)],
    MemLines = lists:append([Ev || #{id := memory_growth, evidence := Ev} <- F]),
    ?assertNotEqual([], MemLines),
    Named = [Q || {Q, Pid, _} <- Queues, lists:member(Q, ?BACKLOG_QUEUES),
                  Line <- MemLines, binary:match(Line, <<Pid/binary, " ">>) =/= nomatch,
                  binary:match(Line, [<<" holds ">>, <<" grew by ">>]) =/= nomatch],
    ?assertNotEqual([], Named, MemLines),
    nothing_the_node_has(F, S),
    within_bounds(L, F),
    beamdiag_amqp:close(C).

%% Yaws serving a dynamic page at a steady pace: the raw signal is the
%% requests served and the node's CPU; Yaws runs with the default busy-wait
%% flags, so busy-wait advice may be given, but never a flag it has.
yaws_paced(Config) ->
    Load = http_load(4, 40),
    {L, F, Cap = #{settings := S}} = diagnose3(Config, yaws_paced, yaws_node, yaws_cookie),
    {Served, Failed} = http_done(Load),
    ct:pal("yaws paced: ~b served, ~b failed; node ~.3f CPUs; flags ~p",
           [Served, Failed, node_cpus(Cap), maps:with([sbwt, sbwtdcpu, sbwtdio], S)]),
    ?assert(Served >= 100),
    ?assertEqual(0, Failed),
    ?assertEqual(<<"medium">>, maps:get(sbwt, S)),
    nothing_the_node_has(F, S),
    within_bounds(L, F),
    {save_config, [{paced, {Served, node_cpus(Cap)}}]}.

%% Yaws under as many requests as its clients can send: more requests and
%% more CPU than at the pace before it, measured side by side (the clients
%% share the host's CPUs with it, and so does the rest of the machine).
%% Whether the node gets all its CPUs depends on the rest of the host; a
%% saturation headline must say which.
yaws_flat_out(Config) ->
    Load = http_load(8, 0),
    {L, F, Cap = #{settings := S}} = diagnose3(Config, yaws_flat_out, yaws_node, yaws_cookie),
    {Served, Failed} = http_done(Load),
    #{by_type := #{scheduler := Sched}} = L,
    Busy = beamdiag_ledger:share(busy, Sched, maps:get(wall, Sched)),
    {yaws_paced, [{paced, {PacedServed, PacedCpus}}]} = ?config(saved_config, Config),
    ct:pal("yaws flat out: ~b served (paced: ~b), ~b failed; node ~.3f CPUs (paced: ~.3f), "
           "schedulers busy ~.3f", [Served, PacedServed, Failed, node_cpus(Cap), PacedCpus, Busy]),
    ?assert(Served >= 2 * PacedServed),
    ?assert(node_cpus(Cap) >= 1.5 * PacedCpus),
    %% Flat out the node either gets all its CPUs (saturated) or waits for
    %% them (starved): one of the two is said. A saturation headline says
    %% which: "uses all the CPU it has" at 90% of its CPUs and more, the
    %% other title below.
    Named = [Id || X = #{id := Id} <- F, lists:member(Id, [cpu_saturated, cpu_starvation]),
                   beamdiag_finding:at_least(X, warning)],
    ?assertMatch([_ | _], Named),
    [case Title of
         <<"The node uses all the CPU it has">> -> ?assert(used_share(Figs) >= 0.9);
         _ -> ?assert(used_share(Figs) < 0.9)
     end || #{id := cpu_saturated, title := Title, figures := Figs} <- F],
    %% A starvation finding stands on its run-queue wait: some, within the
    %% schedulers' wall time, and the node within the host's CPUs.
    [begin
         ByName = maps:from_list([{K, V} || #{name := K, value := V} <- Figs]),
         ct:pal("cpu_starvation figures ~p", [ByName]),
         ?assert(maps:get(runq_s, ByName) > 0),
         ?assert(maps:get(runq_s, ByName) =< maps:get(sched_wall_s, ByName) + 1.0e-6),
         ?assert(maps:get(runq_share, ByName) > 0 andalso maps:get(runq_share, ByName) =< 1),
         ?assert(maps:get(cpus_used, ByName) =< erlang:system_info(logical_processors) + 0.05)
     end || X = #{id := cpu_starvation, figures := Figs} <- F, beamdiag_finding:at_least(X, warning)],
    nothing_the_node_has(F, S),
    within_bounds(L, F).

%%% Helpers

used_share(Figs) ->
    hd([V || #{name := used_share, value := V} <- Figs]).

%% N clients, each sending GET /work.yaws (one connection a request) at
%% Rate a second, or as fast as answers come when Rate is 0, until
%% http_done/1 stops them (or 300 s pass). Returns once the first answers
%% came back (the load runs): {Pids, Counter}.
http_load(N, Rate) ->
    Self = self(),
    Served = counters:new(1, []),
    Until = erlang:monotonic_time(millisecond) + 300000,
    Pids = [spawn_link(fun() -> Self ! {http, self(), http_client(Rate, Until, Served, 0, 0)} end)
            || _ <- lists:seq(1, N)],
    ok = beamdiag_test_lib:await(fun() -> counters:get(Served, 1) >= N end, 30000),
    {Pids, Served}.

http_client(Rate, Until, Served, Ok, Bad) ->
    Now = erlang:monotonic_time(millisecond),
    Stop = receive stop -> true after 0 -> Now >= Until end,
    case Stop of
        true ->
            {Ok, Bad};
        false ->
            R = http_get("/work.yaws"),
            case Rate of
                0 -> ok;
                _ -> timer:sleep(max(0, 1000 div Rate - (erlang:monotonic_time(millisecond) - Now)))
            end,
            case R of
                ok -> counters:add(Served, 1, 1), http_client(Rate, Until, Served, Ok + 1, Bad);
                _ -> http_client(Rate, Until, Served, Ok, Bad + 1)
            end
    end.

http_get(Path) ->
    case gen_tcp:connect({127, 0, 0, 1}, ?YAWS_PORT, [binary, {active, false}], 5000) of
        {ok, S} ->
            ok = gen_tcp:send(S, ["GET ", Path, " HTTP/1.1\r\nHost: localhost\r\n"
                                  "Connection: close\r\n\r\n"]),
            R = http_read(S, <<>>),
            gen_tcp:close(S),
            case R of
                <<"HTTP/1.1 200", _/binary>> -> ok;
                _ -> {error, R}
            end;
        Error ->
            Error
    end.

http_read(S, Acc) ->
    case gen_tcp:recv(S, 0, 10000) of
        {ok, D} -> http_read(S, <<Acc/binary, D/binary>>);
        {error, _} -> Acc
    end.

%% Stops the clients of http_load/2: {Served, Failed}.
http_done({Pids, _Served}) ->
    [P ! stop || P <- Pids],
    lists:foldl(fun(P, {O, B}) ->
                        receive {http, P, {O1, B1}} -> {O + O1, B + B1}
                        after 60000 -> ct:fail(http_client_stuck)
                        end
                end, {0, 0}, Pids).

%% Publishes to Q in batches until the process is sent `stop', at most Max
%% messages and for at most Ms milliseconds.
publish_until_stopped(P, Q, Ms, Max) ->
    publish_until(P, Q, erlang:monotonic_time(millisecond) + Ms, Max).

publish_until(P, Q, Deadline, Left) ->
    Stop = receive stop -> true after 0 -> false end,
    case not Stop andalso Left > 0 andalso erlang:monotonic_time(millisecond) < Deadline of
        true ->
            ok = beamdiag_amqp:publish(P, Q, min(2000, Left), ?MSG_SIZE),
            publish_until(P, Q, Deadline, Left - 2000);
        false ->
            ok
    end.

diagnose3(Config, Case) ->
    diagnose3(Config, Case, rabbit_node, rabbit_cookie).

%% With 5 s of slack rather than the default 1.5: these cases judge the
%% diagnosis of a real server, not its latency (the sick-node suites and
%% bench/sick_latency do). A server and its load generators fill a 2-core
%% host, and on a host busy besides (a first run builds emulators beside
%% the suites) connecting and loading took long enough that a 4 s window's
%% report was due before its last ticks: a partial capture, on time, with
%% no msacc slice, which is right for a user but not what the case judges.
diagnose3(Config, Case, NodeKey, CookieKey) ->
    {ok, #{capture := Cap, ledger := L, findings := F}} =
        beamdiag:diagnose(?config(NodeKey, Config),
                          #{cookie => ?config(CookieKey, Config), duration => ?WINDOW,
                            slack => 5}),
    [ct:pal("~s ~s: ~s~n~s  fix: ~s", [Id, S, T, [["  - ", E, "\n"] || E <- Ev], Fix])
     || #{id := Id, severity := S, title := T, evidence := Ev, fix := Fix} <- F],
    record(Case, Cap),
    {L, F, Cap}.

record(Case, Cap) ->
    case os:getenv("BEAMDIAG_RECORD") of
        "1" ->
            File = filename:join([beamdiag_test_lib:top(), "test", "fixtures", "captures",
                                  atom_to_list(Case) ++ ".capture"]),
            ok = file:write_file(File, io_lib:format("~p.~n", [Cap]));
        _ ->
            ok
    end.

%% No fix advises a flag with the value the node already has, unless the
%% clause says it is already set.
nothing_the_node_has(F, S) ->
    Have = [{string:lowercase(atom_to_binary(K)), V} || {K, V} <- maps:to_list(S), is_binary(V)],
    [case re:run(Fix, "(.{0,60})\\+([A-Za-z]+) ([A-Za-z_0-9]+)([^.;]*)",
                 [global, {capture, all_but_first, binary}]) of
         nomatch ->
             ok;
         {match, Ms} ->
             [?assertEqual({Id, Flag, V, <<"not said already set">>}, {Id, Flag, V, ok})
              || [Before, Flag, V, After] <- Ms,
                 lists:member({string:lowercase(Flag), V}, Have),
                 binary:match(<<Before/binary, After/binary>>, <<"already">>) =:= nomatch]
     end || #{id := Id, fix := Fix} <- F],
    nothing_the_node_has(F).

%% No fix advises busy waiting off (the node has it off), a low wake-up
%% threshold, or scheduler binding the node already has.
nothing_the_node_has(F) ->
    [begin
         ?assertEqual({Id, nomatch}, {Id, re:run(Fix, "(Start the node with|turn busy waiting "
                                                 "off \\()[^.;]*\\+sbwt")}),
         ?assertEqual({Id, nomatch}, {Id, re:run(Fix, "\\+swt (very_)?low")}),
         ?assertEqual({Id, nomatch}, {Id, re:run(Fix, "\\+s(t)?bt db")})
     end || #{id := Id, fix := Fix} <- F].

within_bounds(#{totals := #{cpus_used := Used, on_cpu := On}, host := #{ncpu := N}}, F) ->
    [begin
         case Fig of
             #{unit := share} -> ?assert(V =< 1.0 + 1.0e-9);
             #{unit := cpus, scope := node, name := cpus_used} -> ?assert(V =< N);
             #{unit := cpus, scope := node} -> ?assertEqual({Name, true}, {Name, V =< Used + 1.0e-6});
             #{unit := cpus} -> ?assert(V =< N);
             #{unit := cpu_s, scope := node} -> ?assertEqual({Name, true}, {Name, V =< On + 1.0e-6});
             _ -> ok
         end,
         ?assert(V >= 0)
     end || #{figures := Figs} <- F, Fig = #{name := Name, value := V} <- Figs].

%% The raw signals below come from the capture's own counters (the
%% threads' schedstat and clock ticks, /proc/stat, msacc), apart from the
%% ledger the diagnosis is made of.

%% CPUs the node's threads used over the window.
node_cpus(Cap) ->
    maps:get(node_cpus, beamdiag_test_lib:raw_host(Cap)).

%% The normal and dirty CPU schedulers' run-queue wait, share of their
%% wall time.
runq_share(Cap) ->
    #{wait_ns := W, wall_ns := Wall} = beamdiag_test_lib:raw_threads(Cap, ?SCHED_OR_DIRTY_CPU),
    W / max(1, Wall).

%% CPUs the rest of the host used over the window.
external_cpus(Cap) ->
    #{cpus := Host, node_cpus := Node} = beamdiag_test_lib:raw_host(Cap),
    Host - Node.

server_sessions(Config) ->
    {ok, Group} = file:read_file(filename:join(?config(rabbit_dir, Config), "group.pid")),
    [string:trim(Group), session_of(rabbit_os_pid(Config))].

%% The session of a process, from its /proc/PID/stat (the field after
%% the parenthesised name: state, ppid, pgrp, session).
session_of(OsPid) ->
    {ok, B} = file:read_file("/proc/" ++ OsPid ++ "/stat"),
    [_, Rest] = string:split(B, <<") ">>, trailing),
    [_State, _PPid, _Pgrp, Sid | _] = binary:split(Rest, <<" ">>, [global]),
    Sid.

%% The processes of a session, by ps.
session_processes(Sid) ->
    {_, Out} = sh(["ps -o pid= -s ", string:trim(Sid), " || true"]),
    [string:trim(P) || P <- binary:split(Out, <<"\n">>, [global, trim_all])].

%% The server's emulator, by the pid file the lab script has it write
%% (RABBITMQ_PID_FILE), its command line logged.
rabbit_os_pid(Config) ->
    {ok, B} = file:read_file(filename:join(?config(rabbit_dir, Config), "rabbit.pid")),
    P = binary_to_list(string:trim(B)),
    {ok, Cmd} = file:read_file(["/proc/", P, "/cmdline"]),
    ct:pal("the server's emulator: ~s, ~ts", [P, binary:replace(Cmd, <<0>>, <<" ">>, [global])]),
    P.

depths(Config) ->
    [{Q, binary_to_integer(N)} || [Q, N] <- list_queues(Config, "name messages")].

%% Each queue's name, its process (as the node prints a local pid:
%% <0.N.S>) and that process's memory (bytes), by rabbitmqctl.
queue_pids(Config) ->
    [{Q, local_pid(Pid), binary_to_integer(M)}
     || [Q, Pid, M] <- list_queues(Config, "name pid memory")].

%% rabbitmqctl list_queues: a row of the columns asked for each queue.
list_queues(Config, Columns) ->
    {0, Out} = sh([script(), " ctl ", ?config(rabbit_dir, Config),
                   " list_queues -q --no-table-headers ", Columns]),
    [binary:split(string:trim(Line), <<"\t">>, [global])
     || Line <- binary:split(Out, <<"\n">>, [global, trim_all])].

%% <rabbit@host.1733321114.918.0> -> <0.918.0>
local_pid(Pid) ->
    Parts = binary:split(string:trim(Pid, both, "<>"), <<".">>, [global]),
    [N, S] = lists:nthtail(length(Parts) - 2, Parts),
    <<"<0.", N/binary, ".", S/binary, ">">>.

%% Waits up to Ms milliseconds for every queue to hold N messages.
wait_depth(Config, Queues, N, Ms) ->
    Full = fun() ->
        D = depths(Config),
        lists:all(fun(Q) -> proplists:get_value(Q, D, 0) >= N end, Queues)
    end,
    case beamdiag_test_lib:wait_until(Full, Ms) of
        ok -> ok;
        timeout -> ct:fail({queues_not_filled, depths(Config)})
    end.

script() ->
    script("rabbitmq-lab.sh").

script(Name) ->
    beamdiag_test_lib:script(Name).

sh(Cmd) ->
    beamdiag_test_lib:sh(Cmd).
