%%% @doc The operator's side of the agent's protocol (`beamdiag_agent'),
%%% written once for every session that talks to an agent: a collection
%%% window (`beamdiag_collect') and the live view (`beamdiag_watch').
%%%
%%% `start/2' starts the agent on a node (this one, or a connected one over
%%% erpc with a timeout and one retry) and monitors it; `next/2' hands over
%%% the agent's next word as an event, its end as `{down, Reason}', or
%%% `timeout'; `await/3' waits for one kind of word only; `abort/1' tells
%%% the agent to end at once without a last word, `stop/2' asks it to end
%%% its window and waits for its last word; `close/1' drops the monitor and
%%% whatever the agent still sent.
%%%
%%% The events are the agent's words as it sends them: `{start, Info}',
%%% `{tick, Sample}', `{deadline, InMs}', `{procs, Report}',
%%% `{procs_start, Snapshot}', `{queue_reads, T, Reads}', `{atom_sources, Report}',
%%% `{partial_extras, Quick}',
%%% `{long_schedules, LS}', `finishing', `{done, Extras}' and
%%% `{aborted, Why}'. A start that answered too late may still have started
%%% an agent: its first word names it, and it is told to end here, never
%%% reaching the caller.
%%%
%%% ```
%%% 1> {ok, C} = beamdiag_client:start(node(), #{duration_ms => 2000, interval_ms => 1000}).
%%% 2> beamdiag_client:next(C, 5000).
%%% {event, {start, #{node => <<"nonode@nohost">>, ...}}}
%%% 3> beamdiag_client:next(C, 5000).
%%% {event, {tick, #{t => ..., threads => ..., vm => ...}}}
%%% 4> beamdiag_client:stop(C, 5000).
%%% ok
%%% '''
-module(beamdiag_client).

-export([start/2, next/2, await/3, abort/1, stop/2, close/1, ended/1, format_error/1]).

-export_type([client/0, event/0]).

-opaque client() :: #{node := node(), agent := pid(), ref := reference(), mref := reference()}.
-type event() :: {start, map()} | {tick, beamdiag_agent_tick:sample()} | {deadline, integer()}
               | {procs, map()} | {procs_start, map()} | {queue_reads, integer(), map()}
               | {atom_sources, map()}
               | {partial_extras, map()}
               | {long_schedules, map()} | {locks, term()} | finishing | {done, map()}
               | {aborted, term()}.

%% The agent's start over distribution: its wait, and the retry's.
-define(START_WAITS, [2500, 2500]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Starts the agent on Node with the agent's options
%% (`beamdiag_agent:opts()') and the default waits: 2.5 s, then one retry
%% of 2.5 s.
-spec start(node(), beamdiag_agent:opts()) -> {ok, client()} | {error, {beamdiag_client, term()}}.
start(Node, Opts) ->
    start(Node, Opts, ?START_WAITS).

%% @doc Starts the agent on Node, waiting each of Waits (ms) in turn for
%% the start to answer over distribution (a start on this node answers at
%% once), and monitors it.
-spec start(node(), beamdiag_agent:opts(), [timeout(), ...]) ->
    {ok, client()} | {error, {beamdiag_client, term()}}.
start(Node, Opts, Waits) ->
    case call_start(Node, Opts, Waits, []) of
        {ok, Agent, Ref} ->
            {ok, #{node => Node, agent => Agent, ref => Ref,
                   mref => erlang:monitor(process, Agent)}};
        {error, Why} ->
            {error, {?MODULE, {agent_start, Node, Why}}}
    end.

%% @doc Waits up to Timeout ms for the agent's next word.
-spec next(client(), timeout()) -> {event, event()} | {down, term()} | timeout.
next(C, Timeout) ->
    next(C, Timeout, until(Timeout)).

%% @doc Waits up to Timeout ms for the agent's word `{Tag, Value}', leaving
%% its other words for `next/2'.
-spec await(client(), atom(), timeout()) -> {ok, term()} | timeout.
await(#{ref := Ref}, Tag, Timeout) ->
    receive
        {beamdiag, Ref, {Tag, Value}} -> {ok, Value}
    after Timeout ->
        timeout
    end.

%% @doc Tells the agent to end now: it puts back what it changed and sends
%% its quick extras (`{partial_extras, Quick}'), but no last word.
-spec abort(client()) -> ok.
abort(#{agent := Agent}) ->
    Agent ! {beamdiag_abort, self()},
    ok.

%% @doc Asks the agent to end its window (it takes a last tick, puts back
%% what it changed and unloads itself), waits up to Timeout ms for its
%% last word or its end, and closes the client.
-spec stop(client(), timeout()) -> ok.
stop(C = #{agent := Agent, ref := Ref, mref := MRef}, Timeout) ->
    beamdiag_agent:stop(Agent),
    receive
        {beamdiag, Ref, {done, _}} -> ok;
        {beamdiag, Ref, {aborted, _}} -> ok;
        {'DOWN', MRef, process, _, _} -> ok
    after Timeout ->
        ok
    end,
    close(C).

%% @doc Drops the monitor and the agent's words still in the mailbox; an
%% agent whose late start names itself there is told to end.
-spec close(client()) -> ok.
close(#{ref := Ref, mref := MRef}) ->
    erlang:demonitor(MRef, [flush]),
    flush(Ref).

%% @doc Turns an error reason of this module into a sentence.
-spec format_error(term()) -> iolist().
format_error({agent_start, Node, {timeout, Waits}}) ->
    io_lib:format("~s did not start the agent within ~ts (tried ~b times): it is overloaded or "
                  "a scheduler is held (a NIF that does not yield); run beamdiag on its host for "
                  "a host-side view",
                  [Node, lists:join(" and ", [io_lib:format("~.1f s", [W / 1000]) || W <- Waits]),
                   length(Waits)]);
format_error({agent_start, Node, {error, {erpc, noconnection}}}) ->
    io_lib:format("~s went away while the agent was starting (the connection dropped)", [Node]);
format_error({agent_start, Node, {error, {exception, undef, _}}}) ->
    io_lib:format("the agent's code is not loaded on ~s", [Node]);
format_error({agent_start, Node, Reason}) ->
    io_lib:format("cannot start the agent on ~s: ~0tP", [Node, Reason, 8]).

%% @doc The agent's end, as `next/2' (`{down, Reason}') or its last word
%% (`{aborted, Why}') tells it, in words.
-spec ended({down, term()} | {aborted, term()}) -> iolist().
ended({down, noconnection}) -> "the connection dropped";
ended({down, noproc}) -> "the agent was gone before it could be watched";
ended({down, killed}) -> "the agent was killed";
ended({down, R}) -> io_lib:format("~0tP", [R, 6]);
ended({aborted, deadline}) -> "it reached its deadline before its last tick";
ended({aborted, {caller_down, _}}) -> "its caller went away";
ended({aborted, shutdown}) -> "the node is shutting down";
ended({aborted, W}) -> io_lib:format("~0tP", [W, 6]).

%%%===================================================================
%%% Internal
%%%===================================================================

call_start(Node, Opts, _Waits, _Tried) when Node =:= node() ->
    beamdiag_agent:start(self(), Opts);
%% A start that answers too late may still start an agent, whose first word
%% then names it and is told to end (next/3, flush/1).
call_start(Node, Opts, [Wait | More], Tried) ->
    try beamdiag_rpc:call(Node, beamdiag_agent, start, [self(), Opts], Wait) of
        {ok, _, _} = Ok -> Ok
    catch
        error:{erpc, timeout} when More =/= [] ->
            call_start(Node, Opts, More, [Wait | Tried]);
        error:{erpc, timeout} ->
            {error, {timeout, lists:reverse([Wait | Tried])}};
        Class:Reason ->
            {error, {Class, Reason}}
    end.

next(C = #{ref := Ref, mref := MRef}, Timeout, Until) ->
    receive
        {beamdiag, Ref, Event} ->
            {event, Event};
        {beamdiag, Other, {start, #{agent := Stray}}} when Other =/= Ref ->
            %% An agent whose start answered after the retry: it ends now.
            Stray ! {beamdiag_abort, self()},
            next(C, beamdiag_agent_deadline:left(Until), Until);
        {'DOWN', MRef, process, _, Reason} ->
            {down, Reason}
    after Timeout ->
        timeout
    end.

until(infinity) -> infinity;
until(Ms) -> erlang:monotonic_time(millisecond) + Ms.


flush(Ref) ->
    receive
        {beamdiag, Ref, _} -> flush(Ref);
        {beamdiag, _, {start, #{agent := Stray}}} ->
            Stray ! {beamdiag_abort, self()},
            flush(Ref)
    after 0 -> ok
    end.
