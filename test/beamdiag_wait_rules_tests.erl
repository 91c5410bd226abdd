%%% EUnit tests of beamdiag_wait_rules: the host view's samples of real lab
%%% nodes whose dirty IO schedulers were all blocked in open(2) of a FIFO
%%% nobody writes (OTP 25, 10 dirty IO schedulers; OTP 29 in its own root,
%%% +SDio 4), then each bound on both sides with synthetic samples: the
%%% share of the window, the kernel running the thread in between, the
%%% call changing, idle waits, uninterruptible sleep without a readable
%%% call, the agent's samples (waits read at the window's ends only) and
%%% the VM's account.
-module(beamdiag_wait_rules_tests).
-include_lib("eunit/include/eunit.hrl").

-define(S, 1000000000).

%%% Recorded

recorded(Name) ->
    Samples = beamdiag_test_lib:fixture_term(filename:join("host", Name)),
    #{samples => Samples, settings => beamdiag_host_view:settings(Samples), node => <<"n@h">>,
      extras => #{host_only => true}}.

%% The raw signal in the recording first: every dirty IO thread in openat
%% of the same FIFO at every sample, its on-CPU time unchanged.
recorded_signal_test_() ->
    [fun() ->
         #{samples := Samples} = recorded(F),
         Dio = [{Tid, T} || #{threads := Th} <- Samples, {Tid, T = #{name := Name}} <- maps:to_list(Th),
                            dirty_io(Name)],
         ?assertEqual(N * length(Samples), length(Dio)),
         ?assert(lists:all(fun({_, #{wait := #{call := #{name := <<"openat">>}, wchan := W,
                                               file := File}}}) ->
                                   W =:= <<"wait_for_partner">> andalso
                                       binary:match(File, <<"/fifo">>) =/= nomatch;
                              (_) -> false
                           end, Dio)),
         Runs = maps:groups_from_list(fun({Tid, _}) -> Tid end, fun({_, #{run_ns := R}}) -> R end,
                                      Dio),
         ?assert(lists:all(fun(Rs) -> length(lists:usort(Rs)) =:= 1 end, maps:values(Runs)))
     end || {F, N} <- [{"dirty_io_blocked_samples.term", 10},
                       {"dirty_io_blocked_otp29_samples.term", 4}]].

recorded_finding_test_() ->
    [fun() ->
         C = recorded(F),
         L = beamdiag_ledger:build(C),
         [Fd] = beamdiag_wait_rules:host_findings(C, L, #{}),
         ?assertMatch(#{id := dirty_io_blocked, severity := critical,
                        metrics := #{blocked := N, dirty_io_threads := N, call := <<"openat">>}},
                      Fd),
         ?assertEqual(iolist_to_binary(["All ", integer_to_list(N), " dirty IO schedulers are "
                                        "blocked in openat(2) of ",
                                        maps:get(file, maps:get(metrics, Fd))]),
                      maps:get(title, Fd)),
         Ev = iolist_to_binary(lists:join("\n", maps:get(evidence, Fd))),
         [?assertMatch({_, _}, binary:match(Ev, Part))
          || Part <- [iolist_to_binary([integer_to_list(N), " of the node's ", integer_to_list(N),
                                        " dirty IO scheduler threads"]),
                      <<"the whole">>, <<"since before the window began">>,
                      <<"wait_for_partner (a FIFO waiting for its other end)">>,
                      Mount, <<"code loading">>, <<"name resolution">>,
                      <<"new distribution connections">>]],
         [?assertMatch({_, _}, binary:match(maps:get(fix, Fd), Part))
          || Part <- [<<"mount">>, <<"+SDio">>, <<"timeout">>]],
         [?assert(V >= 0 andalso V =< 1) || #{unit := share, value := V} <- maps:get(figures, Fd)]
     end || {F, N, Mount} <- [{"dirty_io_blocked_samples.term", 10, <<"ext4 mount /">>},
                              {"dirty_io_blocked_otp29_samples.term", 4, <<"tmpfs mount /tmp">>}]].

%% The host-only report names it, so it prints no all-clear.
host_report_test() ->
    C = recorded("dirty_io_blocked_samples.term"),
    D = beamdiag_host_rules:analyse(C, #{unresponsive => true, waited_ms => 4000,
                                         distribution => <<"the handshake did not finish">>}),
    ?assertEqual([dirty_io_blocked], [Id || #{id := Id} <- maps:get(findings, D)]),
    [F] = maps:get(findings, D),
    ?assertMatch({_, _}, binary:match(lists:last(maps:get(evidence, F)),
                                      <<"the node did not answer in 4.0 s">>)),
    Text = beamdiag_format_text:diagnosis(D#{capture := (maps:get(capture, D))#{extras => #{
        host_only => true, os_pid => 1, memory => #{}}}, host_view => #{os_pid => 1}}, #{}),
    ?assertEqual(nomatch, binary:match(Text, <<"none: no sign">>)),
    ?assertMatch({_, _}, binary:match(Text, <<"dirty_io_blocked">>)).

%%% Synthetic

%% A thread as the host view reads it.
th(Name, State, RunNs, Nvcsw, Wait) ->
    T = #{name => Name, state => State, utime => RunNs div 10000000, stime => 0, minflt => 0,
          majflt => 0, run_ns => RunNs, wait_ns => 0, nvcsw => Nvcsw, nivcsw => 0},
    case Wait of
        none -> T;
        _ -> T#{wait => Wait}
    end.

open_wait(Addr) ->
    #{wchan => <<"wait_for_partner">>, call => #{name => <<"openat">>, nr => 257,
                                               args => [16#ffffff9c, Addr, 0, 0, 0, 0]},
      file => <<"/mnt/nfs/f">>, mount => #{point => <<"/mnt/nfs">>, type => <<"nfs4">>,
                                          source => <<"srv:/x">>}}.

idle_wait() ->
    #{wchan => <<"futex_do_wait">>, call => #{name => <<"futex">>, nr => 202,
                                            args => [1, 128, 0, 0, 0, 0]}}.

%% Samples at the given seconds; Threads(Index) gives the threads map.
capture(Times, Threads) ->
    Vm = #{swt => undefined, run_queues => [], reductions => 0, gcs => 0, gc_words => 0,
           context_switches => 0, process_count => 0},
    Samples = [#{t => round(T * ?S), threads => Threads(I), vm => Vm,
                 host => {error, none}, cgroup => {error, none}, tick_cost_us => 0}
               || {I, T} <- lists:enumerate(Times)],
    #{samples => Samples, settings => beamdiag_host_view:settings(Samples), node => <<"n@h">>}.

%% N dirty IO threads, the first B of them blocked as Blocked(Tid, Index)
%% says, the rest idle; two normal schedulers, idle.
node(N, B, Blocked) ->
    fun(I) ->
        Sched = maps:from_list([{K, th(iolist_to_binary([integer_to_list(K), "_scheduler"]), <<"S">>,
                                       1000, 5 * I, idle_wait())} || K <- [1, 2]]),
        Dio = maps:from_list(
                [{100 + K, case K =< B of
                               true -> Blocked(100 + K, I);
                               false -> th(name(K), <<"S">>, 500, 3, idle_wait())
                           end} || K <- lists:seq(1, N)]),
        maps:merge(Sched, Dio)
    end.

name(K) -> iolist_to_binary([integer_to_list(K), "_dirty_io_sche"]).

blocked(Tid) -> th(name(Tid - 100), <<"S">>, 7000, 2, open_wait(16#1000 + Tid)).

analyse(C) ->
    beamdiag_wait_rules:host_findings(C, beamdiag_ledger:build(C), #{}).


%% All blocked the whole window: critical, N of N; some: warning, with
%% how many are left.
severity_by_count_test() ->
    W = lists:seq(0, 6),
    [All] = analyse(capture(W, node(10, 10, fun(T, _) -> blocked(T) end))),
    ?assertMatch(#{severity := critical, metrics := #{blocked := 10, dirty_io_threads := 10,
                                                      file := <<"/mnt/nfs/f">>}}, All),
    [Some] = analyse(capture(W, node(10, 3, fun(T, _) -> blocked(T) end))),
    ?assertMatch(#{severity := warning, metrics := #{blocked := 3, dirty_io_threads := 10}}, Some),
    ?assertMatch({_, _}, binary:match(iolist_to_binary(maps:get(evidence, Some)),
                                      <<"7 dirty IO schedulers are left">>)),
    ?assertEqual([], analyse(capture(W, node(10, 0, fun(T, _) -> blocked(T) end)))).

%% Most of the window: blocked from the second of 11 samples (0.9 of the
%% window) is enough; from the fourth (0.7) is not.
share_bound_test() ->
    W = lists:seq(0, 10),
    From = fun(K) -> fun(T, I) when I >= K -> blocked(T);
                        (T, _) -> th(name(T - 100), <<"S">>, 500, 3, idle_wait())
                     end
           end,
    [F] = analyse(capture(W, node(4, 4, From(2)))),
    ?assertMatch({_, _}, binary:match(hd(maps:get(evidence, F)), <<"since 1.0 s into the window">>)),
    ?assertEqual([], analyse(capture(W, node(4, 4, From(4))))),
    %% 0.8 exactly holds; just under it does not.
    W2 = [0, 1, 2, 3, 4, 5],
    ?assertMatch([_], analyse(capture(W2, node(4, 4, From(2))))),
    ?assertEqual([], analyse(capture([0, 1.01, 2, 3, 4, 5], node(4, 4, From(2))))).

%% A thread the kernel ran between two samples left its call, even in the
%% same call again: its on-CPU time moved (or, without schedstat, its CPU
%% time or voluntary switches).
ran_in_between_test() ->
    W = lists:seq(0, 4),
    Moving = fun(T, I) -> th(name(T - 100), <<"S">>, 7000 + I, 2, open_wait(16#1000 + T)) end,
    ?assertEqual([], analyse(capture(W, node(2, 2, Moving)))),
    Switching = fun(T, I) -> th(name(T - 100), <<"S">>, 7000, 2 + I, open_wait(16#1000 + T)) end,
    ?assertEqual([], analyse(capture(W, node(2, 2, Switching)))),
    %% A different call each sample (another address): not one call.
    Other = fun(T, I) -> th(name(T - 100), <<"S">>, 7000, 2, open_wait(16#1000 + T + I)) end,
    ?assertEqual([], analyse(capture(W, node(2, 2, Other)))),
    %% Running at one sample.
    Ran = fun(T, 3) -> th(name(T - 100), <<"R">>, 7000, 2, none);
             (T, _) -> blocked(T)
          end,
    ?assertEqual([], analyse(capture(W, node(2, 2, Ran)))).

%% A scheduler asleep in futex or epoll is idle, not blocked; in state D
%% it is blocked whatever the call; without a readable call, its state
%% and wchan say it (an idle wchan is not blocked).
idle_and_uninterruptible_test() ->
    W = lists:seq(0, 4),
    ?assertEqual([], analyse(capture(W, node(2, 2, fun(T, _) ->
        th(name(T - 100), <<"S">>, 7000, 2, idle_wait()) end)))),
    [D] = analyse(capture(W, node(2, 2, fun(T, _) ->
        th(name(T - 100), <<"D">>, 7000, 2, #{wchan => <<"rpc_wait_bit_killable">>,
                                              call => unknown}) end))),
    Ev = iolist_to_binary(lists:join("\n", maps:get(evidence, D))),
    ?assertMatch({_, _}, binary:match(Ev, <<"waiting on the NFS server">>)),
    ?assertMatch({_, _}, binary:match(Ev, <<"uninterruptible (state D)">>)),
    ?assertMatch([_], analyse(capture(W, node(2, 2, fun(T, _) ->
        th(name(T - 100), <<"S">>, 7000, 2, #{wchan => <<"wait_for_partner">>,
                                              call => unknown}) end)))),
    ?assertEqual([], analyse(capture(W, node(2, 2, fun(T, _) ->
        th(name(T - 100), <<"S">>, 7000, 2, #{wchan => <<"futex_do_wait">>,
                                              call => unknown}) end)))),
    ?assertEqual([], analyse(capture(W, node(2, 2, fun(T, _) ->
        th(name(T - 100), <<"S">>, 7000, 2, #{wchan => <<"0">>, call => unknown}) end)))).

%% Waits read at the window's ends only: a thread seen in the same call
%% at both, its counters unchanged between, was blocked the whole window.
agent_ends_test() ->
    W = lists:seq(0, 5),
    Ends = fun(T, I) when I =:= 1; I =:= 6 -> blocked(T);
              (T, _) -> maps:remove(wait, blocked(T))
           end,
    C = capture(W, node(3, 3, Ends)),
    [F] = beamdiag_wait_rules:findings(C, beamdiag_ledger:build(C), #{}),
    ?assertMatch(#{id := dirty_io_blocked, metrics := #{blocked := 3}}, F),
    ?assertMatch({_, _}, binary:match(hd(maps:get(evidence, F)), <<"at 2 samples">>)).

%% The VM's account (busy, not on CPU), when the waits were not read: a
%% dirty IO scheduler counted busy 90% of the window but never on a CPU.
vm_account_test() ->
    C = capture([0, 5], node(4, 2, fun(T, _) -> maps:remove(wait, blocked(T)) end)),
    L0 = beamdiag_ledger:build(C),
    Rows = [case R of
                #{type := dirty_io, index := I} when I =< 2 -> R#{blocked => 4.5};
                _ -> R
            end || R <- maps:get(threads, L0)],
    [F] = beamdiag_wait_rules:findings(C, L0#{threads := Rows}, #{}),
    ?assertMatch(#{metrics := #{blocked := 2}, severity := warning}, F),
    ?assertMatch([<<"2 of the node's 4 dirty IO scheduler threads sat blocked for 4.5 s or "
                    "more of the 5.0 s window by the VM's account", _/binary>> | _],
                 maps:get(evidence, F)),
    %% The agent reads the waits on its last tick: the call they sat in
    %% then is named beside the VM's account.
    Last = capture([0, 5], node(4, 2, fun(T, 2) -> blocked(T);
                                        (T, _) -> maps:remove(wait, blocked(T))
                                     end)),
    [FL] = beamdiag_wait_rules:findings(Last, L0#{threads := Rows}, #{}),
    ?assertMatch(#{metrics := #{blocked := 2, call := <<"openat">>, file := <<"/mnt/nfs/f">>}},
                 FL),
    ?assertMatch([<<"2 of the node's 4 dirty IO scheduler threads sat blocked for 4.5 s or more "
                    "of the 5.0 s window by the VM's account: busy, but neither on a CPU nor "
                    "waiting for one; what they sat in at the window's end:">>,
                  <<"2 in openat(2) of /mnt/nfs/f", _/binary>> | _], maps:get(evidence, FL)),
    %% Under most of the window: nothing.
    Rows2 = [case R of #{type := dirty_io} -> R#{blocked => 3.9}; _ -> R end
             || R <- maps:get(threads, L0)],
    ?assertEqual([], beamdiag_wait_rules:findings(C, L0#{threads := Rows2}, #{})).

%% The dirty IO run queue at the window's end is said.
queue_test() ->
    C0 = capture(lists:seq(0, 3), node(2, 2, fun(T, _) -> blocked(T) end)),
    Samples = [S#{vm := (maps:get(vm, S))#{run_queues => [0, 0, 0, 7]}}
               || S <- maps:get(samples, C0)],
    C = C0#{samples := Samples, settings := (maps:get(settings, C0))#{schedulers => 2}},
    [F] = analyse(C),
    ?assertMatch(#{metrics := #{blocked := 2}}, F),
    ?assertMatch({_, _}, binary:match(iolist_to_binary(maps:get(evidence, F)),
                                      <<"7 more jobs wait in the dirty IO run queue">>)).

%% From the host, a normal scheduler blocked in one call for most of the
%% window is scheduler_blocking, critical; the agent's scheduler_blocking
%% gets the calls its threads were seen in.
scheduler_blocking_test() ->
    W = lists:seq(0, 5),
    Sched = fun(I) ->
                #{1 => th(<<"1_scheduler">>, <<"S">>, 9000, 4,
                          #{wchan => <<"pipe_read">>, file => <<"pipe:[42]">>,
                            call => #{name => <<"read">>, nr => 0, args => [9, 1, 2, 0, 0, 0]}}),
                  2 => th(<<"2_scheduler">>, <<"S">>, 1000 * I, I, idle_wait())}
            end,
    C = capture(W, Sched),
    [F] = analyse(C),
    ?assertMatch(#{id := scheduler_blocking, severity := critical}, F),
    ?assertMatch({_, _}, binary:match(hd(maps:get(evidence, F)),
                                      <<"1_scheduler (thread 1) sat blocked in read(2) of pipe:[42]">>)),
    L = beamdiag_ledger:build(C),
    Agent = beamdiag_finding:new(scheduler_blocking, warning, [<<"busy but not on CPU">>], #{}),
    [Annotated] = beamdiag_wait_rules:annotate([Agent], C, L),
    ?assertMatch([<<"busy but not on CPU">>, <<"1_scheduler was in read(2) of pipe:[42] at 6 of "
                                               "the 6 samples", _/binary>>],
                 maps:get(evidence, Annotated)),
    %% Blocked for half the window only: no host finding.
    Half = fun(I) when I > 3 -> Sched(I);
              (I) -> (Sched(I))#{1 => th(<<"1_scheduler">>, <<"R">>, 100 * I, 4, none)}
           end,
    ?assertEqual([], analyse(capture(W, Half))).

dirty_io(<<"erts_dios_", _/binary>>) -> true;
dirty_io(Name) -> binary:match(Name, <<"_dirty_io_">>) =/= nomatch.
