%%% @doc The CLI's own epmd module (`-epmd_module beamdiag_epmd'): reaches
%%% a node whose distribution port beamdiag found on the host, without
%%% asking any epmd, and every other node through OTP's `erl_epmd'.
%%%
%%% A node that registers nowhere (an epmd-less cluster's own
%%% `-epmd_module', or `-erl_epmd_port') still listens on its distribution
%%% port; `beamdiag_attach_plan' finds it and calls `set/3' before connecting.
%%% The callbacks are those OTP 25 to 29 call (`address_please/3' answers
%%% with the address and port, so `port_please' is not asked for such a
%%% node; a node is known by its name and host as its name writes them).
%%%
%%% On OTP 26 and later the kernel parameter `epmd_module' names it at
%%% run time (`use/0'); on OTP 25 only the `-epmd_module' flag does, so the
%%% escript starts itself again with it (see beamdiag_cli_diagnose).
%%%
%%% ```
%%% 1> beamdiag_epmd:set('app@host', {127,0,0,1}, 40123).
%%% 2> net_kernel:connect_node('app@host').
%%% true
%%% '''
-module(beamdiag_epmd).

-export([set/3, use/0]).
%% The epmd module callbacks, called by OTP's distribution.
-export([start_link/0, register_node/2, register_node/3, port_please/2, port_please/3,
         listen_port_please/2, names/1, address_please/3]).
-ignore_xref([{start_link, 0}, {register_node, 2}, {register_node, 3}, {port_please, 2},
              {port_please, 3}, {listen_port_please, 2}, {names, 1}, {address_please, 3}]).

%% The distribution protocol version answered for a node reached by its
%% port: 6, which every release since OTP 23 speaks.
-define(VERSION, 6).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Node is reached at Ip:Port, without epmd.
-spec set(node(), inet:ip_address(), inet:port_number()) -> ok.
set(Node, Ip, Port) ->
    {Name, Host} = beamdiag_node_name:split(Node),
    Key = {?MODULE, Name, Host},
    case persistent_term:get(Key, undefined) of
        {Ip, Port} -> ok;
        _ -> persistent_term:put(Key, {Ip, Port})
    end.

%% @doc Makes this module the epmd module of distribution started later,
%% where the release reads the kernel parameter (OTP 26 and later) and
%% no `-epmd_module' flag was given: true when it is, or already was.
-spec use() -> boolean().
use() ->
    case in_use() of
        true -> true;
        false ->
            Otp = list_to_integer(erlang:system_info(otp_release)),
            case {Otp >= 26, init:get_argument(epmd_module), node()} of
                {true, error, nonode@nohost} ->
                    ok = application:set_env(kernel, epmd_module, ?MODULE),
                    true;
                _ ->
                    false
            end
    end.

%% Whether distribution here uses this module.
in_use() ->
    case init:get_argument(epmd_module) of
        {ok, [[M | _] | _]} -> M =:= atom_to_list(?MODULE);
        _ -> application:get_env(kernel, epmd_module) =:= {ok, ?MODULE}
    end.

%%%===================================================================
%%% epmd module callbacks
%%%===================================================================

%% @private
-spec start_link() -> {ok, pid()} | ignore | {error, term()}.
start_link() ->
    erl_epmd:start_link().

%% @private
-spec register_node(string(), inet:port_number()) -> term().
register_node(Name, Port) ->
    erl_epmd:register_node(Name, Port).

%% @private
-spec register_node(string(), inet:port_number(), atom()) -> term().
register_node(Name, Port, Driver) ->
    erl_epmd:register_node(Name, Port, Driver).

%% @private
-spec port_please(atom() | string(), term()) -> term().
port_please(Name, Host) ->
    port_please(Name, Host, infinity).

%% @private
-spec port_please(atom() | string(), term(), timeout()) -> term().
port_please(Name, Host, Timeout) ->
    erl_epmd:port_please(Name, Host, Timeout).

%% @private
-spec listen_port_please(atom() | string(), term()) -> {ok, inet:port_number()}.
listen_port_please(Name, Host) ->
    erl_epmd:listen_port_please(Name, Host).

%% @private
-spec names(term()) -> term().
names(Host) ->
    erl_epmd:names(Host).

%% @private
-spec address_please(atom() | string(), term(), inet | inet6) -> term().
address_please(Name, Host, Family) ->
    case known(Name, Host) of
        {Ip, Port} when (Family =:= inet andalso tuple_size(Ip) =:= 4) orelse
                        (Family =:= inet6 andalso tuple_size(Ip) =:= 8) ->
            {ok, Ip, Port, ?VERSION};
        _ ->
            erl_epmd:address_please(Name, Host, Family)
    end.

%%%===================================================================
%%% Internal
%%%===================================================================

known(Name, Host) when is_atom(Name) -> known(atom_to_list(Name), Host);
known(Name, Host) when is_list(Name), is_list(Host) ->
    persistent_term:get({?MODULE, Name, Host}, undefined);
known(_Name, _Host) ->
    undefined.
