%%% @doc Builds and installs the lock-counting emulator for the installed ERTS.
%%%
%%% Lock counting (`beamdiag_lock_session') needs an emulator built for it, and the
%%% extra microstate accounting states (alloc, bif, busy_wait, ets, gc_full,
%%% nif, send, timers) need `--with-microstate-accounting=extra'. This module
%%% builds only that emulator (`beam.lcnt.smp' and `erl_child_setup.lcnt')
%%% from OTP source of exactly the installed version, and installs it beside
%%% the installed emulator so that `erl -emu_type lcnt' starts it.
%%%
%%% The source is a given tree or tarball, or on Debian `apt-get source
%%% erlang' of the installed package version (that needs a deb-src entry;
%%% with `add_deb_src' one is added for the configured Debian mirrors). The
%%% build runs in a temporary directory that is removed afterwards. With a
%%% `cache' directory the binaries are kept in `Cache/<erts-version>/' and
%%% reused by later runs. External programs run with explicit arguments,
%%% never through a shell; their output goes to the `progress' fun.
%%%
%%% This module holds the API and the order of the steps; the steps are
%%% `beamdiag_emu_source' (the OTP source, with `beamdiag_emu_apt' for
%%% Debian's deb-src entries), `beamdiag_emu_build' (configure and make),
%%% `beamdiag_emu_cache' (the build cache), `beamdiag_emu_install' (the
%%% installed system: installing and checking the emulator) and
%%% `beamdiag_emu_os' (programs and files).
%%%
%%% ```
%%% 1> beamdiag_emu_type:status().
%%% #{erts_version => <<"13.1.5">>, installed => false, ...}
%%% 2> beamdiag_emu_type:build(#{install => true, add_deb_src => true,
%%%        progress => fun(D) -> io:put_chars(standard_error, D) end}).
%%% {ok, #{action => built, installed => true, seconds => 372, ...}}
%%% '''
-module(beamdiag_emu_type).

-export([build/1, status/0, format_error/1]).
%% Called by the tests only.
-ifdef(TEST).
-export([advice/1, missing_packages/1]).
-endif.
%% Called as Module:format_error/1 on an {error, {Module, Reason}} value.
-ignore_xref([{format_error, 1}]).

-export_type([options/0, settled/0, report/0]).

-type options() :: #{
    otp_src => string() | undefined,
    install => boolean(),
    add_deb_src => boolean(),
    cache => string() | undefined,
    progress => fun((iodata()) -> ok),
    jobs => pos_integer()
}.
%% The options with their defaults merged in (build/1): the steps'
%% modules take them.
-type settled() :: #{
    otp_src := string() | undefined,
    install := boolean(),
    add_deb_src := boolean(),
    cache := string() | undefined,
    progress := fun((iodata()) -> ok),
    jobs := pos_integer()
}.
-type report() :: #{
    action := already_installed | installed_from_cache | built | from_cache,
    erts_version := binary(),
    installed := boolean(),
    bin_dir := binary(),
    cache_dir => binary(),
    seconds => non_neg_integer(),
    source => binary()
}.
-type source() :: beamdiag_emu_source:source().
%% What every report holds, before the action is known.
-type base() :: #{erts_version := binary(), bin_dir := binary()}.

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Builds the lock-counting emulator if needed and, with `install',
%% installs it. Options: `otp_src' (a source tree or tarball; default: the
%% Debian source package), `install', `add_deb_src', `cache' (a directory),
%% `progress' (receives build output line by line), `jobs' (parallel make
%% jobs, default the number of logical processors). Without `install' or
%% `cache' the binaries are kept in the user cache directory. Unknown
%% options raise `badarg' (beamdiag_opts).
-spec build(options()) -> {ok, report()} | {error, {beamdiag_emu_type, term()}}.
build(Opts0) when is_map(Opts0) ->
    Defaults = #{
        otp_src => undefined,
        install => false,
        add_deb_src => false,
        cache => undefined,
        progress => fun(_) -> ok end,
        jobs => beamdiag_emu_build:jobs()
    },
    build_checked(beamdiag_opts:merge(Opts0, Defaults, [])).

%% @doc Whether the lock-counting emulator is installed for the running
%% ERTS, and whether it starts and counts locks.
-spec status() -> #{atom() => boolean() | binary()}.
status() ->
    Vsn = beamdiag_emu_install:erts_version(),
    BinDir = beamdiag_emu_install:bin_dir(),
    Installed = beamdiag_emu_install:present(BinDir),
    Working = Installed andalso beamdiag_emu_install:verify_installed(Vsn) =:= ok,
    #{
        erts_version => list_to_binary(Vsn),
        otp_version => list_to_binary(beamdiag_emu_install:otp_version()),
        bin_dir => list_to_binary(BinDir),
        installed => Installed,
        working => Working
    }.

%% @doc The Debian packages a build from this kind of source still needs.
-spec missing_packages(source()) -> [string()].
missing_packages(Source) ->
    Checks =
        [
            {"build-essential", fun() -> all_exe(["gcc", "g++", "make"]) end},
            {"perl", fun() -> all_exe(["perl"]) end},
            {"libncurses-dev", fun() ->
                lists:any(fun filelib:is_regular/1, [
                    "/usr/include/ncurses.h", "/usr/include/curses.h", "/usr/include/term.h"
                ])
            end}
        ] ++
            case Source of
                debian -> [{"dpkg-dev", fun() -> all_exe(["dpkg-source", "apt-get"]) end}];
                {tarball, _} -> [{"xz-utils", fun() -> all_exe(["tar", "xz"]) end}];
                {dir, _} -> []
            end,
    [Pkg || {Pkg, Check} <- Checks, not Check()].

-ifdef(TEST).
%% @doc What to give `emu-type build' for a node that does not count locks
%% (`beamdiag_lock_advice:emulator/1').
-spec advice(beamdiag_agent_vm:settings()) -> binary().
advice(Settings) ->
    beamdiag_lock_advice:emulator(Settings).
-endif.

%% @doc Turns an error reason from this module into a sentence.
-spec format_error(term()) -> iolist().
format_error({missing_packages, Pkgs}) ->
    [
        "missing build packages: ", lists:join(" ", Pkgs), "\n",
        "install them with: apt-get install --no-install-recommends ", lists:join(" ", Pkgs)
    ];
format_error({version_mismatch, #{installed := I, source := S}}) ->
    io_lib:format(
        "the source is OTP ~s (ERTS ~s) but the installed system is OTP ~s (ERTS ~s); "
        "an emulator must match the installed ERTS exactly: use the source of OTP ~s",
        [maps:get(otp, S), maps:get(erts, S), maps:get(otp, I), maps:get(erts, I),
         maps:get(otp, I)]
    );
format_error({not_otp_source, Path}) ->
    ["no OTP source found in ", Path, " (expected OTP_VERSION, erts/vsn.mk and configure)"];
format_error({no_source, Path}) ->
    ["--otp-src ", Path, " is neither a directory nor a file"];
format_error(no_deb_src) ->
    ["apt has no deb-src entry, so `apt-get source erlang' cannot fetch the source; "
     "rerun with --add-deb-src (adds ", beamdiag_emu_apt:deb_src_file(), ") or give "
     "--otp-src DIR|TARBALL"];
format_error(no_debian_erlang) ->
    "the installed Erlang is not Debian's erlang-base package: give the matching "
    "OTP source with --otp-src DIR|TARBALL";
format_error(no_debian_mirrors) ->
    "found no Debian 'deb' entry in the apt sources to derive a deb-src entry from";
format_error(need_root) ->
    "fetching the Debian source (apt-get update) and installing need root";
format_error({command_failed, Cmd, Status, Tail}) ->
    io_lib:format("~ts exited with status ~b; last output:~n~ts", [Cmd, Status, Tail]);
format_error({not_found, Exe}) ->
    ["program not found: ", Exe];
format_error({not_built, Missing}) ->
    ["the build did not produce ", lists:join(", ", Missing)];
format_error({file, Op, Path, Why}) ->
    io_lib:format("cannot ~s ~ts: ~ts", [Op, Path, file:format_error(Why)]);
format_error({verify_failed, Why}) ->
    io_lib:format("the installed lock-counting emulator does not work: ~ts", [Why]);
format_error(Other) ->
    io_lib:format("~p", [Other]).

%%%===================================================================
%%% Internal
%%%===================================================================

-spec build_checked(settled()) -> {ok, report()} | {error, {beamdiag_emu_type, term()}}.
build_checked(Opts = #{install := Install, cache := Cache0, progress := P}) ->
    Vsn = beamdiag_emu_install:erts_version(),
    Base = #{erts_version => list_to_binary(Vsn),
             bin_dir => list_to_binary(beamdiag_emu_install:bin_dir())},
    Cache =
        case {Cache0, Install} of
            {undefined, false} -> filename:basedir(user_cache, "beamdiag");
            _ -> Cache0
        end,
    CacheDir =
        case Cache of
            undefined -> undefined;
            _ -> filename:join(filename:absname(Cache), Vsn)
        end,
    try
        case Install andalso beamdiag_emu_install:installed_matching(Vsn) of
            true ->
                P(["lock-counting emulator for ERTS ", Vsn, " is already installed in ",
                   beamdiag_emu_install:bin_dir(), " and works; nothing to do\n"]),
                ok = beamdiag_emu_cache:fill_cache(CacheDir, beamdiag_emu_install:bin_dir(), P),
                {ok, with_cache(Base#{action => already_installed, installed => true}, CacheDir)};
            false ->
                build_or_reuse(Opts, Vsn, CacheDir, Base)
        end
    catch
        throw:{?MODULE, _} = Error -> {error, Error}
    end.

-spec build_or_reuse(settled(), string(), string() | undefined, base()) -> {ok, report()}.
build_or_reuse(Opts = #{install := Install, progress := P}, Vsn, CacheDir, Base) ->
    case CacheDir =/= undefined andalso beamdiag_emu_cache:cache_ok(CacheDir, Vsn) of
        true ->
            P(["using the lock-counting emulator cached in ", CacheDir, "\n"]),
            case Install of
                true ->
                    ok = beamdiag_emu_install:install(CacheDir, Vsn, P),
                    {ok, Base#{action => installed_from_cache, installed => true,
                               cache_dir => list_to_binary(CacheDir)}};
                false ->
                    {ok, Base#{action => from_cache, installed => false,
                               cache_dir => list_to_binary(CacheDir)}}
            end;
        false ->
            T0 = erlang:monotonic_time(second),
            {Source, Desc} = beamdiag_emu_source:source(Opts),
            case missing_packages(Source) of
                [] -> ok;
                Pkgs -> throw({?MODULE, {missing_packages, Pkgs}})
            end,
            Tmp = beamdiag_emu_os:make_temp_dir(),
            try
                {BuiltDir, Note} = beamdiag_emu_build:build_in(Tmp, Source, Opts, Vsn),
                Desc1 = Desc ++ Note,
                Keep =
                    case CacheDir of
                        undefined -> BuiltDir;
                        _ -> beamdiag_emu_cache:store_cache(BuiltDir, CacheDir, Vsn, Desc1, P)
                    end,
                _ =
                    case Install of
                        true -> beamdiag_emu_install:install(Keep, Vsn, P);
                        false -> ok
                    end,
                Secs = erlang:monotonic_time(second) - T0,
                P(io_lib:format("built the lock-counting emulator in ~b s~n", [Secs])),
                {ok, with_cache(
                    Base#{action => built, installed => Install, seconds => Secs,
                          source => unicode:characters_to_binary(Desc1)},
                    CacheDir
                )}
            after
                P(["removing ", Tmp, "\n"]),
                _ = file:del_dir_r(Tmp)
            end
    end.

-spec with_cache(report(), string() | undefined) -> report().
with_cache(Report, undefined) -> Report;
with_cache(Report, CacheDir) -> Report#{cache_dir => list_to_binary(CacheDir)}.

-spec all_exe([string()]) -> boolean().
all_exe(Names) ->
    lists:all(fun(N) -> os:find_executable(N) =/= false end, Names).
