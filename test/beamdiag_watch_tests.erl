%%% EUnit tests of the live view on this node: frames over a sliding
%%% window once it holds two samples, a view with a duration that ends
%%% by itself, the agent's end said as an error (killed, shut down), the
%%% options checked before anything starts, and the sentences.
-module(beamdiag_watch_tests).

-include_lib("eunit/include/eunit.hrl").

-define(OPTS, #{interval => 100, procs => false}).

watch_test_() ->
    [{timeout, 60, T} || T <- [
        {"frames over a sliding window", fun sliding/0},
        {"a view with a duration ends", fun ends/0},
        {"the agent killed: target_down", fun killed/0},
        {"the agent shut down: aborted", fun shut_down/0},
        {"bad options raise badarg, before any agent starts", fun bad_options/0},
        {"a bad node name", fun bad_node/0},
        {"sentences", fun sentences/0}
    ]].

sliding() ->
    {ok, S0} = beamdiag_watch:start(node(), ?OPTS#{samples => 3}),
    %% One tick is one sample: no frame yet.
    {wait, S1} = beamdiag_watch:next(S0, 0),
    %% Frames from the second sample on, over at most the last three.
    {S2, D2} = frame(S1),
    ?assertEqual(2, length(samples(D2))),
    {S3, D3} = frame(S2),
    ?assertEqual(3, length(samples(D3))),
    {S4, D4} = frame(S3),
    [A, B, C] = samples(D4),
    ?assertEqual(tl(samples(D3)), [A, B]),
    ?assert(maps:get(t, C) > maps:get(t, B)),
    ?assertMatch(#{capture := #{interval_ms := 100, node := _}, ledger := #{}, findings := _},
                 D4),
    ?assert(is_list(maps:get(findings, D4))),
    %% The ledger covers the sliding window, not the view since its start.
    ?assert(abs(maps:get(window_s, maps:get(ledger, D4)) - (maps:get(t, C) - maps:get(t, A)) / 1.0e9)
            < 1.0e-6),
    ?assertEqual(atom_to_binary(node()), maps:get(node, maps:get(capture, D4))),
    ok = beamdiag_watch:stop(S4),
    agent_ended().

ends() ->
    {ok, S0} = beamdiag_watch:start(node(), ?OPTS#{duration => 0.3}),
    {Frames, _} = until_done(S0, 0),
    %% Up to four ticks in 0.3 s at 100 ms, the first two make one frame;
    %% the first and the last are always taken.
    ?assert(Frames >= 1 andalso Frames =< 3),
    agent_ended().

killed() ->
    {ok, S0} = beamdiag_watch:start(node(), ?OPTS),
    {S1, _} = frame(S0),
    Agent = whereis(beamdiag_agent),
    ?assert(is_pid(Agent)),
    exit(Agent, kill),
    R = until_error(S1),
    ?assertEqual({error, {beamdiag_watch, {target_down, killed}}}, R),
    ?assertEqual(<<"the target went away (the agent was killed)">>,
                 iolist_to_binary(beamdiag_watch:format_error({target_down, killed}))).

shut_down() ->
    {ok, S0} = beamdiag_watch:start(node(), ?OPTS),
    {S1, _} = frame(S0),
    %% As a supervisor ends it when the node stops: it says so, then ends.
    exit(whereis(beamdiag_agent), shutdown),
    ?assertEqual({error, {beamdiag_watch, {aborted, shutdown}}}, until_error(S1)),
    agent_ended().

bad_options() ->
    Bad = [#{interval => 99}, #{interval => 60001}, #{interval => 1.5e3},
           #{duration => 0}, #{duration => -1}, #{duration => forever},
           #{samples => 1}, #{samples => 601}],
    [?assertError({badarg, {K, V}}, beamdiag_watch:start(node(), O))
     || O <- Bad, [{K, V}] <- [maps:to_list(O)]],
    ?assertError({badarg, {unknown_options, [intervall], allowed, _}},
                 beamdiag_watch:start(node(), #{intervall => 1000})),
    %% Not a map: a crash (no agent either).
    ?assertException(error, _, beamdiag_watch:start(node(), [{interval, 1000}])),
    ?assertEqual(undefined, whereis(beamdiag_agent)).

bad_node() ->
    ?assertEqual({error, {beamdiag_node_name, {bad_node, "no-at-sign"}}},
                 beamdiag_watch:start("no-at-sign", ?OPTS)),
    ?assertEqual({error, {beamdiag_node_name, {bad_node, "a b@c"}}},
                 beamdiag_watch:start('a b@c', ?OPTS)),
    %% Options are checked first.
    ?assertError({badarg, {samples, 0}}, beamdiag_watch:start("no-at-sign", #{samples => 0})),
    ?assertEqual(nonode@nohost, node()).

sentences() ->
    ?assertEqual(<<"the agent stopped (it reached its deadline before its last tick)">>,
                 iolist_to_binary(beamdiag_watch:format_error({aborted, deadline}))),
    ?assertEqual(<<"the agent stopped (the node is shutting down)">>,
                 iolist_to_binary(beamdiag_watch:format_error({aborted, shutdown}))),
    ?assertEqual(<<"the target went away (the agent was gone before it could be watched)">>,
                 iolist_to_binary(beamdiag_watch:format_error({target_down, noproc}))),
    Start = {agent_start, 'n@h', {error, {erpc, noconnection}}},
    ?assertEqual(iolist_to_binary(beamdiag_client:format_error(Start)),
                 iolist_to_binary(beamdiag_watch:format_error(Start))).

%%% Helpers

%% The next frame, past the waits.
frame(S) ->
    case beamdiag_watch:next(S, 10000) of
        {ok, S2, D} -> {S2, D};
        {wait, S2} -> frame(S2)
    end.

until_done(S, Frames) ->
    case beamdiag_watch:next(S, 10000) of
        {ok, S2, _} -> until_done(S2, Frames + 1);
        {wait, S2} -> until_done(S2, Frames);
        {done, S2} -> {Frames, S2}
    end.

until_error(S) ->
    case beamdiag_watch:next(S, 10000) of
        {ok, S2, _} -> until_error(S2);
        {wait, S2} -> until_error(S2);
        {error, _} = E -> E
    end.

samples(#{capture := #{samples := Samples}}) ->
    Samples.

agent_ended() ->
    ok = beamdiag_test_lib:await(fun() -> whereis(beamdiag_agent) =:= undefined end, 10000).
