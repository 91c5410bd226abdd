%%% @doc Findings from lock-counting data (pure).
%%%
%%% Takes the lock data `beamdiag_lock_data:summarise/3' makes and turns the
%%% contended lock classes into catalogued findings, with the lock class,
%%% the object (ETS table, allocator, process) and the numbers as evidence.
%%% The knowledge base: which class protects what, and what relieves it,
%%% is in `beamdiag_lock_advice' and in docs/LOCKS.md.
%%%
%%% Severity comes from the wait time summed over all threads as a share of
%%% the window (lcnt's "duration %"; 100% is one thread blocked the whole
%%% window): info from 1%, warning from 5%, critical from 25%, and only with
%%% at least 100 collisions, so that one long wait is not a finding.
%%%
%%% ```
%%% 1> {ok, Data} = beamdiag_lock_session:data(Session, 2000).
%%% 2> [maps:get(id, F) || F <- beamdiag_lock_rules:findings(Data, #{})].
%%% [ets_contention]
%%% '''
-module(beamdiag_lock_rules).

-export([findings/2]).

%% The locks of an ordered_set with write_concurrency (a contention-adapting
%% tree) are counted as db_hash_slot with the table's name when counting
%% starts after the table was made, and as erl_db_catree_* with no name
%% (id []) for tree nodes made while counting is on: OTP 25 and 27 alike.
-define(CATREE_CLASSES, [<<"erl_db_catree_base_node">>, <<"erl_db_catree_route_node">>]).
-define(DB_CLASSES, [<<"db_hash_slot">>, <<"db_tab">>, <<"db_tab_fix">>, <<"db_hash_lock">>
                     | ?CATREE_CLASSES]).
-define(PROC_CLASSES, [
    <<"proc_main">>, <<"proc_msgq">>, <<"proc_status">>, <<"proc_btm">>, <<"proc_link">>,
    <<"proc_trace">>, <<"proc_sig_queue_buffer">>
]).

%% What the rules work with: the window, the lock data and the node's
%% settings (none when only asking whether a process finding is made).
-type ctx() :: #{window_ns := number(),
                 data := beamdiag_lock_data:lock_data(),
                 settings => beamdiag_agent_vm:settings()}.
%% Lock entries or class totals summed: wait and collisions, with the
%% wait in percent of the window and the collisions in percent of the
%% tries.
-type summary() :: #{tries := non_neg_integer(), collisions := non_neg_integer(),
                     wait_ns := non_neg_integer(), wait_pct := number(),
                     collision_pct := number()}.
-type lock_entry() :: beamdiag_lock_data:lock_entry().
-type class_total() :: beamdiag_lock_data:class_total().
-type table() :: beamdiag_lock_data:table().

%%%===================================================================
%%% API
%%%===================================================================

%% The thresholds the lock rules use, as fractions: the waits summed
%% over the threads against the window (`wait_*'), below `min_collisions'
%% collisions nothing is said; `collision_info', the share of tries that
%% collided; a process whose locks carry `single_process' of all
%% process-lock wait is the bottleneck rather than one of many.
-spec thresholds() -> #{atom() => number()}.
thresholds() ->
    #{wait_info => 0.01, wait_warning => 0.05, wait_critical => 0.25,
      min_collisions => 100, collision_info => 0.01, single_process => 0.5}.

%% @doc The findings of a reading of lock data, most severe first, with
%% the node's settings (`beamdiag_agent_vm:settings/0'): a fix never
%% advises an allocator flag the node already has. Each wait is a share of
%% the reading's own span (`window_ns'), the time between the two readings
%% it was taken from, not of the report's window: an earlier reading that
%% stands in for a late last one covers less of the window, and its waits
%% keep their share of what it covers.
-spec findings(beamdiag_lock_data:lock_data(), beamdiag_agent_vm:settings()) ->
    [beamdiag_finding:finding()].
findings(Data, Settings) ->
    Locks = maps:get(locks, Data, []),
    Classes = maps:get(classes, Data, []),
    Ctx = #{window_ns => span_ns(Data), data => Data, settings => Settings},
    Findings =
        ets_findings(Locks, Ctx) ++
            allocator_findings(Locks, Ctx) ++
            process_findings(Locks, Classes, Ctx) ++
            class_findings(Classes, Ctx),
    beamdiag_finding:sort(Findings).

%%%===================================================================
%%% Internal
%%%===================================================================

%% One finding per ETS table whose locks are contended.
-spec ets_findings([lock_entry()], ctx()) -> [beamdiag_finding:finding()].
ets_findings(Locks, Ctx = #{data := Data}) ->
    DbLocks = [L || L = #{class := C} <- Locks, lists:member(C, ?DB_CLASSES)],
    %% Tree-node locks lcnt names no table for belong to the node's one
    %% ordered_set with write_concurrency, when it has only one.
    Trees = maps:get(trees, Data, []),
    Owner = case Trees of
                [#{name := Only}] -> fun(<<"[]">>) -> Only; (Id) -> Id end;
                _ -> fun(Id) -> Id end
            end,
    ByTable = maps:groups_from_list(fun(#{id := Id}) -> Owner(Id) end, DbLocks),
    Tables = maps:get(tables, Data, []) ++ Trees,
    lists:flatmap(
        fun({Name, Ls}) ->
            Sum = sum(Ls, Ctx),
            case severity(Sum) of
                none ->
                    [];
                Sev ->
                    Info = [T || T = #{name := N} <- Tables, N =:= Name],
                    [ets_finding(Name, Ls, Sum, Info, Trees, Sev)]
            end
        end,
        maps:to_list(ByTable)
    ).

-spec ets_finding(binary(), [lock_entry()], summary(), [table()], [table()],
                  beamdiag_finding:severity()) ->
    beamdiag_finding:finding().
ets_finding(Name0, Ls, Sum = #{wait_pct := W, collision_pct := CP, tries := T}, Info, Trees, Sev) ->
    ClassList = lists:usort([C || #{class := C} <- Ls]),
    Name =
        case {ClassList -- ?CATREE_CLASSES, Trees} of
            {[], []} when Name0 =:= <<"[]">> ->
                <<"(an ordered_set with write_concurrency; lcnt names no table for tree "
                  "nodes made while counting)">>;
            {[], _} when Name0 =:= <<"[]">> ->
                iolist_to_binary(
                  ["(one of the node's ordered_set tables with write_concurrency: ",
                   lists:join(", ", [N || #{name := N} <- Trees]),
                   "; lcnt names no table for tree nodes made while counting)"]);
            _ ->
                Name0
        end,
    Instances = lists:sum([maps:get(instances, L, 1) || L <- Ls]),
    {OwnerLine, Opts, Metrics0} =
        case Info of
            [I | _] ->
                Owner = maps:get(owner, I, <<"unknown">>),
                OptText = table_options(I),
                {[<<"owner: ">>, Owner, <<"; options: ">>, OptText],
                 I,
                 #{owner => Owner, options => iolist_to_binary(OptText)}};
            [] ->
                {<<"owner and options unknown (table not found on the node)">>, #{}, #{}}
        end,
    Advice = beamdiag_lock_advice:ets(Opts),
    %% With the table's options known, the fix is the advice fitted to them
    %% (never write_concurrency to a table that has it); without, the
    %% advice stays in the evidence beside the catalogue's fix.
    {AdviceLines, Fitted} = case Opts of
                                #{write_concurrency := _} ->
                                    {[], #{fix => fix_text(Advice)}};
                                _ ->
                                    {[Advice], #{}}
                            end,
    Evidence = [
        io_lib:format(
            "ETS table ~ts: threads waited ~s on its locks (~ts, ~b lock~s); "
            "~s of ~s lock attempts collided",
            [Name, wait_text(W), lists:join(", ", ClassList), Instances, plural(Instances),
             pct_text(CP), beamdiag_units:rate(T)]
        ),
        OwnerLine
    ] ++ location_lines(Ls) ++ AdviceLines,
    beamdiag_finding:new(
        ets_contention, Sev, Evidence,
        maps:merge(Metrics0, (metrics(Sum))#{table => Name}), Fitted
    ).

%% An advice line as a finding's fix: without its "fix: " lead, capitalised.
fix_text(<<"fix: ", C, Rest/binary>>) when C >= $a, C =< $z ->
    <<(C - 32), Rest/binary>>;
fix_text(<<"fix: ", Rest/binary>>) ->
    Rest;
fix_text(Advice) ->
    Advice.

-spec table_options(table()) -> iolist().
table_options(I) ->
    lists:join(", ", [
        [atom_to_binary(K), "=", V]
     || K <- [type, protection, write_concurrency, read_concurrency, decentralized_counters],
        {ok, V} <- [maps:find(K, I)]
    ]).

%% One finding per contended allocator (alcu_allocator ids are allocator names).
-spec allocator_findings([lock_entry()], ctx()) -> [beamdiag_finding:finding()].
allocator_findings(Locks, Ctx = #{data := Data, settings := Settings}) ->
    Alloc = [L || L = #{class := <<"alcu_allocator">>} <- Locks],
    lists:flatmap(
        fun(L = #{id := Id}) ->
            Sum = sum([L], Ctx),
            case severity(Sum) of
                none ->
                    [];
                Sev ->
                    #{wait_pct := W, collision_pct := CP, tries := T} = Sum,
                    Dirty = maps:get(dirty_alloc_instances, Data, unknown),
                    Advice = beamdiag_lock_advice:allocator(Dirty, Settings),
                    Evidence = [
                        io_lib:format(
                            "allocator ~ts: threads waited ~s on its instance "
                            "locks; ~s of ~s lock attempts collided",
                            [Id, wait_text(W), pct_text(CP), beamdiag_units:rate(T)]
                        )
                    ] ++ location_lines([L]) ++ [Advice],
                    %% The catalogue's fix fitted to the node: never +Mdai max
                    %% where the dirty schedulers have instances of their own.
                    [beamdiag_finding:new(
                        allocator_contention, Sev, Evidence,
                        (metrics(Sum))#{allocator => Id},
                        #{fix => beamdiag_fix_text:fix(allocator_contention,
                                                  with_instances(Dirty, Settings))}
                    )]
            end
        end,
        Alloc
    ).

%% Process locks: one process carrying most of the wait is a bottleneck;
%% wait spread over many processes is generic contention.
-spec process_findings([lock_entry()], [class_total()], ctx()) -> [beamdiag_finding:finding()].
process_findings(Locks, Classes, Ctx) ->
    ProcLocks = [L || L = #{class := C} <- Locks, lists:member(C, ?PROC_CLASSES)],
    ByProc = maps:groups_from_list(fun(#{id := Id}) -> Id end, ProcLocks),
    TotalWait = lists:sum([W || #{class := C, wait_ns := W} <- Classes,
                                lists:member(C, ?PROC_CLASSES)]),
    Ranked = lists:reverse(lists:keysort(1, [
        {maps:get(wait_ns, sum(Ls, Ctx)), Id, Ls}
     || {Id, Ls} <- maps:to_list(ByProc)
    ])),
    #{single_process := Single, wait_info := WaitInfo} = thresholds(),
    case Ranked of
        [{Wait, Id, Ls} | _] when TotalWait > 0, Wait >= Single * TotalWait ->
            Sum = sum(Ls, Ctx),
            case severity(Sum) of
                none ->
                    [];
                %% A bottleneck is a process others wait for: collisions
                %% with short waits (0.2% of the window seen on a caller)
                %% do not make one.
                _ when map_get(wait_pct, Sum) / 100 < WaitInfo ->
                    [];
                Sev ->
                    #{wait_pct := W, collision_pct := CP, tries := T} = Sum,
                    ClassList = lists:usort([C || #{class := C} <- Ls]),
                    Evidence = [
                        io_lib:format(
                            "process ~ts: threads waited ~s on its locks "
                            "(~ts), ~s of all process-lock wait; ~s of ~s attempts collided",
                            [Id, wait_text(W), lists:join(", ", ClassList),
                             pct_text(100 * Wait / TotalWait), pct_text(CP), beamdiag_units:rate(T)]
                        )
                    ] ++ location_lines(Ls),
                    [beamdiag_finding:new(
                        single_process_bottleneck, Sev, Evidence,
                        (metrics(Sum))#{process => Id}
                    )]
            end;
        _ ->
            []
    end.

%% Findings from the per-class totals for the classes the rules above do
%% not cover (and for process classes spread over many processes).
-spec class_findings([class_total()], ctx()) -> [beamdiag_finding:finding()].
class_findings(Classes, Ctx) ->
    Covered = ?DB_CLASSES ++ [<<"alcu_allocator">>],
    lists:flatmap(
        fun(C = #{class := Class}) ->
            Sum = sum([C], Ctx),
            case lists:member(Class, Covered) orelse severity(Sum) of
                true -> [];
                none -> [];
                Sev -> class_finding(Class, C, Sum, Sev, Ctx)
            end
        end,
        Classes
    ).

-spec class_finding(binary(), class_total(), summary(), beamdiag_finding:severity(), ctx()) ->
    [beamdiag_finding:finding()].
class_finding(Class, C, Sum, Sev, #{data := Data, settings := Settings}) ->
    IsProc = lists:member(Class, ?PROC_CLASSES),
    %% Process classes concentrated on one process are reported by
    %% process_findings/3.
    case IsProc andalso single_process_reported(Data) of
        true ->
            [];
        false ->
            #{wait_pct := W, collision_pct := CP, tries := T} = Sum,
            Sev1 =
                case IsProc of
                    true -> info;
                    false -> Sev
                end,
            Id =
                case Class of
                    <<"run_queue">> -> run_queue_contention;
                    <<"process_table">> -> process_table_contention;
                    _ -> lock_contention
                end,
            {What, Fix0} =
                case beamdiag_lock_advice:class(Class) of
                    undefined ->
                        {<<"a VM-internal lock">>,
                         <<"see docs/LOCKS.md and the lock's source location">>};
                    Known ->
                        Known
                end,
            Fix = beamdiag_lock_advice:class(Class, release(Data), Settings, Fix0),
            Ids = maps:get(ids, C, 1),
            Evidence = [
                io_lib:format(
                    "lock class ~ts (~ts): threads waited ~s on ~b lock~s; "
                    "~s of ~s attempts collided",
                    [Class, What, wait_text(W), Ids, plural(Ids), pct_text(CP), beamdiag_units:rate(T)]
                )
            ] ++
                top_ids(Class, Data) ++
                case IsProc of
                    true ->
                        [<<"the wait is spread over many processes: usually schedulers "
                           "meeting processes that run on a dirty scheduler (GC of large "
                           "heaps, dirty NIFs) or processes signalling each other">>];
                    false ->
                        []
                end ++
                [["fix: ", Fix]],
            [beamdiag_finding:new(Id, Sev1, Evidence, (metrics(Sum))#{class => Class})]
    end.

%% The node's +Mdai as the lock data counts it: the dirty allocator
%% instances it found, when the settings do not say more.
with_instances(0, Settings) ->
    Settings#{mdai => <<"0">>};
with_instances(N, Settings) when is_integer(N) ->
    case beamdiag_flags:value(mdai, Settings) =:= beamdiag_flags:default(mdai) of
        true -> Settings#{mdai => integer_to_binary(N)};
        false -> Settings
    end;
with_instances(_, Settings) ->
    Settings.

%% The node's OTP major release from the lock data, when it says.
-spec release(beamdiag_lock_data:lock_data()) -> non_neg_integer() | unknown.
release(Data) ->
    case maps:get(otp_release, Data, undefined) of
        B when is_binary(B), byte_size(B) =< 4 ->
            case string:to_integer(B) of
                {N, <<>>} when is_integer(N), N >= 0 -> N;
                _ -> unknown
            end;
        _ ->
            unknown
    end.

-spec single_process_reported(beamdiag_lock_data:lock_data()) -> boolean().
single_process_reported(Data) ->
    Locks = maps:get(locks, Data, []),
    Classes = maps:get(classes, Data, []),
    Ctx = #{window_ns => span_ns(Data), data => Data},
    process_findings(Locks, Classes, Ctx) =/= [].

%% The ids of the class that rank highest, with their share.
-spec top_ids(binary(), beamdiag_lock_data:lock_data()) -> [iolist()].
top_ids(Class, Data) ->
    case [L || L = #{class := C} <- maps:get(locks, Data, []), C =:= Class] of
        [] ->
            [];
        Ls ->
            Top = lists:sublist(Ls, 3),
            [["most wait on: ",
              lists:join(", ", [[Id, " (", pct_text(P), ")"] || #{id := Id, wait_pct := P} <- Top])]]
    end.

%% The reading's own span, in ns: what every share is of.
-spec span_ns(beamdiag_lock_data:lock_data()) -> pos_integer().
span_ns(Data) ->
    max(1, maps:get(window_ns, Data, 1)).

%% Wait, collisions and tries summed over lock entries, with percentages
%% against the window.
-spec sum([lock_entry() | class_total()], ctx()) -> summary().
sum(Ls, #{window_ns := WindowNs}) ->
    Tries = lists:sum([maps:get(tries, L, 0) || L <- Ls]),
    Colls = lists:sum([maps:get(collisions, L, 0) || L <- Ls]),
    Wait = lists:sum([maps:get(wait_ns, L, 0) || L <- Ls]),
    #{
        tries => Tries,
        collisions => Colls,
        wait_ns => Wait,
        wait_pct => 100 * Wait / WindowNs,
        collision_pct =>
            case Tries of
                0 -> 0.0;
                _ -> 100 * Colls / Tries
            end
    }.

-spec severity(summary()) -> beamdiag_finding:severity() | none.
severity(Sum) ->
    severity(Sum, thresholds()).

%% The summary's figures are percent (wait_pct, collision_pct: the lock
%% data's own unit); the thresholds fractions.
severity(#{collisions := C}, #{min_collisions := Min}) when C < Min -> none;
severity(#{wait_pct := W}, #{wait_critical := Crit}) when W / 100 >= Crit -> critical;
severity(#{wait_pct := W}, #{wait_warning := Warn}) when W / 100 >= Warn -> warning;
severity(#{wait_pct := W}, #{wait_info := Info}) when W / 100 >= Info -> info;
%% Frequent collisions with short waits still cost throughput.
severity(#{collision_pct := CP}, #{collision_info := Info}) when CP / 100 >= Info -> info;
severity(_, _) -> none.

-spec metrics(summary()) -> #{atom() => number()}.
metrics(#{tries := T, collisions := C, wait_ns := W, wait_pct := WP, collision_pct := CP}) ->
    #{
        tries => T,
        collisions => C,
        wait_ns => W,
        wait_pct => round2(WP),
        collision_pct => round2(CP)
    }.

%% The source locations with the most wait, over the given lock entries.
-spec location_lines([lock_entry()]) -> [iolist()].
location_lines(Ls) ->
    Locs = lists:foldl(
        fun(#{location := Loc, wait_ns := W}, Acc) -> Acc#{Loc => W + maps:get(Loc, Acc, 0)} end,
        #{},
        lists:append([maps:get(locations, L, []) || L <- Ls])
    ),
    Total = lists:sum(maps:values(Locs)),
    case lists:reverse(lists:keysort(2, maps:to_list(Locs))) of
        [] ->
            [];
        _ when Total =:= 0 ->
            [];
        Sorted ->
            [["waits at: ",
              lists:join(", ", [[Loc, " (", pct_text(100 * W / Total), ")"]
                                || {Loc, W} <- lists:sublist(Sorted, 3), W > 0])]]
    end.

%% The threads' waits, summed over the threads, against the window: a
%% share of it, or a multiple when many threads waited at once.
-spec wait_text(number()) -> iolist().
wait_text(P) when P >= 100 -> io_lib:format("~.1f times the window (summed over the threads)",
                                            [P / 100]);
wait_text(P) -> [pct_text(P), " of the window (summed over the threads)"].

%% A figure of the lock data (percent, its own unit) as text: whole from
%% 10%, with one decimal below.
-spec pct_text(number()) -> string().
pct_text(P) when P >= 10 -> beamdiag_units:whole_pct(P / 100);
pct_text(P) -> beamdiag_units:pct(P / 100).

-spec plural(integer()) -> string().
plural(1) -> "";
plural(_) -> "s".

-spec round2(number()) -> float().
round2(X) -> round(X * 100) / 100.
