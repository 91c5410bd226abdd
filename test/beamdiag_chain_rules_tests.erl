%%% The wait rules on both sides of each bound, on looks shaped as the
%%% walker takes them (beamdiag_agent_chains): the FIFO chain and the busy
%%% distribution port as they were measured on OTP 25.
-module(beamdiag_chain_rules_tests).
-include_lib("eunit/include/eunit.hrl").

-define(S, 1000000000).

server(Reds, Kind) ->
    #{pid => <<"<0.60.0>">>, name => <<"file_server_2">>, initial_call => <<"proc_lib:init_p/5">>,
      status => <<"waiting">>, current => <<"file_io_server:do_start/4">>,
      stack => [<<"file_io_server:do_start/4">>, <<"file_server:handle_call/3">>], queue => 8,
      reductions => Reds, monitored_by => 9, kind => Kind}.

nif(Reds) ->
    #{pid => <<"<0.80.0>">>, name => null, initial_call => <<"erlang:apply/2">>,
      status => <<"running">>, current => <<"prim_file:open_nif/2">>,
      stack => [<<"prim_file:open/2">>], queue => 0, reductions => Reds, monitored_by => 1,
      kind => <<"nif">>, ends => nif}.

callers(N, Reds) ->
    #{count => N,
      read => [#{pid => list_to_binary("<0.9" ++ integer_to_list(I) ++ ".0>"),
                 status => <<"waiting">>, current => <<"gen:do_call/4">>,
                 site => <<"file:call/2">>, reductions => Reds}
               || I <- lists:seq(1, min(N, 8))]}.

look(T, Waiters, SReds, Kind, Hops) ->
    #{t_ns => T, chains => [#{server => server(SReds, Kind), callers => callers(Waiters, 80),
                              waits_on => Hops}],
      suspended => #{count => 0, read => [], dist => [], dist_buf_busy_limit => 1048576}}.

procs(Waits) ->
    #{waits => Waits}.

ids(Procs) ->
    [{Id, S} || #{id := Id, severity := S} <- beamdiag_chain_rules:findings(Procs)].

%% 4 waiters make a chain, 3 do not; 16 make it critical, 15 not (the
%% server working between looks 1 s apart).
waiters_test_() ->
    Chain = fun(N) ->
                    procs(#{start => look(0, N, 100, <<"waiting">>, [nif(117)]),
                            'end' => look(1 * ?S, N, 400, <<"waiting">>, [nif(117)])})
            end,
    [?_assertEqual([], ids(Chain(3))),
     ?_assertEqual([{wait_chain, warning}], ids(Chain(4))),
     ?_assertEqual([{wait_chain, warning}], ids(Chain(15))),
     ?_assertEqual([{wait_chain, critical}], ids(Chain(16)))].

%% Processes that monitor the server from their own idle loop (channels
%% watching their queue, as on RabbitMQ) are counted out: 40 monitors, 8
%% read of which 6 idle in gen_server2's loop make 10 waiters (a warning,
%% not critical), 7 of 8 idle make 5, and 8 of 8 none.
idle_loops_test_() ->
    Chain = fun(IdleN) ->
                    #{read := Read} = C = callers(40, 80),
                    Marked = [case I =< IdleN of
                                  true -> R#{idle => true, current => <<"gen_server2:process_next_msg/1">>};
                                  false -> R#{idle => false}
                              end || {I, R} <- lists:zip(lists:seq(1, length(Read)), Read)],
                    L = fun(T) -> (look(T, 40, 100, <<"waiting">>, [nif(117)]))#{chains :=
                                      [#{server => server(100, <<"waiting">>),
                                         callers => C#{read := Marked}, waits_on => [nif(117)]}]}
                        end,
                    beamdiag_chain_rules:findings(procs(#{start => L(0), 'end' => L(?S)}))
            end,
    Waiters = fun(Fs) -> [{S, maps:get(waiters, M)} || #{severity := S, metrics := M} <- Fs] end,
    Ev = fun(Fs) -> iolist_to_binary(lists:join("\n", maps:get(evidence, hd(Fs)))) end,
    [?_assertEqual([{critical, 40}], Waiters(Chain(0))),
     ?_assertEqual([{warning, 10}], Waiters(Chain(6))),
     ?_assertMatch({_, _}, binary:match(Ev(Chain(6)), <<"of the 40 processes that monitor it, 6 of "
                                                          "the 8 read wait in their own receive loop">>)),
     ?_assertEqual([{warning, 5}], Waiters(Chain(7))),
     ?_assertEqual([], Chain(8))].

%% A server that runs Erlang code is a bottleneck of another kind.
running_test() ->
    ?assertEqual([], ids(procs(#{'end' => look(0, 9, 100, <<"running">>, [])}))).

%% The server idle between looks: 2 s or more apart makes it critical, and
%% idle is 100 reductions or fewer.
idle_test_() ->
    Chain = fun(Dt, Grew) ->
                    procs(#{start => look(0, 9, 180, <<"waiting">>, [nif(117)]),
                            'end' => look(Dt, 9, 180 + Grew, <<"waiting">>, [nif(117)])})
            end,
    [?_assertEqual([{wait_chain, critical}], ids(Chain(2 * ?S, 4))),
     ?_assertEqual([{wait_chain, critical}], ids(Chain(2 * ?S, 100))),
     ?_assertEqual([{wait_chain, warning}], ids(Chain(2 * ?S, 101))),
     ?_assertEqual([{wait_chain, warning}], ids(Chain(19 * ?S div 10, 4)))].

%% The evidence of the FIFO chain: the callers and where they are, each
%% process down the chain, how it ends, how long each did no work; the
%% file fix.
fifo_evidence_test() ->
    [F] = beamdiag_chain_rules:findings(
            procs(#{start => look(0, 9, 180, <<"waiting">>, [nif(117)]),
                    'end' => look(5 * ?S, 9, 184, <<"waiting">>, [nif(117)])})),
    Ev = iolist_to_binary(lists:join("\n", maps:get(evidence, F))),
    [?assertMatch({_, _}, binary:match(Ev, Text))
     || Text <- [<<"9 processes wait on file_server_2 <0.60.0>">>,
                 <<"8 of the 8 read are waiting, in gen:do_call/4 < file:call/2 (8)">>,
                 <<"it waits in file_io_server:do_start/4">>,
                 <<"it did no work between the window's start and end (5.0 s)">>,
                 <<"the chain ends in the NIF prim_file:open_nif/2: a file operation blocked in "
                   "the kernel">>,
                 <<"8 of the 8 callers read did no work">>]],
    ?assertEqual(<<"Processes wait on file_server_2, which waits on the NIF prim_file:open_nif/2">>,
                 maps:get(title, F)),
    ?assertMatch({_, _}, binary:match(maps:get(fix, F), <<"raw option">>)),
    #{metrics := #{waiters := 9, chain := 2, ends := <<"nif">>, idle_s := 5.0}} = F.

%% Other ends: a call to another node, a receive, a cycle.
ends_test_() ->
    End = fun(Hop) ->
                  [F] = beamdiag_chain_rules:findings(procs(#{'end' => look(0, 5, 1, <<"waiting">>,
                                                                             [Hop])})),
                  iolist_to_binary(lists:join("\n", maps:get(evidence, F)))
          end,
    Waiting = (nif(5))#{status => <<"waiting">>, current => <<"my:loop/1">>,
                        kind => <<"waiting">>},
    [?_assertMatch({_, _}, binary:match(End(#{ends => remote, nodes => [<<"b@h">>]}),
                                        <<"a call to another node: b@h">>)),
     ?_assertMatch({_, _}, binary:match(End(Waiting#{ends => 'receive'}),
                                        <<"ends in a receive">>)),
     ?_assertMatch({_, _}, binary:match(End(Waiting#{ends => cycle}), <<"a cycle of calls">>))].

susp(N, Pids, Reds) ->
    #{count => N,
      read => [#{pid => P, name => null, status => <<"suspended">>,
                 current => <<"erts_internal:dsend_continue_trap/1">>,
                 site => <<"lab:sender/2">>, reductions => Reds} || P <- Pids],
      dist => [#{node => <<"b@h">>, port => <<"#Port<0.11>">>, send_pend => 73700,
                 high_watermark => 8192, sndbuf => 4194304, queue_size => 73700}],
      dist_buf_busy_limit => 1048576}.

slook(T, S) ->
    #{t_ns => T, chains => [], suspended => S}.

pids(N) ->
    [list_to_binary("<0.1" ++ integer_to_list(I) ++ ".0>") || I <- lists:seq(1, N)].

%% Suspended: 4 at one look fire, 3 do not; one at both looks fires;
%% critical with 4 or more at both.
busy_port_test_() ->
    One = fun(N) -> procs(#{'end' => slook(0, susp(N, pids(min(N, 8)), 100))}) end,
    Both = fun(N, Grew) ->
                   procs(#{start => slook(0, susp(N, pids(N), 100)),
                           'end' => slook(5 * ?S, susp(N, pids(N), 100 + Grew))})
           end,
    [?_assertEqual([], ids(One(3))),
     ?_assertEqual([{busy_port, warning}], ids(One(4))),
     ?_assertEqual([{busy_port, warning}], ids(Both(1, 5000))),
     ?_assertEqual([{busy_port, warning}], ids(Both(3, 0))),
     ?_assertEqual([{busy_port, critical}], ids(Both(4, 5000))),
     ?_assertEqual([], ids(procs(#{'end' => slook(0, susp(0, [], 0))})))].

%% The busy distribution port named, with its peer and buffers, and the
%% share of samples suspended.
busy_port_evidence_test() ->
    Pids = pids(8),
    [F] = beamdiag_chain_rules:findings(
            procs(#{start => slook(0, susp(8, Pids, 100)),
                    'end' => slook(5 * ?S, susp(8, Pids, 100)),
                    suspended_samples => [#{pid => P, suspended => 9, samples => 10}
                                          || P <- Pids]})),
    Ev = iolist_to_binary(lists:join("\n", maps:get(evidence, F))),
    [?assertMatch({_, _}, binary:match(Ev, Text))
     || Text <- [<<"8 processes are suspended">>,
                 <<"erts_internal:dsend_continue_trap/1 < lab:sender/2 (8)">>,
                 <<"8 of them were suspended at the window's start too, 5.0 s before; 8 did no "
                   "work">>,
                 <<"suspended in 72 of 80 samples (90%)">>,
                 <<"the distribution port #Port<0.11> to b@h has 73.7 kB pending">>,
                 <<"dist_buf_busy_limit, 1.0 MB here">>]],
    ?assertEqual(<<"Processes are suspended on a busy distribution port to b@h">>,
                 maps:get(title, F)),
    ?assertMatch({_, _}, binary:match(maps:get(fix, F), <<"this node's is 1.0 MB">>)),
    #{metrics := #{peer := <<"b@h">>, suspended := 8, suspended_both_looks := 8}} = F.

%% No looks, no finding.
no_waits_test() ->
    ?assertEqual([], beamdiag_chain_rules:findings(#{queues => []})).
