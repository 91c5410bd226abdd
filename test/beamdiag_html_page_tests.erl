%%% The HTML report's page: the skeleton around the sections, the policy
%%% that keeps it offline, the embedded data and the assets from priv/.
-module(beamdiag_html_page_tests).

-include_lib("eunit/include/eunit.hrl").

page(Sections, Data) ->
    iolist_to_binary(beamdiag_html_page:document("the <title>", "<header>HEAD</header>\n",
                                                 Sections, Data)).

count(Html, Pat) -> length(binary:matches(Html, Pat)).

pos(Html, Pat) ->
    {P, _} = binary:match(Html, Pat),
    P.

skeleton_test() ->
    Html = page([{"one", "First", "<p>1</p>"}, {"two", "Second", ["<p>", "2", "</p>"]}], #{}),
    ?assertMatch(<<"<!DOCTYPE html>\n<html lang=\"en\">\n", _/binary>>, Html),
    ?assertEqual(<<"</body>\n</html>\n">>, binary:part(Html, byte_size(Html), -16)),
    %% The title is markup: the caller escapes it.
    ?assertEqual(1, count(Html, <<"<title>the <title></title>">>)),
    %% The header, then one link per section, then the sections, in order.
    ?assert(pos(Html, <<"<body>\n<header>HEAD</header>\n<nav>">>) > 0),
    ?assertEqual(1, count(Html, <<"<nav><a href=\"#one\">First</a>"
                                  "<a href=\"#two\">Second</a></nav>">>)),
    One = pos(Html, <<"<section id=\"one\">\n<h2>First</h2>\n<p>1</p></section>\n">>),
    Two = pos(Html, <<"<section id=\"two\">\n<h2>Second</h2>\n<p>2</p></section>\n">>),
    ?assert(pos(Html, <<"</nav>\n<main>\n">>) < One),
    ?assert(One < Two),
    ?assert(Two < pos(Html, <<"</main>\n<footer>beamdiag ">>)).

no_sections_test() ->
    Html = page([], #{}),
    ?assertEqual(1, count(Html, <<"<nav></nav>\n<main>\n</main>">>)),
    ?assertEqual(0, count(Html, <<"<section">>)).

offline_policy_test() ->
    Html = page([], #{}),
    ?assertEqual(1, count(Html, <<"<meta http-equiv=\"Content-Security-Policy\" "
                                  "content=\"default-src 'none'; ">>)),
    ?assertEqual(0, count(Html, <<" src=\"http">>)),
    ?assertEqual(0, count(Html, <<" href=\"http">>)).

data_test() ->
    Html = page([], #{kind => result, n => 3}),
    {match, [Json]} = re:run(Html, "<script type=\"application/json\" id=\"beamdiag-data\">"
                                   "([^<]*)</script>", [{capture, all_but_first, binary}]),
    ?assertEqual(#{<<"kind">> => <<"result">>, <<"n">> => 3}, beamdiag_test_json:decode(Json)).

data_cannot_close_its_script_test() ->
    Evil = <<"</script><script>alert(1)</script>&amp;<!--">>,
    Html = page([], #{v => Evil}),
    %% Only the page's own two script elements.
    ?assertEqual(2, count(Html, <<"<script">>)),
    ?assertEqual(2, count(Html, <<"</script>">>)),
    ?assertEqual(0, count(Html, <<"<!--">>)),
    {match, [Json]} = re:run(Html, "id=\"beamdiag-data\">(.*?)</script>",
                             [{capture, all_but_first, binary}]),
    ?assertEqual(nomatch, binary:match(Json, [<<"<">>, <<">">>, <<"&">>])),
    %% The string is intact once decoded.
    ?assertEqual(#{<<"v">> => Evil}, beamdiag_test_json:decode(Json)).

assets_test() ->
    Html = page([], #{}),
    Priv = filename:join(beamdiag_test_lib:top(), "priv"),
    {ok, Css} = file:read_file(filename:join(Priv, "report.css")),
    {ok, Js} = file:read_file(filename:join(Priv, "report.js")),
    ?assertEqual(1, count(Html, <<"<style>", Css/binary, "</style>">>)),
    ?assertEqual(1, count(Html, <<"<script>", Js/binary, "</script>\n</body>">>)).

version_test() ->
    _ = application:load(beamdiag),
    {ok, Vsn} = application:get_key(beamdiag, vsn),
    Html = page([], #{}),
    ?assertEqual(1, count(Html, iolist_to_binary(["<footer>beamdiag ", Vsn, " &middot; "]))).
