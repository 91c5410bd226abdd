%%% @doc The members file of a cluster diagnosis: a list of node names, one
%%% a line, read and parsed before anything is connected.
%%%
%%% Blank lines and lines starting with `#' (after blanks) are skipped, and
%%% a `#' after a name starts a comment. A line that is not a node name is
%%% an error naming the file and the line. The errors are
%%% `beamdiag_cluster''s (`{error, {beamdiag_cluster, Reason}}'), put in
%%% words by `beamdiag_cluster:format_error/1', as `beamdiag_cluster:read_nodes/1'
%%% returns them.
%%%
%%% ```
%%% 1> file:write_file("members", "# the shop\napp@host1\napp@host2  # db\n").
%%% ok
%%% 2> beamdiag_cluster_members:read_nodes("members").
%%% {ok,['app@host1','app@host2']}
%%% '''
-module(beamdiag_cluster_members).

-export([read_nodes/1]).
%% Called by the tests only.
-ifdef(TEST).
-export([parse_nodes/1]).
-endif.

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Reads a file of node names (see `parse_nodes/1'). A file that
%% names no node is an error, as is one that cannot be read.
-spec read_nodes(file:filename()) -> {ok, [node()]} | {error, {beamdiag_cluster, term()}}.
read_nodes(File) ->
    case file:read_file(File) of
        {ok, Bin} ->
            case parse_nodes(Bin) of
                {ok, []} ->
                    {error, {beamdiag_cluster, {no_nodes, File}}};
                {ok, _} = Ok ->
                    Ok;
                {error, {beamdiag_cluster, {bad_line, N, L}}} ->
                    {error, {beamdiag_cluster, {bad_line, File, N, L}}}
            end;
        {error, Why} ->
            {error, {beamdiag_cluster, {nodes_file, File, Why}}}
    end.

%% @doc Parses a list of node names, one a line: blank lines and lines
%% starting with `#' (after blanks) are skipped, a `#' after a name starts
%% a comment. A line that is not a node name is an error naming the line.
-spec parse_nodes(binary() | string()) ->
    {ok, [node()]} | {error, {beamdiag_cluster, {bad_line, pos_integer(), binary()}}}.
parse_nodes(Text) ->
    Lines = binary:split(unicode:characters_to_binary(Text), [<<"\r\n">>, <<"\n">>], [global]),
    parse_lines(lists:enumerate(Lines), []).

%%%===================================================================
%%% Internal
%%%===================================================================

parse_lines([], Acc) ->
    {ok, lists:reverse(Acc)};
parse_lines([{N, Line} | Rest], Acc) ->
    Name = string:trim(hd(binary:split(Line, <<"#">>))),
    case Name of
        <<>> ->
            parse_lines(Rest, Acc);
        _ ->
            case beamdiag_node_name:parse(Name) of
                {ok, Node, _} -> parse_lines(Rest, [Node | Acc]);
                {error, _} -> {error, {beamdiag_cluster, {bad_line, N, string:trim(Line)}}}
            end
    end.
