%%% @doc Top-N, in one place for the agent and the operator's side alike
%%% (erts, kernel and stdlib only, so it loads on a target): a bounded
%%% ranking fed one item at a time, so a walk ranks as it reads and never
%%% builds and sorts a list of every process; and the N largest of a short
%%% list already at hand (`largest/2,3').
%%%
%%% A top is `{Capacity, Size, Kept}', Kept ascending by key (the smallest
%%% first, so the one to drop is at hand); only positive keys enter. Each
%%% `consider/4' costs at most Capacity steps (an insertion into a short
%%% sorted list), and nothing when the key is below the smallest kept in a
%%% full top.
%%%
%%% ```
%%% 1> T = lists:foldl(fun({P, K}, A) -> beamdiag_agent_top:consider(K, P, K, A) end,
%%%                    beamdiag_agent_top:new(2), [{a, 3}, {b, 0}, {c, 7}, {d, 5}]).
%%% 2> beamdiag_agent_top:items(T).
%%% [{c,7},{d,5}]
%%% 3> beamdiag_agent_top:largest_ids([{a, 3}, {c, 7}, {d, 5}], 2).
%%% [c,d]
%%% 4> beamdiag_agent_top:largest(2, 2, [{a, 3}, {c, 7}, {d, 5}]).
%%% [{c,7},{d,5}]
%%% '''
-module(beamdiag_agent_top).

-export([new/1, consider/4, items/1, pids/1, largest_ids/2, largest/2, largest/3]).

-export_type([top/0]).

%% Capacity, size, and the {Key, {Id, Item}} kept, the smallest key first.
-opaque top() :: {pos_integer(), non_neg_integer(), [{number(), {term(), term()}}]}.

%%%===================================================================
%%% API
%%%===================================================================

%% @doc An empty top that keeps at most Capacity entries.
-spec new(pos_integer()) -> top().
new(Capacity) when is_integer(Capacity), Capacity > 0 ->
    {Capacity, 0, []}.

%% @doc Id (a pid, for a walk) with Item under key K: kept when K is
%% positive and larger than the smallest key of a full top (which then
%% drops that one). The entry kept is `{Id, Item}'.
-spec consider(number(), term(), term(), top()) -> top().
consider(K, _P, _T, Top) when K =< 0 ->
    Top;
consider(K, _P, _T, Top = {Cap, Cap, [{Min, _} | _]}) when K =< Min ->
    Top;
consider(K, P, T, {Cap, Size, Kept}) when Size < Cap ->
    {Cap, Size + 1, insert({K, {P, T}}, Kept)};
consider(K, P, T, {Cap, Size, [_ | Rest]}) ->
    {Cap, Size, insert({K, {P, T}}, Rest)}.

%% @doc The entries kept (`{Id, Item}'), the largest key first.
-spec items(top()) -> [{term(), term()}].
items({_, _, Kept}) ->
    [I || {_, I} <- lists:reverse(Kept)].

%% @doc The ids kept, the largest key first.
-spec pids(top()) -> [term()].
pids(Top) ->
    [P || {P, _} <- items(Top)].

%% @doc Of `{Id, Key}' pairs, the ids of the N largest positive keys,
%% largest first.
-spec largest_ids([{term(), number()}], pos_integer()) -> [term()].
largest_ids(Pairs, N) ->
    pids(lists:foldl(fun({P, K}, Top) -> consider(K, P, K, Top) end, new(N), Pairs)).

%% @doc The N largest terms of a list, largest first (terms compared whole).
-spec largest(non_neg_integer(), [T]) -> [T].
largest(N, List) ->
    lists:sublist(lists:reverse(lists:sort(List)), N).

%% @doc The N tuples with the largest element at Pos, largest first; of
%% tuples with equal keys, the later in the list comes first.
-spec largest(non_neg_integer(), pos_integer(), [T]) -> [T] when T :: tuple().
largest(N, Pos, List) ->
    lists:sublist(lists:reverse(lists:keysort(Pos, List)), N).

%%%===================================================================
%%% Internal
%%%===================================================================

insert({K, _} = KI, [{K2, _} = H | T]) when K > K2 -> [H | insert(KI, T)];
insert(KI, L) -> [KI | L].
