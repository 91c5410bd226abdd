%%% @doc The stacks a fold worker counts: frame names numbered, stacks
%%% numbered as the nodes of a tree of frames, and samples counted by
%%% thread type and stack.
%%%
%%% A frame name gets a number the first time it is seen (`frame_id/2').
%%% A stack is a node of a tree whose root is the empty stack: the node of
%%% a stack with one more frame at its leaf is the child of the node of
%%% the shorter stack by that frame's number (`child/3', `path/3'). So a
%%% stack's node is found by one map look-up per frame root first, and a
%%% worker that knows the node of a sample's callers (`beamdiag_fold_worker'
%%% caches them) finds the sample's node by one more look-up for its leaf,
%%% whatever the stack's depth: no frame list is hashed or compared.
%%%
%%% A sample is counted under `{Type, Node}'. The number of distinct
%%% stacks is bounded: past it, samples of stacks not seen before count as
%%% `[other stacks]', and no nodes are added for them. With
%%% `unknown => cut', the frames rootwards of the leafmost `[unknown]'
%%% frame are dropped (with frame-pointer unwinding they are garbage):
%%% `add_frames/5' does it, and callers that add by node leave such
%%% samples to it.
%%%
%%% ```
%%% 1> T0 = beamdiag_fold_stacks:new(#{max_stacks => 10, unknown => keep}).
%%% 2> T1 = beamdiag_fold_stacks:add_frames(<<"scheduler">>, [<<"lists:foldl/3">>, <<"main">>], false, false, T0).
%%% 3> maps:get(stacks, beamdiag_fold_stacks:counts(T1)).
%%% #{[<<"scheduler">>, <<"main">>, <<"lists:foldl/3">>] => 1}
%%% '''
-module(beamdiag_fold_stacks).

-export([new/1, frame_id/2, unknown_id/0, child/3, path/3, add/6, add_frames/5, counts/1]).

-export_type([table/0, node_id/0]).

-define(UNKNOWN, <<"[unknown]">>).
-define(NO_STACK, <<"[no stack]">>).
-define(OTHER, <<"[other stacks]">>).
-define(UNKNOWN_ID, 1).
-define(NO_STACK_ID, 2).
-define(OTHER_ID, 3).
%% A child's key: its parent's node number shifted past the frame number.
-define(EDGE(Parent, Id), ((Parent bsl 32) bor Id)).

-record(stacks, {
    max :: pos_integer(),
    cut :: boolean(),
    %% Frame name => number.
    names = #{?UNKNOWN => {?UNKNOWN, ?UNKNOWN_ID}, ?NO_STACK => {?NO_STACK, ?NO_STACK_ID},
              ?OTHER => {?OTHER, ?OTHER_ID}} :: #{binary() => {binary(), pos_integer()}},
    %% ?EDGE(Parent, FrameId) => node; the root (the empty stack) is 0.
    edges = #{} :: #{non_neg_integer() => pos_integer()},
    nnodes = 0 :: non_neg_integer(),
    %% Node counted as a stack => its frames, leaf first.
    stacks = #{} :: #{pos_integer() => [binary()]},
    %% {Type, Node} => samples.
    counts = #{} :: #{{binary(), pos_integer()} => pos_integer()},
    samples = 0 :: non_neg_integer(),
    unknown = 0 :: non_neg_integer(),
    truncated = 0 :: non_neg_integer(),
    overflow = 0 :: non_neg_integer()
}).

-opaque table() :: #stacks{}.
%% A stack's node; `overflow' when the stack is new and the bound on
%% distinct stacks is reached.
-type node_id() :: non_neg_integer() | overflow.

%%%===================================================================
%%% API
%%%===================================================================

%% @doc No stacks, with the folder's checked options (`max_stacks',
%% `unknown').
-spec new(#{max_stacks := pos_integer(), unknown := keep | cut, atom() => term()}) -> table().
new(#{max_stacks := Max, unknown := U}) ->
    #stacks{max = Max, cut = U =:= cut}.

%% @doc A frame name's number, and the table's copy of the name: the name
%% may be part of a chunk of text, which a name kept in a cache or a
%% stack would keep alive.
-spec frame_id(binary(), table()) -> {binary(), pos_integer(), table()}.
frame_id(Name, Tab = #stacks{names = Names}) ->
    case Names of
        #{Name := {Own, Id}} ->
            {Own, Id, Tab};
        _ ->
            Own = binary:copy(Name),
            Id = map_size(Names) + 1,
            {Own, Id, Tab#stacks{names = Names#{Own => {Own, Id}}}}
    end.

%% @doc The number of `[unknown]'.
-spec unknown_id() -> pos_integer().
unknown_id() ->
    ?UNKNOWN_ID.

%% @doc The node of a stack with the frame `Id' added at the leaf of the
%% stack `Parent' (the root, the empty stack, is 0).
-spec child(node_id(), pos_integer(), table()) -> {node_id(), table()}.
child(overflow, _Id, Tab) ->
    {overflow, Tab};
child(Parent, Id, Tab = #stacks{edges = Edges}) ->
    Key = ?EDGE(Parent, Id),
    case Edges of
        #{Key := Node} ->
            {Node, Tab};
        _ when map_size(Tab#stacks.stacks) >= Tab#stacks.max ->
            %% A stack through a node not made yet is a new stack: past
            %% the bound, it counts as `[other stacks]'.
            {overflow, Tab};
        _ ->
            Node = Tab#stacks.nnodes + 1,
            {Node, Tab#stacks{edges = Edges#{Key => Node}, nnodes = Node}}
    end.

%% @doc The node of the stack `Parent' with frames added, root first.
-spec path(node_id(), [pos_integer()], table()) -> {node_id(), table()}.
path(Node, [], Tab) ->
    {Node, Tab};
path(overflow, _Ids, Tab) ->
    {overflow, Tab};
path(Parent, [Id | Ids], Tab) ->
    {Node, Tab2} = child(Parent, Id, Tab),
    path(Node, Ids, Tab2).

%% @doc Counts a sample of thread type `Type' whose stack is `Node'
%% (`child/3', `path/3'), of frames `Frames' (leaf first, not empty);
%% `Unknown': a frame is `[unknown]', `Truncated': the unwind was cut
%% short. With `unknown => cut', a sample with an `[unknown]' frame must go
%% through `add_frames/5' instead.
-spec add(binary(), node_id(), [binary(), ...], boolean(), boolean(), table()) -> table().
add(Type, Node, Frames, U, T, Tab = #stacks{counts = C}) ->
    Key = {Type, Node},
    case C of
        #{Key := N} ->
            %% Counted before: a stack already.
            Tab#stacks{counts = C#{Key := N + 1}, samples = Tab#stacks.samples + 1,
                       unknown = Tab#stacks.unknown + flag(U),
                       truncated = Tab#stacks.truncated + flag(T)};
        _ ->
            Stacks = Tab#stacks.stacks,
            case Stacks of
                #{Node := _} ->
                    count(Type, Node, U, T, Tab);
                _ when Node =/= overflow, map_size(Stacks) < Tab#stacks.max ->
                    count(Type, Node, U, T, Tab#stacks{stacks = Stacks#{Node => Frames}});
                _ ->
                    count(Type, overflow, U, T, Tab)
            end
    end.

%% @doc Counts a sample of thread type `Type' whose frames are `Frames'
%% (leaf first; `[no stack]' when empty), cut at the leafmost `[unknown]'
%% frame with `unknown => cut'.
-spec add_frames(binary(), [binary()], boolean(), boolean(), table()) -> table().
add_frames(Type, Frames0, U0, T0, Tab = #stacks{cut = Cut}) ->
    {Frames, U, T} =
        case Frames0 of
            [] ->
                {[?NO_STACK], U0, T0};
            _ when U0, Cut ->
                Kept = cut_unknown(Frames0),
                {Kept, lists:member(?UNKNOWN, Kept), true};
            _ ->
                {Frames0, U0, T0}
        end,
    {Own, Ids, Tab2} = ids(Frames, [], [], Tab),
    {Node, Tab3} = path(0, Ids, Tab2),
    add(Type, Node, Own, U, T, Tab3).

%% @doc The counted stacks (root first, the thread type first of all) and
%% counters, as in `beamdiag_fold:profile()'.
-spec counts(table()) ->
    #{stacks := #{beamdiag_fold:stack() => pos_integer()},
      samples | unknown_samples | truncated_samples | overflow_samples := non_neg_integer()}.
counts(#stacks{counts = C, stacks = Frames, samples = N, unknown = U, truncated = T,
               overflow = O}) ->
    Stacks = maps:fold(fun({Type, Node}, Count, Acc) ->
                               Acc#{[Type | lists:reverse(maps:get(Node, Frames))] => Count}
                       end, #{}, C),
    #{stacks => Stacks, samples => N, unknown_samples => U, truncated_samples => T,
      overflow_samples => O}.

%%%===================================================================
%%% Internal
%%%===================================================================

%% The table's copies of leaf-first frames, and their numbers root first.
ids([], Own, Ids, Tab) ->
    {lists:reverse(Own), Ids, Tab};
ids([F | Fs], Own, Ids, Tab) ->
    {F2, Id, Tab2} = frame_id(F, Tab),
    ids(Fs, [F2 | Own], [Id | Ids], Tab2).

count(Type, Node, U, T, Tab = #stacks{counts = C, max = Max}) ->
    Key = {Type, Node},
    Tab2 = case C of
        #{Key := N} -> Tab#stacks{counts = C#{Key := N + 1}};
        _ when Node =/= overflow, map_size(C) < Max -> Tab#stacks{counts = C#{Key => 1}};
        _ -> overflow(Type, Tab)
    end,
    Tab2#stacks{
        samples = Tab2#stacks.samples + 1,
        unknown = Tab2#stacks.unknown + flag(U),
        truncated = Tab2#stacks.truncated + flag(T)
    }.

flag(true) -> 1;
flag(false) -> 0.

%% Past the bound on distinct stacks, samples count as `[other stacks]',
%% whose node is made whatever the bound.
overflow(Type, Tab = #stacks{edges = Edges}) ->
    Key = ?EDGE(0, ?OTHER_ID),
    {Node, Tab2} = case Edges of
        #{Key := N} ->
            {N, Tab};
        _ ->
            N = Tab#stacks.nnodes + 1,
            {N, Tab#stacks{edges = Edges#{Key => N}, nnodes = N}}
    end,
    Stacks = Tab2#stacks.stacks,
    Tab3 = case Stacks of
        #{Node := _} -> Tab2;
        _ -> Tab2#stacks{stacks = Stacks#{Node => [?OTHER]}}
    end,
    Tab3#stacks{counts = maps:update_with({Type, Node}, fun(X) -> X + 1 end, 1, Tab3#stacks.counts),
                overflow = Tab3#stacks.overflow + 1}.

%% Keeps the frames leafwards of the leafmost [unknown] frame (frames are
%% leaf first).
cut_unknown(Frames) ->
    case lists:takewhile(fun(F) -> F =/= ?UNKNOWN end, Frames) of
        [] -> [?UNKNOWN];
        Leafward -> Leafward
    end.
