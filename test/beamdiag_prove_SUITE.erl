%%% Common Test suite for proving a fix: experiments on fresh lab nodes,
%%% comparing saved captures, and diagnosing a cluster. Every assertion is a
%%% ratio measured side by side, never an absolute time, so that it holds on
%%% a loaded two-core machine.
-module(beamdiag_prove_SUITE).

-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0, suite/0, init_per_suite/1, end_per_suite/1]).
-export([experiment_busy_wait/1, compare_idle_captures/1, cluster_outlier/1]).

-define(NO_SPIN, "+sbwt none +sbwtdcpu none +sbwtdio none").
-define(COOKIE, "beamdiag_prove_suite").

suite() ->
    [{timetrap, {minutes, 10}}].

all() ->
    [compare_idle_captures, cluster_outlier, experiment_busy_wait].

init_per_suite(Config) ->
    {ok, _} = application:ensure_all_started(kernel),
    Config.

end_per_suite(_Config) ->
    ok.

%%%===================================================================
%%% Cases
%%%===================================================================

%% Default spinning flags (the lab's, +sbwt very_long) against +sbwt none
%% under the same wakeup load: the OS CPU per unit of work drops, with a
%% bootstrap interval that excludes zero; then the verdict says so.
experiment_busy_wait(Config) ->
    {ok, W} = beamdiag_experiment:workload("lab:busy_wait"),
    {ok, R} = beamdiag_experiment:run(#{workloads => [W], variants => ["default", ?NO_SPIN],
                                        runs => 4, duration => 4, warmup => 1.5}),
    Runs = maps:get(runs, R),
    ?assertEqual(8, length(Runs)),
    %% Alternated: A B A B ...
    ?assertEqual([1, 2, 1, 2, 1, 2, 1, 2], [A || #{arm := A} <- Runs]),
    [?assert(U > 0) || #{units := U} <- Runs],
    Cpu = fun(Arm) -> [C || #{arm := A, cpu_us_per_unit := C} <- Runs, A =:= Arm] end,
    Tp = fun(Arm) -> [T || #{arm := A, throughput := T} <- Runs, A =:= Arm] end,
    MeanA = beamdiag_stats:mean(Cpu(1)),
    MeanB = beamdiag_stats:mean(Cpu(2)),
    ct:pal("CPU us/unit: default ~p, no spin ~p; throughput ~p vs ~p",
           [Cpu(1), Cpu(2), Tp(1), Tp(2)]),
    %% Raw figures first: every paired run, and the means with a margin.
    [?assert(B < A) || {A, B} <- lists:zip(Cpu(1), Cpu(2))],
    ?assert(MeanB < 0.8 * MeanA),
    %% Throughput is the same load: within a wide band (the verdict, not
    %% this band, says whether it differs beyond noise).
    TpRatio = beamdiag_stats:mean(Tp(2)) / beamdiag_stats:mean(Tp(1)),
    ?assert(TpRatio > 0.6 andalso TpRatio < 1.4),
    #{versus := [#{metrics := Ms}]} = maps:get(summary, R),
    [CpuM] = [M || M = #{key := cpu_us_per_unit} <- Ms],
    #{ci := {Lo, Hi}, estimate := Est} = CpuM,
    ct:pal("cpu per unit change ~.3f [~.3f, ~.3f]", [Est, Lo, Hi]),
    ?assert(Hi < 0),
    %% Then the verdict.
    ?assertEqual(better, maps:get(verdict, CpuM)),
    %% Results save and re-render like captures.
    File = filename:join(?config(priv_dir, Config), "busy.experiment"),
    ok = beamdiag_capture_file:save(File, R),
    {Code, Out} = cli(["report", File]),
    ?assertEqual(0, Code),
    ?assertNotEqual(nomatch, string:find(Out, "OS CPU per unit")),
    ok.

%% Two windows of the same idle node, saved and loaded: nothing differs
%% beyond the noise.
compare_idle_captures(Config) ->
    {ok, Lab} = beamdiag_lab:start(idle, #{duration => 120}),
    try
        Node = beamdiag_lab:node(Lab),
        Opts = #{cookie => beamdiag_lab:cookie(Lab), duration => 4, msacc => false},
        {ok, D1} = beamdiag:diagnose(Node, Opts),
        {ok, D2} = beamdiag:diagnose(Node, Opts),
        Dir = ?config(priv_dir, Config),
        F1 = filename:join(Dir, "idle1.capture"),
        F2 = filename:join(Dir, "idle2.capture"),
        ok = beamdiag_capture_file:save(F1, D1),
        ok = beamdiag_capture_file:save(F2, D2),
        {ok, L1} = beamdiag_capture_file:load(F1),
        {ok, L2} = beamdiag_capture_file:load(F2),
        C = beamdiag_compare:compare(L1, L2),
        ct:pal("~ts", [beamdiag_format_compare:text(C)]),
        ?assert(length(maps:get(metrics, C)) >= 10),
        ?assertEqual([], [K || #{key := K, significant := true} <- maps:get(metrics, C)]),
        {0, Out} = cli(["compare", F1, F2]),
        ?assertNotEqual(nomatch, string:find(Out, "no ledger delta stands out")),
        {0, Json} = cli(["compare", "--json", F1, F2]),
        ?assertMatch("{" ++ _, Json)
    after
        beamdiag_lab:stop(Lab)
    end.

%% Four connected nodes, one of them spinning under a wakeup load with
%% long busy-wait: the cluster report points at it.
cluster_outlier(_Config) ->
    Peers = [start_peer(I) || I <- lists:seq(1, 4)],
    try
        Nodes = [N || {_, N} <- Peers],
        [{P1, N1}, _, {P3, N3}, _] = Peers,
        [true = peer:call(P1, net_kernel, connect_node, [N]) || N <- tl(Nodes)],
        [true = peer:call(P3, net_kernel, connect_node, [N]) || N <- Nodes, N =/= N3],
        ok = beamdiag_test_lib:await(
               fun() -> length(peer:call(P1, erlang, nodes, [])) >= length(Nodes) - 1 end, 5000),
        {Mod, Bin, File} = code:get_object_code(beamdiag_lab_ledger),
        {module, Mod} = peer:call(P3, code, load_binary, [Mod, File, Bin]),
        ok = peer:call(P3, beamdiag_lab_ledger, wakeups, [120000, 40]),
        %% The load runs: the odd node's reductions grow by millions.
        {R0, _} = peer:call(P3, erlang, statistics, [reductions]),
        ok = beamdiag_test_lib:await(fun() ->
            {R, _} = peer:call(P3, erlang, statistics, [reductions]),
            R - R0 > 2000000
        end, 30000),
        {ok, C} = beamdiag_cluster:diagnose(N1, #{cookie => list_to_atom(?COOKIE),
                                                  duration => 4, msacc => false}),
        ct:pal("~ts", [beamdiag_format_text:cluster(C, #{all => true})]),
        %% The peers, and this node when it is distributed and they see it.
        Members = maps:get(members, C),
        ?assertEqual([], [atom_to_binary(N) || N <- Nodes] -- Members),
        ?assertEqual(length(Members), length(maps:get(nodes, C))),
        Odd = atom_to_binary(N3),
        [#{node := Top, figures := Figs} | _] = maps:get(outliers, C),
        ?assertEqual(Odd, Top),
        ?assert(length(Figs) >= 1),
        %% No healthy node is an outlier.
        ?assertEqual([Odd], [N || #{node := N} <- maps:get(outliers, C)]),
        [Row] = [R || R = #{node := N} <- maps:get(nodes, C), N =:= Odd],
        Others = [R || R = #{node := N} <- maps:get(nodes, C), N =/= Odd],
        %% Raw figures: the odd node uses several times the CPU of any other.
        [?assert(maps:get(cpus_used, Row) > 3 * maps:get(cpus_used, O)) || O <- Others],
        Json = iolist_to_binary(beamdiag_json:encode(C)),
        ?assertMatch(<<"{", _/binary>>, Json)
    after
        [beamdiag_test_lib:stop_node(P) || {P, _} <- Peers]
    end.

%%%===================================================================
%%% Helpers
%%%===================================================================

start_peer(I) ->
    Name = list_to_atom(lists:concat(["beamdiag_prove_", I, "_", os:getpid()])),
    Args = ["-setcookie", ?COOKIE] ++
        case I of
            3 -> ["+sbwt", "very_long", "+sbwtdcpu", "very_long", "+sbwtdio", "very_long"];
            _ -> []
        end,
    {ok, P, N} = beamdiag_test_lib:start_node(list_to_integer(erlang:system_info(otp_release)),
                                              #{name => Name, args => Args, wait_boot => 30000}),
    {P, N}.

%% Runs a command line, returns its exit code and standard output.
cli(Args) ->
    Code = beamdiag_cli:run(Args, beamdiag_test_lib:capture_io()),
    {Out, _} = beamdiag_test_lib:collect_io(),
    {Code, unicode:characters_to_list(Out)}.
