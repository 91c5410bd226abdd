%%% @doc Reaching a target node: hidden distribution and cookies.
%%%
%%% The local node starts as a hidden node that does not listen
%%% (`dist_listen => false'), so it needs no epmd of its own and is not
%%% listed in the target's `nodes()'. `load/2' and `unload/2' put the
%%% agent's modules on the target through `beamdiag_loader', which picks
%%% how from the target's OTP release.
%%%
%%% ```
%%% 1> {ok, Node} = beamdiag_remote:connect("app@host", #{cookie_file => "/home/me/.erlang.cookie"}).
%%% 2> {ok, Loaded} = beamdiag_remote:load(Node, beamdiag_agent:modules()).
%%% '''
-module(beamdiag_remote).

-export([connect/2, load/2, disconnect/1, parse_node/1, format_error/1]).
-export([distribute/1]).
%% Called by bench/overhead.escript.
-ignore_xref([{load, 2}]).
%% Called by the tests only.
-ifdef(TEST).
-export([unload/2]).
-endif.

%% How long the connection may take. A node whose schedulers are all busy,
%% on a host that is itself overloaded, can take seconds to answer the
%% handshake; a wrong cookie or a missing node answers at once.
-define(CONNECT_TIMEOUT, 10000).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Connects to a node given as "name@host" (short or long names,
%% inferred from the host part). Cookie, in order of preference: `cookie',
%% `cookie_file', the environment variable BEAMDIAG_COOKIE, ~/.erlang.cookie.
-spec connect(string() | binary(), map()) -> {ok, node()} | {error, {beamdiag_remote, term()}}.
connect(NodeStr, Opts) ->
    case parse_node(NodeStr) of
        {ok, Node, Domain} ->
            case ensure_distributed(Domain) of
                ok ->
                    case cookie(Opts) of
                        {ok, Cookie} ->
                            true = erlang:set_cookie(Node, Cookie),
                            connect_twice(Node, maps:get(timeout, Opts, ?CONNECT_TIMEOUT));
                        {error, _} = E ->
                            E
                    end;
                {error, _} = E ->
                    E
            end;
        {error, _} = E ->
            E
    end.

%% @doc Loads modules onto the node; returns those it loaded (and so must
%% unload). See `beamdiag_loader:load/2'.
-spec load(node(), [module()]) -> {ok, [module()]} | {error, {beamdiag_loader, term()}}.
load(Node, Mods) ->
    beamdiag_loader:load(Node, Mods).

-ifdef(TEST).
%% @doc Removes modules this session loaded onto the node.
-spec unload(node(), [module()]) -> ok.
unload(Node, Mods) ->
    beamdiag_loader:unload(Node, Mods).
-endif.

%% @doc Drops the connection to the node.
-spec disconnect(node()) -> ok.
disconnect(Node) when Node =:= node() ->
    ok;
disconnect(Node) ->
    _ = erlang:disconnect_node(Node),
    ok.

%% @doc Parses "name@host" and infers the name domain: a host with a dot
%% (or an IP address) means long names.
-spec parse_node(string() | binary()) ->
    {ok, node(), shortnames | longnames} | {error, {beamdiag_remote, term()}}.
parse_node(Bin) when is_binary(Bin) ->
    parse_node(unicode:characters_to_list(Bin));
parse_node(Str) when is_list(Str) ->
    case string:split(Str, "@") of
        [Name, Host] when Name =/= "", Host =/= "", length(Str) =< 255 ->
            case valid_part(Name) andalso valid_part(Host) of
                true ->
                    Domain =
                        case lists:member($., Host) orelse lists:member($:, Host) of
                            true -> longnames;
                            false -> shortnames
                        end,
                    %% One atom for the node the user named; the dist layer
                    %% needs it.
                    {ok, list_to_atom(Str), Domain};
                false ->
                    {error, {beamdiag_remote, {bad_node, Str}}}
            end;
        _ ->
            {error, {beamdiag_remote, {bad_node, Str}}}
    end.

%% @doc Turns an error reason of this module into a sentence.
-spec format_error(term()) -> iolist().
format_error({bad_node, S}) ->
    ["'", beamdiag_safe_text:safe(S, 100), "' is not a node name: expected name@host"];
format_error({no_distribution, Reason}) ->
    io_lib:format("cannot start distribution on this machine: ~0P", [Reason, 8]);
format_error({cookie_file, F, Reason}) ->
    io_lib:format("cannot read the cookie file ~ts: ~ts", [F, file:format_error(Reason)]);
format_error({bad_cookie, not_utf8}) ->
    "the cookie is not valid UTF-8";
format_error({bad_cookie, {length, N}}) ->
    io_lib:format("the cookie has ~b characters; a cookie has 1 to 255", [N]);
format_error(no_cookie) ->
    "no cookie: give --cookie-file FILE, set BEAMDIAG_COOKIE, or create ~/.erlang.cookie";
format_error({unreachable, Node, not_registered, Names}) ->
    io_lib:format("cannot reach ~s: no node of that name is registered on its host "
                  "(registered there: ~ts)", [Node, names(Names)]);
format_error({unreachable, Node, no_epmd}) ->
    io_lib:format("cannot reach ~s: no epmd answers on its host (is the node running?)", [Node]);
format_error({unreachable, Node, refused}) ->
    io_lib:format("cannot reach ~s: the node is running but refused the connection "
                  "(wrong cookie?)", [Node]);
format_error({unreachable, Node, refused_twice}) ->
    io_lib:format("cannot reach ~s: the node is running but refused the connection twice "
                  "(wrong cookie?)", [Node]);
format_error({unreachable, Node, {no_answer, Ms}}) ->
    io_lib:format("cannot reach ~s: the node is registered but did not finish the connection "
                  "within ~b s (overloaded, or its distribution port filtered?)",
                  [Node, Ms div 1000]).

%% @doc Starts this node's distribution (hidden, not listening), as
%% `connect/2' does before its first connection, in the name domain
%% NodeStr's name needs; connects to nothing. For callers that then
%% connect to many nodes side by side.
-spec distribute(string()) -> ok | {error, {beamdiag_remote, term()}}.
distribute(NodeStr) ->
    case parse_node(NodeStr) of
        {ok, _Node, Domain} -> ensure_distributed(Domain);
        {error, _} = E -> E
    end.

%%%===================================================================
%%% Internal
%%%===================================================================

valid_part(S) ->
    lists:all(
        fun(C) ->
            (C >= $a andalso C =< $z) orelse (C >= $A andalso C =< $Z) orelse
                (C >= $0 andalso C =< $9) orelse lists:member(C, "_-.:")
        end,
        S
    ).

ensure_distributed(Domain) ->
    case node() of
        nonode@nohost ->
            Base = "beamdiag_" ++ os:getpid() ++ "_" ++
                integer_to_list(erlang:unique_integer([positive])),
            %% Long names need a host part with a dot; on a host without a
            %% domain name the loopback address serves (this node does not
            %% listen, so nobody connects to it by its name).
            Name = case Domain =:= longnames andalso not lists:member($., net_adm:localhost()) of
                       true -> list_to_atom(Base ++ "@127.0.0.1");
                       false -> list_to_atom(Base)
                   end,
            Opts = #{name_domain => Domain, hidden => true, dist_listen => false},
            case net_kernel:start(Name, Opts) of
                {ok, _} -> ok;
                {error, {already_started, _}} -> ok;
                {error, Reason} -> {error, {beamdiag_remote, {no_distribution, Reason}}}
            end;
        _ ->
            ok
    end.

cookie(Opts) ->
    case {maps:get(cookie, Opts, undefined), maps:get(cookie_file, Opts, undefined)} of
        {C, _} when C =/= undefined -> to_cookie(C);
        {undefined, F} when F =/= undefined -> read_cookie(F);
        {undefined, undefined} ->
            case os:getenv("BEAMDIAG_COOKIE") of
                false ->
                    case init:get_argument(home) of
                        {ok, [[Home]]} ->
                            case read_cookie(filename:join(Home, ".erlang.cookie")) of
                                {ok, _} = Ok -> Ok;
                                {error, _} -> {error, {beamdiag_remote, no_cookie}}
                            end;
                        _ ->
                            {error, {beamdiag_remote, no_cookie}}
                    end;
                Env ->
                    to_cookie(Env)
            end
    end.

read_cookie(File) ->
    case file:read_file(File) of
        {ok, Bin} when byte_size(Bin) > 0, byte_size(Bin) =< 1024 ->
            case unicode:characters_to_list(Bin) of
                L when is_list(L) -> to_cookie(string:trim(L));
                _ -> {error, {beamdiag_remote, {bad_cookie, not_utf8}}}
            end;
        {ok, _} ->
            {error, {beamdiag_remote, {cookie_file, File, einval}}};
        {error, Reason} ->
            {error, {beamdiag_remote, {cookie_file, File, Reason}}}
    end.

%% Cookies are atoms by the distribution's own API, so they hold 1 to 255
%% characters.
to_cookie(C) when is_atom(C) ->
    {ok, C};
to_cookie(C) when is_binary(C) ->
    case unicode:characters_to_list(C) of
        L when is_list(L) -> to_cookie(L);
        _ -> {error, {beamdiag_remote, {bad_cookie, not_utf8}}}
    end;
to_cookie(C) when is_list(C), C =/= [], length(C) =< 255 ->
    {ok, list_to_atom(C)};
to_cookie(C) when is_list(C) ->
    {error, {beamdiag_remote, {bad_cookie, {length, length(C)}}}}.

%% A handshake refused at once is tried once more (a node that is starting
%% or briefly overloaded can drop one; a wrong cookie fails again at once,
%% for a few milliseconds more); one that timed out has used the time.
connect_twice(Node, Timeout) ->
    T0 = erlang:monotonic_time(millisecond),
    case try_connect(Node, Timeout) of
        {error, {beamdiag_remote, {unreachable, Node, refused}}} ->
            Left = Timeout - (erlang:monotonic_time(millisecond) - T0),
            case Left > 0 andalso try_connect(Node, Left) of
                {error, {beamdiag_remote, {unreachable, Node, refused}}} ->
                    {error, {beamdiag_remote, {unreachable, Node, refused_twice}}};
                false ->
                    {error, {beamdiag_remote, {unreachable, Node, refused}}};
                Other ->
                    Other
            end;
        Other ->
            Other
    end.

try_connect(Node, Timeout) ->
    Self = self(),
    Tag = make_ref(),
    T0 = erlang:monotonic_time(millisecond),
    {Pid, MRef} = spawn_monitor(fun() -> Self ! {Tag, net_kernel:connect_node(Node)} end),
    receive
        {Tag, true} ->
            erlang:demonitor(MRef, [flush]),
            {ok, Node};
        {Tag, _} ->
            erlang:demonitor(MRef, [flush]),
            Took = erlang:monotonic_time(millisecond) - T0,
            {error, {beamdiag_remote, diagnose_unreachable(Node, refused_or_silent(Took))}}
    after Timeout ->
        exit(Pid, kill),
        erlang:demonitor(MRef, [flush]),
        {error, {beamdiag_remote, diagnose_unreachable(Node, {no_answer, Timeout})}}
    end.

%% A refused handshake (a wrong cookie) fails at once; one the node never
%% finished fails when the kernel's own set-up time (net_setuptime, 7 s by
%% default) runs out, before our timeout.
refused_or_silent(Took) ->
    SetupMs = 1000 * case application:get_env(kernel, net_setuptime) of
                         {ok, S} when is_integer(S), S > 0 -> S;
                         _ -> 7
                     end,
    case Took >= SetupMs * 9 div 10 of
        true -> {no_answer, Took};
        false -> refused
    end.

%% Why a connection failed: the name is not registered on its host, no
%% epmd answers there, or (registered) the node refused the handshake or
%% did not finish it in time.
diagnose_unreachable(Node, Registered) ->
    [Name, Host] = string:split(atom_to_list(Node), "@"),
    case net_adm:names(Host) of
        {ok, Names} ->
            case lists:keymember(Name, 1, Names) of
                true -> {unreachable, Node, Registered};
                false -> {unreachable, Node, not_registered, [N || {N, _} <- Names]}
            end;
        {error, _} ->
            {unreachable, Node, no_epmd}
    end.

names(Names) ->
    case Names of
        [] -> "none";
        _ -> lists:join(", ", [beamdiag_safe_text:safe(N, 100) || N <- lists:sublist(Names, 10)])
    end.

