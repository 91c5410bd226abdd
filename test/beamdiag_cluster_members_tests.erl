-module(beamdiag_cluster_members_tests).
-include_lib("eunit/include/eunit.hrl").

-define(M, beamdiag_cluster_members).

%% A file of the test's own, removed after the test.
with_file(Text, Fun) ->
    F = filename:join("/tmp", "beamdiag_members_" ++ os:getpid() ++ "_"
                      ++ integer_to_list(erlang:unique_integer([positive]))),
    ok = file:write_file(F, Text),
    try Fun(F) after file:delete(F) end.

words(R) ->
    lists:flatten(io_lib:format("~ts", [beamdiag_cluster:format_error(R)])).

parse_nodes_test() ->
    ?assertEqual({ok, ['a@h', 'b@h.example.com']},
                 ?M:parse_nodes(<<"# members\n\na@h\n  b@h.example.com  # db\n\n">>)),
    ?assertMatch({error, {beamdiag_cluster, {bad_line, 3, <<"nope">>}}},
                 ?M:parse_nodes("a@h\n#\nnope\nb@h\n")).

%% Windows line ends count as one line each; the members keep the file's
%% order, duplicates and all (the session takes each member once).
crlf_and_order_test() ->
    ?assertEqual({ok, ['b@h', 'a@h', 'b@h']},
                 ?M:parse_nodes(<<"b@h\r\n# x\r\n\r\na@h\r\nb@h\r\n">>)),
    ?assertEqual({error, {beamdiag_cluster, {bad_line, 3, <<"bad">>}}},
                 ?M:parse_nodes(<<"a@h\r\n\r\nbad\r\n">>)).

nothing_to_parse_test() ->
    ?assertEqual({ok, []}, ?M:parse_nodes(<<>>)),
    ?assertEqual({ok, []}, ?M:parse_nodes("   \n\t\n  # only comments\n#\n")).

%% The line is named as written (trimmed), its comment included; a name
%% needs both sides of one `@'.
bad_lines_test() ->
    ?assertEqual({error, {beamdiag_cluster, {bad_line, 1, <<"no at # c">>}}},
                 ?M:parse_nodes("  no at # c  \n")),
    ?assertMatch({error, {beamdiag_cluster, {bad_line, 1, <<"@h">>}}}, ?M:parse_nodes("@h\n")),
    ?assertMatch({error, {beamdiag_cluster, {bad_line, 2, <<"a@">>}}}, ?M:parse_nodes("x@h\na@\n")),
    ?assertMatch({error, {beamdiag_cluster, {bad_line, 1, _}}}, ?M:parse_nodes("a@b@c\n")).

read_nodes_test() ->
    with_file("a@h\nnot a node\n",
              fun(F) ->
                      {error, {beamdiag_cluster, R}} = ?M:read_nodes(F),
                      ?assertEqual({bad_line, F, 2, <<"not a node">>}, R),
                      ?assertMatch({match, _}, re:run(words(R), "line 2: 'not a node' is not a "
                                                                "node name"))
              end),
    with_file("# nobody\n",
              fun(F) ->
                      ?assertEqual({error, {beamdiag_cluster, {no_nodes, F}}}, ?M:read_nodes(F))
              end),
    with_file("app@host1\n\napp@host2  # db\n",
              fun(F) -> ?assertEqual({ok, ['app@host1', 'app@host2']}, ?M:read_nodes(F)) end).

unreadable_file_test() ->
    F = "/nonexistent/beamdiag_members",
    {error, {beamdiag_cluster, R}} = ?M:read_nodes(F),
    ?assertEqual({nodes_file, F, enoent}, R),
    ?assertMatch({match, _}, re:run(words(R), "cannot read the node list /nonexistent/")).
