%%% One escript on every ERTS: the escript, built once on this machine,
%%% runs `diagnose' on OTP 25 (this machine), 27 (Debian trixie's root) and
%%% 29 (sid's) against a real node; and on a host whose only Erlang is a
%%% release (built by relx with its own ERTS, OTP 29, no compiler
%%% application, no `escript' on the PATH, no OTP installed), run with the
%%% release's own ERTS, it diagnoses a node of that release. A build made
%%% without the OTP 27 root says so when it is built, and on OTP 29 stops
%%% at start with one line.
-module(beamdiag_erts_SUITE).

-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0, suite/0, init_per_suite/1, end_per_suite/1]).
-export([escript_on_each_otp/1, release_only_host/1, without_otp27_code/1]).

-define(WINDOW, "3").

suite() ->
    [{timetrap, {minutes, 5}}].

all() ->
    [escript_on_each_otp, release_only_host, without_otp27_code].

init_per_suite(Config) ->
    case beamdiag_test_lib:escript() of
        {ok, E} ->
            %% rebar3 in the OTP 29 root builds the release (relx).
            Out = os:cmd(beamdiag_test_lib:script("otp-root.sh") ++ " sid rebar3 2>&1; echo \"exit=$?\""),
            case {string:find(Out, "exit=0"), beamdiag_test_lib:otp_root(27)} of
                {nomatch, _} ->
                    beamdiag_test_lib:missing(["cannot install rebar3 into the OTP 29 root: ", Out]);
                {_, {error, Why}} ->
                    beamdiag_test_lib:missing(["no OTP 27 root: ", Why]);
                {_, {ok, _}} ->
                    {ok, Sid} = beamdiag_test_lib:otp_root(29),
                    %% The escript must carry OTP 27's code: built before the
                    %% roots were, it holds OTP 25's only (scripts/test-run.sh
                    %% builds it again once they are there).
                    {ok, Sections} = escript:extract(E, []),
                    {archive, Zip} = lists:keyfind(archive, 1, Sections),
                    {ok, Names} = zip:list_dir(Zip),
                    Set = [N || {zip_file, N, _, _, _, _} <- Names,
                                N =:= "beamdiag/otp27/beamdiag.set"],
                    Set =/= [] orelse
                        ct:fail("the escript holds no code compiled by OTP 27: build it with "
                                "the OTP 27 root there (rebar3 escriptize)"),
                    [{escript, E}, {sid, Sid} | Config]
            end;
        error ->
            beamdiag_test_lib:missing("the escript is not built (rebar3 escriptize)")
    end.

end_per_suite(_Config) ->
    ok.

%%%===================================================================
%%% Cases
%%%===================================================================

%% The escript, as built, on each release, against one lab node of this
%% machine's OTP: it says which code it runs, and the diagnosis is whole.
escript_on_each_otp(Config) ->
    {ok, Lab} = beamdiag_test_lib:start_lab(cpu_saturated, #{duration => 120}),
    try
        Node = atom_to_list(beamdiag_lab:node(Lab)),
        Cookie = atom_to_list(beamdiag_lab:cookie(Lab)),
        Bin = filename:dirname(?config(escript, Config)),
        [begin
             {0, Version, _} = run(Root, Bin, ["--version"], []),
             ct:pal("~ts", [Version]),
             ?assertMatch({_, _}, binary:match(Version, iolist_to_binary(
                                                          ["on OTP ", integer_to_list(Rel),
                                                           ", running code compiled by OTP ",
                                                           integer_to_list(Code)]))),
             T0 = erlang:monotonic_time(millisecond),
             {Exit, Out, Err} = run(Root, Bin, ["diagnose", Node, "--json", "--duration", ?WINDOW],
                                    [{"BEAMDIAG_COOKIE", Cookie}]),
             Ms = erlang:monotonic_time(millisecond) - T0,
             ct:pal("escript on OTP ~b: exit ~b in ~b ms~n~ts", [Rel, Exit, Ms, Err]),
             ?assertEqual(0, Exit),
             J = beamdiag_test_json:decode(Out),
             whole(J, <<"25">>),
             %% The load the node runs is seen: its schedulers were busy.
             Busy = busy(J),
             ct:pal("OTP ~b CLI: scheduler busy ~.3f of wall time", [Rel, Busy]),
             ?assert(Busy > 0.5),
             beamdiag_test_lib:agent_gone(Lab)
         end || {Root, Rel, Code} <- [{host, 25, 25}, {"trixie", 27, 27}, {"sid", 29, 27}]],
        ok
    after
        beamdiag_test_lib:stop_lab(Lab)
    end.

%% A release built by relx on OTP 29 with its ERTS and kernel, stdlib and
%% sasl only. The node runs from it; then, with the root's OTP hidden
%% (nothing at /usr/lib/erlang, so no `escript' or `erl' on the PATH), the
%% escript runs with the release's ERTS and diagnoses the node. The agent
%% goes over as OTP 27's beams: nothing is compiled on the node.
release_only_host(Config) ->
    Sid = ?config(sid, Config),
    Inside = "/root/beamdiag_erts_" ++ os:getpid(),
    Work = Sid ++ Inside,
    _ = os:cmd("rm -rf '" ++ Work ++ "'"),
    Name = "beamdiag_rel_" ++ integer_to_list(erlang:unique_integer([positive])),
    Cookie = "rel" ++ integer_to_list(rand:uniform(1 bsl 40)),
    ok = write_release_project(filename:join(Work, "demo"), Name, Cookie),
    T0 = erlang:monotonic_time(millisecond),
    {0, BOut, BErr} = otp_run([], "sid", ["sh", "-c", "cd " ++ Inside ++ "/demo && rebar3 release"]),
    ct:pal("relx release in ~b ms:~n~ts~ts", [erlang:monotonic_time(millisecond) - T0, BOut, BErr]),
    Rel = Inside ++ "/demo/_build/default/rel/demo",
    [Erts] = [filename:basename(D) || D <- filelib:wildcard(Sid ++ Rel ++ "/erts-*")],
    Libs = [filename:basename(D) || D <- filelib:wildcard(Sid ++ Rel ++ "/lib/*")],
    ct:pal("release: ~s, ~p", [Erts, Libs]),
    ?assertEqual([], [L || L <- Libs, lists:prefix("compiler", L)]),
    Empty = filename:join(?config(priv_dir, Config), "empty"),
    ok = filelib:ensure_dir(filename:join(Empty, "x")),
    Bin = filename:dirname(?config(escript, Config)),
    %% No OTP but the release's: the root's own hidden under an empty folder.
    Hide = [{"OTP_RUN_BIND", Empty ++ ":/usr/lib/erlang " ++ Bin ++ ":/beamdiag-bin"}],
    {0, _, _} = otp_run(Hide, "sid", [Rel ++ "/bin/demo", "daemon"]),
    Node = list_to_atom(Name ++ "@" ++ short_host()),
    try
        {ok, Node} = beamdiag_test_lib:poll(
                         fun() ->
                                 case beamdiag_remote:connect(atom_to_list(Node),
                                                              #{cookie => list_to_atom(Cookie)}) of
                                     {ok, N} -> {true, N};
                                     Error -> {false, Error}
                                 end
                         end, 30000),
        ?assertEqual(non_existing, erpc:call(Node, code, which, [compile])),
        ?assertEqual("29", erpc:call(Node, erlang, system_info, [otp_release])),
        ErtsBin = Rel ++ "/" ++ Erts ++ "/bin",
        %% The host as the operator finds it: no escript, no erl.
        {Which, WOut, _} = otp_run(Hide, "sid", ["sh", "-c", "command -v escript || command -v erl"]),
        ?assertEqual(<<>>, WOut),
        ?assertNotEqual(0, Which),
        %% The README's command line for a release's own ERTS.
        Cmd = ["ROOTDIR=", Rel, " BINDIR=", ErtsBin, " EMU=beam PROGNAME=erl ESCRIPT_EMULATOR=",
               ErtsBin, "/erlexec ", ErtsBin, "/escript /beamdiag-bin/beamdiag diagnose ", Name,
               "@", short_host(), " --json --duration ", ?WINDOW],
        T1 = erlang:monotonic_time(millisecond),
        {Exit, Out, Err} = otp_run(Hide ++ [{"BEAMDIAG_COOKIE", Cookie}], "sid",
                                   ["sh", "-c", lists:flatten(Cmd)]),
        ct:pal("escript of the release's ERTS: exit ~b in ~b ms~n~ts",
               [Exit, erlang:monotonic_time(millisecond) - T1, Err]),
        ?assertEqual(0, Exit),
        J = beamdiag_test_json:decode(Out),
        whole(J, <<"29">>),
        %% The release's burner is the node's top process.
        ?assertMatch({_, _}, binary:match(Out, <<"demo_burner">>)),
        ?assert(busy(J) > 0.3),
        %% Nothing was compiled there, nothing of beamdiag stays.
        ?assertEqual(false, erpc:call(Node, code, is_loaded, [compile])),
        beamdiag_test_lib:agent_gone(Node)
    after
        stop_release_node(Node),
        _ = os:cmd("rm -rf '" ++ Work ++ "'")
    end.

%% Without the OTP 27 root, the build says so (scripts/beam-sets.sh, the
%% hook after rebar3's compile) and leaves the set out; such an escript
%% runs on OTP 25 and, on OTP 29, says in one line why it stops, before
%% any command, with none of the emulator's load errors.
without_otp27_code(Config) ->
    Priv = ?config(priv_dir, Config),
    Build = filename:join(Priv, "build"),
    Ebin = filename:join([Build, "lib", "beamdiag", "ebin"]),
    Stale = filename:join([Build, "lib", "beamdiag", "otp27", "beamdiag.set"]),
    ok = filelib:ensure_dir(Stale),
    ok = file:write_file(Stale, <<"left from an earlier build">>),
    ok = filelib:ensure_dir(filename:join(Ebin, "x")),
    {0, HOut, HErr} = beamdiag_test_lib:run_exe(
                          beamdiag_test_lib:script("beam-sets.sh"), [],
                          [{"REBAR_BUILD_DIR", Build},
                           {"BEAMDIAG_CACHE", filename:join(Priv, "no_cache")}]),
    ct:pal("beam-sets.sh without a root:~n~ts~ts", [HOut, HErr]),
    ?assertNotEqual(nomatch, string:find(HErr, "WARNING: no OTP 27 root")),
    ?assertNotEqual(nomatch, string:find(HErr, "runs on OTP 25 to 27 only")),
    ?assertNot(filelib:is_regular(Stale)),
    %% The escript as such a build makes it: the same, less OTP 27's code.
    {ok, Sections} = escript:extract(?config(escript, Config), []),
    {archive, Zip} = lists:keyfind(archive, 1, Sections),
    {ok, Files} = zip:unzip(Zip, [memory]),
    Kept = [F || {Name, _} = F <- Files, not lists:prefix("beamdiag/otp27/", Name)],
    ?assert(length(Kept) < length(Files)),
    Bin = filename:join(Priv, "bin"),
    Escript = filename:join(Bin, "beamdiag"),
    ok = filelib:ensure_dir(Escript),
    ok = escript:create(Escript, [shebang, {emu_args, proplists:get_value(emu_args, Sections)},
                                  {archive, Kept, []}]),
    ok = file:change_mode(Escript, 8#755),
    {0, V25, _} = run(host, Bin, ["--version"], []),
    ?assertMatch({_, _}, binary:match(V25, <<"holds code compiled by OTP 25)">>)),
    {Code, Out, Err} = run("sid", Bin, ["diagnose", "nobody@localhost", "--duration", "1"], []),
    ct:pal("on OTP 29: exit ~b~n~ts~ts", [Code, Out, Err]),
    ?assertEqual({4, <<>>}, {Code, Out}),
    [Line] = string:split(string:trim(Err), "\n", all),
    [?assertNotEqual(nomatch, string:find(Line, W), W)
     || W <- ["compiled by OTP 25", "OTP 29 cannot load", "scripts/otp-root.sh trixie"]].

%%%===================================================================
%%% Helpers
%%%===================================================================

%% The escript run on this machine's OTP (host) or inside a root, where
%% its folder is at /beamdiag-bin.
run(host, Bin, Args, Env) ->
    beamdiag_test_lib:run_exe(filename:join(Bin, "beamdiag"), Args, Env);
run(Suite, Bin, Args, Env) ->
    otp_run([{"OTP_RUN_BIND", Bin ++ ":/beamdiag-bin"} | Env], Suite,
            ["escript", "/beamdiag-bin/beamdiag" | Args]).

otp_run(Env, Suite, Args) ->
    beamdiag_test_lib:run_exe(beamdiag_test_lib:script("otp-run.sh"), [Suite | Args], Env).

%% A whole diagnosis of a node of that release.
whole(J, Release) ->
    ?assertEqual(Release, maps:get(<<"otp_release">>, J)),
    ?assert(maps:get(<<"complete">>, J)),
    ?assert(maps:get(<<"samples">>, J) >= 3),
    ?assertMatch([_ | _], maps:get(<<"findings">>, J)).

%% The schedulers' busy share of their wall time.
busy(J) ->
    #{<<"busy">> := B, <<"wall">> := W} = maps:get(<<"scheduler">>, maps:get(<<"by_type">>, J)),
    B / W.

%% init:stop/0 on the node, then SIGKILL if it is still there 10 s later.
stop_release_node(Node) ->
    case catch erpc:call(Node, os, getpid, [], 5000) of
        OsPid when is_list(OsPid) ->
            catch erpc:call(Node, init, stop, [], 5000),
            Gone = fun() -> not beamdiag_test_lib:os_pid_alive(OsPid) end,
            case beamdiag_test_lib:wait_until(Gone, 10000) of
                ok -> ok;
                timeout -> _ = os:cmd("kill -9 " ++ OsPid), ok
            end;
        _ ->
            ok
    end.

short_host() ->
    {ok, H} = inet:gethostname(),
    hd(string:split(H, ".")).

%% A relx project: an application that starts a busy process, a release
%% of it with sasl and the ERTS, named and with a cookie by its vm.args.
write_release_project(Dir, Name, Cookie) ->
    Files = [{"rebar.config",
              "{relx, [{release, {demo, \"1.0.0\"}, [demo, sasl]}, {mode, prod},\n"
              "        {include_erts, true}, {vm_args, \"config/vm.args\"}]}.\n"},
             {"config/vm.args", ["-sname ", Name, "\n-setcookie ", Cookie, "\n"]},
             {"src/demo.app.src",
              "{application, demo, [{vsn, \"1.0.0\"}, {applications, [kernel, stdlib]},\n"
              "                     {mod, {demo, []}}]}.\n"},
             {"src/demo.erl",
              "-module(demo).\n-behaviour(application).\n-export([start/2, stop/1, burn/1]).\n"
              "start(_, _) ->\n"
              "    register(demo_burner, spawn(fun() -> burn(0) end)),\n"
              "    {ok, spawn(fun() -> receive stop -> ok end end)}.\n"
              "stop(_) -> ok.\n"
              "burn(N) -> burn((N * 7 + 3) rem 1000003).\n"}],
    lists:foreach(fun({F, Text}) ->
                          Path = filename:join(Dir, F),
                          ok = filelib:ensure_dir(Path),
                          ok = file:write_file(Path, Text)
                  end, Files).
