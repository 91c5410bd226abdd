%%% The limit rule on both sides of each bound, on captures made of
%%% counts: a share of the limit used, a steady growth, the time left at
%%% this rate, and the atoms' sources.
-module(beamdiag_limit_rules_tests).
-include_lib("eunit/include/eunit.hrl").

%% Samples a second apart, with R's counts (the others idle).
capture(R, Counts, Limit) ->
    capture(R, Counts, Limit, #{}).

capture(R, Counts, Limit, Extras) ->
    capture(R, Counts, Limit, Extras, 1).

%% Samples DtS seconds apart.
capture(R, Counts, Limit, Extras, DtS) ->
    Idle = #{atoms => [10000, 1048576], processes => [100, 262144], ports => [10, 65536],
             ets_tables => [20, 8192]},
    #{samples => [#{t => I * DtS * 1000000000, limits => Idle#{R => [C, Limit]}}
                  || {I, C} <- lists:enumerate(Counts)],
      extras => Extras}.

%% Six samples over 5 s growing by Step a second from Start.
growing(Start, Step) ->
    [Start + Step * I || I <- lists:seq(0, 5)].

found(Capture) ->
    [{maps:get(resource, M), S} || #{id := node_limit, severity := S, metrics := M}
                                       <- beamdiag_limit_rules:findings(Capture)].

%% Atoms: a day left is a warning, an hour critical; less growth than
%% growth_min is no finding.
atoms_time_left_test_() ->
    L = 1000000,
    Big = 5000000,
    %% Left = (L - C1) / Rate, C1 = Start + 5 * Step.
    [?_assertEqual([{<<"atoms">>, critical}], found(capture(atoms, growing(L - 3599 * 100 - 500, 100), L))),
     ?_assertEqual([{<<"atoms">>, warning}], found(capture(atoms, growing(L - 3601 * 100 - 500, 100), L))),
     %% 86,400 s: a warning just under it, nothing just over.
     ?_assertEqual([{<<"atoms">>, warning}],
                   found(capture(atoms, growing(Big - 86399 * 20 - 100, 20), Big))),
     ?_assertEqual([], found(capture(atoms, growing(Big - 86401 * 20 - 100, 20), Big))),
     %% 100 atoms over the window count, 95 do not.
     ?_assertEqual([{<<"atoms">>, warning}], found(capture(atoms, growing(500000, 20), L))),
     ?_assertEqual([], found(capture(atoms, growing(500000, 19), L)))].

%% The share used, growing or not: 0.80 a warning, 0.95 critical.
used_share_test_() ->
    L = 10000,
    Flat = fun(C) -> lists:duplicate(6, C) end,
    [?_assertEqual([], found(capture(processes, Flat(7999), L))),
     ?_assertEqual([{<<"processes">>, warning}], found(capture(processes, Flat(8000), L))),
     ?_assertEqual([{<<"ports">>, warning}], found(capture(ports, Flat(9499), L))),
     ?_assertEqual([{<<"ports">>, critical}], found(capture(ports, Flat(9500), L))),
     ?_assertEqual([{<<"atoms">>, critical}], found(capture(atoms, Flat(9600), L)))].

%% Processes and ports: 10 minutes left critical, an hour a warning.
processes_ports_time_left_test_() ->
    L = 100000,
    [?_assertEqual([{<<"processes">>, critical}],
                   found(capture(processes, growing(L - 599 * 100 - 500, 100), L))),
     ?_assertEqual([{<<"processes">>, warning}],
                   found(capture(processes, growing(L - 601 * 100 - 500, 100), L))),
     ?_assertEqual([{<<"ports">>, warning}],
                   found(capture(ports, growing(L - 3599 * 20 - 100, 20), L))),
     ?_assertEqual([], found(capture(ports, growing(L - 3601 * 20 - 100, 20), L))),
     %% Ports: 50 over the window count, 45 do not.
     ?_assertEqual([{<<"ports">>, warning}], found(capture(ports, growing(70000, 10), L))),
     ?_assertEqual([], found(capture(ports, growing(70000, 9), L)))].

%% A count that falls in more than a quarter of the intervals is load,
%% not a leak, however near its end; one that rose in fewer than half is a
%% burst (a pool started, modules loaded with their atoms).
steady_test_() ->
    L = 100000,
    Up = [50000, 60000, 55000, 70000, 65000, 79000],    % falls in 2 of 5
    Mostly = [50000, 60000, 55000, 70000, 75000, 79000], % falls in 1 of 5
    Burst = [50000, 50000, 50000, 60000, 60000, 60000],  % rises in 1 of 5
    Twice = [50000, 50000, 55000, 55000, 60000, 60000],  % rises in 2 of 5
    Thrice = [50000, 50000, 55000, 55000, 60000, 61000], % rises in 3 of 5
    [?_assertEqual([], found(capture(processes, Up, L))),
     ?_assertEqual([{<<"processes">>, critical}], found(capture(processes, Mostly, L))),
     ?_assertEqual([], found(capture(processes, Burst, L))),
     ?_assertEqual([], found(capture(atoms, [9772, 10117, 10117, 10117, 10117, 10117], L))),
     ?_assertEqual([], found(capture(processes, Twice, L))),
     ?_assertEqual([{<<"processes">>, critical}], found(capture(processes, Thrice, L)))].

%% ETS tables: a steady growth of 100 or more at 1 a second or more is a
%% leak (no time to a limit: it is not enforced).
ets_test_() ->
    Slow = capture(ets_tables, [100, 140, 180, 220, 260, 300], 8192, #{}, 60),
    [?_assertEqual([{<<"ets_tables">>, warning}],
                   found(capture(ets_tables, growing(100, 20), 8192))),
     ?_assertEqual([], found(capture(ets_tables, growing(100, 19), 8192))),
     %% 200 tables in 5 minutes: under a table a second.
     ?_assertEqual([], found(Slow)),
     ?_assertEqual(undefined,
                   maps:get(seconds_left, maps:get(metrics, hd(beamdiag_limit_rules:findings(
                       capture(ets_tables, growing(100, 20), 8192)))), undefined))].

%% The atoms' sources: a process in a function that makes atoms is named
%% first, with the functions seen; none caught, or none looked for, is
%% said so.
sources_test_() ->
    L = 1000000,
    Counts = growing(L - 300000, 1000),
    Sources = #{atoms => [700000, 700500], rounds => 5, span_ms => 90,
                processes => [#{pid => <<"<0.1.0>">>, name => null, samples => 5,
                                functions => [<<"a:b/1">>], makes_atoms => []},
                              #{pid => <<"<0.2.0>">>, name => <<"decoder">>, samples => 3,
                                functions => [<<"erlang:binary_to_term/1">>, <<"d:loop/2">>],
                                makes_atoms => [<<"erlang:binary_to_term/1">>]}]},
    Ev = fun(C) -> iolist_to_binary(lists:join("\n", maps:get(evidence, hd(
                                                    beamdiag_limit_rules:findings(C))))) end,
    With = Ev(capture(atoms, Counts, L, #{atom_sources => Sources})),
    [?_assertMatch({_, _}, binary:match(With, <<"decoder <0.2.0> in 3 of 5 looks, in "
                                                "erlang:binary_to_term/1, d:loop/2; "
                                                "erlang:binary_to_term/1 makes atoms">>)),
     ?_assert(element(1, binary:match(With, <<"decoder">>)) <
                  element(1, binary:match(With, <<"<0.1.0>">>))),
     ?_assertMatch({_, _}, binary:match(Ev(capture(atoms, Counts, L,
                                                   #{atom_sources => Sources#{processes => []}})),
                                        <<"no process was caught running">>)),
     ?_assertMatch({_, _}, binary:match(Ev(capture(atoms, Counts, L)),
                                        <<"were not sampled">>))].

%% Fewer than two samples with counts: nothing to measure.
no_counts_test() ->
    ?assertEqual([], beamdiag_limit_rules:findings(#{samples => [#{t => 0}]})),
    ?assertEqual([], beamdiag_limit_rules:findings(
                       #{samples => [#{t => 0, limits => #{atoms => [1000000, 1000000]}}]})).

%% Processes piling up: the spawner the walks read (the newborn's groups,
%% beamdiag_agent_proc_born) is named with what its children run and where
%% it was; a capture whose walks did not read the newborn says why.
processes_spawner_named_test() ->
    L = 32768,
    Spawner = #{pid => <<"<0.96.0>">>, name => null, initial_call => <<"lab:leak/3">>,
                current => <<"lab:leak_loop/2">>},
    Born = #{read => 200, groups => [#{count => 180, initial_call => <<"erlang:apply/2">>,
                                       current => <<"lab:wait/0">>, parent => Spawner},
                                     #{count => 18, initial_call => <<"erlang:apply/2">>,
                                       parent => null},
                                     #{count => 2, initial_call => <<"erlang:apply/2">>,
                                       parent => null}]},
    C = capture(processes, growing(1000, 500), L, #{procs => #{born => Born}}),
    [#{evidence := Ev}] = beamdiag_limit_rules:findings(C),
    Text = iolist_to_binary(lists:join("\n", Ev)),
    [?assertMatch({_, _}, binary:match(Text, S), S)
     || S <- [<<"of 200 processes born during the window">>,
              <<"180 run erlang:apply/2 (most in lab:wait/0), spawned by <0.96.0> (lab:leak/3), "
                "which was in lab:leak_loop/2">>,
              <<"18 run erlang:apply/2, spawned by a process that is gone">>]],
    %% A group under a tenth of the largest is left out.
    ?assertEqual(nomatch, binary:match(Text, <<"  2 run">>)),
    %% Spawned from a fun and still in it: the fun names them.
    Fun = Born#{groups => [#{count => 200, initial_call => <<"erlang:apply/2">>,
                             current => <<"lab:-leak/3-fun-1-/0">>, parent => Spawner}]},
    [#{evidence := EvF}] = beamdiag_limit_rules:findings(
                             capture(processes, growing(1000, 500), L, #{procs => #{born => Fun}})),
    ?assertMatch({_, _}, binary:match(iolist_to_binary(lists:join("\n", EvF)),
                                      <<"200 run a fun in lab:leak/3, spawned by <0.96.0>">>)),
    C2 = capture(processes, growing(1000, 500), L, #{procs => #{born => #{}}}),
    [#{evidence := Ev2}] = beamdiag_limit_rules:findings(C2),
    ?assertMatch({_, _}, binary:match(iolist_to_binary(Ev2), <<"who spawns them was not read">>)).

%% Ports piling up: the owner of the most ports (beamdiag_agent_ports:owners/2)
%% is named with the driver; none read says why.
ports_owner_named_test() ->
    L = 4096,
    Owner = #{pid => <<"<0.97.0>">>, name => <<"opener">>, initial_call => <<"lab:open/1">>,
              current => <<"lab:open_loop/2">>},
    Groups = [#{count => 480, name => <<"udp_inet">>, owner => Owner}],
    C = capture(ports, growing(100, 80), L, #{procs => #{port_owners => Groups}}),
    [#{evidence := Ev}] = beamdiag_limit_rules:findings(C),
    ?assertMatch({_, _}, binary:match(iolist_to_binary(Ev),
                                      <<"480 udp_inet ports held by opener <0.97.0> (lab:open/1), "
                                        "which was in lab:open_loop/2">>)),
    C2 = capture(ports, growing(100, 80), L, #{procs => #{port_owners => []}}),
    [#{evidence := Ev2}] = beamdiag_limit_rules:findings(C2),
    ?assertMatch({_, _}, binary:match(iolist_to_binary(Ev2), <<"who holds them was not read">>)).

%% Tables piling up: who created the new ones (beamdiag_agent_tables:grew/2)
%% is named; none read says why.
tables_creator_named_test() ->
    Owner = #{pid => <<"<0.99.0>">>, name => null, initial_call => <<"session:init/1">>,
              current => <<"session:loop/1">>},
    Born = [#{count => 300, name => <<"session_state">>, owner => Owner},
            #{count => 2, name => <<"other">>, owner => null}],
    C = capture(ets_tables, growing(100, 20), 8192,
                #{procs => #{tables => #{grew => [], born => Born, count => [100, 400]}}}),
    [#{evidence := Ev}] = beamdiag_limit_rules:findings(C),
    Text = iolist_to_binary(lists:join("\n", Ev)),
    ?assertMatch({_, _}, binary:match(Text, <<"300 tables named session_state, owned by <0.99.0> "
                                              "(session:init/1), which was in session:loop/1">>)),
    ?assertEqual(nomatch, binary:match(Text, <<"other">>)),
    C2 = capture(ets_tables, growing(100, 20), 8192,
                 #{procs => #{tables => #{grew => [], born => [], count => [100, 110]}}}),
    [#{evidence := Ev2}] = beamdiag_limit_rules:findings(C2),
    ?assertMatch({_, _}, binary:match(iolist_to_binary(Ev2), <<"who created them was not read">>)).
