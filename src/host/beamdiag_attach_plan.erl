%%% @doc How to reach a node, decided before connecting: its name and name
%%% mode, the cookies to try, its distribution protocol and TLS options,
%%% and its distribution port when no epmd knows it, each with where it
%%% came from.
%%%
%%% An explicit option always wins (`cookie', `cookie_file', the
%%% environment variable BEAMDIAG_COOKIE, `proto_dist',
%%% `ssl_dist_optfile', `dist_port'). For a node on this host the rest is
%%% read from the node's own settings (`beamdiag_node_settings'): the name
%%% it was started with, its `-setcookie', RELEASE_COOKIE, its release's
%%% `releases/COOKIE' and the cookie file in its user's home (tried in that
%%% order, then the cookie file of the user running beamdiag), its
%%% `-proto_dist' and the client part of its TLS options, and, for a node
%%% that registers nowhere, its port from `-erl_epmd_port', the kernel's
%%% `erl_epmd_node_listen_port', `inet_dist_listen_min' = `max', or the
%%% sockets it listens on, confirmed by the first step of a handshake
%%% (`beamdiag_dist_probe').
%%%
%%% A plan may need this VM's distribution to speak otherwise than it
%%% does (TLS, IPv6, its own epmd module on OTP 25): beamdiag_attach_relaunch
%%% says what it lacks and the flags to start again with. `public/1' is what a report may show:
%%% never a cookie, only where it came from and a short hash.
%%%
%%% ```
%%% 1> {ok, P} = beamdiag_attach_plan:plan("app@myhost", #{}).
%%% 2> maps:get(cookie_from, beamdiag_attach_plan:public(P, 1)).
%%% <<"the file /srv/app/releases/COOKIE">>
%%% '''
-module(beamdiag_attach_plan).

-export([plan/2, public/2, cookie_hash/1, format_error/1]).
-ignore_xref([{format_error, 1}]).

-export_type([plan/0, options/0, public/0]).

-type origin() :: beamdiag_node_args:origin() | {cli, string()} | {passwd, integer()} | epmd
                  | {listen, registered | not_registered | no_epmd | no_answer}
                  | {setting, atom(), beamdiag_node_args:origin()}.
-type plan() :: #{
    node := node(),
    given := string(),
    mode := shortnames | longnames,
    local := boolean(),
    located => beamdiag_host_locate:located(),
    located_error => {beamdiag_host_locate, term()},
    settings => beamdiag_node_settings:settings(),
    cookies := [{atom(), origin()}],
    cookie_error => {beamdiag_remote, term()},
    proto := atom(),
    proto_error => {unknown_proto, string()},
    proto_origin := origin(),
    tls => #{client := list(), from := origin(), optfile => binary()} | #{error := term()},
    port => #{port := inet:port_number(), ip := inet:ip_address(), origin := origin(),
              confirmed := boolean() | tls},
    %% Reached at `port', without epmd: true when no epmd knows the node
    %% (or --dist-port says so), if_usable when no epmd answered here (the usual
    %% way is tried unless this VM has beamdiag_epmd).
    direct := boolean() | if_usable,
    rows := [{binary(), binary(), binary()}],
    notes := [binary()]
}.
%% What public/2 shows of a plan: every setting as {setting, value, where
%% from} in words, the cookies tried (their origin and a short hash), the
%% one that worked, and the port when the plan has one.
-type public() :: #{
    node := binary(),
    mode := binary(),
    settings := [#{setting := binary(), value := binary(), from := binary()}],
    notes := [binary()],
    cookies_tried := [#{from := binary(), hash := binary()}],
    cookie => #{from := binary(), hash := binary()},
    port => #{port := inet:port_number(), address := binary(), from := binary(),
              confirmed := boolean(), epmd := boolean()}
}.
-type options() :: #{
    cookie => atom() | binary() | string(),
    cookie_file => file:filename(),
    proto_dist => atom() | string(),
    ssl_dist_optfile => file:filename(),
    dist_port => inet:port_number(),
    proc_root => file:filename(),
    located => {ok, beamdiag_host_locate:located()} | {error, term()},
    probe_timeout => pos_integer(),
    %% false: nothing read from this host (the node's settings unused).
    host => boolean()
}.

-define(PROTOS, [inet_tcp, inet6_tcp, inet_tls, inet6_tls]).
%% Ports of a node's own sockets probed at most, and each probe's bound.
-define(MAX_PROBES, 8).
-define(PROBE_MS, 1500).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc How to reach the node NodeStr names. For a node on this host its
%% OS process is located (or `located' given) and its settings read,
%% unless `host' is false.
-spec plan(string(), options()) -> {ok, plan()} | {error, {module(), term()}}.
plan(NodeStr, Opts) ->
    case beamdiag_node_name:parse(NodeStr) of
        {ok, Given, Domain} ->
            Local = beamdiag_host_locate:is_local_host(beamdiag_node_name:host(NodeStr)),
            P0 = #{node => Given, given => NodeStr, mode => Domain, local => Local,
                   cookies => [], proto => inet_tcp, proto_origin => default, direct => false,
                   rows => [], notes => []},
            P1 = case Local andalso maps:get(host, Opts, true) of
                     true -> with_settings(P0, Opts);
                     false -> P0
                 end,
            P2 = name(P1),
            P3 = proto(P2, Opts),
            P4 = tls(P3, Opts),
            P5 = cookies(P4, Opts),
            P6 = port(P5, Opts),
            {ok, rows(P6)};
        {error, _} = E ->
            E
    end.

%% @doc What a report may show of the plan, the cookie tried as the
%% Used'th (1-based; 0: none worked): every setting with its value and
%% origin in words, the cookie only as its origin and a short hash.
-spec public(plan(), non_neg_integer()) -> public().
public(Plan = #{node := Node, mode := Mode, rows := Rows, notes := Notes}, Used) ->
    Cookies = maps:get(cookies, Plan),
    Base = #{node => atom_to_binary(Node),
             mode => atom_to_binary(Mode),
             settings => [#{setting => S, value => V, from => F} || {S, V, F} <- Rows],
             notes => Notes ++ settings_notes(Plan),
             cookies_tried => [#{from => origin_text(O), hash => cookie_hash(C)}
                               || {C, O} <- case Used of
                                                0 -> Cookies;
                                                _ -> lists:sublist(Cookies, Used)
                                            end]},
    B1 = case Used > 0 andalso Used =< length(Cookies) of
             true ->
                 {C, O} = lists:nth(Used, Cookies),
                 Base#{cookie => #{from => origin_text(O), hash => cookie_hash(C)}};
             false ->
                 Base
         end,
    case maps:find(port, Plan) of
        {ok, #{port := Port, ip := Ip, origin := PO, confirmed := Conf}} ->
            B1#{port => #{port => Port, address => list_to_binary(inet:ntoa(Ip)),
                          from => port_from(PO), confirmed => Conf =/= false,
                          epmd => maps:get(direct, Plan) =:= false}};
        error ->
            B1
    end.

%% @doc A short hash of a cookie, to tell cookies apart in a report
%% without showing them: "sha256:" and 8 hex digits (md5 when crypto is
%% missing).
-spec cookie_hash(atom() | binary()) -> binary().
cookie_hash(C) when is_atom(C) ->
    cookie_hash(atom_to_binary(C));
cookie_hash(C) ->
    {Alg, Digest} = try {<<"sha256">>, crypto:hash(sha256, C)}
                    catch _:_ -> {<<"md5">>, erlang:md5(C)}
                    end,
    <<Head:4/binary, _/binary>> = Digest,
    <<Alg/binary, ":", (string:lowercase(binary:encode_hex(Head)))/binary>>.

%% @doc Turns an error reason of this module into a sentence.
-spec format_error(term()) -> iolist().
format_error({unreadable_optfile, File, Why}) ->
    io_lib:format("cannot read the node's TLS options file ~ts: ~ts (run as the node's user or "
                  "root, or give --ssl-dist-optfile FILE)", [File, reason(Why)]);
format_error({bad_optfile, File, Why}) ->
    io_lib:format("the TLS options file ~ts is not a list of {server, Opts} and {client, Opts} "
                  "(~0p)", [File, Why]);
format_error({unreadable_tls_file, Opt, File, Why}) ->
    [beamdiag_dist_probe:format_error({tls, {options, {Opt, File, {error, Why}}}}),
     " (run as the node's user or root, or give --ssl-dist-optfile FILE)"];
format_error(no_tls_options) ->
    "the node speaks TLS distribution but its TLS options are not known: give "
    "--ssl-dist-optfile FILE";
format_error({unknown_proto, P}) ->
    io_lib:format("the node's distribution protocol ~ts is not one beamdiag speaks "
                  "(inet_tcp, inet6_tcp, inet_tls, inet6_tls)", [beamdiag_safe_text:safe(P, 60)]).

%%%===================================================================
%%% Internal
%%%===================================================================

with_settings(P, Opts) ->
    NodeStr = maps:get(given, P),
    Root = maps:get(proc_root, Opts, "/proc"),
    Located = case maps:find(located, Opts) of
                  {ok, L} -> L;
                  error -> beamdiag_host_locate:locate(NodeStr, #{timeout => 1000, proc_root => Root})
              end,
    case Located of
        {ok, Loc} ->
            P#{located => Loc, settings => beamdiag_node_settings:read(Loc, #{proc_root => Root})};
        {error, Why} ->
            P#{located_error => Why}
    end.

%% The node's own name, when its settings give it: with its host part
%% when it has one, else this host's short name (short names) or the
%% host given (long names). A name given with another alias of this host
%% (localhost) names the same node; the handshake wants the node's own.
name(P = #{settings := #{args := #{name := #{value := V, mode := Mode}}}, given := Given}) ->
    {GName, GHost} = beamdiag_node_name:split(Given),
    Own = binary_to_list(V),
    Full = case beamdiag_node_name:split(Own) of
               {_N, _H} -> Own;
               error when Mode =:= shortnames -> Own ++ "@" ++ beamdiag_node_name:short_host();
               error -> Own ++ "@" ++ GHost
           end,
    case beamdiag_node_name:split(Full) of
        {GName, _} when Full =/= Given ->
            case beamdiag_node_name:parse(Full) of
                {ok, Node, _} ->
                    note(P#{node => Node, mode => Mode},
                         ["the node's own name is ", Full, "; ", Given, " names it too"]);
                {error, _} ->
                    P#{mode => Mode}
            end;
        _ ->
            P#{mode => Mode}
    end;
name(P) ->
    P.

proto(P, #{proto_dist := Given}) ->
    set_proto(P, to_list(Given), {cli, "--proto-dist"});
proto(P = #{settings := #{args := #{proto_dist := #{value := [Proto | _], origin := O}}}}, _) ->
    set_proto(P, binary_to_list(Proto), O);
proto(P, _) ->
    P.

set_proto(P, Name, Origin) ->
    case [A || A <- ?PROTOS, atom_to_list(A) =:= Name] of
        [A] -> P#{proto => A, proto_origin => Origin};
        [] -> P#{proto_origin => Origin, proto_error => {unknown_proto, Name}}
    end.

tls(P = #{proto := Proto}, Opts) ->
    case is_tls(Proto) of
        false -> P;
        true ->
            Tls = case {maps:find(ssl_dist_optfile, Opts), maps:find(settings, P)} of
                      {{ok, F}, _} -> own_optfile(to_list(F));
                      {error, {ok, #{tls := #{client := C, optfile := File, origin := O}}}} ->
                          checked(#{client => C, from => O, optfile => File});
                      {error, {ok, #{tls := #{error := {unreadable, F, Why}}}}} ->
                          #{error => {unreadable_optfile, F, Why}};
                      {error, {ok, #{tls := #{error := {bad_optfile, Why}, optfile := F}}}} ->
                          #{error => {bad_optfile, F, Why}};
                      _ ->
                          #{error => no_tls_options}
                  end,
            P#{tls => Tls}
    end.

own_optfile(File) ->
    case file:read_file(File) of
        {ok, Bin} ->
            case beamdiag_node_args:ssl_options(Bin) of
                {ok, L} ->
                    checked(#{client => proplists:get_value(client, L, []),
                              from => {cli, "--ssl-dist-optfile"},
                              optfile => list_to_binary(File)});
                {error, Why} ->
                    #{error => {bad_optfile, File, Why}}
            end;
        {error, Why} ->
            #{error => {unreadable_optfile, File, Why}}
    end.

%% Every file the client options name must be readable here: a key that
%% cannot be read is said by its name before any connection.
checked(T = #{client := C}) ->
    Bad = [{K, F, Why} || {K, F} <- C, lists:member(K, [certfile, keyfile, cacertfile]),
                          {error, Why} <- [readable(F)]],
    case Bad of
        [] -> T;
        [{K, F, Why} | _] -> #{error => {unreadable_tls_file, K, F, Why}}
    end.

readable(F) ->
    case file:open(F, [read, raw, binary]) of
        {ok, Fd} -> ok = file:close(Fd);
        {error, _} = E -> E
    end.

%% The cookies to try: the one given (option, file, BEAMDIAG_COOKIE), else
%% the node's own candidates and then the cookie file of the user running
%% beamdiag.
cookies(P, Opts) ->
    case {maps:get(cookie, Opts, undefined), maps:get(cookie_file, Opts, undefined),
          os:getenv("BEAMDIAG_COOKIE")} of
        {C, _, _} when C =/= undefined -> given_cookie(P, C, {cli, "--cookie"});
        {_, F, _} when F =/= undefined ->
            case read_cookie(F) of
                {ok, C} -> P#{cookies => [{C, {file, iolist_to_binary(F)}}]};
                {error, _} = E -> P#{cookie_error => element(2, E)}
            end;
        {_, _, Env} when Env =/= false -> given_cookie(P, Env, {env, <<"BEAMDIAG_COOKIE">>});
        _ ->
            Node = case maps:find(settings, P) of
                       {ok, #{cookies := Cs}} -> [{C, O} || {Bin, O} <- Cs, {ok, C} <- [to_cookie(Bin)]];
                       error -> []
                   end,
            Mine = case init:get_argument(home) of
                       {ok, [[Home]]} ->
                           F2 = filename:join(Home, ".erlang.cookie"),
                           case read_cookie(F2) of
                               {ok, C2} -> [{C2, {cli_home, list_to_binary(F2)}}];
                               {error, _} -> []
                           end;
                       _ -> []
                   end,
            Cookies = lists:foldl(fun({C, O}, Acc) ->
                                          case lists:keymember(C, 1, Acc) of
                                              true -> Acc;
                                              false -> Acc ++ [{C, O}]
                                          end
                                  end, [], Node ++ Mine),
            case Cookies of
                [] -> P#{cookie_error => {beamdiag_remote, no_cookie}};
                _ -> P#{cookies => Cookies}
            end
    end.

given_cookie(P, C, Origin) ->
    case to_cookie(C) of
        {ok, A} -> P#{cookies => [{A, Origin}]};
        {error, Why} -> P#{cookie_error => {beamdiag_remote, Why}}
    end.

read_cookie(File) ->
    case file:read_file(File) of
        {ok, Bin} when byte_size(Bin) > 0, byte_size(Bin) =< 1024 ->
            case to_cookie(string:trim(Bin)) of
                {ok, _} = Ok -> Ok;
                {error, Why} -> {error, {beamdiag_remote, Why}}
            end;
        {ok, _} ->
            {error, {beamdiag_remote, {cookie_file, File, einval}}};
        {error, Reason} ->
            {error, {beamdiag_remote, {cookie_file, File, Reason}}}
    end.

%% Cookies are atoms by the distribution's own API: 1 to 255 characters.
to_cookie(C) when is_atom(C) -> {ok, C};
to_cookie(C) when is_binary(C) ->
    case unicode:characters_to_list(C) of
        L when is_list(L) -> to_cookie(L);
        _ -> {error, {bad_cookie, not_utf8}}
    end;
to_cookie(C) when is_list(C), C =/= [], length(C) =< 255 -> {ok, list_to_atom(C)};
to_cookie(C) when is_list(C) -> {error, {bad_cookie, {length, length(C)}}}.

%% The distribution port, when no epmd can give it: --dist-port, else for
%% a node on this host that no epmd knows, its own settings or sockets.
port(P = #{local := false, given := Given, proto := Proto}, #{dist_port := Port}) ->
    %% Another host: its address, as the distribution would resolve it.
    Host = beamdiag_node_name:host(Given),
    Family = case lists:member(Proto, [inet6_tcp, inet6_tls]) of
                 true -> inet6;
                 false -> inet
             end,
    case inet:getaddr(Host, Family) of
        {ok, Ip} ->
            P#{port => #{port => Port, ip => Ip, origin => {cli, "--dist-port"}, confirmed => false},
               direct => true};
        {error, Why} ->
            note(P, ["cannot resolve ", Host, " (", inet:format_error(Why), "): --dist-port is "
                     "not used"])
    end;
port(P, #{dist_port := Port}) ->
    P#{port => #{port => Port, ip => address_for(P, Port), origin => {cli, "--dist-port"},
                 confirmed => false},
       direct => true};
port(P = #{located := #{epmd := registered, port := Port}}, _Opts) ->
    %% epmd knows it: the usual way works, the address as the node listens.
    P#{port => #{port => Port, ip => address_for(P, Port), origin => epmd, confirmed => true}};
port(P = #{settings := S}, Opts) ->
    Args = maps:get(args, S),
    Listen = maps:get(listen, S, []),
    Declared = [{V, {setting, K, O}} || K <- [erl_epmd_port, erl_epmd_node_listen_port],
                                        #{value := V, origin := O} <- [maps:get(K, Args, #{})],
                                        is_integer(V), V > 0]
        ++ case {maps:get(inet_dist_listen_min, Args, #{}), maps:get(inet_dist_listen_max, Args, #{})} of
               {#{value := Min, origin := O}, #{value := Max}} when Min =:= Max, is_integer(Min) ->
                   [{Min, {setting, inet_dist_listen_min, O}}];
               {#{value := Min, origin := O}, Max} when Max =:= #{}, is_integer(Min) ->
                   [{Min, {setting, inet_dist_listen_min, O}}];
               _ -> []
           end,
    Epmd = case P of
               #{located := #{epmd := E}} -> E;
               _ -> no_answer
           end,
    Sockets = [{Port, {listen, Epmd}} || {_Ip, Port} <- Listen,
                                         not lists:keymember(Port, 1, Declared)],
    Timeout = maps:get(probe_timeout, Opts, ?PROBE_MS),
    case first_confirmed(P, lists:sublist(Declared ++ Sockets, ?MAX_PROBES), Timeout, []) of
        {ok, Found} ->
            %% epmd said it does not know the node: only its port reaches it;
            %% no epmd answered: the usual way may still work.
            P#{port => Found, direct => case Epmd of
                                           not_registered -> true;
                                           no_epmd -> true;
                                           _ -> if_usable
                                       end};
        {none, Tried} -> note(P, ["no distribution port found among the node's: ",
                                  lists:join(", ", [integer_to_list(T) || T <- Tried])])
    end;
port(P, _Opts) ->
    P.

first_confirmed(_P, [], _Timeout, Tried) ->
    {none, lists:reverse(Tried)};
first_confirmed(P, [{Port, Origin} | Rest], Timeout, Tried) ->
    Ip = address_for(P, Port),
    Probe = beamdiag_dist_probe:probe(Ip, Port, probe_opts(P, Timeout)),
    case Probe of
        {ok, _Status} ->
            {ok, #{port => Port, ip => Ip, origin => Origin, confirmed => true}};
        {error, {tls, Why}} when Why =/= closed ->
            %% It speaks TLS and refuses us: the node's port, whose refusal
            %% the connection will say.
            {ok, #{port => Port, ip => Ip, origin => Origin, confirmed => tls}};
        {error, _} ->
            first_confirmed(P, Rest, Timeout, [Port | Tried])
    end.

probe_opts(P = #{mode := Mode}, Timeout) ->
    Base = #{mode => Mode, timeout => Timeout},
    case maps:get(tls, P, undefined) of
        #{client := C} -> Base#{tls => C};
        _ -> Base
    end.

%% The address to reach a port of the node: where it listens, loopback
%% when it listens on every address, in the family of its protocol.
address_for(P = #{proto := Proto}, Port) ->
    Inet6 = lists:member(Proto, [inet6_tcp, inet6_tls]),
    Listen = case P of
                 #{settings := #{listen := L}} -> [Ip || {Ip, Pt} <- L, Pt =:= Port];
                 _ -> []
             end,
    Specific = [Ip || Ip <- Listen, Ip =/= {0, 0, 0, 0}, Ip =/= {0, 0, 0, 0, 0, 0, 0, 0},
                      (tuple_size(Ip) =:= 8) =:= Inet6],
    case Specific of
        [Ip | _] -> Ip;
        [] when Inet6 -> {0, 0, 0, 0, 0, 0, 0, 1};
        [] -> {127, 0, 0, 1}
    end.

%% The rows a report shows: setting, value, origin.
rows(P) ->
    Name = [{<<"name">>, iolist_to_binary([atom_to_binary(maps:get(node, P)), " (",
                                            mode_text(maps:get(mode, P)), ")"]),
             case P of
                 #{settings := #{args := #{name := #{origin := {env, <<"RELEASE_NODE">>}}}}} ->
                     <<"RELEASE_NODE and RELEASE_DISTRIBUTION in the node's environment">>;
                 #{settings := #{args := #{name := #{mode := M, origin := O}}}} ->
                     flag_from(case M of shortnames -> "-sname"; longnames -> "-name" end, O);
                 _ -> <<"the name given">>
             end}],
    Proto = [{<<"distribution">>, atom_to_binary(maps:get(proto, P)),
              case maps:get(proto_origin, P) of
                  default -> <<"the default (no -proto_dist)">>;
                  O2 -> flag_from("-proto_dist", O2)
              end}],
    Tls = case maps:get(tls, P, undefined) of
              #{optfile := F, from := {cli, _} = O3} ->
                  [{<<"TLS options">>, <<F/binary, " (client part)">>, origin_text(O3)}];
              #{optfile := <<>>, from := O3} ->
                  [{<<"TLS options">>, <<"-ssl_dist_opt client_* pairs">>, flag_from("-ssl_dist_opt", O3)}];
              #{optfile := F, from := O3} ->
                  [{<<"TLS options">>, <<F/binary, " (client part)">>,
                    flag_from("-ssl_dist_optfile", O3)}];
              #{error := Why} ->
                  [{<<"TLS options">>, <<"none usable">>, iolist_to_binary(format_error(Why))}];
              undefined -> []
          end,
    Args = case P of
               #{settings := #{args := A}} -> A;
               _ -> #{}
           end,
    Epmd = [{<<"epmd module">>, V, flag_from("-epmd_module", O4)}
            || #{value := V, origin := O4} <- [maps:get(epmd_module, Args, #{})]] ++
        [{<<"epmd module">>, iolist_to_binary(io_lib:format("~0p", [V])),
          flag_from("-kernel epmd_module", O4)}
         || #{value := V, origin := O4} <- [maps:get(kernel_epmd_module, Args, #{})]] ++
        [{<<"epmd">>, <<"none (-no_epmd)">>, flag_from("-no_epmd", O4)}
         || #{origin := O4} <- [maps:get(no_epmd, Args, #{})]],
    Kernel = [{atom_to_binary(K), iolist_to_binary(io_lib:format("~0p", [V])),
               flag_from(case K of
                             erl_epmd_port -> "-erl_epmd_port";
                             _ -> "-kernel " ++ atom_to_list(K)
                         end, O5)}
              || K <- [erl_epmd_port, erl_epmd_node_listen_port, inet_dist_listen_min,
                       inet_dist_listen_max, inet_dist_use_interface],
                 #{value := V, origin := O5} <- [maps:get(K, Args, #{})]],
    Port = case maps:find(port, P) of
               {ok, #{port := Pt, ip := Ip, origin := PO, confirmed := C}} ->
                   [{<<"port">>, iolist_to_binary([integer_to_list(Pt), " on ", inet:ntoa(Ip)]),
                     iolist_to_binary([port_from(PO),
                                       case {PO, C} of
                                           {epmd, _} -> "";
                                           {_, true} -> ", confirmed by a handshake";
                                           {_, tls} -> ", which answers TLS";
                                           {_, false} -> ""
                                       end])}];
               error -> []
           end,
    Home = case P of
               #{settings := #{home := {H, HO}}} ->
                   [{<<"home">>, H, home_from(HO)}];
               _ -> []
           end,
    P#{rows => Name ++ Proto ++ Tls ++ Epmd ++ Kernel ++ Port ++ Home}.

settings_notes(#{settings := #{notes := N}}) -> N;
settings_notes(_) -> [].

flag_from(Flag, command_line) -> iolist_to_binary([Flag, " on the command line"]);
flag_from(_Flag, {cli, Opt}) -> iolist_to_binary(["beamdiag's ", Opt]);
flag_from(Flag, O) -> iolist_to_binary([Flag, " in ", origin_text(O)]).

port_from(epmd) -> <<"epmd">>;
port_from({cli, Opt}) -> iolist_to_binary(["beamdiag's ", Opt]);
port_from({setting, erl_epmd_port, O}) -> flag_from("-erl_epmd_port", O);
port_from({setting, K, O}) -> flag_from("-kernel " ++ atom_to_list(K), O);
port_from({listen, registered}) ->
    <<"the socket the node listens on (epmd's port for it is not one)">>;
port_from({listen, not_registered}) ->
    <<"the socket the node listens on (it is registered in no epmd)">>;
port_from({listen, no_epmd}) ->
    <<"the socket the node listens on (no epmd runs here)">>;
port_from({listen, _}) ->
    <<"the socket the node listens on (no epmd answered)">>.

home_from({env, <<"HOME">>}) -> <<"HOME in the node's environment">>;
home_from(command_line) -> <<"-home on the command line">>;
home_from(O) -> origin_text(O).

origin_text({setcookie, O}) -> flag_from("-setcookie", O);
origin_text({home_file, F}) -> <<"the cookie file in the home of the node's user, ", F/binary>>;
origin_text({release_file, F}) -> <<"the release's cookie file ", F/binary>>;
origin_text({cli_home, F}) -> <<"the cookie file of the user running beamdiag, ", F/binary>>;
origin_text({cli, Opt}) -> iolist_to_binary(["beamdiag's ", Opt]);
origin_text({env, <<"BEAMDIAG_COOKIE">>}) -> <<"the environment variable BEAMDIAG_COOKIE">>;
origin_text({env, V}) -> <<"the node's environment variable ", V/binary>>;
origin_text({file, F}) -> <<"the file ", F/binary>>;
origin_text(O) -> beamdiag_node_args:origin_text(O).

mode_text(shortnames) -> "short names";
mode_text(longnames) -> "long names".

is_tls(P) -> P =:= inet_tls orelse P =:= inet6_tls.

note(P = #{notes := N}, Text) -> P#{notes := N ++ [iolist_to_binary(Text)]}.

to_list(A) when is_atom(A) -> atom_to_list(A);
to_list(B) when is_binary(B) -> binary_to_list(B);
to_list(L) when is_list(L) -> L.

reason(Why) when is_atom(Why) -> file:format_error(Why);
reason(Why) -> io_lib:format("~0p", [Why]).
