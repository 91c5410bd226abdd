%%% The HTML report's text: escaping, bounded text with its tooltip, the
%%% characters of any term, and the float format.
-module(beamdiag_html_text_tests).

-include_lib("eunit/include/eunit.hrl").

-define(FFFD, "\x{FFFD}").

esc(X) -> iolist_to_binary(beamdiag_html_text:escape(X)).

bounded(T, Max) -> iolist_to_binary(beamdiag_html_text:bounded(T, Max)).

escape_markup_test() ->
    ?assertEqual(<<"&lt;script&gt;x(&quot;a&quot;, &#39;b&#39;) &amp; y&lt;/script&gt;">>,
                 esc(<<"<script>x(\"a\", 'b') & y</script>">>)),
    %% Character lists, iolists and atoms are escaped alike.
    ?assertEqual(<<"&lt;i&gt;">>, esc("<i>")),
    ?assertEqual(<<"a&amp;b">>, esc([<<"a">>, "&", $b])),
    ?assertEqual(<<"&lt;atom&gt;">>, esc('<atom>')).

escape_numbers_test() ->
    ?assertEqual(<<"42">>, esc(42)),
    ?assertEqual(<<"-7">>, esc(-7)),
    ?assertEqual(<<"0.5">>, esc(0.5)),
    ?assertEqual(<<"0">>, esc(0.0)).

escape_bad_bytes_test() ->
    %% Invalid UTF-8 and control characters become U+FFFD; newline and tab
    %% stay; valid UTF-8 stays as it is.
    ?assertEqual(unicode:characters_to_binary("a" ?FFFD "b" ?FFFD "\n\tc"),
                 esc(<<"a", 255, "b", 0, "\n\tc">>)),
    ?assertEqual(<<"caf", 16#C3, 16#A9>>, esc(<<"caf", 16#C3, 16#A9>>)).

bounded_short_test() ->
    %% At or under the bound: only escaped, no tooltip.
    ?assertEqual(<<"a&lt;c">>, bounded(<<"a<c">>, 3)),
    ?assertEqual(<<"abc">>, bounded(abc, 10)).

bounded_long_test() ->
    Html = bounded(<<"<abcdef>">>, 3),
    ?assertEqual(<<"<span title=\"&lt;abcdef&gt;\">&lt;ab&hellip;</span>">>, Html).

bounded_tooltip_is_bounded_test() ->
    Long = binary:copy(<<"x">>, 10000),
    Html = bounded(Long, 10),
    {match, [Title]} = re:run(Html, "title=\"(x*)\"", [{capture, all_but_first, binary}]),
    ?assertEqual(4000, byte_size(Title)),
    ?assertMatch({_, _}, binary:match(Html, <<">xxxxxxxxxx&hellip;</span>">>)).

bounded_default_test() ->
    At = binary:copy(<<"y">>, 4000),
    ?assertEqual(At, iolist_to_binary(beamdiag_html_text:bounded(At))),
    Over = <<At/binary, "y">>,
    ?assertMatch({_, _}, binary:match(iolist_to_binary(beamdiag_html_text:bounded(Over)),
                                      <<"&hellip;</span>">>)).

chars_test() ->
    ?assertEqual("abc", beamdiag_html_text:chars(<<"abc">>)),
    ?assertEqual("a" ?FFFD, beamdiag_html_text:chars(<<"a", 255>>)),
    ?assertEqual("ok", beamdiag_html_text:chars(ok)),
    ?assertEqual("12", beamdiag_html_text:chars(12)),
    ?assertEqual("1.5", beamdiag_html_text:chars(1.5)),
    ?assertEqual("ab\x{1F600}", beamdiag_html_text:chars([<<"a">>, [$b], <<"\x{1F600}"/utf8>>])),
    %% Not text: printed as a term.
    ?assertEqual("[-1]", beamdiag_html_text:chars([-1])),
    ?assertEqual("{a,<<\"b\">>}", beamdiag_html_text:chars({a, <<"b">>})).

compact_test() ->
    ?assertEqual("#{a => [1,2]}", beamdiag_html_text:compact(#{a => [1, 2]})),
    Big = beamdiag_html_text:compact(lists:seq(1, 100000)),
    ?assert(length(Big) =< 1100),
    ?assertEqual(nomatch, string:find(Big, "\n")).

float_text_test() ->
    ?assertEqual("0", beamdiag_html_text:float_text(0.0)),
    ?assertEqual("0", beamdiag_html_text:float_text(-0.0)),
    ?assertEqual("1.2e-4", beamdiag_html_text:float_text(0.00012)),
    ?assertEqual("-5.0e-9", beamdiag_html_text:float_text(-5.0e-9)),
    ?assertEqual("1.235e+7", beamdiag_html_text:float_text(12345678.0)),
    ?assertEqual("0.1235", beamdiag_html_text:float_text(0.12345678)),
    ?assertEqual("2.0", beamdiag_html_text:float_text(2.0)),
    ?assertEqual("0.001", beamdiag_html_text:float_text(0.001)),
    ?assertEqual("999999.5", beamdiag_html_text:float_text(999999.5)).
