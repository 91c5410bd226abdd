%%% Real servers as the judge: Debian's RabbitMQ, started by
%%% scripts/rabbitmq-lab.sh on loopback with its own node name, ports and
%%% data, loaded by a small AMQP client (beamdiag_amqp) and stopped at the
%%% end (the server also stops on its own after a time limit). Each case
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

-export([all/0, suite/0, init_per_suite/1, end_per_suite/1]).
-export([rabbitmq_idle/1, rabbitmq_paced/1, rabbitmq_backlog/1]).

-define(WINDOW, 4).
-define(PORT, 5699).
%% Queues that back up: a few, not dozens (the machine is shared).
-define(BACKLOG_QUEUES, [<<"backlog_1">>, <<"backlog_2">>]).
-define(BACKLOG_MSGS, 150000).
-define(MSG_SIZE, 1024).

suite() -> [{timetrap, {minutes, 6}}].

all() ->
    [rabbitmq_idle, rabbitmq_paced, rabbitmq_backlog].

init_per_suite(Config) ->
    case os:find_executable("rabbitmqctl") of
        false ->
            beamdiag_test_lib:missing("rabbitmq-server is not installed (scripts/setup.sh test)");
        _ ->
            Dir = "/tmp/beamdiag_rabbit_" ++ os:getpid(),
            Script = script(),
            %% Stops on its own after 300 s whatever happens to this suite.
            {0, _} = sh([Script, " start ", Dir, " 300"]),
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

end_per_suite(Config) ->
    case ?config(rabbit_dir, Config) of
        undefined -> ok;
        Dir ->
            {0, _} = sh([script(), " stop ", Dir]),
            %% Nothing of the server is left running.
            {_, Left} = sh(["pgrep -u rabbitmq -f 'beamdiag_rabbit@' || true"]),
            ?assertEqual(<<>>, string:trim(Left)),
            _ = sh(["rm -rf ", Dir]),
            ok
    end.

%%% Cases

rabbitmq_idle(Config) ->
    %% Raw signal: no messages anywhere, the node nearly idle.
    ?assertEqual(0, lists:sum([N || {_, N} <- depths(Config)])),
    {L, F, #{settings := S}} = diagnose3(Config, rabbitmq_idle),
    Used = cpus_used(L),
    ct:pal("idle: node ~.3f CPUs", [Used]),
    ?assert(Used < 0.3),
    %% RabbitMQ 3.10 as Debian ships it: busy waiting off, schedulers bound.
    ?assertEqual([<<"none">>, <<"none">>, <<"none">>],
                 [maps:get(K, S) || K <- [sbwt, sbwtdcpu, sbwtdio]]),
    ?assertNotEqual(<<"unbound">>, maps:get(bind_type, S)),
    ?assertEqual([], [Id || X = #{id := Id} <- F, beamdiag_finding:at_least(X, warning),
                           Id =/= cpu_starvation]),
    nothing_the_node_has(F),
    within_bounds(L, F).

rabbitmq_paced(Config) ->
    Q = <<"paced">>,
    {ok, C} = beamdiag_amqp:open(?PORT),
    ok = beamdiag_amqp:declare(C, Q),
    {ok, P} = beamdiag_amqp:open(?PORT),
    _ = beamdiag_amqp:consume(C, Q),
    Self = self(),
    Pub = spawn_link(fun() ->
                             beamdiag_amqp:paced(P, Q, 3000, ?MSG_SIZE, ?WINDOW + 3),
                             Self ! {paced, done}
                     end),
    timer:sleep(1000),
    {L, F} = diagnose(Config, rabbitmq_paced),
    receive {paced, done} -> ok after 30000 -> ct:fail(publisher_stuck) end,
    _ = Pub,
    %% Raw signal: the consumer kept up (the queue did not back up) and the
    %% node worked more than when idle.
    Depth = proplists:get_value(Q, depths(Config)),
    Used = cpus_used(L),
    ct:pal("paced: depth ~p, node ~.3f CPUs, ~b reductions/s",
           [Depth, Used, round(maps:get(reductions_per_s, maps:get(vm, L)))]),
    ?assert(Depth < 30000),
    ?assert(maps:get(reductions_per_s, maps:get(vm, L)) > 100000),
    ?assertNot(lists:member(busy_wait, [Id || #{id := Id} <- F])),
    nothing_the_node_has(F),
    within_bounds(L, F),
    beamdiag_amqp:close(C),
    beamdiag_amqp:close(P).

rabbitmq_backlog(Config) ->
    {ok, C} = beamdiag_amqp:open(?PORT),
    [ok = beamdiag_amqp:declare(C, Q) || Q <- ?BACKLOG_QUEUES],
    [ok = beamdiag_amqp:publish(C, Q, ?BACKLOG_MSGS, ?MSG_SIZE) || Q <- ?BACKLOG_QUEUES],
    wait_depth(Config, ?BACKLOG_QUEUES, ?BACKLOG_MSGS, 60),
    %% More messages into the queues that already hold a backlog, during
    %% the window: each queue process collects its large heap as it grows.
    Self = self(),
    Pubs = [spawn_link(fun() ->
                               {ok, P} = beamdiag_amqp:open(?PORT),
                               ok = beamdiag_amqp:publish(P, Q, 40000, ?MSG_SIZE),
                               beamdiag_amqp:close(P),
                               Self ! {published, Q}
                       end) || Q <- ?BACKLOG_QUEUES],
    {L, F} = diagnose(Config, rabbitmq_backlog),
    [receive {published, Q} -> ok after 60000 -> ct:fail(publisher_stuck) end
     || Q <- ?BACKLOG_QUEUES],
    _ = Pubs,
    %% Raw signal: the queues hold their backlog, and the dirty CPU
    %% schedulers collected garbage (msacc) while the node took page faults.
    Depths = depths(Config),
    [?assert(proplists:get_value(Q, Depths) >= ?BACKLOG_MSGS) || Q <- ?BACKLOG_QUEUES],
    #{msacc := #{by_type := #{dirty_cpu := #{seconds := Secs}}, span_s := Span}} = L,
    GcWall = maps:get(gc, Secs, 0) + maps:get(gc_full, Secs, 0),
    Faults = lists:sum([maps:get(minflt, T) + maps:get(majflt, T) || T <- maps:get(threads, L)]),
    Used = cpus_used(L),
    ct:pal("backlog: depths ~p; node ~.3f CPUs; dirty gc ~.3f s wall in ~.1f s; ~b page faults",
           [Depths, Used, GcWall, Span, round(Faults)]),
    ?assert(GcWall > 0.05),
    ?assert(Faults > 1000),
    %% The diagnosis: dirty GC within the node's CPU, nothing it has.
    [begin
         ct:pal("dirty_cpu_gc figures ~p", [Figs]),
         [?assert(V =< Used + 1.0e-6) || #{name := dirty_gc_cpus, value := V} <- Figs]
     end || #{id := dirty_cpu_gc, figures := Figs} <- F],
    ?assertNot(lists:member(busy_wait, [Id || #{id := Id} <- F])),
    nothing_the_node_has(F),
    within_bounds(L, F),
    beamdiag_amqp:close(C).

%%% Helpers

diagnose(Config, Case) ->
    {L, F, _} = diagnose3(Config, Case),
    {L, F}.

diagnose3(Config, Case) ->
    {ok, #{capture := Cap, ledger := L, findings := F}} =
        beamdiag:diagnose(?config(rabbit_node, Config),
                          #{cookie => ?config(rabbit_cookie, Config), duration => ?WINDOW}),
    [ct:pal("~s ~s: ~s~n  ~p~n  fix: ~s", [Id, S, T, Ev, Fix])
     || #{id := Id, severity := S, title := T, evidence := Ev, fix := Fix} <- F],
    record(Case, Cap),
    {L, F, Cap}.

record(Case, Cap) ->
    case os:getenv("BEAMDIAG_RECORD") of
        "1" ->
            File = filename:join([root(), "test", "fixtures", "captures",
                                  atom_to_list(Case) ++ ".capture"]),
            ok = file:write_file(File, io_lib:format("~p.~n", [Cap]));
        _ ->
            ok
    end.

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

cpus_used(#{totals := #{cpus_used := U}}) -> U.

depths(Config) ->
    {0, Out} = sh([script(), " ctl ", ?config(rabbit_dir, Config),
                   " list_queues -q --no-table-headers name messages"]),
    [{Q, binary_to_integer(N)}
     || Line <- binary:split(Out, <<"\n">>, [global, trim_all]),
        [Q, N] <- [binary:split(string:trim(Line), <<"\t">>)]].

wait_depth(Config, Queues, N, Tries) ->
    D = depths(Config),
    case lists:all(fun(Q) -> proplists:get_value(Q, D, 0) >= N end, Queues) of
        true -> ok;
        false when Tries > 0 -> timer:sleep(1000), wait_depth(Config, Queues, N, Tries - 1);
        false -> ct:fail({queues_not_filled, D})
    end.

script() ->
    filename:join([root(), "scripts", "rabbitmq-lab.sh"]).

%% The project's root, found above where the beamdiag modules were loaded.
root() ->
    root(filename:dirname(code:which(beamdiag))).

root("/") ->
    error(no_project_root);
root(Dir) ->
    case filelib:is_regular(filename:join([Dir, "scripts", "rabbitmq-lab.sh"])) of
        true -> Dir;
        false -> root(filename:dirname(Dir))
    end.

sh(Cmd) ->
    Port = open_port({spawn, lists:flatten(["sh -c '", escape(lists:flatten(Cmd)), "' 2>&1"])},
                     [exit_status, binary, hide]),
    read(Port, <<>>).

escape(S) -> lists:flatten(string:replace(S, "'", "'\\''", all)).

read(Port, Acc) ->
    receive
        {Port, {data, D}} -> read(Port, <<Acc/binary, D/binary>>);
        {Port, {exit_status, S}} -> {S, Acc}
    after 180000 -> error(sh_timeout)
    end.
