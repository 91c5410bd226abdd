%%% @doc A self-contained interactive SVG flamegraph from folded stacks.
%%%
%%% The SVG carries its own script and style and loads nothing: click a
%%% frame to zoom to it, click the bottom frame or "Reset zoom" to go back,
%%% "Search" (or Ctrl-F) highlights the frames whose name matches and shows
%%% their share. Every name from the profile is XML-escaped by
%%% `beamdiag_safe_text:xml/1'; bytes that are not valid UTF-8 and characters
%%% not allowed in XML become U+FFFD. Frames narrower than
%%% `min_width' pixels are left out (their time stays in the parent), so the
%%% size is bounded whatever the profile.
%%%
%%% ```
%%% 1> {ok, P} = beamdiag_fold:fold_file("perf.script", #{}).
%%% 2> file:write_file("flame.svg", beamdiag_format_flamegraph:svg(P, #{title => <<"node@host">>})).
%%% '''
-module(beamdiag_format_flamegraph).

-export([svg/2]).

-export_type([options/0]).

-type options() :: #{
    title => iodata(),
    width => pos_integer(),
    min_width => number(),
    max_depth => pos_integer(),
    subtitle => iodata()
}.

-define(FRAME_H, 16).
-define(PAD_TOP, 50).
-define(PAD_SIDE, 10).
-define(PAD_BOTTOM, 30).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The flamegraph of a folded profile (`beamdiag_fold:profile()') or a
%% bare map of root-first stacks to counts, as iodata.
-spec svg(beamdiag_fold:profile() | #{[binary()] => pos_integer()}, options()) -> iodata().
svg(#{stacks := Stacks}, Opts) ->
    svg(Stacks, Opts);
svg(Stacks, Opts) when is_map(Stacks) ->
    Width = maps:get(width, Opts, 1200),
    MinW = maps:get(min_width, Opts, 0.5),
    MaxDepth = maps:get(max_depth, Opts, 256),
    Title = maps:get(title, Opts, <<"Flame graph">>),
    Sub = maps:get(subtitle, Opts, <<>>),
    Tree = build(maps:to_list(Stacks), MaxDepth),
    {Total, _} = Tree,
    Usable = Width - 2 * ?PAD_SIDE,
    Scale = case Total of 0 -> 0.0; _ -> Usable / Total end,
    {Rects, Depth} = layout(Tree, <<"all">>, 0, 0, Scale, MinW, Total, [], 0),
    Height = ?PAD_TOP + (Depth + 1) * ?FRAME_H + ?PAD_BOTTOM,
    [
        <<"<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"no\"?>\n">>,
        fmt(
            "<svg version=\"1.1\" width=\"~b\" height=\"~b\" viewBox=\"0 0 ~b ~b\" "
            "xmlns=\"http://www.w3.org/2000/svg\" data-total=\"~b\" data-depth=\"~b\">\n",
            [Width, Height, Width, Height, Total, Depth]),
        style(),
        script(Width, Height),
        fmt("<rect x=\"0\" y=\"0\" width=\"~b\" height=\"~b\" fill=\"#f8f8f8\"/>\n",
                      [Width, Height]),
        fmt("<text class=\"title\" x=\"~b\" y=\"20\">~ts</text>\n",
                      [Width div 2, beamdiag_safe_text:xml(Title)]),
        fmt("<text class=\"sub\" x=\"~b\" y=\"36\">~ts</text>\n",
                      [Width div 2, beamdiag_safe_text:xml(Sub)]),
        fmt("<text id=\"reset\" class=\"btn\" x=\"~b\" y=\"20\">Reset zoom</text>\n",
                      [?PAD_SIDE]),
        fmt("<text id=\"search\" class=\"btn\" x=\"~b\" y=\"20\">Search</text>\n",
                      [Width - ?PAD_SIDE - 60]),
        fmt("<text id=\"matched\" x=\"~b\" y=\"~b\"> </text>\n",
                      [Width - ?PAD_SIDE - 160, Height - 10]),
        fmt("<text id=\"details\" x=\"~b\" y=\"~b\"> </text>\n",
                      [?PAD_SIDE, Height - 10]),
        "<g id=\"frames\">\n",
        [rect(N, C, X, W, D, Total, Height) || {N, C, X, W, D} <- lists:reverse(Rects)],
        "</g>\n</svg>\n"
    ].

%%%===================================================================
%%% Internal
%%%===================================================================

fmt(Format, Args) ->
    unicode:characters_to_binary(io_lib:format(Format, Args)).


%% Tree: {Count, #{Name => Tree}}.
build(Pairs, MaxDepth) ->
    lists:foldl(
        fun({Stack, C}, T) -> insert(lists:sublist(Stack, MaxDepth), C, T) end,
        {0, #{}},
        Pairs
    ).

insert([], C, {N, Kids}) ->
    {N + C, Kids};
insert([F | Rest], C, {N, Kids}) ->
    Child = maps:get(F, Kids, {0, #{}}),
    {N + C, Kids#{F => insert(Rest, C, Child)}}.

layout({Count, Kids}, Name, X, Depth, Scale, MinW, Total, Acc, MaxD) ->
    W = Count * Scale,
    Acc2 = [{Name, Count, X, W, Depth} | Acc],
    Sorted = lists:sort(maps:to_list(Kids)),
    {Acc3, _, MaxD2} = lists:foldl(
        fun({K, Sub = {C, _}}, {A, CX, MD}) ->
            case C * Scale < MinW of
                true ->
                    {A, CX + C * Scale, MD};
                false ->
                    {A2, MD2} = layout(Sub, K, CX, Depth + 1, Scale, MinW, Total, A, MD),
                    {A2, CX + C * Scale, MD2}
            end
        end,
        {Acc2, X, max(MaxD, Depth)},
        Sorted
    ),
    {Acc3, MaxD2}.

rect(Name, Count, X0, W, Depth, Total, Height) ->
    Pct = case Total of 0 -> 0.0; _ -> 100 * Count / Total end,
    E = beamdiag_safe_text:xml(Name),
    X = float(X0 + ?PAD_SIDE),
    Y = Height - ?PAD_BOTTOM - (Depth + 1) * ?FRAME_H,
    fmt(
        "<g class=\"f\" data-x=\"~.2f\" data-w=\"~.2f\" data-d=\"~b\">"
        "<title>~ts (~b samples, ~.2f%)</title>"
        "<rect x=\"~.2f\" y=\"~b\" width=\"~.2f\" height=\"~b\" fill=\"~s\"/>"
        "<text x=\"~.2f\" y=\"~b\">~ts</text></g>\n",
        [X, float(W), Depth, E, Count, float(Pct), X, Y, float(W), ?FRAME_H - 1, colour(Name),
         X + 3, Y + ?FRAME_H - 4, E]).

colour(Name) ->
    V = erlang:phash2(Name, 55),
    case beamdiag_fold:frame_kind(Name) of
        erlang -> fmt("rgb(~b,~b,~b)", [80 + V, 190 + V div 2, 80 + V]);
        kernel -> fmt("rgb(~b,~b,~b)", [90 + V, 140 + V, 220]);
        unknown -> fmt("rgb(~b,~b,~b)", [170 + V, 170 + V, 170 + V]);
        unnamed_jit -> fmt("rgb(~b,~b,~b)", [150 + V, 200 + V div 2, 150 + V]);
        unnamed_native -> fmt("rgb(~b,~b,~b)", [230, 170 + V, 140 + V]);
        native -> fmt("rgb(~b,~b,~b)", [220, 110 + 2 * V, 50 + V])
    end.

style() ->
    <<"<style type=\"text/css\"><![CDATA[\n"
      "text { font-family: Verdana, sans-serif; font-size: 12px; fill: #000; }\n"
      ".title { font-size: 17px; text-anchor: middle; }\n"
      ".sub { text-anchor: middle; fill: #555; }\n"
      ".btn { cursor: pointer; fill: #036; text-decoration: underline; }\n"
      ".f { cursor: pointer; }\n"
      ".f text { font-size: 11px; pointer-events: none; }\n"
      ".f:hover rect { stroke: #000; stroke-width: 0.5; }\n"
      ".hit rect { fill: rgb(230,0,230) !important; }\n"
      ".hide { display: none; }\n"
      "]]></style>\n">>.

script(Width, Height) ->
    [
        "<script type=\"text/ecmascript\"><![CDATA[\n",
        fmt("var W = ~b, H = ~b, FH = ~b, PAD = ~b, BOTTOM = ~b;\n",
                      [Width, Height, ?FRAME_H, ?PAD_SIDE, ?PAD_BOTTOM]),
        <<"
var frames = [], zoomed = null, term = null;
function el(id) { return document.getElementById(id); }
function init() {
  var gs = document.querySelectorAll('g.f');
  for (var i = 0; i < gs.length; i++) {
    var g = gs[i];
    frames.push({g: g, x: +g.getAttribute('data-x'), w: +g.getAttribute('data-w'),
                 d: +g.getAttribute('data-d'), name: g.querySelector('text').textContent,
                 title: g.querySelector('title').textContent});
    g.addEventListener('click', onclick);
    g.addEventListener('mouseover', function (e) {
      el('details').textContent = this.querySelector('title').textContent; });
  }
  el('reset').addEventListener('click', function () { zoom(null); });
  el('search').addEventListener('click', ask);
  window.addEventListener('keydown', function (e) {
    if ((e.ctrlKey || e.metaKey) && e.keyCode === 70) { e.preventDefault(); ask(); }
    if (e.keyCode === 27) { search(null); }
  });
  zoom(null);
}
function onclick(e) {
  for (var i = 0; i < frames.length; i++) {
    if (frames[i].g === this) { zoom(frames[i].d === 0 ? null : frames[i]); return; }
  }
}
function zoom(f) {
  zoomed = f;
  var x0 = f ? f.x : PAD, w0 = f ? f.w : W - 2 * PAD, d0 = f ? f.d : 0;
  var k = (W - 2 * PAD) / w0;
  for (var i = 0; i < frames.length; i++) {
    var fr = frames[i], g = fr.g;
    var inside = fr.x + fr.w > x0 + 0.0001 && fr.x < x0 + w0 - 0.0001;
    var below = f && fr.d < d0;
    if (!inside && !below) { g.classList.add('hide'); continue; }
    g.classList.remove('hide');
    var x = below ? PAD : PAD + (fr.x - x0) * k;
    var w = below ? W - 2 * PAD : fr.w * k;
    var y = H - BOTTOM - (fr.d + 1) * FH;
    var r = g.querySelector('rect'), t = g.querySelector('text');
    r.setAttribute('x', x); r.setAttribute('y', y); r.setAttribute('width', Math.max(w, 0.1));
    r.setAttribute('opacity', below ? 0.5 : 1);
    t.setAttribute('x', x + 3); t.setAttribute('y', y + FH - 4);
    var fit = Math.floor((w - 6) / 7);
    t.textContent = fit < 3 ? '' : (fr.name.length <= fit ? fr.name : fr.name.substring(0, fit - 2) + '..');
  }
}
function ask() {
  var t = window.prompt('Search frames (regular expression):', term || '');
  if (t !== null) { search(t === '' ? null : t); }
}
function search(t) {
  term = t;
  var re = null;
  if (t) { try { re = new RegExp(t); } catch (e) { re = null; } }
  var hits = [];
  for (var i = 0; i < frames.length; i++) {
    var fr = frames[i];
    if (re && re.test(fr.name)) { fr.g.classList.add('hit'); hits.push(fr); }
    else { fr.g.classList.remove('hit'); }
  }
  // Share: widths of matched frames not nested in another match.
  hits.sort(function (a, b) { return a.x - b.x || a.d - b.d; });
  var sum = 0, end = -1;
  for (var j = 0; j < hits.length; j++) {
    if (hits[j].x >= end - 0.0001) { sum += hits[j].w; end = hits[j].x + hits[j].w; }
  }
  el('matched').textContent = re ? 'Matched: ' + (100 * sum / (W - 2 * PAD)).toFixed(2) + '%' : ' ';
}
window.addEventListener('load', init);
]]></script>
">>
    ].
