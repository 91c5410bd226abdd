%%% @doc One fold worker: folds the chunks of `perf script' text it is sent
%%% into counted stacks, and answers with its profile at the end.
%%%
%%% Samples of perf script with call chains are a header line and a block
%%% of frame lines, ended by a blank line. The same block recurs often, so
%%% blocks are cached whole and only new blocks are named line by line
%%% (frame names are cached too); a sample is counted by a stack number,
%%% not by hashing its frame list. Text without blank lines (no call
%%% chains, or not perf output) goes line by line. The number of distinct
%%% stacks is bounded (`[other stacks]' past it), lines that are not perf
%%% output are skipped and counted, over-long lines are skipped and counted.
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

-define(CACHE_MAX, 100000).
-define(BLOCKS_MAX, 20000).
-define(UNKNOWN, <<"[unknown]">>).

-record(ctx, {
    max_stacks :: pos_integer(),
    max_line :: pos_integer(),
    cut_unknown :: boolean(),
    perf_map :: tuple() | undefined,
    types :: all | [binary()],
    nl :: binary:cp()
}).

-record(st, {
    %% {Type, StackId} => samples; StackId numbers a distinct frame list
    %% (`ids'), so that counting a sample hashes two small terms, not the
    %% whole stack.
    stacks = #{} :: map(),
    ids = #{} :: map(),
    cache = #{} :: map(),
    blocks = #{} :: map(),
    comms = #{} :: map(),
    samples = 0 :: non_neg_integer(),
    unknown = 0 :: non_neg_integer(),
    truncated = 0 :: non_neg_integer(),
    skipped = 0 :: non_neg_integer(),
    huge = 0 :: non_neg_integer(),
    overflow = 0 :: non_neg_integer()
}).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Starts a worker for `Parent', monitored, with the folder's checked
%% options (`beamdiag_fold') and extra spawn options (its heap).
-spec start(pid(), map(), [erlang:spawn_opt_option()]) -> {pid(), reference()}.
start(Parent, Opts, SpawnOpts) ->
    Ctx = ctx(Opts),
    spawn_opt(fun() -> worker_loop(Parent, Ctx, #st{}) end, [monitor | SpawnOpts]).

%%%===================================================================
%%% Internal
%%%===================================================================

ctx(#{max_stacks := MS, max_line := ML, unknown := U, perf_map := PM, thread_types := TT}) ->
    #ctx{
        max_stacks = MS,
        max_line = ML,
        cut_unknown = U =:= cut,
        perf_map = PM,
        types = TT,
        nl = binary:compile_pattern(<<"\n">>)
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

to_profile(#st{stacks = S0, ids = Ids, samples = N, unknown = U, truncated = T, skipped = Sk,
               huge = H, overflow = O}) ->
    Frames = maps:from_list([{Id, F} || {F, Id} <- maps:to_list(Ids)]),
    S = maps:fold(fun({Type, Id}, C, Acc) -> Acc#{[Type | maps:get(Id, Frames)] => C} end,
                  #{}, S0),
    (beamdiag_fold_profile:empty())#{
        stacks := S,
        samples := N,
        unknown_samples := U,
        truncated_samples := T,
        skipped_lines := Sk,
        huge_lines := H,
        overflow_samples := O
    }.

%% Samples of perf script with call chains end in a blank line. Each
%% sample is a header line and a block of frame lines; the same block
%% (same addresses) recurs often, so blocks are cached whole and only new
%% blocks are parsed line by line. The chunk's line ends are found in one
%% pass (a blank line is two in a row), which is cheaper than searching
%% for the two-byte separator. Text without blank lines (no call chains,
%% or not perf output) goes line by line.
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
    Header = binary:part(Chunk, Start, HeaderEnd - Start),
    case Header of
        <<C, _/binary>> when C =/= $\t ->
            case beamdiag_fold_header:parse(Header) of
                {ok, Comm, <<>>} ->
                    {Type, St2} = type(Comm, Ctx, St),
                    block(Type, binary:part(Chunk, HeaderEnd + 1, Blank - HeaderEnd - 1), Ctx, St2);
                _ ->
                    sample_lines(binary:part(Chunk, Start, Blank - Start), Ctx, St)
            end;
        _ ->
            sample_lines(binary:part(Chunk, Start, Blank - Start), Ctx, St)
    end;
sample(Chunk, Start, _HeaderEnd, Blank, Ctx, St) ->
    sample_lines(binary:part(Chunk, Start, Blank - Start), Ctx, St).

sample_lines(Sample, Ctx = #ctx{nl = NL}, St) ->
    lines(binary:split(Sample, NL, [global]) ++ [<<>>], Ctx, St, none, [], false, false).

block(skip, _Block, _Ctx, St) ->
    St;
block(Type, Block, Ctx, St = #st{blocks = Blocks}) ->
    %% The key is the block's size and first line or so (the leaf's
    %% address); the whole block is compared only against the few cached
    %% blocks with that key, which is cheaper than hashing it.
    Key = {byte_size(Block), binary:part(Block, 0, min(byte_size(Block), 64))},
    Same = maps:get(Key, Blocks, []),
    case lists:keyfind(Block, 1, Same) of
        {_, Stack, Bad} ->
            count(Ctx, Type, Stack, St#st{skipped = St#st.skipped + Bad});
        false ->
            {Frames, U, T, Bad, St2} = block_lines(binary:split(Block, Ctx#ctx.nl, [global]),
                                                   Ctx, St, [], false, false, 0),
            {Stack, St3} = intern(Ctx, St2, Frames, U, T),
            %% Blocks with unknown frames rarely repeat: not cached.
            Blocks2 = case map_size(Blocks) < ?BLOCKS_MAX andalso not U andalso length(Same) < 4 of
                true -> Blocks#{Key => [{binary:copy(Block), Stack, Bad} | Same]};
                false -> Blocks
            end,
            count(Ctx, Type, Stack, St3#st{blocks = Blocks2, skipped = St3#st.skipped + Bad})
    end.

block_lines([], _Ctx, St, Frames, U, T, Bad) ->
    {Frames, U, T, Bad, St};
block_lines([Line | Rest], Ctx, St, Frames, U, T, Bad) when byte_size(Line) > Ctx#ctx.max_line ->
    block_lines(Rest, Ctx, St#st{huge = St#st.huge + 1}, Frames, U, T, Bad);
block_lines([Line | Rest], Ctx, St, Frames, U, T, Bad) ->
    {Frame, St2} = frame(Line, Ctx, St),
    case Frame of
        drop -> block_lines(Rest, Ctx, St2, Frames, U, true, Bad);
        junk -> block_lines(Rest, Ctx, St2, Frames, U, T, Bad + 1);
        ?UNKNOWN when hd(Frames) =:= ?UNKNOWN -> block_lines(Rest, Ctx, St2, Frames, true, T, Bad);
        ?UNKNOWN -> block_lines(Rest, Ctx, St2, [?UNKNOWN | Frames], true, T, Bad);
        _ -> block_lines(Rest, Ctx, St2, [Frame | Frames], U, T, Bad)
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
            {Frame, St2} = frame(Line, Ctx, St),
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
            {Frame, St3} = frame(Inline, Ctx, St2),
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
emit(Ctx, St, Type, Frames, U, T) ->
    {Stack, St2} = intern(Ctx, St, Frames, U, T),
    count(Ctx, Type, Stack, St2).

%% A sample's frames as they will be counted, numbered: `{Id, Unknown,
%% Truncated}', Id `overflow' past the bound on distinct stacks.
intern(#ctx{max_stacks = Max, cut_unknown = Cut}, St = #st{ids = Ids}, Frames0, U, T) ->
    {Frames, U1, T1} =
        case Frames0 of
            [] -> {[<<"[no stack]">>], U, T};
            _ when U, Cut ->
                Kept = cut_unknown(Frames0),
                {Kept, lists:member(?UNKNOWN, Kept), true};
            _ -> {Frames0, U, T}
        end,
    case Ids of
        #{Frames := Id} ->
            {{Id, U1, T1}, St};
        _ when map_size(Ids) < Max ->
            Id = map_size(Ids),
            {{Id, U1, T1}, St#st{ids = Ids#{Frames => Id}}};
        _ ->
            {{overflow, U1, T1}, St}
    end.

count(#ctx{max_stacks = Max}, Type, {Id, U, T}, St = #st{stacks = S, samples = N}) ->
    Key = {Type, Id},
    St2 = case S of
        #{Key := C} ->
            St#st{stacks = S#{Key := C + 1}};
        _ when Id =/= overflow, map_size(S) < Max ->
            St#st{stacks = S#{Key => 1}};
        _ ->
            overflow(Type, St)
    end,
    St3 = case U of
        true -> St2#st{unknown = St2#st.unknown + 1};
        false -> St2
    end,
    St4 = case T of
        true -> St3#st{truncated = St3#st.truncated + 1};
        false -> St3
    end,
    St4#st{samples = N + 1}.

%% Past the bound on distinct stacks, samples count as `[other stacks]'.
overflow(Type, St = #st{stacks = S, ids = Ids}) ->
    Other = [<<"[other stacks]">>],
    {Id, Ids2} = case Ids of
        #{Other := I} -> {I, Ids};
        _ -> {map_size(Ids), Ids#{Other => map_size(Ids)}}
    end,
    St#st{stacks = maps:update_with({Type, Id}, fun(X) -> X + 1 end, 1, S), ids = Ids2,
          overflow = St#st.overflow + 1}.

%% Keeps the frames leafwards of the last [unknown] frame (frames are
%% root-first): with frame-pointer unwinding everything rootwards of an
%% unknown frame is garbage.
cut_unknown(Frames) ->
    case lists:splitwith(fun(F) -> F =/= ?UNKNOWN end, lists:reverse(Frames)) of
        {[], _} -> [?UNKNOWN];
        {Leafward, _} -> lists:reverse(Leafward)
    end.

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

frame(Line, Ctx, St) when byte_size(Line) > 21,
                          binary_part(Line, byte_size(Line), -21) =:= <<"[unknown] ([unknown])">> ->
    %% Addresses perf could place nowhere rarely repeat (frame-pointer
    %% chains through heap data): a quick look, no cache entry.
    {beamdiag_fold_frame:unknown(Line, Ctx#ctx.perf_map), St};
frame(Line, Ctx, St = #st{cache = Cache}) ->
    case Cache of
        #{Line := F} ->
            {F, St};
        _ ->
            F = beamdiag_fold_frame:parse(Line, Ctx#ctx.perf_map),
            Cache2 = case map_size(Cache) < ?CACHE_MAX of
                true -> Cache#{binary:copy(Line) => F};
                false -> Cache
            end,
            {F, St#st{cache = Cache2}}
    end.
