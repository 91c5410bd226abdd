%%% Tests of the SVG flame graph: well-formed XML (xmerl), escaping,
%%% bounded size, nothing loaded from outside.
-module(beamdiag_format_flamegraph_tests).

-include_lib("eunit/include/eunit.hrl").
-include_lib("xmerl/include/xmerl.hrl").

parse(Svg) ->
    {Doc, Rest} = xmerl_scan:string(binary_to_list(iolist_to_binary(Svg)), [{quiet, true}]),
    ?assertEqual([], string:trim(Rest)),
    Doc.

fixture_svg_test() ->
    {ok, P} = beamdiag_fold:fold_file(beamdiag_test_lib:fixture("perf/fp_mixed.txt"), #{}),
    Svg = iolist_to_binary(beamdiag_format_flamegraph:svg(P, #{title => <<"node@host">>})),
    Doc = parse(Svg),
    ?assertEqual(svg, Doc#xmlElement.name),
    ?assertMatch({_, _}, binary:match(Svg, <<"$mix:erl_loop/1">>)),
    ?assertMatch({_, _}, binary:match(Svg, <<"<script">>)),
    %% Self-contained: no external references.
    ?assertEqual(nomatch, binary:match(Svg, [<<"href">>, <<"src=">>, <<"@import">>, <<"url(">>])),
    %% Zoom, search (Ctrl-F) and reset are there.
    [?assertMatch({_, _}, binary:match(Svg, K)) || K <- [<<"function zoom">>, <<"function search">>,
                                                         <<"ctrlKey">>, <<"id=\"reset\"">>]].

escaping_test() ->
    Nasty = [<<"<script>alert(1)</script>">>, <<"a&b\"c'd">>, <<"]]>">>, <<"bad\xff\xfeutf8">>,
             <<"ctl\x01\x02">>, <<"$m:'f<x>'/1">>, <<"ünïcödé"/utf8>>],
    Stacks = maps:from_list([{[<<"scheduler">>, N], 10} || N <- Nasty]),
    Svg = iolist_to_binary(beamdiag_format_flamegraph:svg(Stacks, #{title => <<"<t&>">>, subtitle => <<"\x00">>})),
    _ = parse(Svg),
    ?assertEqual(nomatch, binary:match(Svg, <<"<script>alert">>)),
    ?assertMatch({_, _}, binary:match(Svg, <<"&lt;script&gt;alert(1)&lt;/script&gt;">>)).

%% 50,000 stacks take a few seconds to build and draw on a loaded machine:
%% past EUnit's 5 s default, which cancelled the whole module.
bounded_size_test_() ->
    {timeout, 60, fun bounded_size/0}.

bounded_size() ->
    rand:seed(exsss, {4, 5, 6}),
    Stacks = maps:from_list(
        [{[<<"scheduler">> | [integer_to_binary(rand:uniform(1000000)) || _ <- lists:seq(1, 20)]], 1}
         || _ <- lists:seq(1, 50000)]),
    Svg = iolist_to_binary(beamdiag_format_flamegraph:svg(Stacks, #{})),
    %% 50,000 one-sample stacks: each is far narrower than the minimum
    %% width, so only the root frames are drawn.
    ?assert(byte_size(Svg) < 200000),
    _ = parse(Svg).

empty_test() ->
    _ = parse(beamdiag_format_flamegraph:svg(#{}, #{})).

%% The title and the frame names go through the one XML escaper: markup,
%% control characters and invalid UTF-8 come out inert.
escape_test() ->
    Svg = iolist_to_binary(beamdiag_format_flamegraph:svg(#{}, #{title => <<"<&>\"'", 7>>})),
    ?assertMatch({_, _}, binary:match(Svg, <<"&lt;&amp;&gt;&quot;&#39;\xef\xbf\xbd">>)),
    _ = parse(Svg).
