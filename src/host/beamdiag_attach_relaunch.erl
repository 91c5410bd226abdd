%%% @doc What this VM's distribution lacks to follow an attach plan
%%% (beamdiag_attach_plan) and the flags it starts itself again with: TLS
%%% distribution with the client part of the node's TLS options, IPv6, or
%%% beamdiag_epmd as its epmd module for a node no epmd knows. The escript
%%% runs itself again with them (beamdiag_cli_diagnose).
%%%
%%% ```
%%% 1> {ok, P} = beamdiag_attach_plan:plan("app@myhost", #{}).
%%% 2> beamdiag_attach_relaunch:missing(P).
%%% [{"-proto_dist", ["inet_tls"]}, {"-ssl_dist_optfile", []}]
%%% 3> {ok, Flags, Dir} = beamdiag_attach_relaunch:relaunch_flags(P).
%%% '''
-module(beamdiag_attach_relaunch).

-export([missing/1, relaunch_flags/1]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc What this VM's distribution lacks to follow the plan: flags, each
%% with its values (`-ssl_dist_optfile' with none: the file is written
%% when the VM is started again). Empty when it can connect as it is. On
%% OTP 26 and later, a VM not yet distributed is given beamdiag_epmd as
%% its epmd module here (`beamdiag_epmd:use/0'), so that one is not
%% lacking.
-spec missing(beamdiag_attach_plan:plan()) -> [{string(), [string()]}].
missing(Plan = #{proto := Proto}) ->
    OwnProto = case init:get_argument(proto_dist) of
                   {ok, [[P | _] | _]} -> list_to_atom(P);
                   _ -> inet_tcp
               end,
    ProtoFlags = case Proto =:= OwnProto of
                     true -> [];
                     false -> [{"-proto_dist", [atom_to_list(Proto)]}]
                 end,
    TlsFlags = case lists:member(Proto, [inet_tls, inet6_tls]) andalso init:get_argument(ssl_dist_optfile) =:= error
                   andalso init:get_argument(ssl_dist_opt) =:= error of
                   true -> [{"-ssl_dist_optfile", []}];
                   false -> []
               end,
    EpmdFlags = case maps:get(direct, Plan) =:= true andalso not beamdiag_epmd:use() of
                    true -> [{"-epmd_module", ["beamdiag_epmd"]}];
                    false -> []
                end,
    ProtoFlags ++ TlsFlags ++ EpmdFlags.

%% @doc The flags to start this VM with so that it can follow the plan,
%% and the folder of the files written for them (the TLS options), which
%% the caller removes when that VM has ended.
-spec relaunch_flags(beamdiag_attach_plan:plan()) -> {ok, [string()], file:filename() | none} | {error, {module(), term()}}.
relaunch_flags(Plan) ->
    Missing = missing(Plan),
    case lists:keymember("-ssl_dist_optfile", 1, Missing) of
        false ->
            {ok, lists:append([[F | Vs] || {F, Vs} <- Missing]), none};
        true ->
            case maps:get(tls, Plan, undefined) of
                #{client := Client} ->
                    Dir = temp_dir(),
                    File = filename:join(Dir, "ssl_dist.conf"),
                    ok = file:make_dir(Dir),
                    ok = file:change_mode(Dir, 8#700),
                    Text = io_lib:format("~p.~n", [[{client, Client}]]),
                    ok = file:write_file(File, Text),
                    ok = file:change_mode(File, 8#600),
                    Flags = lists:append([case F of
                                              "-ssl_dist_optfile" -> [F, File];
                                              _ -> [F | Vs]
                                          end || {F, Vs} <- Missing]),
                    {ok, Flags, Dir};
                #{error := Why} ->
                    {error, {beamdiag_attach_plan, Why}};
                undefined ->
                    {error, {beamdiag_attach_plan, no_tls_options}}
            end
    end.

%%%===================================================================
%%% Internal
%%%===================================================================

temp_dir() ->
    beamdiag_tmp:path("beamdiag-attach").
