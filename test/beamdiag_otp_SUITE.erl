%%% beamdiag across OTP releases, as a user runs it: the escript built on
%%% this machine's OTP diagnoses lab nodes started on OTP 25, 27 (Debian
%%% trixie's) and 29 (sid's) in their own roots, and an escript built inside
%%% the OTP 29 root diagnoses an OTP 25 node. The agent goes to OTP 27 and
%%% 29 nodes as OTP 27's beams (scripts/beam-sets.sh), so a node without
%%% the compiler application is diagnosed alike. Each case reads the JSON the
%%% CLI prints and asserts the raw ledger figures before the findings.
%%% Figures go to the log (ct:pal) for the support table.
-module(beamdiag_otp_SUITE).
-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0, groups/0, suite/0, init_per_suite/1, end_per_suite/1,
         init_per_group/2, end_per_group/2, init_per_testcase/2, end_per_testcase/2]).
-export([idle/1, busy_wait/1, busy_wait_off/1, cpu_saturated/1, nif_threads/1, other_commands/1,
         no_compiler_beams/1, agent_load_cost/1, cli_built_on_29/1]).

-define(WINDOW, "3").
%% Seconds a lab load may run at most: the timetrap's bound.
-define(LAB_S, 300).

suite() -> [{timetrap, {minutes, 5}}].

all() ->
    [{group, otp25}, {group, otp27}, {group, otp29}, {group, cli29}].

groups() ->
    Common = [idle, busy_wait, busy_wait_off, cpu_saturated, nif_threads],
    [{otp25, [], Common},
     {otp27, [], Common ++ [other_commands, no_compiler_beams]},
     {otp29, [], Common ++ [other_commands, no_compiler_beams, agent_load_cost]},
     {cli29, [], [cli_built_on_29]}].

init_per_suite(Config) ->
    case beamdiag_test_lib:escript() of
        {ok, E} -> [{escript, E} | Config];
        error -> beamdiag_test_lib:missing("the escript is not built (rebar3 escriptize)")
    end.

end_per_suite(_Config) ->
    ok.

init_per_group(cli29, Config) ->
    init_per_group(otp29, Config);
init_per_group(Group, Config) ->
    beamdiag_test_lib:release_config(list_to_integer(lists:nthtail(3, atom_to_list(Group))),
                                     Config).

end_per_group(_, _Config) ->
    ok.

init_per_testcase(Case, Config) ->
    Scenario = case Case of
                   busy_wait -> busy_wait;
                   busy_wait_off -> busy_wait_off;
                   cpu_saturated -> cpu_saturated;
                   cli_built_on_29 -> busy_wait;
                   _ -> idle
               end,
    %% The load runs until end_per_testcase stops it; its own bound is the
    %% timetrap's, so that it never ends while the case measures.
    Opts = case Case of
               %% The OTP 29 CLI diagnoses a node of this machine's OTP.
               cli_built_on_29 -> #{duration => ?LAB_S};
               _ -> #{duration => ?LAB_S, exec => ?config(exec, Config)}
           end,
    %% Slow set-up first (the OTP 29 escript takes minutes to build on a
    %% cold machine), then the load.
    Config1 = case Case of
                  cli_built_on_29 -> [{sid_build, build_in_sid(Config)} | Config];
                  _ -> Config
              end,
    case Case =:= no_compiler_beams of
        true ->
            Bare = {Peer, _, _} = bare_node(Config1),
            [{peer, Peer}, {bare, Bare} | Config1];
        false ->
            {ok, Lab} = beamdiag_test_lib:start_lab(Scenario, Opts),
            [{lab, Lab} | Config1]
    end.

end_per_testcase(_, Config) ->
    beamdiag_test_lib:end_case_lab(Config),
    case proplists:get_value(peer, Config) of
        undefined -> ok;
        Peer -> beamdiag_test_lib:stop_node(Peer)
    end,
    case proplists:get_value(sid_build, Config) of
        undefined -> ok;
        {_Root, Dir} -> os:cmd("rm -rf '" ++ Dir ++ "'")
    end,
    ok.

%%% Cases

idle(Config) ->
    {J, S, _} = diagnose(Config),
    fig(Config, idle, J),
    ?assert(share(<<"busy">>, S) < 0.10),
    ?assertEqual([], serious(J)).

busy_wait(Config) ->
    case until_named(Config, fun() -> diagnose(Config) end, <<"busy_wait">>, 3) of
        {named, {J, S, Raw}} ->
            fig(Config, busy_wait, J),
            %% The raw signal, from the capture's counters: the load runs
            %% (reductions) and the schedulers were on CPU longer than busy,
            %% the difference spinning; the ledger's spin is that figure.
            ct:pal("raw: ~p", [Raw]),
            ?assert(maps:get(reductions_per_s, Raw) > 1.0e6),
            ?assert(maps:get(spin, Raw) > 0.05),
            ?assert(share(<<"spin">>, S) > 0.05),
            ?assert(abs(share(<<"spin">>, S) - maps:get(spin, Raw)) < 0.02),
            %% The flags came from emu_args on this release.
            #{<<"sbwt">> := <<"very_long">>, <<"sbwtdcpu">> := <<"very_long">>,
              <<"sbwtdio">> := <<"very_long">>} = maps:get(<<"settings">>, J),
            %% msacc ran there: on a stock emulator spinning lands in 'other'.
            Other = msacc_share(J, <<"other">>),
            ct:pal("msacc other ~.3f", [Other]),
            ?assert(Other > 0.03);
        {not_named, {J, _S, Raw}, Host} ->
            starved(Config, busy_wait, J, Raw, Host)
    end.

%% Schedulers that wait for a CPU much of the window cannot spin: a try
%% not named on a host that starved them, by the test's own reading of the
%% host and of the node's scheduler threads around the try
%% (host_starved/1), is tried again, up to N tries in all, and recorded;
%% any other try not named ends it. Diagnose returns {Json,
%% SchedulerRow, RawShares}.
until_named(Config, Diagnose, Id, N) ->
    until_named(maps:get(os_pid, ?config(lab, Config)), Diagnose, Id, N, 1).

until_named(OsPid, Diagnose, Id, N, K) ->
    {Cpu0, Sched0} = {beamdiag_test_lib:host_cpu(), beamdiag_test_lib:sched_stat(OsPid)},
    R = {J, _, _} = Diagnose(),
    Host = (beamdiag_test_lib:sched_wait_since(Sched0))#{
             host_busy => beamdiag_test_lib:host_busy_since(Cpu0)},
    case lists:member(Id, serious(J)) of
        true ->
            K > 1 andalso ct:comment(io_lib:format("~s named on try ~b; the ~b before on a starved "
                                                   "host", [Id, K, K - 1])),
            {named, R};
        false ->
            fig([], {retry, Id}, J),
            case host_starved(Host) andalso K < N of
                true ->
                    beamdiag_test_lib:retried("~s not named on try ~b: ~ts", [Id, K, starved_text(Host)]),
                    until_named(OsPid, Diagnose, Id, N, K + 1);
                false ->
                    {not_named, R, Host}
            end
    end.

%% The host took the CPU time spinning needs, by the test's own reading
%% (/proc/stat, and the node's scheduler threads' schedstat over the try):
%% the host's CPUs 0.85 busy or more, and the schedulers waited runnable
%% for a CPU a quarter of their wall time or more, or half as long as they
%% ran or more. Seen on OTP 29 beside the quiet lane (host 0.87 busy): the
%% schedulers 0.39 of their time on a CPU and 0.207 waiting for one, their
%% spin 0.062 of wall time where a quiet host gives 0.3 or more.
host_starved(#{runq := Runq, on_cpu := OnCpu, host_busy := Host}) ->
    Host >= 0.85 andalso (Runq >= 0.25 orelse Runq >= 0.5 * OnCpu).

starved_text(#{runq := Runq, on_cpu := OnCpu, host_busy := Host, span_ms := Span}) ->
    io_lib:format("the scheduler threads waited for a CPU ~.3f of ~b ms and ran ~.3f, the host's "
                  "CPUs ~.3f busy (read from /proc)", [Runq, Span, OnCpu, Host]).

%% busy_wait was not named in any try. That is a skip only when the test's
%% own reading shows the host starved the schedulers (host_starved/1) and
%% the load ran (reductions, the capture's raw counters). Anything else
%% fails.
starved(Config, What, J, Raw, Host) ->
    fig(Config, What, J),
    ct:pal("raw: ~p~ntest's reading: ~p", [Raw, Host]),
    ?assert(maps:get(reductions_per_s, Raw) > 1.0e6),
    case host_starved(Host) of
        true ->
            beamdiag_test_lib:starved("busy_wait not named: ~ts; the capture's spin ~.3f of "
                                      "wall time", [starved_text(Host), maps:get(spin, Raw)]);
        false ->
            ct:fail({busy_wait_not_named, #{test => Host, capture => Raw}})
    end.

%% The negative control: the same load with +sbwt none does not spin.
busy_wait_off(Config) ->
    {J, S, Raw} = diagnose(Config),
    %% Raw signal: the same load runs.
    ?assert(maps:get(reductions_per_s, Raw) > 1.0e6),
    fig(Config, busy_wait_off, J),
    ?assert(share(<<"spin">>, S) < 0.05),
    #{<<"sbwt">> := <<"none">>} = maps:get(<<"settings">>, J),
    ?assertNot(lists:member(<<"busy_wait">>, ids(J))).

cpu_saturated(Config) ->
    {J, S, Raw} = diagnose(Config),
    ?assert(maps:get(busy, Raw) >= 0.85),
    fig(Config, cpu_saturated, J),
    ?assert(share(<<"busy">>, S) >= 0.85),
    ?assert(lists:member(<<"cpu_saturated">>, serious(J))),
    ?assertNot(lists:member(<<"busy_wait">>, ids(J))),
    %% The Erlang-level sampler goes over with the same loader and finds
    %% the burners.
    Lab = ?config(lab, Config),
    Flame = filename:join(?config(priv_dir, Config), "flame"),
    {FCode, FOut, FErr} = cli(Config, ["flame", atom_to_list(beamdiag_lab:node(Lab)), "--erlang",
                                       "--duration", "2", "--output-dir", Flame],
                              beamdiag_lab:cookie(Lab)),
    ct:pal("flame --erlang exit ~b:~n~ts~ts", [FCode, FOut, FErr]),
    ?assertEqual(0, FCode),
    {ok, Folded} = file:read_file(filename:join(Flame, "profile.folded")),
    ?assertMatch({_, _}, binary:match(Folded, <<"beamdiag_lab_ledger">>)),
    beamdiag_test_lib:agent_gone(Lab).

%% A NIF's threads on an idle node: one spins under a scheduler's
%% inherited name, one is named past the node's schedulers, one has a name
%% of its own. None is a scheduler: the schedulers stay as many as the
%% node has, their spin stays small, and the spinning shows as 'other'.
nif_threads(Config) ->
    Lab = #{peer := Peer} = ?config(lab, Config),
    {So, File} = nif_so(Config),
    {ok, _} = beamdiag_loader:load({peer, Peer}, [beamdiag_nif_thread]),
    %% The threads live until the lab node is stopped at the case's end
    %% (two minutes at most): a fixed few seconds ran out before a window
    %% that started late on a loaded host.
    ok = peer:call(Peer, beamdiag_nif_thread, run, [So, 120000]),
    %% Loaded: the file can go (and its folder, inside a root).
    ok = file:delete(File),
    _ = case ?config(release, Config) of
            25 -> ok;
            _ -> file:del_dir(filename:dirname(File))
        end,
    {J, S, _} = diagnose(Config),
    Threads = maps:get(<<"threads">>, J),
    Names = [{maps:get(<<"name">>, T), maps:get(<<"type">>, T)} || T <- Threads],
    ct:pal("OTP ~b threads ~p", [?config(release, Config), Names]),
    Scheds = [N || {N, <<"scheduler">>} <- Names],
    NSched = maps:get(<<"schedulers">>, maps:get(<<"settings">>, J)),
    ?assertEqual(NSched, length(Scheds)),
    ?assertEqual(NSched, length(lists:usort(Scheds))),
    Others = [T || T = #{<<"type">> := <<"other">>} <- Threads],
    ?assert(length(Others) >= 3),
    OtherCpu = lists:sum([maps:get(<<"on_cpu">>, T) || T <- Others]),
    ct:pal("other threads on CPU ~.2f s; scheduler spin ~.3f", [OtherCpu, share(<<"spin">>, S)]),
    ?assert(OtherCpu > 0.2),
    ?assert(share(<<"spin">>, S) < 0.10),
    ?assert(lists:member(<<"erts_sched_99">>, [N || #{<<"name">> := N} <- Others])),
    ?assertNot(lists:member(<<"busy_wait">>, serious(J))),
    _ = Lab,
    ok.

%% The other commands against the node: two saved captures with an HTML
%% report, re-rendered, compared, and a few seconds of watch.
other_commands(Config) ->
    Lab = #{peer := Peer} = ?config(lab, Config),
    Node = atom_to_list(beamdiag_lab:node(Lab)),
    Priv = ?config(priv_dir, Config),
    [A, B, H] = [filename:join(Priv, F) || F <- ["a.capture", "b.capture", "a.html"]],
    C = beamdiag_lab:cookie(Lab),
    {0, _, _} = cli(Config, ["diagnose", Node, "--duration", "2", "--save", A, "--html", H], C),
    {0, _, _} = cli(Config, ["diagnose", Node, "--duration", "2", "--save", B], C),
    {ok, Html} = file:read_file(H),
    ?assertMatch({_, _}, binary:match(Html, <<"<html">>)),
    ?assertMatch({_, _}, binary:match(Html, sched_name(?config(release, Config)))),
    {0, Report, _} = cli(Config, ["report", A], C),
    ?assertMatch({_, _}, binary:match(Report, <<"TIME LEDGER">>)),
    {0, Cmp, _} = cli(Config, ["compare", A, B], C),
    ct:pal("compare:~n~ts", [Cmp]),
    %% The Prometheus endpoint served from the node, scraped while it runs.
    Port = 20000 + rand:uniform(20000),
    Metrics = open_port({spawn_executable, ?config(escript, Config)},
                        [{args, ["metrics", Node, "--port", integer_to_list(Port),
                                 "--duration", "8"]},
                         {env, [{"BEAMDIAG_COOKIE", atom_to_list(C)}]}, exit_status, binary,
                         stderr_to_stdout, hide]),
    Scrape = scrape(Port),
    ct:pal("metrics scrape:~n~ts", [Scrape]),
    ?assertMatch({_, _}, binary:match(Scrape, <<"beamdiag_">>)),
    ?assertMatch({_, _}, binary:match(Scrape, <<"scheduler">>)),
    {MCode, MOut} = beamdiag_test_lib:read_port(Metrics, 120000),
    ct:pal("metrics exit ~b: ~ts", [MCode, MOut]),
    ?assertEqual(0, MCode),
    {WCode, Watch, WErr} = cli(Config, ["watch", Node, "--duration", "3"], C),
    ct:pal("watch exit ~b:~n~ts~ts", [WCode, Watch, WErr]),
    ?assertEqual(0, WCode),
    ?assertMatch({_, _}, binary:match(Watch, <<"scheduler">>)),
    beamdiag_test_lib:agent_gone(Peer).

%% GET /metrics once the endpoint answers with figures (it warms up for an
%% interval first), waited for up to 15 s.
scrape(Port) ->
    Get = fun() ->
        case gen_tcp:connect({127, 0, 0, 1}, Port, [binary, {active, false}], 1000) of
            {ok, S} ->
                ok = gen_tcp:send(S, "GET /metrics HTTP/1.1\r\nHost: x\r\n"
                                     "Connection: close\r\n\r\n"),
                R = recv_all(S, <<>>),
                gen_tcp:close(S),
                R;
            {error, _} ->
                <<>>
        end
    end,
    Up = fun() ->
        Got = Get(),
        put(beamdiag_scrape, Got),
        binary:match(Got, <<"\nbeamdiag_up 1">>) =/= nomatch
    end,
    %% The scrape that said it is up, or the last one when it never did (the
    %% caller's assertions then say what it held).
    case beamdiag_test_lib:wait_until(Up, 15000) of
        ok -> ok;
        timeout -> ct:pal("the endpoint did not say beamdiag_up 1 within 15 s")
    end,
    erase(beamdiag_scrape).

recv_all(S, Acc) ->
    case gen_tcp:recv(S, 0, 5000) of
        {ok, D} -> recv_all(S, <<Acc/binary, D/binary>>);
        {error, _} -> Acc
    end.

sched_name(25) -> <<"1_scheduler">>;
sched_name(_) -> <<"erts_sched_1">>.

%% A node without the compiler application on its code path (as releases
%% built without it have) is diagnosed on OTP 27 and 29 alike: the agent
%% goes over as beams compiled by OTP 27 (OTP 29 refuses OTP 25's), and
%% nothing is compiled there.
no_compiler_beams(Config) ->
    {Peer, Node, Cookie} = ?config(bare, Config),
    {0, Out, _} = cli(Config, ["diagnose", atom_to_list(Node), "--json", "--duration", "2"],
                      Cookie),
    J = beamdiag_test_json:decode(Out),
    ?assertEqual(integer_to_binary(?config(release, Config)), maps:get(<<"otp_release">>, J)),
    ?assert(maps:get(<<"complete">>, J)),
    ?assertEqual(non_existing, peer:call(Peer, code, which, [compile])),
    ?assertEqual(false, peer:call(Peer, code, is_loaded, [compile])),
    beamdiag_test_lib:agent_gone(Peer).

%% What loading the agent costs on an OTP 29 node (OTP 27's beams, no
%% compile there): OS CPU of the whole node while the loader runs, wall
%% time on an idle and on a saturated node, and a whole diagnosis on the
%% saturated one within window + 2 s.
agent_load_cost(Config) ->
    Lab = ?config(lab, Config),
    Node = beamdiag_lab:node(Lab),
    {ok, Node} = beamdiag_remote:connect(atom_to_list(Node), #{cookie => beamdiag_lab:cookie(Lab)}),
    %% A second session while the first one's modules are there: the same
    %% beams have the same md5 there, so they are used as they are, and
    %% nothing is loaded twice.
    {ok, First} = beamdiag_loader:load(Node, beamdiag_agent:modules()),
    ?assertEqual({ok, []}, beamdiag_loader:load(Node, beamdiag_agent:modules())),
    ok = beamdiag_loader:unload(Node, First),
    ?assertEqual(false, erpc:call(Node, code, is_loaded, [compile])),
    Idle = [load_cost(Node) || _ <- lists:seq(1, 3)],
    ct:pal("idle OTP 29 node, agent loaded as OTP 27's beams: ~p (cpu_ms, wall_ms)", [Idle]),
    {ok, Sat} = beamdiag_test_lib:start_lab(cpu_saturated, #{duration => ?LAB_S,
                                                             exec => ?config(exec, Config)}),
    try
        SNode = beamdiag_lab:node(Sat),
        {ok, SNode} = beamdiag_remote:connect(atom_to_list(SNode),
                                              #{cookie => beamdiag_lab:cookie(Sat)}),
        Busy = [load_cost(SNode) || _ <- lists:seq(1, 3)],
        ct:pal("saturated OTP 29 node (+S 1:1, burn_all): ~p (cpu_ms, wall_ms)", [Busy]),
        T0 = erlang:monotonic_time(millisecond),
        {ok, #{ledger := L}} = beamdiag:diagnose(SNode, #{cookie => beamdiag_lab:cookie(Sat),
                                                          duration => 3}),
        Ms = erlang:monotonic_time(millisecond) - T0,
        #{by_type := #{scheduler := #{busy := B, wall := W}}} = L,
        ct:pal("saturated: diagnosis of a 3 s window took ~b ms; scheduler busy ~.3f",
               [Ms, B / W]),
        ?assert(B / W >= 0.85),
        ?assert(Ms =< 5000)
    after
        beamdiag_test_lib:stop_lab(Sat)
    end.

%% An escript built with OTP 29's rebar3 inside the sid root diagnoses a
%% node of this machine's OTP (the abstract code from OTP 29's compiler
%% compiled by this release's).
cli_built_on_29(Config) ->
    Lab = #{peer := Peer} = ?config(lab, Config),
    {Root, Dir} = ?config(sid_build, Config),
    Inside = string:prefix(Dir, Root),
    Diagnose = fun() ->
        %% The escript runs inside the root, whose /tmp is its own: the
        %% capture goes into the build folder, which both sides see.
        Name = "cli29_" ++ integer_to_list(erlang:unique_integer([positive])) ++ ".capture",
        Save = filename:join(Dir, Name),
        {Code, Out, Err} = beamdiag_test_lib:run_exe(
                               beamdiag_test_lib:script("otp-run.sh"),
                               ["sid", Inside ++ "/_build/default/bin/beamdiag", "diagnose",
                                atom_to_list(beamdiag_lab:node(Lab)), "--json", "--duration",
                                ?WINDOW, "--save", Inside ++ "/" ++ Name],
                               [{"BEAMDIAG_COOKIE", atom_to_list(beamdiag_lab:cookie(Lab))}]),
        ct:pal("exit ~b, stderr ~ts", [Code, Err]),
        ?assertEqual(0, Code),
        J = beamdiag_test_json:decode(Out),
        Here = list_to_binary(erlang:system_info(otp_release)),
        ?assertEqual(Here, maps:get(<<"otp_release">>, J)),
        ?assert(maps:get(<<"complete">>, J)),
        ?assert(maps:get(<<"samples">>, J) >= 3),
        beamdiag_test_lib:agent_gone(Peer),
        {J, sched(J), beamdiag_test_lib:raw_shares(beamdiag_test_lib:read_capture(Save))}
    end,
    case until_named(Config, Diagnose, <<"busy_wait">>, 3) of
        {named, {J, S, Raw}} ->
            fig(Config, cli29_busy_wait, J),
            ct:pal("raw: ~p", [Raw]),
            ?assert(maps:get(reductions_per_s, Raw) > 1.0e6),
            ?assert(maps:get(spin, Raw) > 0.05),
            ?assert(share(<<"spin">>, S) > 0.05),
            ?assert(abs(share(<<"spin">>, S) - maps:get(spin, Raw)) < 0.02);
        {not_named, {J, _, Raw}, Host} ->
            starved(Config, cli29_busy_wait, J, Raw, Host)
    end.

%%% Helpers

%% The escript as a user runs it, the cookie in the environment; the
%% ledger's scheduler row from its JSON. The agent is gone afterwards.
diagnose(Config) ->
    Lab = #{peer := Peer} = ?config(lab, Config),
    Save = filename:join(?config(priv_dir, Config),
                         "run_" ++ integer_to_list(erlang:unique_integer([positive])) ++ ".capture"),
    {Code, Out, Err} = cli(Config, ["diagnose", atom_to_list(beamdiag_lab:node(Lab)), "--json",
                                    "--duration", ?WINDOW, "--save", Save],
                           beamdiag_lab:cookie(Lab)),
    Code =:= 0 orelse ct:fail({exit, Code, Err}),
    J = beamdiag_test_json:decode(Out),
    ?assertEqual(integer_to_binary(?config(release, Config)), maps:get(<<"otp_release">>, J)),
    beamdiag_test_lib:agent_gone(Peer),
    {J, sched(J), beamdiag_test_lib:raw_shares(beamdiag_test_lib:read_capture(Save))}.

cli(Config, Args, Cookie) ->
    beamdiag_test_lib:run_exe(?config(escript, Config), Args,
                              [{"BEAMDIAG_COOKIE", atom_to_list(Cookie)}]).

sched(J) -> maps:get(<<"scheduler">>, maps:get(<<"by_type">>, J)).

share(K, Row = #{<<"wall">> := W}) ->
    case maps:get(K, Row) of
        V when is_number(V), W > 0 -> V / W;
        _ -> 0.0
    end.

ids(J) -> [Id || #{<<"id">> := Id} <- maps:get(<<"findings">>, J)].

serious(J) ->
    [Id || #{<<"id">> := Id, <<"severity">> := S} <- maps:get(<<"findings">>, J),
           lists:member(S, [<<"warning">>, <<"critical">>])].

msacc_share(J, State) ->
    #{<<"by_type">> := #{<<"scheduler">> := #{<<"shares">> := Sh}}} = maps:get(<<"msacc">>, J),
    maps:get(State, Sh, 0.0).

%% The figures of one run, for the closing note's table.
fig(Config, What, J) ->
    S = sched(J),
    ct:pal("FIGURES OTP ~s ~p: busy ~.3f on-cpu ~.3f spin ~.3f runq ~.3f; host busy ~.2f; "
           "findings ~p",
           [maps:get(<<"otp_release">>, J), What, share(<<"busy">>, S), share(<<"on_cpu">>, S),
            share(<<"spin">>, S), share(<<"runq">>, S),
            maps:get(<<"busy">>, maps:get(<<"host">>, J)),
            [{Id, Sv} || #{<<"id">> := Id, <<"severity">> := Sv} <- maps:get(<<"findings">>, J)]]),
    _ = Config,
    ok.

%% A node of the group's release with the compiler application taken off
%% its code path, as a release built without it would have.
bare_node(Config) ->
    Rel = ?config(release, Config),
    Cookie = list_to_atom("otp_" ++ integer_to_list(rand:uniform(1 bsl 40))),
    {ok, Peer, Node} = beamdiag_test_lib:start_node(Rel, #{args => ["-setcookie",
                                                                    atom_to_list(Cookie)]}),
    true = peer:call(Peer, code, del_path, [compiler]),
    non_existing = peer:call(Peer, code, which, [compile]),
    {Peer, Node, Cookie}.

%% Loads the agent once and unloads it: {OS CPU ms of the node, wall ms}.
load_cost(Node) ->
    OsPid = erpc:call(Node, os, getpid, []),
    C0 = cpu_ms(OsPid),
    T0 = erlang:monotonic_time(microsecond),
    {ok, Loaded} = beamdiag_loader:load(Node, beamdiag_agent:modules()),
    T1 = erlang:monotonic_time(microsecond),
    C1 = cpu_ms(OsPid),
    ok = beamdiag_loader:unload(Node, Loaded),
    [_ | _] = Loaded,
    {C1 - C0, (T1 - T0) div 1000}.

%% utime + stime of the process, in ms.
cpu_ms(OsPid) ->
    {ok, Bin} = file:read_file("/proc/" ++ OsPid ++ "/stat"),
    [_, After] = string:split(Bin, ")", trailing),
    Fields = string:lexemes(After, " "),
    Ticks = binary_to_integer(lists:nth(12, Fields)) + binary_to_integer(lists:nth(13, Fields)),
    Ticks * 1000 div beamdiag_agent_procfs:clock_ticks().

%% The NIF, built here with this machine's erl_nif.h (NIF 2.x loads on
%% later releases), placed where the node's root sees it; the path
%% without the extension, as erlang:load_nif/2 wants it.
nif_so(Config) ->
    Include = filename:join([code:root_dir(), "usr", "include"]),
    case filelib:is_regular(filename:join(Include, "erl_nif.h")) andalso
        os:find_executable("gcc") =/= false of
        false -> ct:fail("erl_nif.h or gcc missing (scripts/setup.sh installs them)");
        true -> ok
    end,
    Src = beamdiag_test_lib:fixture("nif/beamdiag_nif_thread.c"),
    {Dir, Inside} =
        case ?config(release, Config) of
            25 -> {?config(priv_dir, Config), ?config(priv_dir, Config)};
            Rel ->
                Root = root_of(Config, Rel),
                D = filename:join([Root, "root", "beamdiag_nif"]),
                {D, "/root/beamdiag_nif"}
        end,
    ok = filelib:ensure_dir(filename:join(Dir, "x")),
    So = filename:join(Dir, "beamdiag_nif_thread.so"),
    Out = os:cmd(lists:flatten(io_lib:format(
        "gcc -O1 -fPIC -shared -I'~ts' -o '~ts' '~ts' -lpthread 2>&1 && echo built",
        [Include, So, Src]))),
    case string:find(Out, "built") of
        nomatch -> ct:fail({gcc, Out});
        _ -> {filename:join(Inside, "beamdiag_nif_thread"), So}
    end.

root_of(_Config, Rel) ->
    {ok, Root} = beamdiag_test_lib:otp_root(Rel),
    Root.

script(Name) ->
    beamdiag_test_lib:script(Name).

%% rebar3 into the sid root (once, cached), the project's sources copied
%% into the root, the escript built there by OTP 29.
build_in_sid(Config) ->
    Out = os:cmd(script("otp-root.sh") ++ " sid rebar3 2>&1; echo \"exit=$?\""),
    case string:find(Out, "exit=0") of
        nomatch -> ct:fail({otp_root_rebar3, Out});
        _ -> ok
    end,
    Root = root_of(Config, 29),
    Dir = filename:join([Root, "root", "beamdiag_cli29_" ++ os:getpid()]),
    Top = beamdiag_test_lib:top(),
    _ = os:cmd("rm -rf '" ++ Dir ++ "'"),
    ok = filelib:ensure_dir(filename:join(Dir, "x")),
    "" = os:cmd(lists:flatten(io_lib:format("cp -r '~ts/src' '~ts/rebar.config' '~ts/'",
                                            [Top, Top, Dir]))),
    Inside = string:prefix(Dir, Root),
    T0 = erlang:monotonic_time(millisecond),
    {Code, BOut, BErr} = beamdiag_test_lib:run_exe(script("otp-run.sh"),
                             ["sid", "sh", "-c", "cd " ++ Inside ++ " && rebar3 escriptize"], []),
    ct:pal("built on OTP 29 in ~b ms: exit ~b~n~ts~ts",
           [erlang:monotonic_time(millisecond) - T0, Code, BOut, BErr]),
    ?assertEqual(0, Code),
    {Root, Dir}.
