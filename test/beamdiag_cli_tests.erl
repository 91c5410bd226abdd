-module(beamdiag_cli_tests).
-include_lib("eunit/include/eunit.hrl").

run(Args) ->
    beamdiag_test_lib:cli(Args).

no_args_is_usage_error_test() ->
    {2, <<>>, Err} = run([]),
    ?assertMatch({_, _}, binary:match(Err, <<"diagnose">>)).

help_test() ->
    {0, Out, _} = run(["--help"]),
    ?assertMatch({_, _}, binary:match(Out, <<"lab">>)).

command_help_has_example_test_() ->
    [?_test(begin
         {0, Out, _} = run([Name, "--help"]),
         ?assertMatch({_, _}, binary:match(Out, <<"example:">>))
     end) || {Name, _, _} <- beamdiag_cli:commands()].

unknown_command_test() ->
    {2, _, Err} = run(["frobnicate"]),
    ?assertMatch({_, _}, binary:match(Err, <<"unknown command">>)).

unknown_option_test() ->
    {2, _, Err} = run(["diagnose", "a@b", "--bogus"]),
    ?assertMatch({_, _}, binary:match(Err, <<"unknown option --bogus">>)).

%% (`diagnose' without a node is not one: it picks the host's only Erlang
%% VM, or lists them; beamdiag_attach_SUITE covers it.)
bad_values_test_() ->
    [?_assertMatch({2, _, _}, run(A)) || A <- [
        ["diagnose", "a@b", "--duration", "zero"],
        ["diagnose", "a@b", "--duration", "-1"],
        ["diagnose", "a@b", "--interval", "5"],
        ["diagnose", "a@b", "--json=yes"],
        ["diagnose", "a@b", "--duration"],
        ["diagnose", "a@b", "extra"],
        ["diagnose", "a@b", "--fail-on", "sometimes"]]].

bad_node_name_test() ->
    {2, _, Err} = run(["diagnose", "no-at-sign", "--cookie-file", "/dev/null"]),
    ?assertMatch({_, _}, binary:match(Err, <<"not a node name">>)).

parse_defaults_test() ->
    {ok, O} = beamdiag_cli:parse(beamdiag_cli_diagnose:spec(), ["n@h", "--duration=2.5"]),
    ?assertEqual(#{node => "n@h", duration => 2.5, interval => 1000, json => false,
                   no_msacc => false, msacc_span => 2.0, no_locks => false, cluster => false,
                   perf => false, no_perf => false, erlang => false, no_procs => false,
                   slack => 1.5}, O).

repeatable_option_replaces_its_default_test() ->
    Spec = #{name => "t", summary => "", example => "", positional => [],
             options => [#{key => v, long => "--v", type => {list, string}, default => ["d"],
                           help => ""}]},
    ?assertEqual({ok, #{v => ["d"]}}, beamdiag_cli:parse(Spec, [])),
    ?assertEqual({ok, #{v => ["a", "b"]}}, beamdiag_cli:parse(Spec, ["--v", "a", "b"])),
    ?assertEqual({ok, #{v => ["a", "b"]}}, beamdiag_cli:parse(Spec, ["--v", "a", "--v", "b"])).

control_characters_are_not_echoed_test() ->
    {2, _, Err} = run(["diagnose", "a@b", "--x\e[31m"]),
    ?assertEqual(nomatch, binary:match(Err, <<"\e">>)).

%% Progress and its padding reach standard error only when it is a
%% terminal.
progress_only_on_a_terminal_test() ->
    _ = beamdiag_test_lib:collect_io(),
    NoTty = beamdiag_test_lib:capture_io(),
    Tty = NoTty#{tty => true},
    P1 = beamdiag_cli_diagnose:progress(NoTty),
    ok = P1(1000, 5000),
    ok = beamdiag_cli_diagnose:end_progress(NoTty),
    ok = beamdiag_cli_diagnose:end_progress(maps:remove(tty, NoTty)),
    ?assertEqual({<<>>, <<>>}, beamdiag_test_lib:collect_io()),
    P2 = beamdiag_cli_diagnose:progress(Tty),
    ok = P2(1000, 5000),
    ?assertEqual({<<>>, <<"\rbeamdiag: sampling, 4s left ">>}, beamdiag_test_lib:collect_io()).

%% compare --html: the comparison as an HTML report beside the text; a file
%% that cannot be written is a failed run (4).
compare_html_test() ->
    Fixture = beamdiag_test_lib:fixture("captures/busy_wait.capture"),
    {ok, [C]} = file:consult(Fixture),
    Dir = filename:join(["/tmp", "beamdiag_cli_tests_" ++ os:getpid()]),
    ok = filelib:ensure_dir(filename:join(Dir, "x")),
    A = filename:join(Dir, "a.capture"),
    ok = beamdiag_capture_file:save(A, beamdiag:analyse(C)),
    Html = filename:join(Dir, "c.html"),
    try
        {0, Out, Err} = run(["compare", A, A, "--html", Html]),
        ?assertNotEqual(nomatch, binary:match(Out, <<"beamdiag compare">>)),
        ?assertNotEqual(nomatch, binary:match(Err, <<"HTML report written">>)),
        {ok, Page} = file:read_file(Html),
        ?assertNotEqual(nomatch, binary:match(Page, <<"scheduler.spin">>)),
        {4, _, _} = run(["compare", A, A, "--html", filename:join([Dir, "no", "c.html"])])
    after
        _ = file:del_dir_r(Dir)
    end.

%% The emulator command is named after erl's -emu_type; its old name stays.
emu_type_alias_test() ->
    {0, New, _} = run(["emu-type", "--help"]),
    {0, Old, _} = run(["flavor", "--help"]),
    ?assertEqual(New, Old),
    ?assertMatch(<<"usage: beamdiag emu-type ", _/binary>>, New),
    {0, Top, _} = run(["--help"]),
    ?assertNotEqual(nomatch, binary:match(Top, <<"flavor       the same as emu-type">>)).

%% The options several commands take are defined once: every command's
%% --cookie, --cookie-file, --json, --out, --html, --save and --fail-on is
%% the shared definition, or the shared one with its help (or range) made
%% for that command.
shared_options_test() ->
    Shared = [cookie, cookie_file, duration, interval, slack, json, out, html, save, fail_on,
              erlang],
    Uses = [{Cmd, O} || {Cmd, Mod, _} <- beamdiag_cli:commands(),
                        O = #{key := K} <- maps:get(options, Mod:spec()),
                        lists:member(K, Shared), not is_map_key(replaced_by, O)],
    ?assert(length(Uses) >= 40),
    [?assertEqual({Cmd, maps:with([key, long], beamdiag_cli_options:option(K))},
                  {Cmd, maps:with([key, long], O)}) || {Cmd, O = #{key := K}} <- Uses],
    %% Node-reaching commands take the cookie options word for word.
    [?assertEqual({Cmd, beamdiag_cli_options:option(K)}, {Cmd, O})
     || {Cmd, O = #{key := K}} <- Uses, K =:= cookie orelse K =:= cookie_file],
    ?assertEqual([], [Cmd || {Cmd, Mod, _} <- beamdiag_cli:commands(),
                             lists:member(cookie, [K || #{key := K} <- maps:get(options, Mod:spec())])
                             =/= lists:member(cookie_file,
                                              [K || #{key := K} <- maps:get(options, Mod:spec())])]).

%% An entry adjusts the shared definition for one command; a map is taken
%% as it is.
pick_test() ->
    Own = #{key => x, long => "--x", type => boolean, help => "x"},
    [Cookie, Out, Dur, Own] = beamdiag_cli_options:pick(
                                 [cookie, {out, "write the results to FILE"},
                                  {duration, #{default => 5.0}}, Own]),
    ?assertEqual(beamdiag_cli_options:option(cookie), Cookie),
    ?assertEqual("write the results to FILE", maps:get(help, Out)),
    ?assertEqual("--out", maps:get(long, Out)),
    ?assertEqual(5.0, maps:get(default, Dur)),
    Old = beamdiag_cli_options:deprecated("--old-x", Own),
    ?assertMatch(#{key := x, long := "--old-x", replaced_by := "--x"}, Old).

%% A command that crashes (a bug) says so in one line and exits with 4,
%% "the run failed", not with the escript's stack trace and 127.
internal_error_is_one_line_and_exit_4_test() ->
    _ = beamdiag_test_lib:collect_io(),
    IO = (beamdiag_test_lib:capture_io())#{out => fun(_) -> error(boom) end},
    ?assertEqual(4, beamdiag_cli:run(["catalogue"], IO)),
    {_, Err} = beamdiag_test_lib:collect_io(),
    ?assertMatch({_, _}, binary:match(Err, <<"beamdiag catalogue: internal error in ">>)),
    ?assertMatch({_, _}, binary:match(Err, <<"error:boom">>)),
    ?assertEqual(2, length(binary:split(Err, <<"\n">>, [global, trim_all]))).

%% How to reach a node, said by hand: protocol, TLS options, port.
attach_options_test_() ->
    Spec = beamdiag_cli_diagnose:spec(),
    [?_assertMatch({ok, #{node := "n@h", proto_dist := inet6_tls, ssl_dist_optfile := "/o",
                          dist_port := 9100}},
                   beamdiag_cli:parse(Spec, ["n@h", "--proto-dist", "inet6_tls",
                                             "--ssl-dist-optfile", "/o", "--dist-port", "9100"])),
     ?_assertMatch({error, {bad_value, "--proto-dist", "quic", _}},
                   beamdiag_cli:parse(Spec, ["n@h", "--proto-dist", "quic"])),
     ?_assertMatch({error, {bad_value, "--dist-port", "70000", _}},
                   beamdiag_cli:parse(Spec, ["n@h", "--dist-port", "70000"]))].

%% --no-perf and --perf contradict each other: a usage error, nothing run.
no_perf_with_perf_test() ->
    {Code, _, Err} = beamdiag_test_lib:cli(["diagnose", "n@h", "--perf", "--no-perf"]),
    ?assertEqual(2, Code),
    ?assertMatch({_, _}, binary:match(Err, <<"--perf and --no-perf together">>)).
