%%% @doc The ETS tables that grew over the window, on the target (erts,
%%% kernel and stdlib only): the memory ledger says the node's `ets' part
%%% grows, and this names the table, its type and its owner.
%%%
%%% At the start walk each table's memory (`ets:info(T, memory)', in
%%% words: an atomic counter, no table lock) is read (`sizes/0'); at the end
%%% walk again (`grew/2'), and the three that grew most by 1 MiB or more are
%%% named: name, type, protection, objects at the end, bytes at both ends, and the
%%% owner, identified as the walks' entries are. Tables born during the
%%% window count from zero. When the table count grew by `?BORN_MIN' or
%%% more, the new tables are grouped by name and owner too (who creates
%%% them, for a table count that climbs to its limit).
%%%
%%% Bounded: read only on a node of at most `?MAX_TABLES' tables, by a
%%% helper of its own stopped after `?TABLES_MS'.
%%%
%%% ```
%%% 1> S = beamdiag_agent_tables:sizes().
%%% 2> T = ets:new(cache, [public]), [ets:insert(T, {K, binary:copy(<<0>>, 100)}) || K <- lists:seq(1, 20000)].
%%% 3> #{grew := [#{name := <<"cache">>}]} = beamdiag_agent_tables:grew(S, #{}).
%%% '''
-module(beamdiag_agent_tables).

-export([sizes/0, grew/2]).

-export_type([sizes/0, report/0]).

%% Each table's memory in words, or `none' when the node has too many
%% tables or the read was late.
-type sizes() :: #{ets:table() => non_neg_integer()} | none.

-type table_entry() :: #{
    name := binary(),
    id := binary(),
    type := binary(),
    protection := binary(),
    objects := non_neg_integer(),
    memory := [non_neg_integer()],
    owner := map() | null
}.
-type report() :: #{
    grew := [table_entry()],
    born := [#{count := pos_integer(), name := binary(), owner := map() | null}],
    count := [non_neg_integer()]
}.

%% Tables on a node above which none are read.
-define(MAX_TABLES, 5000).
%% How long the helper may read them.
-define(TABLES_MS, 200).
%% Tables (and groups of new tables) reported at most.
-define(TOP, 3).
%% A table named when it grew by this many bytes at least.
-define(GREW_MIN, 1048576).
%% New tables grouped when the count grew by this many (the limit rules'
%% growth_min for tables).
-define(BORN_MIN, 50).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Each table's memory now, in words.
-spec sizes() -> sizes().
sizes() ->
    case erlang:system_info(ets_count) =< ?MAX_TABLES of
        true -> bounded(fun read_sizes/0, none);
        false -> none
    end.

%% @doc The tables that grew most since Sizes0 (`sizes/0' at the start),
%% and who created the new ones when many were; Names gives the registered
%% names by pid. `none' when either end could not be read.
-spec grew(sizes(), #{pid() => atom()}) -> report() | none.
grew(none, _Names) ->
    none;
grew(Sizes0, Names) when is_map(Sizes0) ->
    case sizes() of
        none ->
            none;
        Sizes1 ->
            Word = erlang:system_info(wordsize),
            Growth = [{(W1 - maps:get(T, Sizes0, 0)) * Word, T} || {T, W1} <- maps:to_list(Sizes1)],
            Top = [{G, T} || {G, T} <- lists:sublist(lists:reverse(lists:sort(Growth)), ?TOP),
                             G >= ?GREW_MIN],
            New = [T || T <- maps:keys(Sizes1), not maps:is_key(T, Sizes0)],
            Born = case map_size(Sizes1) - map_size(Sizes0) >= ?BORN_MIN of
                       true -> bounded(fun() -> born(New) end, []);
                       false -> []
                   end,
            Infos = bounded(fun() -> [{T, info(T)} || {_, T} <- Top] end, []),
            Owners = [O || {_, #{owner := O}} <- Infos, is_pid(O)] ++
                [O || {{_, O}, _} <- Born, is_pid(O)],
            Ids = beamdiag_agent_proc_identity:read(lists:usort(Owners), #{}),
            Owner = fun(O) -> beamdiag_agent_proc_identity:entry(O, Names, Ids) end,
            #{grew => [entry(I, maps:get(T, Sizes0, 0) * Word, maps:get(T, Sizes1) * Word, Owner)
                       || {T, I} <- Infos, is_map(I)],
              born => [#{count => N, name => Name, owner => Owner(O)} || {{Name, O}, N} <- Born],
              count => [map_size(Sizes0), map_size(Sizes1)]}
    end.

%%%===================================================================
%%% Internal
%%%===================================================================

read_sizes() ->
    maps:from_list([{T, W} || T <- ets:all(), W <- [ets:info(T, memory)], is_integer(W)]).

%% A table's figures, or `gone' when it was deleted meanwhile.
info(T) ->
    case ets:info(T) of
        undefined -> gone;
        I -> maps:with([name, id, type, protection, size, owner], maps:from_list(I))
    end.

entry(I = #{name := Name, id := Id}, M0, M1, Owner) ->
    #{name => atom_to_binary(Name),
      id => term_text(Id),
      type => atom_to_binary(maps:get(type, I)),
      protection => atom_to_binary(maps:get(protection, I)),
      objects => maps:get(size, I),
      memory => [M0, M1],
      owner => Owner(maps:get(owner, I))}.

%% The new tables counted by {name, owner}, the largest groups first.
born(New) ->
    Counts = lists:foldl(
               fun(T, Acc) ->
                       case {ets:info(T, name), ets:info(T, owner)} of
                           {N, O} when is_atom(N), N =/= undefined ->
                               maps:update_with({atom_to_binary(N), O}, fun(C) -> C + 1 end, 1, Acc);
                           _ ->
                               Acc
                       end
               end, #{}, New),
    beamdiag_agent_top:largest(?TOP, 2, maps:to_list(Counts)).

term_text(Id) when is_atom(Id) -> atom_to_binary(Id);
term_text(Id) when is_reference(Id) -> list_to_binary(ref_to_list(Id));
term_text(Id) -> iolist_to_binary(io_lib:format("~0p", [Id])).

%% F's value, or Default when it was late or failed.
bounded(F, Default) ->
    case beamdiag_agent_deadline:within(F, ?TABLES_MS) of
        {ok, R} -> R;
        _ -> Default
    end.
