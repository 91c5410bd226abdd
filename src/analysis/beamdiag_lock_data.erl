%%% @doc Lock data from the lock counters' raw readings (pure).
%%%
%%% `erts_debug:lcnt_collect/0' on a lock-counting emulator returns every
%%% lock's counts since the counters were last cleared (or since boot).
%%% beamdiag never clears them (another user's lock-counting session keeps
%%% its counts): a reading at the window's start is the baseline, and a
%%% later reading less the baseline is the window's lock data. Counts are
%%% subtracted per lock class, lock id and source location, summed over the
%%% lock instances that share them (the hash-slot locks of one ETS table
%%% share its name); a lock created during the window counts from zero, one
%%% gone by its end (a process that exited) counts nothing. A reading whose
%%% counts went down (somebody cleared the counters) is taken whole, since
%%% that clear.
%%%
%%% The lock data: `window_ns', `window_s', `lock_count',
%%% `contended_count', `classes' (per lock class totals, every class that
%%% was taken), `locks' (up to `top' entries, one per class and id, ranked
%%% by wait time), and what `with_node/2' adds: the node's scheduler counts,
%%% release, dirty allocator instances and `tables' (owner and options of
%%% the ETS tables whose locks rank highest).
%%%
%%% ```
%%% 1> D = beamdiag_lock_data:summarise(End, Start, #{}).
%%% 2> [{C, Id} || #{class := C, id := Id} <- lists:sublist(maps:get(locks, D), 1)].
%%% [{<<"db_hash_slot">>, <<"beamdiag_hot_table">>}]
%%% '''
-module(beamdiag_lock_data).

-export([summarise/3, table_names/1, unnamed_trees/1, with_node/2, table/2]).

-export_type([raw/0, lock_data/0, node_facts/0, lock_entry/0, location/0, class_total/0,
              table/0]).

%% The ETS lock classes whose id is a table's name; those of an ordered_set's
%% tree nodes, which have no name when made while lcnt counts (`[]').
-define(CATREE_CLASSES, [<<"erl_db_catree_base_node">>, <<"erl_db_catree_route_node">>]).
-define(DB_CLASSES, [<<"db_hash_slot">>, <<"db_tab">>, <<"db_tab_fix">>, <<"db_hash_lock">>
                     | ?CATREE_CLASSES]).
-define(NO_NAME, <<"[]">>).
%% How many ETS tables get their owner and options looked up.
-define(TABLE_LOOKUPS, 5).

-type raw() :: [{duration, {non_neg_integer(), non_neg_integer()}} | {locks, [raw_lock()]}].
-type raw_lock() :: {atom(), term(), atom(), [raw_stat()]}.
-type raw_stat() ::
    {{atom(), non_neg_integer()}, {non_neg_integer(), non_neg_integer(),
                                   {non_neg_integer(), non_neg_integer(), non_neg_integer()}},
     tuple()}
    | {{atom(), non_neg_integer()}, {non_neg_integer(), non_neg_integer(),
                                     {non_neg_integer(), non_neg_integer(), non_neg_integer()}}}.
%% summarise/3 makes the first keys; with_node/2 adds the optional ones.
%% Percentages are percent (wait_pct: of the window, collision_pct: of the
%% tries).
-type lock_data() :: #{
    window_ns := pos_integer(),
    window_s := float(),
    since := binary(),
    lock_count := non_neg_integer(),
    contended_count := non_neg_integer(),
    classes := [class_total()],
    locks := [lock_entry()],
    tables => [table()],
    trees => [table()],
    schedulers_online => pos_integer(),
    dirty_cpu_schedulers_online => non_neg_integer(),
    dirty_alloc_instances => non_neg_integer(),
    otp_release => binary(),
    erts_version => binary()
}.
%% One lock class and id over the window, summed over its instances.
-type lock_entry() :: #{
    class := binary(),
    id := binary(),
    type := binary(),
    instances := pos_integer(),
    tries := non_neg_integer(),
    collisions := non_neg_integer(),
    collision_pct := float(),
    wait_ns := non_neg_integer(),
    wait_pct := float(),
    waits := non_neg_integer(),
    p50_wait_ns := non_neg_integer(),
    p90_wait_ns := non_neg_integer(),
    locations := [location()]
}.
%% One of a lock entry's source locations with the most wait.
-type location() :: #{location := binary(), tries := non_neg_integer(),
                      collisions := non_neg_integer(), wait_ns := non_neg_integer()}.
%% One lock class's totals over its ids.
-type class_total() :: #{
    class := binary(),
    ids := pos_integer(),
    locks := pos_integer(),
    tries := non_neg_integer(),
    collisions := non_neg_integer(),
    collision_pct := float(),
    wait_ns := non_neg_integer(),
    wait_pct := float()
}.
%% An ETS table's owner and options (table/2): the ets:info/1 values as
%% text, none of them when the table is gone.
-type table() :: #{
    name := binary(),
    owner := binary(),
    tables_with_name := 0 | 1,
    type => binary(),
    protection => binary(),
    write_concurrency => binary(),
    read_concurrency => binary(),
    decentralized_counters => binary(),
    named_table => binary()
}.
%% What the node says of itself beside the readings.
-type node_facts() :: #{schedulers := pos_integer(),
                        schedulers_online := pos_integer(),
                        dirty_cpu_schedulers_online := non_neg_integer(),
                        otp_release := string(),
                        version := string(),
                        eheap_alloc := term()}.

%% Per class and id: the lock type, the instances and, per location,
%% {Tries, Collisions, WaitNs, Waits, Histogram}.
-type group() :: {atom(), pos_integer(), #{binary() => loc_counts()}}.
-type loc_counts() :: {non_neg_integer(), non_neg_integer(), non_neg_integer(),
                       non_neg_integer(), [non_neg_integer()]}.

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The lock data of the span between two readings (`Start' is
%% `none' to take `End' whole, since the counters' last clear), ranked
%% and bounded. Options: `top' (default 50).
-spec summarise(raw(), raw() | none, #{top => non_neg_integer()}) -> lock_data().
summarise(End, Start, Opts) ->
    Top = maps:get(top, Opts, 50),
    EndGroups = groups(End),
    {WindowNs, Groups, Since} =
        case Start of
            none ->
                {duration_ns(End), EndGroups, clear};
            _ ->
                Span = duration_ns(End) - duration_ns(Start),
                case Span > 0 of
                    true -> {Span, diff(EndGroups, groups(Start)), baseline};
                    %% Cleared since the baseline: the reading is whole.
                    false -> {duration_ns(End), EndGroups, clear}
                end
        end,
    Window = max(1, WindowNs),
    Entries = [lock_entry(K, V, Window) || {K, V} <- maps:to_list(Groups)],
    Busy = [E || E = #{collisions := C, wait_ns := W} <- Entries, C > 0 orelse W > 0],
    #{
        window_ns => Window,
        window_s => Window / 1.0e9,
        since => atom_to_binary(Since),
        lock_count => lists:sum([N || {_, N, _} <- maps:values(EndGroups)]),
        contended_count => length(Busy),
        classes => class_totals(Entries, Window),
        locks => lists:sublist(lists:sort(fun rank/2, Busy), Top)
    }.

%% @doc The ETS tables whose locks rank highest, by name (at most five).
-spec table_names(lock_data()) -> [binary()].
table_names(Data) ->
    lists:sublist(dedup([Id || #{class := C, id := Id} <- maps:get(locks, Data, []),
                               lists:member(C, ?DB_CLASSES), Id =/= ?NO_NAME]),
                  ?TABLE_LOOKUPS).

%% @doc Whether contended locks belong to tree nodes of an ordered_set
%% with write_concurrency that lcnt names no table for (the nodes made
%% while it counts have no name: OTP 25 and 27 alike).
-spec unnamed_trees(lock_data()) -> boolean().
unnamed_trees(Data) ->
    lists:any(fun(#{class := C, id := Id}) -> lists:member(C, ?CATREE_CLASSES) andalso Id =:= ?NO_NAME end,
              maps:get(locks, Data, [])).


%% @doc The lock data with what the node says of itself, the tables'
%% owners and options (see `table/2') and, when tree-node locks have no
%% table's name, the node's ordered_set tables with write_concurrency
%% (`trees').
-spec with_node(lock_data(), #{facts := node_facts(), tables := [table()], trees => [table()]}) ->
    lock_data().
with_node(Data, N = #{facts := F, tables := Tables}) ->
    Trees = case maps:get(trees, N, []) of
                [] -> #{};
                T -> #{trees => T}
            end,
    (maps:merge(Data, Trees))#{
        tables => Tables,
        schedulers_online => maps:get(schedulers_online, F),
        dirty_cpu_schedulers_online => maps:get(dirty_cpu_schedulers_online, F),
        dirty_alloc_instances => dirty_alloc_instances(maps:get(eheap_alloc, F),
                                                      maps:get(schedulers, F)),
        otp_release => list_to_binary(maps:get(otp_release, F)),
        erts_version => list_to_binary(maps:get(version, F))
    }.

%% @doc A table's entry from `ets:info/1' (a property list, or `undefined'
%% when no table has that name) and its owner's registered name (`[]' or
%% `undefined' when it has none).
-spec table(binary(), {[{atom(), term()}] | undefined, term()}) -> table().
table(Name, {Info, OwnerName}) when is_list(Info) ->
    Keys = [type, protection, write_concurrency, read_concurrency, decentralized_counters,
            named_table],
    Fields = maps:from_list([{K, text(V)} || {K, V} <- Info, lists:member(K, Keys)]),
    Owner = case {OwnerName, proplists:get_value(owner, Info)} of
                {{registered_name, R}, _} when is_atom(R) -> atom_to_binary(R);
                {_, Pid} when is_pid(Pid) -> list_to_binary(pid_to_list(Pid));
                _ -> <<"unknown">>
            end,
    Fields#{name => Name, owner => Owner, tables_with_name => 1};
table(Name, _) ->
    #{name => Name, owner => <<"gone">>, tables_with_name => 0}.

%%%===================================================================
%%% Internal
%%%===================================================================

-spec duration_ns(raw()) -> non_neg_integer().
duration_ns(Raw) ->
    {S, Ns} = proplists:get_value(duration, Raw, {0, 0}),
    S * 1000000000 + Ns.

%% Locks grouped by class and id, their statistics summed per location.
-spec groups(raw()) -> #{{binary(), binary()} => group()}.
groups(Raw) ->
    lists:foldl(
        fun({Name, Id, Type, Stats}, Acc) ->
            Key = {atom_to_binary(Name), render_id(Id)},
            {T, N, Locs} = maps:get(Key, Acc, {Type, 0, #{}}),
            Acc#{Key => {T, N + 1, add_stats(Stats, Locs)}}
        end,
        #{},
        proplists:get_value(locks, Raw, [])).

-spec add_stats([raw_stat()], #{binary() => loc_counts()}) -> #{binary() => loc_counts()}.
add_stats(Stats, Locs) ->
    lists:foldl(
        fun(Stat, Acc) ->
            {{File, Line}, {T, C, {S, Ns, N}}, Hist} =
                case Stat of
                    {L, V, H} -> {L, V, H};
                    {L, V} -> {L, V, {}}
                end,
            Loc = location(File, Line),
            New = {T, C, S * 1000000000 + Ns, N, tuple_to_list(Hist)},
            case Acc of
                #{Loc := Old} -> Acc#{Loc := add(Old, New)};
                #{} -> Acc#{Loc => New}
            end
        end,
        Locs,
        Stats).

%% The end's counts less the start's, per class, id and location; never
%% below zero (instances that ended took their counts with them).
-spec diff(#{term() => group()}, #{term() => group()}) -> #{term() => group()}.
diff(End, Start) ->
    maps:map(
        fun(Key, {Type, N, Locs}) ->
            Before = case Start of
                         #{Key := {_, _, B}} -> B;
                         #{} -> #{}
                     end,
            {Type, N, maps:map(fun(Loc, Counts) ->
                                   case Before of
                                       #{Loc := Old} -> sub(Counts, Old);
                                       #{} -> Counts
                                   end
                               end, Locs)}
        end,
        End).

add({T1, C1, W1, N1, H1}, {T2, C2, W2, N2, H2}) ->
    {T1 + T2, C1 + C2, W1 + W2, N1 + N2, zip(fun erlang:'+'/2, H1, H2)}.

sub({T1, C1, W1, N1, H1}, {T2, C2, W2, N2, H2}) ->
    {max(0, T1 - T2), max(0, C1 - C2), max(0, W1 - W2), max(0, N1 - N2),
     zip(fun(A, B) -> max(0, A - B) end, H1, H2)}.

%% Histograms of the same length combine; an empty one is no counts.
zip(_F, [], H) -> [max(0, X) || X <- H];
zip(_F, H, []) -> H;
zip(F, H1, H2) when length(H1) =:= length(H2) -> lists:zipwith(F, H1, H2);
zip(_F, H1, _H2) -> H1.

-spec lock_entry({binary(), binary()}, group(), pos_integer()) -> lock_entry().
lock_entry({Class, Id}, {Type, Instances, Locs}, WindowNs) ->
    PerLoc = [{Loc, T, C, W, N, H} || {Loc, {T, C, W, N, H}} <- maps:to_list(Locs)],
    Tries = lists:sum([T || {_, T, _, _, _, _} <- PerLoc]),
    Colls = lists:sum([C || {_, _, C, _, _, _} <- PerLoc]),
    Wait = lists:sum([W || {_, _, _, W, _, _} <- PerLoc]),
    Waits = lists:sum([N || {_, _, _, _, N, _} <- PerLoc]),
    Hist = lists:foldl(fun(H, Acc) -> zip(fun erlang:'+'/2, Acc, H) end, [],
                       [H || {_, _, _, _, _, H} <- PerLoc]),
    TopLocs = lists:sublist(
        lists:sort(fun({_, _, C1, W1, _, _}, {_, _, C2, W2, _, _}) -> {W1, C1} >= {W2, C2} end, PerLoc),
        3
    ),
    #{
        class => Class,
        id => Id,
        type => atom_to_binary(Type),
        instances => Instances,
        tries => Tries,
        collisions => Colls,
        collision_pct => pct(Colls, Tries),
        wait_ns => Wait,
        wait_pct => pct(Wait, WindowNs),
        waits => Waits,
        p50_wait_ns => hist_quantile(Hist, 0.5),
        p90_wait_ns => hist_quantile(Hist, 0.9),
        locations => [
            #{location => Loc, tries => T, collisions => C, wait_ns => W}
         || {Loc, T, C, W, _, _} <- TopLocs, T > 0
        ]
    }.

-spec location(atom(), non_neg_integer()) -> binary().
location(undefined, _) -> <<"unknown">>;
location(File, Line) -> iolist_to_binary([atom_to_binary(File), $:, integer_to_binary(Line)]).

%% Bucket I of the lock-wait histogram counts waits of 2^I up to 2^(I+1) ns;
%% the quantile is reported as the upper edge of its bucket (0 when nothing
%% waited).
-spec hist_quantile([non_neg_integer()], float()) -> non_neg_integer().
hist_quantile(Hist, Q) ->
    case lists:sum(Hist) of
        0 -> 0;
        Total -> quantile_bucket(Hist, Q * Total, 0, 0)
    end.

-spec quantile_bucket([non_neg_integer()], float(), non_neg_integer(), non_neg_integer()) ->
    non_neg_integer().
quantile_bucket([], _Target, _Seen, I) ->
    1 bsl I;
quantile_bucket([N | Rest], Target, Seen, I) ->
    case Seen + N >= Target andalso N > 0 of
        true -> 1 bsl (I + 1);
        false -> quantile_bucket(Rest, Target, Seen + N, I + 1)
    end.

-spec class_totals([lock_entry()], pos_integer()) -> [class_total()].
class_totals(Entries, WindowNs) ->
    ByClass = maps:groups_from_list(fun(#{class := C}) -> C end, Entries),
    Totals = [
        begin
            Tries = lists:sum([T || #{tries := T} <- Es]),
            Colls = lists:sum([C || #{collisions := C} <- Es]),
            Wait = lists:sum([W || #{wait_ns := W} <- Es]),
            #{
                class => Class,
                ids => length(Es),
                locks => lists:sum([N || #{instances := N} <- Es]),
                tries => Tries,
                collisions => Colls,
                collision_pct => pct(Colls, Tries),
                wait_ns => Wait,
                wait_pct => pct(Wait, WindowNs)
            }
        end
     || {Class, Es} <- maps:to_list(ByClass)
    ],
    lists:sort(fun rank/2, [T || T = #{tries := N} <- Totals, N > 0]).

-spec rank(lock_entry() | class_total(), lock_entry() | class_total()) -> boolean().
rank(#{wait_ns := W1, collisions := C1} = A, #{wait_ns := W2, collisions := C2} = B) ->
    {W1, C1, maps:get(id, B, <<>>)} >= {W2, C2, maps:get(id, A, <<>>)}.

-spec pct(number(), number()) -> float().
pct(_, 0) -> 0.0;
pct(A, B) -> round(10000 * A / B) / 100.

%% Lock ids as text: ETS table and allocator names, registered names, pids,
%% ports, numbers.
-spec render_id(term()) -> binary().
render_id(Id) when is_atom(Id) -> atom_to_binary(Id);
render_id(Id) when is_integer(Id) -> integer_to_binary(Id);
render_id(Id) when is_pid(Id) -> list_to_binary(pid_to_list(Id));
render_id(Id) when is_port(Id) -> list_to_binary(erlang:port_to_list(Id));
render_id(Id) when is_binary(Id) -> Id;
render_id(Id) -> iolist_to_binary(io_lib:format("~0P", [Id, 8])).

%% How many eheap_alloc instances belong to dirty schedulers (+Mdai): 0
%% when the dirty schedulers share the global instance.
-spec dirty_alloc_instances(term(), pos_integer()) -> non_neg_integer().
dirty_alloc_instances(Info, Schedulers) when is_list(Info) ->
    max(0, length([I || {instance, I, _} <- Info]) - Schedulers - 1);
dirty_alloc_instances(_, _) ->
    0.

-spec dedup([binary()]) -> [binary()].
dedup(L) ->
    dedup(L, #{}).

dedup([], _) -> [];
dedup([H | T], Seen) when is_map_key(H, Seen) -> dedup(T, Seen);
dedup([H | T], Seen) -> [H | dedup(T, Seen#{H => true})].

-spec text(term()) -> binary().
text(V) when is_atom(V) -> atom_to_binary(V);
text(V) when is_integer(V) -> integer_to_binary(V);
text(V) -> iolist_to_binary(io_lib:format("~0p", [V])).
