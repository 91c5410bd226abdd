%%% @doc The process walks' own process, on the target (erts, kernel and
%%% stdlib only). It takes the walk at the window's start, keeps the walk's
%%% state (every process's figures at the start, which would cost a copy
%%% of the whole table each time it were sent to another process) and
%%% takes the next walks when the agent asks: one in the middle of a watch
%%% every few ticks, and the one at the window's end. In a process of its
%%% own, so that a process that answers slowly (one held in a NIF) stalls
%%% the walk, not the agent's ticks; at high priority like the agent (on a
%%% node whose processes crowd the run queue a normal walker would wait
%%% behind them). It ends with the agent: it monitors it, and it exits
%%% after the end walk.
%%%
%%% Messages to the agent: `{beamdiag_walk, Walker, Result}', Result one of
%%% `{started, Snapshot, Watch}' (the start walk's report alone and the
%%% pids whose queues the ticks watch), `{next, Report}' and
%%% `{error, Text}'. The end walk's report goes to whoever asked, as
%%% `{Ref, {ok, Report}}' or `{Ref, {error, Text}}'.
-module(beamdiag_agent_walker).

-export([start/2, next/1, finish/2]).

%% The start walk's figures take about this many words a process (the
%% tuple, its entry in the list and in the map), at most ?MAX_HEAP_WORDS
%% (8 MB) up front.
-define(WORDS_PER_PROCESS, 20).
-define(MAX_HEAP_WORDS, 1000000).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Starts the walker for Agent; Skip: pids left out of the walks
%% (the agent's helpers; the agent and the walker always are).
-spec start(pid(), [pid()]) -> pid().
start(Agent, Skip) ->
    %% The start walk keeps every process's figures for the end walk: a
    %% heap that holds them from the first avoids the collections that
    %% would grow it step by step (measured at 10,000 processes: the two
    %% walks 5 to 10% faster).
    Words = min(?MAX_HEAP_WORDS, ?WORDS_PER_PROCESS * erlang:system_info(process_count)),
    spawn_opt(fun() -> init(Agent, Skip) end, [{priority, high}, {min_heap_size, Words}]).

%% @doc Asks for the report since the last walk (answered with
%% `{beamdiag_walk, Walker, {next, Report}}').
-spec next(pid()) -> ok.
next(Walker) ->
    Walker ! {beamdiag_walk_next, self()},
    ok.

%% @doc Asks for the end walk's report, answered to the caller with Ref;
%% the walker then exits.
-spec finish(pid(), reference()) -> ok.
finish(Walker, Ref) ->
    Walker ! {beamdiag_walk_finish, self(), Ref},
    ok.

%%%===================================================================
%%% Internal
%%%===================================================================

init(Agent, Skip) ->
    MRef = erlang:monitor(process, Agent),
    case attempt(fun() -> beamdiag_agent_processes:start(#{skip => [Agent | Skip]}) end) of
        {ok, S} ->
            Agent ! {beamdiag_walk, self(), {started, beamdiag_agent_processes:snapshot(S),
                                             beamdiag_agent_processes:watch(S)}},
            loop(Agent, MRef, S);
        {error, _} = E ->
            Agent ! {beamdiag_walk, self(), E}
    end.

loop(Agent, MRef, S) ->
    receive
        {beamdiag_walk_next, Agent} ->
            case attempt(fun() -> beamdiag_agent_processes:next(S) end) of
                {ok, {Report, S2}} ->
                    Agent ! {beamdiag_walk, self(), {next, Report}},
                    loop(Agent, MRef, S2);
                {error, _} = E ->
                    Agent ! {beamdiag_walk, self(), E}
            end;
        {beamdiag_walk_finish, From, Ref} ->
            From ! {Ref, attempt(fun() -> beamdiag_agent_processes:finish(S) end)};
        {'DOWN', MRef, process, Agent, _} ->
            ok
    end.

attempt(F) ->
    try
        {ok, F()}
    catch
        Class:Reason -> {error, beamdiag_agent:error_text(Class, Reason)}
    end.
