#!/usr/bin/env escript
%% -*- erlang -*-
%%%
%%% How long `beamdiag diagnose' takes on a node in trouble, against the
%%% target: the window plus 2 s; and whether the report is right.
%%%
%%% For each lab scenario of the list below (scenarios/0: the scenario, the
%%% finding a right report has at warning or above, and the text it must
%%% hold; kept as data, one line a scenario) a lab node is started on this
%%% host and left to settle for 2 s (a fresh one per try for the flood,
%%% whose sender stops at its cap), then the built escript runs `beamdiag
%%% diagnose NODE --json --duration W' as a separate OS process, as a user
%%% would, BENCH_SICK_TRIES times. Printed per try: the command's wall time
%%% from its start to its exit, the same less the escript's own start-up
%%% (measured once, as `beamdiag --help'), the same less the escript's
%%% start-up measured beside the scenario's node (median of three; a node
%%% that fills the host's CPUs slows every VM's start), the report's own
%%% ready_s, the target, the exit code, whether the report was host-only or
%%% partial, the findings at warning or above, and whether it was right
%%% (the expected finding, with its text) and on time (ready_s within the
%%% window plus 2 s). Then one line a scenario: right and on time N of
%%% tries, and the range of ready_s. A scenario the host cannot run (no
%%% lock-counting emulator, no cgroup to write) is skipped with the lab's
%%% reason.
%%%
%%% Every lab node is stopped after its scenario (the lab kills the stuck
%%% ones with SIGKILL); the nodes are this VM's peers and die with it.
%%%
%%% Run from the repository root after `rebar3 escriptize':
%%%   bench/sick_latency.escript
%%% Environment: BENCH_SICK_WINDOW (6, seconds), BENCH_SICK_TRIES (3),
%%% BENCH_SICK_SCENARIOS (every scenario of the list, or some of them,
%%% separated by spaces or commas), BENCH_SICK_OTP (the release the lab
%%% nodes run: this VM's, or 27 or 29 from the Debian roots
%%% scripts/otp-root.sh builds).
-mode(compile).

%% The scenarios: the lab scenario, the finding a right report names at
%% warning or above, and text the report must hold (the native symbol, the
%% call). `fresh': a fresh lab node for each try.
scenarios() ->
    [#{name => nif_stuck, expect => scheduler_held_native, text => "beamdiag_lab_spin_slice"},
     #{name => nif_long, expect => long_schedule},
     #{name => mailbox_flood, expect => message_queue_growth, fresh => true},
     #{name => cpu_throttling, expect => cpu_throttling},
     #{name => ets_hot, expect => ets_contention},
     #{name => nif_held, expect => scheduler_held_native, text => "beamdiag_lab_spin_slice"},
     #{name => dirty_io_blocked, expect => dirty_io_blocked, text => "openat(2) of"},
     #{name => dirty_io_blocked_sdio4, expect => dirty_io_blocked, text => "openat(2) of"},
     #{name => dirty_io_blocked_cold, expect => dirty_io_blocked, text => "openat(2) of"}].

main(_) ->
    Window = list_to_integer(env("BENCH_SICK_WINDOW", "6")),
    Tries = list_to_integer(env("BENCH_SICK_TRIES", "3")),
    All = scenarios(),
    Names = string:lexemes(env("BENCH_SICK_SCENARIOS",
                               lists:join(" ", [atom_to_list(N) || #{name := N} <- All])), " ,"),
    Chosen = [case [S || S = #{name := N} <- All, atom_to_list(N) =:= Name] of
                  [S] -> S;
                  [] -> halt_with("BENCH_SICK_SCENARIOS: no scenario " ++ Name)
              end || Name <- Names],
    Exe = filename:absname("_build/default/bin/beamdiag"),
    LabOpts = lab_opts(env("BENCH_SICK_OTP", erlang:system_info(otp_release))),
    filelib:is_regular(Exe) orelse halt_with("build the escript first: rebar3 escriptize"),
    true = code:add_patha(filename:absname("_build/default/lib/beamdiag/ebin")),
    {ok, _} = net_kernel:start(list_to_atom("bds_bench_" ++ os:getpid()), #{name_domain => shortnames}),
    {BootMs, _} = run(Exe ++ " --help"),
    io:format("beamdiag sick-node latency: lab nodes on OTP ~s, window ~b s, target ~b s from the "
              "call; escript start-up ~b ms; host ~b CPUs, load ~s~n",
              [maps:get(release, LabOpts), Window, Window + 2, BootMs,
               erlang:system_info(logical_processors), load()]),
    io:format("~-22s ~4s ~8s ~10s ~10s ~7s ~7s ~5s ~10s ~6s  ~s~n",
              ["scenario", "try", "wall s", "-start-up", "-loaded", "ready", "target", "exit",
               "report", "right", "findings"]),
    Results = [{S, scenario(S, Window, Tries, Exe, BootMs, maps:remove(release, LabOpts))}
               || S <- Chosen],
    io:format("~nsummary (OTP ~s, window ~b s, target ~b s):~n", [maps:get(release, LabOpts),
                                                                Window, Window + 2]),
    [summary(S, Rs, Window) || {S, Rs} <- Results],
    ok.

%% Right and on time, of the tries, and the range of ready_s.
summary(#{name := Name}, [], _Window) ->
    io:format("~-22s skipped~n", [Name]);
summary(#{name := Name, expect := Expect}, Rs, Window) ->
    Ready = [R || #{ready := R} <- Rs, is_float(R)],
    Ok = length([x || #{right := true, ready := R} <- Rs, is_float(R), R =< Window + 2]),
    io:format("~-22s ~s: right ~b/~b, on time ~b/~b, right and on time ~b/~b; ready ~s~n",
              [Name, Expect, length([x || #{right := true} <- Rs]), length(Rs),
               length([x || R <- Ready, R =< Window + 2]), length(Rs), Ok, length(Rs),
               case Ready of
                   [] -> "-";
                   _ -> io_lib:format("~.2f-~.2f s", [lists:min(Ready), lists:max(Ready)])
               end]).

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
%% are tried back to back on one node.
scenario(S = #{fresh := true}, Window, Tries, Exe, BootMs, LabOpts) ->
    lists:append([scenario(S, Window, Tries, Exe, BootMs, LabOpts, [K]) || K <- lists:seq(1, Tries)]);
scenario(S, Window, Tries, Exe, BootMs, LabOpts) ->
    scenario(S, Window, Tries, Exe, BootMs, LabOpts, lists:seq(1, Tries)).

scenario(S = #{name := Name}, Window, _Tries, Exe, BootMs, LabOpts, Ks) ->
    case beamdiag_lab:start(Name, LabOpts#{duration => 600}) of
        {ok, Lab} ->
            try
                timer:sleep(2000),
                Node = atom_to_list(beamdiag_lab:node(Lab)),
                Cookie = atom_to_list(beamdiag_lab:cookie(Lab)),
                %% The escript's start-up beside this node (its median of
                %% three): a node that fills the host's CPUs slows every
                %% VM's start, and that is not the diagnosis' time.
                Loaded = lists:nth(2, lists:sort([element(1, run(Exe ++ " --help"))
                                                  || _ <- [1, 2, 3]])),
                %% Back to back, as a user would retry: a session waits for
                %% the previous one's agent to remove its modules.
                [one(S, K, Window, Exe, {BootMs, Loaded}, Node, Cookie) || K <- Ks]
            after
                beamdiag_lab:stop(Lab)
            end;
        {error, {M, Why}} ->
            io:format("~-22s skipped: ~ts~n", [Name, M:format_error(Why)]),
            []
    end.

one(S = #{name := Name}, K, Window, Exe, {BootMs, LoadedMs}, Node, Cookie) ->
    Cmd = lists:flatten(io_lib:format("BEAMDIAG_COOKIE=~s ~s diagnose ~s --json --duration ~b "
                                      "2>/dev/null; echo \"exit=$?\"",
                                      [Cookie, Exe, Node, Window])),
    {Ms, Out} = run(Cmd),
    [Json | _] = string:split(Out, "exit=", trailing),
    Code = lists:last(string:lexemes(Out, "=\n")),
    Kind = case {string:find(Json, "\"host_only\":true"), string:find(Json, "\"complete\":false")} of
               {nomatch, nomatch} -> "complete";
               {nomatch, _} -> "partial";
               _ -> "host-only"
           end,
    Found = serious(Json),
    Right = lists:member(atom_to_list(maps:get(expect, S)), Found) andalso
        string:find(Json, maps:get(text, S, "")) =/= nomatch,
    Ready = ready(Json),
    io:format("~-22s ~4b ~8.2f ~10.2f ~10.2f ~7s ~7b ~5s ~10s ~6s  ~ts~n",
              [Name, K, Ms / 1000, (Ms - BootMs) / 1000, (Ms - LoadedMs) / 1000,
               case Ready of none -> "-"; _ -> io_lib:format("~.2f", [Ready]) end,
               Window + 2, Code, Kind, case Right of true -> "yes"; false -> "NO" end,
               lists:join(",", Found)]),
    #{right => Right, ready => Ready}.

%% The report's own figure: wall seconds from the call (after the
%% escript's start-up) to the diagnosis, before its output is written.
ready(Json) ->
    case re:run(Json, "\"ready_s\":([0-9.]+)", [{capture, [1], list}]) of
        {match, [S]} -> try list_to_float(S) catch error:badarg -> float(list_to_integer(S)) end;
        nomatch -> none
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
