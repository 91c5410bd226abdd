%%% EUnit tests of the agent client on this node: the agent's words come
%%% as events, stop waits for its last word, abort ends it without one, an
%%% agent whose start answered late is told to end, and the failures read
%%% as sentences.
-module(beamdiag_client_tests).

-include_lib("eunit/include/eunit.hrl").

-define(OPTS, #{duration_ms => 60000, interval_ms => 100, msacc => false, locks => false,
                procs => false, host_scan => false}).

client_test_() ->
    {timeout, 60, [
        {"start, ticks, stop", fun start_ticks_stop/0},
        {"abort: no last word, then the agent's end", fun abort_then_down/0},
        {"a late start's agent is told to end", fun stray_start/0},
        {"sentences", fun sentences/0}
    ]}.

start_ticks_stop() ->
    {ok, C} = beamdiag_client:start(node(), ?OPTS),
    {Info, Ticks} = events(C, 2),
    Agent = maps:get(agent, Info),
    ?assertEqual(atom_to_binary(node()), maps:get(node, Info)),
    ?assertEqual(2, length(Ticks)),
    MRef = erlang:monitor(process, Agent),
    ok = beamdiag_client:stop(C, 10000),
    %% The agent ended, and none of its words is left behind (another
    %% test's agent, still ending, may send to this process: only this
    %% session's words count).
    receive {'DOWN', MRef, process, Agent, _} -> ok after 10000 -> ?assert(false) end,
    Ref = maps:get(ref, C),
    ?assertEqual([], [M || {beamdiag, R, _} = M <- mailbox(), R =:= Ref]).

abort_then_down() ->
    {ok, C} = beamdiag_client:start(node(), ?OPTS),
    _ = events(C, 1),
    ok = beamdiag_client:abort(C),
    %% Its quick extras, no last word, then its end.
    ?assertMatch({ok, _}, beamdiag_client:await(C, partial_extras, 10000)),
    ?assertEqual({down, normal}, next_end(C)),
    ok = beamdiag_client:close(C).

stray_start() ->
    {ok, C} = beamdiag_client:start(node(), ?OPTS),
    Self = self(),
    Stray = spawn(fun() -> receive {beamdiag_abort, From} -> Self ! {aborted, From} end end),
    self() ! {beamdiag, make_ref(), {start, #{agent => Stray}}},
    %% The stray's word never reaches the caller: the real agent's does.
    ?assertMatch({event, {start, #{agent := A}}} when A =/= Stray, beamdiag_client:next(C, 10000)),
    receive {aborted, From} -> ?assertEqual(self(), From) after 5000 -> ?assert(false) end,
    ok = beamdiag_client:stop(C, 10000).

sentences() ->
    Start = iolist_to_binary(beamdiag_client:format_error({agent_start, 'n@h', {timeout, [2500, 2500]}})),
    ?assertMatch({_, _}, binary:match(Start, <<"did not start the agent within 2.5 s and 2.5 s">>)),
    %% The collector and the live view say the same.
    ?assertEqual(Start, iolist_to_binary(beamdiag_collect:format_error(
                                             {agent_start, 'n@h', {timeout, [2500, 2500]}}))),
    ?assertEqual(Start, iolist_to_binary(beamdiag_watch:format_error(
                                             {agent_start, 'n@h', {timeout, [2500, 2500]}}))),
    ?assertEqual(<<"the target went away (the connection dropped)">>,
                 iolist_to_binary(beamdiag_watch:format_error({target_down, noconnection}))),
    ?assertEqual(<<"the agent stopped early (it reached its deadline before its last tick)">>,
                 iolist_to_binary(beamdiag_collect:format_error({agent_aborted, deadline}))).

%%% Helpers

%% The start word and the first N ticks.
events(C, N) ->
    events(C, N, undefined, []).

events(_C, 0, Info, Ticks) ->
    {Info, lists:reverse(Ticks)};
events(C, N, Info, Ticks) ->
    case beamdiag_client:next(C, 10000) of
        {event, {start, I}} -> events(C, N, I, Ticks);
        {event, {tick, S}} -> events(C, N - 1, Info, [S | Ticks]);
        {event, _} -> events(C, N, Info, Ticks)
    end.

%% Skips the agent's words until its end.
next_end(C) ->
    case beamdiag_client:next(C, 10000) of
        {event, {done, _}} = E -> E;
        {event, {aborted, _}} = E -> E;
        {event, _} -> next_end(C);
        Other -> Other
    end.

mailbox() ->
    receive M -> [M | mailbox()] after 0 -> [] end.
