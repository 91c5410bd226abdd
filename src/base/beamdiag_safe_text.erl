%%% @doc Text that reaches a terminal or a report, in one place.
%%%
%%% Names, arguments and strings come from targets, captures, perf output
%%% and the command line; any of them can hold bytes that are not UTF-8 or
%%% control characters that a terminal would act on. Every module that
%%% prints such text goes through here:
%%%
%%% - `chars/1,2': characters of a binary (UTF-8, each invalid byte
%%%   replaced), a chardata list, an atom, a number or any other term;
%%% - `safe/1,2': one line, every control character (C0, DEL, C1) as `?',
%%%   optionally cut to a number of characters;
%%% - `report/1': a whole multi-line report, newlines kept;
%%% - `report/2': the same, keeping the colour codes (SGR sequences,
%%%   `ESC [ ... m') a formatter put in, every other escape neutralised;
%%% - `terminal/1': the same for standard error, where carriage returns
%%%   (progress lines) are kept too;
%%% - `cut/2,3': one line cut to a width, a marker showing the cut (the one
%%%   cut-to-width of the text formats);
%%% - `xml/1': text escaped for XML and HTML element content and quoted
%%%   attributes (the one escaper of the SVG flame graph and the HTML
%%%   report).
%%%
%%% Target-side modules (`beamdiag_agent*') do not format text for a
%%% terminal and do not call this module.
%%%
%%% ```
%%% 1> beamdiag_safe_text:safe(<<"a", 255, 27, "[2Jb">>).
%%% "a??[2Jb"
%%% 2> beamdiag_safe_text:safe(<<"node@host">>, 4).
%%% "node"
%%% 3> beamdiag_safe_text:cut(<<"a_long_process_name">>, 10).
%%% ["a_long_","..."]
%%% 4> beamdiag_safe_text:xml(<<"<script>">>).
%%% <<"&lt;script&gt;">>
%%% '''
-module(beamdiag_safe_text).

-export([chars/1, chars/2, safe/1, safe/2, report/1, report/2, terminal/1, cut/2, cut/3, xml/1]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The characters of `Text', each byte that is not UTF-8 as `?'.
-spec chars(term()) -> [char()].
chars(Text) ->
    chars(Text, $?).

%% @doc The characters of `Text', each byte that is not UTF-8 (and each
%% integer that is not a character) as `Replacement'. Binaries are read
%% as UTF-8, lists as chardata (integers 0 to 255 are characters), atoms
%% and numbers as written, any other term as `~0tp' writes it.
-spec chars(term(), char()) -> [char()].
chars(B, R) when is_binary(B) -> bin_chars(B, R);
chars(L, R) when is_list(L) -> list_chars(L, R);
chars(A, _) when is_atom(A) -> atom_to_list(A);
chars(I, _) when is_integer(I) -> integer_to_list(I);
chars(F, _) when is_float(F) -> io_lib:format("~p", [F]);
chars(Other, _) -> lists:flatten(io_lib:format("~0tp", [Other])).

%% @doc `Text' as one printable line: control characters become `?'.
-spec safe(term()) -> string().
safe(Text) ->
    [one_line(C) || C <- chars(Text)].

%% @doc `Text' as one printable line of at most `Max' characters.
-spec safe(term(), non_neg_integer()) -> string().
safe(Text, Max) ->
    [one_line(C) || C <- lists:sublist(chars(Text), Max)].

%% @doc A multi-line report ready for a terminal, as UTF-8: newlines stay,
%% every other control character and each byte that is not UTF-8 becomes
%% `?'.
-spec report(unicode:chardata() | iodata()) -> binary().
report(Text) ->
    case clean(Text) of
        {ok, B} -> B;
        dirty -> unicode:characters_to_binary([multi_line(C) || C <- chars(Text)])
    end.

%% @doc A report for a terminal: `plain' as `report/1'; `colour' keeps the
%% colour codes (`ESC [', digits and semicolons, `m') and turns every
%% other escape, and every other control character but the newline, into
%% `?'.
-spec report(unicode:chardata() | iodata(), plain | colour) -> binary().
report(Text, plain) ->
    report(Text);
report(Text, colour) ->
    case clean(Text) of
        {ok, B} -> B;
        dirty -> unicode:characters_to_binary(sgr(chars(Text)))
    end.

%% @doc Messages for standard error, as UTF-8: as `report/1', and carriage
%% returns (which redraw a progress line) stay too.
-spec terminal(unicode:chardata() | iodata()) -> binary().
terminal(Text) ->
    unicode:characters_to_binary([progress(C) || C <- chars(Text)]).

%% @doc `Text' as one printable line of at most `Width' characters, `...'
%% ending a line that was cut.
-spec cut(term(), non_neg_integer()) -> unicode:chardata().
cut(Text, Width) ->
    cut(Text, Width, "...").

%% @doc `Text' as one printable line of at most `Width' characters
%% (grapheme clusters), `Marker' ending a line that was cut.
-spec cut(term(), non_neg_integer(), string()) -> unicode:chardata().
cut(Text, Width, Marker) ->
    S = safe(Text),
    case string:length(S) > Width of
        true -> [string:slice(S, 0, max(0, Width - length(Marker))), Marker];
        false -> S
    end.

%% @doc `Text' escaped for XML and HTML (element content and quoted
%% attributes), as UTF-8: `&', `<', `>', `"' and `'' as references; each
%% byte that is not UTF-8, each control character but tab and newline,
%% and each character XML does not allow as U+FFFD.
-spec xml(term()) -> binary().
xml(Text) ->
    unicode:characters_to_binary([xml_char(C) || C <- chars(Text, 16#FFFD)]).

%%%===================================================================
%%% Internal
%%%===================================================================

%% Text that is already valid UTF-8 with no control byte but the newline
%% (the common case: a JSON document, a clean report) as it is.
clean(Text) ->
    try unicode:characters_to_binary(Text) of
        B when is_binary(B) ->
            case re:run(B, <<"[\\x00-\\x09\\x0b-\\x1f\\x7f]|\\xc2[\\x80-\\x9f]">>,
                        [{capture, none}]) of
                nomatch -> {ok, B};
                match -> dirty
            end;
        _ ->
            dirty
    catch
        error:_ -> dirty
    end.

%% Colour codes stay; any other escape is cut at its ESC.
sgr([27, $[ | T]) ->
    case lists:splitwith(fun(C) -> (C >= $0 andalso C =< $9) orelse C =:= $; end, T) of
        {Params, [$m | Rest]} -> [27, $[, Params, $m | sgr(Rest)];
        _ -> [$? | sgr([$[ | T])]
    end;
sgr([C | T]) ->
    [multi_line(C) | sgr(T)];
sgr([]) ->
    [].

xml_char($&) -> "&amp;";
xml_char($<) -> "&lt;";
xml_char($>) -> "&gt;";
xml_char($") -> "&quot;";
xml_char($') -> "&#39;";
xml_char(C) when C =:= $\n; C =:= $\t -> C;
xml_char(C) when C < 32; C >= 127, C =< 159 -> 16#FFFD;
xml_char(C) when C =:= 16#FFFE; C =:= 16#FFFF -> 16#FFFD;
xml_char(C) -> C.

one_line(C) when C < 32; C >= 127, C =< 159 -> $?;
one_line(C) -> C.

multi_line($\n) -> $\n;
multi_line(C) -> one_line(C).

progress($\r) -> $\r;
progress(C) -> multi_line(C).

bin_chars(B, R) ->
    case unicode:characters_to_list(B) of
        L when is_list(L) -> L;
        {error, Good, <<_, Rest/binary>>} -> Good ++ [R | bin_chars(Rest, R)];
        {incomplete, Good, _} -> Good ++ [R]
    end.

list_chars([], _) -> [];
list_chars([C | T], R) when is_integer(C) -> [char(C, R) | list_chars(T, R)];
list_chars([H | T], R) when is_binary(H); is_list(H) -> chars(H, R) ++ list_chars(T, R);
list_chars([H | T], R) -> chars(H, R) ++ list_chars(T, R);
list_chars(Tail, R) -> chars(Tail, R).

char(C, _) when C >= 0, C < 16#D800 -> C;
char(C, _) when C > 16#DFFF, C =< 16#10FFFF, C =/= 16#FFFE, C =/= 16#FFFF -> C;
char(_, R) -> R.
