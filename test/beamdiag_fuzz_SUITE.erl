%%% @doc Hostile input: generated command lines, /proc and cgroup text,
%%% perf script text and capture files.
%%%
%%% Each fuzzer is seeded (the seed is logged; set BEAMDIAG_FUZZ_SEED to
%%% replay one) and bounded in time. Inputs are random bytes, mutations of
%%% recorded fixtures (truncation, bit flips, spliced junk, duplicated and
%%% huge lines) and generated near-valid text. A parser must return a value
%%% of its documented shape and never raise; the command line must return an
%%% exit code and create no atoms.
-module(beamdiag_fuzz_SUITE).

-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0, suite/0, init_per_suite/1, end_per_suite/1,
         init_per_testcase/2, end_per_testcase/2]).
-export([cli_argv/1, proc_parsers/1, cgroup_parsers/1, vm_flags/1, perf_script/1,
         capture_files/1]).

-define(SECONDS, 12).
%% The one node name the fuzzer may produce: well formed, never running.
-define(NODE, "nosuch@localhost").
%% A run that takes longer has hung: every command the fuzzer runs ends at
%% once on bad input or an unreachable node (seconds on a loaded machine).
-define(RUN_TIMEOUT, 20000).

-spec suite() -> [tuple()].
suite() ->
    [{timetrap, {minutes, 2}}].

-spec all() -> [atom()].
all() ->
    [cli_argv, proc_parsers, cgroup_parsers, vm_flags, perf_script, capture_files].

-spec init_per_suite(list()) -> list().
init_per_suite(Config) ->
    {ok, _} = application:ensure_all_started(beamdiag),
    Config.

-spec end_per_suite(list()) -> ok.
end_per_suite(_Config) ->
    ok.

-spec init_per_testcase(atom(), list()) -> list().
init_per_testcase(_Case, Config) ->
    Seed = case os:getenv("BEAMDIAG_FUZZ_SEED") of
               false -> erlang:phash2({os:getpid(), erlang:monotonic_time()});
               S -> list_to_integer(S)
           end,
    _ = rand:seed(exsss, Seed),
    ct:log("seed ~b (replay with BEAMDIAG_FUZZ_SEED=~b)", [Seed, Seed]),
    [{seed, Seed} | Config].

-spec end_per_testcase(atom(), list()) -> ok.
end_per_testcase(_Case, _Config) ->
    ok.

%%%===================================================================
%%% Command line
%%%===================================================================

%% Random argument vectors through beamdiag_cli:run/2: an exit code every
%% time, no exception, no new atom. Commands that would start real work
%% (build an emulator, start lab nodes, run perf) are run only when their
%% arguments do not parse; their parser is fuzzed on its own.
-spec cli_argv(list()) -> term().
cli_argv(_Config) ->
    Commands = beamdiag_cli:commands(),
    Longs = lists:usort(lists:append([[L || #{long := L} <- maps:get(options, M:spec())]
                                      || {_, M, _} <- Commands])),
    Names = [N || {N, _, _} <- Commands],
    Gen = fun() -> argv(Names, Longs) end,
    %% Warm up: load every command module and start what the first runs
    %% start (distribution), so what is counted afterwards is the fuzzing.
    _ = [run_cli(A) || A <- [["diagnose", ?NODE, "--duration", "1"],
                             ["report", "/nonexistent"], ["compare", "/a", "/b"], ["--version"],
                             ["catalogue"], ["lab", "list"]] ++ [[N, "--help"] || N <- Names]],
    Atoms0 = erlang:system_info(atom_count),
    Stats = loop(?SECONDS, fun() ->
        Argv = Gen(),
        R = atoms_checked(Argv),
        case R of
            {ok, Code} when is_integer(Code), Code >= 0 -> {ran, Code};
            {parsed_only, _} = P -> P;
            {timeout, _} -> ct:fail({cli_hung, Argv, ?RUN_TIMEOUT});
            {crash, {error, {escape_in_output, Out}, _}} ->
                %% User input echoed raw to the terminal, by any command.
                ct:fail({raw_escape_in_output, Argv, Out});
            {crash, Why} -> ct:fail({cli_crash, Argv, Why})
        end
    end),
    Atoms1 = erlang:system_info(atom_count),
    ct:log("~p; atoms before ~b, after ~b", [Stats, Atoms0, Atoms1]),
    ok.

%% Runs an argument vector and checks it made no atoms. Distribution takes
%% the node name and the cookie as atoms: a run that gets as far as
%% connecting may make those two, nothing else. A run that loaded a module
%% on first use (whose own atoms are not the input's) is run again, with
%% everything loaded now, and that second run is held to the rule.
atoms_checked(Argv) ->
    A0 = erlang:system_info(atom_count),
    M0 = length(erlang:loaded()),
    R = run_cli(Argv),
    case {erlang:system_info(atom_count) - A0, length(erlang:loaded()) - M0} of
        {0, _} ->
            R;
        {_, Loaded} when Loaded > 0 ->
            A1 = erlang:system_info(atom_count),
            M1 = length(erlang:loaded()),
            R2 = run_cli(Argv),
            case {erlang:system_info(atom_count) - A1, length(erlang:loaded()) - M1} of
                {0, _} -> R2;
                {N, 0} when N =< 2 -> true = lists:member(?NODE, Argv), R2;
                {N, L} -> ct:fail({atoms_created, N, Argv, {modules_loaded, L}})
            end;
        {N, 0} when N =< 2 ->
            true = lists:member(?NODE, Argv),
            R;
        {N, 0} ->
            ct:fail({atoms_created, N, Argv})
    end.

%% Commands fuzzed through run/2 when their arguments parse.
-define(RUNNABLE, ["diagnose", "catalogue", "report", "compare"]).

run_cli([Cmd | Rest] = Argv) ->
    case lists:keyfind(Cmd, 1, beamdiag_cli:commands()) of
        {Cmd, Mod, _} ->
            Help = lists:member("--help", Rest) orelse lists:member("-h", Rest),
            case Help orelse lists:member(Cmd, ?RUNNABLE) of
                true -> run_bounded(Argv);
                false ->
                    case beamdiag_cli:parse(Mod:spec(), Rest) of
                        {ok, _} -> {parsed_only, Cmd};
                        {error, Reason} ->
                            _ = unicode:characters_to_binary(beamdiag_cli:format_error(Reason)),
                            run_bounded(Argv)
                    end
            end;
        false ->
            run_bounded(Argv)
    end;
run_cli([]) ->
    run_bounded([]).

run_bounded(Argv) ->
    Self = self(),
    %% Output must be text, and user input must not reach the terminal
    %% raw: no escape sequences.
    Sink = fun(D) ->
        case unicode:characters_to_binary(D) of
            B when is_binary(B) ->
                case binary:match(B, <<27>>) of
                    nomatch -> ok;
                    _ -> error({escape_in_output, B})
                end;
            Bad ->
                error({not_text, Bad})
        end
    end,
    IO = #{out => Sink, err => Sink, colour => false},
    {Pid, MRef} = spawn_monitor(fun() ->
        Self ! {self(), try {ok, beamdiag_cli:run(Argv, IO)}
                        catch C:R:St -> {crash, {C, R, St}} end}
    end),
    receive
        {Pid, Result} ->
            erlang:demonitor(MRef, [flush]),
            Result;
        {'DOWN', MRef, process, Pid, Why} ->
            {crash, Why}
    after ?RUN_TIMEOUT ->
        exit(Pid, kill),
        {timeout, Argv}
    end.

argv(Names, Longs) ->
    Len = rand:uniform(7) - 1,
    Head = pick([fun() -> pick(Names) end, fun() -> pick(Names) end, fun() -> pick(Names) end,
                 fun() -> junk_arg() end, fun() -> pick(["--help", "-h", "help", "--version", ""]) end]),
    [Head() | [arg(Longs) || _ <- lists:seq(1, Len)]].

arg(Longs) ->
    (pick([
        fun() -> pick(Longs) end,
        fun() -> pick(Longs) end,
        fun() -> pick(Longs) ++ "=" ++ value() end,
        fun() -> value() end,
        fun() -> value() end,
        fun() -> node_arg() end,
        fun() -> "-" ++ [rand:uniform(94) + 32] end,
        fun() -> "--" end,
        fun() -> junk_arg() end
    ]))().

value() ->
    (pick([
        fun() -> integer_to_list(rand:uniform(200000) - 100000) end,
        fun() -> float_to_list(rand:uniform() * 1.0e4 - 10, [{decimals, rand:uniform(6)}]) end,
        fun() -> pick(["0", "-0", "1e999", "NaN", "inf", "0x10", "1.", ".5", "1e3", "3600.0001",
                       "critical", "warning", "info", "none", "dwarf", "list", "99999999999999999999"]) end,
        fun() -> "/nonexistent/" ++ safe_word() end,
        fun() -> junk_arg() end
    ]))().

%% Node names that cannot start real work: malformed ones and one that no
%% epmd knows.
node_arg() ->
    pick([?NODE, "a", "@", "x@", "@y", "a@b@c", "nosuch@localhost@", "x y@localhost",
          "é@localhost", lists:duplicate(300, $a) ++ "@localhost"]).

%% Arbitrary text without '@' (so never a reachable node name): printable,
%% control characters, unicode, long.
junk_arg() ->
    N = case rand:uniform(10) of 10 -> rand:uniform(5000); _ -> rand:uniform(20) - 1 end,
    [junk_char() || _ <- lists:seq(1, N)].

junk_char() ->
    case rand:uniform(6) of
        1 -> rand:uniform(31);
        2 -> pick([16#e9, 16#263a, 16#1F600, 16#7f, 16#fffd, 16#200b]);
        _ ->
            case rand:uniform(94) + 32 of
                $@ -> $a;
                C -> C
            end
    end.

safe_word() ->
    [pick("abcdefghij") || _ <- lists:seq(1, rand:uniform(8))].

%%%===================================================================
%%% /proc and cgroup
%%%===================================================================

%% beamdiag_agent_procfs's parsers on junk: `{ok, _}' or `{error, {beamdiag_agent_procfs, _}}'.
-spec proc_parsers(list()) -> term().
proc_parsers(Config) ->
    Seeds = proc_seeds(Config),
    Parsers = [
        {parse_stat, fun beamdiag_agent_procfs:parse_stat/1},
        {parse_schedstat, fun beamdiag_agent_procfs:parse_schedstat/1},
        {parse_status, fun beamdiag_agent_procfs:parse_status/1},
        {parse_host_stat, fun beamdiag_agent_procfs:parse_host_stat/1},
        {parse_loadavg, fun beamdiag_agent_procfs:parse_loadavg/1}
    ],
    Stats = loop(?SECONDS, fun() ->
        Input = input(Seeds),
        lists:foreach(
            fun({Name, P}) ->
                case catch_call(P, [Input]) of
                    {ok, {ok, V}} when is_map(V); is_tuple(V) -> ok;
                    {ok, {error, {beamdiag_agent_procfs, R}}} ->
                        %% The reason must turn into a sentence.
                        _ = iolist_to_binary(beamdiag_agent_procfs:format_error(R)),
                        ok;
                    Other -> ct:fail({Name, Input, Other})
                end
            end,
            Parsers),
        ok
    end),
    ct:log("~p", [Stats]).

%% beamdiag_agent_cgroup's parsers on junk: values of their documented shapes.
-spec cgroup_parsers(list()) -> term().
cgroup_parsers(Config) ->
    Seeds = cgroup_seeds(Config),
    Stats = loop(?SECONDS, fun() ->
        Input = input(Seeds),
        Checks = [
            {parse_proc_cgroup, fun beamdiag_agent_cgroup:parse_proc_cgroup/1, fun is_list/1},
            {parse_mountinfo, fun beamdiag_agent_cgroup:parse_mountinfo/1, fun is_list/1},
            {parse_cpu_max, fun beamdiag_agent_cgroup:parse_cpu_max/1,
             fun({Q, P}) -> (Q =:= unlimited orelse is_float(Q)) andalso is_integer(P);
                (_) -> false end},
            {parse_cpu_stat_v1, fun(B) -> beamdiag_agent_cgroup:parse_cpu_stat(1, B) end, fun is_map/1},
            {parse_cpu_stat_v2, fun(B) -> beamdiag_agent_cgroup:parse_cpu_stat(2, B) end, fun is_map/1}
        ],
        lists:foreach(
            fun({Name, P, Shape}) ->
                case catch_call(P, [Input]) of
                    {ok, V} ->
                        case Shape(V) of
                            true -> ok;
                            false -> ct:fail({Name, Input, {bad_shape, V}})
                        end;
                    Other ->
                        ct:fail({Name, Input, Other})
                end
            end,
            Checks),
        ok
    end),
    ct:log("~p", [Stats]).

%% The flag scanner over hostile argument vectors: a map of binaries, no
%% value longer than 32 bytes.
-spec vm_flags(list()) -> term().
vm_flags(_Config) ->
    Flags = ["-sbwt", "-sbwtdcpu", "-sbwtdio", "-swt", "-scl", "-sub", "-sfwi", "-Mdai", "-MMscs",
             "-JPperf", "-setcookie", "--", "-", ""],
    Stats = loop(?SECONDS div 2, fun() ->
        Args = [case rand:uniform(3) of
                    1 -> pick(Flags);
                    2 -> pick(Flags) ++ junk_arg();
                    3 -> junk_arg()
                end || _ <- lists:seq(1, rand:uniform(30))],
        Bins = [unicode:characters_to_binary(A) || A <- Args],
        case catch_call(fun beamdiag_agent_vm:parse_flags/1, [Bins]) of
            {ok, M} when is_map(M) ->
                [ct:fail({vm_flags, Args, V}) || V <- maps:values(M),
                                                 not is_binary(V) orelse byte_size(V) > 32],
                ok;
            Other ->
                ct:fail({vm_flags, Args, Other})
        end
    end),
    ct:log("~p", [Stats]).

%%%===================================================================
%%% perf script text
%%%===================================================================

-spec perf_script(list()) -> term().
perf_script(Config) ->
    %% The folder is several modules (beamdiag_fold_*, and the top table's
    %% beamdiag_safe_text), loaded before the atoms are counted: loading
    %% one is no atom made from the input.
    {ok, Mods} = application:get_key(beamdiag, modules),
    _ = [code:ensure_loaded(M) || M <- [beamdiag_safe_text | Mods],
                                  lists:prefix("beamdiag_fold_", atom_to_list(M)) orelse
                                      M =:= beamdiag_safe_text],
    case code:ensure_loaded(beamdiag_fold) of
        {module, _} ->
            Seeds = perf_seeds(Config),
            no_new_atoms(fun() ->
                Input = input(Seeds),
                Opts = pick([#{}, #{workers => 1}, #{workers => 2, chunk_size => 64 + rand:uniform(4096)},
                             #{max_line => 80, max_stacks => 5}, #{unknown => cut}]),
                case catch_call(fun beamdiag_fold:fold_binary/2, [Input, Opts]) of
                    {ok, {ok, P}} when is_map(P) ->
                        _ = iolist_to_binary(beamdiag_fold:to_iolist(P)),
                        _ = beamdiag_fold:summary(P),
                        %% Text (chardata); frame names may hold any character.
                        true = is_binary(unicode:characters_to_binary(
                            beamdiag_fold:format_top("fuzz", beamdiag_fold:top(P, #{})))),
                        ok;
                    {ok, {error, {beamdiag_fold, R}}} ->
                        _ = iolist_to_binary(beamdiag_fold:format_error(R)),
                        ok;
                    Other ->
                        ct:fail({fold_binary, Input, Opts, Other})
                end
            end);
        _ ->
            ct:fail("beamdiag_fold is part of every build")
    end.

%%%===================================================================
%%% Capture files
%%%===================================================================

-spec capture_files(list()) -> term().
capture_files(Config) ->
    case code:ensure_loaded(beamdiag_capture_file) of
        {module, _} ->
            Seeds = capture_seeds(Config),
            File = filename:join(?config(priv_dir, Config), "fuzz.capture"),
            no_new_atoms(fun() ->
                Input = capture_input(Seeds),
                ok = file:write_file(File, Input),
                case catch_call(fun beamdiag_capture_file:load/1, [File]) of
                    {ok, {ok, D}} when is_map(D) -> ok;
                    {ok, {error, {beamdiag_capture_file, R}}} ->
                        _ = iolist_to_binary(beamdiag_capture_file:format_error(R)),
                        ok;
                    Other ->
                        Keep = filename:join(?config(priv_dir, Config),
                                             "crash_" ++ integer_to_list(erlang:unique_integer([positive]))),
                        ok = file:write_file(Keep, Input),
                        ct:fail({capture_load, Keep, Other})
                end
            end);
        _ ->
            ct:fail("beamdiag_capture_file is part of every build")
    end.

%% Captures are compressed terms after a header: mutate the header, the
%% body, and also re-wrap mutated terms so that the checksum matches and
%% the decoder sees hostile structure.
capture_input(Seeds) ->
    case rand:uniform(4) of
        1 -> mutate(pick(Seeds));
        2 -> rewrap(pick(Seeds));
        _ -> input(Seeds)
    end.

rewrap(Seed) ->
    case binary:split(Seed, <<"\n">>) of
        [Magic, <<_:64, _:32, Body/binary>>] ->
            NewBody =
                try binary_to_term(Body, [safe]) of
                    T -> term_to_binary(mutate_term(T), [compressed])
                catch
                    _:_ -> mutate(Body)
                end,
            <<Magic/binary, "\n", (byte_size(NewBody)):64, (erlang:crc32(NewBody)):32, NewBody/binary>>;
        _ ->
            mutate(Seed)
    end.

%% Replaces one random subterm with something of another type.
mutate_term(T) ->
    case rand:uniform(8) of
        1 -> junk_term();
        _ ->
            if
                is_map(T), map_size(T) > 0 ->
                    K = pick(maps:keys(T)),
                    case rand:uniform(5) of
                        1 -> maps:remove(K, T);
                        _ -> T#{K => mutate_term(maps:get(K, T))}
                    end;
                is_list(T), T =/= [] ->
                    I = rand:uniform(length(T)),
                    {A, [E | B]} = lists:split(I - 1, T),
                    A ++ [mutate_term(E) | B];
                is_tuple(T), tuple_size(T) > 0 ->
                    I = rand:uniform(tuple_size(T)),
                    setelement(I, T, mutate_term(element(I, T)));
                true ->
                    junk_term()
            end
    end.

junk_term() ->
    pick([undefined, -1, 0, 1.0e300, -0.0, <<>>, <<255, 0, 10>>, [], #{}, {}, [a | b],
          {'$a', <<"no_such_atom_xyz">>}, {'$a', 42}, lists:seq(1, 100), #{<<"k">> => [1, 2]},
          make_ref(), self(), 1 bsl 200]).

%%%===================================================================
%%% Inputs
%%%===================================================================

%% One input: random bytes, a mutated seed, or generated near-valid text.
input(Seeds) ->
    case rand:uniform(10) of
        1 -> rand_bytes(rand:uniform(256) - 1);
        2 -> rand_bytes(rand:uniform(70000));
        3 -> huge_line(Seeds);
        _ -> mutate(pick(Seeds))
    end.

rand_bytes(N) ->
    rand:bytes(N).

huge_line(Seeds) ->
    S = pick(Seeds),
    Fill = binary:copy(pick([<<"9">>, <<" ">>, <<"(">>, <<")">>, <<"x">>, <<";">>, <<0>>]),
                       rand:uniform(200000)),
    Cut = rand:uniform(byte_size(S) + 1) - 1,
    <<(binary:part(S, 0, Cut))/binary, Fill/binary, (binary:part(S, Cut, byte_size(S) - Cut))/binary>>.

mutate(<<>>) ->
    rand_bytes(rand:uniform(64));
mutate(Bin) ->
    lists:foldl(fun(_, B) -> mutate1(B) end, Bin, lists:seq(1, rand:uniform(4))).

mutate1(<<>>) ->
    <<"\n">>;
mutate1(B) ->
    N = byte_size(B),
    P = rand:uniform(N) - 1,
    case rand:uniform(9) of
        1 -> binary:part(B, 0, P);                                            %% truncate
        2 ->                                                                   %% flip a bit
            <<Pre:P/binary, C, Post/binary>> = B,
            <<Pre/binary, (C bxor (1 bsl (rand:uniform(8) - 1))), Post/binary>>;
        3 ->                                                                   %% splice junk
            <<Pre:P/binary, Post/binary>> = B,
            <<Pre/binary, (rand_bytes(rand:uniform(16)))/binary, Post/binary>>;
        4 ->                                                                   %% delete a run
            L = min(N - P, rand:uniform(32)),
            <<Pre:P/binary, _:L/binary, Post/binary>> = B,
            <<Pre/binary, Post/binary>>;
        5 ->                                                                   %% duplicate a run
            L = min(N - P, rand:uniform(64)),
            <<Pre:P/binary, Mid:L/binary, Post/binary>> = B,
            <<Pre/binary, Mid/binary, Mid/binary, Post/binary>>;
        6 ->                                                                   %% special token
            <<Pre:P/binary, Post/binary>> = B,
            T = pick([<<"-1">>, <<"18446744073709551616">>, <<"\n">>, <<" ">>, <<")">>, <<"(">>,
                      <<":">>, <<" - ">>, <<"\t">>, <<"max">>, <<"0">>, <<"\xff\xfe">>,
                      <<"1e400">>, <<"NaN">>, <<"\r\n">>, <<0>>]),
            <<Pre/binary, T/binary, Post/binary>>;
        7 ->                                                                   %% swap halves
            <<Pre:P/binary, Post/binary>> = B,
            <<Post/binary, Pre/binary>>;
        8 ->                                                                   %% digits to junk
            << <<(case X >= $0 andalso X =< $9 andalso rand:uniform(20) =:= 1 of
                      true -> pick("x-.e ");
                      false -> X
                  end)>> || <<X>> <= B >>;
        9 ->                                                                   %% repeat
            binary:copy(B, rand:uniform(3))
    end.

proc_seeds(Config) ->
    Fixtures = fixture_files(Config, "proc"),
    Fixtures ++ [
        <<"12345 (1_scheduler) S 1 12345 12345 0 -1 4194560 1000 0 2 0 1500 300 0 0 20 0 30 0 100 0 0\n">>,
        <<"12345 (a) (b)) R 1 2 3 4 5 6 7 8 9 10 11 12 13 14\n">>,
        <<"123456789 987654 321\n">>,
        <<"Name:\t1_scheduler\nState:\tS\nvoluntary_ctxt_switches:\t150\nnonvoluntary_ctxt_switches:\t7\n">>,
        <<"cpu  100 0 50 1000 5 0 1 0 0 0\ncpu0 50 0 25 500 2 0 1 0 0 0\ncpu1 50 0 25 500 3 0 0 0 0 0\n"
          "intr 1 2 3\nctxt 10\n">>,
        <<"0.52 0.58 0.59 2/467 12345\n">>
    ].

cgroup_seeds(Config) ->
    fixture_files(Config, "proc") ++ [
        <<"0::/user.slice/user-1000.slice/session-1.scope\n">>,
        <<"12:cpu,cpuacct:/docker/abc\n11:memory:/docker/abc\n0::/\n">>,
        <<"36 35 0:30 / /sys/fs/cgroup rw,nosuid shared:9 - cgroup2 cgroup2 rw\n"
          "37 35 0:31 /docker /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n">>,
        <<"max 100000\n">>, <<"200000 100000\n">>,
        <<"usage_usec 123\nuser_usec 100\nsystem_usec 23\nnr_periods 10\nnr_throttled 2\n"
          "throttled_usec 5000\n">>,
        <<"nr_periods 10\nnr_throttled 2\nthrottled_time 5000000\n">>
    ].

perf_seeds(Config) ->
    fixture_files(Config, "perf") ++ [
        <<"1_scheduler 12345 [000] 1000.000001:   10101010 cpu-clock:\n"
          "\t7f0000001000 $lists:foldl/3+0x10 (/tmp/perf-1.map)\n"
          "\t7f0000002000 erts_schedule+0x20 (/usr/lib/erlang/erts-13.1.5/bin/beam.smp)\n"
          "\tffffffffffffffff [unknown] ([unknown])\n\n"
          "beam.smp 12346 1000.1: 1 cpu-clock: \n\t0 [unknown] ([unknown])\n\n">>
    ].

capture_seeds(Config) ->
    case fixture_files(Config, "captures") of
        [] ->
            %% No recorded captures: make one here.
            {ok, C} = beamdiag_collect:run(node(), #{duration_ms => 600, interval_ms => 200,
                                                     msacc => true, locks => false, unload => []}),
            File = filename:join(?config(priv_dir, Config), "seed.capture"),
            ok = beamdiag_capture_file:save(File, beamdiag:analyse(C)),
            {ok, B} = file:read_file(File),
            [B];
        Files ->
            Files
    end.

%% The recorded fixtures under test/fixtures/Dir (recursively), at most 64
%% files of at most 2 MB each.
fixture_files(_Config, Dir) ->
    Base = beamdiag_test_lib:fixture_dir(Dir),
    Files = lists:sublist(lists:sort(filelib:wildcard(filename:join(Base, "**/*"))), 64),
    [B || F <- Files, filelib:is_regular(F), {ok, B} <- [file:read_file(F)],
          byte_size(B) =< 2000000].

%%%===================================================================
%%% Helpers
%%%===================================================================

%% Runs F for about Seconds; counts what it returned.
%% Runs F for the fuzzing time and checks that no input made an atom.
no_new_atoms(F) ->
    Atoms0 = erlang:system_info(atom_count),
    Stats = loop(?SECONDS, F),
    Atoms1 = erlang:system_info(atom_count),
    ct:log("~p; atoms before ~b, after ~b", [Stats, Atoms0, Atoms1]),
    ?assertEqual(Atoms0, Atoms1).

loop(Seconds, F) ->
    Until = erlang:monotonic_time(millisecond) + Seconds * 1000,
    loop(F, Until, #{iterations => 0}).

loop(F, Until, Acc) ->
    case erlang:monotonic_time(millisecond) >= Until of
        true ->
            Acc;
        false ->
            R = F(),
            Key = case R of {K, _} when is_atom(K) -> K; K when is_atom(K) -> K; _ -> other end,
            Acc2 = maps:update_with(Key, fun(N) -> N + 1 end, 1, Acc),
            loop(F, Until, Acc2#{iterations => maps:get(iterations, Acc2) + 1})
    end.

catch_call(F, Args) ->
    try
        {ok, apply(F, Args)}
    catch
        C:R:St -> {raised, C, R, lists:sublist(St, 3)}
    end.

pick(L) when is_list(L) ->
    lists:nth(rand:uniform(length(L)), L).
