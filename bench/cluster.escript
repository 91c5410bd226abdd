#!/usr/bin/env escript
%% -*- erlang -*-
%%%
%%% The cluster view at 50, 100 and 200 members on one host, measured as a
%%% user sees it.
%%%
%%% For each size N: N small nodes are started on this host (+S 1 +A 1, one
%%% dirty scheduler of each kind, no busy-waiting, +P 4096), the last of
%%% them busy (a process spinning on its one scheduler), and meshed: every
%%% node connected to every other, as a cluster's members are. The built
%%% escript then runs `beamdiag cluster SEED --json' (the first node: it and
%%% the nodes it is connected to are the members) as a separate OS process,
%%% once per window (BENCH_CLUSTER_WINDOWS) on the same nodes, side by side.
%%%
%%% Printed per run, one line:
%%% - `wall s': from the command's start to its end, its VM's start
%%%   included, as a user sees it; `target' is met when that is within the
%%%   window plus 5 s;
%%% - where that time went, in seconds (the phases add up to `wall s'):
%%%   `vm' the VM's start and the command line, up to the session's start
%%%   (from the report's wall clock); `list' the seed's members;
%%%   `prep' connecting to every member and loading the agent (the agents
%%%   get ready meanwhile); `start' agents still getting ready after the
%%%   last member was prepared, up to the windows' opening; `win' the window;
%%%   `coll' from the window's end to the last capture; `anal' from there to
%%%   the last member's analysis; `rep' the cluster's analysis and closing
%%%   the connections; `out' the JSON made, written, and the VM's exit;
%%% - `answered' (every member diagnosed), `odd 1st' (the busy member is
%%%   the first outlier), `others' (members other than the busy one with a
%%%   finding at warning or above, and the first such findings), `hosts'
%%%   (the hosts the report found the members on, and whether it says the
%%%   host's contention once, for the host), the command's peak memory
%%%   (maximum resident set) and the load average when the run started.
%%%
%%% A member of a real cluster has had distribution connections before, so
%%% the code of its distribution is loaded; the mesh does that here (with
%%% BENCH_CLUSTER_TOPOLOGY=list the nodes are not meshed, each is connected
%%% to once, hidden, and let go, and the command gets `--nodes FILE').
%%%
%%% Nothing outlives the bench: every node (and every CPU hog) is an OTP
%%% `peer' over standard I/O, which halts when this VM goes away, however
%%% that happens (a crash or an interrupt included); each round also stops
%%% them and then kills them with kill -9 by OS pid. A size needs about
%%% 35 MB per node: one the host's available memory cannot hold (with 2 GB
%%% to spare) is skipped, and the bench says so.
%%%
%%% Run from the repository root after `rebar3 escriptize':
%%%   bench/cluster.escript
%%% Environment: BENCH_CLUSTER_NS ("50 100 200", members, the busy one
%%% included), BENCH_CLUSTER_WINDOWS ("5 10", seconds), BENCH_CLUSTER_TOPOLOGY
%%% (mesh | list), BENCH_CLUSTER_FLAGS (small | default: the nodes started
%%% with OTP's default flags instead, two schedulers, ten dirty I/O
%%% schedulers and busy-waiting, which at 150 to 200 nodes load this host by
%%% themselves), BENCH_CLUSTER_HOGS (0: that many more spinning
%%% schedulers on the host, in a node of their own, while the runs go:
%%% other load on the host), BENCH_CLUSTER_CONCURRENCY (the command's
%%% --concurrency; its default when unset), BENCH_CLUSTER_SHOW (set: print
%%% each report's timing and hosts, and the other members' findings at
%%% warning or above; `text': run the command once more and print its text
%%% report), BENCH_CLUSTER_BEFORE (the path of another build of the
%%% escript: each run has it first, then this one, on the same nodes, one
%%% line each, for figures side by side), BENCH_CLUSTER_ARGS and
%%% BENCH_CLUSTER_BEFORE_ARGS (more arguments for the command, this build's
%%% and the other's: the same build twice compares options), BENCH_CLUSTER_KEEP (a folder: each
%%% run's JSON report is kept there).
-mode(compile).

-define(COOKIE, "beamdiag_cluster_bench").
-define(MB_PER_NODE, 35).
-define(START_BATCH, 12).
-define(SMALL, ["-setcookie", ?COOKIE, "+S", "1:1", "+SDcpu", "1:1", "+SDio", "1", "+A", "1",
                "-connect_all", "false", "+sbwt", "none", "+sbwtdcpu", "none",
                "+sbwtdio", "none", "+Mea", "min", "+P", "4096"]).

main(_) ->
    Ns = ints(env("BENCH_CLUSTER_NS", "50 100 200")),
    Windows = ints(env("BENCH_CLUSTER_WINDOWS", "5 10")),
    Topology = list_to_atom(env("BENCH_CLUSTER_TOPOLOGY", "mesh")),
    lists:member(Topology, [mesh, list]) orelse halt_with("BENCH_CLUSTER_TOPOLOGY: mesh or list"),
    Hogs = list_to_integer(env("BENCH_CLUSTER_HOGS", "0")),
    Exe = filename:absname("_build/default/bin/beamdiag"),
    filelib:is_regular(Exe) orelse halt_with("build the escript first: rebar3 escriptize"),
    This = {"this", Exe, env("BENCH_CLUSTER_ARGS", "")},
    Exes = case env("BENCH_CLUSTER_BEFORE", "") of
               "" -> [This];
               B -> [{"before", B, env("BENCH_CLUSTER_BEFORE_ARGS", "")}, This]
           end,
    json_reader(),
    %% The lab nodes register with epmd, as nodes do: started if need be.
    _ = os:cmd("epmd -daemon"),
    {ok, _} = net_kernel:start(list_to_atom("bdc_bench_" ++ os:getpid()),
                               #{name_domain => shortnames}),
    erlang:set_cookie(list_to_atom(?COOKIE)),
    io:format("beamdiag cluster bench: ~s, windows ~w s, target: the report within the window "
              "+ 5 s of the command's start; ~b more spinning schedulers; host ~b CPUs, ~b MB "
              "available~n",
              [Topology, Windows, Hogs, erlang:system_info(logical_processors), available_mb()]),
    io:format("~6s ~4s ~3s ~6s ~6s | ~4s ~4s ~4s ~5s ~4s ~4s ~4s ~4s ~4s | ~8s ~7s ~14s ~18s ~6s ~5s~n",
              ["build", "memb", "win", "wall s", "target", "vm", "list", "prep", "start", "win",
               "coll", "anal", "rep", "out", "answered", "odd 1st", "others >= warn",
               "hosts", "peak", "load"]),
    Hog = start_hogs(Hogs),
    try
        [round(N, Windows, Topology, Exes) || N <- Ns]
    after
        stop_peers(Hog)
    end,
    ok.

round(N, Windows, Topology, Exes) ->
    Need = N * ?MB_PER_NODE + 2048,
    case available_mb() of
        Avail when Avail < Need ->
            io:format("~6b skipped: needs ~b MB available, the host has ~b MB~n", [N, Need, Avail]);
        _ ->
            Peers = start_peers(N),
            try
                Nodes = [Nd || {_, Nd} <- Peers],
                {BusyPeer, Busy} = lists:last(Peers),
                Target = case Topology of
                             mesh ->
                                 mesh(Peers),
                                 {seed, hd(Nodes)};
                             list ->
                                 warm(Nodes),
                                 File = "/tmp/bdc_bench_nodes_" ++ os:getpid(),
                                 ok = file:write_file(File, [[atom_to_list(Nd), "\n"] || Nd <- Nodes]),
                                 {file, File}
                         end,
                spin(BusyPeer),
                timer:sleep(1500),
                [run(Build, Exe, Args, N, W, Target, Busy) || W <- Windows, {Build, Exe, Args} <- Exes],
                case Target of
                    {file, F} -> file:delete(F);
                    _ -> ok
                end
            after
                stop_peers(Peers)
            end
    end.

run(Build, Exe, Args, N, Window, Target, Busy) ->
    Out = "/tmp/bdc_bench_report_" ++ os:getpid(),
    _ = file:delete(Out),
    Who = case Target of
              {seed, Seed} -> atom_to_list(Seed);
              {file, File} -> "--nodes " ++ File
          end,
    Conc = case env("BENCH_CLUSTER_CONCURRENCY", "") of
               "" -> "";
               K -> " --concurrency " ++ K
           end,
    Cmd = lists:flatten(io_lib:format(
        "/usr/bin/time -f '%M' ~s cluster ~s --cookie ~s --duration ~b~s ~s --json --out ~s 2>&1 "
        "| tail -1", [Exe, Who, ?COOKIE, Window, Conc, Args, Out])),
    Load = hd(string:lexemes(os:cmd("cat /proc/loadavg"), " ")),
    W0 = os:system_time(millisecond),
    PeakKb = list_to_integer(string:trim(os:cmd(Cmd))),
    W1 = os:system_time(millisecond),
    WallS = (W1 - W0) / 1000,
    Doc = case file:read_file(Out) of
              {ok, Text} -> beamdiag_test_json:decode(Text);
              {error, _} -> #{}
          end,
    _ = case env("BENCH_CLUSTER_KEEP", "") of
            "" -> file:delete(Out);
            Dir -> file:rename(Out, filename:join(Dir, lists:concat([Build, "_", N, "_", Window,
                                                                     "_", W0, ".json"])))
        end,
    BusyB = atom_to_binary(Busy),
    Members = length(maps:get(<<"members">>, Doc, [])),
    Answered = length(maps:get(<<"nodes">>, Doc, [])),
    OddFirst = case maps:get(<<"outliers">>, Doc, []) of
                   [#{<<"node">> := BusyB} | _] -> "yes";
                   _ -> "NO"
               end,
    Others = [{Nd, Id} || {Nd, Fs} <- maps:to_list(maps:get(<<"findings">>, Doc, #{})),
                          Nd =/= BusyB,
                          #{<<"id">> := Id, <<"severity">> := S} <- Fs,
                          lists:member(S, [<<"warning">>, <<"critical">>])],
    OthersText = case Others of
                     [] -> "0";
                     _ ->
                         Ids = lists:usort([Id || {_, Id} <- Others]),
                         io_lib:format("~b ~ts", [length(lists:usort([Nd || {Nd, _} <- Others])),
                                                  lists:join(",", [short_id(I) || I <- Ids])])
                 end,
    Phases = phases(Doc, W0, W1),
    io:format("~6s ~4b ~3b ~6.1f ~6s | ~ts | ~7.1f% ~7s ~14ts ~18ts ~6.1f ~5s~n",
              [Build, N, Window, WallS,
               case WallS =< Window + 5 andalso Answered =:= N of
                   true -> "met";
                   false -> "missed"
               end,
               Phases, 100 * Answered / max(1, Members), OddFirst, cut(OthersText, 14),
               cut(hosts(Doc), 18), PeakKb / 1024, Load]),
    case env("BENCH_CLUSTER_SHOW", "") of
        "" -> ok;
        "text" ->
            %% One more run of the command, its text report as a user sees it.
            io:format("~ts~n", [os:cmd(lists:flatten(io_lib:format(
                "~s cluster ~s --cookie ~s --duration ~b~s ~s 2>/dev/null",
                [Exe, Who, ?COOKIE, Window, Conc, Args])))]);
        _ ->
            Rows = maps:from_list([{Nd, R} || R = #{<<"node">> := Nd} <- maps:get(<<"nodes">>, Doc, [])]),
            Fs = maps:get(<<"findings">>, Doc, #{}),
            io:format("    timing: ~tp~n    hosts: ~tp~n", [maps:get(<<"timing">>, Doc, none),
                                                          maps:get(<<"hosts">>, Doc, none)]),
            [io:format("    ~ts: ~tp~n      ~tp~n",
                       [Nd, maps:with([<<"busy">>, <<"runq">>, <<"blocked">>, <<"on_cpu">>,
                                       <<"window_s">>, <<"window_start_ms">>],
                                      maps:get(Nd, Rows, #{})),
                        [{Id, Ev} || #{<<"id">> := Id, <<"evidence">> := Ev} <- maps:get(Nd, Fs, [])]])
             || Nd <- lists:sublist(lists:usort([Nd || {Nd, _} <- Others]), 3)]
    end.

%% Where the command's time went, from the report's `timing' (its own
%% clock) and this bench's (the command's start and end): each phase in
%% seconds, "-" for one a build does not report.
phases(Doc, W0, W1) ->
    T = maps:get(<<"timing">>, Doc, #{}),
    %% A build before the phases: its connect and load.
    P = maps:get(<<"phases_ms">>, T, #{<<"prepare">> => maps:get(<<"prepare_ms">>, T, null)}),
    Of = fun(K) -> case maps:get(K, P, null) of
                       null -> "-";
                       Ms -> io_lib:format("~.1f", [Ms / 1000])
                   end
         end,
    Vm = case maps:get(<<"started_wall_ms">>, T, null) of
             null -> "-";
             S -> io_lib:format("~.1f", [(S - W0) / 1000])
         end,
    OutS = case maps:get(<<"done_wall_ms">>, T, null) of
               null -> "-";
               D -> io_lib:format("~.1f", [(W1 - D) / 1000])
           end,
    Cols = [{Vm, 4}, {Of(<<"members">>), 4}, {Of(<<"prepare">>), 4}, {Of(<<"start">>), 5},
            {Of(<<"window">>), 4}, {Of(<<"collect">>), 4}, {Of(<<"analyse">>), 4},
            {Of(<<"report">>), 4}, {OutS, 4}],
    lists:join(" ", [string:pad(V, W, leading) || {V, W} <- Cols]).

%% The hosts the report found, and how many members carry a finding that
%% the host's entry says for them.
hosts(Doc) ->
    case maps:get(<<"hosts">>, Doc, null) of
        null -> "-";
        Hosts when is_list(Hosts) ->
            io_lib:format("~b: ~ts", [length(Hosts),
                                      lists:join(",", [host_text(H) || H <- lists:sublist(Hosts, 2)])])
    end.

host_text(H = #{<<"members">> := Ms}) ->
    Said = [short_id(Id) || #{<<"id">> := Id} <- maps:get(<<"findings">>, H, [])],
    io_lib:format("~b~ts", [length(Ms), case Said of
                                            [] -> "";
                                            _ -> [" ", lists:join("+", Said)]
                                        end]).

short_id(<<"cpu_starvation">>) -> "starv";
short_id(<<"scheduler_blocking">>) -> "block";
short_id(<<"cluster_outlier">>) -> "outl";
short_id(<<"host_contention">>) -> "cont";
short_id(Id) -> Id.

cut(Text, N) ->
    S = lists:flatten(io_lib:format("~ts", [Text])),
    case string:length(S) > N of
        true -> string:slice(S, 0, N - 1) ++ "~";
        false -> S
    end.

%% The nodes, the busy one last, started a batch at a time.
start_peers(N) ->
    Names = [lists:concat(["bdc_", os:getpid(), "_", I]) || I <- lists:seq(1, N)],
    Args = case env("BENCH_CLUSTER_FLAGS", "small") of
               "small" -> ?SMALL;
               "default" -> ["-setcookie", ?COOKIE, "-connect_all", "false"]
           end,
    lists:append([start_batch(B, Args) || B <- chunks(Names, ?START_BATCH)]).

start_batch(Names, Args) ->
    Self = self(),
    Pids = [spawn_link(fun() -> Self ! {self(), start_peer(Name, Args)} end) || Name <- Names],
    [receive {P, R} -> R end || P <- Pids].

start_peer(Name, Args) ->
    {ok, P, Node} = peer:start(#{name => list_to_atom(Name), args => Args,
                                 connection => standard_io, wait_boot => 120000}),
    {P, Node}.

%% Every node connected to every other (node I to the nodes before it),
%% the nodes side by side.
mesh(Peers) ->
    Nodes = [Nd || {_, Nd} <- Peers],
    Self = self(),
    Pids = [spawn_link(fun() ->
                           [true = peer:call(P, net_kernel, connect_node, [Other], 60000)
                            || Other <- lists:sublist(Nodes, I - 1)],
                           Self ! {self(), ok}
                       end) || {I, {P, _}} <- lists:enumerate(Peers)],
    [receive {Pid, ok} -> ok end || Pid <- Pids],
    ok.

%% Each node connected to once (hidden) and let go, a batch at a time.
warm(Nodes) ->
    lists:foreach(
        fun(Batch) ->
            Self = self(),
            Pids = [spawn_link(fun() ->
                                   true = net_kernel:hidden_connect_node(Nd),
                                   true = erlang:disconnect_node(Nd),
                                   Self ! {self(), ok}
                               end) || Nd <- Batch],
            [receive {P, ok} -> ok end || P <- Pids]
        end, chunks(Nodes, ?START_BATCH)),
    timer:sleep(500).

spin(Peer) ->
    eval(Peer, "spawn(fun() -> F = fun F(X) -> F(erlang:phash2({X, X})) end, F(1) end)."),
    ok.

%% Other load on the host: a node with H schedulers, each kept busy.
start_hogs(0) ->
    [];
start_hogs(H) ->
    Args = ["-setcookie", ?COOKIE, "+S", integer_to_list(H), "+sbwt", "none"],
    Peer = start_peer(lists:concat(["bdc_hog_", os:getpid()]), Args),
    [eval(element(1, Peer), "spawn(fun() -> F = fun F(X) -> F(erlang:phash2({X, X})) end, F(1) end).")
     || _ <- lists:seq(1, H)],
    [Peer].

eval(Peer, Text) ->
    {ok, Tokens, _} = erl_scan:string(Text),
    {ok, Exprs} = erl_parse:parse_exprs(Tokens),
    {value, V, _} = peer:call(Peer, erl_eval, exprs, [Exprs, []]),
    V.

stop_peers(Peers) ->
    OsPids = [os_pid(P) || {P, _} <- Peers],
    [catch peer:stop(P) || {P, _} <- Peers],
    timer:sleep(500),
    [os:cmd("kill -9 " ++ Pid ++ " 2>/dev/null") || Pid <- OsPids, Pid =/= undefined],
    ok.

os_pid(P) ->
    try peer:call(P, os, getpid, [], 2000)
    catch _:_ -> undefined
    end.

%% The suites' JSON reader (OTP 25 has no json module), compiled here.
json_reader() ->
    Src = "test/beamdiag_test_json.erl",
    {ok, M, Bin} = compile:file(Src, [binary, report_errors]),
    {module, M} = code:load_binary(M, Src, Bin),
    ok.

chunks([], _) -> [];
chunks(L, K) when length(L) =< K -> [L];
chunks(L, K) -> {A, B} = lists:split(K, L), [A | chunks(B, K)].

available_mb() ->
    {ok, Bin} = file:read_file("/proc/meminfo"),
    {match, [Kb]} = re:run(Bin, "MemAvailable:\\s+(\\d+)", [{capture, all_but_first, list}]),
    list_to_integer(Kb) div 1024.

ints(S) ->
    [list_to_integer(X) || X <- string:lexemes(S, " ,")].

env(K, Default) ->
    case os:getenv(K) of
        false -> Default;
        "" -> Default;
        V -> V
    end.

halt_with(Msg) ->
    io:format(standard_error, "bench/cluster.escript: ~s~n", [Msg]),
    halt(2).
