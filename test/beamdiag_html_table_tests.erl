%%% The HTML report's table engine on every shape of term: which table a
%%% shape becomes, the column order, the bounds on rows, columns, depth and
%%% text, and escaping.
-module(beamdiag_html_table_tests).

-include_lib("eunit/include/eunit.hrl").

html(Term) -> iolist_to_binary(beamdiag_html_table:render(Term, 0)).

count(Html, Pat) -> length(binary:matches(Html, Pat)).

has(Html, Pat) -> binary:match(Html, Pat) =/= nomatch.

max_rows_test() ->
    ?assertEqual(500, beamdiag_html_table:max_rows()).

kv_table_test() ->
    Html = iolist_to_binary(beamdiag_html_table:kv_table([{runs, 3}, {<<"<k>">>, <<"<v>">>},
                                                          {ratio, 0.25}, {gone, null}])),
    ?assertEqual(<<"<table class=\"kv\"><tbody>"
                   "<tr><th>runs</th><td><span class=\"n\">3</span></td></tr>\n"
                   "<tr><th>&lt;k&gt;</th><td>&lt;v&gt;</td></tr>\n"
                   "<tr><th>ratio</th><td><span class=\"n\">0.25</span></td></tr>\n"
                   "<tr><th>gone</th><td>&ndash;</td></tr>\n"
                   "</tbody></table>\n">>, Html).

kv_table_bounded_test() ->
    Html = iolist_to_binary(beamdiag_html_table:kv_table([{I, I} || I <- lists:seq(1, 600)])),
    ?assertEqual(500, count(Html, <<"<tr>">>)),
    ?assert(has(Html, <<"<th>500</th>">>)),
    ?assertNot(has(Html, <<"<th>501</th>">>)).

empty_test() ->
    ?assertEqual(<<"<p class=\"none\">empty</p>">>, html(#{})),
    ?assertEqual(<<"<p class=\"none\">none</p>">>, html([])).

scalars_test() ->
    ?assertEqual(<<"<p><span class=\"n\">7</span></p>">>, html(7)),
    ?assertEqual(<<"<p>&lt;b&gt;</p>">>, html(<<"<b>">>)),
    ?assertEqual(<<"<p>a string</p>">>, html("a string")),
    ?assertEqual(<<"<p>[<span class=\"n\">1.0</span>, <span class=\"n\">2</span>]</p>">>,
                 html({1.0, 2})),
    %% Anything else is printed as a term, escaped.
    ?assertEqual(<<"<p><code>{tuple,&lt;&lt;&quot;x&quot;&gt;&gt;}</code></p>">>,
                 html({tuple, <<"x">>})).

scalar_list_test() ->
    ?assertEqual(<<"<p><span class=\"n\">1</span>, a, b</p>">>, html([1, a, <<"b">>])),
    %% At most 50 shown, and how many there were.
    Html = html([x || _ <- lists:seq(1, 80)]),
    ?assertEqual(50, count(Html, <<"x">>)),
    ?assert(has(Html, <<" &hellip; (80)</p>">>)).

map_of_scalars_test() ->
    %% Keys sorted by their text; nested maps after the scalars, in details.
    Html = html(#{b => 2, a => 1, n => #{z => <<"deep">>}}),
    {A, _} = binary:match(Html, <<"<th>a</th>">>),
    {B, _} = binary:match(Html, <<"<th>b</th>">>),
    {N, _} = binary:match(Html, <<"<details open class=\"nested\"><summary>n</summary>">>),
    ?assert(A < B andalso B < N),
    ?assert(has(Html, <<"<th>z</th><td>deep</td>">>)).

map_of_maps_is_one_table_test() ->
    Html = html(#{busy => #{a => 0.1, b => 0.3}, spin => #{a => 0.5, b => 0.0}}),
    ?assertEqual(1, count(Html, <<"<table">>)),
    %% A key column, then a column per inner key.
    ?assert(has(Html, <<"<thead><tr><th></th><th>a</th><th>b</th></tr></thead>">>)),
    ?assert(has(Html, <<"<tr><th>busy</th><td><span class=\"n\">0.1</span></td>">>)),
    %% Numbers right-aligned (no class), text left.
    ?assertEqual(0, count(Html, <<"class=\"t\"">>)).

list_of_maps_test() ->
    Rows = [#{cpu => 1.5, name => <<"+sbwt none">>, extra => [1, 2, 3]},
            #{cpu => 2.5, name => <<"<b>default</b>">>, significant => true}],
    Html = html(Rows),
    ?assertEqual(1, count(Html, <<"<table">>)),
    %% No key column for a list; the naming column first.
    ?assert(has(Html, <<"<thead><tr><th>name</th><th>cpu</th>">>)),
    ?assertNot(has(Html, <<"<th></th>">>)),
    ?assertEqual(1, count(Html, <<"<tr class=\"sig\">">>)),
    ?assert(has(Html, <<"&lt;b&gt;default&lt;/b&gt;">>)),
    ?assertNot(has(Html, <<"<b>default">>)),
    %% A row without a key has an empty cell.
    ?assert(has(Html, <<"<td class=\"t\"></td>">>)).

id_columns_first_test() ->
    Html = html([#{z => 1, a => 2, workload => w, id => 1, name => n}]),
    {match, Heads} = re:run(Html, "<th>([a-z]+)</th>", [global, {capture, all_but_first, binary}]),
    ?assertEqual([<<"id">>, <<"name">>, <<"workload">>, <<"a">>, <<"z">>], [H || [H] <- Heads]).

rows_bounded_test() ->
    Html = html([#{i => I} || I <- lists:seq(1, 520)]),
    ?assertEqual(500, count(Html, <<"<tr><td>">>)),
    ?assert(has(Html, <<"<p class=\"help\">20 more rows not shown.</p>">>)).

columns_bounded_test() ->
    Wide = maps:from_list([{I, I} || I <- lists:seq(1, 45)]),
    Html = html([Wide]),
    ?assertEqual(40, count(Html, <<"<th>">>)).

depth_bounded_test() ->
    Deep = lists:foldl(fun(_, A) -> #{k => A, s => 1} end, #{leaf => <<"<end>">>},
                       lists:seq(1, 10)),
    Html = html(Deep),
    %% Seven levels as details (depth 0 to 6), then the rest on one line.
    ?assertEqual(7, count(Html, <<"<details">>)),
    ?assert(has(Html, <<"<code>#{k =&gt; #{k =&gt;">>)),
    ?assertNot(has(Html, <<"<end>">>)).

text_bounded_test() ->
    Html = html(#{v => binary:copy(<<"a">>, 5000)}),
    ?assert(has(Html, <<"&hellip;</span>">>)),
    ?assert(byte_size(Html) < 9000).

diagnosis_gist_test() ->
    D = #{capture => #{node => <<"n@h">>, samples => [lots]},
          ledger => #{window_s => 5.0, totals => #{cpus_used => 1.25}},
          findings => [#{id => busy_wait, severity => warning},
                       #{id => <<"other">>, severity => info}]},
    Html = html(#{baseline => D}),
    ?assert(has(Html, <<"<th>node</th><td>n@h</td>">>)),
    ?assert(has(Html, <<"<th>cpus_used</th><td><span class=\"n\">1.25</span></td>">>)),
    ?assert(has(Html, <<"<th>findings</th><td>warning busy_wait, info other</td>">>)),
    ?assertNot(has(Html, <<"lots">>)).

render_depth_test() ->
    %% Tables inside cells only near the top: deeper, a cell holds a term.
    Rows = [#{n => 1, sub => #{a => [x, #{}]}}],
    Top = iolist_to_binary(beamdiag_html_table:render(Rows, 0)),
    Deeper = iolist_to_binary(beamdiag_html_table:render(Rows, 2)),
    ?assert(has(Top, <<"<div class=\"inner\">">>)),
    ?assertNot(has(Deeper, <<"<div class=\"inner\">">>)),
    ?assert(has(Deeper, <<"<code>#{a =&gt; [x,#{}]}</code>">>)).
