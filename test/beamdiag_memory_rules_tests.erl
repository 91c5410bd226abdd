%%% EUnit tests of the memory ledger and its rules on hand-made readings:
%%% every figure is arithmetic done by hand. A relay that keeps its
%%% payloads (binary memory steadily up 40 MB/s), a NIF that mallocs
%%% (resident memory up, the VM flat), and the healthy shapes that must
%%% give nothing: the saw of garbage collection, a large heap that stays
%%% the same size, one burst.
-module(beamdiag_memory_rules_tests).
-include_lib("eunit/include/eunit.hrl").

-define(MIB, 1048576).
-define(S, 1000000000).

%% Seven readings a second apart: VM parts as funs of the second.
capture(Binary, Processes, Native, Room) ->
    Reading = fun(I) ->
        B = Binary(I),
        P = Processes(I),
        Total = B + P + 30 * ?MIB,
        Rss = Total + Native(I),
        #{vm => #{total => Total, processes => P, binary => B, ets => ?MIB, atom => ?MIB,
                  code => 10 * ?MIB, system => 30 * ?MIB - 12 * ?MIB + B},
          os => #{rss => Rss, anon => Rss - 8 * ?MIB, shared => 8 * ?MIB}}
    end,
    Samples = [#{t => erlang:convert_time_unit(I * ?S, nanosecond, native), memory => Reading(I)}
               || I <- lists:seq(0, 6)],
    Extras = case Room of
                 none -> #{};
                 {By, R} -> #{memory_room => #{room => R, bound_by => By}}
             end,
    #{samples => Samples, extras => Extras#{procs => #{heap_growth => []}}}.

flat(V) -> fun(_) -> V end.
ids(C) -> [Id || #{id := Id} <- beamdiag_memory_rules:findings(beamdiag_memory_ledger:build(C), C)].

%% The relay: 40 MiB a second of binaries; the host has 2 GiB available.
binary_leak_test() ->
    C = capture(fun(I) -> 10 * ?MIB + 40 * ?MIB * I end, flat(50 * ?MIB), flat(20 * ?MIB),
                {host, 2048 * ?MIB}),
    M = beamdiag_memory_ledger:build(C),
    #{accounts := #{binary := B, rss := Rss}, span_s := Span} = M,
    ?assertEqual(6.0, Span),
    ?assertEqual(240 * ?MIB, maps:get(change, B)),
    ?assertEqual(40.0 * ?MIB, maps:get(rate, B)),
    ?assert(maps:get(steady, B)),
    %% The resident memory grows as fast: 2 GiB last 51.2 s.
    ?assertEqual(40.0 * ?MIB, maps:get(rate, Rss)),
    ?assertEqual(51.2, maps:get(time_left_s, M)),
    [F] = beamdiag_memory_rules:findings(M, C),
    ?assertEqual(memory_growth, maps:get(id, F)),
    ?assertEqual(critical, maps:get(severity, F)),
    ?assertEqual(<<"The node's binary memory grows by 41.9 MB/s">>, maps:get(title, F)),
    Ev = iolist_to_binary(lists:join("\n", maps:get(evidence, F))),
    [?assertMatch({_, _}, binary:match(Ev, S))
     || S <- [<<"binary memory (erlang:memory/0) grew from 10.5 MB to 262.1 MB in 6.0 s">>,
              <<"resident memory from">>, <<"2.15 GB of the host's available memory">>,
              <<"gone in 51 s">>]],
    ?assertMatch({_, _}, binary:match(maps:get(fix, F), <<"fullsweep_after">>)),
    ?assertEqual(51, maps:get(time_left_s, maps:get(metrics, F))).

%% The same in a cgroup with room for ten minutes and more: a warning,
%% and the limit named.
cgroup_room_test() ->
    C = capture(fun(I) -> 40 * ?MIB * I end, flat(50 * ?MIB), flat(20 * ?MIB),
                {cgroup, 3000 * ?MIB}),
    [F] = beamdiag_memory_rules:findings(beamdiag_memory_ledger:build(C), C),
    ?assertEqual(critical, maps:get(severity, F)),
    ?assertEqual(<<"cgroup">>, maps:get(bound_by, maps:get(metrics, F))),
    C2 = capture(fun(I) -> 40 * ?MIB * I end, flat(50 * ?MIB), flat(20 * ?MIB),
                 {cgroup, 100000 * ?MIB}),
    [F2] = beamdiag_memory_rules:findings(beamdiag_memory_ledger:build(C2), C2),
    ?assertEqual(warning, maps:get(severity, F2)),
    ?assertMatch({_, _}, binary:match(iolist_to_binary(maps:get(evidence, F2)),
                                      <<"below the memory cgroup's limit">>)).

%% A session store whose heap grows: the process that grew is named.
heap_leak_names_the_process_test() ->
    C0 = capture(flat(10 * ?MIB), fun(I) -> 50 * ?MIB + 15 * ?MIB * I end, flat(20 * ?MIB),
                 {host, 20000 * ?MIB}),
    Grower = #{pid => <<"<0.99.0>">>, name => <<"sessions">>, initial_call => <<"store:init/1">>,
               memory => [1 * ?MIB, 91 * ?MIB], current => <<"gen_server:loop/7">>},
    C = C0#{extras := (maps:get(extras, C0))#{procs => #{heap_growth => [Grower]}}},
    [F] = beamdiag_memory_rules:findings(beamdiag_memory_ledger:build(C), C),
    ?assertEqual(<<"processes">>, maps:get(part, maps:get(metrics, F))),
    Ev = iolist_to_binary(lists:join("\n", maps:get(evidence, F))),
    ?assertMatch({_, _}, binary:match(Ev, <<"sessions <0.99.0> (store:init/1) grew by 94.4 MB (100% of the growth)">>)).

%% A queue's heap that climbs in steps (its collections copy it) read
%% between two steps at both walks grew by less than a tenth of the
%% growth: the largest processes at the end are named with what they hold
%% (a real RabbitMQ's queue, measured: 501.1 MB, rabbitmqctl's figure).
heap_in_steps_names_the_largest_test() ->
    C0 = capture(flat(10 * ?MIB), fun(I) -> 50 * ?MIB + 15 * ?MIB * I end, flat(20 * ?MIB),
                 {host, 20000 * ?MIB}),
    Queue = #{pid => <<"<0.911.0>">>, name => null, initial_call => <<"rabbit_prequeue:init/1">>,
              memory => [470 * ?MIB, 478 * ?MIB], queue => [0, 3],
              current => <<"gen_server2:process_next_msg/1">>},
    Small = Queue#{pid => <<"<0.7.0>">>, memory => [1, 1000]},
    C = C0#{extras := (maps:get(extras, C0))#{procs => #{heap_growth => [Queue],
                                                         heaps => [Small, Queue]}}},
    [F] = beamdiag_memory_rules:findings(beamdiag_memory_ledger:build(C), C),
    Ev = iolist_to_binary(lists:join("\n", maps:get(evidence, F))),
    ?assertMatch({_, _}, binary:match(Ev, <<"no process that the walks read grew by a tenth">>)),
    ?assertMatch({_, _}, binary:match(Ev, <<"<0.911.0> (rabbit_prequeue:init/1) holds 501.2 MB, "
                                           "3 messages queued">>)),
    ?assertEqual(nomatch, binary:match(Ev, <<"<0.7.0>">>)).

%% A GenServer flooded by casts, that did not answer the start walk: its
%% memory at the start is unknown, its mailbox grew by 223,538 messages
%% and it holds ~169 MB at the end, so it is named (an Elixir release's
%% Holdex.Store, measured); a mailbox that grew by fewer than 10,000 is
%% not. A queue whose memory was estimated at both ends counts as a heap
%% that grew.
queue_grower_named_test() ->
    C0 = capture(flat(10 * ?MIB), fun(I) -> 160 * ?MIB + 30 * ?MIB * I end, flat(20 * ?MIB),
                 {host, 20000 * ?MIB}),
    Store = fun(Q0, Q1, M0) ->
                    #{pid => <<"<0.643.0>">>, name => <<"Elixir.Holdex.Store">>,
                      initial_call => <<"?">>, current => <<"gen_server:try_dispatch/4">>,
                      queue => [Q0, Q1], memory => [M0, 169 * ?MIB], memory_estimated => true}
            end,
    Ev = fun(Q) ->
                 C = C0#{extras := (maps:get(extras, C0))#{procs => #{heap_growth => [],
                                                                      queues => [Q]}}},
                 [F] = beamdiag_memory_rules:findings(beamdiag_memory_ledger:build(C), C),
                 iolist_to_binary(lists:join("\n", maps:get(evidence, F)))
         end,
    ?assertMatch({_, _}, binary:match(Ev(Store(185619, 409157, null)),
                                      <<"Elixir.Holdex.Store <0.643.0> holds ~177.2 MB now and "
                                        "its mailbox grew from 185.6k to 409.2k messages">>)),
    ?assertMatch({_, _}, binary:match(Ev(Store(null, 9999, null)),
                                      <<"no process that the walks read grew">>)),
    ?assertMatch({_, _}, binary:match(Ev(Store(185619, 409157, 69 * ?MIB)),
                                      <<"Elixir.Holdex.Store <0.643.0> grew by 104.9 MB (">>)),
    ?assertMatch({_, _}, binary:match(Ev(Store(185619, 409157, 69 * ?MIB)),
                                      <<"of the growth); it was in gen_server:try_dispatch/4">>)).

%% A NIF that mallocs: resident memory up 30 MiB a second, the VM flat.
native_leak_test() ->
    C = capture(flat(10 * ?MIB), flat(50 * ?MIB), fun(I) -> 20 * ?MIB + 30 * ?MIB * I end,
                {host, 20000 * ?MIB}),
    ?assertEqual([native_memory], ids(C)).

%% Healthy shapes: garbage collection's saw, a large heap that stays, one
%% burst, a slow rise under the threshold.
healthy_test() ->
    Saw = fun(I) -> 50 * ?MIB + case I rem 2 of 0 -> 0; 1 -> 60 * ?MIB end end,
    ?assertEqual([], ids(capture(flat(10 * ?MIB), Saw, flat(20 * ?MIB), {host, 2048 * ?MIB}))),
    ?assertEqual([], ids(capture(flat(10 * ?MIB), flat(4000 * ?MIB), flat(20 * ?MIB),
                                 {host, 2048 * ?MIB}))),
    Burst = fun(I) when I >= 3 -> 500 * ?MIB; (_) -> 10 * ?MIB end,
    ?assertEqual([], ids(capture(Burst, flat(50 * ?MIB), flat(20 * ?MIB), {host, 2048 * ?MIB}))),
    Slow = fun(I) -> 10 * ?MIB + ?MIB * I end,
    ?assertEqual([], ids(capture(Slow, flat(50 * ?MIB), flat(20 * ?MIB), {host, 2048 * ?MIB}))).

%% A heap that climbs in steps (resized at its collections: flat, then a
%% jump) while the resident memory rises steadily by 15 MiB a second: the
%% part is not steady itself, but it is a leak. The same steps beside a
%% steady native growth six times larger are a NIF's, not the heap's; and
%% the steps beside a flat resident memory (a heap resized once) nothing.
heap_in_steps_test() ->
    Steps = fun(I) -> 50 * ?MIB + 30 * ?MIB * (I div 2) end,
    Rss = fun(I) -> 100 * ?MIB + 15 * ?MIB * I end,
    %% The helper's resident memory is the VM's total plus Native.
    Native = fun(I) -> Rss(I) - (10 * ?MIB + Steps(I) + 30 * ?MIB) end,
    C = capture(flat(10 * ?MIB), Steps, Native, {host, 20000 * ?MIB}),
    M = beamdiag_memory_ledger:build(C),
    #{accounts := #{processes := P, rss := R}} = M,
    ?assertNot(maps:get(steady, P)),
    ?assertEqual(0, maps:get(fall, P)),
    ?assert(maps:get(steady, R)),
    [F] = beamdiag_memory_rules:findings(M, C),
    ?assertEqual(memory_growth, maps:get(id, F)),
    ?assertEqual(<<"processes">>, maps:get(part, maps:get(metrics, F))),
    ?assertMatch({_, _}, binary:match(iolist_to_binary(maps:get(evidence, F)), <<"in steps">>)),
    %% A collection that frees the heap it copied from: a fall of 14% of
    %% the rise (as on OTP 29) is still a climb; a saw whose falls are a
    %% third of its rise is not.
    Dip = fun(I) -> Steps(I) - case I of 3 -> 12 * ?MIB; _ -> 0 end end,
    NativeDip = fun(I) -> Rss(I) - (10 * ?MIB + Dip(I) + 30 * ?MIB) end,
    ?assertEqual([memory_growth], ids(capture(flat(10 * ?MIB), Dip, NativeDip, {host, 20000 * ?MIB}))),
    %% A saw whose falls are a third of its rise is no climb of the heaps;
    %% the resident memory still rose steadily, so the node's memory grows
    %% all the same: the resident memory's growth, the heaps' saw beside it.
    Saw = fun(I) -> Steps(I) - case I of 3 -> 32 * ?MIB; _ -> 0 end end,
    NativeSaw = fun(I) -> Rss(I) - (10 * ?MIB + Saw(I) + 30 * ?MIB) end,
    CSaw = capture(flat(10 * ?MIB), Saw, NativeSaw, {host, 20000 * ?MIB}),
    [SawF] = beamdiag_memory_rules:findings(beamdiag_memory_ledger:build(CSaw), CSaw),
    ?assertEqual({memory_growth, <<"resident">>},
                 {maps:get(id, SawF), maps:get(part, maps:get(metrics, SawF))}),
    ?assertMatch({_, _}, binary:match(iolist_to_binary(maps:get(evidence, SawF)),
                                      <<"processes +">>)),
    OneStep = fun(I) when I >= 3 -> 70 * ?MIB; (_) -> 50 * ?MIB end,
    ?assertEqual([native_memory],
                 ids(capture(flat(10 * ?MIB), OneStep, fun(I) -> 20 * ?MIB + 30 * ?MIB * I end,
                             {host, 20000 * ?MIB}))),
    FlatRss = fun(I) -> 200 * ?MIB - (10 * ?MIB + Steps(I) + 30 * ?MIB) end,
    ?assertEqual([], ids(capture(flat(10 * ?MIB), Steps, FlatRss, {host, 20000 * ?MIB}))).

%% The allocators' account at the window's ends: the carriers and blocks
%% summed, the resident memory beyond the carriers, the types most free
%% first, in the text. A NIF's leak lies beyond the carriers; the same
%% growth with the carriers growing as fast (and their blocks not) is free
%% carrier space, and the evidence says which.
allocators_test() ->
    Native = fun(I) -> 20 * ?MIB + 30 * ?MIB * I end,
    Alloc = fun(Extra) ->
                #{binary_alloc => #{carriers => 40 * ?MIB + Extra, blocks => 10 * ?MIB},
                  eheap_alloc => #{carriers => 60 * ?MIB, blocks => 50 * ?MIB}}
            end,
    C = with_alloc(capture(flat(10 * ?MIB), flat(50 * ?MIB), Native, {host, 20000 * ?MIB}),
                   Alloc(0), Alloc(0)),
    M = beamdiag_memory_ledger:build(C),
    #{accounts := #{carriers := Ca, blocks := Bl, outside := Out, rss := Rss}} = M,
    ?assertEqual({100 * ?MIB, 0}, {maps:get(last, Ca), maps:get(change, Ca)}),
    ?assertEqual(60 * ?MIB, maps:get(last, Bl)),
    ?assertEqual(maps:get(last, Rss) - 100 * ?MIB, maps:get(last, Out)),
    ?assertMatch([#{type := binary_alloc, carriers := _}, #{type := eheap_alloc}],
                 maps:get(allocators, M)),
    [F] = beamdiag_memory_rules:findings(M, C),
    ?assertEqual(native_memory, maps:get(id, F)),
    ?assertMatch({_, _}, binary:match(iolist_to_binary(maps:get(evidence, F)),
                                      <<"beyond the VM's carriers">>)),
    Text = iolist_to_binary(beamdiag_format_text:memory(M)),
    [?assertMatch({_, _}, binary:match(Text, S))
     || S <- [<<"VM carriers">>, <<"beyond carriers">>,
              <<"free in carriers at the end">>,
              <<"binary_alloc      31.5 MB free of    41.9 MB (25% in use)">>]],
    C2 = with_alloc(capture(flat(10 * ?MIB), flat(50 * ?MIB), Native, {host, 20000 * ?MIB}),
                    Alloc(0), Alloc(180 * ?MIB)),
    [F2] = beamdiag_memory_rules:findings(beamdiag_memory_ledger:build(C2), C2),
    ?assertMatch({_, _}, binary:match(iolist_to_binary(maps:get(evidence, F2)),
                                      <<"free space in the carriers">>)).

with_alloc(C = #{samples := [S0 | Rest]}, First, Last) ->
    {Middle, [SN]} = lists:split(length(Rest) - 1, Rest),
    Add = fun(S = #{memory := Mem}, A) -> S#{memory := Mem#{alloc => A}} end,
    C#{samples := [Add(S0, First)] ++ Middle ++ [Add(SN, Last)]}.

%% Captures without readings (an older agent's, a host view's): no
%% accounts, a note, no finding.
no_readings_test() ->
    C = #{samples => [#{t => 0}, #{t => 1}], extras => #{}},
    M = beamdiag_memory_ledger:build(C),
    ?assertEqual(#{}, maps:get(accounts, M)),
    ?assertEqual([<<"no memory readings in this capture">>], maps:get(notes, M)),
    ?assertEqual([], beamdiag_memory_rules:findings(M, C)).

%% The relay named: the walks' binary holders in the evidence.
binary_holder_named_test() ->
    C0 = capture(fun(I) -> 40 * ?MIB * I end, flat(50 * ?MIB), flat(20 * ?MIB),
                 {host, 20000 * ?MIB}),
    Relay = #{pid => <<"<0.88.0>">>, name => null, initial_call => <<"relay:loop/2">>,
              current => <<"relay:loop/2">>, count => 240, bytes => 240 * ?MIB,
              sole_bytes => 239 * ?MIB},
    C = C0#{extras := (maps:get(extras, C0))#{procs => #{heap_growth => [], binaries => [Relay]}}},
    [F] = beamdiag_memory_rules:findings(beamdiag_memory_ledger:build(C), C),
    Ev = iolist_to_binary(lists:join("\n", maps:get(evidence, F))),
    ?assertMatch({_, _}, binary:match(Ev, <<"<0.88.0> (relay:loop/2) references 240 reference-counted "
                                           "binaries of 251.7 MB (250.6 MB of them held by it alone)">>)).

%% Eight relays spawned alike, each holding an eighth: one line for the
%% eight, their binaries summed, three named with their own bytes; a
%% holder unlike them has its own line.
alike_holders_in_one_line_test() ->
    C0 = capture(fun(I) -> 40 * ?MIB * I end, flat(50 * ?MIB), flat(20 * ?MIB),
                 {host, 20000 * ?MIB}),
    Relay = fun(I) ->
                    #{pid => iolist_to_binary(io_lib:format("<0.~b.0>", [96 + I])), name => null,
                      initial_call => <<"erlang:apply/2">>, spawn_call => <<"erlang:apply/2">>,
                      parent => #{pid => <<"<0.95.0>">>}, current => <<"relay:loop/4">>,
                      count => 30, bytes => (40 - I) * ?MIB, sole_bytes => (40 - I) * ?MIB}
            end,
    Other = #{pid => <<"<0.200.0>">>, name => null, initial_call => <<"log:init/1">>,
              current => <<"log:loop/1">>, count => 10, bytes => 20 * ?MIB, sole_bytes => 0},
    Bins = [Relay(I) || I <- lists:seq(1, 3)] ++ [Other] ++ [Relay(I) || I <- lists:seq(4, 8)],
    C = C0#{extras := (maps:get(extras, C0))#{procs => #{heap_growth => [], binaries => Bins}}},
    [F] = beamdiag_memory_rules:findings(beamdiag_memory_ledger:build(C), C),
    Ev = iolist_to_binary(lists:join("\n", maps:get(evidence, F))),
    ?assertMatch({_, _}, binary:match(Ev, <<"8 processes alike (erlang:apply/2, spawned by <0.95.0>: "
                                           "<0.97.0> 40.9 MB, <0.98.0> 39.8 MB, <0.99.0> 38.8 MB "
                                           "and 5 more) reference 240 reference-counted binaries of "
                                           "297.8 MB together (297.8 MB of them held by one of them "
                                           "alone); they were in relay:loop/4">>), Ev),
    ?assertMatch({_, _}, binary:match(Ev, <<"<0.200.0> (log:init/1) references 10">>), Ev),
    ?assertEqual(nomatch, binary:match(Ev, <<"<0.100.0>">>)).

%% Eight stores alike whose heaps grew: one line, their growth summed.
alike_growers_in_one_line_test() ->
    C0 = capture(flat(10 * ?MIB), fun(I) -> 50 * ?MIB + 15 * ?MIB * I end, flat(20 * ?MIB),
                 {host, 20000 * ?MIB}),
    Store = fun(I) ->
                    #{pid => iolist_to_binary(io_lib:format("<0.~b.0>", [96 + I])), name => null,
                      initial_call => <<"store:init/1">>, parent => #{pid => <<"<0.95.0>">>},
                      memory => [1 * ?MIB, (14 - I) * ?MIB], current => <<"gen_server:loop/7">>}
            end,
    C = C0#{extras := (maps:get(extras, C0))#{procs => #{heap_growth => [Store(I) || I <- lists:seq(1, 8)]}}},
    [F] = beamdiag_memory_rules:findings(beamdiag_memory_ledger:build(C), C),
    Ev = iolist_to_binary(lists:join("\n", maps:get(evidence, F))),
    ?assertMatch({_, _}, binary:match(Ev, <<"8 processes alike (store:init/1: <0.97.0> by 12.6 MB, "
                                           "<0.98.0> by 11.5 MB, <0.99.0> by 10.5 MB and 5 more) "
                                           "grew by 71.3 MB together (76% of the growth); they were "
                                           "in gen_server:loop/7">>), Ev).

%% A channel that passes payloads on to a queue references them, but
%% holds none alone: the evidence says they are shared, and names the
%% queue, too large for its binaries to be listed, with its memory. A
%% holder that holds its own is named alone.
shared_binaries_name_the_large_process_test() ->
    C0 = capture(fun(I) -> 40 * ?MIB * I end, flat(50 * ?MIB), flat(20 * ?MIB),
                 {host, 20000 * ?MIB}),
    Channel = #{pid => <<"<0.943.0>">>, name => null, initial_call => <<"rabbit_channel:init/1">>,
                current => <<"rabbit_channel:check_msg_size/3">>, count => 341,
                bytes => 1370 * ?MIB, sole_bytes => 0},
    Queue = #{pid => <<"<0.918.0>">>, name => null, initial_call => <<"rabbit_prequeue:init/1">>,
              current => <<"gen_server2:process_next_msg/1">>, memory => [200 * ?MIB, 255 * ?MIB],
              queue => [0, 12]},
    Small = Queue#{pid => <<"<0.5.0>">>, memory => [1 * ?MIB, 2 * ?MIB]},
    Ev = fun(Bins) ->
                 C = C0#{extras := (maps:get(extras, C0))#{procs => #{heap_growth => [],
                                                                      heaps => [Small, Queue],
                                                                      binaries => Bins}}},
                 [F] = beamdiag_memory_rules:findings(beamdiag_memory_ledger:build(C), C),
                 iolist_to_binary(lists:join("\n", maps:get(evidence, F)))
         end,
    Shared = Ev([Channel]),
    ?assertMatch({_, _}, binary:match(Shared, <<"1.44 GB of the 1.44 GB they reference is "
                                               "referenced by other processes too">>)),
    ?assertMatch({_, _}, binary:match(Shared, <<"<0.918.0> (rabbit_prequeue:init/1) holds 267.4 MB, "
                                               "12 messages queued; it was in "
                                               "gen_server2:process_next_msg/1">>)),
    ?assertEqual(nomatch, binary:match(Shared, <<"<0.5.0>">>)),
    %% None listed at all: the large process is still named.
    ?assertMatch({_, _}, binary:match(Ev([]), <<"<0.918.0> (rabbit_prequeue:init/1) holds">>)),
    Own = Ev([Channel#{sole_bytes => 1300 * ?MIB}]),
    ?assertEqual(nomatch, binary:match(Own, <<"<0.918.0>">>)),
    ?assertEqual(nomatch, binary:match(Own, <<"other processes too">>)).

%% The agent's binary holders, on this node: a process holding 4 MiB of
%% its own binaries is named with their count and bytes; one above the
%% memory bound is not asked.
agent_binaries_test() ->
    Self = self(),
    P = spawn(fun() -> Bins = [binary:copy(<<I>>, 1048576) || I <- lists:seq(1, 4)],
                       Self ! ready, receive stop -> length(Bins) end end),
    receive ready -> ok end,
    {memory, M} = erlang:process_info(P, memory),
    [H] = beamdiag_agent_proc_memory:binaries([P], #{P => M}, 1048576),
    ?assertMatch(#{pid := P, count := 4, bytes := 4194304, sole_bytes := 4194304}, H),
    ?assertEqual([], beamdiag_agent_proc_memory:binaries([P], #{P => 9000000}, 1048576)),
    P ! stop.

%% A middle tick carries the resident memory alone (from the process's
%% stat), the window's ends the anonymous part too (statm): every account
%% is kept, the anonymous one from its two readings.
anon_at_the_ends_test() ->
    R = fun(I, Anon) ->
            Os = #{rss => (100 + 10 * I) * ?MIB},
            #{t => erlang:convert_time_unit(I * ?S, nanosecond, native),
              memory => #{vm => #{total => 50 * ?MIB, processes => 10 * ?MIB, binary => ?MIB,
                                  ets => ?MIB, atom => ?MIB, code => ?MIB, system => 40 * ?MIB},
                          os => case Anon of
                                    true -> Os#{anon => (80 + 10 * I) * ?MIB};
                                    false -> Os
                                end}}
        end,
    A = #{eheap_alloc => #{carriers => 30 * ?MIB, blocks => 20 * ?MIB}},
    C0 = #{samples => [R(0, true), R(1, false), R(2, false), R(3, true)], extras => #{}},
    C = with_alloc(C0, A, A),
    #{accounts := Acc} = beamdiag_memory_ledger:build(C),
    ?assertEqual(lists:sort(beamdiag_memory_ledger:accounts()), lists:sort(maps:keys(Acc))),
    ?assertEqual(30 * ?MIB, maps:get(change, maps:get(anon, Acc))),
    ?assertEqual(10.0 * ?MIB, maps:get(rate, maps:get(rss, Acc))).

%% A node where erlang:memory/0 is not supported (+Mea min): the agent
%% sends an empty VM account; no accounts, a note that says why, no
%% finding.
vm_account_not_supported_test() ->
    S = fun(I) -> #{t => I, memory => #{vm => #{}, os => #{rss => 100 * ?MIB}}} end,
    C = #{samples => [S(0), S(1)], extras => #{}},
    M = beamdiag_memory_ledger:build(C),
    ?assertEqual(#{}, maps:get(accounts, M)),
    [Note] = maps:get(notes, M),
    ?assertMatch({_, _}, binary:match(Note, <<"+Mea min">>)),
    ?assertEqual([], beamdiag_memory_rules:findings(M, C)).

%% A node whose scheduler was held: the agent's ticks could not wait for
%% erlang:memory/0 and say so (`vm_missing'). Every tick late: no accounts,
%% the note says why (not +Mea min), no finding. Some ticks late: the
%% accounts from the others, and the note counts the late ones.
vm_account_late_test() ->
    Late = #{vm => #{}, vm_missing => timeout, os => #{rss => 100 * ?MIB}},
    All = #{samples => [#{t => I, memory => Late} || I <- [0, 1, 2]], extras => #{}},
    M = beamdiag_memory_ledger:build(All),
    ?assertEqual(#{}, maps:get(accounts, M)),
    [Note] = maps:get(notes, M),
    ?assertMatch({_, _}, binary:match(Note, <<"missing in 3 of 3 samples">>)),
    ?assertEqual(nomatch, binary:match(Note, <<"+Mea min">>)),
    ?assertEqual([], beamdiag_memory_rules:findings(M, All)),
    C0 = capture(flat(10 * ?MIB), flat(50 * ?MIB), flat(20 * ?MIB), {host, 20000 * ?MIB}),
    [S0, S1 | Rest] = maps:get(samples, C0),
    Some = C0#{samples := [S0, S1#{memory := Late} | Rest]},
    M2 = beamdiag_memory_ledger:build(Some),
    ?assertEqual(length(Rest) + 1, maps:get(readings, M2)),
    ?assert(maps:is_key(total, maps:get(accounts, M2))),
    ?assertMatch([_], [N || N <- maps:get(notes, M2),
                            binary:match(N, <<"missing in 1 of 7 samples">>) =/= nomatch]).

%% A cache table without eviction: the ets part up 20 MiB a second, the
%% resident memory with it; the table that grew is named with its type and
%% owner, a small one beside it is not.
ets_table_named_test() ->
    C0 = capture(flat(10 * ?MIB), flat(50 * ?MIB), flat(20 * ?MIB), {host, 20000 * ?MIB}),
    Grow = fun(S = #{t := T, memory := M = #{vm := Vm, os := Os}}) ->
                   I = erlang:convert_time_unit(T, native, nanosecond) div ?S,
                   E = 20 * ?MIB * I,
                   S#{memory := M#{vm := Vm#{ets := ?MIB + E, total := maps:get(total, Vm) + E},
                                   os := Os#{rss := maps:get(rss, Os) + E}}}
           end,
    Owner = #{pid => <<"<0.90.0>">>, name => <<"price_cache">>, initial_call => <<"cache:init/1">>,
              current => <<"gen_server:loop/7">>},
    Cache = #{name => <<"prices">>, id => <<"prices">>, type => <<"set">>, protection => <<"public">>,
              memory => [?MIB, 121 * ?MIB], objects => 480000, owner => Owner},
    Small = Cache#{name => <<"small">>, id => <<"#Ref<0.1.2.3>">>, memory => [0, 2 * ?MIB]},
    C = C0#{samples := [Grow(S) || S <- maps:get(samples, C0)],
            extras := (maps:get(extras, C0))#{procs => #{heap_growth => [],
                                                        tables => #{grew => [Cache, Small], born => [],
                                                                    count => [20, 21]}}}},
    [F] = beamdiag_memory_rules:findings(beamdiag_memory_ledger:build(C), C),
    ?assertEqual(memory_growth, maps:get(id, F)),
    ?assertEqual(<<"ets">>, maps:get(part, maps:get(metrics, F))),
    Ev = iolist_to_binary(lists:join("\n", maps:get(evidence, F))),
    ?assertMatch({_, _}, binary:match(Ev, <<"table prices (set, public) grew from 1.0 MB to 126.9 MB "
                                           "(100% of the growth), 480.0k objects at the end; its "
                                           "owner is price_cache <0.90.0> (cache:init/1), which was "
                                           "in gen_server:loop/7">>)),
    ?assertEqual(nomatch, binary:match(Ev, <<"small">>)),
    %% Without the tables read: said so, not an all-clear.
    C2 = C#{extras := (maps:get(extras, C))#{procs => #{heap_growth => []}}},
    [F2] = beamdiag_memory_rules:findings(beamdiag_memory_ledger:build(C2), C2),
    ?assertMatch({_, _}, binary:match(iolist_to_binary(maps:get(evidence, F2)),
                                      <<"the tables were not read">>)).

%% The host's report of a node that did not answer: its samples carry the
%% resident memory alone (beamdiag_host_view). Rising 20 MiB a second with
%% 1 GiB available: memory_growth of the resident memory, the time left,
%% and no claim about which part; flat, nothing.
host_only_resident_test() ->
    Host = fun(Rss) ->
                   [#{t => erlang:convert_time_unit(I * ?S, nanosecond, native),
                      memory => #{rss => Rss(I), mem_total => 4096 * ?MIB,
                                  mem_available => 1024 * ?MIB}}
                    || I <- lists:seq(0, 6)]
           end,
    C = #{samples => Host(fun(I) -> 200 * ?MIB + 20 * ?MIB * I end), extras => #{}},
    M = beamdiag_memory_ledger:build(C),
    ?assertEqual([rss], maps:keys(maps:get(accounts, M))),
    ?assertEqual(host, maps:get(bound_by, M)),
    [F] = beamdiag_memory_rules:findings(M, C),
    ?assertEqual(memory_growth, maps:get(id, F)),
    ?assertEqual(critical, maps:get(severity, F)),
    ?assertEqual(<<"resident">>, maps:get(part, maps:get(metrics, F))),
    ?assertEqual(51, maps:get(time_left_s, maps:get(metrics, F))),
    Ev = iolist_to_binary(lists:join("\n", maps:get(evidence, F))),
    ?assertMatch({_, _}, binary:match(Ev, <<"which part grows">>)),
    ?assertMatch({_, _}, binary:match(Ev, <<"gone in 51 s">>)),
    Flat = #{samples => Host(fun(_) -> 200 * ?MIB end), extras => #{}},
    ?assertEqual([], beamdiag_memory_rules:findings(beamdiag_memory_ledger:build(Flat), Flat)).

%% A large heap copied at its major collections: the old heap and the new
%% both count until the old one is freed, so the part peaks and falls back
%% by more than a quarter of its rise, yet each low is higher than the
%% last. Two windows read from a lab store (heap_leak, OTP 25, 2026-12-03;
%% MiB a second apart, the resident memory beside it): both a climb; a saw
%% of the same peaks whose lows stay put is not, beside the same steady
%% resident memory.
heap_peaks_test() ->
    At = fun(L) -> fun(I) -> lists:nth(I + 1, L) * ?MIB end end,
    Window = fun(Procs, Rss) ->
                 P = At(Procs),
                 R = At(Rss),
                 capture(flat(10 * ?MIB), P, fun(I) -> R(I) - P(I) - 40 * ?MIB end,
                         {host, 20000 * ?MIB})
             end,
    W2 = Window([170, 340, 282, 282, 287, 295, 295], [433, 503, 748, 738, 754, 779, 778]),
    #{accounts := #{processes := P2}} = M2 = beamdiag_memory_ledger:build(W2),
    ?assertEqual({58 * ?MIB, 112 * ?MIB}, {maps:get(fall, P2), maps:get(low_rise, P2)}),
    [F2] = [F || F = #{id := memory_growth} <- beamdiag_memory_rules:findings(M2, W2)],
    ?assertEqual(<<"processes">>, maps:get(part, maps:get(metrics, F2))),
    ?assertMatch({_, _}, binary:match(iolist_to_binary(maps:get(evidence, F2)),
                                      <<"in steps and peaks">>)),
    W4 = Window([362, 368, 368, 1297, 658, 659, 659], [1038, 1046, 1058, 1310, 1398, 1408, 1421]),
    ?assertMatch([memory_growth | _], ids(W4)),
    %% A heap's saw is no climb; a node whose resident memory rose
    %% steadily beside it grows all the same (the resident memory's
    %% growth); with the resident memory flat, no finding.
    Saw = Window([300, 600, 300, 300, 600, 300, 300], [400, 420, 440, 460, 480, 500, 520]),
    [SawF] = [F || F = #{id := memory_growth} <- beamdiag_memory_rules:findings(
                                                     beamdiag_memory_ledger:build(Saw), Saw)],
    ?assertEqual(<<"resident">>, maps:get(part, maps:get(metrics, SawF))),
    FlatSaw = Window([300, 600, 300, 300, 600, 300, 300], [700, 700, 700, 700, 700, 700, 700]),
    ?assertEqual([], ids(FlatSaw)),
    %% Seen on OTP 25 (heap_leak, 16 KiB events, 1,000 a second): the heap
    %% rose 96 MiB with a fall of 236 MiB (a copy counted twice), its lows
    %% 14 MiB higher; the resident memory rose 243 MiB steadily, 154 MiB of
    %% it beyond the carriers: the resident memory's growth, the heaps
    %% named beside it.
    Peaks = Window([105, 106, 341, 190, 120, 201, 201], [281, 320, 366, 408, 450, 490, 524]),
    [PF] = [F || F = #{id := memory_growth} <- beamdiag_memory_rules:findings(
                                                  beamdiag_memory_ledger:build(Peaks), Peaks)],
    ?assertEqual(<<"resident">>, maps:get(part, maps:get(metrics, PF))),
    ?assertMatch({_, _}, binary:match(iolist_to_binary(maps:get(evidence, PF)), <<"in peaks">>)).

%% The same relay where the queue process did not answer the end walk (a
%% process in a long collection of a large heap answers no read; seen on a
%% loaded host with a real RabbitMQ): it is named by its size at the start,
%% with why nothing more is known; a small one is not.
stalled_large_process_named_test() ->
    C0 = capture(fun(I) -> 40 * ?MIB * I end, flat(50 * ?MIB), flat(20 * ?MIB),
                 {host, 20000 * ?MIB}),
    Channel = #{pid => <<"<0.956.0>">>, name => null, initial_call => <<"rabbit_channel:init/1">>,
                current => <<"gen_server2:process_next_msg/1">>, count => 368,
                bytes => 1400 * ?MIB, sole_bytes => 0},
    Queue = #{pid => <<"<0.913.0>">>, name => null, waited_ms => 100,
              memory_start => 400 * ?MIB},
    Small = Queue#{pid => <<"<0.7.0>">>, memory_start => 2 * ?MIB},
    Gone = Queue#{pid => <<"<0.8.0>">>, memory_start => null},
    C = C0#{extras := (maps:get(extras, C0))#{procs => #{heap_growth => [], heaps => [],
                                                         binaries => [Channel],
                                                         stalled => [Small, Gone, Queue]}}},
    [F] = beamdiag_memory_rules:findings(beamdiag_memory_ledger:build(C), C),
    Ev = iolist_to_binary(lists:join("\n", maps:get(evidence, F))),
    ?assertMatch({_, _}, binary:match(Ev, <<"<0.913.0> holds 419.4 MB at the window's start and "
                                           "did not answer at its end (a read waited 100 ms">>)),
    ?assertEqual(nomatch, binary:match(Ev, <<"<0.7.0>">>)),
    ?assertEqual(nomatch, binary:match(Ev, <<"<0.8.0>">>)).

%% Eight stores whose heaps were resized ahead of their data (seen on OTP
%% 25: 13.8 MB each holding 4 to 12 MiB): the VM's account stays flat
%% above the resident memory, which climbs as the heaps fill. Not a NIF's
%% memory: the resident memory's growth, with why, and the stores named
%% as the largest processes.
untouched_heaps_test() ->
    C0 = capture(flat(1 * ?MIB), flat(120 * ?MIB),
                 fun(I) -> -20 * ?MIB + 17 * ?MIB * I end, {host, 20000 * ?MIB}),
    Store = fun(I) ->
                    #{pid => iolist_to_binary(io_lib:format("<0.~b.0>", [96 + I])), name => null,
                      initial_call => <<"store:init/1">>, parent => #{pid => <<"<0.95.0>">>},
                      memory => [14 * ?MIB, 14 * ?MIB], queue => [0, 0],
                      current => <<"store:loop/3">>}
            end,
    C = C0#{extras := (maps:get(extras, C0))#{procs => #{heap_growth => [],
                                                         heaps => [Store(I) || I <- lists:seq(1, 8)]}}},
    M = beamdiag_memory_ledger:build(C),
    ?assertEqual(0, maps:get(first, maps:get(native, maps:get(accounts, M)))),
    [F] = beamdiag_memory_rules:findings(M, C),
    ?assertEqual({memory_growth, <<"resident">>}, {maps:get(id, F), maps:get(part, maps:get(metrics, F))}),
    Ev = iolist_to_binary(lists:join("\n", maps:get(evidence, F))),
    ?assertMatch({_, _}, binary:match(Ev, <<"the VM had mapped memory it had not touched yet">>), Ev),
    ?assertMatch({_, _}, binary:match(Ev, <<"8 processes alike (store:init/1: <0.97.0> 14.7 MB">>), Ev).

%% Seen on OTP 29 (heap_leak, 16 KiB events, 1,000 a second): the heaps
%% rose 83.5 MiB with a fall of 32.7 (a copy freed), their lows 70.4 MiB
%% higher; the resident memory rose 197.5 MiB in 3 of its 6 steps, its
%% largest fall 3.8 MiB: not steady, yet a rise. The heaps' climb is named.
heap_climb_beside_a_rising_rss_test() ->
    At = fun(L) -> fun(I) -> round(lists:nth(I + 1, L) * ?MIB) end end,
    P = At([104.4, 104.4, 137.0, 207.5, 174.8, 188.0, 188.0]),
    R = At([273.9, 273.9, 340.0, 400.0, 396.2, 471.5, 471.5]),
    C = capture(flat(1 * ?MIB), P, fun(I) -> R(I) - P(I) - 31 * ?MIB end, {host, 20000 * ?MIB}),
    M = beamdiag_memory_ledger:build(C),
    #{rss := Rss} = maps:get(accounts, M),
    ?assertEqual({false, 3, 6}, {maps:get(steady, Rss), maps:get(rises, Rss), maps:get(steps, Rss)}),
    [F] = beamdiag_memory_rules:findings(M, C),
    ?assertEqual({memory_growth, <<"processes">>},
                 {maps:get(id, F), maps:get(part, maps:get(metrics, F))}).

%% Seen on OTP 25 (the same leak): the resident memory rose 178.5 MiB in
%% 5 of 6 steps and fell 20.0 MiB once (11% of its rise: not steady); the
%% heaps rose 82.4 MiB with a fall of 33.4, their lows 76.2 MiB higher.
%% The heaps' climb is named. A saw of the resident memory (its lows stay
%% put) is no rise.
heap_climb_beside_an_rss_that_fell_once_test() ->
    At = fun(L) -> fun(I) -> round(lists:nth(I + 1, L) * ?MIB) end end,
    P = At([79.3, 100.0, 140.0, 195.1, 161.7, 161.7, 161.7]),
    R = At([204.9, 240.0, 290.0, 330.0, 310.0, 350.0, 383.4]),
    C = capture(flat(1 * ?MIB), P, fun(I) -> R(I) - P(I) - 31 * ?MIB end, {host, 20000 * ?MIB}),
    M = beamdiag_memory_ledger:build(C),
    #{rss := Rss} = maps:get(accounts, M),
    ?assertEqual({false, 5, 6}, {maps:get(steady, Rss), maps:get(rises, Rss), maps:get(steps, Rss)}),
    [F] = beamdiag_memory_rules:findings(M, C),
    ?assertEqual({memory_growth, <<"processes">>},
                 {maps:get(id, F), maps:get(part, maps:get(metrics, F))}),
    Saw = At([300, 340, 380, 300, 340, 380, 330]),
    CS = capture(flat(1 * ?MIB), flat(100 * ?MIB), fun(I) -> Saw(I) - 131 * ?MIB end,
                 {host, 20000 * ?MIB}),
    ?assertEqual([], beamdiag_memory_rules:findings(beamdiag_memory_ledger:build(CS), CS)).
