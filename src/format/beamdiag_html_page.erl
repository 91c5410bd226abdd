%%% @doc The HTML report's page: the one self-contained document every
%%% report (diagnosis, cluster, compare, experiment) is drawn in. It holds
%%% a Content-Security-Policy that loads nothing from outside the file
%%% (inline style and script, data: images, the flamegraph's srcdoc
%%% frame), the style sheet, a header, a navigation bar with a link per
%%% section, the sections, a footer with beamdiag's version, the charts'
%%% data as JSON in a `<script type="application/json" id="beamdiag-data">'
%%% element, and the script that draws the charts from it.
%%%
%%% The style sheet and the script are files of their own, priv/report.css
%%% and priv/report.js, read when a page is made. The JSON escapes `<', `>'
%%% and `&', so no string in the data can close its script element.
%%%
%%% The title, header and section bodies are markup: their callers escape
%%% what came from the target (beamdiag_html_text).
%%%
%%% ```
%%% 1> Html = beamdiag_html_page:document("t", "<header>h</header>",
%%%                                       [{"a", "A", "<p>body</p>"}], #{kind => result}).
%%% 2> binary:match(iolist_to_binary(Html), <<"<section id=\"a\">">>) =/= nomatch.
%%% true
%%% '''
-module(beamdiag_html_page).

-export([document/4]).

-export_type([section/0]).

%% A section of the page: its element id (the navigation's link target),
%% its heading and its body, all markup.
-type section() :: {Id :: iodata(), Name :: iodata(), Body :: iodata()}.

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The whole HTML document: `Title' in the title element, `Header'
%% above the navigation, the sections in order, and `Data' (a term
%% `beamdiag_json' encodes) for the charts' script.
-spec document(iodata(), iodata(), [section()], term()) -> iodata().
document(Title, Header, Sections, Data) ->
    [
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n",
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n",
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
        "style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:; "
        "frame-src 'self' about:\">\n",
        "<title>", Title, "</title>\n<style>", css(), "</style>\n</head>\n<body>\n",
        Header,
        "<nav>", [["<a href=\"#", Id, "\">", Name, "</a>"] || {Id, Name, _} <- Sections], "</nav>\n",
        "<main>\n",
        [["<section id=\"", Id, "\">\n<h2>", Name, "</h2>\n", Body, "</section>\n"]
         || {Id, Name, Body} <- Sections],
        "</main>\n<footer>beamdiag ", vsn(), " &middot; this file is self-contained and "
        "opens offline</footer>\n",
        "<script type=\"application/json\" id=\"beamdiag-data\">", json(Data), "</script>\n",
        "<script>", js(), "</script>\n</body>\n</html>\n"
    ].

%%%===================================================================
%%% Internal
%%%===================================================================

%% JSON for a script element: < and > are escaped by the encoder; & too.
json(Data) ->
    binary:replace(iolist_to_binary(beamdiag_json:encode(Data)), <<"&">>, <<"\\u0026">>, [global]).

vsn() ->
    case application:get_key(beamdiag, vsn) of
        {ok, V} -> beamdiag_html_text:escape(V);
        _ -> ""
    end.

%% The report's style sheet and script are files of their own in priv/
%% (linted by `make check'), read when a report is made: from the
%% application's priv directory, or from inside the escript's archive,
%% which `rebar3 escriptize' packs priv into.
css() -> asset("report.css").

js() -> asset("report.js").

asset(Name) ->
    Path = filename:join(priv_dir(), Name),
    case erl_prim_loader:get_file(Path) of
        {ok, Bin, _} -> Bin;
        error -> erlang:error({missing_asset, Path})
    end.

priv_dir() ->
    case code:priv_dir(beamdiag) of
        Dir when is_list(Dir) -> Dir;
        {error, bad_name} -> filename:join(filename:dirname(filename:dirname(code:which(?MODULE))), "priv")
    end.
