#!/usr/bin/env escript
%%! +sbwt none +sbwtdcpu none +sbwtdio none
%% Folding speed on a large real capture, and side by side with another
%% build.
%%
%% Records a real BEAM node (+JPperf true; the atom_decode and erlang_cpu
%% lab workloads) with perf at 999 Hz: frame-pointer call chains (long
%% stacks, mostly unique: the folder's worst case) in 30 s recordings until
%% there are 90 MB of text or four recordings, and 10 s of DWARF call
%% chains (short, repeating stacks). All of it is real text: nothing is
%% repeated (repeats would flatter the folder's caches). Then folds it and
%% prints MB/s of wall time and MB per CPU second (the VM's CPU time, all
%% its threads): one worker in a VM that `taskset' pins to CPU 0 (the
%% reader, the worker, file I/O and garbage collection share that core),
%% and one worker per core in a VM that is not pinned. Each figure is the
%% best of three folds in a fresh VM, with the VM flags of the beamdiag
%% escript (no busy-waiting schedulers). CPU time is the VM's threads' time
%% on a CPU (/proc/self/task/*/schedstat), kernel time included; on a
%% host shared with other work, wall time is the longer by the time the
%% VM waited for a CPU, and each round prints the load average.
%%
%% Side by side: with BENCH_FOLD_BASE set, the same capture is folded by
%% that build too, alternately with this one, BENCH_FOLD_ROUNDS rounds
%% (default 3), and the bench prints each round's ratio (this build's MB/s
%% over the base's, so ratios above 1 mean this build is faster), the
%% best of the rounds for each build, and whether the two builds gave the
%% same folded stacks. BENCH_FOLD_BASE is a directory of compiled modules
%% or a git revision of this repository (its src/profile/beamdiag_fold*.erl
%% are compiled into a temporary directory).
%%
%% A native folder to compare with: none is packaged for Debian or npm
%% (flamegraph.pl's stackcollapse-perf.pl and inferno are not), so none
%% is installed; with BENCH_FOLD_NATIVE set to a command (for example
%% inferno-collapse-perf), the bench also times that command on the
%% capture, pinned to one core, its output thrown away, best of three.
%%
%% Needs root (or perf_event_paranoid <= 1) to record, and `rebar3 compile'.
%%
%% Usage: bench/fold_bench.escript [CAPTURE_FILE]
%%   with a file: folds that file instead of recording one.
%% Environment: BENCH_FOLD_BASE (revision or directory), BENCH_FOLD_ROUNDS,
%% BENCH_FOLD_NATIVE (a command).
-mode(compile).

-define(TRIES, 3).

main(["--child", Ebin, Workers, File]) ->
    %% One measurement, in a VM of its own: best of ?TRIES folds.
    true = code:add_patha(Ebin),
    child(File, list_to_integer(Workers));
main(Args) ->
    Ebin = ebin(),
    true = code:add_patha(Ebin),
    File = case Args of
        [F] -> F;
        [] -> make_capture(Ebin)
    end,
    Size = filelib:file_size(File),
    io:format("capture: ~s, ~.1f MB~n", [File, Size / 1.0e6]),
    Rounds = list_to_integer(os:getenv("BENCH_FOLD_ROUNDS", "3")),
    Builds = case os:getenv("BENCH_FOLD_BASE", "") of
        "" -> [{this, Ebin}];
        Base -> [{this, Ebin}, {base, base_ebin(Base)}]
    end,
    Results = [bench_round(R, File, Size, Builds) || R <- lists:seq(1, Rounds)],
    report(Results, Size, Builds),
    native(os:getenv("BENCH_FOLD_NATIVE", ""), File, Size),
    %% The base's modules compiled here are removed; a recorded capture is
    %% kept (its path is printed) to fold again.
    [file:del_dir_r(Dir) || {base, Dir} <- Builds, lists:prefix("/tmp/beamdiag_fold_base_", Dir)],
    ok.

ebin() ->
    filename:absname(filename:join([filename:dirname(escript:script_name()), "..", "_build",
                                    "default", "lib", "beamdiag", "ebin"])).

%%% Side by side

%% One round: each build, one core then two, in alternating order so that
%% neither build always runs first.
bench_round(R, File, Size, Builds) ->
    io:format("round ~b: load average ~s~n", [R, load()]),
    Order = case R rem 2 of
        1 -> Builds;
        0 -> lists:reverse(Builds)
    end,
    Rs = [{{Name, Mode}, measure(Mode, Dir, File)} || {Name, Dir} <- Order, Mode <- [one, two]],
    [io:format("round ~b: ~-4s ~s: ~.1f MB/s wall, ~.1f MB per CPU second~n",
               [R, Name, mode(Mode), mbs(Size, Ms), mbs(Size, Cpu)])
     || {{Name, Mode}, #{ms := Ms, cpu_ms := Cpu}} <- Rs],
    case Builds of
        [_, _] ->
            [io:format("round ~b: ~s: this / base = ~.2f~n",
                       [R, mode(Mode), ratio(Rs, Mode)]) || Mode <- [one, two]];
        _ ->
            ok
    end,
    maps:from_list(Rs).

ratio(Rs, Mode) ->
    #{ms := This} = proplists:get_value({this, Mode}, Rs),
    #{ms := Base} = proplists:get_value({base, Mode}, Rs),
    Base / max(This, 1).

report(Results, Size, Builds) ->
    [begin
         Best = lists:min([maps:get(ms, maps:get({Name, Mode}, R)) || R <- Results]),
         BestCpu = lists:min([maps:get(cpu_ms, maps:get({Name, Mode}, R)) || R <- Results]),
         io:format("best of ~b rounds: ~-4s ~s: ~.1f MB/s wall, ~.1f MB per CPU second~n",
                   [length(Results), Name, mode(Mode), mbs(Size, Best), mbs(Size, BestCpu)])
     end || {Name, _} <- Builds, Mode <- [one, two]],
    #{digest := D, summary := S} = maps:get({this, one}, hd(Results)),
    io:format("~b samples, ~b distinct stacks, [unknown] in ~.1f% of samples~n",
              [maps:get(samples, S), maps:get(distinct_stacks, S),
               100 * maps:get(unknown_share, S)]),
    Digests = lists:usort([maps:get(digest, X) || R <- Results, X <- maps:values(R)]),
    case {Builds, Digests} of
        {[_, _], [D]} -> io:format("same folded stacks from both builds in every run~n");
        {[_, _], _} -> io:format("THE BUILDS' FOLDED STACKS DIFFER~n");
        {_, [D]} -> ok;
        _ -> io:format("THE RUNS' FOLDED STACKS DIFFER~n")
    end.

load() ->
    case file:read_file("/proc/loadavg") of
        {ok, L} -> lists:join(" ", lists:sublist(string:lexemes(binary_to_list(L), " "), 3));
        _ -> "unknown"
    end.

%% A native folder, for comparison: the wall time of the command on the
%% capture, pinned to CPU 0, output to /dev/null, best of three.
native("", _File, _Size) ->
    ok;
native(Cmd, File, Size) ->
    Sh = "taskset -c 0 " ++ Cmd ++ " '" ++ File ++ "' > /dev/null",
    Ms = lists:min([begin
                        T0 = erlang:monotonic_time(millisecond),
                        _ = os:cmd(Sh),
                        erlang:monotonic_time(millisecond) - T0
                    end || _ <- lists:seq(1, ?TRIES)]),
    io:format("native folder (~s), one core: ~.1f MB/s wall~n", [Cmd, mbs(Size, Ms)]).

mode(one) -> "one worker, one core (taskset -c 0)";
mode(two) -> "one worker per core                ".

mbs(Size, Ms) ->
    Size / 1.0e6 / (max(Ms, 1) / 1000).

%% A fresh VM for each measurement: `taskset' pins the one-core one.
measure(Mode, Dir, File) ->
    Escript = os:find_executable("escript"),
    Args = [escript:script_name(), "--child", Dir, workers(Mode), File],
    {Exe, Argv} = case Mode of
        one ->
            case os:find_executable("taskset") of
                false -> error(taskset_not_found);
                T -> {T, ["-c", "0", Escript | Args]}
            end;
        two ->
            {Escript, Args}
    end,
    Port = open_port({spawn_executable, Exe},
                     [{args, Argv}, exit_status, binary, stderr_to_stdout]),
    Out = collect(Port, <<>>),
    case binary:split(Out, <<"RESULT ">>) of
        [_, Term] ->
            {ok, Tokens, _} = erl_scan:string(binary_to_list(Term)),
            {ok, Result} = erl_parse:parse_term(Tokens),
            Result;
        _ ->
            error({child_failed, Out})
    end.

workers(one) -> "1";
workers(two) -> integer_to_list(erlang:system_info(schedulers_online)).

collect(Port, Acc) ->
    receive
        {Port, {data, D}} -> collect(Port, <<Acc/binary, D/binary>>);
        {Port, {exit_status, _}} -> Acc
    end.

child(File, Workers) ->
    Rs = [once(File, Workers) || _ <- lists:seq(1, ?TRIES)],
    {Ms, _, P} = lists:min(Rs),
    Cpu = lists:min([C || {_, C, _} <- Rs]),
    %% The folded stacks, in an order that does not depend on the fold.
    Digest = erlang:phash2(lists:sort(maps:to_list(maps:get(stacks, P)))),
    Result = #{ms => Ms, cpu_ms => Cpu, digest => Digest, summary => beamdiag_fold:summary(P)},
    io:format("RESULT ~w.~n", [Result]).

once(File, Workers) ->
    erlang:garbage_collect(),
    C0 = cpu_ms(),
    T0 = erlang:monotonic_time(millisecond),
    {ok, P} = beamdiag_fold:fold_file(File, #{workers => Workers}),
    T1 = erlang:monotonic_time(millisecond),
    C1 = cpu_ms(),
    {T1 - T0, C1 - C0, P}.

%% The CPU time of all the VM's threads, kernel time included
%% (`statistics(runtime)' leaves the kernel's out: page faults, reads).
cpu_ms() ->
    {ok, Tasks} = file:list_dir("/proc/self/task"),
    Ns = lists:sum([case file:read_file("/proc/self/task/" ++ T ++ "/schedstat") of
                        {ok, B} -> binary_to_integer(hd(binary:split(B, <<" ">>)));
                        _ -> 0
                    end || T <- Tasks]),
    Ns div 1000000.

%% The base build's modules: a directory, or a revision's fold modules
%% compiled into a temporary one.
base_ebin(Base) ->
    case filelib:is_file(filename:join(Base, "beamdiag_fold.beam")) of
        true ->
            filename:absname(Base);
        false ->
            Repo = filename:join(filename:dirname(escript:script_name()), ".."),
            Dir = filename:join("/tmp", "beamdiag_fold_base_" ++ os:getpid()),
            ok = filelib:ensure_dir(filename:join(Dir, "x")),
            Files = string:lexemes(git(Repo, ["ls-tree", "--name-only", Base, "src/profile/"]),
                                   "\n"),
            Fold = [F || F <- Files, lists:prefix("src/profile/beamdiag_fold", F)],
            Fold =/= [] orelse error({no_fold_modules_at, Base}),
            [begin
                 Src = filename:join(Dir, filename:basename(F)),
                 ok = file:write_file(Src, git(Repo, ["show", Base ++ ":" ++ F])),
                 {ok, _} = compile:file(Src, [{outdir, Dir}, report_errors])
             end || F <- Fold],
            io:format("base: ~s (~b fold modules compiled in ~s)~n", [Base, length(Fold), Dir]),
            Dir
    end.

git(Repo, Args) ->
    Port = open_port({spawn_executable, os:find_executable("git")},
                     [{args, ["-C", Repo | Args]}, exit_status, binary]),
    binary_to_list(collect(Port, <<>>)).

%%% Recording

make_capture(Ebin) ->
    Dir = filename:join("/tmp", "beamdiag_fold_bench_" ++ os:getpid()),
    ok = filelib:ensure_dir(filename:join(Dir, "x")),
    {ok, Peer, _} = peer:start_link(#{connection => standard_io,
                                      args => ["+JPperf", "true", "-pa", Ebin]}),
    {ok, _} = peer:call(Peer, beamdiag_lab_cache, start,
                        [atom_decode, #{duration => 300, workers => 1, owner => undefined}]),
    {ok, _} = peer:call(Peer, beamdiag_lab_cache, start,
                        [erlang_cpu, #{duration => 300, workers => 2, owner => undefined}]),
    OsPid = list_to_integer(peer:call(Peer, os, getpid, [])),
    timer:sleep(1000),
    Fp = record_fp(OsPid, Dir, 1, 0, []),
    Dwarf = record(OsPid, Dir, "dwarf", dwarf, 10),
    peer:stop(Peer),
    Out = filename:join(Dir, "capture.txt"),
    {ok, Fd} = file:open(Out, [write, raw, binary]),
    [begin {ok, B} = file:read_file(T), ok = file:write(Fd, B) end || T <- Fp ++ [Dwarf]],
    ok = file:close(Fd),
    Out.

%% 30 s recordings of frame-pointer chains until 90 MB of text, at most
%% four: a loaded host records fewer samples.
record_fp(OsPid, Dir, N, Bytes, Acc) when N =< 4, Bytes < 90000000 ->
    S = record(OsPid, Dir, "fp" ++ integer_to_list(N), fp, 30),
    record_fp(OsPid, Dir, N + 1, Bytes + filelib:file_size(S), [S | Acc]);
record_fp(_OsPid, _Dir, _N, _Bytes, Acc) ->
    lists:reverse(Acc).

record(OsPid, Dir, Name, CG, Secs) ->
    D = filename:join(Dir, Name),
    %% 16 KiB of stack per DWARF sample: 64 KiB at 999 Hz on two busy
    %% threads reaches perf's 512 MiB cap in seconds.
    {ok, #{script := S}} = beamdiag_perf:record(
        OsPid, #{duration => Secs, frequency => 999, call_graph => CG, dir => D,
                 dwarf_stack => 16384}),
    io:format("recorded ~s (~s, ~b s): ~.1f MB of perf script text~n",
              [Name, CG, Secs, filelib:file_size(S) / 1.0e6]),
    S.
