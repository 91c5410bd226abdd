%%% @doc The BEAM nodes running on this host, for `beamdiag diagnose'
%%% without a node: each one's OS pid, name, release and distribution in
%%% words, read from /proc and the node's command line (at most 50). A
%%% node that starts its distribution after boot, as RabbitMQ does, has no
%%% name on its command line: it is named by this host's epmd when one of
%%% its listening sockets is the port epmd gives for a name.
%%%
%%% ```
%%% 1> beamdiag_host_vms:list(#{}).
%%% [#{os_pid => 4242, name => <<"app@myhost">>, otp => 27,
%%%    distribution => <<"inet_tcp, listens on 39311">>}]
%%% '''
-module(beamdiag_host_vms).

-export([list/1]).

-define(MAX_LISTED, 50).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The BEAM nodes on this host, for `beamdiag diagnose' without a
%% node: each one's OS pid, name (if distributed), OTP release and
%% distribution set-up in words. This VM is left out, and so is the
%% beamdiag escript that started it, when it was started again
%% (beamdiag_attach_relaunch). Options: `proc_root', `names' (epmd's
%% names as `net_adm:names/1' gives them, instead of asking this host's
%% epmd, which is asked at most once, within 2 s).
-spec list(#{proc_root => file:filename(),
             names => {ok, [{string(), inet:port_number()}]} | {error, term()}}) ->
    [#{os_pid := pos_integer(), name := binary() | none,
       otp := pos_integer() | undefined, distribution := binary()}].
list(Opts) ->
    Root = maps:get(proc_root, Opts, "/proc"),
    Own = own(Root, list_to_integer(os:getpid())),
    Beams = [P || {P, _} <- beamdiag_host_locate:beams(Root), not lists:member(P, Own)],
    Settings = [{P, beamdiag_node_settings:read(P, #{proc_root => Root})}
                || P <- lists:sublist(Beams, ?MAX_LISTED)],
    %% epmd is asked only when a VM without a name listens.
    Unnamed = lists:any(fun({_, #{args := A, listen := L}}) -> L =/= [] andalso
                                                               not maps:is_key(name, A)
                        end, Settings),
    Names = case {Unnamed, maps:find(names, Opts)} of
                {false, _} -> [];
                {true, {ok, Given}} -> epmd_ports(Given);
                {true, error} -> epmd_ports(beamdiag_host_locate:epmd_names("localhost"))
            end,
    [candidate(P, S, Names) || {P, S} <- Settings].

%%%===================================================================
%%% Internal
%%%===================================================================

%% This OS process, and its parent when that runs the same escript (it
%% started this one again, with more flags).
own(Root, Pid) ->
    Parent = case beamdiag_host_locate:read(filename:join([Root, integer_to_list(Pid), "stat"])) of
                 {ok, Bin} ->
                     case beamdiag_agent_procfs:stat_fields(Bin) of
                         {ok, _, [_State, PPid | _]} -> string:to_integer(binary_to_list(PPid));
                         _ -> error
                     end;
                 {error, _} -> error
             end,
    Script = try escript:script_name() of
                 S -> list_to_binary(S)
             catch _:_ -> none
             end,
    case Parent of
        {P, ""} when is_integer(P), P > 1, Script =/= none ->
            case beamdiag_host_locate:read(filename:join([Root, integer_to_list(P), "cmdline"])) of
                {ok, Cmd} ->
                    case lists:member(Script, binary:split(Cmd, <<0>>, [global])) of
                        true -> [Pid, P];
                        false -> [Pid]
                    end;
                {error, _} -> [Pid]
            end;
        _ ->
            [Pid]
    end.

%% epmd's names by port.
epmd_ports({ok, Names}) -> [{Port, N} || {N, Port} <- Names];
epmd_ports({error, _}) -> [].

candidate(Pid, S, EpmdPorts) ->
    Args = maps:get(args, S),
    Listen = [Pt || {_, Pt} <- maps:get(listen, S)],
    %% Its name, the ports said (every listening socket of a node named
    %% on its command line; epmd's port for a node only epmd names), and
    %% how the name was found.
    {Name, Ports, Started} =
        case maps:find(name, Args) of
            {ok, #{value := V, mode := shortnames}} ->
                case binary:match(V, <<"@">>) of
                    nomatch -> {beamdiag_node_name:on_this_host(V), Listen, ""};
                    _ -> {V, Listen, ""}
                end;
            {ok, #{value := V}} ->
                {V, Listen, ""};
            error ->
                case [{N, Pt} || {Pt, N} <- EpmdPorts, lists:member(Pt, Listen)] of
                    [{N, EpmdPort} | _] -> {beamdiag_node_name:on_this_host(N), [EpmdPort],
                                      ", started after boot (epmd's name for its port)"};
                    [] -> {none, [], ""}
                end
        end,
    Proto = case maps:find(proto_dist, Args) of
                {ok, #{value := [Pr | _]}} -> Pr;
                error -> <<"inet_tcp">>
            end,
    Epmd = case {maps:find(epmd_module, Args), maps:find(erl_epmd_port, Args)} of
               {{ok, #{value := M}}, _} -> [", epmd module ", M];
               {_, {ok, #{value := Pt}}} -> [", port ", integer_to_list(Pt), " (-erl_epmd_port)"];
               _ -> ""
           end,
    Dist = case Name of
               none -> <<"no distribution">>;
               _ -> iolist_to_binary([Proto, Epmd, Started,
                                      [[", listens on ", lists:join(", ", [integer_to_list(Pt)
                                                                        || Pt <- Ports])]
                                       || Ports =/= []]])
           end,
    #{os_pid => Pid, name => Name, otp => maps:get(otp, S), distribution => Dist}.
