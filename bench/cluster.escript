#!/usr/bin/env escript
%% -*- erlang -*-
%%%
%%% The cluster view at hundreds of nodes, measured.
%%%
%%% For each N: N idle nodes and one busy node (a process spinning on its
%%% one scheduler) are started on this host, small (+S 1 +A 1, one dirty
%%% scheduler of each kind, -connect_all false, no busy-waiting), and
%%% listed in a node file; the built escript runs `beamdiag cluster --nodes
%%% FILE' as a separate OS process under /usr/bin/time. Printed per N: the
%%% time to start the nodes; the command's wall time from its start to its
%%% report; of that, the time it took to connect to every member and load
%%% the agent (load s), and the time from the agents' start to the report
%%% (window+ s); the target (window + 5 s) is met when the command's wall
%%% time less the VM's own start (vm s) is within it; the command's peak
%%% memory (maximum resident set), the share of members that answered,
%%% whether the busy node is the first outlier, the report's length in
%%% lines (target: one screen, <= 50), and how long all windows overlapped
%%% (with how far apart they started).
%%%
%%% A member of a real cluster has had distribution connections before
%%% (that is what makes it a member), so the code of its distribution is
%%% loaded; a node the bench starts has had none, and its first connection
%%% costs it 30 to 40 ms of CPU to load that code (measured on one idle
%%% node here; 0 ms for a second connection), 201 nodes 6 to 8 s of CPU on
%%% two cores. So each node is connected to once (hidden) and let go
%%% before the rounds, as a cluster member would have been; set
%%% BENCH_CLUSTER_COLD to leave them as started (each round then pays for
%%% the first connections too).
%%%
%%% Every node is started with OTP's `peer' over standard I/O: it halts
%%% when this VM goes away, however that happens (interrupted included),
%%% and each is also stopped, then killed with kill -9, at the end of its
%%% round. A size needs about 35 MB per node: one the host's available
%%% memory cannot hold (with 2 GB to spare) is skipped, and the bench says
%%% so.
%%%
%%% Run from the repository root after `rebar3 escriptize':
%%%   bench/cluster.escript
%%% Environment: BENCH_CLUSTER_NS ("50 100 200"), BENCH_CLUSTER_WINDOW (10,
%%% seconds), BENCH_CLUSTER_CONCURRENCY (64, the command's --concurrency),
%%% BENCH_CLUSTER_SHOW (set: print each report), BENCH_CLUSTER_BEFORE (the path
%%% of another build of the escript: each round runs it first, then this
%%% one, on the same nodes, one line each, for a side-by-side comparison;
%%% BENCH_CLUSTER_BEFORE_CONCURRENCY, 32, its --concurrency).
%%% Each line also gives the CLI VM's own start (`beamdiag help', timed
%%% just before) and, from the report, where the time went per member
%%% (connect, load, analysis: median and max, ms).
-mode(compile).

-define(COOKIE, "beamdiag_cluster_bench").
-define(MB_PER_NODE, 35).
-define(START_BATCH, 12).

main(_) ->
    Ns = [list_to_integer(S) || S <- string:lexemes(env("BENCH_CLUSTER_NS", "50 100 200"), " ,")],
    Window = list_to_integer(env("BENCH_CLUSTER_WINDOW", "10")),
    K = list_to_integer(env("BENCH_CLUSTER_CONCURRENCY", "64")),
    Exe = filename:absname("_build/default/bin/beamdiag"),
    filelib:is_regular(Exe) orelse halt_with("build the escript first: rebar3 escriptize"),
    Exes = case os:getenv("BENCH_CLUSTER_BEFORE") of
               B when B =:= false; B =:= "" -> [{"this", Exe, K}];
               B -> [{"before", B, list_to_integer(env("BENCH_CLUSTER_BEFORE_CONCURRENCY", "32"))},
                     {"this", Exe, K}]
           end,
    {ok, _} = net_kernel:start(list_to_atom("bdc_bench_" ++ os:getpid()), #{name_domain => shortnames}),
    erlang:set_cookie(list_to_atom(?COOKIE)),
    io:format("beamdiag cluster bench: window ~b s, target report within ~b s; --concurrency ~b; "
              "host ~b CPUs, ~b MB available~n",
              [Window, Window + 5, K, erlang:system_info(logical_processors), available_mb()]),
    io:format("~6s ~6s ~8s ~6s ~8s ~8s ~11s ~7s ~8s ~9s ~9s ~6s ~12s  ~s~n",
              ["build", "nodes", "start s", "vm s", "wall s", "load s", "window+ s", "target",
               "peak MB", "answered", "odd first", "lines", "overlap s",
               "per member, median (max); captured, analysed"]),
    [round(N, Window, K, Exes) || N <- Ns],
    ok.

round(N, Window, _K, Exes) ->
    Need = (N + 1) * ?MB_PER_NODE + 2048,
    case available_mb() of
        Avail when Avail < Need ->
            io:format("~6b skipped: needs ~b MB available, the host has ~b MB~n", [N + 1, Need, Avail]);
        _ ->
            T0 = erlang:monotonic_time(millisecond),
            Peers = start_peers(N),
            try
                StartS = (erlang:monotonic_time(millisecond) - T0) / 1000,
                {BusyPeer, Busy} = lists:last(Peers),
                case os:getenv("BENCH_CLUSTER_COLD") of
                    C when C =:= false; C =:= "" -> warm([Nd || {_, Nd} <- Peers]);
                    _ -> ok
                end,
                spin(BusyPeer),
                timer:sleep(1500),
                File = "/tmp/bdc_bench_nodes_" ++ os:getpid(),
                ok = file:write_file(File, [[atom_to_list(Node), "\n"] || {_, Node} <- Peers]),
                [run(Build, Exe, N, Window, KB, File, StartS, Busy) || {Build, Exe, KB} <- Exes],
                file:delete(File)
            after
                stop_peers(Peers)
            end
    end.

run(Build, Exe, N, Window, K, File, StartS, Busy) ->
    V0 = erlang:monotonic_time(millisecond),
    _ = os:cmd(Exe ++ " help"),
    VmS = (erlang:monotonic_time(millisecond) - V0) / 1000,
    Out = "/tmp/bdc_bench_report_" ++ os:getpid(),
    W0 = erlang:monotonic_time(millisecond),
    Cmd = io_lib:format("/usr/bin/time -f '%M' ~s cluster --nodes ~s --cookie ~s "
                        "--duration ~b --concurrency ~b --out ~s 2>&1 | tail -1",
                        [Exe, File, ?COOKIE, Window, K, Out]),
    PeakKb = list_to_integer(string:trim(os:cmd(lists:flatten(Cmd)))),
    WallS = (erlang:monotonic_time(millisecond) - W0) / 1000,
    {ok, Text} = file:read_file(Out),
    Lines = binary:split(Text, <<"\n">>, [global, trim]),
    {Answered, Members} = answered(hd(Lines)),
    OddFirst = odd_first(Lines, atom_to_binary(Busy)),
    Overlap = overlap(Lines),
    {LoadS, ReadyS} = phases(Lines),
    io:format("~6s ~6b ~8.1f ~6.1f ~8.1f ~8.1f ~11.1f ~7s ~8.1f ~8.1f% ~9s ~6b ~12s  ~s~n",
              [Build, N + 1, StartS, VmS, WallS, LoadS, ReadyS,
               case WallS - VmS =< Window + 5 of true -> "met"; false -> "missed" end,
               PeakKb / 1024, 100 * Answered / max(1, Members),
               atom_to_list(OddFirst), length(Lines), Overlap, per_member(Lines)]),
    file:delete(Out),
    case os:getenv("BENCH_CLUSTER_SHOW") of
        false -> ok;
        _ -> io:format("~ts~n", [Text])
    end.

%% The report's line on where the time went per member, if it has one.
per_member(Lines) ->
    Of = fun(Prefix) ->
                 case [L || L <- Lines, binary:match(L, Prefix) =/= nomatch] of
                     [L | _] -> string:trim(lists:nthtail(byte_size(Prefix), binary_to_list(L)));
                     [] -> "-"
                 end
         end,
    Of(<<"  per member, median (max): ">>) ++ "; captured " ++ Of(<<"  captured ">>).

%% Each node connected to once (hidden) and let go, a batch at a time.
warm(Nodes) ->
    lists:foreach(
        fun(Batch) ->
            Self = self(),
            Pids = [spawn_link(fun() ->
                                   true = net_kernel:hidden_connect_node(N),
                                   true = erlang:disconnect_node(N),
                                   Self ! {self(), ok}
                               end) || N <- Batch],
            [receive {P, ok} -> ok end || P <- Pids]
        end, chunks(Nodes, ?START_BATCH)),
    timer:sleep(500).

%% The idle nodes and, last, the busy one, started a batch at a time.
start_peers(N) ->
    Names = [lists:concat(["bdc_", os:getpid(), "_", I]) || I <- lists:seq(1, N + 1)],
    lists:append([start_batch(B) || B <- chunks(Names, ?START_BATCH)]).

start_batch(Names) ->
    Self = self(),
    Pids = [spawn_link(fun() -> Self ! {self(), start_peer(Name)} end) || Name <- Names],
    [receive {P, R} -> R end || P <- Pids].

start_peer(Name) ->
    Args = ["-setcookie", ?COOKIE, "+S", "1:1", "+SDcpu", "1:1", "+SDio", "1", "+A", "1",
            "-connect_all", "false", "+sbwt", "none", "+sbwtdcpu", "none", "+sbwtdio", "none",
            "+Mea", "min"],
    {ok, P, Node} = peer:start(#{name => list_to_atom(Name), args => Args,
                                 connection => standard_io, wait_boot => 120000}),
    {P, Node}.

spin(Peer) ->
    Text = "spawn(fun() -> F = fun F(X) -> F(erlang:phash2({X, X})) end, F(1) end).",
    {ok, Tokens, _} = erl_scan:string(Text),
    {ok, Exprs} = erl_parse:parse_exprs(Tokens),
    {value, _, _} = peer:call(Peer, erl_eval, exprs, [Exprs, []]),
    ok.

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

answered(Header) ->
    case re:run(Header, "(\\d+) members .*, (\\d+) answered", [{capture, all_but_first, list}]) of
        {match, [M, A]} -> {list_to_integer(A), list_to_integer(M)};
        nomatch -> {0, 1}
    end.

%% The first node named under OUTLIERS is the busy one.
odd_first(Lines, Busy) ->
    case lists:dropwhile(fun(L) -> not is_prefix(<<"OUTLIERS">>, L) end, Lines) of
        [_, First | _] -> is_prefix(<<"  ", Busy/binary, " ">>, First);
        _ -> false
    end.

overlap(Lines) ->
    case [L || L <- Lines, binary:match(L, <<"all overlap for">>) =/= nomatch] of
        [L | _] ->
            case re:run(L, "within ([0-9.]+) s .* for ([0-9.]+) s", [{capture, all_but_first, list}]) of
                {match, [Spread, Ov]} -> Ov ++ " (" ++ Spread ++ ")";
                nomatch -> "?"
            end;
        [] -> "-"
    end.

%% How long connecting and loading took, and how long after the agents
%% started the report was ready (the report's third line).
phases(Lines) ->
    case [L || L <- Lines, binary:match(L, <<"connect and load:">>) =/= nomatch] of
        [L | _] ->
            {match, [A, B]} = re:run(L, "load: ([0-9.]+) s; report ready ([0-9.]+) s",
                                     [{capture, all_but_first, list}]),
            {list_to_float(A), list_to_float(B)};
        [] ->
            {0.0, 0.0}
    end.

is_prefix(P, B) ->
    binary:longest_common_prefix([P, B]) =:= byte_size(P).

chunks([], _) -> [];
chunks(L, K) when length(L) =< K -> [L];
chunks(L, K) -> {A, B} = lists:split(K, L), [A | chunks(B, K)].

available_mb() ->
    {ok, Bin} = file:read_file("/proc/meminfo"),
    {match, [Kb]} = re:run(Bin, "MemAvailable:\\s+(\\d+)", [{capture, all_but_first, list}]),
    list_to_integer(Kb) div 1024.

env(K, Default) ->
    case os:getenv(K) of
        false -> Default;
        "" -> Default;
        V -> V
    end.

halt_with(Msg) ->
    io:format(standard_error, "bench/cluster.escript: ~s~n", [Msg]),
    halt(2).
