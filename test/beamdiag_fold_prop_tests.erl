%%% Property-style tests of the perf script folder: generated perf script
%%% text (real-looking samples and hostile ones: odd frames, empty stacks,
%%% [unknown] runs, recursion, long lines, CRLF, missing or extra blank
%%% lines, a truncated last sample, random bytes) folded by the folder's
%%% fast paths must give exactly what a plain fold, written here line by
%%% line without any cache, gives.
%%%
%%% The reference reads the text as perf script is defined: a blank line
%%% ends a sample; a line that starts with a tab is a frame line; a line
%%% that starts with a space is a header if it parses as one, else a frame
%%% line; any other line is a header (which ends the sample before it);
%%% over-long lines are skipped and counted. Frame names come from
%%% `beamdiag_fold_frame' (a line ending in `[unknown] ([unknown])' from
%%% `unknown/2', any other from `parse/2'), headers from
%%% `beamdiag_fold_header:parse/1': what is checked is everything the
%%% folder adds on top of them (samples cut out of chunks, header and name
%%% caches, cached callers, runs of equal lines skipped, the stack tree,
%%% the bounds, the cut mode).
%%%
%%% BEAMDIAG_FOLD_SEED=N runs other inputs (the seed is printed on a
%%% failure).
-module(beamdiag_fold_prop_tests).

-include_lib("eunit/include/eunit.hrl").

-define(UNKNOWN, <<"[unknown]">>).

%%% The properties

%% Many small texts, each under random options.
fast_path_matches_reference_test_() ->
    {timeout, 120, fun() ->
        Seed = seed(),
        rand:seed(exsss, Seed),
        [check(Seed, I, text(rand:uniform(60)), options()) || I <- lists:seq(1, 250)]
    end}.

%% Fewer, larger texts: caches fill and hit, runs are long, and the bound
%% on distinct stacks is reached.
large_texts_match_reference_test_() ->
    {timeout, 120, fun() ->
        Seed = seed(),
        rand:seed(exsss, Seed),
        [check(Seed, I, text(300 + rand:uniform(700)), options()) || I <- lists:seq(1, 8)]
    end}.

%% The same property on a real capture with its addresses moved, and its
%% samples shuffled with hostile ones in between.
real_text_matches_reference_test_() ->
    {timeout, 120, fun() ->
        Seed = seed(),
        rand:seed(exsss, Seed),
        {ok, Real} = file:read_file(beamdiag_test_lib:fixture("perf/fp_atom_decode.txt")),
        Samples = binary:split(Real, <<"\n\n">>, [global, trim_all]),
        [begin
             Mixed = [case rand:uniform(10) of
                          1 -> [sample(), "\n"];
                          _ -> [S, "\n\n"]
                      end || S <- Samples],
             check(Seed, I, iolist_to_binary(Mixed), options())
         end || I <- lists:seq(1, 4)]
    end}.

%% The reference is not vacuous: it sees what the text holds.
reference_reads_samples_test() ->
    Text = <<"1_scheduler 7 [001] 1.5: 1 cpu-clock: \n"
             "\t 7f01 $m:f/1+0x1 (/tmp/perf-1.map)\n"
             "\t 7f02 $m:f/1+0x2 (/tmp/perf-1.map)\n"
             "\t    7f0000000003 [unknown] ([unknown])\n"
             "\t    7f0000000004 [unknown] ([unknown])\n"
             "\t 7f05 main (/bin/x)\n\n"
             "junk line\n"
             "2_dirty_cpu_sch 8 2.5: 1 cpu-clock: \n"
             "\t               0 [unknown] ([unknown])\n\n">>,
    P = reference(Text, opts(#{})),
    ?assertEqual(#{[<<"scheduler">>, <<"main">>, ?UNKNOWN, <<"$m:f/1">>, <<"$m:f/1">>] => 1,
                   [<<"dirty_cpu">>, <<"[no stack]">>] => 1}, maps:get(stacks, P)),
    ?assertMatch(#{samples := 2, unknown_samples := 1, truncated_samples := 1,
                   skipped_lines := 1}, P),
    {ok, Fast} = beamdiag_fold:fold_binary(Text, #{workers => 1}),
    ?assertEqual(P#{bytes => byte_size(Text)}, Fast).

%% A sample whose blank line is missing ends at the next header line, as
%% perf script without call chains is read: its callers are not the next
%% sample's (the folder before this one counted `scheduler;b;a').
missing_blank_line_test() ->
    Text = <<"1_scheduler 1 1.5: 1 cpu-clock: \n\t 7f01 a (/x)\n"
             "2_scheduler 2 1.6: 1 cpu-clock: \n\t 7f02 b (/x)\n\n">>,
    {ok, P} = beamdiag_fold:fold_binary(Text, #{}),
    ?assertEqual(#{[<<"scheduler">>, <<"a">>] => 1, [<<"scheduler">>, <<"b">>] => 1},
                 maps:get(stacks, P)),
    ?assertEqual(reference(Text, opts(#{})), maps:without([bytes], P)).

%% Text whose last sample has no blank line and no final line end (a
%% capture cut short) keeps that sample's last line: the reader does not
%% cut the input's last read at a line end (it did, and the last line was
%% counted as a line outside any sample).
last_line_of_text_test() ->
    Text = <<"  lead   84555   .5:   1001001 cpu-clock: \n"
             "\t               0 [unknown] ([unknown])\n\t     7f01 f (/x)">>,
    Want = #{[<<"lead">>, <<"f">>] => 1},
    {ok, P} = beamdiag_fold:fold_binary(Text, #{}),
    ?assertEqual(Want, maps:get(stacks, P)),
    ?assertEqual(0, maps:get(skipped_lines, P)),
    File = filename:join(os:getenv("TMPDIR", "/tmp"),
                         "beamdiag_fold_prop_" ++ integer_to_list(erlang:unique_integer([positive]))),
    ok = file:write_file(File, Text),
    try
        {ok, F} = beamdiag_fold:fold_file(File, #{}),
        ?assertEqual(Want, maps:get(stacks, F))
    after
        file:delete(File)
    end.

%%% Checking

check(Seed, I, Text, Opts) ->
    Want = reference(Text, opts(Opts)),
    case beamdiag_fold:fold_binary(Text, Opts#{workers => 1, chunk_size => 1 bsl 30}) of
        {ok, Got} ->
            case Got =:= Want#{bytes => byte_size(Text)} of
                true ->
                    ok;
                false ->
                    ?debugFmt("seed ~p, case ~b, options ~p: the fold differs from the "
                              "reference;~ntext (its first 4 KiB):~n~p",
                              [Seed, I, Opts, binary:part(Text, 0, min(4096, byte_size(Text)))]),
                    ?assertEqual(Want#{bytes => byte_size(Text)}, Got)
            end;
        {error, {beamdiag_fold, not_perf_output}} ->
            ?assertEqual(0, maps:get(samples, Want))
    end.

seed() ->
    case os:getenv("BEAMDIAG_FOLD_SEED") of
        false -> {30, 3, 250};
        N -> {list_to_integer(N), 3, 250}
    end.

%% The folder's options with its defaults, as the reference reads them.
opts(Opts) ->
    maps:merge(#{max_line => 16384, max_stacks => 200000, unknown => keep, perf_map => undefined,
                 thread_types => all}, Opts).

options() ->
    pick([#{}, #{}, #{}, #{unknown => cut}, #{max_stacks => 1 + rand:uniform(6)},
          #{max_line => 30 + rand:uniform(60)}, #{thread_types => [<<"scheduler">>]},
          #{unknown => cut, max_stacks => 3, max_line => 70}]).

%%% The reference fold: line by line, no caches.

-record(ref, {opts, type = none, frames = [], unknown = false, truncated = false,
              ids = #{}, nids = 0, counts = #{}, samples = 0, unknowns = 0, truncs = 0,
              overflow = 0, skipped = 0, huge = 0}).

reference(Text, Opts) ->
    R = lists:foldl(fun ref_line/2, #ref{opts = Opts}, binary:split(Text, <<"\n">>, [global])),
    #ref{counts = Counts, samples = N, unknowns = U, truncs = T, overflow = O, skipped = Sk,
         huge = H} = ref_emit(R),
    #{stacks => maps:from_list([{[Type | lists:reverse(Frames)], C}
                                || {{Type, Frames}, C} <- maps:to_list(Counts)]),
      samples => N, unknown_samples => U, truncated_samples => T, overflow_samples => O,
      skipped_lines => Sk, huge_lines => H}.

ref_line(<<>>, R) ->
    (ref_emit(R))#ref{type = none};
ref_line(Line, R = #ref{opts = #{max_line := Max}, huge = H}) when byte_size(Line) > Max ->
    R#ref{huge = H + 1};
ref_line(<<$\t, _/binary>> = Line, R) ->
    ref_frame(Line, R);
ref_line(<<$\s, _/binary>> = Line, R) ->
    case beamdiag_fold_header:parse(Line) of
        {ok, _, _} -> ref_header(Line, R);
        error -> ref_frame(Line, R)
    end;
ref_line(Line, R) ->
    ref_header(Line, R).

ref_header(Line, R0) ->
    R = ref_emit(R0),
    case beamdiag_fold_header:parse(Line) of
        error ->
            R#ref{type = none, skipped = R#ref.skipped + 1};
        {ok, Comm, Inline} ->
            Type = beamdiag_fold_header:thread_type(Comm),
            Kept = case maps:get(thread_types, R#ref.opts) of
                all -> true;
                Types -> lists:member(Type, Types)
            end,
            R2 = R#ref{type = case Kept of true -> Type; false -> skip end},
            case Inline of
                <<>> ->
                    R2;
                _ ->
                    %% No call chain: the leaf on the header line; a bad one
                    %% leaves the stack empty, and is not counted as junk.
                    case ref_name(Inline, R#ref.opts) of
                        ?UNKNOWN -> R2#ref{frames = [?UNKNOWN], unknown = true};
                        Name when is_binary(Name) -> R2#ref{frames = [Name]};
                        _ -> R2
                    end
            end
    end.

ref_frame(_Line, R = #ref{type = none, skipped = Sk}) ->
    R#ref{skipped = Sk + 1};
ref_frame(_Line, R = #ref{type = skip}) ->
    R;
ref_frame(Line, R = #ref{frames = Frames}) ->
    case ref_name(Line, R#ref.opts) of
        drop -> R#ref{truncated = true};
        junk -> R#ref{skipped = R#ref.skipped + 1};
        %% Consecutive unplaced frames are one.
        ?UNKNOWN when Frames =/= [], hd(Frames) =:= ?UNKNOWN -> R#ref{unknown = true};
        ?UNKNOWN -> R#ref{frames = [?UNKNOWN | Frames], unknown = true};
        Name -> R#ref{frames = [Name | Frames]}
    end.

ref_name(Line, #{perf_map := Map}) ->
    case byte_size(Line) > 21 andalso
             binary_part(Line, byte_size(Line), -21) =:= <<"[unknown] ([unknown])">> of
        true -> beamdiag_fold_frame:unknown(Line, Map);
        false -> beamdiag_fold_frame:parse(Line, Map)
    end.

%% Counts the open sample (frames are root first here), as the folder
%% counts: at most max_stacks distinct stacks and as many (type, stack)
%% pairs, past them `[other stacks]'; with `unknown => cut', the frames
%% rootwards of the leafmost `[unknown]' are dropped.
ref_emit(R = #ref{type = Type}) when Type =:= none; Type =:= skip ->
    R#ref{frames = [], unknown = false, truncated = false};
ref_emit(R = #ref{type = Type, frames = RootFirst, unknown = U0, truncated = T0,
                  opts = #{max_stacks := Max, unknown := Mode}}) ->
    Leaf = lists:reverse(RootFirst),
    {Frames, U, T} =
        case Leaf of
            [] ->
                {[<<"[no stack]">>], U0, T0};
            _ when U0, Mode =:= cut ->
                case lists:takewhile(fun(F) -> F =/= ?UNKNOWN end, Leaf) of
                    [] -> {[?UNKNOWN], true, true};
                    Kept -> {Kept, false, true}
                end;
            _ ->
                {Leaf, U0, T0}
        end,
    #ref{ids = Ids, nids = NIds, counts = Counts} = R,
    {Id, Ids2, NIds2} =
        case Ids of
            #{Frames := _} -> {Frames, Ids, NIds};
            _ when NIds < Max -> {Frames, Ids#{Frames => true}, NIds + 1};
            _ -> {overflow, Ids, NIds}
        end,
    R2 = case Counts of
        #{{Type, Id} := C} ->
            R#ref{ids = Ids2, nids = NIds2, counts = Counts#{{Type, Id} := C + 1}};
        _ when Id =/= overflow, map_size(Counts) < Max ->
            R#ref{ids = Ids2, nids = NIds2, counts = Counts#{{Type, Id} => 1}};
        _ ->
            Other = [<<"[other stacks]">>],
            {Ids3, NIds3} = case Ids2 of
                #{Other := _} -> {Ids2, NIds2};
                _ -> {Ids2#{Other => true}, NIds2 + 1}
            end,
            R#ref{ids = Ids3, nids = NIds3, overflow = R#ref.overflow + 1,
                  counts = maps:update_with({Type, Other}, fun(X) -> X + 1 end, 1, Counts)}
    end,
    R2#ref{frames = [], unknown = false, truncated = false, samples = R#ref.samples + 1,
           unknowns = R#ref.unknowns + flag(U), truncs = R#ref.truncs + flag(T)}.

flag(true) -> 1;
flag(false) -> 0.

%%% Generated perf script text

text(Samples) ->
    Body = [sample_sep() || _ <- lists:seq(1, Samples)],
    Text = iolist_to_binary(Body),
    case rand:uniform(8) of
        1 -> binary:part(Text, 0, rand:uniform(byte_size(Text)));   % truncated last sample
        2 -> binary:replace(Text, <<"\n">>, <<"\r\n">>, [global]);  % CRLF
        3 -> beamdiag_fold_tests:flip(Text, rand:uniform(20));      % hostile bytes
        _ -> Text
    end.

sample_sep() ->
    [sample(), case rand:uniform(20) of
                   1 -> "";            % no blank line after it
                   2 -> "\n\n";        % an extra one
                   3 -> "\n \n";       % a line of one space
                   _ -> "\n"
               end].

%% A sample: a header line and frame lines, leaf first, each ending in a
%% line end; the caller adds the blank line.
sample() ->
    case rand:uniform(40) of
        1 -> [rand_line(), "\n"];
        2 -> [header(inline), "\n"];
        _ -> [header(chain), "\n", frames()]
    end.

header(Kind) ->
    Comm = pick(["1_scheduler", "2_scheduler", "erts_sched_3", "1_dirty_cpu_sch", "erts_dios_2",
                 "beam.smp", "sys_sig_dispatc", "my worker", "a;b", "  lead", "12"]),
    Tid = integer_to_list(rand:uniform(99999)),
    Cpu = pick(["", " [001]", " [000]"]),
    Time = pick([io_lib:format("~b.~6..0b", [rand:uniform(999), rand:uniform(999999)]),
                 "12.5", "1.2.3", "123", ".5"]),
    Sep = pick(["  ", " ", "   "]),
    Event = pick(["1001001 cpu-clock: ", "1001001 cpu-clock:", "cpu-clock: ", "1 cycles:u: "]),
    Inline = case Kind of
        inline -> frame_text();
        chain -> pick(["", "", "", "", " "])
    end,
    Lead = pick(["", "", "", "  "]),
    [Lead, Comm, Sep, Tid, Cpu, Sep, Time, ":", Sep, Event, Inline].

frames() ->
    N = rand:uniform(12) - 1,
    Lines = lists:append([frame_run() || _ <- lists:seq(1, N)]),
    [[L, "\n"] || L <- Lines].

%% A frame line, or a run of equal ones (recursion, frame-pointer chains
%% that loop), or unplaced addresses of all kinds.
frame_run() ->
    case rand:uniform(12) of
        1 -> lists:duplicate(rand:uniform(200), frame());
        2 -> lists:duplicate(rand:uniform(50), unknown_line());
        3 -> [unknown_line() || _ <- lists:seq(1, rand:uniform(8))];
        4 -> lists:duplicate(rand:uniform(30), ["\t", field("0"), " [unknown] ([unknown])"]);
        5 -> [["\t", field("ffffffffffffffff"), " [unknown] ([unknown])"]];
        _ -> [frame()]
    end.

frame() ->
    case rand:uniform(30) of
        1 -> rand_line();
        2 -> [" ", frame_text()];                         % spaces for the tab
        3 -> ["\t", lists:duplicate(100 + rand:uniform(200), $x)];  % over max_line at times
        4 -> ["\t", field("7fzz00"), " sym (/x)"];        % not an address
        5 -> "\t";
        6 -> ["\t", frame_text(), "\r"];
        _ -> ["\t", frame_text()]
    end.

frame_text() ->
    Addr = pick(["7f01a8d35808", "7f01a8d359c0", "2036ee", "1f7f84", "ffffffff813a2293",
                 "7f01a8d93fec", "7f01a8d93fd8", "ab2d"]),
    [field(Addr), " ", symbol()].

symbol() ->
    pick(["$rand:exsss_uniform/2+0x1c (/tmp/perf-2139.map)",
          "$lists:foldl/3 (/tmp/perf-2139.map)",
          "$beamdiag_lab_cache:'-cpu_loop/1-lc$^0/1-0-'/1 (/tmp/perf-2139.map)",
          "$global::call_light_bif_shared (/tmp/perf-2139.map)",
          "hash_get (/usr/lib/erlang/erts-13.1.5/bin/beam.smp)",
          "[unknown] (/usr/lib/erlang/erts-13.1.5/bin/beam.smp)",
          "[unknown] (/memfd:vmem (deleted))",
          "[unknown] (/tmp/perf-77.map)",
          "__schedule+0x3e ([kernel.kallsyms])",
          "x;y+0x1 (/lib/a;b.so)",
          "erts_atom_put",
          "sym+0x10 (",
          " (/x)",
          "[unknown] ([unknown])"]).

unknown_line() ->
    ["\t", field(integer_to_list(16#7f0000000000 + rand:uniform(1 bsl 20), 16)),
     " [unknown] ([unknown])"].

%% An address right-aligned in sixteen bytes, as perf script writes it.
field(Addr) ->
    string:right(Addr, 16, $\s).

rand_line() ->
    [case rand:uniform(6) of
         1 -> $\t;
         2 -> $\s;
         3 -> $:;
         _ -> 32 + rand:uniform(94)
     end || _ <- lists:seq(1, rand:uniform(50))] ++ [rand:uniform(255) || rand:uniform(3) =:= 1].

pick(L) ->
    lists:nth(rand:uniform(length(L)), L).
