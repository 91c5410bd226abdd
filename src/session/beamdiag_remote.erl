%%% @doc Reaching a target node: hidden distribution and cookies.
%%%
%%% The local node starts as a hidden node that does not listen
%%% (`dist_listen => false'), so it needs no epmd of its own and is not
%%% listed in the target's `nodes()'. `load/2' and `unload/2' put the
%%% agent's modules on the target through `beamdiag_loader', which picks
%%% how from the target's OTP release.
%%%
%%% `attach/2' follows a plan (`beamdiag_attach_plan': the node's own name,
%%% cookies, protocol and port, read from its host): each cookie is tried
%%% in turn, a node that no epmd knows is reached at its port
%%% (`beamdiag_epmd'), and a connection that fails is said as what it is,
%%% from the first step of a handshake made by hand
%%% (`beamdiag_dist_probe'): the port is closed, the TLS handshake was
%%% refused (an alert, a certificate, a key that cannot be read), the node
%%% speaks another protocol, the name is not allowed, or the cookie is
%%% not the node's.
%%%
%%% ```
%%% 1> {ok, Node} = beamdiag_remote:connect("app@host", #{cookie_file => "/home/me/.erlang.cookie"}).
%%% 2> {ok, Loaded} = beamdiag_remote:load(Node, beamdiag_agent:modules()).
%%% '''
-module(beamdiag_remote).

-export([connect/2, attach/2, load/2, disconnect/1, unreachable/1, format_error/1]).
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
%% The options a plan is made from (beamdiag_attach_plan:plan/2).
-export_type([options/0]).

%% connect/2's and attach/2's options: those a plan is made from
%% (beamdiag_attach_plan:options()), or the plan itself, and the bound on the
%% whole attempt (ms). Open: callers pass their own options, whose other
%% keys are not read.
-type options() :: #{
    plan => beamdiag_attach_plan:plan(),
    timeout => timeout(),
    cookie => atom() | binary() | string(),
    cookie_file => file:filename(),
    proto_dist => atom() | string(),
    ssl_dist_optfile => file:filename(),
    dist_port => inet:port_number(),
    proc_root => file:filename(),
    located => {ok, beamdiag_host_locate:located()} | {error, term()},
    host => boolean(),
    atom() => term()
}.

-define(PLAN_KEYS, [cookie, cookie_file, proto_dist, ssl_dist_optfile, dist_port, proc_root,
                    located, host]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Connects to a node given as "name@host" (short or long names,
%% inferred from the host part; for a node on this host, read from its
%% command line). Cookie, in order of preference: `cookie', `cookie_file',
%% the environment variable BEAMDIAG_COOKIE, the node's own (see
%% `beamdiag_attach_plan'), ~/.erlang.cookie. Also takes the other options of
%% `attach/2'.
%% With a cookie given and nothing else to say how, the node is first
%% tried the plain way, without reading its host (many nodes at once, as
%% `beamdiag cluster' connects them, cost a walk of /proc each otherwise);
%% a node of this host that refuses is then tried by its own settings.
-spec connect(string() | binary(), options()) -> {ok, node()} | {error, {module(), term()}}.
connect(NodeStr, Opts) when is_binary(NodeStr) ->
    connect(unicode:characters_to_list(NodeStr), Opts);
connect(NodeStr, Opts) ->
    Quick = not maps:is_key(plan, Opts) andalso
        (maps:is_key(cookie, Opts) orelse maps:is_key(cookie_file, Opts) orelse
         os:getenv("BEAMDIAG_COOKIE") =/= false) andalso
        not lists:any(fun(K) -> maps:is_key(K, Opts) end,
                      [proto_dist, ssl_dist_optfile, dist_port]),
    First = case Quick of
                true -> attach(NodeStr, Opts#{host => false});
                false -> attach(NodeStr, Opts)
            end,
    case First of
        {ok, Node, _Outcome} ->
            {ok, Node};
        {error, {?MODULE, Why}} = E when Quick ->
            case full_retry(Why) of
                true ->
                    case attach(NodeStr, Opts) of
                        {ok, Node, _} -> {ok, Node};
                        {error, _} = E2 -> E2
                    end;
                false ->
                    E
            end;
        {error, _} = E ->
            E
    end.

%% A node not reached the plain way is tried by its own settings, unless
%% the cookie given was what it refused.
full_retry({unreachable, _, {wrong_cookie, _}}) -> false;
full_retry({unreachable, _, _}) -> true;
full_retry({unreachable, _, _, _}) -> true;
full_retry(_) -> false.

%% @doc Connects to a node by a plan (`plan', else made here from the
%% options `beamdiag_attach_plan:plan/2' takes): `{ok, Node, #{cookie =>
%% Index}}', the plan's cookie that worked, or why it cannot be reached.
%% `timeout' (10 s) bounds the whole attempt.
-spec attach(string() | binary(), options()) ->
    {ok, node(), #{cookie := pos_integer(), plan := beamdiag_attach_plan:plan()}} |
    {error, {module(), term()}}.
attach(NodeStr, Opts) when is_binary(NodeStr) ->
    attach(unicode:characters_to_list(NodeStr), Opts);
attach(NodeStr, Opts) ->
    Plan = case maps:find(plan, Opts) of
               {ok, P} -> {ok, P};
               error -> beamdiag_attach_plan:plan(NodeStr, maps:with(?PLAN_KEYS, Opts))
           end,
    case Plan of
        {ok, Pl} -> follow(Pl, maps:get(timeout, Opts, ?CONNECT_TIMEOUT));
        {error, _} = E -> E
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

%% @doc Whether an error is one of a node that may run but cannot be
%% reached over distribution (the one place that says so: the diagnosis
%% falls back to the host's view on it, the command line exits 3).
-spec unreachable({module(), term()}) -> boolean().
unreachable({?MODULE, {unreachable, _, _}}) -> true;
unreachable({?MODULE, {unreachable, _, _, _}}) -> true;
unreachable({?MODULE, {own_dist, _, _}}) -> true;
unreachable({?MODULE, {own_mode, _, _}}) -> true;
unreachable(_) -> false.

%% @doc Turns an error reason of this module into a sentence.
-spec format_error(term()) -> iolist().
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
format_error({unreachable, Node, {wrong_cookie, Tried}}) ->
    io_lib:format("cannot reach ~s: wrong cookie: the node answered the handshake's first step "
                  "and refused the cookie (tried: ~ts); give the node's cookie with "
                  "--cookie-file FILE", [Node, tried(Tried)]);
format_error({unreachable, Node, {port_closed, Ip, Port}}) ->
    io_lib:format("cannot reach ~s: its distribution port ~b on ~ts is closed (connection "
                  "refused)", [Node, Port, inet:ntoa(Ip)]);
format_error({unreachable, Node, {tls, Why}}) ->
    io_lib:format("cannot reach ~s: TLS refused: ~ts", [Node, beamdiag_dist_probe:format_error({tls, Why})]);
format_error({unreachable, Node, {tls_options, {M, Why}}}) ->
    io_lib:format("cannot reach ~s over TLS: ~ts", [Node, M:format_error(Why)]);
format_error({unreachable, Node, {speaks_tls, Port}}) ->
    io_lib:format("cannot reach ~s: its port ~b speaks TLS distribution, and this connection "
                  "was plain TCP; give --proto-dist inet_tls --ssl-dist-optfile FILE", [Node, Port]);
format_error({unreachable, Node, {speaks_plain, Port}}) ->
    io_lib:format("cannot reach ~s: its port ~b speaks plain TCP distribution, not TLS; give "
                  "--proto-dist inet_tcp", [Node, Port]);
format_error({unreachable, Node, {not_distribution, Port}}) ->
    io_lib:format("cannot reach ~s: port ~b does not speak Erlang distribution", [Node, Port]);
format_error({unreachable, Node, {status, Status}}) ->
    io_lib:format("cannot reach ~s: the node refused this connection's name (status ~ts: "
                  "it allows only some nodes, or is already connecting to one of that name)",
                  [Node, beamdiag_safe_text:safe(Status, 40)]);
format_error({unreachable, Node, {unknown_name, Names}}) ->
    io_lib:format("cannot reach ~s: name unknown: no Erlang VM on this host was started with "
                  "that name, and epmd knows none of it (registered there: ~ts)",
                  [Node, names(Names)]);
format_error({unreachable, Node, {no_port, Names}}) ->
    io_lib:format("cannot reach ~s: it is registered in no epmd and no distribution port of it "
                  "was found (registered: ~ts); give --dist-port PORT", [Node, names(Names)]);
format_error({own_dist, Node, Missing}) ->
    io_lib:format("cannot reach ~s from this VM: its distribution would need ~ts; the beamdiag "
                  "escript starts itself so, a VM of your own must be started with those flags",
                  [Node, lists:join(" ", [[F, [[" ", V] || V <- Vs, V =/= ""],
                                           case {F, Vs} of
                                               {"-ssl_dist_optfile", []} -> " FILE";
                                               _ -> ""
                                           end] || {F, Vs} <- Missing])]);
format_error({own_mode, Node, Want}) ->
    io_lib:format("cannot reach ~s from this VM: it is distributed already with the other name "
                  "mode (~s wanted)", [Node, case Want of
                                                 longnames -> "long names";
                                                 shortnames -> "short names"
                                             end]);
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
    case beamdiag_node_name:parse(NodeStr) of
        {ok, _Node, Domain} -> ensure_distributed(Domain);
        {error, _} = E -> E
    end.

%%%===================================================================
%%% Internal
%%%===================================================================

%% Follows a plan: what it found wrong before connecting, this VM's own
%% distribution, then each cookie until one is taken.
follow(Plan = #{node := Node, mode := Mode}, Timeout) ->
    case pre_errors(Plan) of
        {error, _} = E -> E;
        ok ->
            case beamdiag_attach_relaunch:missing(Plan) of
                [] ->
                    case ensure_distributed(Mode) of
                        ok ->
                            case own_mode_ok(Mode) of
                                true ->
                                    Direct = direct(Plan),
                                    _ = case {Direct, Plan} of
                                            {true, #{port := #{ip := Ip, port := Port}}} ->
                                                beamdiag_epmd:set(Node, Ip, Port);
                                            _ -> ok
                                        end,
                                    T0 = erlang:monotonic_time(millisecond),
                                    unknown_name(Plan, try_cookies(Plan#{direct := Direct},
                                                                   maps:get(cookies, Plan), 1,
                                                                   T0 + Timeout, unknown));
                                false ->
                                    {error, {?MODULE, {own_mode, Node, Mode}}}
                            end;
                        {error, _} = E ->
                            E
                    end;
                Missing ->
                    {error, {?MODULE, {own_dist, Node, Missing}}}
            end
    end.

%% Whether the node is reached at the plan's port, without epmd: when no
%% epmd knows it, and, when no epmd answered, if this VM has beamdiag_epmd.
direct(#{direct := true}) -> true;
direct(#{direct := if_usable, port := _}) -> beamdiag_epmd:use();
direct(_) -> false.

%% A name epmd does not know, of a node this host does not run: said so.
unknown_name(#{local := true, located_error := {beamdiag_host_locate, {not_found, _}}},
             {error, {?MODULE, {unreachable, Node, not_registered, Names}}}) ->
    {error, {?MODULE, {unreachable, Node, {unknown_name, Names}}}};
unknown_name(_Plan, Result) ->
    Result.

pre_errors(#{cookie_error := {M, Why}}) when is_atom(M) ->
    {error, {M, Why}};
pre_errors(#{cookie_error := Why}) ->
    {error, {?MODULE, Why}};
pre_errors(#{node := Node, proto_error := Why}) ->
    {error, {?MODULE, {unreachable, Node, {tls_options, {beamdiag_attach_plan, Why}}}}};
pre_errors(#{node := Node, tls := #{error := Why}}) ->
    {error, {?MODULE, {unreachable, Node, {tls_options, {beamdiag_attach_plan, Why}}}}};
pre_errors(_) ->
    ok.

%% Whether this VM's distribution runs in the name mode wanted.
own_mode_ok(Mode) ->
    case catch net_kernel:longnames() of
        true -> Mode =:= longnames;
        false -> Mode =:= shortnames;
        _ -> true
    end.

%% Each cookie once; the first refusal is asked why (the probe): a closed
%% port, TLS, another protocol or a name refused end the attempt, and a
%% cookie refused moves to the next. A single cookie refused at once is
%% tried a second time (a node starting, or briefly overloaded, can drop
%% one handshake).
try_cookies(#{node := Node}, [], _I, _Deadline, _Why) ->
    {error, {?MODULE, {unreachable, Node, {wrong_cookie, []}}}};
try_cookies(Plan = #{node := Node, cookies := All}, [{Cookie, _} | Rest], I, Deadline, Why) ->
    Left = Deadline - erlang:monotonic_time(millisecond),
    true = erlang:set_cookie(Node, Cookie),
    Direct = maps:get(direct, Plan, false),
    Attempt = case Left > 0 of
                  true -> try_connect(Node, Left, Direct);
                  false -> {error, {?MODULE, {unreachable, Node, {no_answer, 0}}}}
              end,
    case Attempt of
        {ok, Node} ->
            {ok, Node, #{cookie => I, plan => Plan}};
        {error, {?MODULE, {unreachable, Node, refused}}} ->
            Cause = case Why of
                        unknown -> refusal(Plan);
                        _ -> Why
                    end,
            case Cause of
                cookie when Rest =:= [], length(All) =:= 1, I =:= 1 ->
                    %% One cookie: once more, then it is the cookie.
                    _ = erlang:disconnect_node(Node),
                    case try_connect(Node, max(1, Deadline - erlang:monotonic_time(millisecond)),
                                     Direct) of
                        {ok, Node} -> {ok, Node, #{cookie => I, plan => Plan}};
                        {error, {?MODULE, {unreachable, Node, refused}}} ->
                            {error, {?MODULE, {unreachable, Node, {wrong_cookie, origins(All)}}}};
                        Other -> Other
                    end;
                cookie when Rest =:= [] ->
                    {error, {?MODULE, {unreachable, Node, {wrong_cookie, origins(All)}}}};
                cookie ->
                    try_cookies(Plan, Rest, I + 1, Deadline, cookie);
                Other ->
                    {error, {?MODULE, {unreachable, Node, Other}}}
            end;
        Other ->
            Other
    end.

origins(Cookies) ->
    [{O, beamdiag_attach_plan:cookie_hash(C)} || {C, O} <- Cookies].

tried([]) -> "none";
tried(L) ->
    lists:join("; ", [[beamdiag_safe_text:safe(origin_words(O), 200), ", ", H] || {O, H} <- L]).

origin_words({cli, Opt}) -> ["beamdiag's ", Opt];
origin_words({cli_home, F}) -> ["your own cookie file ", F];
origin_words({env, <<"BEAMDIAG_COOKIE">>}) -> "BEAMDIAG_COOKIE";
origin_words({env, V}) -> ["the node's ", V];
origin_words({setcookie, _}) -> "the node's -setcookie";
origin_words({home_file, F}) -> ["the node's user's ", F];
origin_words({release_file, F}) -> ["the release's ", F];
origin_words(O) -> beamdiag_node_args:origin_text(O).

%% Why a handshake was refused at once, from a probe of the node's port:
%% `cookie' when the name step passes (what is left is the cookie), else
%% the reason in the shape format_error/1 reads.
refusal(Plan = #{node := Node, mode := Mode, proto := Proto}) ->
    case probe_target(Plan) of
        {ok, Ip, Port} ->
            Tls = case maps:get(tls, Plan, undefined) of
                      #{client := C} -> C;
                      _ -> none
                  end,
            IsTls = Proto =:= inet_tls orelse Proto =:= inet6_tls,
            Opts = #{mode => Mode, tls => case IsTls of true -> Tls; false -> none end,
                     server_name => beamdiag_node_name:host(Node)},
            case beamdiag_dist_probe:probe(Ip, Port, Opts) of
                {ok, S} when S =:= <<"ok">>; S =:= <<"ok_simultaneous">>; S =:= <<"alive">> ->
                    cookie;
                {ok, S} ->
                    {status, S};
                {error, {tcp, econnrefused}} ->
                    {port_closed, Ip, Port};
                {error, {tcp, timeout}} when IsTls ->
                    %% A plain port waits for more of what it read as a length.
                    case beamdiag_dist_probe:probe(Ip, Port, Opts#{tls => none}) of
                        {ok, _} -> {speaks_plain, Port};
                        _ -> {no_answer, 0}
                    end;
                {error, {tls, Why}} ->
                    {tls, Why};
                {error, not_distribution} when not IsTls ->
                    case beamdiag_dist_probe:probe(Ip, Port, Opts#{tls => [{verify, verify_none}]}) of
                        {ok, _} -> {speaks_tls, Port};
                        {error, {tls, W}} when W =/= closed -> {speaks_tls, Port};
                        _ -> {not_distribution, Port}
                    end;
                {error, not_distribution} ->
                    {not_distribution, Port};
                {error, _} ->
                    cookie
            end;
        {error, Reason} ->
            Reason
    end.

%% Where the node's distribution listens: the plan's port, else epmd's.
probe_target(#{port := #{ip := Ip, port := Port}}) ->
    {ok, Ip, Port};
probe_target(#{node := Node, proto := Proto}) ->
    {Name, Host} = beamdiag_node_name:split(Node),
    Family = case Proto of
                 inet6_tcp -> inet6;
                 inet6_tls -> inet6;
                 _ -> inet
             end,
    case {inet:getaddr(Host, Family), net_adm:names(Host)} of
        {{ok, Ip}, {ok, Names}} ->
            case lists:keyfind(Name, 1, Names) of
                {_, Port} -> {ok, Ip, Port};
                false -> {error, {no_port, [N || {N, _} <- Names]}}
            end;
        _ ->
            {error, refused}
    end.

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

try_connect(Node, Timeout, Direct) ->
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
            {error, {beamdiag_remote, diagnose_unreachable(Node, refused_or_silent(Took), Direct)}}
    after Timeout ->
        exit(Pid, kill),
        erlang:demonitor(MRef, [flush]),
        {error, {beamdiag_remote, diagnose_unreachable(Node, {no_answer, Timeout}, Direct)}}
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
diagnose_unreachable(Node, Seen, true) ->
    %% Reached at its port, without epmd: epmd's names say nothing.
    {unreachable, Node, Seen};
diagnose_unreachable(Node, Registered, false) ->
    {Name, Host} = beamdiag_node_name:split(Node),
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

