%%% The metrics endpoint on a real port: scraped with httpc over a real
%%% socket, the exposition text parsed, every metric docs/METRICS.md lists
%%% present with sane values, the schedulers busy under a burn load, and
%%% the flags put back when it stops.
-module(beamdiag_metrics_SUITE).

-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0, suite/0, init_per_suite/1, end_per_suite/1]).
-export([documented_metrics_under_load/1, msacc_metrics_and_restore/1, port_in_use/1,
         supervised/1]).
%% Supervisor callback for the supervised case.
-export([init/1]).

suite() ->
    [{timetrap, {minutes, 2}}].

all() ->
    [documented_metrics_under_load, msacc_metrics_and_restore, port_in_use, supervised].

init_per_suite(Config) ->
    {ok, _} = application:ensure_all_started(inets),
    Root = filename:dirname(filename:dirname(proplists:get_value(source, ?MODULE:module_info(compile)))),
    [{docs, filename:join([Root, "docs", "METRICS.md"])} | Config].

end_per_suite(_Config) ->
    ok.

%%%===================================================================
%%% Cases
%%%===================================================================

documented_metrics_under_load(Config) ->
    Swt0 = erlang:statistics(scheduler_wall_time),
    Port = free_port(),
    {ok, Pid} = beamdiag_metrics:start(#{port => Port, interval => 500}),
    Burners = burn(erlang:system_info(schedulers_online)),
    try
        timer:sleep(1500),
        Metrics = scrape(Port),
        Documented = documented(?config(docs, Config)),
        ct:log("documented: ~p", [Documented]),
        Always = [N || {N, always} <- Documented],
        ?assert(length(Always) >= 10),
        Missing = [N || N <- Always, not lists:keymember(N, 1, Metrics)],
        ?assertEqual([], Missing),
        %% Nothing undocumented is exported.
        Names = lists:usort([N || {N, _, _} <- Metrics]),
        ?assertEqual([], Names -- [N || {N, _} <- Documented]),
        %% Shares and utilisation between 0 and 1.
        Bad = [M || M = {N, _, V} <- Metrics,
                    binary:match(N, [<<"_share">>, <<"_utilization">>]) =/= nomatch,
                    not (V >= 0.0 andalso V =< 1.0)],
        ?assertEqual([], Bad),
        ?assertEqual(1.0, value(Metrics, <<"beamdiag_up">>, [])),
        %% The states of a type add up to 1.
        States = [V || {<<"beamdiag_thread_time_share">>, L, V} <- Metrics,
                       lists:member({<<"type">>, <<"scheduler">>}, L)],
        ?assertEqual(5, length(States)),
        ?assert(abs(lists:sum(States) - 1.0) < 0.01),
        Busy = value(Metrics, <<"beamdiag_scheduler_utilization">>, [{<<"type">>, <<"scheduler">>}]),
        ct:pal("scheduler utilisation under burn: ~.3f; cpus used ~.2f of ~.2f",
               [Busy, value(Metrics, <<"beamdiag_cpus_used">>, []),
                value(Metrics, <<"beamdiag_cpus_available">>, [])]),
        ?assert(Busy > 0.5),
        ?assert(value(Metrics, <<"beamdiag_cpus_used">>, []) > 0.0),
        ?assertEqual(0.0, value(Metrics, <<"beamdiag_msacc_enabled">>, [])),
        %% Anything but the path is a 404.
        {ok, {{_, 404, _}, _, _}} = httpc:request(get, {url(Port, "/other"), []}, [], [])
    after
        [exit(B, kill) || B <- Burners],
        ok = beamdiag_metrics:stop(Pid)
    end,
    ?assertEqual(Swt0, erlang:statistics(scheduler_wall_time)),
    closed(Port, 20).

msacc_metrics_and_restore(_Config) ->
    Was = msacc_on(),
    try
        %% Off before: on while it runs, off again after.
        _ = erlang:system_flag(microstate_accounting, false),
        Port = free_port(),
        {ok, Pid} = beamdiag_metrics:start(#{port => Port, interval => 300, msacc => true}),
        timer:sleep(900),
        ?assert(msacc_on()),
        Metrics = scrape(Port),
        ok = beamdiag_metrics:stop(Pid),
        ?assertNot(msacc_on()),
        ?assertEqual(1.0, value(Metrics, <<"beamdiag_msacc_enabled">>, [])),
        Gc = value(Metrics, <<"beamdiag_dirty_gc_share">>, []),
        ?assert(Gc >= 0.0 andalso Gc =< 1.0),
        ?assert(lists:keymember(<<"beamdiag_msacc_state_share">>, 1, Metrics)),
        %% On before: still on after.
        _ = erlang:system_flag(microstate_accounting, true),
        {ok, Pid2} = beamdiag_metrics:start(#{port => Port, interval => 300, msacc => true}),
        ok = beamdiag_metrics:stop(Pid2),
        ?assert(msacc_on())
    after
        _ = erlang:system_flag(microstate_accounting, Was)
    end.

%% Whether microstate accounting is on (statistics/1 returns counters
%% either way on some releases).
msacc_on() ->
    Old = erlang:system_flag(microstate_accounting, false),
    _ = erlang:system_flag(microstate_accounting, Old),
    Old.

port_in_use(_Config) ->
    Port = free_port(),
    {ok, Pid} = beamdiag_metrics:start(#{port => Port}),
    try
        {error, {beamdiag_metrics, Reason}} = beamdiag_metrics:start(#{port => Port}),
        Text = lists:flatten(beamdiag_metrics:format_error(Reason)),
        ct:log("~s", [Text]),
        ?assertNotEqual(nomatch, string:find(Text, integer_to_list(Port)))
    after
        beamdiag_metrics:stop(Pid)
    end,
    ?assertError({badarg, _}, beamdiag_metrics:start(#{port => Port, colour => true})).

supervised(_Config) ->
    Port = free_port(),
    process_flag(trap_exit, true),
    {ok, Sup} = supervisor:start_link(?MODULE, beamdiag_metrics:child_spec(#{port => Port})),
    timer:sleep(1500),
    ?assertEqual(1.0, value(scrape(Port), <<"beamdiag_up">>, [])),
    exit(Sup, shutdown),
    receive {'EXIT', Sup, shutdown} -> ok after 5000 -> ct:fail(no_shutdown) end,
    closed(Port, 20).

%% The listener goes away shortly after the stop returns.
closed(Port, 0) ->
    ct:fail({still_listening, Port});
closed(Port, N) ->
    case gen_tcp:connect({127, 0, 0, 1}, Port, [], 1000) of
        {error, econnrefused} -> ok;
        {error, _} -> timer:sleep(100), closed(Port, N - 1);
        {ok, S} -> gen_tcp:close(S), timer:sleep(100), closed(Port, N - 1)
    end.

init(ChildSpec) ->
    {ok, {#{strategy => one_for_one, intensity => 0, period => 1}, [ChildSpec]}}.

%%%===================================================================
%%% Internal
%%%===================================================================

free_port() ->
    {ok, L} = gen_tcp:listen(0, [{ip, {127, 0, 0, 1}}]),
    {ok, Port} = inet:port(L),
    gen_tcp:close(L),
    Port.

url(Port, Path) ->
    "http://127.0.0.1:" ++ integer_to_list(Port) ++ Path.

%% Scrapes with httpc and parses the exposition text into
%% [{Name, [{Label, Value}], Number}], checking each sample has its HELP
%% and TYPE.
scrape(Port) ->
    {ok, {{_, 200, _}, Headers, Body}} =
        httpc:request(get, {url(Port, "/metrics"), []}, [{timeout, 20000}],
                      [{body_format, binary}]),
    ?assertMatch("text/plain; version=0.0.4" ++ _, proplists:get_value("content-type", Headers)),
    ct:log("~ts", [Body]),
    Lines = [L || L <- string:split(Body, <<"\n">>, all), L =/= <<>>],
    Typed = [N || <<"# TYPE ", Rest/binary>> <- Lines, [N, <<"gauge">>] <- [string:split(Rest, " ")]],
    Helped = [hd(string:split(Rest, " ")) || <<"# HELP ", Rest/binary>> <- Lines],
    Samples = [sample(L) || L <- Lines, binary:first(L) =/= $#],
    [begin
         ?assert(lists:member(N, Typed)),
         ?assert(lists:member(N, Helped))
     end || {N, _, _} <- Samples],
    Samples.

sample(Line) ->
    {match, [Name, Labels, Value]} =
        re:run(Line, <<"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\\{(.*)\\})? (\\S+)$">>,
               [{capture, all_but_first, binary}]),
    Ls = [{K, V} || P <- binary:split(Labels, <<",">>, [global, trim_all]),
                    {match, [K, V]} <- [re:run(P, <<"^([a-z_]+)=\"(.*)\"$">>,
                                               [{capture, all_but_first, binary}])]],
    {Name, Ls, number(Value)}.

number(<<"NaN">>) -> nan;
number(B) ->
    case string:to_float(B) of
        {F, <<>>} -> F;
        _ -> float(binary_to_integer(B))
    end.

value(Metrics, Name, Labels) ->
    case [V || {N, L, V} <- Metrics, N =:= Name, Labels -- L =:= []] of
        [V | _] -> V;
        [] -> ct:fail({missing, Name, Labels})
    end.

%% The metric table of docs/METRICS.md: name and when it is present.
documented(File) ->
    {ok, Doc} = file:read_file(File),
    [{N, binary_to_atom(When)}
     || L <- string:split(Doc, <<"\n">>, all),
        {match, [N, When]} <- [re:run(L, <<"^\\| `(beamdiag_[a-z_]+)` \\|[^|]*\\| ([a-z]+) \\|">>,
                                      [{capture, all_but_first, binary}])]].

%% Low priority: the schedulers are busy, yet the sampler and the HTTP
%% server (normal priority) still run at once.
burn(N) ->
    [spawn(fun() -> process_flag(priority, low), spin(0) end) || _ <- lists:seq(1, N)].

spin(X) ->
    spin((X * 7 + 3) rem 1000003).
