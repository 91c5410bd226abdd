%%% @doc Lock counting on the target node, without the `tools' application.
%%%
%%% This module is loaded onto the node under study and runs there; it uses
%%% only erts, kernel and stdlib (`erts_debug:lcnt_control/1,2',
%%% `erts_debug:lcnt_collect/0', `erts_debug:lcnt_clear/0'), never `lcnt',
%%% which may be missing on the target. It works only on an emulator built
%%% for lock counting (`erl -emu_type lcnt', see `beamdiag emu-type build').
%%%
%%% `start/1' saves the lock-counting mask and the copy_save flag, sets the
%%% categories it needs and clears the counters; `collect/1' returns the
%%% lock data for the window since `start/1' as plain data (ready for JSON,
%%% bounded to the top locks); `stop/1' puts back what `start/1' found.
%%%
%%% ```
%%% 1> {ok, S} = beamdiag_agent_lcnt:start(#{}).
%%% 2> timer:sleep(5000).
%%% 3> #{locks := [Top | _]} = beamdiag_agent_lcnt:collect(S).
%%% 4> maps:with([class, id, wait_pct], Top).
%%% #{class => <<"db_hash_slot">>, id => <<"beamdiag_hot_table">>, wait_pct => 81.4}
%%% 5> beamdiag_agent_lcnt:stop(S).
%%% ok
%%% '''
%%%
%%% Lock data: `window_ns', `window_s', the node's scheduler counts,
%%% `classes' (per lock class totals, every class that was taken), `locks'
%%% (up to `top' entries, one per class and id, summed over the lock
%%% instances sharing that id, ranked by wait time) and `tables' (owner and
%%% options of the ETS tables whose locks rank highest).
-module(beamdiag_agent_lcnt).

-export([available/0, start/1, collect/1, stop/1, format_error/1]).
%% Called as Module:format_error/1 on an {error, {Module, Reason}} value.
-ignore_xref([{format_error, 1}]).
%% Called by the tests only.
-ifdef(TEST).
-export([summarise/2]).
-endif.

-export_type([state/0, lock_data/0, options/0]).

-define(ALL_CATEGORIES, [allocator, db, debug, distribution, generic, io, process, scheduler]).
-define(DEFAULT_CATEGORIES, [allocator, db, distribution, generic, io, process, scheduler]).
-define(DB_CLASSES, [<<"db_hash_slot">>, <<"db_tab">>, <<"db_tab_fix">>, <<"db_hash_lock">>,
                     <<"erl_db_catree_base_node">>, <<"erl_db_catree_route_node">>]).
%% How many ETS tables get an ets:info lookup, and how many tables the
%% lookup of an unnamed table may scan.
-define(TABLE_LOOKUPS, 5).
-define(TABLE_SCAN_MAX, 2000).

-type options() :: #{
    categories => [atom()],
    top => pos_integer(),
    owner => pid(),
    max_s => pos_integer(),
    clear => boolean()
}.
-opaque state() :: #{
    saved_mask := [atom()],
    saved_copy_save := boolean(),
    categories := [atom()],
    top := pos_integer(),
    guard := pid() | undefined
}.
-type lock_data() :: #{atom() => number() | binary() | [map()]}.
-type raw_lock() :: {atom(), term(), atom(), [raw_stat()]}.
-type raw_stat() ::
    {{atom(), non_neg_integer()}, {non_neg_integer(), non_neg_integer(), {non_neg_integer(), non_neg_integer(), non_neg_integer()}}, tuple()}
    | {{atom(), non_neg_integer()}, {non_neg_integer(), non_neg_integer(), {non_neg_integer(), non_neg_integer(), non_neg_integer()}}}.

%%%===================================================================
%%% API
%%%===================================================================

%% @doc True when this emulator counts locks (`erl -emu_type lcnt').
-spec available() -> boolean().
available() ->
    try
        erlang:system_info(lock_counting) =:= true
    catch
        error:badarg -> false
    end.

%% @doc Saves the lock-counting settings, enables the categories asked for
%% (default: all but `debug') and clears the counters.
%%
%% Options: `categories' (lock categories to count), `top' (how many locks
%% `collect/1' returns, default 50), `owner' (a pid, possibly on another
%% node: when it goes down the settings are put back), `max_s' (put the
%% settings back after this many seconds even if nobody calls `stop/1',
%% default 3600) and `clear' (default true; false keeps counters the
%% caller has just cleared, unless the mask gains a category).
-spec start(options()) -> {ok, state()} | {error, {beamdiag_agent_lcnt, term()}}.
start(Opts) when is_map(Opts) ->
    Known = [categories, top, owner, max_s, clear],
    case maps:keys(maps:without(Known, Opts)) of
        [] -> start_checked(Opts);
        Unknown -> {error, {?MODULE, {unknown_options, Unknown}}}
    end.

%% @doc The lock data for the window since `start/1' (collecting does not
%% clear the counters), ranked and bounded, as plain data.
-spec collect(state()) -> lock_data().
collect(#{top := Top}) ->
    Raw = erts_debug:lcnt_collect(),
    Data = summarise(Raw, #{top => Top}),
    Data#{
        tables => table_info(maps:get(locks, Data)),
        schedulers_online => erlang:system_info(schedulers_online),
        dirty_cpu_schedulers_online => erlang:system_info(dirty_cpu_schedulers_online),
        dirty_alloc_instances => dirty_alloc_instances(),
        otp_release => list_to_binary(erlang:system_info(otp_release)),
        erts_version => list_to_binary(erlang:system_info(version))
    }.

%% @doc Puts back the mask and copy_save flag `start/1' found. Safe to
%% call more than once.
-spec stop(state()) -> ok.
stop(#{saved_mask := Mask, saved_copy_save := CopySave, guard := Guard}) ->
    case Guard of
        undefined -> ok;
        _ -> unlink(Guard), exit(Guard, kill)
    end,
    restore(Mask, CopySave).

%% @doc Turns the output of `erts_debug:lcnt_collect/0' into lock data
%% (pure; used by `collect/1' and by tests on recorded data). Options:
%% `top' (default 50).
-spec summarise([{duration, {non_neg_integer(), non_neg_integer()}} | {locks, [raw_lock()]}], map()) ->
    lock_data().
summarise(Raw, Opts) ->
    Top = maps:get(top, Opts, 50),
    {S, Ns} = proplists:get_value(duration, Raw, {0, 0}),
    WindowNs = max(1, S * 1000000000 + Ns),
    Locks = proplists:get_value(locks, Raw, []),
    Groups = group_locks(Locks),
    Entries = [lock_entry(K, V, WindowNs) || {K, V} <- maps:to_list(Groups)],
    Busy = [E || E = #{collisions := C, wait_ns := W} <- Entries, C > 0 orelse W > 0],
    Ranked = lists:sort(fun rank/2, Busy),
    #{
        window_ns => WindowNs,
        window_s => WindowNs / 1.0e9,
        lock_count => length(Locks),
        contended_count => length(Busy),
        classes => class_totals(Entries, WindowNs),
        locks => lists:sublist(Ranked, Top)
    }.

%% @doc Turns an error reason from this module into a sentence.
-spec format_error(term()) -> iolist().
format_error(not_lcnt_emulator) ->
    "the node does not count locks: start it with `erl -emu_type lcnt' "
    "(install the emulator with `beamdiag emu-type build --install')";
format_error({unknown_options, Keys}) ->
    io_lib:format("unknown lock-counting options: ~p", [Keys]);
format_error({bad_categories, Cats}) ->
    io_lib:format("unknown lock categories ~p; known: ~p", [Cats, ?ALL_CATEGORIES]);
format_error(Other) ->
    io_lib:format("lock counting failed: ~p", [Other]).

%%%===================================================================
%%% Internal
%%%===================================================================

-spec start_checked(options()) -> {ok, state()} | {error, {beamdiag_agent_lcnt, term()}}.
start_checked(Opts) ->
    Cats = maps:get(categories, Opts, ?DEFAULT_CATEGORIES),
    case {available(), Cats -- ?ALL_CATEGORIES} of
        {false, _} ->
            {error, {?MODULE, not_lcnt_emulator}};
        {true, [_ | _] = Bad} ->
            {error, {?MODULE, {bad_categories, Bad}}};
        {true, []} ->
            Mask = erts_debug:lcnt_control(mask),
            CopySave = erts_debug:lcnt_control(copy_save),
            %% The mask cannot change while deleted locks are being saved.
            ok = erts_debug:lcnt_control(copy_save, false),
            ok = erts_debug:lcnt_control(mask, Cats),
            %% Counters already cleared for this session (`clear => false')
            %% are kept, unless a category was added: its locks would count
            %% from now only, so all restart here (the stock mask of the
            %% lock-counting emulator has every category; dropping `debug'
            %% only stops its locks counting).
            _ = case maps:get(clear, Opts, true) orelse Cats -- Mask =/= [] of
                    true -> ok = erts_debug:lcnt_clear();
                    false -> ok
                end,
            Guard =
                case Opts of
                    #{owner := Owner} ->
                        guard(Owner, maps:get(max_s, Opts, 3600), Mask, CopySave);
                    #{max_s := MaxS} ->
                        guard(undefined, MaxS, Mask, CopySave);
                    #{} ->
                        undefined
                end,
            {ok, #{
                saved_mask => Mask,
                saved_copy_save => CopySave,
                categories => Cats,
                top => maps:get(top, Opts, 50),
                guard => Guard
            }}
    end.

%% A process on the target that puts the settings back if the owner goes
%% down or the time runs out before stop/1 is called.
-spec guard(pid() | undefined, pos_integer(), [atom()], boolean()) -> pid().
guard(Owner, MaxS, Mask, CopySave) ->
    spawn(fun() ->
        _ =
            case Owner of
                undefined -> ok;
                _ -> erlang:monitor(process, Owner)
            end,
        receive
            {'DOWN', _, process, _, _} -> restore(Mask, CopySave)
        after MaxS * 1000 ->
            restore(Mask, CopySave)
        end
    end).

-spec restore([atom()], boolean()) -> ok.
restore(Mask, CopySave) ->
    ok = erts_debug:lcnt_control(copy_save, false),
    ok = erts_debug:lcnt_control(mask, Mask),
    ok = erts_debug:lcnt_control(copy_save, CopySave).

%% Locks grouped by class and id: {Class, IdBin} => {Type, Instances, [Stat]}.
-spec group_locks([raw_lock()]) -> #{{binary(), binary()} => {atom(), pos_integer(), [raw_stat()]}}.
group_locks(Locks) ->
    lists:foldl(
        fun({Name, Id, Type, Stats}, Acc) ->
            Key = {atom_to_binary(Name), render_id(Id)},
            case Acc of
                #{Key := {T, N, Ss}} -> Acc#{Key := {T, N + 1, Stats ++ Ss}};
                #{} -> Acc#{Key => {Type, 1, Stats}}
            end
        end,
        #{},
        Locks
    ).

-spec lock_entry({binary(), binary()}, {atom(), pos_integer(), [raw_stat()]}, pos_integer()) ->
    map().
lock_entry({Class, Id}, {Type, Instances, Stats}, WindowNs) ->
    PerLoc = merge_locations(Stats),
    Tries = lists:sum([T || {_, T, _, _, _, _} <- PerLoc]),
    Colls = lists:sum([C || {_, _, C, _, _, _} <- PerLoc]),
    Wait = lists:sum([W || {_, _, _, W, _, _} <- PerLoc]),
    Waits = lists:sum([N || {_, _, _, _, N, _} <- PerLoc]),
    Hist = sum_histograms([H || {_, _, _, _, _, H} <- PerLoc]),
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

%% Sums the statistics of the same source location over lock instances.
-spec merge_locations([raw_stat()]) ->
    [{binary(), non_neg_integer(), non_neg_integer(), non_neg_integer(), non_neg_integer(), [non_neg_integer()]}].
merge_locations(Stats) ->
    M = lists:foldl(
        fun(Stat, Acc) ->
            {{File, Line}, {T, C, {S, Ns, N}}, Hist} =
                case Stat of
                    {L, V, H} -> {L, V, H};
                    {L, V} -> {L, V, {}}
                end,
            Loc = location(File, Line),
            H1 = tuple_to_list(Hist),
            W = S * 1000000000 + Ns,
            case Acc of
                #{Loc := {T0, C0, W0, N0, H0}} ->
                    Acc#{Loc := {T0 + T, C0 + C, W0 + W, N0 + N, sum_histograms([H0, H1])}};
                #{} ->
                    Acc#{Loc => {T, C, W, N, H1}}
            end
        end,
        #{},
        Stats
    ),
    [{Loc, T, C, W, N, H} || {Loc, {T, C, W, N, H}} <- maps:to_list(M)].

-spec location(atom(), non_neg_integer()) -> binary().
location(undefined, _) -> <<"unknown">>;
location(File, Line) -> iolist_to_binary([atom_to_binary(File), $:, integer_to_binary(Line)]).

-spec sum_histograms([[non_neg_integer()]]) -> [non_neg_integer()].
sum_histograms([]) -> [];
sum_histograms([H]) -> H;
sum_histograms([[], H | Rest]) -> sum_histograms([H | Rest]);
sum_histograms([H, [] | Rest]) -> sum_histograms([H | Rest]);
sum_histograms([A, B | Rest]) -> sum_histograms([lists:zipwith(fun erlang:'+'/2, A, B) | Rest]).

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

-spec class_totals([map()], pos_integer()) -> [map()].
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

-spec rank(map(), map()) -> boolean().
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
-spec dirty_alloc_instances() -> non_neg_integer().
dirty_alloc_instances() ->
    try erlang:system_info({allocator, eheap_alloc}) of
        Info when is_list(Info) ->
            N = length([I || {instance, I, _} <- Info]),
            max(0, N - erlang:system_info(schedulers) - 1);
        _ ->
            0
    catch
        error:badarg -> 0
    end.

%% Owner and options of the ETS tables whose locks rank highest.
-spec table_info([map()]) -> [map()].
table_info(Locks) ->
    Names = lists:sublist(
        dedup([Id || #{class := C, id := Id} <- Locks, lists:member(C, ?DB_CLASSES)]),
        ?TABLE_LOOKUPS
    ),
    [table(Name) || Name <- Names].

-spec dedup([binary()]) -> [binary()].
dedup(L) ->
    dedup(L, #{}).

-spec dedup([binary()], map()) -> [binary()].
dedup([], _) -> [];
dedup([H | T], Seen) when is_map_key(H, Seen) -> dedup(T, Seen);
dedup([H | T], Seen) -> [H | dedup(T, Seen#{H => true})].

-spec table(binary()) -> map().
table(Name) ->
    case find_table(Name) of
        {Tid, Count} ->
            try
                Owner = ets:info(Tid, owner),
                Info = [
                    {K, ets:info(Tid, K)}
                 || K <- [type, protection, write_concurrency, read_concurrency,
                          decentralized_counters, named_table]
                ],
                Fields = maps:from_list([{K, text(V)} || {K, V} <- Info]),
                Fields#{
                    name => Name,
                    owner => owner_text(Owner),
                    tables_with_name => Count
                }
            catch
                error:badarg -> #{name => Name, owner => <<"gone">>, tables_with_name => 0}
            end;
        none ->
            #{name => Name, owner => <<"gone">>, tables_with_name => 0}
    end.

%% The table with this name: a named table directly, else a bounded scan.
-spec find_table(binary()) -> {ets:table(), non_neg_integer()} | none.
find_table(NameBin) ->
    case binary_to_existing_atom_safe(NameBin) of
        none ->
            none;
        Name ->
            case ets:whereis(Name) of
                undefined ->
                    Matches = [
                        T
                     || T <- lists:sublist(ets:all(), ?TABLE_SCAN_MAX),
                        ets:info(T, name) =:= Name
                    ],
                    case Matches of
                        [] -> none;
                        [T | _] -> {T, length(Matches)}
                    end;
                Tid ->
                    {Tid, 1}
            end
    end.

-spec binary_to_existing_atom_safe(binary()) -> atom() | none.
binary_to_existing_atom_safe(B) ->
    try
        binary_to_existing_atom(B)
    catch
        error:badarg -> none
    end.

-spec owner_text(pid() | undefined) -> binary().
owner_text(Pid) when is_pid(Pid) ->
    case erlang:process_info(Pid, registered_name) of
        {registered_name, Name} -> atom_to_binary(Name);
        _ -> list_to_binary(pid_to_list(Pid))
    end;
owner_text(_) ->
    <<"unknown">>.

-spec text(term()) -> binary().
text(V) when is_atom(V) -> atom_to_binary(V);
text(V) when is_integer(V) -> integer_to_binary(V);
text(V) -> iolist_to_binary(io_lib:format("~0p", [V])).
