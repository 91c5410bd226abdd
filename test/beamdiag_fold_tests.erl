%%% Tests of the perf script folder on real perf captures of BEAM nodes
%%% (test/fixtures/perf) and on generated garbage.
-module(beamdiag_fold_tests).

-include_lib("eunit/include/eunit.hrl").

-export([recount/1, flip/2]).

fixture(Name) ->
    beamdiag_test_lib:fixture(filename:join("perf", Name)).

fold(Name) ->
    fold(Name, #{}).

fold(Name, Opts) ->
    {ok, P} = beamdiag_fold:fold_file(fixture(Name), Opts),
    P.

dwarf_fixture_test() ->
    P = fold("dwarf_atom_decode.txt"),
    S = beamdiag_fold:summary(P),
    ?assertEqual(150, maps:get(samples, S)),
    ?assert(maps:get(unknown_share, S) < 0.05),
    ?assertEqual(0, maps:get(skipped_lines, S)),
    %% Every stack starts with a normalized thread type.
    Types = lists:usort([T || [T | _] <- maps:keys(maps:get(stacks, P))]),
    ?assert(lists:all(fun(T) -> lists:member(T, [<<"scheduler">>, <<"dirty_cpu">>, <<"dirty_io">>,
                                                 <<"aux">>, <<"poll">>, <<"main">>]) end, Types)),
    ?assert(lists:member(<<"scheduler">>, Types)).

folded_text_round_trip_test() ->
    P = fold("dwarf_redis_cache.txt"),
    Text = iolist_to_binary(beamdiag_fold:to_iolist(P)),
    Lines = binary:split(Text, <<"\n">>, [global, trim_all]),
    Counts = [begin
                  [Stack, C] = string:split(L, " ", trailing),
                  ?assertMatch([_, _ | _], binary:split(Stack, <<";">>, [global])),
                  binary_to_integer(C)
              end || L <- Lines],
    ?assertEqual(maps:get(samples, P), lists:sum(Counts)).

fp_unknown_test() ->
    Keep = beamdiag_fold:summary(fold("fp_mixed.txt")),
    Cut = beamdiag_fold:summary(fold("fp_mixed.txt", #{unknown => cut})),
    %% Frame-pointer chains through C code end in unknown addresses...
    ?assert(maps:get(unknown_share, Keep) > 0.1),
    %% ...which the cut mode drops, keeping the leafward part.
    ?assert(maps:get(unknown_share, Cut) < 0.05),
    ?assertEqual(maps:get(samples, Keep), maps:get(samples, Cut)).

fp_erlang_stacks_test() ->
    P = fold("fp_mixed.txt"),
    Erl = [S || S <- maps:keys(maps:get(stacks, P)), lists:member(<<"$mix:erl_loop/1">>, S)],
    ?assertNotEqual([], Erl),
    Top = beamdiag_fold:top(P, #{kind => erlang, limit => 50}),
    ?assert(lists:any(fun(#{name := N}) -> N =:= <<"$lists:foldl_1/3">> end, Top)).

leaf_only_test() ->
    P = fold("leaf_mixed.txt"),
    ?assertEqual(301, maps:get(samples, P)),
    ?assert(lists:all(fun(S) -> length(S) =:= 2 end, maps:keys(maps:get(stacks, P)))),
    ?assertEqual(0, maps:get(skipped_lines, P)).

chunking_does_not_change_result_test() ->
    {ok, Bin} = file:read_file(fixture("dwarf_atom_decode.txt")),
    {ok, A} = beamdiag_fold:fold_binary(Bin, #{}),
    {ok, B} = beamdiag_fold:fold_binary(Bin, #{chunk_size => 997, workers => 3}),
    ?assertEqual(maps:get(stacks, A), maps:get(stacks, B)),
    {ok, Leaf} = file:read_file(fixture("leaf_mixed.txt")),
    {ok, C} = beamdiag_fold:fold_binary(Leaf, #{}),
    {ok, D} = beamdiag_fold:fold_binary(Leaf, #{chunk_size => 333, workers => 2}),
    ?assertEqual(maps:get(stacks, C), maps:get(stacks, D)).

%% The three readers give the same chunks: a regular file (read with
%% pread, each chunk's tail read again), a pipe (read in order, the tail
%% kept) and text in memory, with chunks far smaller than the text.
readers_agree_test() ->
    File = fixture("dwarf_atom_decode.txt"),
    {ok, Bin} = file:read_file(File),
    Opts = #{chunk_size => 997, workers => 3},
    {ok, Mem} = beamdiag_fold:fold_binary(Bin, Opts),
    {ok, Reg} = beamdiag_fold:fold_file(File, Opts),
    ?assertEqual(150, maps:get(samples, Mem)),
    ?assertEqual(Mem, Reg),
    Dir = filename:join(os:getenv("TMPDIR", "/tmp"),
                        "beamdiag_fold_fifo_" ++ integer_to_list(erlang:unique_integer([positive]))),
    ok = file:make_dir(Dir),
    Fifo = filename:join(Dir, "perf.txt"),
    try
        Mkfifo = os:find_executable("mkfifo"),
        ?assert(is_list(Mkfifo)),
        {0, _, _} = beamdiag_test_lib:run_exe(Mkfifo, [Fifo], []),
        ?assertNot(filelib:is_regular(Fifo)),
        %% Raw: a pipe opened through the file server would block it
        %% until a reader comes, and the folder asks it about the path.
        Writer = spawn_link(fun() ->
                                {ok, W} = file:open(Fifo, [write, raw, binary]),
                                ok = file:write(W, Bin),
                                ok = file:close(W)
                            end),
        {ok, Piped} = beamdiag_fold:fold_file(Fifo, Opts),
        unlink(Writer),
        ?assertEqual(maps:get(stacks, Mem), maps:get(stacks, Piped)),
        ?assertEqual(maps:get(samples, Mem), maps:get(samples, Piped)),
        ?assertEqual(maps:get(bytes, Mem), maps:get(bytes, Piped))
    after
        _ = file:del_dir_r(Dir)
    end.

%% The sample path (blocks between blank lines, cached whole) and the line
%% path (text without blank lines: a header line ends the previous sample)
%% are two readers of one format: on real text they must agree, and extra
%% blank lines change nothing.
sample_and_line_paths_agree_test_() ->
    [{F, fun() ->
          {ok, Bin} = file:read_file(fixture(F)),
          {ok, A} = beamdiag_fold:fold_binary(Bin, #{}),
          NoBlank = binary:replace(Bin, <<"\n\n">>, <<"\n">>, [global]),
          ?assertEqual(nomatch, binary:match(NoBlank, <<"\n\n">>)),
          {ok, B} = beamdiag_fold:fold_binary(NoBlank, #{}),
          ExtraBlank = binary:replace(Bin, <<"\n\n">>, <<"\n\n\n\n">>, [global]),
          {ok, C} = beamdiag_fold:fold_binary(ExtraBlank, #{chunk_size => 4096, workers => 2}),
          [?assertEqual(maps:get(K, A), maps:get(K, X))
           || X <- [B, C], K <- [stacks, samples, unknown_samples, truncated_samples]],
          ?assert(maps:get(samples, A) > 100)
      end} || F <- ["dwarf_atom_decode.txt", "fp_atom_decode.txt", "fp_mixed.txt",
                    "dwarf_redis_cache.txt"]].

thread_type_test_() ->
    [?_assertEqual(Want, beamdiag_fold:thread_type(Comm))
     || {Comm, Want} <- [
            {<<"1_scheduler">>, <<"scheduler">>},
            {<<"12_scheduler">>, <<"scheduler">>},
            {<<"2_dirty_cpu_sch">>, <<"dirty_cpu">>},
            {<<"1_dirty_io_sche">>, <<"dirty_io">>},
            {<<"10_dirty_io_sch">>, <<"dirty_io">>},
            {<<"1_aux">>, <<"aux">>},
            {<<"0_poller">>, <<"poll">>},
            {<<"async_1">>, <<"async">>},
            {<<"sys_sig_dispatc">>, <<"sys_sig_dispatch">>},
            {<<"sys_msg_dispatc">>, <<"sys_msg_dispatch">>},
            {<<"erts_sched_1">>, <<"scheduler">>},
            {<<"erts_sched_16">>, <<"scheduler">>},
            {<<"erts_dcpus_1">>, <<"dirty_cpu">>},
            {<<"erts_dios_1">>, <<"dirty_io">>},
            {<<"erts_aux_1">>, <<"aux">>},
            {<<"erts_poll_0">>, <<"poll">>},
            {<<"erts_async_1">>, <<"async">>},
            {<<"erts_ssig_disp">>, <<"sys_sig_dispatch">>},
            {<<"erts_smsg_disp">>, <<"sys_msg_dispatch">>},
            {<<"erts_runq_sup">>, <<"runq_supervisor">>},
            {<<"beam.smp">>, <<"main">>},
            {<<"some;thing">>, <<"some_thing">>}
        ]].

frame_kind_test_() ->
    [?_assertEqual(Want, beamdiag_fold:frame_kind(F))
     || {F, Want} <- [
            {<<"$lists:foldl/3">>, erlang},
            {<<"lists:foldl/3">>, erlang},
            {<<"$mix:'-erl_loop/1-fun-1-'/2">>, erlang},
            {<<"$global::call_light_bif_shared">>, native},
            {<<"erts_atom_put">>, native},
            {<<"do_syscall_64_[k]">>, kernel},
            {<<"[beam.smp]">>, unnamed_native},
            {<<"[unknown] (/memfd:vmem (deleted))">>, unnamed_jit},
            {<<"[unknown] (/tmp/perf-42.map)">>, unnamed_jit},
            {<<"[unknown]">>, unknown}
        ]].

perf_map_resolution_test() ->
    Map = filename:join(tmp_dir(), "perf-test.map"),
    ok = file:write_file(Map, <<"7f0000001000 100 $mymod:hot/2\n7f0000002000 80 $global::x\nnot a line\n">>),
    Text = <<"1_scheduler  4242   1.000000:   10309278 cpu-clock: \n"
             "\t    7f0000001010 [unknown] ([unknown])\n"
             "\t    7f0000002000 [unknown] ([unknown])\n"
             "\t    7f0000009999 [unknown] ([unknown])\n\n">>,
    {ok, P} = beamdiag_fold:fold_binary(Text, #{perf_map => Map}),
    ?assertEqual(#{[<<"scheduler">>, <<"[unknown]">>, <<"$global::x">>, <<"$mymod:hot/2">>] => 1},
                 maps:get(stacks, P)),
    ?assertMatch({error, {beamdiag_fold, {perf_map, _, enoent}}},
                 beamdiag_fold:fold_binary(Text, #{perf_map => "/nonexistent/perf.map"})),
    rm_tmp_dir().

%% A module purged, and one loaded later where its code was (an Elixir
%% script's elixir_compiler_1 under Shop.Pricing, measured on Elixir 1.14
%% with +JPperf true: 15 overlapping lines in a map of 33,307): the map
%% keeps both, and perf named a third of CI's samples after the purged
%% one's code footer. The later line wins, for frames perf named after the
%% purged code as for those it left unnamed; a name no later line covers
%% is kept as perf gave it.
stale_perf_map_names_test() ->
    Map = filename:join(tmp_dir(), "perf-stale.map"),
    ok = file:write_file(Map, <<"7f0000001000 400 $elixir_compiler_1::codeFooter\n"
                                "7f0000004000 100 $lists:foldl/3\n"
                                "7f0000001100 80 $'Elixir.Shop.Pricing':total/1\n"
                                "7f0000001200 40 $'Elixir.Shop.Pricing':'-total/1-fun-0-'/2\n">>),
    {ok, M} = beamdiag_fold_perf_map:load(Map),
    ?assertEqual(<<"$'Elixir.Shop.Pricing':total/1">>, beamdiag_fold_perf_map:lookup(M, 16#7f0000001110)),
    ?assertEqual(<<"$'Elixir.Shop.Pricing':'-total/1-fun-0-'/2">>,
                 beamdiag_fold_perf_map:lookup(M, 16#7f0000001220)),
    %% Outside the later lines, the purged module's line is all there is.
    ?assertEqual(<<"$elixir_compiler_1::codeFooter">>, beamdiag_fold_perf_map:lookup(M, 16#7f0000001300)),
    ?assertEqual(<<"$lists:foldl/3">>, beamdiag_fold_perf_map:lookup(M, 16#7f0000004000)),
    ?assertEqual(none, beamdiag_fold_perf_map:lookup(M, 16#7f0000003000)),
    ?assert(beamdiag_fold_perf_map:stale(M, <<"$elixir_compiler_1::codeFooter">>)),
    ?assertNot(beamdiag_fold_perf_map:stale(M, <<"$'Elixir.Shop.Pricing':total/1">>)),
    ?assertNot(beamdiag_fold_perf_map:stale(M, <<"$lists:foldl/3">>)),
    Footer = <<"$elixir_compiler_1::codeFooter+0x220 (/tmp/perf-42.map)\n">>,
    Text = <<"1_scheduler  4242   1.000000:   10309278 cpu-clock: \n"
             "\t    7f0000001220 ", Footer/binary,
             "\t    7f0000001110 [unknown] (/tmp/perf-42.map)\n"
             "\t    7f0000004010 $lists:foldl/3+0x10 (/tmp/perf-42.map)\n\n"
             "1_scheduler  4242   1.100000:   10309278 cpu-clock: \n"
             "\t    7f0000001300 ", Footer/binary, "\n">>,
    {ok, P} = beamdiag_fold:fold_binary(Text, #{perf_map => Map}),
    ?assertEqual(#{[<<"scheduler">>, <<"$lists:foldl/3">>, <<"$'Elixir.Shop.Pricing':total/1">>,
                    <<"$'Elixir.Shop.Pricing':'-total/1-fun-0-'/2">>] => 1,
                   [<<"scheduler">>, <<"$elixir_compiler_1::codeFooter">>] => 1},
                 maps:get(stacks, P)),
    %% Without a map, perf's names stand.
    {ok, P0} = beamdiag_fold:fold_binary(Text, #{}),
    ?assertEqual([<<"$elixir_compiler_1::codeFooter">>, <<"$elixir_compiler_1::codeFooter">>],
                 lists:sort([lists:last(K) || K <- maps:keys(maps:get(stacks, P0))])),
    rm_tmp_dir().

end_of_unwind_marker_test() ->
    Text = <<"2_scheduler  7   9.5:   1 cpu-clock: \n"
             "\t          2e921a ethr_rwmutex_runlock+0x2a (/usr/lib/erlang/erts-13.1.5/bin/beam.smp)\n"
             "\t          1ab0b1 [unknown] (/usr/lib/erlang/erts-13.1.5/bin/beam.smp)\n"
             "\tffffffffffffffff [unknown] ([unknown])\n\n">>,
    {ok, P} = beamdiag_fold:fold_binary(Text, #{}),
    ?assertEqual(#{[<<"scheduler">>, <<"[beam.smp]">>, <<"ethr_rwmutex_runlock">>] => 1},
                 maps:get(stacks, P)),
    ?assertEqual(1, maps:get(truncated_samples, P)),
    ?assertEqual(0, maps:get(unknown_samples, P)).

bad_options_test() ->
    ?assertMatch({error, {beamdiag_fold, {bad_option, nope, 1}}},
                 beamdiag_fold:fold_binary(<<>>, #{nope => 1})),
    ?assertMatch({error, {beamdiag_fold, {open, _, enoent}}},
                 beamdiag_fold:fold_file("/nonexistent/perf.txt", #{})),
    [beamdiag_test_lib:sentence(beamdiag_fold:format_error(R))
     || R <- [not_perf_output, {read, x}, {worker, x}, {bad_option, a, b},
              {open, "f", enoent}, {perf_map, "f", enoent}]].

%% Garbage never crashes the folder and never creates atoms.
garbage_test_() ->
    {timeout, 60, fun() ->
        rand:seed(exsss, {1, 2, 3}),
        {ok, Real} = file:read_file(fixture("dwarf_redis_cache.txt")),
        Atoms0 = erlang:system_info(atom_count),
        Inputs = [
            rand:bytes(2000000),
            binary:copy(<<0>>, 100000),
            binary:copy(<<"\n">>, 100000),
            binary:copy(<<"\t">>, 100000),
            << <<(rand:uniform(3) - 1 + $\t)>> || _ <- lists:seq(1, 300000) >>,
            %% A huge line in the middle of real samples.
            iolist_to_binary([Real, binary:copy(<<"x">>, 3000000), "\n\n", Real]),
            %% Real text cut at random places and shuffled.
            iolist_to_binary(shuffle_pieces(Real, 200)),
            %% Real text with random bytes flipped.
            flip(Real, 500),
            %% Thread names with odd characters.
            <<"a;b c\xff  12  3.5:  1 cpu-clock: \n\t  1f x;y+0x1 (/lib/a;b.so)\n\n">>
        ],
        [begin
             case beamdiag_fold:fold_binary(In, #{chunk_size => 65536}) of
                 {ok, P} ->
                     _ = iolist_to_binary(beamdiag_fold:to_iolist(P)),
                     _ = beamdiag_fold:top(P, #{}),
                     [?assertEqual(nomatch, binary:match(F, [<<";">>, <<"\n">>]))
                      || S <- maps:keys(maps:get(stacks, P)), F <- S];
                 {error, {beamdiag_fold, not_perf_output}} ->
                     ok
             end
         end || In <- Inputs],
        {ok, Huge} = beamdiag_fold:fold_binary(lists:nth(6, Inputs), #{chunk_size => 65536}),
        ?assertEqual(300, maps:get(samples, Huge)),
        ?assert(maps:get(huge_lines, Huge) >= 1),
        %% Only atoms of the code itself (loaded lazily) may appear; none
        %% per input line.
        ?assert(erlang:system_info(atom_count) - Atoms0 < 50)
    end}.

max_stacks_bound_test() ->
    Text = iolist_to_binary([io_lib:format("1_scheduler 1 ~b.0: 1 cpu-clock: \n\t ~.16b f~b (/x)\n\n", [I, I, I])
                             || I <- lists:seq(1, 5000)]),
    {ok, P} = beamdiag_fold:fold_binary(Text, #{max_stacks => 100}),
    ?assertEqual(5000, maps:get(samples, P)),
    ?assert(map_size(maps:get(stacks, P)) =< 101),
    ?assert(maps:get(overflow_samples, P) > 0).

top_test() ->
    P = fold("dwarf_atom_decode.txt"),
    [First | _] = Top = beamdiag_fold:top(P, #{kind => native, limit => 10}),
    ?assert(length(Top) =< 10),
    ?assert(lists:all(fun(#{self_share := S, total_share := T}) -> S =< T andalso T =< 1.0 end, Top)),
    ?assertMatch(#{kind := native}, First),
    Text = iolist_to_binary(beamdiag_fold:format_top("Native", Top)),
    ?assertMatch({_, _}, binary:match(Text, <<"erts_atom_put">>)).

from_counts_and_merge_test() ->
    A = beamdiag_fold:from_counts(#{[<<"erlang">>, <<"a:b/1">>] => 3, [<<"erlang">>, <<"[unknown]">>] => 1}),
    ?assertEqual(4, maps:get(samples, A)),
    ?assertEqual(1, maps:get(unknown_samples, A)),
    M = beamdiag_fold:merge(A, A),
    ?assertEqual(8, maps:get(samples, M)),
    ?assertEqual(6, maps:get([<<"erlang">>, <<"a:b/1">>], maps:get(stacks, M))).

%%% Helpers

tmp_dir() ->
    D = filename:join(["/tmp", "beamdiag_fold_tests_" ++ os:getpid()]),
    ok = filelib:ensure_dir(filename:join(D, "x")),
    D.

%% The test's files go with it (this VM's folder: EUnit runs one test
%% at a time).
rm_tmp_dir() ->
    ok = file:del_dir_r(tmp_dir()).

shuffle_pieces(Bin, N) ->
    Cuts = lists:usort([rand:uniform(byte_size(Bin)) || _ <- lists:seq(1, N)]),
    Pieces = pieces(Bin, 0, Cuts, []),
    [P || {_, P} <- lists:sort([{rand:uniform(), P} || P <- Pieces])].

pieces(Bin, Start, [], Acc) ->
    [binary:part(Bin, Start, byte_size(Bin) - Start) | Acc];
pieces(Bin, Start, [C | Cs], Acc) ->
    pieces(Bin, C, Cs, [binary:part(Bin, Start, C - Start) | Acc]).

flip(Bin, N) ->
    lists:foldl(
        fun(_, B) ->
            P = rand:uniform(byte_size(B)) - 1,
            <<H:P/binary, _, T/binary>> = B,
            <<H/binary, (rand:uniform(256) - 1), T/binary>>
        end, Bin, lists:seq(1, N)).

%% The header's figures are what the folded stacks it writes show: counted
%% again here from the folded text, with this test's own reading of frame
%% names, they agree within 1 point for every recorded capture.
header_figures_match_folded_text_test_() ->
    [{F, fun() ->
              {ok, P} = beamdiag_fold:fold_file(fixture(F), Opts),
              S = beamdiag_fold:summary(P),
              R = recount(iolist_to_binary(beamdiag_fold:to_iolist(P))),
              ?assertEqual(maps:get(samples, S), maps:get(samples, R)),
              [?assert(abs(maps:get(K, S) - maps:get(K, R)) =< 0.01)
               || K <- [erlang_share, unnamed_jit_share, unnamed_native_share, unplaced_share,
                        cut_short_share]]
          end}
     || {F, Opts} <- [{"dwarf_atom_decode.txt", #{}}, {"dwarf_redis_cache.txt", #{}},
                      {"fp_atom_decode.txt", #{}}, {"fp_mixed.txt", #{}},
                      {"fp_mixed.txt", #{unknown => cut}}, {"leaf_mixed.txt", #{}},
                      {"fp_memfd_nomap.txt", #{}},
                      {"fp_otp27_jpperf.txt", #{perf_map => fixture("fp_otp27_jpperf.map"),
                                                unknown => cut}}]].

%% OTP 27 without +JPperf, frame pointers: perf names the JIT's memfd
%% mapping but no function in it; the folder keeps perf's name whole and
%% the header counts those samples.
memfd_without_map_test() ->
    {ok, Raw} = file:read_file(fixture("fp_memfd_nomap.txt")),
    RawJit = length(binary:matches(Raw, <<"[unknown] (/memfd:vmem (deleted))">>)),
    ?assert(RawJit > 10),
    P = fold("fp_memfd_nomap.txt"),
    Frames = lists:usort(lists:append(maps:keys(maps:get(stacks, P)))),
    ?assert(lists:member(<<"[unknown] (/memfd:vmem (deleted))">>, Frames)),
    ?assertNot(lists:member(<<"[unknown] (/memfd:vmem">>, Frames)),
    ?assert(maps:get(unnamed_jit_share, beamdiag_fold:summary(P)) > 0.2).

%% OTP 27 with +JPperf true, frame pointers, perf map in the node's own
%% /tmp (perf on the host names the map but cannot read it): the folder
%% names the JIT frames from the map's copy.
otp27_map_test() ->
    {ok, Raw} = file:read_file(fixture("fp_otp27_jpperf.txt")),
    ?assertMatch([_ | _], binary:matches(Raw, <<"[unknown] (/tmp/perf-">>)),
    P = fold("fp_otp27_jpperf.txt", #{perf_map => fixture("fp_otp27_jpperf.map"), unknown => cut}),
    Frames = lists:usort(lists:append(maps:keys(maps:get(stacks, P)))),
    ?assertEqual([], [F || F <- Frames, beamdiag_fold:frame_kind(F) =:= unnamed_jit]),
    ?assert(lists:member(<<"$w:cpu_loop/0">>, Frames)),
    ?assert(maps:get(erlang_share, beamdiag_fold:summary(P)) > 0.05).

%% Figures of folded text (`frame;frame count' lines), counted apart from
%% the folder's code: shares of samples with an Erlang function
%% (`mod:fun/arity', with or without `$'), an unnamed JIT frame
%% (`[unknown] (object)'), an unnamed native frame (`[object]'), a bare
%% `[unknown]', and samples cut short (no Erlang function, root-most frame
%% not a thread entry).
recount(Text) ->
    Lines = binary:split(Text, <<"\n">>, [global, trim_all]),
    Parsed = [begin
                  {match, [St, C]} = re:run(L, <<"^(.*) ([0-9]+)$">>, [{capture, all_but_first, binary}]),
                  {binary:split(St, <<";">>, [global]), binary_to_integer(C)}
              end || L <- Lines],
    N = lists:sum([C || {_, C} <- Parsed]),
    Count = fun(Pred) -> lists:sum([C || {[_ | Fr], C} <- Parsed, Pred(Fr)]) end,
    Any = fun(RE) -> fun(Fr) -> lists:any(fun(F) -> re:run(F, RE) =/= nomatch end, Fr) end end,
    Erl = Any(<<"^\\$?[^$\\[][^:]*:.+/[0-9]+$">>),
    Roots = [<<"clone">>, <<"clone3">>, <<"__clone">>, <<"__clone3">>, <<"start_thread">>,
             <<"thread_start">>, <<"_start">>, <<"__libc_start_main">>,
             <<"__libc_start_call_main">>, <<"$global::process_main">>, <<"process_main">>],
    Cut = fun(Fr) -> Fr =/= [<<"[other stacks]">>] andalso not Erl(Fr) andalso
                         not (Fr =/= [] andalso lists:member(hd(Fr), Roots)) end,
    Share = fun(X) -> case N of 0 -> 0.0; _ -> X / N end end,
    #{samples => N,
      erlang_share => Share(Count(Erl)),
      unnamed_jit_share => Share(Count(Any(<<"^\\[unknown\\] \\(">>))),
      unnamed_native_share => Share(Count(fun(Fr) ->
          lists:any(fun(F) -> re:run(F, <<"^\\[">>) =/= nomatch andalso
                                  re:run(F, <<"^\\[(unknown|no stack|other stacks)\\]">>) =:= nomatch
                    end, Fr) end)),
      unplaced_share => Share(Count(fun(Fr) -> lists:member(<<"[unknown]">>, Fr) end)),
      cut_short_share => Share(Count(Cut))}.

%% perf's own text for JIT code it cannot name is kept whole, and the map
%% names it when perf named the map but could not read it (a container's
%% /tmp).
jit_frames_kept_whole_test() ->
    Map = filename:join(tmp_dir(), "perf-77.map"),
    ok = file:write_file(Map, <<"7f0000001000 100 $mymod:hot/2\n">>),
    Text = <<"erts_sched_1  4242   1.000000:   10309278 cpu-clock: \n"
             "\t          3d0828 erts_atom_put (/usr/lib/erlang/erts-15.2.7/bin/beam.smp)\n"
             "\t    7f5d68005bd [unknown] (/memfd:vmem (deleted))\n"
             "\t    7f0000001010 [unknown] (/tmp/perf-77.map)\n"
             "\t    7f0000009999 [unknown] (/tmp/perf-77.map)\n\n">>,
    {ok, Raw} = beamdiag_fold:fold_binary(Text, #{}),
    ?assertEqual(#{[<<"scheduler">>, <<"[unknown] (/tmp/perf-77.map)">>,
                    <<"[unknown] (/tmp/perf-77.map)">>, <<"[unknown] (/memfd:vmem (deleted))">>,
                    <<"erts_atom_put">>] => 1}, maps:get(stacks, Raw)),
    ?assertMatch(#{unnamed_jit_share := 1.0, unplaced_share := 0.0, cut_short_share := 1.0},
                 beamdiag_fold:summary(Raw)),
    {ok, Named} = beamdiag_fold:fold_binary(Text, #{perf_map => Map}),
    ?assertEqual(#{[<<"scheduler">>, <<"[unknown] (/tmp/perf-77.map)">>, <<"$mymod:hot/2">>,
                    <<"[unknown] (/memfd:vmem (deleted))">>, <<"erts_atom_put">>] => 1},
                 maps:get(stacks, Named)),
    ?assertMatch(#{erlang_share := 1.0, cut_short_share := 0.0}, beamdiag_fold:summary(Named)),
    rm_tmp_dir().

%% The folded output of every fixture, under several option sets, is the
%% one recorded in test/fixtures/perf/golden (by make_golden.escript there,
%% from the folder before its rewrite for speed): a change of the output
%% fails here. Lines are compared sorted: the order of equal counts is the
%% order of a map.
golden_output_test_() ->
    Dir = filename:dirname(fixture("golden/counts.eterm")),
    {ok, Cases} = file:consult(filename:join(Dir, "counts.eterm")),
    [{Fixture ++ " " ++ atom_to_list(Tag),
      fun() ->
          {ok, P} = beamdiag_fold:fold_file(fixture(Fixture), golden_options(Tag)),
          ?assertEqual(Counts, maps:without([stacks], P)),
          {ok, Want} = file:read_file(filename:join(Dir, filename:rootname(Fixture) ++ "." ++
                                                        atom_to_list(Tag) ++ ".folded")),
          Got = lists:sort(binary:split(iolist_to_binary(beamdiag_fold:to_iolist(P)), <<"\n">>,
                                        [global, trim_all])),
          ?assertEqual(binary:split(Want, <<"\n">>, [global, trim_all]), Got)
      end} || {Fixture, Tag, Counts} <- Cases].

golden_options(default) -> #{};
golden_options(cut) -> #{unknown => cut};
golden_options(small_chunks) -> #{chunk_size => 997, workers => 3, max_stacks => 8};
golden_options(perf_map) -> #{perf_map => fixture("fp_otp27_jpperf.map")};
golden_options(schedulers) -> #{thread_types => [<<"scheduler">>]}.

%% The fast paths (headers cached by their text before the time, callers
%% cached whole, names cached by the text after the address) agree with
%% folding line by line, on the fixtures with their leaf and unplaced
%% addresses moved at random so that the caches both hit and miss.
fast_paths_agree_with_line_by_line_test_() ->
    Opts = #{max_line => 16384, perf_map => undefined, thread_types => all,
             max_stacks => 200000, unknown => keep},
    [{F, fun() ->
             {ok, Bin} = file:read_file(fixture(F)),
             rand:seed(exsss, {1, 2, 3}),
             Text = iolist_to_binary([move_addresses(S) || S <- binary:split(Bin, <<"\n\n">>, [global])]),
             {ok, Fast} = beamdiag_fold:fold_binary(Text, #{workers => 1, chunk_size => 1 bsl 30}),
             Slow = beamdiag_fold_worker:fold_line_by_line(Text, Opts),
             ?assertEqual(Slow#{bytes := byte_size(Text)}, Fast),
             {ok, Cut} = beamdiag_fold:fold_binary(Text, #{workers => 1, unknown => cut,
                                                             max_stacks => 30}),
             SlowCut = beamdiag_fold_worker:fold_line_by_line(Text, Opts#{unknown := cut,
                                                                          max_stacks := 30}),
             ?assertEqual(SlowCut#{bytes := byte_size(Text)}, Cut)
         end}
     || F <- ["dwarf_atom_decode.txt", "dwarf_redis_cache.txt", "fp_atom_decode.txt",
              "fp_memfd_nomap.txt", "fp_mixed.txt", "fp_otp27_jpperf.txt"]].

move_addresses(<<>>) ->
    [];
move_addresses(Sample) ->
    [Header | Frames] = binary:split(Sample, <<"\n">>, [global]),
    Moved = [case {I, rand:uniform(2), F} of
                 {_, _, <<"\t", _:16/binary, " [unknown] ([unknown])">>} -> move(F);
                 {1, 1, <<"\t", _:16/binary, " ", _/binary>>} -> move(F);
                 _ -> F
             end || {I, F} <- lists:enumerate(Frames)],
    [lists:join($\n, [Header | Moved]), "\n\n"].

move(<<"\t", Field:16/binary, Rest/binary>> = F) ->
    case string:trim(Field) of
        <<"0">> -> F;
        <<"ffffffffffffffff">> -> F;
        Hex ->
            A = binary_to_integer(Hex, 16) + rand:uniform(4096),
            iolist_to_binary(io_lib:format("\t~16.16.\sb~s", [A, Rest]))
    end.
