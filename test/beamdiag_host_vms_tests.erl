%%% EUnit tests of beamdiag_host_vms on the recorded /proc tree of
%%% beamdiag_host_locate_tests (test/fixtures/host/proc), epmd's names given.
-module(beamdiag_host_vms_tests).
-include_lib("eunit/include/eunit.hrl").

list(Names) ->
    Vms = beamdiag_host_vms:list(#{proc_root => beamdiag_test_lib:fixture_dir("host/proc"),
                                   names => Names}),
    maps:from_list([{P, V} || V = #{os_pid := P} <- Vms]).

short() -> beamdiag_node_name:short_host().

named_on_the_command_line_test() ->
    #{100 := #{name := Name, distribution := Dist}} = list({ok, []}),
    ?assertEqual(iolist_to_binary(["app@", short()]), Name),
    %% (The fixture holds no net/tcp of its own for app.)
    ?assertEqual(<<"inet_tcp">>, Dist).

started_after_boot_named_by_epmd_test() ->
    %% epmd gives 25699 for the name: that node, and only its
    %% distribution port said (5699 is another listener of it).
    #{500 := #{name := Name, distribution := Dist}} =
        list({ok, [{"app", 46045}, {"rabbit", 25699}]}),
    ?assertEqual(iolist_to_binary(["rabbit@", short()]), Name),
    ?assertEqual(<<"inet_tcp, started after boot (epmd's name for its port), listens on 25699">>,
                 Dist).

not_in_epmd_test() ->
    ?assertMatch(#{500 := #{name := none, distribution := <<"no distribution">>}},
                 list({ok, [{"app", 46045}]})).

no_epmd_test() ->
    ?assertMatch(#{500 := #{name := none}, 100 := #{name := <<"app@", _/binary>>}},
                 list({error, address})).

a_name_on_the_command_line_wins_test() ->
    %% epmd naming another node on app's port does not rename it.
    #{100 := #{name := Name}} = list({ok, [{"impostor", 46045}]}),
    ?assertEqual(iolist_to_binary(["app@", short()]), Name).
