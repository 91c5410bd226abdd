%%% Tests of the flame command's argument spec and report text.
-module(beamdiag_cli_flame_tests).

-include_lib("eunit/include/eunit.hrl").

parse_test() ->
    Spec = beamdiag_cli_flame:spec(),
    {ok, O} = beamdiag_cli:parse(Spec, ["app@host", "--duration", "5", "--erlang",
                                        "--cookie-file", "/c", "--call-graph", "fp"]),
    ?assertMatch(#{node := "app@host", duration := 5, frequency := 97, erlang := true,
                   cookie_file := "/c", call_graph := fp, out := "beamdiag-flame"}, O),
    ?assertMatch({error, {bad_value, "--duration", "0", _}},
                 beamdiag_cli:parse(Spec, ["a@h", "--duration", "0"])),
    ?assertMatch({error, {missing_argument, _}}, beamdiag_cli:parse(Spec, [])),
    Usage = iolist_to_binary(beamdiag_cli:usage(Spec)),
    ?assertMatch({_, _}, binary:match(Usage, <<"--frequency HZ">>)).

report_test() ->
    {ok, P} = beamdiag_fold:fold_file(beamdiag_fold_tests:fixture("dwarf_atom_decode.txt"), #{}),
    F = beamdiag_profile_rules:findings(P, #{}),
    Text = iolist_to_binary(beamdiag_cli_flame:report(#{profile => P, findings => F, method => perf}, #{})),
    [?assertMatch({_, _}, binary:match(Text, K))
     || K <- [<<"150 samples (perf)">>, <<"with an unnamed JIT frame: 0.0%">>,
              <<"cut short by the unwinder before an Erlang or thread-root frame">>,
              <<"Native functions">>,
              <<"binary_to_term decoding atoms">>]].
