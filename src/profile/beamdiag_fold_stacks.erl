%%% @doc The stacks a fold worker counts: numbering distinct frame lists
%%% and counting samples by thread type and stack number.
%%%
%%% A stack is given leaf first, with its hash (`hash/2', folded root
%%% first, so that a cached run of callers can be extended by its leaf).
%%% Stacks are found by hash, and the frame list is compared only with the
%%% few stacks of the same hash: cheaper than hashing the list in a map
%%% key. A sample is counted under `{Type, StackNumber}'. The number of
%%% distinct stacks is bounded: past it, samples count as `[other
%%% stacks]'. With `unknown => cut', the frames rootwards of the leafmost
%%% `[unknown]' frame are dropped (with frame-pointer unwinding they are
%%% garbage).
%%%
%%% ```
%%% 1> T0 = beamdiag_fold_stacks:new(#{max_stacks => 10, unknown => keep}).
%%% 2> F = [<<"lists:foldl/3">>, <<"main">>].
%%% 3> T1 = beamdiag_fold_stacks:add(<<"scheduler">>, F, beamdiag_fold_stacks:hash(F), false, false, T0).
%%% 4> maps:get(stacks, beamdiag_fold_stacks:counts(T1)).
%%% #{[<<"scheduler">>, <<"main">>, <<"lists:foldl/3">>] => 1}
%%% '''
-module(beamdiag_fold_stacks).

-export([new/1, add/6, hash/1, hash/2, code/1, counts/1]).

-export_type([table/0]).

-define(UNKNOWN, <<"[unknown]">>).

-record(stacks, {
    max :: pos_integer(),
    cut :: boolean(),
    %% {Type, StackNumber} => samples.
    counts = #{} :: #{{binary(), non_neg_integer()} => pos_integer()},
    %% Hash => [{Frames, StackNumber}].
    ids = #{} :: #{non_neg_integer() => [{[binary()], non_neg_integer()}]},
    nids = 0 :: non_neg_integer(),
    samples = 0 :: non_neg_integer(),
    unknown = 0 :: non_neg_integer(),
    truncated = 0 :: non_neg_integer(),
    overflow = 0 :: non_neg_integer()
}).

-opaque table() :: #stacks{}.

%%%===================================================================
%%% API
%%%===================================================================

%% @doc No stacks, with the folder's checked options (`max_stacks',
%% `unknown').
-spec new(#{max_stacks := pos_integer(), unknown := keep | cut, atom() => term()}) -> table().
new(#{max_stacks := Max, unknown := U}) ->
    #stacks{max = Max, cut = U =:= cut}.

%% @doc Counts a sample of thread type `Type' whose frames are `Frames'
%% (leaf first), of hash `H' (`hash/1'); `Unknown': a frame is
%% `[unknown]', `Truncated': the unwind was cut short.
-spec add(binary(), [binary()], non_neg_integer(), boolean(), boolean(), table()) -> table().
add(Type, Frames0, H0, U0, T0, Tab = #stacks{cut = Cut}) ->
    {Frames, H, U, T} =
        case Frames0 of
            [] ->
                {[<<"[no stack]">>], hash([<<"[no stack]">>]), U0, T0};
            _ when U0, Cut ->
                Kept = cut_unknown(Frames0),
                {Kept, hash(Kept), lists:member(?UNKNOWN, Kept), true};
            _ ->
                {Frames0, H0, U0, T0}
        end,
    {Id, Tab2} = case stack_id(Frames, H, Tab) of
        new when Tab#stacks.nids < Tab#stacks.max -> add_stack(Frames, H, Tab);
        new -> {overflow, Tab};
        Found -> {Found, Tab}
    end,
    count(Type, Id, U, T, Tab2).

%% @doc A stack's hash, root first: `hash(hash(0, code(Root)),
%% code(Callee))' and so on to the leaf. Below 2^48: a small integer.
-spec hash(non_neg_integer(), non_neg_integer()) -> non_neg_integer().
hash(H, Code) ->
    (H * 33 + Code) band 16#ffffffffffff.

%% @doc The hash of a leaf-first frame list (`hash/2').
-spec hash([binary()]) -> non_neg_integer().
hash(Frames) ->
    lists:foldr(fun(F, H) -> hash(H, code(F)) end, 0, Frames).

%% @doc A frame name's code for `hash/2'.
-spec code(binary()) -> non_neg_integer().
code(Name) ->
    erlang:phash2(Name).

%% @doc The counted stacks (root first, the thread type first of all) and
%% counters, as in `beamdiag_fold:profile()'.
-spec counts(table()) ->
    #{stacks := #{beamdiag_fold:stack() => pos_integer()},
      samples | unknown_samples | truncated_samples | overflow_samples := non_neg_integer()}.
counts(#stacks{counts = C, ids = Ids, samples = N, unknown = U, truncated = T, overflow = O}) ->
    Frames = maps:from_list([{Id, F} || Same <- maps:values(Ids), {F, Id} <- Same]),
    Stacks = maps:fold(fun({Type, Id}, Count, Acc) ->
                               Acc#{[Type | lists:reverse(maps:get(Id, Frames))] => Count}
                       end, #{}, C),
    #{stacks => Stacks, samples => N, unknown_samples => U, truncated_samples => T,
      overflow_samples => O}.

%%%===================================================================
%%% Internal
%%%===================================================================

stack_id(Frames, H, #stacks{ids = Ids}) ->
    case Ids of
        #{H := Same} ->
            case lists:keyfind(Frames, 1, Same) of
                {_, Id} -> Id;
                false -> new
            end;
        _ ->
            new
    end.

add_stack(Frames, H, Tab = #stacks{ids = Ids, nids = Id}) ->
    Same = maps:get(H, Ids, []),
    {Id, Tab#stacks{ids = Ids#{H => [{Frames, Id} | Same]}, nids = Id + 1}}.

count(Type, Id, U, T, Tab = #stacks{counts = C, max = Max}) ->
    Key = {Type, Id},
    Tab2 = case C of
        #{Key := N} -> Tab#stacks{counts = C#{Key := N + 1}};
        _ when Id =/= overflow, map_size(C) < Max -> Tab#stacks{counts = C#{Key => 1}};
        _ -> overflow(Type, Tab)
    end,
    Tab2#stacks{
        samples = Tab2#stacks.samples + 1,
        unknown = Tab2#stacks.unknown + flag(U),
        truncated = Tab2#stacks.truncated + flag(T)
    }.

flag(true) -> 1;
flag(false) -> 0.

%% Past the bound on distinct stacks, samples count as `[other stacks]'.
overflow(Type, Tab) ->
    Other = [<<"[other stacks]">>],
    H = hash(Other),
    {Id, Tab2 = #stacks{counts = C}} = case stack_id(Other, H, Tab) of
        new -> add_stack(Other, H, Tab);
        Found -> {Found, Tab}
    end,
    Tab2#stacks{counts = maps:update_with({Type, Id}, fun(X) -> X + 1 end, 1, C),
                overflow = Tab2#stacks.overflow + 1}.

%% Keeps the frames leafwards of the leafmost [unknown] frame (frames are
%% leaf first).
cut_unknown(Frames) ->
    case lists:takewhile(fun(F) -> F =/= ?UNKNOWN end, Frames) of
        [] -> [?UNKNOWN];
        Leafward -> Leafward
    end.
