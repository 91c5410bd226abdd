%%% The process rules on process data shaped as the agent returns it: the
%%% findings fire on the pathology, not on many equal workers, and name the
%%% process.
-module(beamdiag_proc_rules_tests).
-include_lib("eunit/include/eunit.hrl").

%%% Fixtures

entry(Pid, Name, Reds, Q, Mem, Mons) ->
    #{pid => Pid, name => Name, initial_call => <<"my_server:init/1">>,
      spawn_call => <<"proc_lib:init_p/5">>, label => null, current => <<"gen_server:loop/7">>,
      reductions => Reds, queue => Q, memory => Mem, heap_words => 1000, born => false,
      monitored_by => Mons, status => <<"running">>, like => null}.

procs(Top, Queues, Heaps, Total) ->
    #{mode => all, limit => 50000, span_ms => 10000, reductions => Total,
      process_count => [1000, 1000], scanned => [1000, 1000], walk_us => [2000, 2000],
      truncated => false, top_reductions => Top, queues => Queues, heaps => Heaps,
      heap_growth => []}.

%% Two schedulers, Busy of them busy over a 10 s window.
ledger(Busy) ->
    #{window_s => 10.0, by_type => #{scheduler => #{busy => Busy * 10.0, wall => 20.0}}}.

settings() ->
    #{schedulers_online => 2}.

ids(Fs) -> [Id || #{id := Id} <- Fs].

%%% Tests

server_bottleneck_test() ->
    Server = entry(<<"<0.90.0>">>, <<"my_server">>, 60000000, [20, 40], [10000, 12000], 63),
    Workers = [entry(<<"<0.1.", (integer_to_binary(I))/binary, ">">>, null, 600000, [0, 0],
                     [2000, 2000], 0) || I <- lists:seq(1, 9)],
    P = procs([Server | Workers], [], [], 100000000),
    [F] = beamdiag_proc_rules:findings(P, ledger(1.6), settings()),
    ?assertEqual(single_process_bottleneck, maps:get(id, F)),
    ?assertEqual(critical, maps:get(severity, F)),
    #{metrics := M = #{name := <<"my_server">>, reds_share := Share}} = F,
    ?assertEqual(0.6, Share),
    %% 60% of 1.6 busy schedulers: 0.96 of one.
    ?assert(abs(maps:get(process_cpus, M) - 0.96) < 1.0e-6),
    ?assertEqual(63, maps:get(waiters, M)),
    ?assertMatch({_, _}, binary:match(hd(maps:get(evidence, F)), <<"my_server <0.90.0>">>)).

%% The monitors on a server are counted at instants (a caller between two
%% calls holds none): the rule takes the most that the end walk and the
%% window's two looks saw, so 16 callers read once as 15 still make the
%% finding critical, the same answer on every window of that load.
server_waiters_most_seen_test() ->
    Server = entry(<<"<0.90.0>">>, <<"my_server">>, 60000000, [0, 0], [10000, 12000], 15),
    Workers = [entry(<<"<0.1.", (integer_to_binary(I))/binary, ">">>, null, 600000, [0, 0],
                     [2000, 2000], 0) || I <- lists:seq(1, 9)],
    P0 = procs([Server | Workers], [], [], 100000000),
    Hop = fun(Pid, M) -> #{pid => Pid, name => null, initial_call => <<"proc_lib:init_p/5">>,
                           status => <<"running">>, current => <<"my_server:handle_call/3">>,
                           stack => [], queue => 0, reductions => 1000000, monitored_by => M,
                           kind => <<"running">>, ends => running} end,
    Look = fun(T, M) -> #{t_ns => T, suspended => #{count => 0, read => [], dist => []},
                          chains => [#{server => Hop(<<"<0.90.0>">>, M),
                                       callers => #{count => M, read => []}, waits_on => []},
                                     #{server => Hop(<<"<0.91.0>">>, 40),
                                       callers => #{count => 40, read => []}, waits_on => []}]} end,
    [Alone] = beamdiag_proc_rules:findings(P0, ledger(2.0), settings()),
    ?assertEqual(warning, maps:get(severity, Alone)),
    ?assertEqual(15, maps:get(waiters, maps:get(metrics, Alone))),
    P = P0#{waits => #{start => Look(0, 16), 'end' => Look(9000000000, 14)}},
    [F] = [X || X = #{id := single_process_bottleneck} <- beamdiag_proc_rules:findings(P, ledger(2.0), settings())],
    ?assertEqual(critical, maps:get(severity, F)),
    %% Another server's monitors are not this one's.
    ?assertEqual(16, maps:get(waiters, maps:get(metrics, F))),
    ?assertMatch({_, _}, binary:match(lists:last(maps:get(evidence, F)), <<"16 processes monitor it">>)).

equal_workers_test() ->
    Workers = [entry(integer_to_binary(I), null, 1000000, [0, 1], [2000, 2000], 0)
               || I <- lists:seq(1, 10)],
    P = procs(Workers, [], [], 64000000),
    ?assertEqual([], beamdiag_proc_rules:findings(P, ledger(2.0), settings())).

%% Two CPU-bound processes on two schedulers: each keeps a scheduler busy,
%% but nobody waits on them and nothing is idle.
two_burners_test() ->
    Burners = [entry(B, null, 50000000, [0, 0], [2000, 2000], 0)
               || B <- [<<"<0.80.0>">>, <<"<0.81.0>">>]],
    P = procs(Burners, [], [], 100000000),
    ?assertEqual([], beamdiag_proc_rules:findings(P, ledger(2.0), settings())).

%% Little work on a quiet node: a large share of nothing.
quiet_node_test() ->
    One = entry(<<"<0.80.0>">>, <<"logger">>, 9000, [0, 0], [2000, 2000], 0),
    P = procs([One], [], [], 10000),
    ?assertEqual([], beamdiag_proc_rules:findings(P, ledger(0.05), settings())).

queue_growth_test() ->
    Q = entry(<<"<0.95.0>">>, <<"consumer">>, 20000, [100, 50100], [1000000, 41000000], 0),
    P = procs([], [Q], [], 1000000),
    [F] = beamdiag_proc_rules:findings(P, ledger(0.5), settings()),
    ?assertEqual(message_queue_growth, maps:get(id, F)),
    #{metrics := M} = F,
    ?assertEqual(5000.0, maps:get(queue_rate, M)),
    ?assertEqual(50100, maps:get(queue_end, M)),
    %% 40 MB for 50,000 messages: 800 bytes a message, 5,000 a second.
    ?assertEqual(800 * 5000 * 60, maps:get(bytes_per_minute, M)),
    ?assertMatch({_, _}, binary:match(hd(maps:get(evidence, F)), <<"consumer">>)).

queue_small_or_shrinking_test() ->
    Small = entry(<<"<0.95.0>">>, <<"a">>, 20000, [0, 300], [2000, 9000], 0),
    Shrinking = entry(<<"<0.96.0>">>, <<"b">>, 20000, [90000, 10], [2000, 2000], 0),
    P = procs([], [Small, Shrinking], [], 1000000),
    ?assertEqual([], beamdiag_proc_rules:findings(P, ledger(0.5), settings())).

dirty_gc_names_heaps_test() ->
    Big = (entry(<<"<0.120.0>">>, null, 100, [0, 400000], [300000000, 520000000], 0))#{
        initial_call => <<"rabbit_amqqueue_process:init/1">>, like => 12},
    Small = entry(<<"<0.121.0>">>, null, 100, [0, 0], [4000, 4000], 0),
    P = procs([], [], [Big, Small], 1000),
    Gc = beamdiag_finding:new(dirty_cpu_gc, warning, [<<"dirty gc 1.2 s">>], #{}),
    [F] = beamdiag_proc_rules:annotate([Gc], P, ledger(1.0)),
    Ev = iolist_to_binary(lists:join("\n", maps:get(evidence, F))),
    ?assertMatch({_, _}, binary:match(Ev, <<"<0.120.0> (rabbit_amqqueue_process:init/1): 520.0 MB, +220.0 MB">>)),
    ?assertMatch({_, _}, binary:match(Ev, <<"12 processes with its initial call">>)),
    ?assertEqual(nomatch, binary:match(Ev, <<"<0.121.0>">>)),
    ?assertEqual(520000000, maps:get(largest_heap_bytes, maps:get(metrics, F))),
    %% A flooded GenServer that did not answer the end walk is in the queues
    %% only, with its estimate: it is named first, before a 4.1 MB heap (an
    %% Elixir release's store, measured: it was left out, and code_server
    %% named instead).
    Store = (entry(<<"<0.643.0>">>, <<"Elixir.Holdex.Store">>, 0, [185619, 409157],
                   [null, 169000000], 0))#{memory_estimated => true},
    Code = entry(<<"<0.581.0>">>, <<"code_server">>, 0, [0, 0], [4100000, 4100000], 0),
    [F2] = beamdiag_proc_rules:annotate([Gc], procs([], [Store], [Code], 1000), ledger(1.0)),
    Ev2 = iolist_to_binary(lists:join("\n", maps:get(evidence, F2))),
    ?assertMatch({_, _}, binary:match(Ev2, <<"largest process heaps\n  Elixir.Holdex.Store <0.643.0>">>)),
    ?assertEqual(<<"<0.643.0>">>, maps:get(largest_heap_pid, maps:get(metrics, F2))),
    ?assertMatch({_, _}, binary:match(Ev2, <<"2 processes over 1 MB hold 173.1 MB">>)).

%% A lock-counting bottleneck on the same process is one finding.
merged_with_locks_test() ->
    Server = entry(<<"<0.90.0>">>, <<"my_server">>, 60000000, [20, 40], [10000, 12000], 63),
    P = procs([Server], [], [], 100000000),
    Own = beamdiag_proc_rules:findings(P, ledger(1.6), settings()),
    Lock = beamdiag_finding:new(single_process_bottleneck, warning, [<<"process <0.90.0>: "
                                "threads waited 30% of the window on its locks">>],
                                #{process => <<"<0.90.0>">>, wait_pct => 30.0}),
    Other = beamdiag_finding:new(cpu_saturated, warning, [], #{}),
    Out = beamdiag_proc_rules:annotate(Own ++ [Lock, Other], P, ledger(1.6)),
    ?assertEqual([single_process_bottleneck, cpu_saturated], ids(Out)),
    [F | _] = Out,
    ?assertEqual(4, length(maps:get(evidence, F))),
    ?assertEqual(30.0, maps:get(wait_pct, maps:get(metrics, F))),
    %% Lock counting names a registered process by its name.
    LockByName = Lock#{metrics => #{process => <<"my_server">>}},
    ?assertEqual(1, length([x || #{id := single_process_bottleneck}
                                     <- beamdiag_proc_rules:annotate(Own ++ [LockByName], P,
                                                                     ledger(1.6))])),
    %% On another process: both stay.
    Lock2 = Lock#{metrics => #{process => <<"<0.99.0>">>}},
    ?assertEqual(2, length([x || #{id := single_process_bottleneck}
                                     <- beamdiag_proc_rules:annotate(Own ++ [Lock2], P,
                                                                     ledger(1.6))])).

text_section_test() ->
    Server = entry(<<"<0.90.0>">>, <<"my_server">>, 60000000, [20, 40], [10000, 12000], 63),
    Q = entry(<<"<0.95.0>">>, <<"consumer", 27, "[2J">>, 20000, [100, 50100], [1000, 4100000], 0),
    %% Unread at the start (it held its scheduler), and one born since.
    Unread = entry(<<"<0.97.0>">>, <<"stuck">>, 0, [null, 3], [null, 9000000], 0),
    New = (entry(<<"<0.98.0>">>, <<"fresh">>, 0, [null, 0], [null, 8000000], 0))#{born => true},
    P = procs([Server], [Q], [Q, Server, Unread, New], 100000000),
    Text = beamdiag_safe_text:terminal(beamdiag_format_procs:text(P)),
    ?assertMatch({_, _}, binary:match(Text, <<"unread  stuck">>)),
    ?assertMatch({_, _}, binary:match(Text, <<"new  fresh">>)),
    ?assertMatch({_, _}, binary:match(Text, <<"TOP PROCESSES">>)),
    ?assertMatch({_, _}, binary:match(Text, <<"60.0%  my_server <0.90.0>">>)),
    ?assertMatch({_, _}, binary:match(Text, <<"100 -> 50.1k">>)),
    ?assertEqual(nomatch, binary:match(Text, <<27>>)),
    ?assertMatch({_, _}, binary:match(beamdiag_safe_text:terminal(
        beamdiag_format_procs:text(#{error => <<"error:badarg">>})), <<"not collected">>)).

%% Compare: which process changed between two windows.
compare_test() ->
    ServerA = entry(<<"<0.90.0>">>, <<"my_server">>, 1000000, [0, 0], [10000, 12000], 0),
    ServerB = entry(<<"<0.91.0>">>, <<"my_server">>, 60000000, [0, 400], [10000, 90000], 60),
    Same = entry(<<"<0.5.0>">>, <<"logger">>, 1000000, [0, 0], [5000, 5000], 0),
    A = procs([ServerA, Same], [], [], 100000000),
    B = procs([ServerB, Same#{reductions => 1000000}], [], [], 100000000),
    [First | _] = Rows = beamdiag_compare:processes(A, B),
    ?assertEqual(<<"my_server">>, maps:get(process, First)),
    ?assertEqual([0.01, 0.6], maps:get(share, First)),
    ?assertEqual([0, 400], maps:get(queue, First)),
    ?assertEqual([], [R || R = #{process := <<"logger">>} <- Rows]),
    Text = iolist_to_binary(beamdiag_format_procs:compare_text(Rows)),
    ?assertMatch({_, _}, binary:match(Text, <<"my_server">>)),
    ?assertEqual([], beamdiag_compare:processes(undefined, undefined)).

%% A saved capture keeps the process data, and reads back whole.
capture_round_trip_test() ->
    Server = entry(<<"<0.90.0>">>, <<"my_server">>, 60000000, [20, 40], [10000, 12000], 63),
    P = procs([Server], [], [Server], 100000000),
    Bin = term_to_binary(beamdiag_capture_file:encode(#{procs => P})),
    #{procs := P2} = beamdiag_capture_file:decode(binary_to_term(Bin, [safe])),
    ?assertEqual(P, P2),
    Text = iolist_to_binary(beamdiag_format_procs:text(P2#{mode => <<"unknown_mode">>})),
    ?assertMatch({_, _}, binary:match(Text, <<"unknown_mode: 1000 of 1000 processes">>)).

%% The walks run by default and not with `procs => false'.
procs_option_test_() ->
    {timeout, 60, fun() ->
        {ok, #{capture := #{extras := On}}} = beamdiag:diagnose(#{duration => 1, locks => false}),
        ?assertMatch(#{procs := #{mode := all, top_reductions := _}}, On),
        {ok, #{capture := #{extras := Off}}} =
            beamdiag:diagnose(#{duration => 1, locks => false, procs => false}),
        ?assertNot(is_map_key(procs, Off))
    end}.

%% What a report from the host's view can still say: the process data
%% alone names a mailbox's growth (1,000 messages and 50 a second over the
%% span, both sides), and nothing without one.
named_test_() ->
    Q = fun(Q0, Q1) -> (procs([], [entry(<<"<0.95.0>">>, <<"flooded">>, 0, [Q0, Q1],
                                         [null, null], 0)], [], 0))#{span_ms => 2000} end,
    [?_assert(beamdiag_proc_rules:named(Q(100, 1100))),
     ?_assertNot(beamdiag_proc_rules:named(Q(100, 1099))),
     ?_assertNot(beamdiag_proc_rules:named((Q(100, 1100))#{span_ms => 21000})),
     ?_assertNot(beamdiag_proc_rules:named(#{error => <<"walk failed">>}))].

%% A process the start walk could not read and the watch never answered
%% for has no start length: no growth is made up from its length alone.
unread_start_test() ->
    E = (entry(<<"<0.95.0>">>, <<"flooded">>, 0, [null, 5000000], [null, null], 0))#{
            answered => false},
    ?assertEqual([], beamdiag_proc_rules:findings(procs([], [E], [], 0), ledger(1.0),
                                                  settings())).

%% Where a process was: its current function, and the user's innermost
%% frame that led there when the agent found one.
where_test_() ->
    [?_assertEqual(<<"gen_server:loop/7">>,
                   iolist_to_binary(beamdiag_proc_rules:where(#{current => <<"gen_server:loop/7">>}))),
     ?_assertEqual(<<"lists:foldl/3, called from shop:total/1 (src/shop.erl:12)">>,
                   iolist_to_binary(beamdiag_proc_rules:where(#{current => <<"lists:foldl/3">>,
                                                                own => <<"shop:total/1">>,
                                                                own_at => <<"src/shop.erl:12">>}))),
     %% Not read: said in words, not "?".
     ?_assertEqual(<<"a function not read (it did not answer the walks' reads)">>,
                   iolist_to_binary(beamdiag_proc_rules:where(#{current => <<"?">>}))),
     ?_assertEqual(<<"a function not read (it did not answer the walks' reads)">>,
                   iolist_to_binary(beamdiag_proc_rules:where(#{}))),
     %% Nor is an initial call not read.
     ?_assertEqual(<<"st <0.9.0>">>, iolist_to_binary(beamdiag_proc_rules:who(
                                         #{pid => <<"<0.9.0>">>, name => <<"st">>,
                                           initial_call => <<"?">>})))].

%% dirty_cpu_gc with no heap read at the end but large processes that did
%% not answer there: those are the heaps being collected, not "none".
gc_heaps_stalled_test() ->
    Procs = #{heaps => [], stalled => [#{pid => <<"<0.913.0>">>, name => null, waited_ms => 100,
                                         memory_start => 418023896}]},
    [F] = beamdiag_proc_rules:annotate(
            [beamdiag_finding:new(dirty_cpu_gc, warning, [<<"dirty gc">>], #{})], Procs, #{}),
    Ev = iolist_to_binary(lists:join("\n", maps:get(evidence, F))),
    ?assertMatch({_, _}, binary:match(Ev, <<"the largest processes did not answer">>)),
    ?assertMatch({_, _}, binary:match(Ev, <<"<0.913.0> holds 418.0 MB at the window's start">>)),
    ?assertEqual(nomatch, binary:match(Ev, <<"no process heap over 1 MB">>)).

%% Processes alike: unnamed ones with the same initial call, spawner and
%% function share a group, their figures summed; a registered one is
%% never grouped; groups by their sums.
alike_test() ->
    W = fun(Pid, Cur) -> #{pid => Pid, name => null, initial_call => <<"erlang:apply/2">>,
                           spawn_call => <<"erlang:apply/2">>,
                           parent => #{pid => <<"<0.95.0>">>}, current => Cur} end,
    Named = (W(<<"<0.9.0>">>, <<"relay:loop/4">>))#{name => <<"relay">>},
    Groups = beamdiag_proc_rules:alike([{5, W(<<"<0.1.0>">>, <<"relay:loop/4">>)},
                                        {9, Named},
                                        {4, W(<<"<0.2.0>">>, <<"relay:loop/4">>)},
                                        {3, W(<<"<0.3.0>">>, <<"sink:loop/0">>)}]),
    ?assertEqual([{9, [<<"<0.1.0>">>, <<"<0.2.0>">>]}, {9, [<<"<0.9.0>">>]}, {3, [<<"<0.3.0>">>]}],
                 [{S, [P || {_, #{pid := P}} <- G]} || {S, G} <- Groups]),
    %% Two that did not answer are not alike: nothing is known of them.
    Unread = #{name => null, initial_call => <<"?">>, current => <<"?">>},
    ?assertEqual(2, length(beamdiag_proc_rules:alike([{2, Unread#{pid => <<"<0.7.0>">>}},
                                                      {1, Unread#{pid => <<"<0.8.0>">>}}]))),
    [{_, Two} | _] = Groups,
    ?assertEqual(<<"2 processes alike (erlang:apply/2, spawned by <0.95.0>: <0.1.0> 5, <0.2.0> 4)">>,
                 iolist_to_binary(beamdiag_proc_rules:alike_who(Two, fun integer_to_list/1))).
