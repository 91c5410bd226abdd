%%% Hostile text (terminal escapes, control characters, invalid UTF-8,
%%% markup) through every way text reaches a user: `beamdiag_cli:emit/3'
%%% (standard output, colour or not, and a file), the experiment text, the
%%% flame command's printed summary, the SVG flame graph and the HTML
%%% escaper. Each test first checks that the hostile text reached the
%%% output (as `?' or escaped), then that nothing raw did.
-module(beamdiag_hostile_text_tests).

-include_lib("eunit/include/eunit.hrl").

%% Clear screen and home, a window title (OSC ... BEL), a colour code, C0
%% and C1 controls, DEL, invalid UTF-8, markup and a CDATA end.
hostile() ->
    <<"\e[2J\e[H", "\e]0;pwned", 7, "\e[31mred", 0, 8, "\r", 127, 16#9b/utf8, "[1m",
      255, 16#C0, 16#80, "<script>alert(1)</script>", "]]>">>.

emit_plain_test() ->
    {0, Out, _} = emit(hostile(), #{}, false),
    terminal_safe(Out),
    no_escape(Out),
    %% The text is there, made harmless: ESC as '?', markup as it was.
    ?assertMatch({_, _}, binary:match(Out, <<"?[2J?[H?]0;pwned??[31mred">>)),
    ?assertMatch({_, _}, binary:match(Out, <<"<script>alert(1)</script>]]>">>)).

%% On a colour terminal the formatter's colour codes stay and every other
%% escape is cut at its ESC. (A hostile colour code looks like the
%% formatter's and stays too: it can only colour text.)
emit_colour_test() ->
    {0, Out, _} = emit([<<"\e[1;31mCRITICAL\e[0m ">>, hostile()], #{}, true),
    terminal_safe_but_sgr(Out),
    ?assertMatch({_, _}, binary:match(Out, <<"\e[1;31mCRITICAL\e[0m ">>)),
    ?assertEqual(nomatch, binary:match(Out, <<"\e[2J">>)),
    ?assertEqual(nomatch, binary:match(Out, <<"\e]">>)),
    ?assertMatch({_, _}, binary:match(Out, <<"?[2J?[H?]0;pwned?">>)).

emit_file_test() ->
    File = filename:join(tmp_dir(), "hostile.txt"),
    {0, <<>>, Err} = emit(hostile(), #{out => File}, true),
    ?assertMatch({_, _}, binary:match(Err, <<"written to">>)),
    {ok, Bin} = file:read_file(File),
    ok = file:delete(File),
    ok = file:del_dir(filename:dirname(File)),
    terminal_safe(Bin),
    no_escape(Bin),
    ?assertMatch({_, _}, binary:match(Bin, <<"?[2J">>)).

%% A clean report (a JSON document, say) comes out byte for byte.
emit_clean_is_unchanged_test() ->
    Json = <<"{\"node\":\"n\\u001b@h\",\"name\":\"caf\xc3\xa9\"}\n">>,
    {0, Out, _} = emit(Json, #{}, false),
    ?assertEqual(Json, Out).

%% Workloads and flags from a saved results file (beamdiag report reads
%% them) or the command line.
experiment_text_test() ->
    R = experiment(hostile(), [<<"+sbwt none ">>, hostile()]),
    Text = unicode:characters_to_binary(beamdiag_format_experiment:text(R)),
    ?assert(is_binary(Text)),
    terminal_safe(Text),
    no_escape(Text),
    ?assertMatch({_, _}, binary:match(Text, <<"A  ?[2J?[H?]0;pwned??[31mred">>)),
    ?assertMatch({_, _}, binary:match(Text, <<"flags: +sbwt none , concurrency 4">>)),
    ?assertMatch({_, _}, binary:match(Text, <<"B  ?[2J?[H?]0;pwned??[31mred">>)),
    %% Through the command's output path as well.
    {0, Out, _} = emit(beamdiag_format_experiment:text(R), #{}, false),
    terminal_safe(Out).

%% Function names from perf and findings' text from the rules, printed by
%% `beamdiag flame' and written to top.txt.
flame_summary_test() ->
    P = hostile_profile(),
    Findings = [#{id => hostile, severity => warning, title => hostile(),
                  evidence => [hostile(), <<"two\nlines">>], fix => [<<"fix ">>, hostile()]}],
    Text = beamdiag_cli_flame:report(#{profile => P, findings => Findings, method => perf}, #{}),
    terminal_safe(Text),
    no_escape(Text),
    %% The hostile frame is in the native table (folding made its ';' a
    %% '_'), the finding below.
    ?assertMatch({_, _}, binary:match(Text, <<"evil?[2J?]0_x?<script>]]>?">>)),
    ?assertMatch({_, _}, binary:match(Text, <<"[warning] ?[2J?[H">>)),
    ?assertMatch({_, _}, binary:match(Text, <<"    - two?lines\n">>)).

%% The same names in the SVG: escaped once, by the one XML escaper, and
%% the document is well-formed.
flame_svg_test() ->
    Svg = iolist_to_binary(beamdiag_format_flamegraph:svg(hostile_profile(),
                                                          #{title => hostile()})),
    ?assertEqual(nomatch, binary:match(Svg, <<"<script>alert">>)),
    %% (The SVG's own script ends its CDATA section; a name does not.)
    ?assertEqual(nomatch, binary:match(Svg, <<"<script>]]>">>)),
    ?assertEqual(nomatch, binary:match(Svg, <<"\e">>)),
    ?assertMatch({_, _}, binary:match(Svg, <<"&lt;script&gt;alert(1)&lt;/script&gt;]]&gt;">>)),
    ?assertMatch({_, _}, binary:match(Svg, <<"evil\xef\xbf\xbd[2J">>)),
    {_, Rest} = xmerl_scan:string(binary_to_list(Svg), [{quiet, true}]),
    ?assertEqual([], string:trim(Rest)).

html_escape_test() ->
    H = beamdiag_format_html:escape(hostile()),
    ?assertEqual(H, beamdiag_safe_text:xml(hostile())),
    ?assertEqual(nomatch, binary:match(H, <<"<">>)),
    ?assertEqual(nomatch, binary:match(H, <<"]]>">>)),
    ?assertEqual(nomatch, binary:match(H, <<"\e">>)),
    ?assertMatch({_, _}, binary:match(H, <<"&lt;script&gt;">>)),
    ?assert(is_list(unicode:characters_to_list(H))).

%%%===================================================================
%%% Helpers
%%%===================================================================

emit(Text, Opts, Colour) ->
    _ = beamdiag_test_lib:collect_io(),
    Code = beamdiag_cli:emit(Text, Opts, (beamdiag_test_lib:capture_io())#{colour => Colour}),
    {Out, Err} = beamdiag_test_lib:collect_io(),
    {Code, Out, Err}.

%% Valid UTF-8 without a control character but the newline.
terminal_safe(Bin) ->
    Chars = unicode:characters_to_list(Bin),
    ?assert(is_list(Chars)),
    ?assertEqual([], [C || C <- Chars, C =/= $\n, C < 32 orelse (C >= 127 andalso C =< 159)]).

%% The same, but colour codes (ESC [ digits/semicolons m) allowed.
terminal_safe_but_sgr(Bin) ->
    terminal_safe(re:replace(Bin, <<"\e\\[[0-9;]*m">>, <<>>, [global, {return, binary}])).

no_escape(Bin) ->
    ?assertEqual(nomatch, binary:match(Bin, <<"\e">>)).

hostile_profile() ->
    Name = <<"evil", "\e[2J", "\e]0;x", 7, "<script>]]>", 255>>,
    Script = iolist_to_binary(
               [[<<"1_scheduler 20404  1245.6", (integer_to_binary(I))/binary,
                   ":   10309278 cpu-clock: \n",
                   "\t          1f8d8f ">>, Name, <<" (/usr/lib/erlang/erts-13.1.5/bin/beam.smp)\n",
                   "\t          1ab0b1 process_main (/usr/lib/erlang/erts-13.1.5/bin/beam.smp)\n",
                   "\tffffffffffffffff [unknown] ([unknown])\n\n">>]
                || I <- lists:seq(10, 30)]),
    {ok, P} = beamdiag_fold:fold_binary(Script, #{}),
    P.

experiment(Workload, [V1, V2]) ->
    Run = fun(Arm, N, T) ->
              #{arm => Arm, run => N, throughput => T, cpu_us_per_unit => 2.0, cpus_used => 1.0,
                sched_util => 0.5, p50_us => 10, p99_us => 20, p999_us => 30}
          end,
    #{kind => experiment,
      arms => [#{index => 1, workload => Workload, variant => V1, concurrency => 4},
               #{index => 2, workload => Workload, variant => V2, concurrency => 4}],
      runs => [Run(1, 1, 100.0), Run(2, 1, 110.0), Run(1, 2, 101.0), Run(2, 2, 111.0)],
      settings => #{runs => 2, duration => 1.0, warmup => 0.0, bootstrap => 200}}.

tmp_dir() ->
    Dir = filename:join(["/tmp", "beamdiag_hostile_" ++ os:getpid()]),
    ok = filelib:ensure_dir(filename:join(Dir, "x")),
    Dir.
