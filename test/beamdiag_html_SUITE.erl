%%% The HTML report in a real browser: every ledger lab scenario is
%%% diagnosed, rendered, opened in headless Chromium, checked for console
%%% errors and drawn charts, and screenshotted into the test's log
%%% directory. A capture full of hostile strings must render without running
%%% any of them.
-module(beamdiag_html_SUITE).

-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0, suite/0, init_per_suite/1, end_per_suite/1]).
-export([ledger_scenarios/0, ledger_scenarios/1, hostile_strings/1, generic_results/1,
         cluster_report/1]).

-define(WINDOW_S, 3).

suite() ->
    [{timetrap, {minutes, 5}}].

all() ->
    [hostile_strings, generic_results, cluster_report, ledger_scenarios].

init_per_suite(Config) ->
    case os:find_executable("chromium") of
        false ->
            ct:fail("chromium is not installed (scripts/setup.sh test installs it)");
        Exe ->
            [{chromium, Exe} | Config]
    end.

end_per_suite(_Config) ->
    ok.

%%%===================================================================
%%% Cases
%%%===================================================================

%% Each ledger scenario: diagnose a lab node for a short window, render the
%% report, open it in Chromium. Nine nodes, nine windows and eighteen
%% browser runs one after the other: on a busy 2-core host that took over
%% the suite's five minutes (a cold run timed out), so this case has ten.
ledger_scenarios() ->
    [{timetrap, {minutes, 10}}].

ledger_scenarios(Config) ->
    Results = [scenario(S, Config) || S <- beamdiag_lab_ledger:scenarios()],
    ct:pal("scenarios: ~p", [Results]),
    Failed = [R || {_, {failed, _}} = R <- Results],
    Rendered = [N || {N, {ok, _}} <- Results],
    Skipped = [{N, Why} || {N, {skipped, Why}} <- Results],
    ?assertEqual([], Failed),
    %% Every scenario renders; only a quota scenario may be skipped, on a
    %% machine without a writable cgroup hierarchy, and never in CI.
    ?assertEqual(length(Results), length(Rendered) + length(Skipped)),
    case Skipped of
        [] -> {comment, io_lib:format("~b scenarios rendered", [length(Rendered)])};
        _ -> beamdiag_test_lib:missing(io_lib:format("a writable cgroup hierarchy: ~p", [Skipped]))
    end.

%% Node, thread, table and lock names, evidence, settings and a profile SVG
%% with markup, quotes, newlines and huge lengths: nothing of it runs.
hostile_strings(Config) ->
    {ok, D0} = beamdiag:diagnose(#{duration => 1, interval => 250}),
    D = hostile(D0),
    Html = iolist_to_binary(beamdiag_format_html:diagnosis(D)),
    %% Only the report's own two script elements, no image, no handler.
    ?assertEqual(2, count(Html, <<"<script">>)),
    ?assertEqual(2, count(Html, <<"</script">>)),
    ?assertEqual(0, count(Html, <<"<img">>)),
    ?assertEqual(0, count(Html, <<"<iframe src">>)),
    %% Every < in the page is the report's own: with the (double-quoted,
    %% escaped) attribute values taken out, no tag carries a handler.
    Tags = re:replace(Html, "\"[^\"]*\"", "\"\"", [global, {return, binary}]),
    ?assertEqual(nomatch, re:run(Tags, "<[^<>]*\\son[a-z]+\\s*=", [caseless])),
    %% The flamegraph frame is sandboxed and its markup attribute-escaped.
    ?assertEqual(1, count(Html, <<"sandbox=\"allow-scripts\"">>)),
    #{dom := Dom, rendered := N} = browse(<<"hostile">>, Html, Config),
    ?assert(N >= 3),
    ?assertEqual(0, count(Dom, <<"data-pwned=\"">>)),
    ok.

%% A cluster of 200 nodes, one busy and one with a hostile name: a chart
%% per figure, one bar per node, the busy node's bars marked as outliers,
%% and no name runs as markup.
cluster_report(Config) ->
    rand:seed(exsss, {3, 2, 1}),
    Row = fun(Name, Busy) ->
              J = fun(S) -> S * rand:uniform() end,
              #{row => #{node => Name, window_start_ms => 0, window_s => 4.0, complete => true,
                         cpus_used => 0.01 + J(0.01) + Busy, busy => 0.02 + J(0.01) + Busy * 0.8,
                         on_cpu => 0.01 + J(0.01) + Busy * 0.7, spin => J(0.01), runq => J(0.02),
                         sys => J(0.01), blocked => 0.0, reductions_per_s => 2.0e4 + J(2.0e3),
                         findings => [], top_process => null},
                findings => []}
          end,
    Evil = <<"<img src=x onerror=\"document.body.dataset.pwned=1\">@h">>,
    Results = [Row(iolist_to_binary(["n", integer_to_list(I), "@h"]), 0.0) || I <- lists:seq(1, 198)]
        ++ [Row(Evil, 0.0), Row(<<"busy@h">>, 1.0)],
    A = beamdiag_cluster_analysis:analyse(Results),
    C = A#{schema => <<"beamdiag.cluster/2">>, seed => null, source => list,
           members => [N || #{node := N} <- maps:get(nodes, A)], window_s => 4.0,
           windows => #{first_start_ms => 0, start_spread_s => 0.3, overlap_s => 3.7},
           errors => [#{node => <<"gone@h">>, message => <<"cannot reach it">>}]},
    Html = iolist_to_binary(beamdiag_format_html:cluster(C)),
    #{dom := Dom, rendered := N} = browse(<<"cluster">>, Html, Config),
    ?assertEqual(8, N),
    ?assertEqual(200 * 8, count(Dom, <<"data-node=\"">>)),
    %% The busy node is an outlier on busy, on-CPU and CPUs: its bars are marked.
    ?assert(count(Dom, <<"class=\"outlier\"">>) >= 3),
    ?assertEqual(0, count(Dom, <<"data-pwned=\"">>)),
    ok.

%% compare/1 and experiment/1 take whatever maps their producers return.
generic_results(Config) ->
    Result = #{
        runs => 3,
        metrics => #{busy_share => #{a => 0.12, b => 0.34, delta => 0.22, noise => 0.01},
                     spin_share => #{a => 0.5, b => 0.01, delta => -0.49, noise => 0.02}},
        variants => [#{name => <<"+sbwt none">>, cpu => 1.5, throughput => 1000},
                     #{name => <<"<b>default</b>">>, cpu => 2.5, extra => [1, 2, 3]}],
        verdict => <<"variant b uses less CPU & keeps throughput \"within noise\"">>,
        odd => {tuple, self(), make_ref()},
        nested => #{a => #{b => #{c => #{d => #{e => #{f => #{g => #{h => 1}}}}}}}},
        empty => #{},
        findings => [beamdiag_finding:new(busy_wait, warning, [<<"<i>x</i>">>], #{s => 1.0})]
    },
    C = iolist_to_binary(beamdiag_format_html:compare(Result)),
    E = iolist_to_binary(beamdiag_format_html:experiment(Result#{extra => [a, <<"b">>, 3]})),
    ?assertEqual(0, count(C, <<"<b>default">>)),
    ?assertEqual(0, count(C, <<"<i>x">>)),
    #{errors := 0} = browse(<<"compare">>, C, Config),
    #{errors := 0} = browse(<<"experiment">>, E, Config),
    real_compare(Config).

%% What beamdiag_compare really returns: the module is part of the build.
real_compare(Config) ->
    {module, beamdiag_compare} = code:ensure_loaded(beamdiag_compare),
    ?assert(erlang:function_exported(beamdiag_compare, compare, 2)),
    {ok, A} = beamdiag:diagnose(#{duration => 1, interval => 200}),
    {ok, B} = beamdiag:diagnose(#{duration => 1, interval => 200}),
    R = beamdiag_compare:compare(A, B),
    Html = iolist_to_binary(beamdiag_format_html:compare(R)),
    #{errors := 0} = browse(<<"compare_real">>, Html, Config),
    ok.

%%%===================================================================
%%% Internal
%%%===================================================================

scenario(#{name := Name}, Config) ->
    T0 = erlang:monotonic_time(millisecond),
    case beamdiag_lab:start(Name, #{duration => 30}) of
        {ok, Lab} ->
            try
                Res = beamdiag:diagnose(beamdiag_lab:node(Lab),
                                        #{cookie => beamdiag_lab:cookie(Lab),
                                          duration => ?WINDOW_S}),
                case Res of
                    {ok, D} ->
                        Html = beamdiag_format_html:diagnosis(D),
                        B = browse(atom_to_binary(Name), iolist_to_binary(Html), Config),
                        #{rendered := N, charts := Charts} = B,
                        %% Ledger charts per type, CPU, msacc: at least 3, and
                        %% every chart box the page made holds an SVG.
                        case N >= 3 andalso N =:= Charts of
                            true ->
                                {Name, {ok, #{charts => N,
                                              ms => erlang:monotonic_time(millisecond) - T0}}};
                            false ->
                                {Name, {failed, {charts, N, Charts}}}
                        end;
                    {error, {M, R}} ->
                        {Name, {failed, iolist_to_binary(M:format_error(R))}}
                end
            catch
                Class:Reason:St ->
                    {Name, {failed, {Class, Reason, St}}}
            after
                beamdiag_lab:stop(Lab)
            end;
        {error, {beamdiag_lab, {cgroup, _} = R}} ->
            %% Quota scenarios need a writable cgroup hierarchy.
            {Name, {skipped, iolist_to_binary(beamdiag_lab:format_error(R))}};
        {error, {M, R}} ->
            {Name, {failed, iolist_to_binary(M:format_error(R))}}
    end.

%% Writes the page, opens it twice in headless Chromium (a screenshot, then
%% the DOM after the scripts ran), fails on any console message or script
%% error, and returns what it found.
browse(Name, Html, Config) ->
    Chromium = ?config(chromium, Config),
    Dir = ?config(priv_dir, Config),
    File = filename:join(Dir, <<Name/binary, ".html">>),
    Png = filename:join(Dir, <<Name/binary, ".png">>),
    ok = file:write_file(File, Html),
    Url = "file://" ++ unicode:characters_to_list(File),
    Profile = filename:join(Dir, "chromium-profile"),
    Common = ["--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
              "--user-data-dir=" ++ Profile, "--enable-logging=stderr", "--v=0"],
    {_, ShotErr} = chromium(Chromium, Common ++ ["--window-size=1280,2400",
                                                 "--screenshot=" ++ unicode:characters_to_list(Png),
                                                 Url]),
    {Dom, DomErr} = chromium(Chromium, Common ++ ["--dump-dom", Url]),
    Console = [L || L <- string:split(<<ShotErr/binary, DomErr/binary>>, <<"\n">>, all),
                   binary:match(L, <<":CONSOLE">>) =/= nomatch],
    ct:log("<a href=\"~ts\">~ts.html</a> <a href=\"~ts\">~ts.png</a>",
           [File, Name, Png, Name]),
    ?assertEqual([], Console),
    {ok, <<137, "PNG", _/binary>> = Shot} = file:read_file(Png),
    ?assert(byte_size(Shot) > 10000),
    Rendered = attr(Dom, <<"data-rendered">>),
    %% The report's script counts its errors in data-errors, set on the
    %% first one: absent means none. The count the page gives is returned.
    Errors = case attr(Dom, <<"data-errors">>) of undefined -> 0; E -> E end,
    ?assertEqual(0, Errors),
    ?assertNotEqual(undefined, Rendered),
    #{dom => Dom, rendered => Rendered, errors => Errors,
      charts => count(Dom, <<"<div class=\"chart\"><h4>">>)}.

%% Chromium's standard output, and its standard error (its log) as a
%% binary; a failed run fails the case.
chromium(Exe, Args) ->
    case beamdiag_test_lib:run_exe(Exe, Args, []) of
        {0, Out, Err} -> {Out, unicode:characters_to_binary(Err)};
        {S, Out, Err} -> ct:fail({chromium_exit, S, Out, Err})
    end.

attr(Dom, Name) ->
    case re:run(Dom, <<Name/binary, "=\"([0-9]+)\"">>, [{capture, all_but_first, binary}]) of
        {match, [N]} -> binary_to_integer(N);
        nomatch -> undefined
    end.

count(Bin, Pat) ->
    length(binary:matches(Bin, Pat)).

%% A diagnosis whose every target string is hostile.
hostile(#{capture := C0}) ->
    Script = <<"<script>document.documentElement.setAttribute('data-pwned','1')</script>">>,
    Img = <<"\"><img src=x onerror=\"document.documentElement.setAttribute('data-pwned','2')\">">>,
    Long = binary:copy(<<"A&<>\"'\n">>, 20000),
    Names = [Script, Img, <<"quote\"s 'and' \\back\\slash\nnew\rline\t\0nul">>, Long,
             <<"</script><script>x()</script>">>, <<255, 254, "bad utf8 <b>">>],
    Samples = [rename_threads(S, Names) || S <- maps:get(samples, C0)],
    Locks = #{window_ns => 1000000000, lock_count => 2,
              locks => [#{class => <<"db_hash_slot">>, id => Script, wait_pct => 50.0,
                          locations => [#{location => Img, tries => 3}]},
                        #{class => Img, id => Long, wait_pct => 1.5}],
              tables => [#{name => Script, owner => Img}]},
    %% The folded stacks the flamegraph is drawn from, with hostile frame
    %% names (the page draws it under the node's hostile name).
    Folded = #{[Script, Img, Long] => 10, [<<"main">>, Script] => 5},
    C = C0#{node => <<Script/binary, "@", Img/binary>>,
            samples => Samples,
            settings => (maps:get(settings, C0))#{sbwt => Img, os => Script, Long => Script},
            notes => [Script, Long]},
    %% The extras go in after the analysis: they are here for the page, not
    %% for the lock and profile rules.
    D0 = beamdiag:analyse(C),
    D = D0#{capture => C#{extras => #{locks => Locks, profile => #{profile => Folded, Script => Img}}}},
    #{ledger := L, findings := F} = D,
    Threads = [T#{name => lists:nth(1 + I rem length(Names), Names)}
               || {I, T} <- lists:enumerate(maps:get(threads, L))],
    Hostile = beamdiag_finding:new(busy_wait, critical, [Script, Img, Long],
                                   #{Script => 1.0, note => Img}),
    D#{ledger => L#{threads => Threads, notes => [Img]}, findings => [Hostile | F]}.

rename_threads(S = #{threads := Th}, Names) when is_map(Th) ->
    S#{threads => maps:map(
        fun(Tid, T = #{name := N}) ->
            case beamdiag_threads:classify(N) of
                {Ty, _} when Ty =:= main; Ty =:= sys; Ty =:= async ->
                    T#{name => lists:nth(1 + Tid rem length(Names), Names)};
                _ -> T
            end
        end, Th)};
rename_threads(S, _) ->
    S.
