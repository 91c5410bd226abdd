#!/usr/bin/env escript
%% Overhead of the Erlang-level sampler on a CPU-bound node.
%%
%% Starts a peer node whose schedulers are kept busy by CPU-bound Erlang
%% processes (the erlang_cpu lab scenario: sorting, small maps) that count
%% their work, then
%% alternates windows without and with beamdiag_agent_sampler running on that
%% node, and prints the throughput ratio. Needs `rebar3 compile'.
%%
%% Usage: bench/sampler_overhead.escript [SECONDS_PER_WINDOW] [PAIRS] [HZ]
-mode(compile).

main(Args) ->
    Ebin = filename:join([filename:dirname(escript:script_name()), "..", "_build", "default",
                          "lib", "beamdiag", "ebin"]),
    true = code:add_patha(Ebin),
    [Secs, Pairs, Hz] = case [list_to_integer(A) || A <- Args] of
        [S, P, H] -> [S, P, H];
        [S, P] -> [S, P, 97];
        [S] -> [S, 4, 97];
        [] -> [3, 4, 97]
    end,
    {ok, Peer, _} = peer:start_link(#{connection => standard_io, args => ["-pa", Ebin]}),
    run(Peer, Secs, Pairs, Hz),
    peer:stop(Peer).

run(Peer, Secs, Pairs, Hz) ->
    Workers = peer:call(Peer, erlang, system_info, [schedulers_online]) * 2,
    {ok, _} = peer:call(Peer, beamdiag_lab_cache, start,
                        [erlang_cpu, #{duration => 600, workers => Workers, owner => undefined}]),
    timer:sleep(1000),
    Rounds = [begin
                  Off = window(Peer, Secs, off, Hz),
                  On = window(Peer, Secs, on, Hz),
                  io:format("pair ~b: without ~.1f ops/s, with sampler ~.1f ops/s (~.2f%)~n",
                            [I, Off, On, 100 * (On / Off - 1)]),
                  {Off, On}
              end || I <- lists:seq(1, Pairs)],
    ok = peer:call(Peer, beamdiag_lab_cache, stop, [erlang_cpu]),
    SumOff = lists:sum([O || {O, _} <- Rounds]),
    SumOn = lists:sum([O || {_, O} <- Rounds]),
    io:format("sampler at ~b Hz on ~b busy processes: throughput with/without = ~.4f "
              "(overhead ~.2f%)~n", [Hz, Workers, SumOn / SumOff, 100 * (1 - SumOn / SumOff)]),
    %% The sampler's own CPU time, on a quiet node with many idle processes.
    N = 20000,
    cpu_cost(Peer, Secs, Hz, N).

cpu_cost(Peer, Secs, Hz, N) ->
    Pids = [peer:call(Peer, erlang, spawn, [timer, sleep, [infinity]]) || _ <- lists:seq(1, N)],
    {R0, _} = peer:call(Peer, erlang, statistics, [runtime]),
    timer:sleep(Secs * 1000),
    {R1, _} = peer:call(Peer, erlang, statistics, [runtime]),
    #{samples := S, looked_at := L, ticks := T} =
        peer:call(Peer, beamdiag_agent_sampler, run, [#{duration => Secs, frequency => Hz}], (Secs + 30) * 1000),
    {R2, _} = peer:call(Peer, erlang, statistics, [runtime]),
    [peer:call(Peer, erlang, exit, [P, kill]) || P <- Pids],
    Base = (R1 - R0) / Secs,
    With = (R2 - R1) / Secs,
    io:format("sampler CPU on a quiet node with ~b idle processes: ~.1f ms CPU per second "
              "(~.1f without), ~b ticks, ~b processes looked at, ~b samples~n",
              [N, With, Base, T, L, S]).

window(Peer, Secs, Mode, Hz) ->
    Before = peer:call(Peer, beamdiag_lab_cache, ops, [erlang_cpu]),
    T0 = erlang:monotonic_time(microsecond),
    case Mode of
        off -> timer:sleep(Secs * 1000);
        on -> _ = peer:call(Peer, beamdiag_agent_sampler, run, [#{duration => Secs, frequency => Hz}],
                            (Secs + 30) * 1000)
    end,
    After = peer:call(Peer, beamdiag_lab_cache, ops, [erlang_cpu]),
    (After - Before) / ((erlang:monotonic_time(microsecond) - T0) / 1.0e6).
