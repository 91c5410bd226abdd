%%% Lock counting on real peer nodes running the lock-counting emulator.
%%%
%%% Each case starts a peer with `-emu_type lcnt', runs a lab workload from
%%% beamdiag_lab_locks, reads its lock counters with beamdiag_lock_session
%%% from here, checks the raw signal first (the node's own counters,
%%% erts_debug:lcnt_collect/0, read by the test around the session: raw/2)
%%% and then the findings. The emulator must be installed
%%% (scripts/lcnt-emulator.sh); without it every case fails.
-module(beamdiag_locks_SUITE).

-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0, groups/0, suite/0, init_per_suite/1, end_per_suite/1, init_per_group/2,
         end_per_group/2, init_per_testcase/2, end_per_testcase/2]).
-export([ets_hot/1, ets_sharded/1, dirty_gc_alloc/1, dirty_gc_alloc_mdai/1, healthy_node/1,
         nothing_changed/1]).
-export([ets_hot_session/1, ets_sharded_session/1, not_counted_session/1,
         installed_not_running/1, saturated_plain_set/1]).

-define(WINDOW_MS, 4000).
%% With +Mdai max the dirty GCs' eheap_alloc locks collide less often: in
%% 4 s windows this host counted 118 to 190 collisions (waits 3.1% to
%% 6.7%), short of the 200 contended/2 needs. The count grows with the
%% span, the wait share does not: 8 s windows.
-define(MDAI_WINDOW_MS, 8000).
-define(GC_ARGS, ["+S", "4:4", "+SDcpu", "4:4"]).
%% As the lab's ets_hot and ets_sharded scenarios: more writers than cores.
-define(ETS_ARGS, ["+S", "4:4"]).

all() ->
    [ets_hot, ets_sharded, dirty_gc_alloc, dirty_gc_alloc_mdai, healthy_node,
     nothing_changed, installed_not_running, saturated_plain_set,
     {group, otp27}, {group, otp29}].

%% The lock session (beamdiag:diagnose on a lab node) on OTP 27's
%% lock-counting emulator, built into the trixie root by
%% scripts/lcnt-emulator.sh; and on OTP 29 (sid), for which no lock-counting
%% emulator can be built here, what the session says to build.
groups() ->
    [{otp27, [], [ets_hot_session, ets_sharded_session, saturated_plain_set]},
     {otp29, [], [not_counted_session]}].

suite() ->
    [{timetrap, {minutes, 3}}].

init_per_suite(Config) ->
    ok = ensure_distributed(),
    Config.

end_per_suite(_Config) ->
    ok.

init_per_group(Group, Config) ->
    beamdiag_test_lib:release_config(case Group of otp27 -> 27; otp29 -> 29 end, Config).

end_per_group(_Group, _Config) ->
    ok.

init_per_testcase(_Case, Config) ->
    Config.

end_per_testcase(_Case, _Config) ->
    ok.

%%%===================================================================
%%% Cases
%%%===================================================================

%% Many writers on one table: the table's hash-slot locks carry a large
%% share of the window, and the finding names the table.
ets_hot(_Config) ->
    {Data, Raw} = measure(ets_hot, ?ETS_ARGS),
    #{wait_pct := Hot, collisions := Coll, tries := Tries} = raw(Raw, table(beamdiag_hot_table)),
    ct:pal("ets_hot: beamdiag_hot_table wait ~.2f% of the span, ~b collisions in ~b tries "
           "(the node's counters); the lock data: wait ~.2f% of the window",
           [Hot, Coll, Tries, float(table_wait_pct(Data, <<"beamdiag_hot_table">>))]),
    ?assert(Hot >= 10.0),
    Findings = beamdiag_lock_rules:findings(Data, #{}),
    [F] = [F || F = #{id := ets_contention} <- Findings],
    ?assertMatch(#{metrics := #{table := <<"beamdiag_hot_table">>}}, F),
    ?assert(beamdiag_finding:at_least(F, warning)),
    [Table] = [T || T = #{name := <<"beamdiag_hot_table">>} <- maps:get(tables, Data)],
    ?assertMatch(#{write_concurrency := <<"true">>, protection := <<"public">>, type := <<"set">>},
                 Table),
    Text = iolist_to_binary(beamdiag_format_locks:text(Data)),
    ?assertNotEqual(nomatch, binary:match(Text, <<"beamdiag_hot_table">>)),
    ok.

%% The same load over one table per scheduler: far less wait, no ETS
%% finding above info.
ets_sharded(_Config) ->
    {Data, Raw} = measure(ets_sharded, ?ETS_ARGS),
    %% The node's own counters: the writers really hit the shard tables'
    %% hash-slot locks (a control whose load never ran would pass for
    %% nothing), and those locks barely wait.
    #{wait_pct := Wait, tries := Tries} =
        raw(Raw, shard_slots()),
    ct:pal("ets_sharded: ~b hash-slot lock acquisitions on the shard tables; they wait "
           "~.2f% of the span in total (the node's counters)", [Tries, Wait]),
    ?assert(Tries > 10000),
    ?assert(Wait < 2.0),
    Findings = beamdiag_lock_rules:findings(Data, #{}),
    ?assertEqual([], [F || F = #{id := ets_contention} <- Findings,
                           beamdiag_finding:at_least(F, warning)]),
    ok.

%% Dirty GC of large heaps with the default +Mdai: the dirty schedulers
%% share one locked eheap_alloc instance, whose lock collides, and the
%% finding says +Mdai max. Contention between dirty GCs depends on them
%% overlapping in time, which a loaded two-core host does not always give
%% in one window: up to three windows are measured.
dirty_gc_alloc(_Config) ->
    Check = fun() ->
        {Data, Raw} = measure(dirty_gc, ?GC_ARGS),
        #{instances := N, collisions := C, wait_pct := W, tries := T} =
            raw(Raw, lock_named(alcu_allocator, eheap_alloc)),
        ct:pal("dirty_gc_alloc: eheap_alloc ~b lock(s), ~b tries, ~b collisions, wait ~.2f% of "
               "the span (the node's counters)", [N, T, C, W]),
        ?assertEqual(0, maps:get(dirty_alloc_instances, Data)),
        Findings = beamdiag_lock_rules:findings(Data, #{}),
        Found = [F || F = #{id := allocator_contention, metrics := #{allocator := <<"eheap_alloc">>}}
                          <- Findings],
        %% Raw signal first: a span whose one shared eheap_alloc lock
        %% collided twice what the rule counts (100 collisions, 1% in wait)
        %% must give the finding; a span with less contention is measured
        %% again.
        case contended(C, W) of
            true -> ?assertEqual(1, N), ?assertMatch([_], Found), Found;
            false -> put(quiet_windows, [{T, C, W} | get_list(quiet_windows)]), []
        end
    end,
    %% A host that never lets the dirty GCs overlap enough in three windows
    %% is a skip with each window's tries, collisions and wait.
    F = case retry_or_none(Check, 3) of
            [Found1] -> Found1;
            [] -> beamdiag_test_lib:starved(
                    "eheap_alloc never reached 200 collisions and 2% wait in 3 spans, by the "
                    "node's counters (tries, collisions, wait %: ~p)", [get_list(quiet_windows)])
        end,
    ?assertNotEqual(nomatch, binary:match(iolist_to_binary(maps:get(evidence, F)),
                                          <<"+Mdai max">>)),
    ok.

%% The same load with +Mdai max: one eheap_alloc instance (and lock) per
%% dirty scheduler besides the global one, and no advice to set +Mdai max.
dirty_gc_alloc_mdai(_Config) ->
    Check = fun() ->
        {Data, Raw} = measure(dirty_gc, ?GC_ARGS ++ ["+Mdai", "max"], ?MDAI_WINDOW_MS),
        #{instances := N, collisions := C, wait_pct := W, tries := T} =
            raw(Raw, lock_named(alcu_allocator, eheap_alloc)),
        ct:pal("dirty_gc_alloc_mdai: eheap_alloc ~b locks, ~b tries, ~b collisions, wait ~.2f% "
               "of the span (the node's counters)", [N, T, C, W]),
        ?assertEqual(4, maps:get(dirty_alloc_instances, Data)),
        %% One eheap_alloc instance (and lock) per dirty scheduler besides
        %% the global one, as the node counts them.
        ?assertEqual(5, N),
        Findings = beamdiag_lock_rules:findings(Data, #{}),
        Found = [F || F = #{id := allocator_contention, metrics := #{allocator := <<"eheap_alloc">>}}
                          <- Findings],
        %% Raw signal first, as in dirty_gc_alloc: a span whose eheap_alloc
        %% locks collided twice what the rule counts must give the finding,
        %% whose advice is then checked; a quieter span is measured again.
        case contended(C, W) of
            true -> ?assertMatch([_], Found), Found;
            false -> put(quiet_windows, [{C, W} | get_list(quiet_windows)]), []
        end
    end,
    case retry_or_none(Check, 3) of
        [_ | _] = Found ->
            [?assertEqual(nomatch, binary:match(iolist_to_binary([maps:get(evidence, F),
                                                                   maps:get(fix, F)]),
                                                <<"+Mdai max">>))
             || F <- Found],
            ok;
        [] ->
            beamdiag_test_lib:not_produced(
              "eheap_alloc never contended in 3 spans with +Mdai max, by the node's counters "
              "(collisions, wait %: ~p; 200 collisions and 2% wait needed): the host did not "
              "run the dirty GCs together",
              [get_list(quiet_windows)])
    end.

get_list(K) ->
    case get(K) of undefined -> []; L -> L end.

%% An idle node gets no lock finding above info.
healthy_node(_Config) ->
    {Data, _Raw} = measure(idle, []),
    Findings = beamdiag_lock_rules:findings(Data, #{}),
    ct:pal("healthy: ~p", [[{I, S} || #{id := I, severity := S} <- Findings]]),
    ?assertEqual([], [F || F <- Findings, beamdiag_finding:at_least(F, warning)]),
    ok.

%% The session reads the counters and changes nothing: the mask and the
%% copy_save flag stay as the node had them, and the counters are not
%% cleared (their duration keeps growing across the session).
nothing_changed(_Config) ->
    {Peer, Node} = start_peer([]),
    try
        ok = erpc:call(Node, erts_debug, lcnt_control, [mask, [db, process]]),
        ok = erpc:call(Node, erts_debug, lcnt_control, [copy_save, true]),
        [{duration, Before} | _] = erpc:call(Node, erts_debug, lcnt_collect, []),
        Due = erlang:monotonic_time(millisecond) + 2500,
        {ok, S} = beamdiag_lock_session:start(Node, #{window_ms => 2000, ready_by => Due}),
        {ok, Data} = beamdiag_lock_session:data(S, 3000),
        %% Raw signal: a span of the session's own, against the baseline.
        ?assertEqual(<<"baseline">>, maps:get(since, Data)),
        ?assert(maps:get(window_s, Data) > 0.5),
        [{duration, After} | _] = erpc:call(Node, erts_debug, lcnt_collect, []),
        ?assert(After > Before),
        ?assertEqual([db, process], lists:sort(erpc:call(Node, erts_debug, lcnt_control, [mask]))),
        ?assertEqual(true, erpc:call(Node, erts_debug, lcnt_control, [copy_save]))
    after
        beamdiag_test_lib:stop_node(Peer)
    end.

%% ets_hot on OTP 27, through the whole session: the raw lock counts in
%% the capture first (the table's wait share and collision rate), then the
%% finding that names the table.
ets_hot_session(Config) ->
    {Locks, Findings, Raw} = session(ets_hot, Config),
    #{wait_pct := Wait, collisions := C, tries := Tries} = raw(Raw, table(beamdiag_hot_table)),
    Coll = 100 * C / max(1, Tries),
    ct:pal("OTP ~s ets_hot: beamdiag_hot_table wait ~.2f% of the span, ~.2f% of ~b tries "
           "collided (the node's counters)", [maps:get(otp_release, Locks), Wait, Coll, Tries]),
    ?assertEqual(integer_to_binary(?config(release, Config)), maps:get(otp_release, Locks)),
    ?assert(Wait >= 10.0),
    ?assert(Coll >= 1.0),
    [F] = [F || F = #{id := ets_contention} <- Findings],
    ?assertMatch(#{severity := critical, metrics := #{table := <<"beamdiag_hot_table">>}}, F),
    [Table] = [T || T = #{name := <<"beamdiag_hot_table">>} <- maps:get(tables, Locks)],
    ?assertMatch(#{write_concurrency := <<"true">>, protection := <<"public">>}, Table),
    ok.

%% ets_sharded on OTP 27: the writers run (the hash-slot locks are taken
%% millions of times) but the shard tables barely wait, and no ETS finding.
ets_sharded_session(Config) ->
    {Locks, Findings, Raw} = session(ets_sharded, Config),
    #{wait_pct := Wait, tries := Tries, collisions := C, instances := Shards} =
        raw(Raw, shard_slots()),
    ct:pal("OTP ~s ets_sharded: the shard tables' hash-slot locks ~b tries, ~.2f% collided; "
           "~b locks, waiting ~.2f% of the span (the node's counters)",
           [maps:get(otp_release, Locks), Tries, 100 * C / max(1, Tries), Shards, Wait]),
    ?assertEqual(integer_to_binary(?config(release, Config)), maps:get(otp_release, Locks)),
    ?assert(Tries >= 100000),
    ?assert(Wait < 2.0),
    ?assertEqual([], [F || F = #{id := ets_contention} <- Findings]),
    ok.

%% The seeds' own case on a saturated node: the default scheduler count
%% (one per core), 64 writers on one counter of a plain set table (no
%% write_concurrency: one lock for the table). The raw signal first, read
%% from the node's counters apart from beamdiag around the session: the
%% table's lock wait as a share of the span. Then the session, as
%% `beamdiag diagnose NODE' runs it: the finding names the table, on time
%% (the window plus 2 s, from the call). A node whose schedulers did
%% not get their CPUs skips, counted, with the numbers.
saturated_plain_set(Config) ->
    Window = 6,
    Vary = #{schedulers => host, writers => 64, write_concurrency => false},
    {ok, Lab} = beamdiag_test_lib:start_lab(ets_hot, maps:merge(#{duration => 60, vary => Vary},
                                                               exec(Config))),
    try
        Node = beamdiag_lab:node(Lab),
        true = erlang:set_cookie(Node, beamdiag_lab:cookie(Lab)),
        Before = erpc:call(Node, erts_debug, lcnt_collect, [], 30000),
        Load = erpc:call(Node, erlang, statistics, [total_run_queue_lengths], 30000),
        R = beamdiag:diagnose(Node, #{cookie => beamdiag_lab:cookie(Lab), duration => Window}),
        After = erpc:call(Node, erts_debug, lcnt_collect, [], 30000),
        Wait = hot_table_wait(Before, After),
        ct:pal("OTP ~s: run queue ~b at the start; beamdiag_hot_table waited ~.1f% of the span "
               "(read apart)", [release(Config), Load, Wait]),
        ?assert(Load >= 32),
        %% The pathology, produced: the table's lock waited twice the rule's
        %% warning share (5% of the window) or more, so that the session's
        %% window, inside the span, sees it whatever its share of the span.
        %% (Measured: 21.7% to 67% of the span, OTP 25 to 27, 2 cores; the
        %% 64 writers do not always reach the lock at once.) Below that the
        %% lab did not produce it: a counted skip with the figure.
        case Wait >= 10.0 of
            true -> ok;
            false -> beamdiag_test_lib:not_produced("beamdiag_hot_table's lock waited ~.1f% of "
                                                    "the span (10% or more wanted)", [Wait])
        end,
        {ok, D = #{findings := F, ready_ms := Ms}} = R,
        ct:pal("ready ~b ms, host-only ~p, findings ~p",
               [Ms, maps:get(host_only, D, false), [{Id, S} || #{id := Id, severity := S} <- F]]),
        [E] = [E || E = #{id := ets_contention, metrics := #{table := <<"beamdiag_hot_table">>}} <- F],
        ?assert(beamdiag_finding:at_least(E, warning)),
        %% The fix fits the table: it has no write_concurrency.
        ?assertNotEqual(nomatch, binary:match(maps:get(fix, E), <<"write_concurrency">>)),
        case Ms =< (Window + 2) * 1000 of
            true -> ok;
            false -> late(Ms, Window)
        end
    after
        beamdiag_test_lib:stop_lab(Lab)
    end.

exec(Config) ->
    case ?config(exec, Config) of
        undefined -> #{};
        Exec -> #{exec => Exec}
    end.

release(Config) ->
    case ?config(release, Config) of
        undefined -> erlang:system_info(otp_release);
        R -> integer_to_list(R)
    end.

%% A late report on a host whose load kept the node's schedulers from
%% their CPUs is a counted skip with the figures; otherwise a failure.
late(Ms, Window) ->
    {ok, B} = file:read_file("/proc/loadavg"),
    [L1 | _] = binary:split(B, <<" ">>),
    Load = binary_to_float(L1),
    Cpus = erlang:system_info(logical_processors),
    case Load > 2 * Cpus of
        true -> beamdiag_test_lib:starved("the report came ~b ms after the call (due ~b ms) at a "
                                          "host load of ~.1f on ~b CPUs", [Ms, (Window + 2) * 1000,
                                                                          Load, Cpus]);
        false -> ct:fail("the report came ~b ms after the call, due ~b ms (host load ~.1f on ~b "
                         "CPUs)", [Ms, (Window + 2) * 1000, Load, Cpus])
    end.

%% The hot table's lock wait between two readings of the node's
%% counters, in percent of the span (100%: one thread waiting throughout).
hot_table_wait(Before, After) ->
    Sum = fun(R) ->
              {S, Ns} = proplists:get_value(duration, R),
              {S * 1000000000 + Ns,
               lists:sum([WS * 1000000000 + WNs
                          || {_, beamdiag_hot_table, _, Stats} <- proplists:get_value(locks, R),
                             {_, {_, _, {WS, WNs, _}}, _} <- Stats])}
          end,
    {D0, W0} = Sum(Before),
    {D1, W1} = Sum(After),
    100 * (W1 - W0) / max(1, D1 - D0).

%% OTP 29's node runs the stock emulator: the session counts no locks and
%% says which source and command build the lock-counting emulator for
%% exactly that release.
not_counted_session(Config) ->
    {ok, Lab} = beamdiag_test_lib:start_lab(idle, #{duration => 60, exec => ?config(exec, Config)}),
    try
        Node = beamdiag_lab:node(Lab),
        Otp = peer:call(maps:get(peer, Lab), erlang, system_info, [otp_release]),
        ?assertEqual("29", Otp),
        {ok, #{capture := C, ledger := #{notes := Notes}}} =
            beamdiag:diagnose(Node, #{cookie => beamdiag_lab:cookie(Lab), duration => 2}),
        ?assertNot(maps:is_key(locks, maps:get(extras, C))),
        #{otp_version := V, lock_counting := false, lcnt_emulator_installed := false} =
            maps:get(settings, C),
        ct:pal("OTP ~s notes: ~p", [V, Notes]),
        ?assertMatch(<<"29.", _/binary>>, V),
        Want = <<"emu-type build --install --otp-src otp_src_", V/binary, ".tar.gz">>,
        ?assertMatch([_], [N || N <- Notes, binary:match(N, Want) =/= nomatch])
    after
        beamdiag_test_lib:stop_lab(Lab)
    end.

%% A node on the stock emulator of an Erlang that has the lock-counting
%% emulator installed beside it (this machine's, by the set-up): the note
%% says to restart it with -emu_type lcnt, not to build anything.
installed_not_running(_Config) ->
    {ok, Lab} = beamdiag_test_lib:start_lab(idle, #{duration => 60}),
    try
        {ok, #{capture := C, ledger := #{notes := Notes}}} =
            beamdiag:diagnose(beamdiag_lab:node(Lab), #{cookie => beamdiag_lab:cookie(Lab),
                                                        duration => 2}),
        %% Raw signal: stock emulator, the lock-counting one on disk.
        ?assertMatch(#{lock_counting := false, lcnt_emulator_installed := true},
                     maps:get(settings, C)),
        [N] = [X || X = <<"locks not counted", _/binary>> <- Notes],
        ct:pal("~ts", [N]),
        ?assertNotEqual(nomatch, binary:match(N, <<"restart the node with -emu_type lcnt">>)),
        ?assertEqual(nomatch, binary:match(N, <<"emu-type build">>))
    after
        beamdiag_test_lib:stop_lab(Lab)
    end.

%%%===================================================================
%%% Helpers
%%%===================================================================

%% Runs a lab lock scenario on the group's OTP with its lock-counting
%% emulator and diagnoses it: the capture's lock data and the findings.
%% On a host this loaded (four busy schedulers on two shared cores) the
%% node can miss the session's deadlines; that says nothing about the
%% locks, so the session is run again on a fresh node, at most three times.
session(Scenario, Config) ->
    session(Scenario, Config, 3).

session(Scenario, Config, Tries) ->
    Exec = ?config(exec, Config),
    {ok, Lab} = beamdiag_test_lib:start_lab(Scenario, #{duration => 60, exec => Exec}),
    Cpu0 = beamdiag_test_lib:host_cpu(),
    Node = beamdiag_lab:node(Lab),
    true = erlang:set_cookie(Node, beamdiag_lab:cookie(Lab)),
    {Result, Raw} =
        try
            Before = raw_counters(Node),
            R = beamdiag:diagnose(Node, #{cookie => beamdiag_lab:cookie(Lab),
                                          duration => ?WINDOW_MS div 1000}),
            {R, {Before, raw_counters(Node)}}
        after
            beamdiag_test_lib:stop_lab(Lab)
        end,
    case Result of
        {ok, #{capture := #{extras := #{locks_missing := _}} = C}} when Tries > 1 ->
            %% The report came on time, without the lock data: the node
            %% read its counters too late for it.
            case beamdiag_test_lib:retry_on_loaded_host(
                   Cpu0, "~s: the lock data came too late (~p)", [Scenario, maps:get(notes, C)]) of
                true -> session(Scenario, Config, Tries - 1);
                false -> ct:fail({locks_missing, Scenario, maps:get(notes, C)})
            end;
        {ok, #{capture := C, findings := F}} ->
            ct:pal("findings ~p", [[{Id, S} || #{id := Id, severity := S} <- F]]),
            #{locks := Locks} = maps:get(extras, C),
            {Locks, F, Raw};
        {error, Reason} when Tries > 1 ->
            case host_too_slow(Reason) andalso beamdiag_test_lib:retry_on_loaded_host(
                   Cpu0, "~s: the node did not answer in time (~p)", [Scenario, Reason]) of
                true ->
                    session(Scenario, Config, Tries - 1);
                false ->
                    ct:fail({session, Scenario, Reason})
            end
    end.

%% The session's own deadlines, missed because the host is overloaded: the
%% agent's window, or the loader's first call to a busy node.
host_too_slow({beamdiag_collect, timeout}) -> true;
host_too_slow({beamdiag_loader, {target_facts, _, {error, {erpc, timeout}}}}) -> true;
host_too_slow(_) -> false.

%% Starts a peer with the workload, counts locks over a window and returns
%% the lock data, with the node's own counters read by the test before and
%% after the session (raw/2).
measure(Load, EmuArgs) ->
    measure(Load, EmuArgs, ?WINDOW_MS).

measure(Load, EmuArgs, WindowMs) ->
    {Peer, Node} = start_peer(EmuArgs),
    try
        case Load of
            idle -> ok;
            _ ->
                {ok, _} = erpc:call(Node, beamdiag_lab_locks, run, [Load, #{duration_s => 120}]),
                %% The load runs before the window opens: the node's
                %% reductions grow by millions.
                {R0, _} = erpc:call(Node, erlang, statistics, [reductions]),
                ok = beamdiag_test_lib:await(fun() ->
                    {R, _} = erpc:call(Node, erlang, statistics, [reductions]),
                    R - R0 > 2000000
                end, 30000)
        end,
        Before = raw_counters(Node),
        {ok, S} = beamdiag_lock_session:start(Node, #{window_ms => WindowMs,
                                                      ready_by => infinity}),
        {ok, Data} = beamdiag_lock_session:data(S, infinity),
        {Data, {Before, raw_counters(Node)}}
    after
        beamdiag_test_lib:stop_node(Peer)
    end.

start_peer(EmuArgs) ->
    require_lcnt(),
    Name = list_to_atom("beamdiag_locks_" ++ integer_to_list(erlang:unique_integer([positive]))),
    %% Control over standard I/O: the test node may already be a hidden node
    %% that does not listen (an earlier diagnosis made it one), so the peer
    %% cannot connect back to it.
    {ok, Peer, Node} = beamdiag_test_lib:start_node(
                           list_to_integer(erlang:system_info(otp_release)),
                           #{name => Name, args => ["-emu_type", "lcnt", "-hidden"] ++ EmuArgs,
                             wait_boot => 30000}),
    true = erpc:call(Node, erlang, system_info, [lock_counting]),
    load(Node, beamdiag_lab_locks),
    {Peer, Node}.

load(Node, Mod) ->
    {Mod, Bin, File} = code:get_object_code(Mod),
    {module, Mod} = erpc:call(Node, code, load_binary, [Mod, File, Bin]).

%% The lock-counting emulator must be installed: CI installs it first.
require_lcnt() ->
    Bin = filename:join([code:root_dir(), "erts-" ++ erlang:system_info(version), "bin",
                         "beam.lcnt.smp"]),
    case filelib:is_regular(Bin) of
        true ->
            ok;
        false ->
            ct:fail("the lock-counting emulator is not installed (~s is missing): "
                    "run scripts/lcnt-emulator.sh (as root) first", [Bin])
    end.

ensure_distributed() ->
    case node() of
        nonode@nohost ->
            _ = os:cmd("epmd -daemon"),
            Name = list_to_atom("beamdiag_locks_ct_" ++ os:getpid()),
            {ok, _} = net_kernel:start([Name, shortnames]),
            ok;
        _ ->
            ok
    end.

table_wait_pct(Data, Table) ->
    lists:sum([P || #{class := C, id := Id, wait_pct := P} <- maps:get(locks, Data),
                    Id =:= Table, lists:member(C, [<<"db_hash_slot">>, <<"db_tab">>])]).

%% The node's own lock counters (erts_debug:lcnt_collect/0), read by the
%% test apart from beamdiag.
raw_counters(Node) ->
    erpc:call(Node, erts_debug, lcnt_collect, [], 30000).

%% Between two readings of the node's counters, over the locks Pick(Name,
%% Id) selects: their tries, collisions and wait, the wait as a share of
%% the span (%, summed over the threads that waited: it may pass 100), and
%% how many lock instances the second reading has. Totals are compared, not
%% lock by lock: the instances of one table's hash slots, or of one
%% allocator type, share a name and an id. (For a table or an allocator
%% the locks live as long as their owner; a lock gone between the readings
%% would take its counts with it.)
raw({Before, After}, Pick) ->
    Span = duration_ns(After) - duration_ns(Before),
    Entries = fun(R) -> [Ls || {Name, Id, _Type, Ls} <- proplists:get_value(locks, R),
                               Pick(Name, Id)] end,
    Sum = fun(R) ->
              lists:foldl(fun({_Where, {T, C, {S, Ns, _}}, _Hist}, {T0, C0, W0}) ->
                                  {T0 + T, C0 + C, W0 + S * 1000000000 + Ns}
                          end, {0, 0, 0}, lists:append(Entries(R)))
          end,
    {T0, C0, W0} = Sum(Before),
    {T1, C1, W1} = Sum(After),
    #{tries => T1 - T0, collisions => C1 - C0, wait_pct => 100 * (W1 - W0) / max(1, Span),
      instances => length(Entries(After))}.

duration_ns(R) ->
    {S, Ns} = proplists:get_value(duration, R),
    S * 1000000000 + Ns.

%% Every lock of one ETS table (its hash-slot and table locks).
table(Table) ->
    fun(Name, Id) -> lists:member(Name, [db_hash_slot, db_tab, db_tab_fix]) andalso
                         id_text(Id) =:= atom_to_list(Table) end.

%% The hash-slot locks of the lab's shard tables (beamdiag_shard_N).
shard_slots() ->
    fun(Name, Id) -> Name =:= db_hash_slot andalso lists:prefix("beamdiag_shard_", id_text(Id)) end.

lock_named(Name, Id) ->
    fun(N, I) -> N =:= Name andalso id_text(I) =:= atom_to_list(Id) end.

id_text(Id) when is_atom(Id) -> atom_to_list(Id);
id_text(Id) when is_list(Id) -> Id;
id_text(Id) -> lists:flatten(io_lib:format("~p", [Id])).

%% Contended twice what the allocator rule counts (100 collisions, 1% of
%% the span in wait; beamdiag_lock_rules), so that the session's window,
%% inside the span, counts it whatever its share of the span.
contended(Collisions, WaitPct) ->
    Collisions >= 200 andalso WaitPct >= 2.0.

%% Runs Check until it returns a non-empty list, at most N times: that
%% list, or []. Check returns [] only for a window whose raw signal (the
%% lock's own counters) fell short of the pathology, and asserts the
%% finding in any other: a retry follows a measured quiet window, never a
%% wrong diagnosis. The windows it took are reported.
retry_or_none(Check, N) ->
    retry_or_none(Check, N, 1).

retry_or_none(Check, N, K) ->
    case Check() of
        [_ | _] = Found ->
            K > 1 andalso ct:comment(io_lib:format("produced in window ~b of ~b; the ~b before "
                                                   "were quiet by the lock's counters", [K, N, K - 1])),
            Found;
        [] when K < N -> retry_or_none(Check, N, K + 1);
        [] -> []
    end.
