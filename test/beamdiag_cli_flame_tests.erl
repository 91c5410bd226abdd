%%% Tests of the flame command's argument spec and report text.
-module(beamdiag_cli_flame_tests).

-include_lib("eunit/include/eunit.hrl").

parse_test() ->
    Spec = beamdiag_cli_flame:spec(),
    {ok, O} = beamdiag_cli:parse(Spec, ["app@host", "--duration", "5", "--erlang",
                                        "--cookie-file", "/c", "--call-graph", "fp"]),
    ?assertMatch(#{node := "app@host", duration := 5, frequency := 97, erlang := true,
                   cookie_file := "/c", call_graph := fp, output_dir := "beamdiag-flame"}, O),
    ?assertMatch({error, {bad_value, "--duration", "0", _}},
                 beamdiag_cli:parse(Spec, ["a@h", "--duration", "0"])),
    ?assertMatch({error, {missing_argument, _}}, beamdiag_cli:parse(Spec, [])),
    Usage = iolist_to_binary(beamdiag_cli:usage(Spec)),
    ?assertMatch({_, _}, binary:match(Usage, <<"--frequency HZ">>)),
    ?assertMatch({_, _}, binary:match(Usage, <<"--output-dir DIR">>)),
    ?assertMatch({_, _}, binary:match(Usage, <<"--perf-binary PATH">>)),
    %% The former names are not offered.
    ?assertEqual(nomatch, binary:match(Usage, <<"--out ">>)),
    ?assertEqual(nomatch, binary:match(Usage, <<"--perf ">>)).

%% --out DIR and --perf PATH, the former names, still work for one release,
%% under the new names' keys, with a note on standard error.
former_names_test() ->
    Spec = beamdiag_cli_flame:spec(),
    {ok, O} = beamdiag_cli:parse(Spec, ["a@h", "--out", "/d", "--perf=/usr/bin/perf"]),
    ?assertMatch(#{output_dir := "/d", perf_binary := "/usr/bin/perf"}, O),
    ?assertEqual(false, is_map_key(out, O)),
    ?assertEqual(false, is_map_key(perf, O)),
    {ok, New} = beamdiag_cli:parse(Spec, ["a@h", "--output-dir", "/d",
                                          "--perf-binary", "/usr/bin/perf"]),
    ?assertEqual(New, O),
    %% The note, once per former name, before the command runs (here it
    %% stops at the bad node name).
    {2, _, Err} = beamdiag_test_lib:cli(["flame", "no-at-sign", "--out", "/d", "--perf", "p",
                                          "--cookie-file", "/dev/null"]),
    ?assertMatch({_, _}, binary:match(Err, <<"beamdiag flame: --out is deprecated and goes in the "
                                             "next release; use --output-dir DIR instead\n">>)),
    ?assertMatch({_, _}, binary:match(Err, <<"beamdiag flame: --perf is deprecated and goes in the "
                                             "next release; use --perf-binary PATH instead\n">>)),
    ?assertMatch({_, _}, binary:match(Err, <<"not a node name">>)),
    %% The new names give no note.
    {2, _, Err2} = beamdiag_test_lib:cli(["flame", "no-at-sign", "--output-dir", "/d",
                                           "--cookie-file", "/dev/null"]),
    ?assertEqual(nomatch, binary:match(Err2, <<"deprecated">>)).

report_test() ->
    {ok, P} = beamdiag_fold:fold_file(beamdiag_test_lib:fixture("perf/dwarf_atom_decode.txt"), #{}),
    F = beamdiag_profile_rules:findings(P, #{}),
    Text = iolist_to_binary(beamdiag_cli_flame:report(#{profile => P, findings => F, method => perf}, #{})),
    [?assertMatch({_, _}, binary:match(Text, K))
     || K <- [<<"150 samples (perf)">>, <<"with an unnamed JIT frame: 0.0%">>,
              <<"cut short by the unwinder before an Erlang or thread-root frame">>,
              <<"Native functions">>,
              <<"binary_to_term decoding atoms">>]].

%% The header's advice fits the node: a node that already runs +JPperf
%% true is never told to start with it (DWARF chosen because its emulator
%% names its C functions); one without it is; a missing map on a node
%% with the flag is said as such; with the Erlang-level sampler beside
%% perf, the Erlang callers are pointed at, not a flag.
header_never_advises_a_flag_the_node_has_test() ->
    {ok, P} = beamdiag_fold:fold_file(beamdiag_test_lib:fixture("perf/dwarf_atom_decode.txt"), #{}),
    Target = fun(Flag, Map) -> #{perf_flag => Flag, frame_pointers => Flag =/= none,
                                 perf_map => Map, native_names => true} end,
    Header = fun(Perf) ->
                 iolist_to_binary(beamdiag_format_profile:header(#{profile => P, method => perf,
                                                           perf => Perf}))
             end,
    Has = Header(#{call_graph => dwarf, perf_map => "/tmp/m", target => Target(<<"true">>, "/tmp/m")}),
    ?assertEqual(nomatch, binary:match(Has, <<"+JPperf true and">>)),
    ?assertMatch({_, _}, binary:match(Has, <<"--call-graph fp (the node already runs +JPperf true">>)),
    Lacks = Header(#{call_graph => dwarf, perf_map => missing, target => Target(none, missing)}),
    ?assertMatch({_, _}, binary:match(Lacks, <<"start the node with +JPperf true and use "
                                               "--call-graph fp">>)),
    ?assertMatch({_, _}, binary:match(Lacks, <<"restart it with +JPperf true">>)),
    NoMap = Header(#{call_graph => dwarf, perf_map => missing, target => Target(<<"true">>, missing)}),
    ?assertEqual(nomatch, binary:match(NoMap, <<"restart it with +JPperf true">>)),
    ?assertMatch({_, _}, binary:match(NoMap, <<"although the node runs +JPperf true">>)),
    {ok, C} = beamdiag_fold:fold_file(beamdiag_test_lib:fixture("perf/dwarf_atom_decode.txt"), #{}),
    Sampled = iolist_to_binary(beamdiag_format_profile:header(
                                 #{profile => P, method => perf, callers => C,
                                   perf => #{call_graph => dwarf, perf_map => "/tmp/m",
                                             target => Target(<<"true">>, "/tmp/m")}})),
    ?assertEqual(nomatch, binary:match(Sampled, <<"+JPperf true and">>)),
    ?assertMatch({_, _}, binary:match(Sampled, <<"the Erlang-level sampler beside perf names "
                                                 "them">>)).
