%%% @doc Text for the HTML report: every string the page shows as text (as
%%% opposed to its own markup) goes through here. `escape/1' escapes for
%%% element content and quoted attributes (through `beamdiag_safe_text:xml/1':
%%% invalid UTF-8 and control characters other than newline and tab become
%%% U+FFFD); `bounded/2' cuts long text and keeps the whole of it (bounded)
%%% in a tooltip; numbers print in the report's one float format.
%%%
%%% ```
%%% 1> iolist_to_binary(beamdiag_html_text:escape(<<"<b>&">>)).
%%% <<"&lt;b&gt;&amp;">>
%%% 2> iolist_to_binary(beamdiag_html_text:bounded(<<"abcdef">>, 3)).
%%% <<"<span title=\"abcdef\">abc&hellip;</span>">>
%%% 3> beamdiag_html_text:float_text(0.00012).
%%% "1.2e-4"
%%% '''
-module(beamdiag_html_text).

-export([escape/1, bounded/1, bounded/2, chars/1, compact/1, float_text/1]).

%% The longest text shown in full, in a cell or a tooltip.
-define(MAX_TEXT, 4000).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Text HTML-escaped, for element content and quoted attributes;
%% atoms by their name, integers in decimal, floats as `float_text/1'.
-spec escape(term()) -> iodata().
escape(X) when is_atom(X) -> escape(atom_to_binary(X));
escape(X) when is_integer(X) -> integer_to_list(X);
escape(X) when is_float(X) -> float_text(X);
escape(X) -> beamdiag_safe_text:xml(chars(X)).

%% @doc As `bounded/2', at the longest text the report shows in full
%% (4000 characters).
-spec bounded(term()) -> iodata().
bounded(T) ->
    bounded(T, ?MAX_TEXT).

%% @doc Text escaped and cut to `Max' characters, with an ellipsis; the
%% whole text (up to 4000 characters) then goes in a `title' tooltip.
-spec bounded(term(), non_neg_integer()) -> iodata().
bounded(T, Max) ->
    S = chars(T),
    case length(S) > Max of
        true -> ["<span title=\"", escape(lists:sublist(S, ?MAX_TEXT)), "\">",
                 escape(lists:sublist(S, Max)), "&hellip;</span>"];
        false -> escape(S)
    end.

%% @doc The characters of a binary (UTF-8; a byte that is not becomes
%% U+FFFD), a character list, an atom or a number (as `escape/1' writes
%% it); any other term printed as by `compact/1'.
-spec chars(term()) -> string().
chars(B) when is_binary(B) -> beamdiag_safe_text:chars(B, 16#FFFD);
chars(A) when is_atom(A) -> atom_to_list(A);
chars(N) when is_integer(N) -> integer_to_list(N);
chars(F) when is_float(F) -> float_text(F);
chars(L) when is_list(L) ->
    try unicode:characters_to_list(L) of
        R when is_list(R) -> R;
        _ -> compact(L)
    catch
        _:_ -> compact(L)
    end;
chars(Other) -> compact(Other).

%% @doc Any term printed on one line (`~0tp'), bounded to 1000 characters.
-spec compact(term()) -> string().
compact(V) ->
    lists:flatten(io_lib:format("~0tp", [V], [{chars_limit, 1000}])).

%% @doc A float in the report's format: "0" for zero; below 0.001 in
%% scientific notation with 2 significant digits ("1.2e-4"), from a million
%% with 4 ("1.235e+7"); otherwise up to four decimals ("0.1235", "2.0").
-spec float_text(float()) -> string().
float_text(F) when F == 0 -> "0";
float_text(F) when abs(F) < 0.001 -> fmt("~.2e", [F]);
float_text(F) when abs(F) >= 1.0e6 -> fmt("~.4e", [F]);
float_text(F) -> float_to_list(F, [{decimals, 4}, compact]).

%%%===================================================================
%%% Internal
%%%===================================================================

fmt(F, A) -> lists:flatten(io_lib:format(F, A)).
