-module(beamdiag_emu_type_tests).

-include_lib("eunit/include/eunit.hrl").

-define(DEBIAN_SOURCES, <<
    "Types: deb\n"
    "# http://archive.example/debian/20250520T000000Z\n"
    "URIs: http://mirror.example/debian\n"
    "Suites: bookworm bookworm-updates\n"
    "Components: main\n"
    "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
    "\n"
    "Types: deb\n"
    "URIs: http://mirror.example/debian-security\n"
    "Suites: bookworm-security\n"
    "Components: main\n"
    "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
>>).

deb822_stanzas_test() ->
    [A, B] = beamdiag_emu_apt:deb822(?DEBIAN_SOURCES),
    ?assertEqual("deb", maps:get("Types", A)),
    ?assertEqual("bookworm bookworm-updates", maps:get("Suites", A)),
    ?assertEqual("http://mirror.example/debian-security", maps:get("URIs", B)).

deb822_continuation_test() ->
    [S] = beamdiag_emu_apt:deb822(<<"Types: deb deb-src\nSuites: a\n b\nURIs: x\n">>),
    ?assertEqual("a b", maps:get("Suites", S)).

has_deb_src_test_() ->
    [
        ?_assertNot(beamdiag_emu_apt:has_deb_src(".sources", ?DEBIAN_SOURCES)),
        ?_assert(beamdiag_emu_apt:has_deb_src(".sources", <<"Types: deb deb-src\nURIs: x\n">>)),
        ?_assertNot(beamdiag_emu_apt:has_deb_src(
            ".sources", <<"Types: deb-src\nURIs: x\nEnabled: no\n">>)),
        ?_assert(beamdiag_emu_apt:has_deb_src(".list", <<"deb http://x y main\ndeb-src http://x y main\n">>)),
        ?_assertNot(beamdiag_emu_apt:has_deb_src(".list", <<"# deb-src http://x y main\n">>))
    ].

unknown_option_test() ->
    %% Options are checked as every entry point checks them (beamdiag_opts).
    ?assertError({badarg, {unknown_options, [bogus], allowed, _}},
                 beamdiag_emu_type:build(#{bogus => true})).

missing_source_test() ->
    ?assertMatch({error, {beamdiag_emu_type, {no_source, _}}},
                 beamdiag_emu_type:build(#{otp_src => "/nonexistent/otp", cache => "/nonexistent/c"})).

version_mismatch_test() ->
    Dir = filename:join(os:getenv("TMPDIR", "/tmp"),
                        "beamdiag_flavor_test_" ++ integer_to_list(erlang:unique_integer([positive]))),
    ok = filelib:ensure_dir(filename:join([Dir, "erts", "x"])),
    ok = file:write_file(filename:join(Dir, "OTP_VERSION"), "21.3.8\n"),
    ok = file:write_file(filename:join([Dir, "erts", "vsn.mk"]), "VSN = 10.3.5\n"),
    ok = file:write_file(filename:join(Dir, "configure"), "#!/bin/sh\nexit 1\n"),
    try
        R = beamdiag_emu_type:build(#{otp_src => Dir, cache => filename:join(Dir, "cache")}),
        case beamdiag_emu_type:missing_packages({dir, Dir}) of
            [] ->
                ?assertMatch({error, {beamdiag_emu_type, {version_mismatch, _}}}, R),
                {error, {M, Reason}} = R,
                Text = lists:flatten(io_lib:format("~ts", [M:format_error(Reason)])),
                ?assertNotEqual(nomatch, string:find(Text, "21.3.8"));
            Pkgs ->
                ?assertEqual({error, {beamdiag_emu_type, {missing_packages, Pkgs}}}, R)
        end
    after
        file:del_dir_r(Dir)
    end.

format_error_test_() ->
    [
        ?_assertMatch([_ | _], lists:flatten(io_lib:format("~ts", [beamdiag_emu_type:format_error(E)])))
     || E <- [no_deb_src, need_root, no_debian_erlang, {missing_packages, ["dpkg-dev"]},
              {not_found, "make"}, {command_failed, "make", 2, "x"},
              {file, "write", "/x", eacces}, {verify_failed, "x"}]
    ].

%% debootstrap writes a one-line sources.list; a deb-src entry is derived
%% from its deb lines (options in brackets and comments left out).
one_line_debs_test() ->
    ?assertEqual(
        [[{"URIs", "http://mirror.example/debian"}, {"Suites", "trixie"},
          {"Components", "main contrib"}],
         [{"URIs", "http://mirror.example/sec"}, {"Suites", "trixie-security"},
          {"Components", "main"}]],
        beamdiag_emu_apt:one_line_debs(<<
            "deb http://mirror.example/debian trixie main contrib\n"
            "# deb http://old.example/debian bookworm main\n"
            "deb-src http://mirror.example/debian trixie main\n"
            "deb [arch=amd64 signed-by=/k.gpg] http://mirror.example/sec trixie-security main\n"
            "deb http://broken.example\n"
        >>)
    ).

%% A node without lock counting (OTP 29, whose Debian source is not served
%% here) is told exactly which source and command build its emulator.
advice_names_the_exact_source_test() ->
    A = beamdiag_emu_type:advice(#{otp_release => <<"29">>, otp_version => <<"29.1.2">>,
                                 erts_version => <<"17.1.1">>, lock_counting => false}),
    [?assertNotEqual(nomatch, binary:match(A, W), W)
     || W <- [<<"OTP 29.1.2 (ERTS 17.1.1)">>,
              <<"beamdiag emu-type build --install --otp-src otp_src_29.1.2.tar.gz">>,
              <<"https://github.com/erlang/otp/releases/download/OTP-29.1.2/otp_src_29.1.2.tar.gz">>,
              <<"-emu_type lcnt">>]].

%% The emulator is installed beside the node's but not running: restart,
%% nothing to build.
advice_installed_test() ->
    A = beamdiag_emu_type:advice(#{otp_release => <<"25">>, otp_version => <<"25.2.3">>,
                                   lock_counting => false, lcnt_emulator_installed => true}),
    ?assertNotEqual(nomatch, binary:match(A, <<"restart the node with -emu_type lcnt">>)),
    ?assertEqual(nomatch, binary:match(A, <<"emu-type build">>)).

%% Settings come from the target: anything but a version number is left out.
advice_hostile_settings_test() ->
    A = beamdiag_emu_type:advice(#{otp_release => <<"27">>, otp_version => <<"27; rm -rf /">>,
                                 erts_version => [1, 2]}),
    ?assertEqual(nomatch, binary:match(A, <<"rm -rf">>)),
    ?assertNotEqual(nomatch, binary:match(A, <<"--otp-src otp_src_27.tar.gz">>)),
    ?assertNotEqual(nomatch, binary:match(A, <<"(ERTS ?)">>)).

%% The VM's own nice value, which a build's programs get for their session
%% (beamdiag_emu_os:keep_nice/1), read as ps reads it.
own_nice_test() ->
    Ps = string:trim(os:cmd("ps -o ni= -p " ++ os:getpid())),
    ?assertEqual(list_to_integer(Ps), beamdiag_emu_os:own_nice()).

%% A spawned program's session gets the nice value, not the session of
%% erl_child_setup it left: the value is written only once the program
%% leads its own session (its OS pid is known before its setsid). Read
%% back from /proc/PID/autogroup, on a kernel with autogroups.
group_nice_after_setsid_test() ->
    case file:read_file("/proc/self/autogroup") of
        {ok, _} ->
            [begin
                 Port = open_port({spawn_executable, "/bin/sleep"}, [{args, ["5"]}, exit_status]),
                 {os_pid, OsPid} = erlang:port_info(Port, os_pid),
                 try
                     ?assert(beamdiag_emu_os:group_nice(OsPid, 7)),
                     Proc = "/proc/" ++ integer_to_list(OsPid),
                     {ok, Stat} = file:read_file(Proc ++ "/stat"),
                     [_, AfterName] = binary:split(Stat, <<") ">>),
                     Session = lists:nth(4, binary:split(AfterName, <<" ">>, [global])),
                     ?assertEqual(integer_to_binary(OsPid), Session),
                     {ok, G} = file:read_file(Proc ++ "/autogroup"),
                     ?assertMatch({_, _}, binary:match(G, <<"nice 7">>))
                 after
                     port_close(Port),
                     os:cmd("kill " ++ integer_to_list(OsPid))
                 end
             end || _ <- lists:seq(1, 5)],
            ok;
        {error, _} ->
            ok
    end.
