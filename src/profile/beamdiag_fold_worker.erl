%%% @doc One fold worker: folds the chunks of `perf script' text it is sent
%%% into counted stacks, and answers with its profile at the end.
%%%
%%% Samples of perf script with call chains are a header line and a block
%%% of frame lines, leaf first, ended by a blank line. Most of the text
%%% repeats: runs of one line (recursion, and frame-pointer chains that
%%% loop through one unplaced address: on real captures two thirds of the
%%% bytes are a line equal to the one before), and a sample's callers (all
%%% its frame lines but the leaf), whose return addresses recur even when
%%% the leaf's address does not. So the worker reads a chunk sample by
%%% sample, with as few steps per byte as it can:
%%% <ul>
%%% <li>a line's end is found by `binary:match/3' (memchr, in C) from
%%%   where the line starts; nothing builds a list of the chunk's lines;</li>
%%% <li>a header seen before with only its time changed is found by its
%%%   first 14 bytes (read as integers) and checked in place, its line end
%%%   with it (no search for it); others are
%%%   cut at their time (`beamdiag_fold_header:split/2') and their thread
%%%   type cached by the text before and after it;</li>
%%% <li>the callers are cached whole, found by their first 28 bytes (read
%%%   as integers) and compared whole against the chunk (memcmp), checked
%%%   at their blank line first, without reading their lines: a hit jumps
%%%   to the next sample; most callers are seen once (frame-pointer chains
%%%   end in garbage), so callers are copied into the cache when seen a
%%%   second time;</li>
%%% <li>callers not cached are read line by line, and a line's run of
%%%   equal lines is measured by comparing the chunk with itself at
%%%   doubling lengths (a few memcmps for a run of thousands); lines of
%%%   addresses perf could place nowhere, and the end-of-unwind markers,
%%%   are read in place by a binary pattern, without making a binary;</li>
%%% <li>a frame line's name is cached by the whole line (callers' lines are
%%%   return addresses, which recur, and so do most leaves), and else by
%%%   its text after the address (`beamdiag_fold_frame:symbol/2'), which
%%%   repeats far more than the line;</li>
%%% <li>stacks are the nodes of a tree of numbered frames
%%%   (`beamdiag_fold_stacks'): cached callers keep their node, and a
%%%   sample's stack is one look-up for its leaf.</li>
%%% </ul>
%%% On OTP 25, matching a binary byte by byte in Erlang costs about 10 ns a
%%% byte, and a search pattern compiled at each call costs more than the
%%% search: the scans are BIFs with patterns compiled once per worker.
%%%
%%% Anything else goes line by line, exactly as `fold_line_by_line/2'
%%% reads text (the reference the fast paths are tested against): text
%%% without blank lines (no call chains), headers of another shape, frame
%%% lines that do not start with a tab, over-long lines, filtered thread
%%% types, CRLF line ends, and text that is not perf output. Lines that are
%%% not perf output are skipped and counted, over-long lines are skipped
%%% and counted.
%%%
%%% The protocol (`beamdiag_fold_chunks' drives it): the worker gets
%%% `{chunk, Binary}' and answers `{ack, self()}' once folded, then
%%% `{done, From}' and answers `{profile, self(), Profile}' and ends.
%%%
%%% ```
%%% 1> {Pid, Mon} = beamdiag_fold_worker:start(self(), Opts, []).
%%% 2> Pid ! {chunk, Text}, Pid ! {done, self()}.
%%% '''
-module(beamdiag_fold_worker).

-export([start/3]).
%% Called by the tests only: the reference the fast paths are checked
%% against.
-ifdef(TEST).
-export([fold_line_by_line/2]).
-endif.

-define(CACHE_MAX, 100000).
-define(HEADS_MAX, 10000).
%% The callers cache: its key is the callers' first ?KEY bytes, at most
%% ?SAME callers a key; it is emptied when it holds ?BLOCKS_MAX callers or
%% ?BLOCKS_BYTES bytes of text, and callers longer than ?BLOCK_MAX bytes
%% are not kept.
-define(KEY, 28).
-define(SAME, 8).
-define(BLOCKS_MAX, 20000).
-define(BLOCKS_BYTES, 8 * 1024 * 1024).
-define(BLOCK_MAX, 65536).
-define(UNKNOWN, <<"[unknown]">>).

-record(ctx, {
    max_line :: pos_integer(),
    perf_map :: tuple() | undefined,
    types :: all | [binary()],
    nl :: binary:cp(),
    nlnl :: binary:cp(),
    colon :: binary:cp(),
    unknown_id :: pos_integer(),
    cut :: boolean()
}).

-record(st, {
    stacks :: beamdiag_fold_stacks:table(),
    %% Frame line => {Name, FrameId} | drop | junk (FrameId:
    %% `beamdiag_fold_stacks:frame_id/2'), `line/3'.
    cache = #{} :: map(),
    %% A frame line's text after its address => {Name, FrameId} | junk |
    %% address (the name depends on the address: see `cache').
    syms = #{} :: map(),
    %% The callers' first ?KEY bytes (as integers) => [{Text, Callers}]
    %% (`callers/8').
    blocks = #{} :: map(),
    %% {Key, Size} of callers seen once, not cached yet.
    seen = #{} :: map(),
    blocks_n = 0 :: non_neg_integer(),
    blocks_bytes = 0 :: non_neg_integer(),
    %% Comm => thread type.
    comms = #{} :: map(),
    %% The text before a header's time token and the text after it =>
    %% thread type, skip or slow.
    heads = #{} :: map(),
    %% A header's first 14 bytes (as integers) => [{Prefix, After, Type}]
    %% (`known_head/4').
    known = #{} :: map(),
    skipped = 0 :: non_neg_integer(),
    huge = 0 :: non_neg_integer()
}).

%% A sample's callers, read: their frames (leaf first), the node of that
%% stack (`beamdiag_fold_stacks:path/3'), whether a frame is `[unknown]',
%% whether the unwind was cut short, and how many lines were junk.
-record(callers, {
    frames :: [binary()],
    node :: beamdiag_fold_stacks:node_id(),
    unknown :: boolean(),
    truncated :: boolean(),
    junk :: non_neg_integer()
}).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Starts a worker for `Parent', monitored, with the folder's checked
%% options (`beamdiag_fold') and extra spawn options (its heap).
-spec start(pid(), beamdiag_fold:settled(), [erlang:spawn_opt_option()]) -> {pid(), reference()}.
start(Parent, Opts, SpawnOpts) ->
    Ctx = ctx(Opts),
    St = #st{stacks = beamdiag_fold_stacks:new(Opts)},
    spawn_opt(fun() -> worker_loop(Parent, Ctx, St) end, [monitor | SpawnOpts]).

-ifdef(TEST).
%% @doc Folds text line by line, in this process, without the caches of
%% samples' headers and callers: what the fast paths must agree with on
%% perf script text.
-spec fold_line_by_line(binary(), beamdiag_fold:settled()) -> beamdiag_fold:profile().
fold_line_by_line(Text, Opts) ->
    Ctx = #ctx{nl = NL} = ctx(Opts),
    St = #st{stacks = beamdiag_fold_stacks:new(Opts)},
    to_profile(lines(binary:split(Text, NL, [global]), Ctx, St, none, [], false, false)).
-endif.

%%%===================================================================
%%% Internal
%%%===================================================================

ctx(#{max_line := ML, perf_map := PM, thread_types := TT, unknown := U}) ->
    #ctx{
        max_line = ML,
        perf_map = PM,
        types = TT,
        nl = binary:compile_pattern(<<"\n">>),
        nlnl = binary:compile_pattern(<<"\n\n">>),
        colon = beamdiag_fold_header:colon(),
        unknown_id = beamdiag_fold_stacks:unknown_id(),
        cut = U =:= cut
    }.

worker_loop(Parent, Ctx, St) ->
    receive
        {chunk, Chunk} ->
            St2 = samples(Chunk, 0, byte_size(Chunk), Ctx, St),
            Parent ! {ack, self()},
            worker_loop(Parent, Ctx, St2);
        {done, From} ->
            From ! {profile, self(), to_profile(St)}
    end.

to_profile(#st{stacks = Tab, skipped = Sk, huge = H}) ->
    maps:merge(beamdiag_fold_profile:empty(),
               (beamdiag_fold_stacks:counts(Tab))#{skipped_lines => Sk, huge_lines => H}).

%% The samples of a chunk from S on, each a header line and its frame
%% lines up to a blank line. S is where a line starts, and no sample is
%% open there (the chunk's start, or after a blank line): reading a sample
%% line by line from S (`slow/5') gives what `fold_line_by_line/2' gives,
%% so every path that meets something unusual goes there.
samples(_Chunk, S, Size, _Ctx, St) when S >= Size ->
    St;
samples(Chunk, S, Size, Ctx, St) ->
    case Chunk of
        <<_:S/binary, K1:56, K2:56, _/binary>> ->
            %% Headers seen before, found by their first 14 bytes (as
            %% integers) and checked in place, their line end with them
            %% (`known_head/4').
            Key = {K1, K2},
            case St#st.known of
                #{Key := Same} ->
                    case known_head(Same, Chunk, S, Ctx#ctx.max_line) of
                        {H, Type} when is_binary(Type) -> leaf(Chunk, S, H + 1, Size, Type, Ctx, St);
                        {_H, _SlowOrSkip} -> slow(Chunk, S, Size, Ctx, St);
                        none -> line_start(Chunk, S, Size, Key, Same, Ctx, St)
                    end;
                _ ->
                    line_start(Chunk, S, Size, Key, [], Ctx, St)
            end;
        _ ->
            line_start(Chunk, S, Size, none, [], Ctx, St)
    end.

%% A line at S that is not a header seen before. Key: its first 14 bytes
%% (`none' at the chunk's end), and Same what is remembered under them.
line_start(Chunk, S, Size, Key, Same, Ctx = #ctx{nl = NL, max_line = Max}, St) ->
    case binary:match(Chunk, NL, [{scope, {S, Size - S}}]) of
        {S, 1} ->
            %% A blank line.
            samples(Chunk, S + 1, Size, Ctx, St);
        {H, 1} when H - S =< Max ->
            case Chunk of
                <<_:S/binary, $\t, _/binary>> ->
                    slow(Chunk, S, Size, Ctx, St);
                _ when H - S >= 14 ->
                    new_header(Chunk, S, H, Size, Key, Same, Ctx, St);
                _ ->
                    new_header(Chunk, S, H, Size, none, [], Ctx, St)
            end;
        _ ->
            slow(Chunk, S, Size, Ctx, St)
    end.

%% A header line (from S to H) not seen before: read (`header/3') and
%% remembered under Key, its first 14 bytes.
new_header(Chunk, S, H, Size, Key, Same, Ctx, St) ->
    case header(binary:part(Chunk, S, H - S), Ctx, St) of
        {Type, Split, St2} ->
            St3 = remember_head(Key, Same, Split, Type, St2),
            case is_binary(Type) of
                true -> leaf(Chunk, S, H + 1, Size, Type, Ctx, St3);
                false -> slow(Chunk, S, Size, Ctx, St3)
            end
    end.

remember_head(Key, _Same, {Prefix, After}, Type, St = #st{known = Known}) when Key =/= none ->
    Known2 = case map_size(Known) < ?HEADS_MAX of
        true -> Known;
        false -> #{}
    end,
    Same = case Known2 of
        #{Key := L} -> lists:sublist(L, 3);
        _ -> []
    end,
    St#st{known = Known2#{Key => [{binary:copy(Prefix), binary:copy(After), Type} | Same]}};
remember_head(_Key, _Same, _Split, _Type, St) ->
    St.

%% The line end and type of the header line at S if it is a header seen
%% before with only its time changed: the text before the time token
%% (Prefix), a space, the time token (digits and one dot, at least two
%% bytes), its `:', the text after it (After) and the line's end, no
%% further than Max bytes from S. Then `split/2' would cut the line into
%% Prefix and After: Prefix holds no `:', no line end and some text, the
%% token holds no space, and After is empty or starts with a space (they
%% were cut so once). `none' when it is no such header.
known_head([{Prefix, After, Type} | Rest], Chunk, S, Max) ->
    PL = byte_size(Prefix),
    case Chunk of
        <<_:S/binary, P:PL/binary, $\s, Tail/binary>> when P =:= Prefix ->
            case time_token(Tail, 0, 0) of
                {Len, 1} when Len >= 2 ->
                    C = S + PL + 1 + Len,
                    AL = byte_size(After),
                    H = C + 1 + AL,
                    case Chunk of
                        <<_:C/binary, $:, A:AL/binary, $\n, _/binary>>
                          when A =:= After, H - S =< Max ->
                            {H, Type};
                        _ ->
                            known_head(Rest, Chunk, S, Max)
                    end;
                _ ->
                    known_head(Rest, Chunk, S, Max)
            end;
        _ ->
            known_head(Rest, Chunk, S, Max)
    end;
known_head([], _Chunk, _S, _Max) ->
    none.

%% The length of the run of digits and dots a binary starts with, and its
%% dots.
time_token(<<C, R/binary>>, Len, Dots) when C >= $0, C =< $9 -> time_token(R, Len + 1, Dots);
time_token(<<$., R/binary>>, Len, Dots) -> time_token(R, Len + 1, Dots + 1);
time_token(_, Len, Dots) -> {Len, Dots}.

%% The sample from S to the next blank line, line by line; without a
%% blank line, the rest of the chunk.
slow(Chunk, S, Size, Ctx = #ctx{nl = NL, nlnl = NLNL}, St) ->
    case binary:match(Chunk, NLNL, [{scope, {S, Size - S}}]) of
        {B, 2} ->
            Lines = binary:split(binary:part(Chunk, S, B - S), NL, [global]),
            St2 = lines(Lines ++ [<<>>], Ctx, St, none, [], false, false),
            samples(Chunk, B + 2, Size, Ctx, St2);
        nomatch ->
            Lines = binary:split(binary:part(Chunk, S, Size - S), NL, [global]),
            lines(Lines, Ctx, St, none, [], false, false)
    end.

%% The leaf: the frame line at P, after the header line at S.
leaf(Chunk, S, P, Size, Type, Ctx = #ctx{nl = NL, max_line = Max}, St) when P < Size ->
    case binary:match(Chunk, NL, [{scope, {P, Size - P}}]) of
        {P, 1} ->
            %% No frame line: `[no stack]'.
            St2 = St#st{stacks = beamdiag_fold_stacks:add_frames(Type, [], false, false,
                                                                 St#st.stacks)},
            samples(Chunk, P + 1, Size, Ctx, St2);
        {E, 1} when E - P =< Max, binary_part(Chunk, P, 1) =:= <<"\t">> ->
            {Leaf, St2} = line(binary:part(Chunk, P, E - P), Ctx, St),
            callers(Chunk, S, E + 1, Size, Type, Leaf, Ctx, St2);
        _ ->
            slow(Chunk, S, Size, Ctx, St)
    end;
leaf(Chunk, S, _P, Size, _Type, Ctx, St) ->
    slow(Chunk, S, Size, Ctx, St).

%% The callers: the frame lines from C to the blank line, found whole in
%% the cache or read line by line (`walk/10') and cached.
callers(Chunk, S, C, Size, Type, Leaf, Ctx, St) when C < Size ->
    case Chunk of
        <<_:C/binary, $\n, _/binary>> ->
            %% A leaf alone.
            Empty = #callers{frames = [], node = 0, unknown = false, truncated = false, junk = 0},
            samples(Chunk, C + 1, Size, Ctx, commit(Type, Leaf, Empty, Ctx, St));
        <<_:C/binary, K1:56, K2:56, K3:56, K4:56, _/binary>> ->
            %% The key: the callers' first ?KEY bytes as integers (no
            %% binary is made).
            Key = {K1, K2, K3, K4},
            case St#st.blocks of
                #{Key := Same} ->
                    case find(Same, Chunk, C, Size) of
                        {Len, Callers} ->
                            samples(Chunk, C + Len, Size, Ctx, commit(Type, Leaf, Callers, Ctx, St));
                        none ->
                            read_callers(Chunk, S, C, Size, Type, Leaf, Key, Same, Ctx, St)
                    end;
                _ ->
                    read_callers(Chunk, S, C, Size, Type, Leaf, Key, [], Ctx, St)
            end;
        _ ->
            read_callers(Chunk, S, C, Size, Type, Leaf, none, [], Ctx, St)
    end;
callers(Chunk, S, _C, Size, _Type, _Leaf, Ctx, St) ->
    slow(Chunk, S, Size, Ctx, St).

%% A cached callers' text (its frame lines and the blank line) that the
%% chunk holds at C.
find([{Text, Callers} | Rest], Chunk, C, Size) ->
    %% The blank line that would end it first: callers that share their
    %% start can be long runs of one line of different lengths.
    Len = byte_size(Text),
    End = C + Len - 2,
    case Chunk of
        <<_:End/binary, "\n\n", _/binary>> when binary_part(Chunk, C, Len) =:= Text ->
            {Len, Callers};
        _ ->
            find(Rest, Chunk, C, Size)
    end;
find([], _Chunk, _C, _Size) ->
    none.

read_callers(Chunk, S, C, Size, Type, Leaf, Key, Same, Ctx, St) ->
    case walk(Chunk, C, Size, Ctx, St, [], [], false, false, 0) of
        {End, Names, Ids, U, T, Bad, St2} ->
            %% Names and Ids are root first.
            {Node, Tab} = beamdiag_fold_stacks:path(0, Ids, St2#st.stacks),
            St3 = St2#st{stacks = Tab},
            Callers = #callers{frames = lists:reverse(Names), node = Node, unknown = U,
                               truncated = T, junk = Bad},
            St4 = cache_callers(Key, Same, binary:part(Chunk, C, End - C), Callers, St3),
            samples(Chunk, End, Size, Ctx, commit(Type, Leaf, Callers, Ctx, St4));
        {slow, St2} ->
            slow(Chunk, S, Size, Ctx, St2)
    end.

cache_callers(none, _Same, _Text, _Callers, St) ->
    St;
cache_callers(_Key, _Same, Text, _Callers, St)
  when byte_size(Text) > ?BLOCK_MAX; byte_size(Text) < ?KEY ->
    %% Callers shorter than the key are found by text that is not theirs.
    St;
cache_callers(Key, Same, Text, Callers, St = #st{blocks_n = N, blocks_bytes = Bytes})
  when N >= ?BLOCKS_MAX; Bytes >= ?BLOCKS_BYTES ->
    %% Full: start again, so that the callers of text read later (another
    %% capture, another phase) are cached.
    cache_callers(Key, Same, Text, Callers, St#st{blocks = #{}, seen = #{}, blocks_n = 0,
                                                  blocks_bytes = 0});
cache_callers(Key, Same, Text, Callers, St = #st{blocks = Blocks, seen = Seen, blocks_n = N,
                                                 blocks_bytes = Bytes}) ->
    %% Most callers are seen once (frame-pointer chains end in garbage):
    %% they are cached when seen again, so that the copy is made only for
    %% callers that recur.
    Seen1 = {Key, byte_size(Text)},
    case Seen of
        #{Seen1 := _} ->
            Same2 = case map_size(Blocks) > 0 andalso is_map_key(Key, Blocks) of
                true -> lists:sublist(Same, ?SAME - 1);
                false -> []
            end,
            St#st{blocks = Blocks#{Key => [{copy(Text), Callers} | Same2]},
                  blocks_n = N + 1, blocks_bytes = Bytes + byte_size(Text)};
        _ ->
            St#st{seen = Seen#{Seen1 => true}, blocks_n = N + 1}
    end.

%% A copy of a binary: `binary:copy/1' copies byte by byte on OTP 25 (about
%% 0.5 ns a byte), building a binary from an iolist copies with memcpy
%% (a list of one binary would be that binary itself).
copy(Bin) ->
    list_to_binary([Bin, <<>>]).

%% The frame lines from P to the blank line, leaf first: their names and
%% frame numbers (root first, as read), unknown and truncated flags and
%% junk lines, and where the next sample starts; `slow' for anything
%% `fold_line_by_line/2' would read otherwise than as frame lines (a line
%% that does not start with a tab, an over-long line, the chunk's end).
%% Consecutive unknown frames count as one; end-of-unwind markers are
%% dropped (the stack is then truncated); junk lines are counted. A line's
%% run of equal lines is measured at once (`run/6') and named once.
walk(Chunk, P, Size, Ctx = #ctx{nl = NL, max_line = Max}, St, Names, Ids, U, T, Bad)
  when P < Size ->
    case Chunk of
        <<_:P/binary, $\n, _/binary>> ->
            {P + 1, Names, Ids, U, T, Bad, St};
        %% The lines of addresses perf could place nowhere, read without
        %% making a binary (`frame/3' names them so): frame-pointer chains
        %% through heap data give long runs of them.
        <<_:P/binary, "\t    ", C, _:11/binary, " [unknown] ([unknown])\n", _/binary>>
          when C =/= $0, C =/= $f, C =/= $\s, C =/= $\t, Ctx#ctx.perf_map =:= undefined,
               Max >= 39 ->
            UId = Ctx#ctx.unknown_id,
            case Ids of
                [UId | _] ->
                    walk(Chunk, P + 40, Size, Ctx, St, Names, Ids, true, T, Bad);
                _ ->
                    walk(Chunk, P + 40, Size, Ctx, St, [?UNKNOWN | Names], [UId | Ids], true, T,
                         Bad)
            end;
        <<_:P/binary, "\t               0 [unknown] ([unknown])\n", _/binary>> when Max >= 39 ->
            walk(Chunk, P + 40, Size, Ctx, St, Names, Ids, U, true, Bad);
        <<_:P/binary, "\tffffffffffffffff [unknown] ([unknown])\n", _/binary>> when Max >= 39 ->
            walk(Chunk, P + 40, Size, Ctx, St, Names, Ids, U, true, Bad);
        <<_:P/binary, $\t, _/binary>> ->
            case binary:match(Chunk, NL, [{scope, {P, Size - P}}]) of
                {E, 1} when E - P =< Max ->
                    Line = binary:part(Chunk, P, E - P),
                    L = E + 1 - P,
                    %% How many more of this line follow it.
                    More = case Chunk of
                        <<_:(E + L)/binary, $\n, _/binary>>
                          when binary_part(Chunk, E + 1, L - 1) =:= Line ->
                            run(Chunk, P, L, Size, 2, 2) - 1;
                        _ ->
                            0
                    end,
                    {F, St2} = line(Line, Ctx, St),
                    Next = E + 1 + More * L,
                    case F of
                        drop ->
                            walk(Chunk, Next, Size, Ctx, St2, Names, Ids, U, true, Bad);
                        junk ->
                            walk(Chunk, Next, Size, Ctx, St2, Names, Ids, U, T, Bad + 1 + More);
                        {_, Id} when Id =:= Ctx#ctx.unknown_id, Ids =/= [],
                                     hd(Ids) =:= Ctx#ctx.unknown_id ->
                            walk(Chunk, Next, Size, Ctx, St2, Names, Ids, true, T, Bad);
                        {Name, Id} when Id =:= Ctx#ctx.unknown_id ->
                            walk(Chunk, Next, Size, Ctx, St2, [Name | Names], [Id | Ids], true, T,
                                 Bad);
                        {Name, Id} ->
                            {Names2, Ids2} = push(More + 1, Name, Id, Names, Ids),
                            walk(Chunk, Next, Size, Ctx, St2, Names2, Ids2, U, T, Bad)
                    end;
                _ ->
                    {slow, St}
            end;
        _ ->
            {slow, St}
    end;
walk(_Chunk, _P, _Size, _Ctx, St, _Names, _Ids, _U, _T, _Bad) ->
    {slow, St}.

push(0, _Name, _Id, Names, Ids) ->
    {Names, Ids};
push(N, Name, Id, Names, Ids) ->
    push(N - 1, Name, Id, [Name | Names], [Id | Ids]).

%% The number of copies of the line of L bytes at P that start there,
%% knowing that Have do: the chunk is compared with itself at doubling
%% lengths, then halving ones, so a run of N lines takes about 2 log2 N
%% memcmps.
run(Chunk, P, L, Size, Have, Step) when Step >= 1 ->
    Len = Step * L,
    At = P + Have * L,
    case At + Len =< Size andalso binary:part(Chunk, At, Len) =:= binary:part(Chunk, P, Len) of
        true when Step =:= Have -> run(Chunk, P, L, Size, Have + Step, Step * 2);
        true -> run(Chunk, P, L, Size, Have + Step, Step div 2);
        false -> run(Chunk, P, L, Size, Have, Step div 2)
    end;
run(_Chunk, _P, _L, _Size, Have, _Step) ->
    Have.

%% Counts a sample whose leaf is Leaf and whose callers are Callers.
commit(Type, Leaf, #callers{frames = CFrames, node = CNode, unknown = CU, truncated = CT,
                            junk = CBad}, Ctx, St = #st{stacks = Tab}) ->
    {Frames, Node, U, T, Bad, Tab2} =
        case Leaf of
            drop ->
                {CFrames, CNode, CU, true, CBad, Tab};
            junk ->
                {CFrames, CNode, CU, CT, CBad + 1, Tab};
            {?UNKNOWN, _} when CFrames =/= [], hd(CFrames) =:= ?UNKNOWN ->
                {CFrames, CNode, true, CT, CBad, Tab};
            {Name, Id} ->
                {N, T2} = beamdiag_fold_stacks:child(CNode, Id, Tab),
                {[Name | CFrames], N, CU orelse Id =:= Ctx#ctx.unknown_id, CT, CBad, T2}
        end,
    Tab3 = case Frames =:= [] orelse (U andalso Ctx#ctx.cut) of
        true -> beamdiag_fold_stacks:add_frames(Type, Frames, U, T, Tab2);
        false -> beamdiag_fold_stacks:add(Type, Node, Frames, U, T, Tab2)
    end,
    St#st{stacks = Tab3, skipped = St#st.skipped + Bad}.

%% The thread type of a sample's header line with a call chain after it
%% (`skip' when the type is filtered out), or `slow' for any other line
%% (read line by line), and `{Prefix, After}' when `split/2' cut it. The
%% text before the time token (comm, tid, cpu) is the same for all samples
%% of a thread, and the text after it (period and event) for most: the
%% type is cached by both.
header(Header, Ctx, St = #st{heads = Heads}) ->
    case beamdiag_fold_header:split(Header, Ctx#ctx.colon) of
        {_Prefix, _After} = Key ->
            case Heads of
                #{Key := Type} ->
                    {Type, Key, St};
                _ ->
                    {Type, St2} = new_head(Key, Ctx, St),
                    {Type, Key, St2}
            end;
        slow ->
            case beamdiag_fold_header:parse(Header) of
                {ok, Comm, <<>>} ->
                    {Type, St2} = type(Comm, Ctx, St),
                    {Type, none, St2};
                _ ->
                    {slow, none, St}
            end
    end.

%% After the time: with an inline frame, perf recorded no call chain.
new_head({Prefix, After}, Ctx, St) ->
    {Type, St2 = #st{heads = Heads}} =
        case beamdiag_fold_header:inline(After) of
            <<>> ->
                case beamdiag_fold_header:comm(Prefix) of
                    {ok, Comm} -> type(Comm, Ctx, St);
                    error -> {slow, St}
                end;
            _ ->
                {slow, St}
        end,
    case map_size(Heads) < ?HEADS_MAX of
        true -> {Type, St2#st{heads = Heads#{{binary:copy(Prefix), binary:copy(After)} => Type}}};
        false -> {Type, St2}
    end.

%% Sample state: Type (binary | none | skip), Frames (root-first), Unknown
%% and Truncated flags.
lines([], Ctx, St, Type, Frames, U, T) ->
    emit(Ctx, St, Type, Frames, U, T);
lines([<<>> | Rest], Ctx, St, Type, Frames, U, T) ->
    lines(Rest, Ctx, emit(Ctx, St, Type, Frames, U, T), none, [], false, false);
lines([Line | Rest], Ctx, St, Type, Frames, U, T) when byte_size(Line) > Ctx#ctx.max_line ->
    lines(Rest, Ctx, St#st{huge = St#st.huge + 1}, Type, Frames, U, T);
lines([<<$\s, _/binary>> = Line | Rest], Ctx, St, Type, Frames, U, T) ->
    %% Header lines of perf script without call chains start with the
    %% right-aligned thread name; call-chain lines of some versions start
    %% with spaces.
    case beamdiag_fold_header:parse(Line) of
        {ok, _, _} -> header_line(Line, Rest, Ctx, St, Type, Frames, U, T);
        error -> frame_line(Line, Rest, Ctx, St, Type, Frames, U, T)
    end;
lines([<<$\t, _/binary>> = Line | Rest], Ctx, St, Type, Frames, U, T) ->
    frame_line(Line, Rest, Ctx, St, Type, Frames, U, T);
lines([Line | Rest], Ctx, St, Type, Frames, U, T) ->
    header_line(Line, Rest, Ctx, St, Type, Frames, U, T).

frame_line(Line, Rest, Ctx, St, Type, Frames, U, T) ->
    case Type of
        none ->
            %% A frame line outside a sample.
            lines(Rest, Ctx, St#st{skipped = St#st.skipped + 1}, Type, Frames, U, T);
        skip ->
            lines(Rest, Ctx, St, Type, Frames, U, T);
        _ ->
            {Frame, St2} = frame_name(Line, Ctx, St),
            case Frame of
                drop -> lines(Rest, Ctx, St2, Type, Frames, U, true);
                junk -> lines(Rest, Ctx, St2#st{skipped = St2#st.skipped + 1}, Type, Frames, U, T);
                ?UNKNOWN when Frames =/= [], hd(Frames) =:= ?UNKNOWN ->
                    lines(Rest, Ctx, St2, Type, Frames, true, T);
                ?UNKNOWN -> lines(Rest, Ctx, St2, Type, [?UNKNOWN | Frames], true, T);
                _ -> lines(Rest, Ctx, St2, Type, [Frame | Frames], U, T)
            end
    end.

%% A header line; a previous sample without a blank line ends here.
header_line(Line, Rest, Ctx, St, Type, Frames, U, T) ->
    St1 = emit(Ctx, St, Type, Frames, U, T),
    case beamdiag_fold_header:parse(Line) of
        {ok, Comm, <<>>} ->
            {Ty, St2} = type(Comm, Ctx, St1),
            lines(Rest, Ctx, St2, Ty, [], false, false);
        {ok, Comm, Inline} ->
            %% perf script without call chains: the leaf on the header line.
            {Ty, St2} = type(Comm, Ctx, St1),
            {Frame, St3} = frame_name(Inline, Ctx, St2),
            case Frame of
                F when F =:= drop; F =:= junk ->
                    lines(Rest, Ctx, St3, Ty, [], false, false);
                ?UNKNOWN ->
                    lines(Rest, Ctx, St3, Ty, [?UNKNOWN], true, false);
                _ ->
                    lines(Rest, Ctx, St3, Ty, [Frame], false, false)
            end;
        error ->
            lines(Rest, Ctx, St1#st{skipped = St1#st.skipped + 1}, none, [], false, false)
    end.

emit(_Ctx, St, none, _, _, _) ->
    St;
emit(_Ctx, St, skip, _, _, _) ->
    St;
emit(_Ctx, St = #st{stacks = Tab}, Type, Frames, U, T) ->
    St#st{stacks = beamdiag_fold_stacks:add_frames(Type, lists:reverse(Frames), U, T, Tab)}.

type(Comm, #ctx{types = Types}, St = #st{comms = Cs}) ->
    case Cs of
        #{Comm := Ty} ->
            {Ty, St};
        _ ->
            %% A copy: the type may be part of the chunk.
            Ty0 = binary:copy(beamdiag_fold_header:thread_type(Comm)),
            Ty = case Types =:= all orelse lists:member(Ty0, Types) of
                true -> Ty0;
                false -> skip
            end,
            Cs2 = case map_size(Cs) < 10000 of
                true -> Cs#{binary:copy(Comm) => Ty};
                false -> Cs
            end,
            {Ty, St#st{comms = Cs2}}
    end.

%% A frame line's name and number, `drop' or `junk', cached by the whole
%% line: the lines of callers are return addresses, which recur, and so do
%% most leaves. Addresses perf could place nowhere rarely recur and are
%% not cached.
line(Line, Ctx, St = #st{cache = Cache}) ->
    case Cache of
        #{Line := F} ->
            {F, St};
        _ ->
            case frame(Line, Ctx, St) of
                {{?UNKNOWN, _}, _} = R ->
                    R;
                {F, St2 = #st{cache = Cache2}} ->
                    case map_size(Cache2) < ?CACHE_MAX of
                        true -> {F, St2#st{cache = Cache2#{binary:copy(Line) => F}}};
                        false -> {F, St2}
                    end
            end
    end.

%% A frame line's name and number, `drop' or `junk'.
frame(<<$\t, Field:16/binary, $\s, Rest/binary>> = Line, Ctx, St) ->
    %% The usual layout: the address right-aligned in sixteen bytes.
    case Rest of
        <<"[unknown] ([unknown])">> when Ctx#ctx.perf_map =:= undefined ->
            %% An address perf could place nowhere: the end of an unwind
            %% (`drop': the text after the blanks starts with `0 ' or
            %% `ffffffffffffffff '), or `[unknown]'
            %% (`beamdiag_fold_frame:unknown/2'). Frame-pointer chains
            %% through heap data give long runs of these.
            case Field of
                <<"    ", C, _/binary>> when C =/= $0, C =/= $f, C =/= $\s, C =/= $\t ->
                    {{?UNKNOWN, Ctx#ctx.unknown_id}, St};
                _ ->
                    unknown_frame(Line, Ctx, St)
            end;
        _ when binary_part(Line, byte_size(Line), -21) =:= <<"[unknown] ([unknown])">> ->
            unknown_frame(Line, Ctx, St);
        _ ->
            symbol_frame(Field, Rest, Line, Ctx, St)
    end;
frame(Line, Ctx, St) when byte_size(Line) > 21,
                          binary_part(Line, byte_size(Line), -21) =:= <<"[unknown] ([unknown])">> ->
    unknown_frame(Line, Ctx, St);
frame(Line, Ctx, St) ->
    line_frame(Line, Ctx, St).

%% The name is cached by the text after the address, which repeats far
%% more than the line (a leaf's address differs from sample to sample).
symbol_frame(Field, Rest, Line, Ctx, St = #st{syms = Syms}) ->
    case beamdiag_fold_frame:is_address(Field) of
        true ->
            case Syms of
                #{Rest := address} ->
                    line_frame(Line, Ctx, St);
                #{Rest := F} ->
                    {F, St};
                _ ->
                    case beamdiag_fold_frame:symbol(Rest, Ctx#ctx.perf_map) of
                        address ->
                            line_frame(Line, Ctx, cache_symbol(Rest, address, St));
                        F0 ->
                            {F, St2} = with_id(F0, St),
                            {F, cache_symbol(Rest, F, St2)}
                    end
            end;
        false ->
            line_frame(Line, Ctx, St)
    end.

cache_symbol(Rest, F, St = #st{syms = Syms}) ->
    case map_size(Syms) < ?CACHE_MAX of
        true -> St#st{syms = Syms#{binary:copy(Rest) => F}};
        false -> St
    end.

%% Addresses perf could place nowhere rarely repeat (frame-pointer chains
%% through heap data): a quick look, no cache entry.
unknown_frame(Line, Ctx, St) ->
    case beamdiag_fold_frame:unknown(Line, Ctx#ctx.perf_map) of
        ?UNKNOWN -> {{?UNKNOWN, Ctx#ctx.unknown_id}, St};
        F -> with_id(F, St)
    end.

%% Any other frame line: its name cached by the whole line.
line_frame(Line, Ctx, St = #st{cache = Cache}) ->
    case Cache of
        #{Line := F} ->
            {F, St};
        _ ->
            {F, St2} = with_id(beamdiag_fold_frame:parse(Line, Ctx#ctx.perf_map), St),
            Cache2 = case map_size(Cache) < ?CACHE_MAX of
                true -> Cache#{binary:copy(Line) => F};
                false -> Cache
            end,
            {F, St2#st{cache = Cache2}}
    end.

with_id(Name, St = #st{stacks = Tab}) when is_binary(Name) ->
    {Name2, Id, Tab2} = beamdiag_fold_stacks:frame_id(Name, Tab),
    {{Name2, Id}, St#st{stacks = Tab2}};
with_id(Other, St) ->
    {Other, St}.

%% A frame line's name, `drop' or `junk'.
frame_name(Line, Ctx, St) ->
    case frame(Line, Ctx, St) of
        {{Name, _Id}, St2} -> {Name, St2};
        Other -> Other
    end.
