%%% The folded stacks beamdiag writes load in a standard viewer
%%% (speedscope, installed by scripts/setup.sh), in headless Chromium; a
%%% file that is not folded stacks does not.
-module(beamdiag_folded_SUITE).
-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0, init_per_suite/1, end_per_suite/1]).
-export([speedscope_loads_folded/1, speedscope_refuses_garbage/1, svg_renders/1]).

all() -> [speedscope_loads_folded, speedscope_refuses_garbage, svg_renders].

init_per_suite(Config) ->
    Cache = case os:getenv("BEAMDIAG_CACHE") of false -> "/var/cache/beamdiag"; C -> C end,
    Index = filename:join([Cache, "npm", "node_modules", "speedscope", "dist", "release",
                           "index.html"]),
    case {filelib:is_regular(Index), os:find_executable("chromium")} of
        {true, Chromium} when is_list(Chromium) ->
            [{index, Index}, {chromium, Chromium} | Config];
        _ ->
            beamdiag_test_lib:missing("speedscope (npm) or chromium is not installed")
    end.

end_per_suite(_Config) ->
    ok.

speedscope_loads_folded(Config) ->
    Folded = beamdiag_fold:to_iolist(profile()),
    ?assertEqual(<<"profile.folded - speedscope">>, load(Config, "profile.folded", Folded)).

%% The negative control: speedscope does not take just anything.
speedscope_refuses_garbage(Config) ->
    Title = load(Config, "profile.folded", <<"this is not a profile\n\x00\x01">>),
    ct:log("title: ~ts", [Title]),
    %% speedscope itself refused it (its alert; a crashed browser or a page
    %% that never ran gives no title at all).
    ?assertMatch(<<"alert: ", _/binary>>, Title).

%% The SVG flamegraph renders: Chromium draws its frames.
svg_renders(Config) ->
    Priv = ?config(priv_dir, Config),
    Svg = filename:join(Priv, "flame.svg"),
    ok = file:write_file(Svg, beamdiag_format_flamegraph:svg(profile(), #{title => "fixture"})),
    Dom = chromium(Config, ["--dump-dom", "file://" ++ Svg]),
    ?assertNotEqual(nomatch, binary:match(Dom, <<"erts_atom_put">>)),
    Png = filename:join(Priv, "flame.png"),
    _ = chromium(Config, ["--window-size=1200,600", "--screenshot=" ++ Png, "file://" ++ Svg]),
    %% Drawn, not blank: a flame graph's frames, their colours and text
    %% give hundreds of distinct pixel values; an empty page gives one.
    Colours = beamdiag_test_lib:png_colours(Png),
    ct:log("~b distinct colours in the screenshot", [Colours]),
    ?assert(filelib:file_size(Png) > 1000),
    ?assert(Colours >= 16).

%%% Helpers

profile() ->
    Fixture = beamdiag_test_lib:fixture("perf/dwarf_atom_decode.txt"),
    {ok, P} = beamdiag_fold:fold_file(Fixture, #{}),
    P.

%% Loads a file into speedscope the way its own command line does, and
%% returns the page title once it has read it.
load(Config, Name, Bytes) ->
    Priv = ?config(priv_dir, Config),
    Js = filename:join(Priv, "load_" ++ integer_to_list(erlang:unique_integer([positive])) ++ ".js"),
    %% A modal alert (speedscope's answer to a file it cannot read) would
    %% stall headless Chromium: it goes to the title instead.
    ok = file:write_file(Js, ["window.alert = function(m) { document.title = 'alert: ' + m; };\n",
                              "speedscope.loadFileFromBase64(\"", Name, "\", \"",
                              base64:encode(iolist_to_binary(Bytes)), "\")"]),
    Url = "file://" ++ ?config(index, Config) ++ "#localProfilePath=" ++ Js,
    Dom = chromium(Config, ["--allow-file-access-from-files", "--virtual-time-budget=5000",
                            "--dump-dom", Url]),
    case re:run(Dom, "<title>([^<]*)</title>", [{capture, all_but_first, binary}]) of
        {match, [T]} -> T;
        nomatch -> <<>>
    end.

%% Bounded: a browser that hangs is killed after 60 s.
chromium(Config, Args) ->
    Port = open_port({spawn_executable, os:find_executable("timeout")},
                     [{args, ["60", ?config(chromium, Config), "--headless=new", "--no-sandbox", "--log-level=3",
                              "--disable-gpu" | Args]},
                      exit_status, binary]),
    case beamdiag_test_lib:read_port(Port, 90000) of
        {0, Out} -> Out;
        {S, Out} -> error({chromium_failed, S, Out})
    end.
