%%% Native and Erlang-level profiles of real nodes: a peer started with
%%% +JPperf true runs a cache lab workload, perf records it through
%%% beamdiag_perf, the folder and the rules explain it. Raw signals are
%%% asserted before findings.
-module(beamdiag_profile_SUITE).

-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0, init_per_suite/1, end_per_suite/1, init_per_testcase/2, end_per_testcase/2]).
-export([atom_decode_perf/1, redis_cache_perf/1, erlang_sampler/1, perf_errors/1,
         flame_cli/1, diagnose_perf/1, header_otp25/1, header_otp27/1, header_otp29/1,
         perfdirectory_otp29/1, callers_otp29/1, cli_perf_otp27/1, cli_perf_otp29/1]).

all() ->
    [perf_errors, atom_decode_perf, redis_cache_perf, erlang_sampler, flame_cli, diagnose_perf,
     header_otp25, header_otp27, header_otp29, perfdirectory_otp29, callers_otp29,
     cli_perf_otp27, cli_perf_otp29].

init_per_suite(Config) ->
    case os:find_executable("perf") of
        false -> beamdiag_test_lib:missing("perf is not installed");
        _ -> Config
    end.

end_per_suite(_Config) ->
    ok.

init_per_testcase(perf_errors, Config) ->
    Config;
init_per_testcase(header_otp25, Config) ->
    Config;
init_per_testcase(header_otp27, Config) ->
    Config;
init_per_testcase(header_otp29, Config) ->
    Config;
init_per_testcase(perfdirectory_otp29, Config) ->
    Config;
init_per_testcase(cli_perf_otp27, Config) ->
    init_per_testcase(callers_otp29, Config);
init_per_testcase(cli_perf_otp29, Config) ->
    init_per_testcase(callers_otp29, Config);
init_per_testcase(callers_otp29, Config) ->
    case ensure_distributed() of
        ok -> Config;
        {error, Why} -> beamdiag_test_lib:missing(io_lib:format("no distribution: ~p", [Why]))
    end;
init_per_testcase(diagnose_perf, Config) ->
    init_per_testcase(flame_cli, Config);
init_per_testcase(flame_cli, Config) ->
    case ensure_distributed() of
        ok -> start_dist_node(Config);
        {error, Why} -> beamdiag_test_lib:missing(io_lib:format("distribution: ~p", [Why]))
    end;
init_per_testcase(redis_cache_perf, Config) ->
    case os:find_executable("redis-server") of
        false -> beamdiag_test_lib:missing("redis-server is not installed");
        _ -> start_lab(redis_cache, Config, [])
    end;
init_per_testcase(_, Config) ->
    start_lab(atom_decode, Config, []).

end_per_testcase(_, Config) ->
    case ?config(peer, Config) of
        undefined -> ok;
        Peer -> beamdiag_test_lib:stop_node(Peer)
    end,
    case ?config(dist_node, Config) of
        undefined -> ok;
        Node -> catch erpc:call(Node, erlang, halt, [], 5000)
    end,
    case ?config(dist_os_pid, Config) of
        undefined -> ok;
        OsPid -> beamdiag_test_lib:kill_os_node(OsPid)
    end,
    ok.

%%% Cases

%% Expected failures come back as values with a sentence.
perf_errors(_Config) ->
    {error, {beamdiag_perf, Gone = {target_gone, _}}} = beamdiag_perf:record(999999999, #{}),
    {error, {beamdiag_perf, NoPerf}} = beamdiag_perf:record(1, #{perf => "/nonexistent/perf"}),
    {error, {beamdiag_perf, {bad_option, duration, 0}}} = beamdiag_perf:record(1, #{duration => 0}),
    [beamdiag_test_lib:sentence(beamdiag_perf:format_error(R)) || R <- [Gone, NoPerf]],
    ok.

atom_decode_perf(Config) ->
    P = record(Config, 5, dwarf),
    S = beamdiag_fold:summary(P),
    ct:pal("summary: ~p~n~s", [S, beamdiag_fold:format_top("top", beamdiag_fold:top(P, #{}))]),
    %% Raw signal first: most samples decode atoms, and perf could place
    %% (nearly) every frame.
    ?assert(maps:get(samples, S) >= 100),
    Decode = share_with(P, [<<"binary_to_term_1">>, <<"erts_atom_put">>, <<"erts_atom_put_index">>,
                            <<"erl_zlib_inflate_chunk">>]),
    ct:pal("binary_to_term frames in ~.1f% of samples, [unknown] in ~.1f%",
           [100 * Decode, 100 * maps:get(unknown_share, S)]),
    ?assert(Decode > 0.5),
    ?assert(maps:get(unknown_share, S) < 0.05),
    %% Then the finding.
    Findings = beamdiag_profile_rules:findings(P, #{}),
    [F | _] = [X || X = #{metrics := #{family := <<"atom_decode">>}} <- Findings],
    ?assertMatch(#{id := hot_function}, F),
    ?assert(beamdiag_finding:at_least(F, warning)),
    %% The flame graph of the real profile is well-formed XML.
    Svg = filename:join(?config(priv_dir, Config), "flame.svg"),
    ok = file:write_file(Svg, beamdiag_format_flamegraph:svg(P, #{title => <<"atom_decode">>})),
    {_, _} = xmerl_scan:file(Svg, [{quiet, true}]),
    ok.

redis_cache_perf(Config) ->
    Peer = ?config(peer, Config),
    RedisPid = peer:call(Peer, beamdiag_lab_cache, redis_os_pid, [redis_cache]),
    ?assert(is_integer(RedisPid)),
    ?assert(alive(RedisPid)),
    Ops0 = peer:call(Peer, beamdiag_lab_cache, ops, [redis_cache]),
    P = record(Config, 5, dwarf),
    Ops1 = peer:call(Peer, beamdiag_lab_cache, ops, [redis_cache]),
    S = beamdiag_fold:summary(P),
    Decode = share_with(P, [<<"binary_to_term_1">>, <<"erts_atom_put">>, <<"erts_atom_put_index">>,
                            <<"erl_zlib_inflate_chunk">>]),
    ct:pal("GET+decode: ~b in 5 s; binary_to_term frames in ~.1f% of samples, [unknown] in ~.1f%",
           [Ops1 - Ops0, 100 * Decode, 100 * maps:get(unknown_share, S)]),
    ?assert(Ops1 > Ops0),
    ?assert(Decode > 0.3),
    ?assert(maps:get(unknown_share, S) < 0.05),
    ?assertMatch([_ | _], [X || X = #{metrics := #{family := <<"atom_decode">>}}
                                <- beamdiag_profile_rules:findings(P, #{})]),
    %% Stopping the scenario stops redis-server.
    ok = peer:call(Peer, beamdiag_lab_cache, stop, [redis_cache]),
    ok = beamdiag_test_lib:await(fun() -> not alive(RedisPid) end, 5000),
    ok.

erlang_sampler(Config) ->
    Peer = ?config(peer, Config),
    _ = [begin
             {Mod, Bin, File} = code:get_object_code(M),
             {module, Mod} = peer:call(Peer, code, load_binary, [Mod, File, Bin])
         end || M <- beamdiag_agent_sampler:modules()],
    R = peer:call(Peer, beamdiag_agent_sampler, run, [#{duration => 3, frequency => 97}], 60000),
    #{stacks := Stacks, samples := N, ticks := Ticks, looked_at := Looked} = R,
    ct:pal("sampler: ~b samples in ~b ticks, ~b processes looked at", [N, Ticks, Looked]),
    ?assert(Ticks > 100),
    ?assert(N > 0),
    ?assert(Looked =< Ticks * 200),
    P = beamdiag_fold:from_counts(Stacks),
    ?assert(share_with(P, [<<"beamdiag_lab_cache:decode_loop/2">>, <<"erlang:binary_to_term/1">>]) > 0.5),
    ok.

%% The command end to end over distribution.
flame_cli(Config) ->
    Node = ?config(node, Config),
    Out = filename:join(?config(priv_dir, Config), "flame_cli"),
    IO = beamdiag_test_lib:capture_io(),
    {ok, Opts} = beamdiag_cli:parse(beamdiag_cli_flame:spec(),
                                    [atom_to_list(Node), "--duration", "4", "--output-dir", Out,
                                     "--cookie", atom_to_list(erlang:get_cookie())]),
    Code = beamdiag_cli_flame:run(Opts, IO),
    {Printed, PrintedErr} = beamdiag_test_lib:collect_io(),
    ct:pal("exit ~b~n~s~s", [Code, Printed, PrintedErr]),
    0 = Code,
    [true = filelib:is_regular(filename:join(Out, F)) || F <- ["profile.folded", "flame.svg", "top.txt"]],
    {_, _} = xmerl_scan:file(filename:join(Out, "flame.svg"), [{quiet, true}]),
    %% Raw signal first: the stacks the command wrote decode atoms.
    Decode = folded_share(filename:join(Out, "profile.folded"),
                          [<<"binary_to_term_1">>, <<"erts_atom_put">>, <<"erl_zlib_inflate_chunk">>]),
    ct:pal("binary_to_term frames in ~.1f% of the folded samples", [100 * Decode]),
    ?assert(Decode > 0.3),
    {_, _} = binary:match(Printed, <<"with an unnamed JIT frame">>),
    {_, _} = binary:match(Printed, <<"binary_to_term decoding atoms">>),
    %% The node runs +JPperf true: it is not told to start with it; the
    %% Erlang callers no perf mode shows of native code come from the
    %% Erlang-level sampler beside perf, named in the header and drawn.
    nomatch = binary:match(Printed, <<"+JPperf true and use">>),
    {_, _} = binary:match(Printed, <<"Erlang callers from the Erlang-level sampler">>),
    {_, _} = binary:match(Printed, <<"beamdiag_lab_cache:decode_loop/2">>),
    {_, _} = xmerl_scan:file(filename:join(Out, "erlang.svg"), [{quiet, true}]),
    ?assert(folded_share(filename:join(Out, "erlang.folded"),
                         [<<"beamdiag_lab_cache:decode_loop/2">>]) > 0.3),
    %% The Erlang-level sampler over distribution, from the same command.
    OutErl = filename:join(?config(priv_dir, Config), "flame_cli_erlang"),
    {ok, OptsErl} = beamdiag_cli:parse(beamdiag_cli_flame:spec(),
                                       [atom_to_list(Node), "--duration", "3", "--output-dir", OutErl,
                                        "--erlang"]),
    0 = beamdiag_cli_flame:run(OptsErl, IO),
    {PrintedErl, _} = beamdiag_test_lib:collect_io(),
    ct:pal("--erlang:~n~s", [PrintedErl]),
    DecodeErl = folded_share(filename:join(OutErl, "profile.folded"),
                             [<<"beamdiag_lab_cache:decode_loop/2">>]),
    ct:pal("decode_loop/2 in ~.1f% of the Erlang sampler's folded samples", [100 * DecodeErl]),
    ?assert(DecodeErl > 0.3),
    {_, _} = binary:match(PrintedErl, <<"beamdiag_lab_cache:decode_loop/2">>),
    %% The sampler was removed from the node afterwards.
    false = erpc:call(Node, code, is_loaded, [beamdiag_agent_sampler]),
    ok.

%% perf as a library option: one connection, one capture that holds the
%% profile, one analysis whose findings include the profile's.
diagnose_perf(Config) ->
    Node = ?config(node, Config),
    %% Every run of the profile rules is counted (a run with the Erlang
    %% sampler's callers beside perf calls them twice more, for each).
    Rules = {beamdiag_profile_rules, findings, 2},
    {module, _} = code:ensure_loaded(beamdiag_profile_rules),
    1 = erlang:trace_pattern(Rules, true, [call_count]),
    T0 = erlang:monotonic_time(millisecond),
    {ok, D} = beamdiag:diagnose(Node, #{duration => 4, perf => true, msacc_span => 1}),
    Elapsed = erlang:monotonic_time(millisecond) - T0,
    {call_count, Calls} = erlang:trace_info(Rules, call_count),
    _ = erlang:trace_pattern(Rules, false, [call_count]),
    #{capture := #{extras := #{profile := Prof}}, findings := Findings} = D,
    %% The profile rules ran once, in the one analysis.
    ?assertEqual(case maps:is_key(callers, Prof) of true -> 3; false -> 1 end, Calls),
    #{profile := P, perf := Perf} = Prof,
    %% The capture keeps the folded stacks; the flamegraph is drawn on output.
    ?assertNot(maps:is_key(svg, Prof)),
    Html = iolist_to_binary(beamdiag_format_html:diagnosis(D)),
    S = beamdiag_fold:summary(P),
    ct:pal("diagnose --perf: ~b ms for a 4 s window; ~p~n~p", [Elapsed, S, Perf]),
    %% Raw signal: the profile has samples, most in the atom decoding.
    ?assert(maps:get(samples, S) >= 50),
    ?assert(share_with(P, [<<"binary_to_term_1">>, <<"erts_atom_put">>, <<"erts_atom_put_index">>,
                           <<"erl_zlib_inflate_chunk">>]) > 0.3),
    ?assertMatch({_, _}, binary:match(Html, <<"&lt;svg">>)),
    %% The one analysis saw the profile: its finding is in the diagnosis.
    ?assertMatch([_ | _], [F || F = #{id := hot_function, metrics := #{family := <<"atom_decode">>}}
                                <- Findings]),
    %% The text report carries the header.
    Text = iolist_to_binary(beamdiag_format_text:diagnosis(D, #{colour => false})),
    ?assertMatch({_, _}, binary:match(Text, <<"with an unnamed JIT frame">>)),
    %% A bad perf option is a caller's mistake.
    ?assertError({badarg, {perf, #{call_graph := lbr}}},
                 beamdiag:diagnose(Node, #{duration => 1, perf => #{call_graph => lbr}})),
    ok.

%%% Helpers

%% The load runs until end_per_testcase stops the node (its own bound is
%% the longest the lab allows); the case starts once it has done work.
start_lab(Scenario, Config, _Opts) ->
    {ok, Peer, Node} = beamdiag_test_lib:start_node(
                           list_to_integer(erlang:system_info(otp_release)),
                           #{args => ["+JPperf", "true"], wait_boot => 30000}),
    [begin
         {M, B, F} = code:get_object_code(M),
         {module, M} = peer:call(Peer, code, load_binary, [M, F, B])
     end || M <- [beamdiag_lab_cache, beamdiag_resp]],
    {ok, _} = peer:call(Peer, beamdiag_lab_cache, start,
                        [Scenario, #{duration => 600, owner => undefined}], 60000),
    ok = beamdiag_test_lib:await(
           fun() -> peer:call(Peer, beamdiag_lab_cache, ops, [Scenario]) > 100 end, 30000),
    OsPid = list_to_integer(peer:call(Peer, os, getpid, [])),
    [{peer, Peer}, {node, Node}, {ospid, OsPid} | Config].

%% A node started the way users start theirs: erl with a name, a cookie and
%% +JPperf true, running the atom_decode workload until the case ends (it
%% halts on its own after 300 s); the case starts once the load did work.
start_dist_node(Config) ->
    Name = "beamdiag_flame_" ++ os:getpid(),
    {ok, Host} = inet:gethostname(),
    Node = list_to_atom(Name ++ "@" ++ Host),
    Ebin = filename:dirname(code:which(beamdiag_lab_cache)),
    Erl = os:find_executable("erl"),
    Eval = "{ok, _} = beamdiag_lab_cache:start(atom_decode, #{duration => 300, owner => undefined}), "
           "timer:sleep(305000), halt().",
    Port = open_port({spawn_executable, Erl},
                     [{args, ["+JPperf", "true", "-sname", Name, "-setcookie",
                              atom_to_list(erlang:get_cookie()), "-noshell", "-pa", Ebin,
                              "-eval", Eval]}, exit_status, stderr_to_stdout]),
    {os_pid, OsPid} = erlang:port_info(Port, os_pid),
    Running = fun() ->
        net_adm:ping(Node) =:= pong andalso
            erpc:call(Node, beamdiag_lab_cache, ops, [atom_decode], 5000) > 100
    end,
    case beamdiag_test_lib:wait_until(Running, 30000) of
        ok ->
            [{dist_node, Node}, {node, Node}, {dist_port, Port}, {dist_os_pid, OsPid} | Config];
        timeout ->
            _ = os:cmd("kill -9 " ++ integer_to_list(OsPid)),
            ct:fail("the target node did not come up and run its load within 30 s")
    end.

record(Config, Seconds, CallGraph) ->
    OsPid = ?config(ospid, Config),
    Dir = filename:join(?config(priv_dir, Config), "perf"),
    {ok, R = #{script := Script}} = beamdiag_perf:record(OsPid, #{duration => Seconds, dir => Dir,
                                                                  call_graph => CallGraph}),
    ct:pal("perf: ~p", [maps:without([record_output], R)]),
    Map = maps:get(perf_map, R),
    true = filelib:is_regular(Map),
    {ok, P} = beamdiag_fold:fold_file(Script, #{perf_map => Map}),
    P.

%% Share of the samples of a folded file ("f1;f2;... count" lines) whose
%% stack holds one of the frames.
folded_share(File, Frames) ->
    {ok, Bin} = file:read_file(File),
    Rows = [{Stack, binary_to_integer(C)}
            || L <- binary:split(Bin, <<"\n">>, [global, trim_all]),
               [Stack, C] <- [string:split(L, <<" ">>, trailing)]],
    Hits = lists:sum([C || {S, C} <- Rows,
                           lists:any(fun(F) -> binary:match(S, F) =/= nomatch end, Frames)]),
    Hits / max(1, lists:sum([C || {_, C} <- Rows])).

%%% The header's figures on real nodes of each OTP, with and without
%%% +JPperf: they are what profile.folded shows (counted again from its
%%% text by the fold tests' own reading), the call-graph mode fits the node
%%% and the header says what it lost.

header_otp25(Config) -> header(25, Config).
header_otp27(Config) -> header(27, Config).
header_otp29(Config) -> header(29, Config).

%% Both runs, or the first run's skip (no root for that release): a skip
%% is the case's result, never swallowed.
header(Release, Config) ->
    case header(Release, true, Config) of
        {skip, _} = Skip -> Skip;
        _ -> header(Release, none, Config)
    end.

header(Release, Flag, Config) ->
    Args = case Flag of true -> ["+JPperf", "true"]; none -> [] end,
    beamdiag_test_lib:with_node(Release, #{args => Args}, fun(Peer, _Node) ->
        ok = start_workload(Peer),
        OsPid = list_to_integer(peer:call(Peer, os, getpid, [])),
        Dir = filename:join(?config(priv_dir, Config),
                            lists:concat(["otp", Release, "_", Flag])),
        {ok, R = #{script := Script, call_graph := CG, perf_map := Map}} =
            beamdiag_perf:record(OsPid, #{duration => 4, dir => Dir}),
        ct:pal("OTP ~b, +JPperf ~p: ~p", [Release, Flag, maps:without([record_output], R)]),
        %% The mode fits the node: frame pointers where the JIT
        %% keeps them and the map was found (through /proc/PID/root
        %% for a node in its own root), DWARF otherwise.
        case {Release, Flag} of
            {29, true} -> fp = CG, true = filelib:is_regular(Map);
            {_, true} -> dwarf = CG, true = filelib:is_regular(Map);
            {_, none} -> dwarf = CG, missing = Map
        end,
        FoldOpts = case {Map, CG} of
            {missing, _} -> #{};
            {_, fp} -> #{perf_map => Map, unknown => cut};
            {_, dwarf} -> #{perf_map => Map}
        end,
        {ok, P} = beamdiag_fold:fold_file(Script, FoldOpts),
        Folded = iolist_to_binary(beamdiag_fold:to_iolist(P)),
        ok = file:write_file(filename:join(Dir, "profile.folded"), Folded),
        %% Raw signal: samples were taken, and the folded text's own
        %% figures.
        Recount = beamdiag_fold_tests:recount(Folded),
        S = beamdiag_fold:summary(P),
        Header = iolist_to_binary(beamdiag_format_profile:header(
                     #{profile => P, method => perf, perf => R})),
        ct:pal("recount ~p~nheader ~s", [Recount, Header]),
        ?assert(maps:get(samples, Recount) >= 20),
        [?assert(abs(maps:get(K, S) - maps:get(K, Recount)) =< 0.01)
         || K <- [erlang_share, unnamed_jit_share, unnamed_native_share, unplaced_share,
                  cut_short_share]],
        %% The header prints those figures, each as a whole number ("0.0%"
        %% must not match inside "10.0%").
        [?assertMatch({K, {match, _}},
                      {K, re:run(Header, ["(^|[^0-9.])",
                                          string:replace(io_lib:format("~.1f", [100 * maps:get(K, S)]),
                                                         ".", "\\."),
                                          "%"])})
         || K <- [erlang_share, unnamed_jit_share, cut_short_share]],
        case Flag of
            true ->
                %% With +JPperf true the JIT code is named.
                ?assert(maps:get(unnamed_jit_share, Recount) < 0.05),
                ?assert(maps:get(erlang_share, Recount) > 0.0);
            none ->
                ?assert(maps:get(unnamed_jit_share, Recount) > 0.05),
                {_, _} = binary:match(Header, <<"No perf map">>),
                {_, _} = binary:match(Header, <<"DWARF unwinding stops">>)
        end
    end).

%% OTP 28+ writes its perf map where +JPperfdirectory says, inside its own
%% root: found through /proc/PID/root, named, and the JIT frames with it.
perfdirectory_otp29(Config) ->
    Args = ["+JPperf", "map", "+JPperfdirectory", "/dev/shm"],
    beamdiag_test_lib:with_node(29, #{args => Args}, fun(Peer, _Node) ->
        OsPid = list_to_integer(peer:call(Peer, os, getpid, [])),
        Written = "/dev/shm/perf-" ++ integer_to_list(OsPid) ++ ".map",
        try
            ok = start_workload(Peer),
            T = beamdiag_perf:target(OsPid),
            ct:pal("~p", [T]),
            %% Raw signal: the file is where the flag says.
            true = filelib:is_regular(Written),
            #{perf_flag := <<"map">>, perf_directory := <<"/dev/shm">>, ns_pid := OsPid,
              frame_pointers := true} = T,
            Map = maps:get(perf_map, T),
            ?assertEqual(lists:concat(["/proc/", OsPid, "/root/dev/shm/perf-", OsPid, ".map"]),
                         Map),
            Dir = filename:join(?config(priv_dir, Config), "perfdirectory"),
            {ok, #{script := Script, perf_map := Copy}} =
                beamdiag_perf:record(OsPid, #{duration => 3, dir => Dir, call_graph => fp}),
            {ok, P} = beamdiag_fold:fold_file(Script, #{perf_map => Copy, unknown => cut}),
            S = beamdiag_fold:summary(P),
            ct:pal("~p", [S]),
            ?assert(maps:get(samples, S) >= 20),
            ?assert(maps:get(unnamed_jit_share, S) < 0.05),
            ?assert(maps:get(erlang_share, S) > 0.0)
        after
            file:delete(Written)
        end
    end).

%% Sid's OTP 29 emulator names none of its internal C functions: perf
%% alone cannot see the atom decoding nor its Erlang caller. The Erlang
%% sampler runs beside perf and names both; the finding says where it comes
%% from.
callers_otp29(Config) ->
    Args = ["+JPperf", "true", "-setcookie", atom_to_list(erlang:get_cookie())],
    beamdiag_test_lib:with_node(29, #{args => Args}, fun(Peer, Node) ->
        ok = start_workload(Peer),
        true = net_kernel:connect_node(Node),
        Dir = filename:join(?config(priv_dir, Config), "callers"),
        {ok, R = #{profile := P, callers := C, findings := Findings}} =
            beamdiag_profile:profile(Node, #{duration => 4, out => Dir}, fun(_) -> ok end),
        Header = iolist_to_binary(header(R)),
        ct:pal("~s~n~p", [Header, Findings]),
        %% Raw signals: perf's native frames have no names here...
        ?assertEqual(0.0, share_with(P, [<<"binary_to_term_1">>, <<"erts_atom_put">>])),
        ?assertEqual(false, maps:get(native_names, maps:get(target, maps:get(perf, R)))),
        %% ...the sampler's stacks name the BIF (as its trap
        %% continuation: a large term) and the Erlang function that
        %% calls it, and the header shows the caller.
        ?assert(maps:get(samples, C) >= 20),
        ?assert(share_with(C, [<<"beamdiag_profile_work:decode_loop/1">>]) > 0.2),
        Bif = share_with(C, [<<"erts_internal:binary_to_term_trap/1">>,
                             <<"erlang:binary_to_term/1">>]),
        ct:pal("sampler: binary_to_term in ~.1f% of samples", [100 * Bif]),
        %% Measured 9.4% to 15.7% of the sampler's stacks (a fresh
        %% machine's first run, with the emulator builds beside it, gave
        %% the low end): named, well above none.
        ?assert(Bif > 0.05),
        ?assertMatch({_, _}, binary:match(Header, <<"Erlang callers from the Erlang-level "
                                                    "sampler">>)),
        ?assertMatch({_, _}, binary:match(Header, <<"beamdiag_profile_work:decode_loop/1">>)),
        %% Then the finding: binary_to_term named with its caller,
        %% from the sampler, without a claim about atoms it did
        %% not see.
        [#{title := Title, evidence := Ev}] =
            [X || X = #{metrics := #{family := <<"atom_decode">>}} <- Findings],
        ?assertEqual(<<"Decoding terms with binary_to_term takes a large share of the CPU">>,
                     Title),
        EvText = iolist_to_binary(lists:join("\n", Ev)),
        ?assertMatch({_, _}, binary:match(EvText, <<"From the Erlang-level sampler">>)),
        ?assertMatch({_, _}, binary:match(EvText, <<"Called from beamdiag_profile_work:"
                                                    "decode_loop/1">>)),
        %% No finding points at a frame without a name.
        ?assertEqual([], [X || X = #{metrics := #{function := <<"[", _/binary>>}} <- Findings])
    end).

%% As a new user would: the escript of this machine's OTP runs `diagnose
%% --perf' against a node of another OTP that decodes an atom-heavy term in
%% a loop. On OTP 27 perf names the atom decoding in C (DWARF, the emulator
%% has its symbols); on OTP 29 (stripped) the Erlang sampler beside perf
%% names binary_to_term and its caller. Raw signal first, then the finding.
cli_perf_otp27(Config) -> cli_perf(27, Config).
cli_perf_otp29(Config) -> cli_perf(29, Config).

cli_perf(Release, _Config) ->
    Escript = case beamdiag_test_lib:escript() of
        {ok, E} -> E;
        error -> throw(beamdiag_test_lib:missing("the escript is not built (rebar3 escriptize)"))
    end,
    Cookie = atom_to_list(erlang:get_cookie()),
    beamdiag_test_lib:with_node(Release, #{args => ["+JPperf", "true", "-setcookie", Cookie]}, fun(Peer, Node) ->
        ok = start_workload(Peer),
        T0 = erlang:monotonic_time(millisecond),
        {Code, Out, Err} = beamdiag_test_lib:run_exe(
            Escript, ["diagnose", atom_to_list(Node), "--perf", "--json", "--duration", "4"],
            [{"BEAMDIAG_COOKIE", Cookie}]),
        Ms = erlang:monotonic_time(millisecond) - T0,
        ct:pal("OTP ~b: exit ~b in ~b ms for a 4 s window~n~ts", [Release, Code, Ms, Err]),
        ?assertEqual(0, Code),
        J = beamdiag_test_json:decode(Out),
        Findings = maps:get(<<"findings">>, J),
        ct:pal("findings: ~p~nprofile: ~p",
               [[{maps:get(<<"id">>, X), maps:get(<<"metrics">>, X, #{})} || X <- Findings],
                maps:without([<<"folded">>, <<"stacks">>], maps:get(<<"profile">>, J, #{}))]),
        [F] = [X || X = #{<<"id">> := <<"hot_function">>,
                          <<"metrics">> := #{<<"family">> := <<"atom_decode">>}} <- Findings],
        #{<<"title">> := Title, <<"evidence">> := Ev} = F,
        ct:pal("~ts~n~ts", [Title, [[E, $\n] || E <- Ev]]),
        %% Raw signal: the share the finding is built on.
        Share = maps:get(<<"share">>, maps:get(<<"metrics">>, F)),
        ?assert(Share >= 0.05),
        EvText = iolist_to_binary(lists:join("\n", Ev)),
        case Release of
            27 ->
                ?assertMatch(<<"Decoding atom-heavy terms", _/binary>>, Title),
                ?assertMatch({_, _}, binary:match(EvText, <<"erts_atom_put">>));
            29 ->
                ?assertMatch(<<"Decoding terms with binary_to_term", _/binary>>, Title),
                ?assertMatch({_, _}, binary:match(EvText, <<"Called from beamdiag_profile_"
                                                            "work:decode_loop/1">>))
        end
    end).

header(R) -> beamdiag_format_profile:header(R).

%% A workload compiled on the target from source, so that it runs on any
%% OTP: one process decodes an atom-heavy term, one does list and map work.
start_workload(Peer) ->
    Src = "-module(beamdiag_profile_work).\n"
          "-export([start/0, decode_loop/1, cpu_loop/0]).\n"
          "start() ->\n"
          "    T = [list_to_atom(\"a\" ++ integer_to_list(I)) || I <- lists:seq(1, 20000)],\n"
          "    Bin = term_to_binary(T, [{compressed, 6}]),\n"
          "    spawn(fun() -> decode_loop(Bin) end), spawn(fun() -> cpu_loop() end), ok.\n"
          "decode_loop(Bin) -> _ = binary_to_term(Bin), decode_loop(Bin).\n"
          "cpu_loop() ->\n"
          "    L = [rand:uniform(1000) || _ <- lists:seq(1, 200)],\n"
          "    M = lists:foldl(fun(X, A) -> A#{X rem 32 => X} end, #{}, lists:sort(L)),\n"
          "    _ = map_size(M), cpu_loop().\n",
    Forms = forms(Src),
    {ok, Mod, Bin} = peer:call(Peer, compile, forms, [Forms]),
    {module, Mod} = peer:call(Peer, code, load_binary, [Mod, "beamdiag_profile_work.erl", Bin]),
    ok = peer:call(Peer, Mod, start, []),
    %% Raw signal that the load runs: the node's reductions grow by
    %% millions (an idle node does thousands a second).
    {R0, _} = peer:call(Peer, erlang, statistics, [reductions]),
    beamdiag_test_lib:await(fun() ->
        {R, _} = peer:call(Peer, erlang, statistics, [reductions]),
        R - R0 > 5000000
    end, 30000).

forms(Src) ->
    case erl_scan:tokens([], Src, 1) of
        {done, {ok, Toks, _}, Rest} ->
            {ok, F} = erl_parse:parse_form(Toks),
            [F | forms(Rest)];
        _ ->
            []
    end.

share_with(#{stacks := Stacks, samples := N}, Frames) ->
    Hits = lists:sum([C || {S, C} <- maps:to_list(Stacks),
                           lists:any(fun(F) -> lists:member(F, S) end, Frames)]),
    Hits / max(N, 1).

alive(OsPid) ->
    filelib:is_dir("/proc/" ++ integer_to_list(OsPid)).

ensure_distributed() ->
    case node() of
        nonode@nohost ->
            _ = case os:find_executable("epmd") of
                false -> ok;
                Epmd ->
                    Port = open_port({spawn_executable, Epmd}, [{args, ["-daemon"]}, exit_status]),
                    receive {Port, {exit_status, _}} -> ok after 5000 -> ok end
            end,
            case net_kernel:start([list_to_atom("beamdiag_ct_" ++ os:getpid()), shortnames]) of
                {ok, _} -> ok;
                {error, Why} -> {error, Why}
            end;
        _ ->
            ok
    end.
