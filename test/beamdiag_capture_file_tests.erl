%%% EUnit tests of saved captures: round trip, and clear errors on files
%%% that are truncated, random, of another version, corrupt or too large.
-module(beamdiag_capture_file_tests).

-include_lib("eunit/include/eunit.hrl").

capture_test_() ->
    {setup,
     fun setup/0,
     fun cleanup/1,
     fun(Ctx) ->
         [
             {"round trip", fun() -> round_trip(Ctx) end},
             {"truncated", fun() -> truncated(Ctx) end},
             {"random bytes", fun() -> random_bytes(Ctx) end},
             {"wrong version", fun() -> wrong_version(Ctx) end},
             {"corrupt body", fun() -> corrupt(Ctx) end},
             {"oversized", fun() -> oversized(Ctx) end},
             {"unknown atoms are not created", fun() -> unknown_atom(Ctx) end},
             {"missing file", fun() -> missing(Ctx) end},
             {"experiment is not a diagnosis", fun() -> wrong_kind(Ctx) end},
             {"a profile saved with its drawing is drawn again",
              fun() -> profile_drawn_again(Ctx) end}
         ]
     end}.

setup() ->
    Dir = filename:join(std_tmp(), "beamdiag_capture_tests_" ++ os:getpid()),
    ok = filelib:ensure_path(Dir),
    {ok, D} = beamdiag:diagnose(#{duration => 0.4, interval => 100, msacc => false,
                                  locks => false}),
    File = filename:join(Dir, "a.capture"),
    ok = beamdiag_capture_file:save(File, D),
    {ok, Bin} = file:read_file(File),
    #{dir => Dir, diagnosis => D, file => File, bin => Bin}.

cleanup(#{dir := Dir}) ->
    _ = [file:delete(F) || F <- filelib:wildcard(filename:join(Dir, "*"))],
    _ = file:del_dir(Dir),
    ok.

round_trip(#{diagnosis := D, file := File, bin := Bin}) ->
    ?assertMatch(<<"beamdiag-capture 1\n", _/binary>>, Bin),
    {ok, D2} = beamdiag_capture_file:load(File),
    ?assertEqual(maps:get(capture, D), maps:get(capture, D2)),
    ?assertEqual(maps:get(findings, D), maps:get(findings, D2)),
    ?assertEqual(maps:get(ledger, D), maps:get(ledger, D2)).

truncated(Ctx = #{bin := Bin}) ->
    Half = binary:part(Bin, 0, byte_size(Bin) div 2),
    expect_error(Ctx, "half", Half, truncated),
    expect_error(Ctx, "header", <<"beamdiag-capture 1\n", 0, 0>>, truncated),
    expect_error(Ctx, "empty", <<>>, not_a_capture).

random_bytes(Ctx = #{bin := Bin}) ->
    rand:seed(exsss, {1, 2, 3}),
    Random = rand:bytes(5000),
    expect_error(Ctx, "random", Random, not_a_capture),
    %% A valid header and frame length over random bytes: the checksum
    %% catches it.
    Body = rand:bytes(byte_size(Bin)),
    expect_error(Ctx, "random_body",
                 <<"beamdiag-capture 1\n", (byte_size(Body)):64, 0:32, Body/binary>>, corrupt).

wrong_version(Ctx = #{bin := <<"beamdiag-capture 1\n", Rest/binary>>}) ->
    {error, {beamdiag_capture_file, R}} =
        expect_error(Ctx, "v9", <<"beamdiag-capture 9\n", Rest/binary>>, unsupported_version),
    ?assertMatch({unsupported_version, _, <<"9">>}, R).

corrupt(Ctx = #{bin := Bin}) ->
    Pos = byte_size(Bin) - 10,
    <<Pre:Pos/binary, B, Post/binary>> = Bin,
    expect_error(Ctx, "flipped", <<Pre/binary, (B bxor 16#5a), Post/binary>>, corrupt),
    expect_error(Ctx, "trailing", <<Bin/binary, "xyz">>, trailing_bytes).

oversized(#{dir := Dir}) ->
    File = filename:join(Dir, "big.capture"),
    {ok, F} = file:open(File, [write, raw, binary]),
    {ok, _} = file:position(F, 300 * 1024 * 1024),
    ok = file:write(F, <<0>>),
    ok = file:close(F),
    {error, {beamdiag_capture_file, R}} = beamdiag_capture_file:load(File),
    ?assertMatch({too_large, _, _, _}, R),
    assert_sentence(R),
    ok = file:delete(File).

unknown_atom(Ctx) ->
    Name = <<"beamdiag_capture_tests_no_such_atom_", (integer_to_binary(erlang:unique_integer([positive])))/binary>>,
    %% A body that names an atom directly (as a hostile file would):
    %% refused by [safe], and the atom is not created.
    Body = <<131, 119, (byte_size(Name)), Name/binary>>,
    expect_error(Ctx, "atom", <<"beamdiag-capture 1\n", (byte_size(Body)):64,
                                (erlang:crc32(Body)):32, Body/binary>>, corrupt),
    ?assertError(badarg, binary_to_existing_atom(Name, utf8)),
    %% The encoded form of an unknown atom decodes to a binary.
    ?assertEqual(Name, beamdiag_capture_file:decode({'$a', Name})),
    Term = #{ledger => [true, {'$a', Name}, {1, 2.5, "x"}]},
    ?assertEqual(Term, beamdiag_capture_file:decode(beamdiag_capture_file:encode(Term))),
    ?assertError(badarg, binary_to_existing_atom(Name, utf8)).

missing(#{dir := Dir}) ->
    {error, {beamdiag_capture_file, R}} = beamdiag_capture_file:load(filename:join(Dir, "nope")),
    ?assertMatch({read, _, enoent}, R),
    assert_sentence(R).

wrong_kind(#{dir := Dir, diagnosis := D}) ->
    File = filename:join(Dir, "exp.capture"),
    E = #{kind => experiment, settings => #{bootstrap => 100},
          arms => [#{index => 1}], runs => [#{arm => 1, run => 1, throughput => 1.0,
                                               diagnosis => D}]},
    ok = beamdiag_capture_file:save(File, E),
    {error, {beamdiag_capture_file, R}} = beamdiag_capture_file:load(File),
    ?assertMatch({wrong_kind, _, experiment}, R),
    {ok, {experiment, E2}} = beamdiag_capture_file:read(File),
    ?assertEqual(maps:get(capture, D), maps:get(capture, maps:get(diagnosis, hd(maps:get(runs, E2))))).

%% A capture saved when the flamegraph was drawn at collection time holds
%% the drawing and the profile's summary beside the folded stacks: it loads,
%% keeps only the stacks, and the formats draw and count from those.
profile_drawn_again(#{dir := Dir, diagnosis := D = #{capture := C}}) ->
    {ok, P} = beamdiag_fold:fold_file(beamdiag_test_lib:fixture("perf/dwarf_atom_decode.txt"), #{}),
    Old = #{profile => P, method => perf, by_process => [],
            svg => <<"<svg>drawn when saved</svg>">>, summary => beamdiag_fold:summary(P)},
    File = filename:join(Dir, "old_profile.capture"),
    ok = beamdiag_capture_file:save(File, D#{capture => C#{extras => #{profile => Old}}}),
    {ok, D2 = #{capture := #{extras := #{profile := New}}, findings := F}} =
        beamdiag_capture_file:load(File),
    ?assertEqual(maps:without([svg, summary], Old), New),
    %% The one analysis read the profile.
    ?assertMatch([_ | _], [X || X = #{id := hot_function} <- F]),
    Html = iolist_to_binary(beamdiag_format_html:diagnosis(D2)),
    ?assertEqual(nomatch, binary:match(Html, <<"drawn when saved">>)),
    ?assertMatch({_, _}, binary:match(Html, <<"&lt;svg version=">>)),
    ?assertMatch({_, _}, binary:match(Html, <<"sandbox=\"allow-scripts\"">>)),
    %% The JSON's profile summary is counted from the stacks, as it was saved.
    #{profile := #{summary := S}} = beamdiag_format_json:document(D2),
    ?assertEqual(maps:get(summary, Old), S).

%% Writes Bin, loads it, and checks the error's tag and sentence.
expect_error(#{dir := Dir}, Name, Bin, Tag) ->
    File = filename:join(Dir, Name ++ ".capture"),
    ok = file:write_file(File, Bin),
    Result = beamdiag_capture_file:load(File),
    ?assertMatch({error, {beamdiag_capture_file, _}}, Result),
    {error, {beamdiag_capture_file, R}} = Result,
    ?assertEqual(Tag, element(1, R)),
    assert_sentence(R),
    Result.

assert_sentence(R) ->
    S = lists:flatten(io_lib:format("~ts", [beamdiag_capture_file:format_error(R)])),
    ?assert(length(S) > 10).

std_tmp() ->
    case os:getenv("TMPDIR") of
        false -> "/tmp";
        T -> T
    end.
