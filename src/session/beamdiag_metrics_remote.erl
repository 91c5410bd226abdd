%%% @doc The metrics endpoint on a node with nothing installed: for as long
%%% as the session lasts, the target serves the Prometheus text of
%%% `beamdiag_metrics' on its own port, and nothing of beamdiag stays there
%%% afterwards.
%%%
%%% Only target-side code goes to the target: the agent samples it each
%%% interval and streams the samples here, where the ledger and the text
%%% are made; the text goes back to `beamdiag_agent_http', a bounded
%%% HTTP/1.1 responder on the target (erts, kernel and stdlib only, so a
%%% release without inets serves it too). Both end with this session,
%%% however it ends (its end, the caller's death, a dropped connection),
%%% and remove the modules loaded for it.
%%%
%%% ```
%%% 1> beamdiag_metrics_remote:run("app@db1", #{port => 9568, duration => 60}).
%%% {ok, #{port => 9568, samples => 61}}
%%% '''
-module(beamdiag_metrics_remote).

-export([run/2, format_error/1]).
%% Called as Module:format_error/1 on an {error, {Module, Reason}} value.
-ignore_xref([{format_error, 1}]).

-export_type([options/0, settled/0]).

%% run/2's options (see there).
-type options() :: #{
    port => inet:port_number(),
    ip => loopback | any | inet:ip_address(),
    path => string(),
    interval => 100..60000,
    duration => number(),
    started => fun((inet:port_number()) -> term()) | undefined,
    cookie => atom() | binary() | string(),
    cookie_file => file:filename()
}.
%% The options with the defaults filled in (options/1).
-type settled() :: #{
    port := inet:port_number(),
    ip := loopback | any | inet:ip_address(),
    path := string(),
    interval := 100..60000,
    duration := number(),
    started := fun((inet:port_number()) -> term()) | undefined,
    cookie => atom() | binary() | string(),
    cookie_file => file:filename()
}.

-define(DEFAULTS, #{port => 9568, ip => loopback, path => "/metrics", interval => 1000,
                    duration => 3600, started => undefined}).
-define(REMOTE_KEYS, [cookie, cookie_file]).
-define(CALL_TIMEOUT, 5000).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Serves the metrics of a node from that node for `duration' seconds
%% (3600), then removes everything. Options: `port' (9568; 0 for any free
%% port), `ip' (`loopback', `any' or an address tuple), `path'
%% ("/metrics"), `interval' ms (1000), `cookie' or `cookie_file', and
%% `started', a fun called with the port once the endpoint listens.
-spec run(node() | string() | binary(), options()) ->
    {ok, #{port := inet:port_number(), samples := non_neg_integer()}} |
    {error, {module(), term()}}.
run(Node, Opts) when is_atom(Node) ->
    run(atom_to_list(Node), Opts);
run(NodeStr, Opts0) ->
    Opts = options(Opts0),
    case beamdiag_remote:connect(NodeStr, maps:with(?REMOTE_KEYS, Opts)) of
        {ok, Node} ->
            Agent = beamdiag_agent:modules(),
            case beamdiag_loader:load(Node, [beamdiag_agent_http | Agent]) of
                {ok, Loaded} ->
                    serve(Node, Opts, Loaded -- [beamdiag_agent_http],
                          lists:member(beamdiag_agent_http, Loaded));
                {error, _} = E ->
                    E
            end;
        {error, _} = E ->
            E
    end.

%% @doc Validates options and fills in defaults; raises `badarg'.
%% (Anything else than a map raises `badarg' too.)
-spec options(options()) -> settled().
options(Opts) when is_map(Opts) ->
    O = beamdiag_opts:merge(Opts, ?DEFAULTS, ?REMOTE_KEYS),
    #{port := P, ip := Ip, path := Path, interval := I, duration := D} = O,
    (is_integer(P) andalso P >= 0 andalso P < 65536) orelse erlang:error({badarg, {port, P}}),
    (Ip =:= loopback orelse Ip =:= any orelse is_tuple(Ip)) orelse erlang:error({badarg, {ip, Ip}}),
    (is_list(Path) andalso Path =/= [] andalso hd(Path) =:= $/) orelse
        erlang:error({badarg, {path, Path}}),
    (is_integer(I) andalso I >= 100 andalso I =< 60000) orelse erlang:error({badarg, {interval, I}}),
    (is_number(D) andalso D > 0 andalso D =< 86400) orelse erlang:error({badarg, {duration, D}}),
    O;
options(Other) ->
    erlang:error({badarg, Other}).

%% @doc Turns an error reason of this module into a sentence.
-spec format_error(term()) -> iolist().
format_error({responder, Node, Reason}) ->
    io_lib:format("cannot start the metrics responder on ~s: ~0p", [Node, Reason]).

%%%===================================================================
%%% Internal
%%%===================================================================

serve(Node, Opts = #{port := Port, ip := Ip, path := Path, interval := I, duration := D},
      AgentLoaded, HttpLoaded) ->
    HttpOpts = #{owner => self(), port => Port, ip => Ip, path => Path, unload => HttpLoaded},
    case responder(Node, HttpOpts) of
        {ok, Http} ->
            try
                {ok, Bound} = erpc:call(Node, beamdiag_agent_http, port, [Http], ?CALL_TIMEOUT),
                ok = beamdiag_agent_http:set(Http, beamdiag_metrics:warming_up()),
                Renderer = spawn_link(fun() -> render(Http, undefined, undefined) end),
                Collect = fun() -> beamdiag_collect:run(Node, #{
                    duration_ms => max(1, round(D * 1000)), interval_ms => I, msacc => false,
                    unload => AgentLoaded,
                    on_sample => fun(S) -> Renderer ! {sample, S}, ok end
                }) end,
                Result = case maps:get(started, Opts) of
                             undefined -> Collect();
                             Started -> started(Started, Bound, Collect, Node, AgentLoaded)
                         end,
                unlink(Renderer),
                exit(Renderer, kill),
                case Result of
                    {ok, #{samples := Samples}} ->
                        {ok, #{port => Bound, samples => length(Samples)}};
                    {error, _} = E ->
                        E
                end
            after
                %% Stops the responder, which removes its own module.
                catch erpc:call(Node, beamdiag_agent_http, stop, [Http], ?CALL_TIMEOUT)
            end;
        {error, _} = E ->
            beamdiag_loader:unload(Node, [beamdiag_agent_http || HttpLoaded] ++ AgentLoaded),
            E
    end.

%% The caller's fun runs before the agent starts; should it fail, the agent's
%% modules are removed here, as the agent would have done.
started(Started, Bound, Collect, Node, AgentLoaded) ->
    try Started(Bound) of
        _ -> Collect()
    catch
        Class:Reason:St ->
            beamdiag_loader:unload(Node, AgentLoaded),
            erlang:raise(Class, Reason, St)
    end.

responder(Node, HttpOpts) ->
    try erpc:call(Node, beamdiag_agent_http, start, [HttpOpts], ?CALL_TIMEOUT) of
        {ok, Pid} -> {ok, Pid};
        {error, _} = E -> E
    catch
        Class:Reason -> {error, {?MODULE, {responder, Node, {Class, Reason}}}}
    end.

%% Keeps the last sample and the target's settings; each new sample makes
%% the text over the last interval, sent to the responder.
render(Http, Last, Settings) ->
    receive
        {sample, S} ->
            case Last of
                undefined ->
                    render(Http, S, settings(Http));
                _ ->
                    ok = beamdiag_agent_http:set(Http, beamdiag_metrics:exposition(Last, S, Settings)),
                    render(Http, S, Settings)
            end
    end.

settings(Http) ->
    case catch erpc:call(node(Http), beamdiag_agent_vm, settings, [], ?CALL_TIMEOUT) of
        M when is_map(M) -> M;
        _ -> #{}
    end.
