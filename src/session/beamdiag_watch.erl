%%% @doc A live view of a node: the agent streams ticks, and each tick the
%%% ledger and findings are computed over a sliding window of the last few
%%% samples.
%%%
%%% The session is data the caller drives: `start/2' connects, ships the
%%% agent and starts it with a long window; `next/2' waits for the next
%%% tick and returns the diagnosis of the sliding window; `stop/1' ends the
%%% agent, which puts back every flag it changed and unloads itself.
%%% Every 5 s the agent walks the process table once and the frame shows
%%% the process with the largest share of the reductions and the longest
%%% mailbox since the last walk (`procs => false' turns it off).
%%% `beamdiag_format_watch:frame/2' renders each as one screen. Printing
%%% is the CLI's job (`beamdiag_cli_watch'). The agent
%%% is spoken to through `beamdiag_client', as a collection window does.
%%%
%%% ```
%%% 1> {ok, S0} = beamdiag_watch:start("app@host", #{interval => 1000}).
%%% 2> {ok, S1, D} = beamdiag_watch:next(S0, 5000).
%%% 3> io:put_chars(beamdiag_format_watch:frame(D, #{colour => false, tick => 1})).
%%% 4> beamdiag_watch:stop(S1).
%%% '''
-module(beamdiag_watch).

-export([start/2, next/2, stop/1, format_error/1]).
%% Called as Module:format_error/1 on an {error, {Module, Reason}} value.
-ignore_xref([{format_error, 1}]).

-export_type([session/0, options/0, settled/0]).

-opaque session() :: #{
    node := node(),
    client := beamdiag_client:client(),
    loaded := [module()],
    info := map() | undefined,
    samples := [beamdiag_agent_tick:sample()],
    keep := pos_integer(),
    ticks := non_neg_integer(),
    interval := pos_integer(),
    procs => map()
}.

%% start/2's and options/1's options (see options/1).
-type options() :: #{
    interval => 100..60000,
    duration => number() | infinity,
    samples => 2..600,
    msacc => boolean(),
    procs => boolean(),
    cookie => atom() | binary() | string(),
    cookie_file => file:filename()
}.
%% The options with the defaults filled in (options/1).
-type settled() :: #{
    interval := 100..60000,
    duration := number() | infinity,
    samples := 2..600,
    msacc := boolean(),
    procs := boolean(),
    cookie => atom() | binary() | string(),
    cookie_file => file:filename()
}.

-define(DEFAULTS, #{interval => 1000, duration => infinity, samples => 2, msacc => false,
                   procs => true}).
%% How often the agent walks the process table for the view, in ms.
-define(PROCS_EVERY_MS, 5000).
-define(REMOTE_KEYS, [cookie, cookie_file]).
%% An agent needs a bounded window; "until stopped" is a day.
-define(LONG_MS, 86400000).
-define(CALL_TIMEOUT, 5000).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Validates options and fills in defaults: `interval' ms between
%% ticks (1000), `duration' seconds or `infinity' (infinity: a day),
%% `samples' per ledger (2: the last interval), `msacc' (false:
%% microstate accounting costs a little on every state change, so a
%% long-running view leaves it off unless asked), `cookie', `cookie_file'.
%% Unknown options raise `badarg'.
-spec options(options()) -> settled().
options(Opts) when is_map(Opts) ->
    O = beamdiag_opts:merge(Opts, ?DEFAULTS, ?REMOTE_KEYS),
    #{interval := I, duration := D, samples := W} = O,
    (is_integer(I) andalso I >= 100 andalso I =< 60000) orelse erlang:error({badarg, {interval, I}}),
    (D =:= infinity orelse (is_number(D) andalso D > 0)) orelse erlang:error({badarg, {duration, D}}),
    (is_integer(W) andalso W >= 2 andalso W =< 600) orelse erlang:error({badarg, {samples, W}}),
    O.

%% @doc Connects to the node (this node when given `node()'), loads the
%% agent there and starts it.
-spec start(node() | string() | binary(), options()) ->
    {ok, session()} | {error, {module(), term()}}.
start(Node, Opts) when Node =:= node() ->
    start_agent(Node, [], options(Opts));
start(Node, Opts) when is_atom(Node) ->
    start(atom_to_list(Node), Opts);
start(NodeStr, Opts) ->
    O = options(Opts),
    case beamdiag_remote:connect(NodeStr, maps:with(?REMOTE_KEYS, O)) of
        {ok, Node} ->
            case beamdiag_loader:load(Node, beamdiag_agent:modules()) of
                {ok, Loaded} -> start_agent(Node, Loaded, O);
                {error, _} = E -> E
            end;
        {error, _} = E ->
            E
    end.

%% @doc Waits up to Timeout ms for the next tick. Returns the diagnosis of
%% the sliding window once it holds two samples, `{wait, Session}' before
%% that or when nothing came in time, `{done, Session}' when the agent's
%% window ended, or an error when the target went away.
-spec next(session(), timeout()) ->
    {ok, session(), beamdiag_diagnosis:diagnosis()} | {wait, session()} | {done, session()}
    | {error, {beamdiag_watch, term()}}.
next(S, Timeout) ->
    next(S, Timeout, case Timeout of
                         infinity -> infinity;
                         _ -> erlang:monotonic_time(millisecond) + Timeout
                     end).

%% @doc Ends the agent; it restores the flags it changed and unloads its
%% modules from the target.
-spec stop(session()) -> ok.
stop(#{client := Client}) ->
    beamdiag_client:stop(Client, ?CALL_TIMEOUT).

%% @doc Turns an error reason of this module into a sentence.
-spec format_error(term()) -> iolist().
format_error({target_down, Why}) ->
    io_lib:format("the target went away (~ts)", [beamdiag_client:ended({down, Why})]);
format_error({aborted, Why}) ->
    io_lib:format("the agent stopped (~ts)", [beamdiag_client:ended({aborted, Why})]);
format_error({agent_start, _, _} = Why) ->
    beamdiag_client:format_error(Why).

%%%===================================================================
%%% Internal: session
%%%===================================================================

next(S = #{client := Client}, Timeout, Until) ->
    case beamdiag_client:next(Client, Timeout) of
        {event, {start, Info}} ->
            next(S#{info => Info}, beamdiag_agent_deadline:left(Until), Until);
        {event, {procs, Report}} ->
            next(S#{procs => Report}, beamdiag_agent_deadline:left(Until), Until);
        {event, {tick, Sample}} ->
            S2 = push(Sample, S),
            case diagnosis(S2) of
                undefined -> {wait, S2};
                D -> {ok, S2, D}
            end;
        {event, {done, _}} ->
            beamdiag_client:close(Client),
            {done, S};
        {event, {aborted, Why}} ->
            beamdiag_client:close(Client),
            {error, {beamdiag_watch, {aborted, Why}}};
        {event, _} ->
            %% Words a view does not show (finishing, the deadline's moves).
            next(S, beamdiag_agent_deadline:left(Until), Until);
        {down, Why} ->
            {error, {beamdiag_watch, {target_down, Why}}};
        timeout ->
            {wait, S}
    end.


start_agent(Node, Loaded, Opts = #{interval := I, duration := D, samples := W, msacc := M}) ->
    Duration = case D of
                   infinity -> ?LONG_MS;
                   _ -> max(I, round(D * 1000))
               end,
    %% A watch window lasts until it is stopped: the agent walks the
    %% process table every few seconds instead (one walk each) and reports
    %% the processes since the last walk.
    AgentOpts = #{duration_ms => Duration, interval_ms => I, msacc => M,
                  procs => maps:get(procs, Opts), procs_every => max(1, ?PROCS_EVERY_MS div I),
                  unload => Loaded},
    case beamdiag_client:start(Node, AgentOpts) of
        {ok, Client} ->
            {ok, #{node => Node, client => Client, loaded => Loaded,
                   info => undefined, samples => [], keep => W, ticks => 0,
                   interval => I}};
        {error, {beamdiag_client, Why}} ->
            beamdiag_loader:unload(Node, Loaded),
            {error, {beamdiag_watch, Why}}
    end.

%% The newest sample first, at most Window kept.
push(Sample, S = #{samples := Samples, keep := W, ticks := T}) ->
    S#{samples => lists:sublist([Sample | Samples], W), ticks => T + 1}.

diagnosis(S = #{info := Info, samples := Samples, interval := I}) when is_map(Info),
                                                                      length(Samples) >= 2 ->
    Extras = case S of
                 #{procs := P} -> #{procs => P};
                 _ -> #{}
             end,
    beamdiag_diagnosis:analyse(beamdiag_capture:new(Info, lists:reverse(Samples),
                                          #{interval_ms => I, extras => Extras}));
diagnosis(_) ->
    undefined.
