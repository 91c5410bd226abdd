-module(beamdiag_cluster_analysis_tests).
-include_lib("eunit/include/eunit.hrl").

-define(BOOT, <<"3fa68fdf-cd42-4e3c-a175-0de3ba6f4288">>).
-define(OTHER_BOOT, <<"9b0c1d2e-3f40-4a5b-8c6d-7e8f90a1b2c3">>).

%% A member's result as the collectors give it: figures near an idle
%% node's on a busy host (a seeded jitter), the host it read, and the
%% given findings, each with the metric the starvation rule sets.
result(I, Host, Over, Findings) ->
    J = fun(Scale) -> Scale * (rand:uniform() - 0.5) end,
    Row = maps:merge(
        #{node => iolist_to_binary(["m", integer_to_list(I), "@vm"]),
          window_start_ms => 1700000000000 + I, window_s => 5.0, complete => true,
          cpus_used => 0.003 + J(0.002), busy => 0.03 + J(0.02), on_cpu => 0.001 + J(0.001),
          spin => 0.0, runq => 0.08 + J(0.06), sys => 0.0, blocked => 0.0,
          reductions_per_s => 8000.0 + J(2000.0),
          findings => [#{id => Id, severity => S} || {Id, S, _} <- Findings],
          top_process => null, host => Host},
        Over),
    #{row => Row,
      findings => [beamdiag_finding:new(Id, S, [<<"evidence">>], #{runq_share => Q})
                   || {Id, S, Q} <- Findings]}.

host(Boot, Name) ->
    #{id => Boot, name => Name, cpus => 2, busy => 0.99, load => 96.0}.

%% Members that read the same boot id share a host, whatever their node
%% names say; a member that read no host is placed by its node name's host
%% part. The hosts come most members first.
groups_by_boot_id_test() ->
    rand:seed(exsss, {1, 2, 3}),
    A = [result(I, host(?BOOT, <<"vm">>), #{}, []) || I <- lists:seq(1, 5)],
    B = [result(I, host(?OTHER_BOOT, <<"db2">>), #{}, []) || I <- lists:seq(6, 7)],
    C = [result(8, #{id => null, name => null, cpus => null, busy => null, load => null},
                #{node => <<"m8@db3">>}, [])],
    {Hosts, _} = beamdiag_cluster_analysis:hosts(A ++ B ++ C),
    ?assertMatch([#{key := ?BOOT, name := <<"vm">>, cpus := 2.0},
                  #{key := ?OTHER_BOOT, name := <<"db2">>},
                  #{key := <<"db3">>, name := <<"db3">>, boot_id := null, busy := null}], Hosts),
    ?assertEqual([<<"m6@vm">>, <<"m7@vm">>], maps:get(members, lists:nth(2, Hosts))).

%% On a shared host, the members' cpu_starvation at warning or above is
%% taken off them (the full findings and the row's brief list) and kept
%% with the host, with how long they waited; an info one stays; a member
%% alone on its host keeps its own.
lifts_starvation_to_a_shared_host_test() ->
    rand:seed(exsss, {4, 5, 6}),
    Shared = [result(I, host(?BOOT, <<"vm">>), #{},
                     case I of
                         1 -> [{cpu_starvation, warning, 0.12}];
                         2 -> [{cpu_starvation, critical, 0.31}, {busy_wait, warning, 0.0}];
                         3 -> [{cpu_starvation, info, 0.15}];
                         _ -> []
                     end) || I <- lists:seq(1, 10)],
    Alone = result(11, host(?OTHER_BOOT, <<"db2">>), #{}, [{cpu_starvation, warning, 0.2}]),
    {Hosts, Results} = beamdiag_cluster_analysis:hosts(Shared ++ [Alone]),
    [#{lifted := [Lifted]}, #{lifted := []}] = Hosts,
    ?assertMatch(#{id := cpu_starvation, severity := critical,
                   nodes := [<<"m1@vm">>, <<"m2@vm">>]}, Lifted),
    #{runq_share := #{median := Med, max := Max}} = Lifted,
    ?assertEqual(0.31, Max),
    ?assert(abs(Med - 0.215) < 1.0e-9),
    Ids = fun(N) -> hd([{[Id || #{id := Id} <- Fs], [Id || #{id := Id} <- maps:get(findings, R)]}
                        || #{row := R = #{node := M}, findings := Fs} <- Results, M =:= N])
          end,
    ?assertEqual({[], []}, Ids(<<"m1@vm">>)),
    ?assertEqual({[busy_wait], [busy_wait]}, Ids(<<"m2@vm">>)),
    ?assertEqual({[cpu_starvation], [cpu_starvation]}, Ids(<<"m3@vm">>)),
    ?assertEqual({[cpu_starvation], [cpu_starvation]}, Ids(<<"m11@vm">>)).

%% On a contended shared host, a member that stands out only on busy,
%% runnable-wait or blocked shares (the time it waited for the host's
%% CPUs) is not an outlier; one that also stands out on a figure of its
%% own demand is, with all its figures. On a host that is not contended,
%% or a member alone, nothing changes.
own_outliers_test() ->
    Fig = fun(K) -> #{figure => K, value => 1.0, median => 0.1, mad => 0.01, p10 => 0.0, p90 => 0.2,
                      z => 9.0} end,
    Out = [#{node => <<"waits@vm">>, figures => [Fig(busy), Fig(runq)], own_findings => [], score => 9.0},
           #{node => <<"works@vm">>, figures => [Fig(reductions_per_s), Fig(busy)], own_findings => [],
             score => 9.0},
           #{node => <<"alone@db2">>, figures => [Fig(runq)], own_findings => [], score => 9.0}],
    Rows = [#{node => <<"waits@vm">>, host => host(?BOOT, <<"vm">>)},
            #{node => <<"works@vm">>, host => host(?BOOT, <<"vm">>)},
            #{node => <<"alone@db2">>, host => host(?OTHER_BOOT, <<"db2">>)}],
    Host = fun(Contended) -> #{key => ?BOOT, members => [<<"waits@vm">>, <<"works@vm">>],
                              contended => Contended} end,
    Alone = #{key => ?OTHER_BOOT, members => [<<"alone@db2">>], contended => false},
    Nodes = fun(Hs) -> [N || #{node := N} <- beamdiag_cluster_analysis:own_outliers(Out, Rows, Hs)] end,
    ?assertEqual([<<"works@vm">>, <<"alone@db2">>], Nodes([Host(true), Alone])),
    ?assertEqual([<<"waits@vm">>, <<"works@vm">>, <<"alone@db2">>], Nodes([Host(false), Alone])),
    [#{figures := [_, _]}] = [O || O = #{node := <<"works@vm">>}
                                       <- beamdiag_cluster_analysis:own_outliers(Out, Rows, [Host(true)])].

%% A host is contended when a member there waited for a CPU with work to
%% do (cpu_starvation at warning or above) or its CPUs were 90% busy or
%% more; there, a member whose schedulers mostly waited (on a CPU less
%% than a quarter of their busy time) has its scheduler_imbalance and
%% scheduler_blocking lifted too; one that ran keeps them, and so does
%% every member of a host that was not contended.
contended_host_lifts_waits_test() ->
    rand:seed(exsss, {3, 3, 3}),
    Waiter = fun(I, H) -> result(I, H, #{busy => 0.3, on_cpu => 0.01},
                                 [{scheduler_imbalance, warning, 0.0}, {scheduler_blocking, warning, 0.0}])
             end,
    Runner = fun(I, H) -> result(I, H, #{busy => 0.3, on_cpu => 0.2},
                                 [{scheduler_imbalance, warning, 0.0}]) end,
    Busy = host(?BOOT, <<"vm">>),
    Calm = (host(?BOOT, <<"vm">>))#{busy => 0.4},
    Ids = fun(Results) -> [{N, [Id || #{id := Id} <- Fs]} || #{row := #{node := N}, findings := Fs} <- Results] end,
    {[#{contended := true, lifted := Lifted}], R1} =
        beamdiag_cluster_analysis:hosts([Waiter(1, Busy), Runner(2, Busy), result(3, Busy, #{}, [])]),
    ?assertEqual([{<<"m1@vm">>, []}, {<<"m2@vm">>, [scheduler_imbalance]}, {<<"m3@vm">>, []}], Ids(R1)),
    ?assertEqual([scheduler_blocking, scheduler_imbalance], [Id || #{id := Id} <- Lifted]),
    {[#{contended := false, lifted := []}], R2} =
        beamdiag_cluster_analysis:hosts([Waiter(1, Calm), Runner(2, Calm)]),
    ?assertEqual([{<<"m1@vm">>, [scheduler_imbalance, scheduler_blocking]},
                  {<<"m2@vm">>, [scheduler_imbalance]}], Ids(R2)),
    %% A starving member makes a calm-looking host contended.
    {[#{contended := true}], R3} =
        beamdiag_cluster_analysis:hosts([Waiter(1, Calm), result(2, Calm, #{}, [{cpu_starvation, warning, 0.2}])]),
    ?assertEqual([{<<"m1@vm">>, []}, {<<"m2@vm">>, []}], Ids(R3)).

%% The cluster's analysis end to end, as a contended host of 200 members
%% gives it: 36 idle members waited for a CPU (cpu_starvation, warning) and
%% a dozen of them waited long enough to stand out on busy and runq; one
%% member spins. The spinning one is the only outlier, no other member has
%% a finding at warning or above, and the host says the wait once, with
%% figures; the text report shows it, on one screen.
%% Its own JSON reader decodes 200 members: seconds on a loaded host, past
%% EUnit's default 5 s.
contended_host_end_to_end_test_() ->
    {timeout, 60, fun contended_host_end_to_end/0}.

contended_host_end_to_end() ->
    rand:seed(exsss, {7, 8, 9}),
    H = host(?BOOT, <<"vm">>),
    Idle = [result(I, H,
                   case I =< 12 of
                       true -> #{busy => 0.25 + I / 100, runq => 0.45 + I / 100};
                       false -> #{}
                   end,
                   [{cpu_starvation, warning, 0.10 + I / 200} || I =< 36])
            || I <- lists:seq(1, 199)],
    Busy = result(200, H, #{busy => 0.6, on_cpu => 0.35, cpus_used => 0.4, runq => 0.3,
                            reductions_per_s => 3.0e7},
                  [{cpu_starvation, critical, 0.3}, {cpu_saturated, warning, 0.0}]),
    A = beamdiag_cluster_analysis:analyse(Idle ++ [Busy]),
    ?assertMatch([#{node := <<"m200@vm">>}], maps:get(outliers, A)),
    Loud = [{N, Id} || {N, Fs} <- maps:to_list(maps:get(findings, A)), N =/= <<"m200@vm">>,
                       #{id := Id, severity := S} <- Fs, S =/= info],
    ?assertEqual([], Loud),
    [#{members := Ms, findings := [F]}] = maps:get(hosts, A),
    ?assertEqual(200, length(Ms)),
    ?assertMatch(#{id := shared_host_contention, severity := critical,
                   metrics := #{members := 200, members_waiting := 37, host_busy := 0.99}}, F),
    ?assertMatch({match, _}, re:run(hd(maps:get(evidence, F)),
                                    "^37 of the 200 members on this host waited for a CPU")),
    %% The busy member keeps its own saturation, not the host's wait.
    ?assertEqual([cluster_outlier, cpu_saturated],
                 lists:sort([Id || #{id := Id} <- maps:get(<<"m200@vm">>, maps:get(findings, A))])),
    C = A#{schema => <<"beamdiag.cluster/2">>, seed => null, source => list,
           members => Ms, window_s => 5.0,
           windows => #{first_start_ms => 0, start_spread_s => 0.1, overlap_s => 4.9}, errors => [],
           timing => #{phases_ms => #{members => 120, prepare => 12345, start => 2000,
                                      window => 3600000, collect => 12345, analyse => 1234,
                                      report => 123},
                       connect_ms => #{median => 386, max => 853, sum => 77000},
                       load_ms => #{median => 302, max => 641, sum => 60000}}},
    Text = beamdiag_format_text:cluster(C, #{}),
    %% Where the time went, phase by phase, within 80 columns.
    ?assertMatch({match, _}, re:run(Text, "took 3628.2 s: members 0.1, connect and load 12.3, "
                                          "agents' start 2.0,\n  window 3600.0, collect 12.3, "
                                          "analyse 1.2, report 0.1\n")),
    ?assertEqual([], [L || L <- binary:split(Text, <<"\n">>, [global]), string:length(L) > 80]),
    ?assertMatch({match, _}, re:run(Text, "HOSTS \\(1 shared by 200 members\\)")),
    ?assertMatch({match, _}, re:run(Text, "CRITICAL shared_host_contention: 37 members waited")),
    ?assert(length(binary:split(Text, <<"\n">>, [global, trim])) =< 50),
    Doc = beamdiag_test_json:decode(iolist_to_binary(beamdiag_format_json:cluster(C))),
    ?assertMatch(#{<<"hosts">> := [#{<<"key">> := ?BOOT, <<"lifted">> := [_]}]}, Doc).

%% The host's evidence in words: who waited and how long, the host's CPUs,
%% what the members used, and this session's own CPU when it ran there.
host_evidence_test() ->
    H = #{members => [<<"a@h">>, <<"b@h">>, <<"c@h">>], cpus => 2.0,
          busy => #{median => 0.97, max => 1.0}, load => 12.5, cpus_used => 0.42,
          lifted => [#{id => cpu_starvation, severity => warning, nodes => [<<"a@h">>],
                       runq_share => #{median => 0.12, max => 0.12}}],
          session => #{cpu_s => 0.35}},
    [L1, L2, L3, L4] = beamdiag_cluster_evidence:host_evidence(H),
    ?assertMatch({match, _}, re:run(L1, "^1 of the 3 members .* median 12.0%, worst 12.0%")),
    ?assertEqual(<<"the host: 2 CPUs, 97.0% busy over the window (as its members read /proc/stat; "
                   "100.0% at most), load average 12.5">>, L2),
    ?assertEqual(<<"its 3 members used 0.42 CPUs in all over the window">>, L3),
    ?assertMatch({match, _}, re:run(L4, "0.35 CPU-seconds")),
    ?assertEqual(3, length(beamdiag_cluster_evidence:host_evidence(H#{session => null}))).

%% This host between two /proc readings: the busy share of its CPU time,
%% the busy CPUs, the load at the end and the span; readings that cannot
%% be set against each other give undefined.
host_load_test() ->
    Ticks = beamdiag_agent_procfs:clock_ticks(),
    H0 = #{cpu => #{user => 1000, nice => 0, system => 0, idle => 1000, iowait => 0, irq => 0,
                    softirq => 0, steal => 0}, ncpu => 2},
    H1 = #{cpu => #{user => 1000 + 9 * Ticks, nice => 0, system => Ticks, idle => 1000,
                    iowait => 0, irq => 0, softirq => 0, steal => 0},
           ncpu => 2, loadavg => {84.5, 40.0, 10.0}},
    L = beamdiag_cluster_analysis:host_load(H0, H1),
    ?assertMatch(#{ncpu := 2, load1 := 84.5}, L),
    ?assert(abs(maps:get(busy, L) - 1.0) < 1.0e-9),
    ?assert(abs(maps:get(cpus, L) - 2.0) < 1.0e-9),
    ?assert(abs(maps:get(span_s, L) - 5.0) < 1.0e-9),
    ?assertEqual(undefined, beamdiag_cluster_analysis:host_load(H1, H1)),
    ?assertEqual(undefined, beamdiag_cluster_analysis:host_load(#{}, H1)).

%% The members on this host that did not answer, said once when the host
%% was saturated (90% busy, or a load twice its CPUs), and two of them at
%% least; members elsewhere and a host with CPU to spare give null.
saturated_host_test() ->
    Busy = #{ncpu => 2, busy => 0.97, cpus => 1.94, load1 => 3.0, span_s => 5.5},
    Loaded = Busy#{busy => 0.5, cpus => 1.0, load1 => 60.0},
    Quiet = Busy#{busy => 0.5, cpus => 1.0, load1 => 1.0},
    Here = [list_to_atom("m" ++ integer_to_list(I) ++ "@vm") || I <- lists:seq(1, 200)],
    S = beamdiag_cluster_analysis:saturated_host(['x@elsewhere' | Here], Busy, "vm.example"),
    ?assertMatch(#{members := 200, ncpu := 2, busy := 0.97, nodes := [_, _, _, _, _]}, S),
    ?assertMatch(#{members := 200}, beamdiag_cluster_analysis:saturated_host(Here, Loaded, "vm")),
    ?assertEqual(null, beamdiag_cluster_analysis:saturated_host(Here, Quiet, "vm")),
    ?assertEqual(null, beamdiag_cluster_analysis:saturated_host(['m1@vm'], Busy, "vm")),
    ?assertEqual(null, beamdiag_cluster_analysis:saturated_host(['a@h2', 'b@h2'], Busy, "vm")),
    ?assertEqual(null, beamdiag_cluster_analysis:saturated_host(Here, undefined, "vm")).

%% The text: the saturated host said once, and members with the same
%% reason in one line, not one line each.
saturated_text_test() ->
    Msg = <<"its agent sent nothing usable within 5.5 s of the window's end; it was told to stop">>,
    Errs = [#{node => iolist_to_binary(["m", integer_to_list(I), "@vm"]), message => Msg}
            || I <- lists:seq(1, 200)] ++ [#{node => <<"z@vm">>, message => <<"refused">>}],
    A = beamdiag_cluster_analysis:analyse([result(I, host(?BOOT, <<"vm">>), #{}, [])
                                           || I <- lists:seq(201, 203)]),
    C = A#{schema => <<"beamdiag.cluster/2">>, seed => null, source => list,
          members => [N || #{node := N} <- Errs], window_s => 5.0,
          windows => #{first_start_ms => 0, start_spread_s => 0.0, overlap_s => 0.0},
          errors => Errs,
          saturated_host => #{members => 200, ncpu => 2, busy => 0.99, cpus => 1.98,
                              load1 => 84.5, span_s => 10.5,
                              nodes => [<<"m1@vm">>, <<"m10@vm">>]}},
    Text = beamdiag_format_text:cluster(C, #{}),
    ?assertMatch({match, _}, re:run(Text, "THIS HOST WAS SATURATED\n  200 members on this host")),
    ?assertMatch({match, _}, re:run(Text, "99.0% busy \\(1.98 CPUs, load average 84.5\\)")),
    ?assertMatch({match, _}, re:run(Text, "NOT DIAGNOSED \\(201\\)\n  200 members \\(m1@vm, m2@vm, "
                                          "m3@vm, ...\\): its agent sent nothing usable")),
    ?assertMatch({match, _}, re:run(Text, "\n  z@vm: refused\n")),
    ?assertEqual(1, length(binary:matches(Text, <<"sent nothing usable">>))),
    ?assertEqual([], [L || L <- binary:split(Text, <<"\n">>, [global]), string:length(L) > 80]),
    Html = iolist_to_binary(beamdiag_format_html:cluster(C)),
    ?assertMatch({_, _}, binary:match(Html, <<"This host was saturated:</strong> 200 members">>)),
    ?assertEqual(null, maps:get(saturated_host, C#{saturated_host => null})).
