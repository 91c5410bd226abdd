%%% EUnit tests of beamdiag_host_locate on a recorded /proc tree
%%% (test/fixtures/host/proc): pid 100 is a beam listening on 46045 and
%%% started with -sname app; pid 200 is a shell holding the same socket (not
%%% a beam); pid 300 a beam listening on 40001 over IPv6 with -name other@..;
%%% pid 400 a beam started with -sname nodist and no listening socket;
%%% pid 500 a beam without a name on its command line (its distribution
%%% started after boot, as RabbitMQ starts it) listening on 25699 and 5699.
-module(beamdiag_host_locate_tests).
-include_lib("eunit/include/eunit.hrl").

root() -> beamdiag_test_lib:fixture_dir("host/proc").

locate(Target, Names) ->
    beamdiag_host_locate:locate(Target, #{proc_root => root(), names => Names}).

by_epmd_port_test() ->
    ?assertMatch({ok, #{os_pid := 100, how := epmd_port, port := 46045, epmd := registered,
                        comm := <<"beam.smp">>}},
                 locate("app@localhost", {ok, [{"other", 40001}, {"app", 46045}]})).

by_epmd_port_tcp6_test() ->
    ?assertMatch({ok, #{os_pid := 300, how := epmd_port, port := 40001}},
                 locate("other@localhost", {ok, [{"other", 40001}]})).

no_epmd_falls_back_to_the_command_line_test() ->
    ?assertMatch({ok, #{os_pid := 100, how := cmdline, epmd := no_answer}},
                 locate("app@localhost", {error, timeout})).

no_epmd_listening_test() ->
    %% epmd refused (none runs here), unlike one that did not answer in time.
    ?assertMatch({ok, #{os_pid := 100, how := cmdline, epmd := no_epmd}},
                 locate("app@localhost", {error, address})).

not_registered_found_on_its_command_line_test() ->
    ?assertMatch({ok, #{os_pid := 400, how := cmdline, epmd := not_registered}},
                 locate("nodist@localhost", {ok, [{"app", 46045}]})).

registered_port_nobody_listens_on_test() ->
    %% epmd says a port no beam listens on: the command line decides.
    ?assertMatch({ok, #{os_pid := 100, how := cmdline, epmd := registered}},
                 locate("app@localhost", {ok, [{"app", 1}]})).

not_found_test() ->
    ?assertEqual({error, {beamdiag_host_locate, {not_found, "ghost@localhost"}}},
                 locate("ghost@localhost", {ok, []})).

os_pid_test_() ->
    [?_assertMatch({ok, #{os_pid := 100, how := given}}, locate("100", {ok, []})),
     ?_assertMatch({ok, #{os_pid := 100, how := given}}, locate(100, {ok, []})),
     ?_assertEqual({error, {beamdiag_host_locate, {not_beam, 200, <<"bash">>}}},
                   locate("200", {ok, []})),
     ?_assertEqual({error, {beamdiag_host_locate, {no_such_pid, 999}}}, locate(999, {ok, []}))].

other_host_and_bad_input_test_() ->
    [?_assertEqual({error, {beamdiag_host_locate, {other_host, "db1.example.org"}}},
                   locate("app@db1.example.org", {ok, []})),
     ?_assertEqual({error, {beamdiag_host_locate, {bad_node, "nonsense"}}},
                   locate("nonsense", {ok, []})),
     ?_assertMatch({error, {beamdiag_host_locate, {no_such_pid, 100}}},
                   beamdiag_host_locate:locate(100, #{proc_root => "/nonexistent"}))].

target_test_() ->
    [?_assertEqual({os_pid, 42}, beamdiag_host_locate:target("42")),
     ?_assertEqual({os_pid, 42}, beamdiag_host_locate:target(<<"42">>)),
     ?_assertEqual({node, "a@b"}, beamdiag_host_locate:target("a@b")),
     ?_assertEqual({node, "0"}, beamdiag_host_locate:target("0"))].

parse_net_tcp_only_listening_test() ->
    {ok, B} = file:read_file(filename:join([root(), "net", "tcp"])),
    ?assertEqual([{16#1111, 27813}, {46045, 777}], beamdiag_host_locate:parse_net_tcp(B)).

parse_cmdline_test() ->
    ?assertEqual(["app", "b@h"],
                 beamdiag_host_locate:parse_cmdline(<<"beam.smp", 0, "-sname", 0, "app", 0,
                                                      "-name", 0, "b@h", 0, "-sname">>)).

local_host_test_() ->
    {ok, Here} = inet:gethostname(),
    [?_assert(beamdiag_host_locate:is_local_host(H)) || H <- ["localhost", "127.0.0.1", Here]] ++
    [?_assertNot(beamdiag_host_locate:is_local_host(H)) || H <- ["db1.example.org", "10.9.8.7"]].

format_error_test_() ->
    [?_test(beamdiag_test_lib:sentence(beamdiag_host_locate:format_error(R)))
     || R <- [{no_such_pid, 1}, {not_beam, 1, <<"bash">>}, {unreadable, "/proc/1/comm", eacces},
              {other_host, "h"}, {not_found, "a@b"}, {bad_node, "x"}]].
