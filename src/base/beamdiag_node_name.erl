%%% @doc Node names: `name@host' parsed and split, in one place.
%%%
%%% `parse/1' checks a name the operator typed and says which naming mode
%%% (short or long names) it needs; `split/1' and `host/1' take a name
%%% apart at its first `@', as the distribution does, keeping the kind of
%%% text they were given (an atom or a string gives strings, a binary
%%% binaries).
%%%
%%% ```
%%% 1> beamdiag_node_name:parse("app@db1.example").
%%% {ok, 'app@db1.example', longnames}
%%% 2> beamdiag_node_name:split('app@db1').
%%% {"app", "db1"}
%%% 3> beamdiag_node_name:host(<<"app">>).
%%% <<>>
%%% '''
-module(beamdiag_node_name).

-export([parse/1, split/1, host/1, short_host/0, on_this_host/1, format_error/1]).
%% Called as Module:format_error/1 on an {error, {Module, Reason}} value.
-ignore_xref([{format_error, 1}]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc A node name as typed: the node and the naming mode it needs (long
%% names when its host part has a dot or a colon). Each part may hold
%% letters, digits and `_-.:'; the whole at most 255 characters.
-spec parse(string() | binary()) ->
    {ok, node(), shortnames | longnames} | {error, {beamdiag_node_name, term()}}.
parse(Bin) when is_binary(Bin) ->
    parse(unicode:characters_to_list(Bin));
parse(Str) when is_list(Str) ->
    case split(Str) of
        {Name, Host} when Name =/= "", Host =/= "", length(Str) =< 255 ->
            case valid_part(Name) andalso valid_part(Host) of
                true ->
                    Domain = case lists:member($., Host) orelse lists:member($:, Host) of
                                 true -> longnames;
                                 false -> shortnames
                             end,
                    %% One atom for the node the user named; the dist layer
                    %% needs it.
                    {ok, list_to_atom(Str), Domain};
                false ->
                    {error, {?MODULE, {bad_node, Str}}}
            end;
        _ ->
            {error, {?MODULE, {bad_node, Str}}}
    end.

%% @doc The name and the host part, split at the first `@'; `error' when
%% there is none.
-spec split(node() | string()) -> {string(), string()} | error;
           (binary()) -> {binary(), binary()} | error.
split(Node) when is_atom(Node) ->
    split(atom_to_list(Node));
split(Bin) when is_binary(Bin) ->
    case binary:split(Bin, <<"@">>) of
        [Name, Host] -> {Name, Host};
        [_] -> error
    end;
split(Str) when is_list(Str) ->
    case string:split(Str, "@") of
        [Name, Host] -> {Name, Host};
        [_] -> error
    end.

%% @doc The host part; empty when the name has none.
-spec host(node() | string()) -> string();
          (binary()) -> binary().
host(Node) ->
    case split(Node) of
        {_, Host} -> Host;
        error when is_binary(Node) -> <<>>;
        error -> ""
    end.

%% @doc This host's short name (its name up to the first dot), as short
%% node names use it.
-spec short_host() -> string().
short_host() ->
    {ok, H} = inet:gethostname(),
    hd(string:split(H, ".")).

%% @doc A short node name on this host: Name@ShortHost.
-spec on_this_host(iodata()) -> binary().
on_this_host(Name) ->
    iolist_to_binary([Name, "@", short_host()]).

%% @doc Turns an error reason of this module into a sentence.
-spec format_error(term()) -> iolist().
format_error({bad_node, S}) ->
    ["'", beamdiag_safe_text:safe(S, 100), "' is not a node name: expected name@host"].

%%%===================================================================
%%% Internal
%%%===================================================================

valid_part(S) ->
    lists:all(fun(C) ->
                      (C >= $a andalso C =< $z) orelse (C >= $A andalso C =< $Z) orelse
                          (C >= $0 andalso C =< $9) orelse lists:member(C, "_-.:")
              end, S).
