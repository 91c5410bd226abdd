%%% The HTML formatter on edge cases that need no browser: escaping, empty
%%% and partial captures, and generic values of every shape.
-module(beamdiag_format_html_tests).

-include_lib("eunit/include/eunit.hrl").

escape_test() ->
    ?assertEqual(<<"&lt;a href=&quot;x&quot;&gt;&amp;&#39;</a>">>,
                 binary:replace(beamdiag_format_html:escape(<<"<a href=\"x\">&'</a>">>),
                                <<"&lt;/a&gt;">>, <<"</a>">>)),
    %% Invalid UTF-8 and control characters become U+FFFD; newlines stay.
    ?assertEqual(<<"a\xef\xbf\xbdb\xef\xbf\xbd\nc">>,
                 beamdiag_format_html:escape(<<"a", 255, "b", 0, "\nc">>)),
    ?assertEqual(<<"ok">>, beamdiag_format_html:escape(ok)),
    ?assertEqual(<<"42">>, beamdiag_format_html:escape(42)).

%% A capture with fewer than two samples still makes a page.
empty_capture_test() ->
    C = #{schema => <<"beamdiag.capture/1">>, node => <<"n@h">>, settings => #{},
          interval_ms => 1000, duration_ms => 1000, wall_start_ms => 0, samples => [],
          extras => #{}, complete => false, notes => [<<"<partial>">>]},
    D = beamdiag:analyse(C),
    Html = iolist_to_binary(beamdiag_format_html:diagnosis(D)),
    ?assertNotEqual(nomatch, binary:match(Html, <<"partial: see the notes">>)),
    ?assertNotEqual(nomatch, binary:match(Html, <<"&lt;partial&gt;">>)),
    ?assertEqual(nomatch, binary:match(Html, <<"<partial>">>)).

generic_shapes_test() ->
    Values = [#{}, [], [1, 2, 3], [#{a => 1}, #{b => <<"<x>">>}], #{a => #{b => 1}, c => #{b => 2}},
              {1.0, 2.0}, {tuple, [nested]}, self(), make_ref(), <<255, 0>>, "a string",
              [a, <<"b">>, 3], #{k => [#{x => [#{y => #{z => 1}}]}]}, 1.0e-9, 1.0e12, -0.5],
    %% Each shape renders to some markup whose elements are all closed.
    [begin
         H = iolist_to_binary(beamdiag_format_html:generic(V, #{})),
         ?assert(byte_size(H) > 0),
         ?assertEqual({V, []}, {V, unclosed(H)})
     end || V <- Values],
    Html = iolist_to_binary(beamdiag_format_html:generic([#{b => <<"<x>">>}], #{})),
    ?assertEqual(nomatch, binary:match(Html, <<"<x>">>)).

%% No string from a result can close a script element.
json_in_script_test() ->
    Html = iolist_to_binary(beamdiag_format_html:compare(#{v => <<"</script><b>&">>})),
    ?assertEqual(2, length(binary:matches(Html, <<"</script>">>))).

%% Element names opened more (or fewer) times than they are closed, void
%% elements aside.
unclosed(Html) ->
    Names = fun(Re) ->
        case re:run(Html, Re, [global, {capture, all_but_first, binary}]) of
            {match, Ms} -> [N || [N] <- Ms];
            nomatch -> []
        end
    end,
    Void = [<<"br">>, <<"hr">>, <<"img">>, <<"input">>, <<"meta">>, <<"col">>, <<"wbr">>],
    Open = [N || N <- Names(<<"<([a-z][a-z0-9]*)[\\s>/]">>), not lists:member(N, Void)],
    Close = Names(<<"</([a-z][a-z0-9]*)\\s*>">>),
    lists:usort((Open -- Close) ++ (Close -- Open)).
