%%% EUnit tests of beamdiag_safe_text: invalid UTF-8, control characters and
%%% terms of every kind come out as printable text.
-module(beamdiag_safe_text_tests).

-include_lib("eunit/include/eunit.hrl").

chars_test() ->
    ?assertEqual("a?b", beamdiag_safe_text:chars(<<"a", 255, "b">>)),
    ?assertEqual([$a, 16#FFFD, $b], beamdiag_safe_text:chars(<<"a", 255, "b">>, 16#FFFD)),
    %% A sequence cut short at the end.
    ?assertEqual("a?", beamdiag_safe_text:chars(<<"a", 16#E2, 16#82>>)),
    ?assertEqual([$é, 8364], beamdiag_safe_text:chars(<<"é€"/utf8>>)),
    ?assertEqual("node@host", beamdiag_safe_text:chars('node@host')),
    ?assertEqual("42", beamdiag_safe_text:chars(42)),
    ?assertEqual("{a,1}", beamdiag_safe_text:chars({a, 1})),
    %% Chardata lists, deep, with binaries; integers that are not characters.
    ?assertEqual("ab?c?", beamdiag_safe_text:chars(["a", [<<"b", 255>>], $c, -1])),
    ?assertEqual("??", beamdiag_safe_text:chars([16#D800, 16#110000])).

safe_test() ->
    ?assertEqual("a??[2J?b", beamdiag_safe_text:safe(<<"a", 255, 27, "[2J", 16#9b/utf8, "b">>)),
    ?assertEqual("a?b?c", beamdiag_safe_text:safe("a\nb\rc")),
    ?assertEqual("a?", beamdiag_safe_text:safe([$a, 127])),
    ?assertEqual([$é, 8364], beamdiag_safe_text:safe(<<"é€"/utf8>>)),
    ?assertEqual("node", beamdiag_safe_text:safe(<<"node@host">>, 4)),
    ?assertEqual("", beamdiag_safe_text:safe(<<>>, 4)).

terminal_test() ->
    ?assertEqual(<<"one\ntwo ?[31m?\n"/utf8>>,
                 beamdiag_safe_text:terminal([<<"one\ntwo ">>, 27, "[31m", <<255>>, "\n"])),
    ?assertEqual(<<"€"/utf8>>, beamdiag_safe_text:terminal(<<"€"/utf8>>)),
    ?assertEqual(<<"a\rb?c">>, beamdiag_safe_text:terminal(<<"a\rb\tc">>)),
    ?assertEqual(<<"a?b?c\n">>, beamdiag_safe_text:report(<<"a\rb\tc\n">>)).

%% Random bytes: whatever comes in, safe/1 gives printable characters only
%% and terminal/1 valid UTF-8 with no control character but the newline.
random_bytes_test() ->
    S0 = rand:seed_s(exsss, {3, 1, 4}),
    lists:foldl(
        fun(_, S) ->
            {Len, S1} = rand:uniform_s(40, S),
            {Bytes, S2} = lists:mapfoldl(fun(_, Sx) -> rand:uniform_s(256, Sx) end,
                                         S1, lists:seq(1, Len)),
            B = list_to_binary([X - 1 || X <- Bytes]),
            ?assertEqual([], [C || C <- beamdiag_safe_text:safe(B), C < 32 orelse (C >= 127 andalso C =< 159)]),
            T = beamdiag_safe_text:terminal(B),
            Cs = unicode:characters_to_list(T),
            ?assert(is_list(Cs)),
            ?assertEqual([], [C || C <- Cs, C =/= $\n, C =/= $\r,
                                   C < 32 orelse (C >= 127 andalso C =< 159)]),
            S2
        end, S0, lists:seq(1, 500)),
    ok.

cut_test() ->
    ?assertEqual("node@host", lists:flatten(beamdiag_safe_text:cut(<<"node@host">>, 9))),
    ?assertEqual("node@...", lists:flatten(beamdiag_safe_text:cut(<<"node@host!">>, 8))),
    ?assertEqual("node@ho~", lists:flatten(beamdiag_safe_text:cut(<<"node@host!">>, 8, "~"))),
    %% One line, control characters and invalid UTF-8 as '?', before the cut.
    ?assertEqual("?[2J?b...", lists:flatten(beamdiag_safe_text:cut(<<27, "[2J", 255, "bcdefgh">>, 9))),
    ?assertEqual("a?b", lists:flatten(beamdiag_safe_text:cut("a\nb", 10))),
    ?assertEqual("...", lists:flatten(beamdiag_safe_text:cut("abcdef", 2))),
    %% Width counts what a terminal shows: an accent on its letter is one.
    ?assertEqual([$e, 16#301, $x], lists:flatten(beamdiag_safe_text:cut([$e, 16#301, $x], 2, ""))).

xml_test() ->
    ?assertEqual(<<"&lt;a href=&quot;x&quot;&gt;&amp;&#39;&lt;/a&gt;">>,
                 beamdiag_safe_text:xml(<<"<a href=\"x\">&'</a>">>)),
    ?assertEqual(<<"]]&gt;">>, beamdiag_safe_text:xml("]]>")),
    %% Invalid UTF-8, controls (but tab and newline), DEL, C1 and the
    %% characters XML forbids as U+FFFD.
    ?assertEqual(<<"a\xef\xbf\xbdb\xef\xbf\xbd\t\n\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbdc">>,
                 beamdiag_safe_text:xml([<<"a", 255, "b", 27, "\t\n\r">>, 127, 16#9b, 16#FFFE, $c])),
    ?assertEqual(<<"caf\xc3\xa9 \xe2\x82\xac">>, beamdiag_safe_text:xml([$c, $a, $f, $é, $\s, 8364])).

report_colour_test() ->
    ?assertEqual(<<"\e[1;31mX\e[0m ?[2J ?]0;t? ?[">>,
                 beamdiag_safe_text:report(<<"\e[1;31mX\e[0m \e[2J \e]0;t\^G \e[">>, colour)),
    ?assertEqual(<<"?[1;31mX?[0m">>, beamdiag_safe_text:report(<<"\e[1;31mX\e[0m">>, plain)),
    %% Already clean text is returned as it is.
    Clean = <<"ok\ncaf\xc3\xa9\n">>,
    ?assertEqual(Clean, beamdiag_safe_text:report(Clean)),
    ?assertEqual(Clean, beamdiag_safe_text:report([<<"ok\n">>, [$c, $a, $f, $é], "\n"], colour)).
