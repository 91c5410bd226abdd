#!/usr/bin/env escript
%% -*- erlang -*-
%%%
%%% How long `beamdiag diagnose' takes on a node in trouble, against the
%%% target: the window plus 2 s.
%%%
%%% For each lab scenario (a plain NIF that never yields, the same NIF
%%% 100 ms at a time, a flooded mailbox, a CPU-bound node under a 0.2-CPU
%%% quota, a saturated lock-counting node with one hot ETS table) a lab
%%% node is started on this host and left to settle for 2 s (a fresh one per
%%% try for the flood, whose sender stops at its cap), then the built
%%% escript runs `beamdiag diagnose NODE --json --duration W' as a separate
%%% OS process, as a user would, BENCH_SICK_TRIES times. Printed per try:
%%% the command's wall time from its start to its exit, the same less the
%%% escript's own start-up (measured once, as `beamdiag --help'), the
%%% same less the escript's start-up measured beside the scenario's node
%%% (median of three; a node that fills the host's CPUs slows every VM's
%%% start), the target, the exit code, whether the report was host-only or partial,
%%% and the findings at warning or above. A scenario the host cannot run
%%% (no lock-counting emulator, no cgroup to write) is skipped with the
%%% lab's reason.
%%%
%%% Every lab node is stopped after its scenario (the lab kills the stuck
%%% ones with SIGKILL); the nodes are this VM's peers and die with it.
%%%
%%% A scenario is a lab scenario's name, or a name and a variation as
%%% `beamdiag lab NAME --vary' takes it: `ets_hot:writers=64,table=bag'.
%%% Each try is right when the report names one of the causes expected of
%%% the scenario (EXPECT below) at warning or above, and on time when its
%%% own ready time is within the window plus 2 s; the last two columns
%%% count both over the tries. For a lock scenario the table's own wait
%%% share is read from the node's lock counters around each try, apart from
%%% beamdiag (the raw signal: `wait%'; 100% is one thread waiting the whole
%%% span), beside the finding's.
%%%
%%% Run from the repository root after `rebar3 escriptize':
%%%   bench/sick_latency.escript
%%% Environment: BENCH_SICK_WINDOW (6, seconds), BENCH_SICK_TRIES (3),
%%% BENCH_SICK_SCENARIOS ("nif_stuck nif_long mailbox_flood cpu_throttling
%%% ets_hot"), BENCH_SICK_OTP (the release the lab nodes run: this VM's, or
%%% 27 or 29 from the Debian roots scripts/otp-root.sh builds),
%%% BENCH_SICK_HOST_LOAD (0: CPUs that other processes of the host keep
%%% busy, shell loops at normal priority, for the whole run).
-mode(compile).

%% What a right report names, at warning or above (one of).
-define(EXPECT, #{nif_stuck => [scheduler_held_native],
                  nif_long => [long_schedule, scheduler_held_native],
                  mailbox_flood => [message_queue_growth],
                  cpu_throttling => [cpu_throttling],
                  ets_hot => [ets_contention]}).

main(_) ->
    Window = list_to_integer(env("BENCH_SICK_WINDOW", "6")),
    Tries = list_to_integer(env("BENCH_SICK_TRIES", "3")),
    Scenarios = string:lexemes(env("BENCH_SICK_SCENARIOS",
                                   "nif_stuck nif_long mailbox_flood cpu_throttling ets_hot"), " "),
    Exe = filename:absname("_build/default/bin/beamdiag"),
    LabOpts = lab_opts(env("BENCH_SICK_OTP", erlang:system_info(otp_release))),
    filelib:is_regular(Exe) orelse halt_with("build the escript first: rebar3 escriptize"),
    true = code:add_patha(filename:absname("_build/default/lib/beamdiag/ebin")),
    {ok, _} = net_kernel:start(list_to_atom("bds_bench_" ++ os:getpid()), #{name_domain => shortnames}),
    HostLoad = list_to_integer(env("BENCH_SICK_HOST_LOAD", "0")),
    Burners = [open_port({spawn, "sh -c 'while :; do :; done'"}, []) || _ <- lists:seq(1, HostLoad)],
    {BootMs, _} = run(Exe ++ " --help"),
    io:format("beamdiag sick-node latency: lab nodes on OTP ~s, window ~b s, target ~b s from the "
              "call; escript start-up ~b ms; host ~b CPUs, ~b kept busy besides, load ~s~n",
              [maps:get(release, LabOpts), Window, Window + 2, BootMs,
               erlang:system_info(logical_processors), HostLoad, load()]),
    io:format("~-50s ~4s ~8s ~10s ~7s ~5s ~10s ~6s ~6s  ~s~n",
              ["scenario", "try", "wall s", "-loaded", "ready", "exit", "report", "wait%",
               "right", "findings"]),
    Rows = lists:append([scenario(S, Window, Tries, Exe, BootMs, maps:remove(release, LabOpts))
                         || S <- Scenarios]),
    [begin
         {_, OsPid} = erlang:port_info(B, os_pid),
         _ = os:cmd("kill " ++ integer_to_list(OsPid))
     end || B <- Burners],
    io:format("~nright and on time (window + 2 s, the report's own ready time):~n"),
    [io:format("  ~-50s right ~b/~b, on time ~b/~b, both ~b/~b~n",
               [S, length([x || {S2, R, _} <- Rows, S2 =:= S, R]), N,
                length([x || {S2, _, T} <- Rows, S2 =:= S, T]), N,
                length([x || {S2, R, T} <- Rows, S2 =:= S, R, T]), N])
     || S <- lists:usort([S || {S, _, _} <- Rows]),
        N <- [length([x || {S2, _, _} <- Rows, S2 =:= S])]],
    ok.

%% How the lab nodes are started: this VM's erl, or the Debian root's
%% (built once by scripts/otp-root.sh, which says why when it cannot).
lab_opts(Rel) ->
    Own = erlang:system_info(otp_release),
    case {Rel, lists:keyfind(Rel, 1, [{"27", "trixie"}, {"29", "sid"}])} of
        {Own, _} ->
            #{release => Own};
        {_, {_, Suite}} ->
            Script = filename:absname("scripts/otp-root.sh"),
            case os:cmd(Script ++ " " ++ Suite ++ " >/dev/null 2>&1; echo $?") of
                "0\n" -> #{release => Rel,
                           exec => {filename:absname("scripts/otp-run.sh"), [Suite, "erl"]}};
                _ -> halt_with("cannot build the OTP " ++ Rel ++ " root: run " ++ Script ++ " " ++ Suite)
            end;
        _ ->
            halt_with("BENCH_SICK_OTP: " ++ Rel ++ " is not this VM's release, 27 or 29")
    end.

%% The flood's sender stops at its cap (14 million messages) within a
%% window or two, so each of its tries gets a fresh lab node; the others
%% are tried back to back on one node. A spec is NAME or NAME:VARIATION.
scenario(Spec, Window, Tries, Exe, BootMs, LabOpts) ->
    {Name, Vary} = case string:split(Spec, ":") of
                       [N] -> {list_to_atom(N), #{}};
                       [N, V] ->
                           {ok, Sc} = beamdiag_lab:scenario(N),
                           case beamdiag_lab:parse_variation(Sc, V) of
                               {ok, Map} -> {list_to_atom(N), Map};
                               {error, {M, Why}} -> halt_with(M:format_error(Why))
                           end
                   end,
    Opts = LabOpts#{vary => Vary, spec => Spec},
    lists:append(
      case Name of
          mailbox_flood -> [run_scenario(Name, Window, Exe, BootMs, Opts, [K]) || K <- lists:seq(1, Tries)];
          _ -> [run_scenario(Name, Window, Exe, BootMs, Opts, lists:seq(1, Tries))]
      end).

run_scenario(Name, Window, Exe, BootMs, Opts, Ks) ->
    {Spec, LabOpts} = maps:take(spec, Opts),
    case beamdiag_lab:start(Name, LabOpts#{duration => 600}) of
        {ok, Lab} ->
            try
                timer:sleep(2000),
                Cookie = atom_to_list(beamdiag_lab:cookie(Lab)),
                true = erlang:set_cookie(beamdiag_lab:node(Lab), beamdiag_lab:cookie(Lab)),
                %% The escript's start-up beside this node (its median of
                %% three): a node that fills the host's CPUs slows every
                %% VM's start, and that is not the diagnosis' time.
                Loaded = lists:nth(2, lists:sort([element(1, run(Exe ++ " --help"))
                                                  || _ <- [1, 2, 3]])),
                %% Back to back, as a user would retry: a session waits for
                %% the previous one's agent to remove its modules.
                [one({Name, Spec}, K, Window, Exe, {BootMs, Loaded}, beamdiag_lab:node(Lab), Cookie)
                 || K <- Ks]
            after
                beamdiag_lab:stop(Lab)
            end;
        {error, {M, Why}} ->
            io:format("~-50s skipped: ~ts~n", [Spec, M:format_error(Why)]),
            []
    end.

one({Name, Spec}, K, Window, Exe, {_BootMs, LoadedMs}, NodeAtom, Cookie) ->
    Node = atom_to_list(NodeAtom),
    Before = lock_reading(NodeAtom, Name),
    Cmd = lists:flatten(io_lib:format("BEAMDIAG_COOKIE=~s ~s diagnose ~s --json --duration ~b "
                                      "2>/dev/null; echo \"exit=$?\"",
                                      [Cookie, Exe, Node, Window])),
    {Ms, Out} = run(Cmd),
    Wait = table_wait(Before, lock_reading(NodeAtom, Name)),
    [Json | _] = string:split(Out, "exit=", trailing),
    Code = lists:last(string:lexemes(Out, "=\n")),
    Kind = case {string:find(Json, "\"host_only\":true"), string:find(Json, "\"complete\":false")} of
               {nomatch, nomatch} -> "complete";
               {nomatch, _} -> "partial";
               _ -> "host-only"
           end,
    Serious = serious(Json),
    Right = lists:any(fun(E) -> lists:member(atom_to_list(E), Serious) end,
                      maps:get(Name, ?EXPECT, [])),
    Ready = ready(Json),
    OnTime = Ready =/= "-" andalso list_to_float(Ready) =< Window + 2,
    io:format("~-50s ~4b ~8.2f ~10.2f ~7s ~5s ~10s ~6s ~6s  ~ts~n",
              [Spec, K, Ms / 1000, (Ms - LoadedMs) / 1000, Ready, Code, Kind, Wait,
               case {Right, OnTime} of {true, true} -> "yes"; {true, false} -> "late"; _ -> "NO" end,
               lists:join(",", Serious)]),
    {Spec, Right, OnTime}.

%% The node's lock counters, read apart from beamdiag (erpc, as any tool
%% would), for a lock scenario; its table's wait share of the span between
%% two readings, in percent of one thread's time.
lock_reading(Node, ets_hot) ->
    try erpc:call(Node, erts_debug, lcnt_collect, [], 20000) catch _:_ -> none end;
lock_reading(_Node, _Name) ->
    none.

table_wait(none, _) -> "-";
table_wait(_, none) -> "-";
table_wait(Before, After) ->
    Sum = fun(R) ->
              {S, Ns} = proplists:get_value(duration, R),
              W = lists:sum([WS * 1000000000 + WNs
                             || {_, beamdiag_hot_table, _, Stats} <- proplists:get_value(locks, R),
                                {_, {_, _, {WS, WNs, _}}, _} <- Stats]),
              {S * 1000000000 + Ns, W}
          end,
    {D0, W0} = Sum(Before),
    {D1, W1} = Sum(After),
    case D1 > D0 of
        true -> io_lib:format("~.1f", [100 * (W1 - W0) / (D1 - D0)]);
        false -> "-"
    end.

%% The report's own figure: wall seconds from the call (after the
%% escript's start-up) to the diagnosis, before its output is written.
ready(Json) ->
    case re:run(Json, "\"ready_s\":([0-9.]+)", [{capture, [1], list}]) of
        {match, [S]} -> io_lib:format("~.2f", [list_to_float(S)]);
        nomatch -> "-"
    end.

%% The ids of the findings at warning or critical, read from the JSON text.
serious(Json) ->
    case re:run(Json, "\"id\":\"([a-z_]+)\"(?:,\"metrics\":\\{[^{}]*\\})?,"
                      "\"severity\":\"(critical|warning)\"",
                [global, {capture, [1], list}]) of
        {match, Ids} -> lists:usort([Id || [Id] <- Ids]);
        nomatch -> ["none"]
    end.

run(Cmd) ->
    T0 = erlang:monotonic_time(millisecond),
    Out = os:cmd(Cmd),
    {erlang:monotonic_time(millisecond) - T0, Out}.

load() ->
    case file:read_file("/proc/loadavg") of
        {ok, B} -> hd(string:lexemes(binary_to_list(B), " "));
        _ -> "?"
    end.

env(Name, Default) ->
    case os:getenv(Name) of
        false -> Default;
        "" -> Default;
        V -> V
    end.

halt_with(Text) ->
    io:format(standard_error, "~s~n", [Text]),
    halt(2).
