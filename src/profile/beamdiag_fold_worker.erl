%%% @doc One fold worker: folds the chunks of `perf script' text it is sent
%%% into counted stacks, and answers with its profile at the end.
%%%
%%% Samples of perf script with call chains are a header line and a block
%%% of frame lines, leaf first, ended by a blank line. What costs is the
%%% work per line, so the worker does as little of it as it can:
%%% <ul>
%%% <li>the chunk's line ends are found in one pass in C
%%%   (`binary:matches/2'), and a blank line is two in a row;</li>
%%% <li>the header's thread type is cached by the text before its time
%%%   (`beamdiag_fold_header:split/2');</li>
%%% <li>a block's callers (all its lines but the leaf) recur even when the
%%%   leaf's address does not: they are cached whole, found by their size
%%%   and first line and compared whole, and only new ones are read line
%%%   by line;</li>
%%% <li>a frame line's name is cached by its text after the address
%%%   (`beamdiag_fold_frame:symbol/2'), which repeats far more than the
%%%   line; a line equal to the one before (recursion) takes its name;
%%%   addresses perf could place nowhere (long runs of them where
%%%   frame-pointer chains go through heap data) are named by a glance at
%%%   the address field;</li>
%%% <li>stacks are numbered and counted by `beamdiag_fold_stacks', by a
%%%   hash built frame by frame rather than by hashing the frame list.</li>
%%% </ul>
%%% On OTP 25, matching a binary byte by byte in Erlang costs about 10 ns a
%%% byte, and a search pattern compiled at each call costs more than the
%%% search: the scans are BIFs with patterns compiled once per worker.
%%%
%%% Text without blank lines (no call chains), samples whose header is not
%%% of the usual shape, and text that is not perf output go line by line.
%%% Lines that are not perf output are skipped and counted, over-long
%%% lines are skipped and counted.
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
-define(BLOCKS_MAX, 20000).
-define(HEADS_MAX, 10000).
-define(UNKNOWN, <<"[unknown]">>).

-record(ctx, {
    max_line :: pos_integer(),
    perf_map :: tuple() | undefined,
    types :: all | [binary()],
    nl :: binary:cp(),
    colon :: binary:cp(),
    unknown_code :: non_neg_integer()
}).

-record(st, {
    stacks :: beamdiag_fold_stacks:table(),
    %% Frame line => {Name, Code} | drop | junk (Code: the name's
    %% `beamdiag_fold_stacks:code/1').
    cache = #{} :: map(),
    %% A frame line's text after its address => {Name, Code} | junk |
    %% address (the name depends on the address: see `cache').
    syms = #{} :: map(),
    %% {Size, Head} => [{Callers, Frames, Hash, Truncated, Junk}]: the
    %% callers' lines of a block (`callers/3').
    blocks = #{} :: map(),
    %% Comm => thread type.
    comms = #{} :: map(),
    %% The text before a header's time token => thread type.
    heads = #{} :: map(),
    %% The text after a header's time token => whether it holds no inline
    %% frame.
    tails = #{} :: map(),
    skipped = 0 :: non_neg_integer(),
    huge = 0 :: non_neg_integer()
}).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Starts a worker for `Parent', monitored, with the folder's checked
%% options (`beamdiag_fold') and extra spawn options (its heap).
-spec start(pid(), map(), [erlang:spawn_opt_option()]) -> {pid(), reference()}.
start(Parent, Opts, SpawnOpts) ->
    Ctx = ctx(Opts),
    St = #st{stacks = beamdiag_fold_stacks:new(Opts)},
    spawn_opt(fun() -> worker_loop(Parent, Ctx, St) end, [monitor | SpawnOpts]).

-ifdef(TEST).
%% @doc Folds text line by line, in this process, without the caches of
%% samples' headers and callers: what the fast paths must agree with on
%% perf script text.
-spec fold_line_by_line(binary(), map()) -> beamdiag_fold:profile().
fold_line_by_line(Text, Opts) ->
    Ctx = #ctx{nl = NL} = ctx(Opts),
    St = #st{stacks = beamdiag_fold_stacks:new(Opts)},
    to_profile(lines(binary:split(Text, NL, [global]), Ctx, St, none, [], false, false)).
-endif.

%%%===================================================================
%%% Internal
%%%===================================================================

ctx(#{max_line := ML, perf_map := PM, thread_types := TT}) ->
    #ctx{
        max_line = ML,
        perf_map = PM,
        types = TT,
        nl = binary:compile_pattern(<<"\n">>),
        colon = beamdiag_fold_header:colon(),
        unknown_code = beamdiag_fold_stacks:code(?UNKNOWN)
    }.

worker_loop(Parent, Ctx, St) ->
    receive
        {chunk, Chunk} ->
            St2 = fold_chunk(Chunk, Ctx, St),
            Parent ! {ack, self()},
            worker_loop(Parent, Ctx, St2);
        {done, From} ->
            From ! {profile, self(), to_profile(St)}
    end.

to_profile(#st{stacks = Tab, skipped = Sk, huge = H}) ->
    maps:merge(beamdiag_fold_profile:empty(),
               (beamdiag_fold_stacks:counts(Tab))#{skipped_lines => Sk, huge_lines => H}).

%% Samples of perf script with call chains end in a blank line. The
%% chunk's line ends are found in one pass (`binary:matches/2' with a
%% one-byte pattern, in C; a blank line is two in a row), which is about
%% twice as fast as searching for the two-byte separator. Text without
%% blank lines (no call chains, or not perf output) goes line by line.
fold_chunk(Chunk, Ctx = #ctx{nl = NL}, St) ->
    samples(Chunk, 0, binary:matches(Chunk, NL), Ctx, St).

%% Ms: the positions of the chunk's line ends from Start on.
samples(Chunk, Start, Ms, Ctx = #ctx{nl = NL}, St) ->
    case blank(Ms, none) of
        {HeaderEnd, Blank, Rest} ->
            St2 = sample(Chunk, Start, HeaderEnd, Blank, Ctx, St),
            samples(Chunk, Blank + 2, Rest, Ctx, St2);
        none ->
            Tail = binary:part(Chunk, Start, byte_size(Chunk) - Start),
            lines(binary:split(Tail, NL, [global]), Ctx, St, none, [], false, false)
    end.

%% The first line end (the header's, `none' for a one-line sample), the
%% blank line's start and the line ends after it.
blank([{P, 1}, {Q, 1} | Rest], First) when Q =:= P + 1 ->
    {First, P, Rest};
blank([{P, 1} | Rest], none) ->
    blank(Rest, P);
blank([_ | Rest], First) ->
    blank(Rest, First);
blank([], _) ->
    none.

sample(Chunk, Start, HeaderEnd, Blank, Ctx = #ctx{max_line = Max}, St)
  when is_integer(HeaderEnd), HeaderEnd - Start =< Max ->
    case binary:at(Chunk, Start) of
        $\t ->
            sample_lines(binary:part(Chunk, Start, Blank - Start), Ctx, St);
        _ ->
            case header(binary:part(Chunk, Start, HeaderEnd - Start), Ctx, St) of
                {slow, St2} ->
                    sample_lines(binary:part(Chunk, Start, Blank - Start), Ctx, St2);
                {Type, St2} ->
                    block(Type, binary:part(Chunk, HeaderEnd + 1, Blank - HeaderEnd - 1), Ctx, St2)
            end
    end;
sample(Chunk, Start, _HeaderEnd, Blank, Ctx, St) ->
    sample_lines(binary:part(Chunk, Start, Blank - Start), Ctx, St).

%% The thread type of a sample's header line with a call chain after it
%% (`skip' when the type is filtered out), or `slow' for any other line
%% (read line by line). The text before the time token (comm, tid, cpu)
%% is the same for all samples of a thread: its type is cached.
header(Header, Ctx, St = #st{heads = Heads, tails = Tails}) ->
    case beamdiag_fold_header:split(Header, Ctx#ctx.colon) of
        {Prefix, After} ->
            %% After the time: the period and event, the same for most
            %% samples; with an inline frame, perf recorded no call chain.
            {NoInline, St2} = case Tails of
                #{After := E} ->
                    {E, St};
                _ ->
                    E = beamdiag_fold_header:inline(After) =:= <<>>,
                    case map_size(Tails) < ?HEADS_MAX of
                        true -> {E, St#st{tails = Tails#{binary:copy(After) => E}}};
                        false -> {E, St}
                    end
            end,
            case NoInline of
                true ->
                    case Heads of
                        #{Prefix := Type} -> {Type, St2};
                        _ -> new_head(Prefix, Ctx, St2)
                    end;
                false ->
                    {slow, St2}
            end;
        slow ->
            case beamdiag_fold_header:parse(Header) of
                {ok, Comm, <<>>} -> type(Comm, Ctx, St);
                _ -> {slow, St}
            end
    end.

new_head(Prefix, Ctx, St) ->
    {Type, St2 = #st{heads = Heads}} =
        case beamdiag_fold_header:comm(Prefix) of
            {ok, Comm} -> type(Comm, Ctx, St);
            error -> {slow, St}
        end,
    case map_size(Heads) < ?HEADS_MAX of
        true -> {Type, St2#st{heads = Heads#{binary:copy(Prefix) => Type}}};
        false -> {Type, St2}
    end.

sample_lines(Sample, Ctx = #ctx{nl = NL}, St) ->
    lines(binary:split(Sample, NL, [global]) ++ [<<>>], Ctx, St, none, [], false, false).

%% A sample's block of frame lines, leaf first. The leaf's address
%% differs from sample to sample, but its callers' return addresses
%% recur: the callers' lines are cached whole and only new ones are read
%% line by line, then the leaf is added to them.
block(skip, _Block, _Ctx, St) ->
    St;
block(Type, Block, Ctx = #ctx{nl = NL}, St) ->
    {Leaf, Callers} = case binary:match(Block, NL) of
        nomatch ->
            {Block, <<>>};
        {P, 1} ->
            {binary:part(Block, 0, P), binary:part(Block, P + 1, byte_size(Block) - P - 1)}
    end,
    {Frames0, H0, U0, T0, Bad0, St2} = callers(Callers, Ctx, St),
    {Frames, H, U, T, Bad, St3} = frame_lines([Leaf], Ctx, St2, Frames0, H0, U0, T0, Bad0),
    St3#st{stacks = beamdiag_fold_stacks:add(Type, Frames, H, U, T, St3#st.stacks),
           skipped = St3#st.skipped + Bad}.

%% The frames of a block's callers (leaf first), their hash (`hash/2'),
%% unknown and truncated flags and junk lines. The cache key is the text's
%% size and first line or so; the whole text is compared only against the
%% few cached ones with that key, which is cheaper than hashing it.
callers(<<>>, _Ctx, St) ->
    {[], 0, false, false, 0, St};
callers(Callers, Ctx = #ctx{nl = NL}, St = #st{blocks = Blocks}) ->
    Key = {byte_size(Callers), binary:part(Callers, 0, min(byte_size(Callers), 64))},
    Same = maps:get(Key, Blocks, []),
    case lists:keyfind(Callers, 1, Same) of
        {_, Frames, H, T, Bad} ->
            {Frames, H, false, T, Bad, St};
        false ->
            Lines = lists:reverse(binary:split(Callers, NL, [global])),
            {Frames, H, U, T, Bad, St2} = frame_lines(Lines, Ctx, St, [], 0, false, false, 0),
            %% Callers with unknown frames rarely repeat (frame-pointer
            %% chains through heap data), and over-long lines are counted
            %% each time: neither is cached.
            case not U andalso St2#st.huge =:= St#st.huge andalso length(Same) < 4 andalso
                     map_size(Blocks) < ?BLOCKS_MAX of
                true ->
                    %% Copies: a sub-binary in the cache would keep its
                    %% whole chunk alive.
                    {Size, Head} = Key,
                    Entry = {binary:copy(Callers), Frames, H, T, Bad},
                    Blocks2 = Blocks#{{Size, binary:copy(Head)} => [Entry | Same]},
                    {Frames, H, U, T, Bad, St2#st{blocks = Blocks2}};
                false ->
                    {Frames, H, U, T, Bad, St2}
            end
    end.

%% Frame lines root first (the reverse of perf's order), added to Frames
%% (leaf first) and to their hash H (`hash/2', root first). Consecutive
%% unknown frames count as one; end-of-unwind markers are dropped (the
%% stack is then truncated); junk lines are counted. A line equal to the
%% one before (non-tail recursion) is named as that one was, without a
%% look at the caches.
frame_lines(Lines, Ctx, St, Frames, H, U, T, Bad) ->
    frame_lines(Lines, Ctx, St, Frames, H, U, T, Bad, none).

frame_lines([], _Ctx, St, Frames, H, U, T, Bad, _Prev) ->
    {Frames, H, U, T, Bad, St};
frame_lines([Line | Rest], Ctx, St, Frames, H, U, T, Bad, {Line, F}) ->
    add_frame(F, Line, Rest, Ctx, St, Frames, H, U, T, Bad);
frame_lines([Line | Rest], Ctx, St, Frames, H, U, T, Bad, _Prev)
  when byte_size(Line) > Ctx#ctx.max_line ->
    frame_lines(Rest, Ctx, St#st{huge = St#st.huge + 1}, Frames, H, U, T, Bad, none);
frame_lines([Line | Rest], Ctx, St, Frames, H, U, T, Bad, _Prev) ->
    {F, St2} = frame(Line, Ctx, St),
    add_frame(F, Line, Rest, Ctx, St2, Frames, H, U, T, Bad).

add_frame(F, Line, Rest, Ctx, St, Frames, H, U, T, Bad) ->
    Prev = {Line, F},
    case F of
        drop ->
            frame_lines(Rest, Ctx, St, Frames, H, U, true, Bad, Prev);
        junk ->
            frame_lines(Rest, Ctx, St, Frames, H, U, T, Bad + 1, Prev);
        {?UNKNOWN, _} when Frames =/= [], hd(Frames) =:= ?UNKNOWN ->
            frame_lines(Rest, Ctx, St, Frames, H, true, T, Bad, Prev);
        {?UNKNOWN, Code} ->
            frame_lines(Rest, Ctx, St, [?UNKNOWN | Frames], beamdiag_fold_stacks:hash(H, Code),
                        true, T, Bad, Prev);
        {Frame, Code} ->
            frame_lines(Rest, Ctx, St, [Frame | Frames], beamdiag_fold_stacks:hash(H, Code),
                        U, T, Bad, Prev)
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
    Leafward = lists:reverse(Frames),
    St#st{stacks = beamdiag_fold_stacks:add(Type, Leafward, beamdiag_fold_stacks:hash(Leafward),
                                            U, T, Tab)}.

type(Comm, #ctx{types = Types}, St = #st{comms = Cs}) ->
    case Cs of
        #{Comm := Ty} ->
            {Ty, St};
        _ ->
            Ty0 = beamdiag_fold_header:thread_type(Comm),
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

%% A frame line's name and code (`hash/2'), `drop' or `junk'.
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
                    {{?UNKNOWN, Ctx#ctx.unknown_code}, St};
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
                            F = with_code(F0),
                            {F, cache_symbol(Rest, F, St)}
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
        ?UNKNOWN -> {{?UNKNOWN, Ctx#ctx.unknown_code}, St};
        F when is_binary(F) -> {{F, beamdiag_fold_stacks:code(F)}, St};
        F -> {F, St}
    end.

%% Any other frame line: its name cached by the whole line.
line_frame(Line, Ctx, St = #st{cache = Cache}) ->
    case Cache of
        #{Line := F} ->
            {F, St};
        _ ->
            F = with_code(beamdiag_fold_frame:parse(Line, Ctx#ctx.perf_map)),
            Cache2 = case map_size(Cache) < ?CACHE_MAX of
                true -> Cache#{binary:copy(Line) => F};
                false -> Cache
            end,
            {F, St#st{cache = Cache2}}
    end.

with_code(Name) when is_binary(Name) -> {Name, beamdiag_fold_stacks:code(Name)};
with_code(Other) -> Other.

%% A frame line's name, `drop' or `junk'.
frame_name(Line, Ctx, St) ->
    case frame(Line, Ctx, St) of
        {{Name, _Code}, St2} -> {Name, St2};
        Other -> Other
    end.
