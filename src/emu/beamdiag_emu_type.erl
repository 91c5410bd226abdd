%%% @doc Builds and installs the lock-counting emulator for the installed ERTS.
%%%
%%% Lock counting (`beamdiag_agent_lcnt') needs an emulator built for it, and the
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
%%% ```
%%% 1> beamdiag_emu_type:status().
%%% #{erts_version => <<"13.1.5">>, installed => false, ...}
%%% 2> beamdiag_emu_type:build(#{install => true, add_deb_src => true,
%%%        progress => fun(D) -> io:put_chars(standard_error, D) end}).
%%% {ok, #{action => built, installed => true, seconds => 372, ...}}
%%% '''
-module(beamdiag_emu_type).

-export([build/1, status/0, advice/1, format_error/1]).
%% Called as Module:format_error/1 on an {error, {Module, Reason}} value.
-ignore_xref([{format_error, 1}]).

-export_type([options/0, report/0]).

-ifdef(TEST).
-export([deb822/1, has_deb_src/2, one_line_debs/1, missing_packages/1]).
-endif.

-define(LCNT_BEAM, "beam.lcnt.smp").
-define(CHILD_SETUP, "erl_child_setup.lcnt").
-define(FILES, [?LCNT_BEAM, ?CHILD_SETUP]).
-define(INFO, "BUILD_INFO").
-define(DEB_SRC_FILE, "/etc/apt/sources.list.d/beamdiag-deb-src.sources").
-define(CONFIGURE_ARGS, [
    "--with-microstate-accounting=extra",
    "--without-javac",
    "--without-wx",
    "--without-odbc",
    "--without-jinterface",
    "--without-ssl"
]).

-type options() :: #{
    otp_src => string() | undefined,
    install => boolean(),
    add_deb_src => boolean(),
    cache => string() | undefined,
    progress => fun((iodata()) -> ok),
    jobs => pos_integer()
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
-type source() :: {dir, string()} | {tarball, string()} | debian.

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Builds the lock-counting emulator if needed and, with `install',
%% installs it. Options: `otp_src' (a source tree or tarball; default: the
%% Debian source package), `install', `add_deb_src', `cache' (a directory),
%% `progress' (receives build output line by line), `jobs' (parallel make
%% jobs, default the number of logical processors). Without `install' or
%% `cache' the binaries are kept in the user cache directory.
-spec build(options()) -> {ok, report()} | {error, {beamdiag_emu_type, term()}}.
build(Opts0) when is_map(Opts0) ->
    Defaults = #{
        otp_src => undefined,
        install => false,
        add_deb_src => false,
        cache => undefined,
        progress => fun(_) -> ok end,
        jobs => jobs()
    },
    case maps:keys(maps:without(maps:keys(Defaults), Opts0)) of
        [] -> build_checked(maps:merge(Defaults, Opts0));
        Unknown -> {error, {?MODULE, {unknown_options, Unknown}}}
    end.

%% @doc Whether the lock-counting emulator is installed for the running
%% ERTS, and whether it starts and counts locks.
-spec status() -> #{atom() => boolean() | binary()}.
status() ->
    Vsn = erts_version(),
    BinDir = bin_dir(),
    Installed = lists:all(fun(F) -> filelib:is_regular(filename:join(BinDir, F)) end, ?FILES),
    Working = Installed andalso verify_installed(Vsn) =:= ok,
    #{
        erts_version => list_to_binary(Vsn),
        otp_version => list_to_binary(otp_version()),
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

%% @doc What to give `emu-type build' for a node that does not count locks,
%% from the node's settings (`beamdiag_agent_vm:settings/0'): the exact OTP
%% source it needs, the command, and the restart. The build must run where
%% the node's Erlang is installed, by a beamdiag that this OTP can run.
-spec advice(map()) -> binary().
advice(Settings = #{lcnt_emulator_installed := true}) ->
    Otp = version(maps:get(otp_version, Settings, undefined), <<"?">>),
    iolist_to_binary([
        "locks not counted: the node runs OTP ", Otp, " on the stock emulator, and the "
        "lock-counting emulator is installed beside it: restart the node with -emu_type lcnt "
        "(for a release: add it to vm.args, or ERL_FLAGS=\"-emu_type lcnt\") and diagnose "
        "again"
    ]);
advice(Settings) ->
    Rel = version(maps:get(otp_release, Settings, undefined), <<"?">>),
    Otp = version(maps:get(otp_version, Settings, undefined), Rel),
    Erts = version(maps:get(erts_version, Settings, undefined), <<"?">>),
    Tarball = ["otp_src_", Otp, ".tar.gz"],
    iolist_to_binary([
        "locks not counted: the node runs OTP ", Otp, " (ERTS ", Erts, ") on the stock emulator. "
        "To name contended locks, build the lock-counting emulator for exactly that "
        "release where the node's Erlang is installed (its machine or container, as root, "
        "with a beamdiag escript that OTP ", Rel, " loads: build it there with rebar3 if "
        "in doubt): beamdiag emu-type build --install "
        "--otp-src ", Tarball, ", the source from "
        "https://github.com/erlang/otp/releases/download/OTP-", Otp, "/", Tarball,
        " (for Debian's erlang packages --add-deb-src fetches it instead); then restart "
        "the node with -emu_type lcnt"
    ]).

%% A version number from a node's settings (which come from the target:
%% anything else becomes the default).
-spec version(term(), binary()) -> binary().
version(V, Default) when is_binary(V), byte_size(V) =< 32 ->
    case re:run(V, "^[0-9]+(\\.[0-9]+)*$", [{capture, none}]) of
        match -> V;
        nomatch -> Default
    end;
version(_, Default) ->
    Default.

%% @doc Turns an error reason from this module into a sentence.
-spec format_error(term()) -> iolist().
format_error({unknown_options, Keys}) ->
    io_lib:format("unknown options: ~p", [Keys]);
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
    "apt has no deb-src entry, so `apt-get source erlang' cannot fetch the source; "
    "rerun with --add-deb-src (adds " ?DEB_SRC_FILE ") or give --otp-src DIR|TARBALL";
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

-spec build_checked(map()) -> {ok, report()} | {error, {beamdiag_emu_type, term()}}.
build_checked(Opts = #{install := Install, cache := Cache0, progress := P}) ->
    Vsn = erts_version(),
    Base = #{erts_version => list_to_binary(Vsn), bin_dir => list_to_binary(bin_dir())},
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
        case Install andalso installed_matching(Vsn) of
            true ->
                P(["lock-counting emulator for ERTS ", Vsn, " is already installed in ",
                   bin_dir(), " and works; nothing to do\n"]),
                ok = fill_cache(CacheDir, bin_dir(), P),
                {ok, with_cache(Base#{action => already_installed, installed => true}, CacheDir)};
            false ->
                build_or_reuse(Opts, Vsn, CacheDir, Base)
        end
    catch
        throw:{?MODULE, _} = Error -> {error, Error}
    end.

-spec build_or_reuse(map(), string(), string() | undefined, map()) -> {ok, report()}.
build_or_reuse(Opts = #{install := Install, progress := P}, Vsn, CacheDir, Base) ->
    case CacheDir =/= undefined andalso cache_ok(CacheDir, Vsn) of
        true ->
            P(["using the lock-counting emulator cached in ", CacheDir, "\n"]),
            case Install of
                true ->
                    ok = install(CacheDir, Vsn, P),
                    {ok, Base#{action => installed_from_cache, installed => true,
                               cache_dir => list_to_binary(CacheDir)}};
                false ->
                    {ok, Base#{action => from_cache, installed => false,
                               cache_dir => list_to_binary(CacheDir)}}
            end;
        false ->
            T0 = erlang:monotonic_time(second),
            {Source, Desc} = source(Opts),
            case missing_packages(Source) of
                [] -> ok;
                Pkgs -> throw({?MODULE, {missing_packages, Pkgs}})
            end,
            Tmp = make_temp_dir(),
            try
                {BuiltDir, Note} = build_in(Tmp, Source, Opts, Vsn),
                Desc1 = Desc ++ Note,
                Keep =
                    case CacheDir of
                        undefined -> BuiltDir;
                        _ -> store_cache(BuiltDir, CacheDir, Vsn, Desc1, P)
                    end,
                _ =
                    case Install of
                        true -> install(Keep, Vsn, P);
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

-spec with_cache(map(), string() | undefined) -> report().
with_cache(Report, undefined) -> Report;
with_cache(Report, CacheDir) -> Report#{cache_dir => list_to_binary(CacheDir)}.

-spec source(map()) -> {source(), string()}.
source(#{otp_src := undefined}) ->
    {debian, "Debian source package"};
source(#{otp_src := Path}) ->
    case {filelib:is_dir(Path), filelib:is_regular(Path)} of
        {true, _} -> {{dir, filename:absname(Path)}, Path};
        {_, true} -> {{tarball, filename:absname(Path)}, Path};
        _ -> throw({?MODULE, {no_source, Path}})
    end.

%% Gets the source into Tmp, checks its version, configures and builds;
%% returns the directory holding the built files and what to add to the
%% source's description.
-spec build_in(string(), source(), map(), string()) -> {string(), string()}.
build_in(Tmp, Source, Opts = #{progress := P, jobs := Jobs}, Vsn) ->
    {Src, Note} = fetch_source(Tmp, Source, Opts),
    ok = check_version(Src, Vsn),
    Env = [{"ERL_TOP", Src}, {"MAKEFLAGS", false}, {"MAKELEVEL", false}],
    P(["configuring ", Src, "\n"]),
    ok = run(filename:join(Src, "configure"), ?CONFIGURE_ARGS, Src, Env, P),
    J = "-j" ++ integer_to_list(Jobs),
    P("building the lock-counting emulator (several minutes)\n"),
    ok = run(exe("make"), ["-C", "erts/lib_src", "lcnt", J], Src, Env, P),
    ok = run(exe("make"), ["-C", "erts/emulator", "lcnt", J], Src, Env, P),
    Built = filelib:wildcard(filename:join([Src, "bin", "*", ?LCNT_BEAM])),
    case Built of
        [Beam | _] ->
            Dir = filename:dirname(Beam),
            case [F || F <- ?FILES, not filelib:is_regular(filename:join(Dir, F))] of
                [] -> {Dir, Note};
                Missing -> throw({?MODULE, {not_built, Missing}})
            end;
        [] ->
            throw({?MODULE, {not_built, [?LCNT_BEAM]}})
    end.

-spec fetch_source(string(), source(), map()) -> {string(), string()}.
fetch_source(Tmp, {dir, Dir}, #{progress := P}) ->
    %% Configure and make write into the tree: build in a copy.
    Root = otp_root(Dir),
    P(["copying the OTP source in ", Root, " to ", Tmp, "\n"]),
    Copy = filename:join(Tmp, "otp"),
    ok = run(exe("cp"), ["-a", Root, Copy], Tmp, [], P),
    {Copy, ""};
fetch_source(Tmp, {tarball, File}, #{progress := P}) ->
    P(["unpacking ", File, "\n"]),
    ok = run(exe("tar"), ["-xf", File, "-C", Tmp], Tmp, [], P),
    {otp_root(Tmp), ""};
fetch_source(Tmp, debian, Opts = #{progress := P}) ->
    Version =
        case run_output(exe("dpkg-query"), ["-W", "-f=${Version}", "erlang-base"]) of
            {0, V} when V =/= "" -> V;
            _ -> throw({?MODULE, no_debian_erlang})
        end,
    ok = ensure_deb_src(Opts),
    Spec = "erlang=" ++ Version,
    P(["fetching the source of ", Spec, " with apt-get source\n"]),
    AptEnv = [{"DEBIAN_FRONTEND", "noninteractive"}],
    case run(exe("apt-get"), ["source", "-q", Spec], Tmp, AptEnv, P, nothrow) of
        ok ->
            {otp_root(Tmp), ""};
        {error, _} ->
            P("apt-get source failed; updating the package lists and retrying\n"),
            ok = apt_update(P),
            case run(exe("apt-get"), ["source", "-q", Spec], Tmp, AptEnv, P, nothrow) of
                ok -> {otp_root(Tmp), ""};
                {error, Reason} -> upstream_tarball(Tmp, Reason, P)
            end
    end.

%% When a mirror serves the upstream tarball of the source package but not
%% Debian's parts (the .dsc and the packaging), apt-get source fails after
%% downloading the tarball. The upstream source alone builds the emulator
%% (Debian's patches are then not applied); check_version/2 still checks
%% that it is the installed ERTS.
-spec upstream_tarball(string(), term(), fun((iodata()) -> ok)) -> {string(), string()}.
upstream_tarball(Tmp, Reason, P) ->
    case filelib:wildcard(filename:join(Tmp, "erlang_*.orig.tar.*")) of
        [Tarball | _] ->
            P(["apt-get source fetched only the upstream tarball ", filename:basename(Tarball),
               "; building from it without Debian's patches\n"]),
            ok = run(exe("tar"), ["-xf", Tarball, "-C", Tmp], Tmp, [], P),
            ok = file_op("delete", Tarball, file:delete(Tarball)),
            {otp_root(Tmp), ": only its upstream tarball " ++ filename:basename(Tarball) ++
                 " (the Debian parts could not be fetched), without Debian's patches"};
        [] ->
            throw({?MODULE, Reason})
    end.

%% The directory under Root that holds an OTP source tree.
-spec otp_root(string()) -> string().
otp_root(Root) ->
    Candidates = [Root | filelib:wildcard(filename:join(Root, "*"))],
    case [D || D <- Candidates, is_otp_tree(D)] of
        [D | _] -> D;
        [] -> throw({?MODULE, {not_otp_source, Root}})
    end.

-spec is_otp_tree(string()) -> boolean().
is_otp_tree(D) ->
    lists:all(
        fun(F) -> filelib:is_regular(filename:join(D, F)) end,
        ["OTP_VERSION", "configure", "erts/vsn.mk"]
    ).

-spec check_version(string(), string()) -> ok.
check_version(Src, ErtsVsn) ->
    {ok, OtpBin} = file:read_file(filename:join(Src, "OTP_VERSION")),
    SrcOtp = string:trim(hd(string:split(binary_to_list(OtpBin), "\n"))),
    {ok, VsnMk} = file:read_file(filename:join([Src, "erts", "vsn.mk"])),
    SrcErts =
        case re:run(VsnMk, "^VSN\\s*=\\s*(\\S+)", [multiline, {capture, all_but_first, list}]) of
            {match, [V]} -> V;
            nomatch -> "unknown"
        end,
    case {SrcErts, SrcOtp} =:= {ErtsVsn, otp_version()} of
        true ->
            ok;
        false ->
            throw({?MODULE, {version_mismatch, #{
                installed => #{otp => otp_version(), erts => ErtsVsn},
                source => #{otp => SrcOtp, erts => SrcErts}
            }}})
    end.

%% Makes sure apt knows a deb-src entry; adds one only when asked to.
-spec ensure_deb_src(map()) -> ok.
ensure_deb_src(#{add_deb_src := Add, progress := P}) ->
    case has_deb_src() of
        true ->
            ok;
        false when not Add ->
            throw({?MODULE, no_deb_src});
        false ->
            Stanzas =
                case deb_mirrors() of
                    [] -> throw({?MODULE, no_debian_mirrors});
                    Ss -> Ss
                end,
            Text = [
                ["Types: deb-src\n", [[K, ": ", V, "\n"] || {K, V} <- S], "\n"]
             || S <- Stanzas
            ],
            Header = "# Added by beamdiag emu-type build --add-deb-src (source of the emulator)\n",
            case file:write_file(?DEB_SRC_FILE, [Header | Text]) of
                ok -> ok;
                {error, eacces} -> throw({?MODULE, need_root});
                {error, Why} -> throw({?MODULE, {file, "write", ?DEB_SRC_FILE, Why}})
            end,
            P(["added deb-src entries to ", ?DEB_SRC_FILE, "\n"]),
            apt_update(P)
    end.

-spec apt_update(fun((iodata()) -> ok)) -> ok.
apt_update(P) ->
    P("running apt-get update\n"),
    ok = run(exe("apt-get"), ["update", "-q"], "/", [{"DEBIAN_FRONTEND", "noninteractive"}], P).

%% True when some apt source (one-line or deb822 format) has deb-src.
-spec has_deb_src() -> boolean().
has_deb_src() ->
    lists:any(
        fun(File) ->
            case file:read_file(File) of
                {ok, B} -> has_deb_src(filename:extension(File), B);
                _ -> false
            end
        end,
        apt_source_files()
    ).

-spec has_deb_src(string(), binary()) -> boolean().
has_deb_src(".sources", B) ->
    lists:any(
        fun(Stanza) ->
            Types = string:lexemes(maps:get("Types", Stanza, ""), " \t"),
            lists:member("deb-src", Types) andalso
                string:lowercase(maps:get("Enabled", Stanza, "yes")) =/= "no"
        end,
        deb822(B)
    );
has_deb_src(_, B) ->
    re:run(B, "^\\s*deb-src\\s", [multiline]) =/= nomatch.

-spec apt_source_files() -> [string()].
apt_source_files() ->
    ["/etc/apt/sources.list" | filelib:wildcard("/etc/apt/sources.list.d/*.{list,sources}")].

%% The URIs/Suites/Components/Signed-By of the Debian 'deb' entries, in
%% deb822 files and in one-line lists (as debootstrap writes them).
-spec deb_mirrors() -> [[{string(), string()}]].
deb_mirrors() ->
    Files = filelib:wildcard("/etc/apt/sources.list.d/*.sources"),
    Lists = ["/etc/apt/sources.list" | filelib:wildcard("/etc/apt/sources.list.d/*.list")],
    lists:usort(
        [S || F <- Lists, {ok, B} <- [file:read_file(F)], S <- one_line_debs(B)] ++
            deb822_mirrors(Files)
    ).

%% The 'deb' lines of a one-line sources list, as deb822 fields. Options in
%% brackets ([arch=amd64 signed-by=...]) are dropped.
-spec one_line_debs(binary()) -> [[{string(), string()}]].
one_line_debs(B) ->
    [
        [{"URIs", Uri}, {"Suites", Suite}, {"Components", lists:flatten(lists:join(" ", Comps))}]
     || Line <- string:split(binary_to_list(B), "\n", all),
        ["deb" | Rest] <- [string:lexemes(strip_options(Line), " \t")],
        [Uri, Suite | Comps] <- [Rest],
        Comps =/= []
    ].

-spec strip_options(string()) -> string().
strip_options(Line) ->
    case string:split(Line, "[") of
        [Before, After] ->
            case string:split(After, "]") of
                [_Opts, Rest] -> Before ++ " " ++ Rest;
                _ -> Line
            end;
        _ ->
            Line
    end.

-spec deb822_mirrors([string()]) -> [[{string(), string()}]].
deb822_mirrors(Files) ->
    lists:usort([
        [{K, maps:get(K, S)} || K <- ["URIs", "Suites", "Components", "Signed-By"],
                                maps:is_key(K, S)]
     || F <- Files,
        F =/= ?DEB_SRC_FILE,
        {ok, B} <- [file:read_file(F)],
        S <- deb822(B),
        lists:member("deb", string:lexemes(maps:get("Types", S, ""), " \t")),
        string:lowercase(maps:get("Enabled", S, "yes")) =/= "no",
        maps:is_key("URIs", S),
        maps:is_key("Suites", S)
    ]).

%% deb822 stanzas as maps of single-line fields (comments dropped,
%% continuation lines appended).
-spec deb822(binary()) -> [#{string() => string()}].
deb822(B) ->
    Lines = string:split(binary_to_list(B), "\n", all),
    {Stanzas, Last, _} = lists:foldl(fun deb822_line/2, {[], #{}, undefined}, Lines),
    lists:reverse([S || S <- [Last | Stanzas], map_size(S) > 0]).

-spec deb822_line(string(), {[map()], map(), string() | undefined}) ->
    {[map()], map(), string() | undefined}.
deb822_line(Line, {Acc, Cur, LastKey}) ->
    case Line of
        "#" ++ _ ->
            {Acc, Cur, LastKey};
        [C | _] when (C =:= $\s orelse C =:= $\t), LastKey =/= undefined ->
            case string:trim(Line) of
                "" -> {[Cur | Acc], #{}, undefined};
                "." -> {Acc, Cur, LastKey};
                More -> {Acc, Cur#{LastKey := maps:get(LastKey, Cur) ++ " " ++ More}, LastKey}
            end;
        _ ->
            case string:trim(Line) of
                "" ->
                    {[Cur | Acc], #{}, undefined};
                T ->
                    case string:split(T, ":") of
                        [K, V] -> {Acc, Cur#{string:trim(K) => string:trim(V)}, string:trim(K)};
                        _ -> {Acc, Cur, LastKey}
                    end
            end
    end.

%%% Cache and install

-spec cache_ok(string(), string()) -> boolean().
cache_ok(Dir, Vsn) ->
    lists:all(fun(F) -> filelib:is_regular(filename:join(Dir, F)) end, ?FILES) andalso
        case file:read_file(filename:join(Dir, ?INFO)) of
            {ok, B} -> re:run(B, ["^erts_version ", Vsn, "$"], [multiline]) =/= nomatch;
            _ -> false
        end.

-spec store_cache(string(), string(), string(), string(), fun((iodata()) -> ok)) -> string().
store_cache(From, CacheDir, Vsn, Desc, P) ->
    ok = mkdir_p(CacheDir),
    _ = [ok = copy_exec(filename:join(From, F), filename:join(CacheDir, F)) || F <- ?FILES],
    Info = [
        "erts_version ", Vsn, "\n",
        "otp_version ", otp_version(), "\n",
        "source ", Desc, "\n",
        "configure ", lists:join(" ", ?CONFIGURE_ARGS), "\n"
    ],
    ok = write_file(filename:join(CacheDir, ?INFO), Info),
    P(["kept the lock-counting emulator in ", CacheDir, "\n"]),
    CacheDir.

%% Copies an installed emulator into an empty cache.
-spec fill_cache(string() | undefined, string(), fun((iodata()) -> ok)) -> ok.
fill_cache(undefined, _BinDir, _P) ->
    ok;
fill_cache(CacheDir, BinDir, P) ->
    Vsn = erts_version(),
    case cache_ok(CacheDir, Vsn) of
        true ->
            ok;
        false ->
            _ = store_cache(BinDir, CacheDir, Vsn, "installed emulator", P),
            ok
    end.

-spec install(string(), string(), fun((iodata()) -> ok)) -> ok.
install(From, Vsn, P) ->
    BinDir = bin_dir(),
    _ = [ok = copy_exec(filename:join(From, F), filename:join(BinDir, F)) || F <- ?FILES],
    P(["installed ", lists:join(" and ", ?FILES), " in ", BinDir, "\n"]),
    case verify_installed(Vsn) of
        ok ->
            P("checked: `erl -emu_type lcnt' starts, counts locks and has the extra "
              "microstate accounting states\n");
        {error, Why} ->
            throw({?MODULE, {verify_failed, Why}})
    end.

-spec installed_matching(string()) -> boolean().
installed_matching(Vsn) ->
    lists:all(fun(F) -> filelib:is_regular(filename:join(bin_dir(), F)) end, ?FILES) andalso
        verify_installed(Vsn) =:= ok.

%% Starts `erl -emu_type lcnt' and checks its version, lock counting and
%% extra microstate accounting.
-spec verify_installed(string()) -> ok | {error, string()}.
verify_installed(Vsn) ->
    Erl = filename:join([code:root_dir(), "bin", "erl"]),
    Expr =
        "io:format(\"~s ~p ~p~n\", [erlang:system_info(version), "
        "erlang:system_info(lock_counting), "
        "lists:all(fun(#{counters := C}) -> maps:is_key(alloc, C) end, "
        "erlang:statistics(microstate_accounting))]), erlang:halt().",
    case run_output(Erl, ["-emu_type", "lcnt", "-noshell", "-noinput", "-eval", Expr]) of
        {0, Out} ->
            case string:lexemes(Out, " \n") of
                [Vsn, "true", "true"] -> ok;
                [Vsn, "true", "false"] -> {error, "no extra microstate accounting states"};
                _ -> {error, "unexpected answer: " ++ Out}
            end;
        {Status, Out} ->
            {error, io_lib:format("exit status ~b: ~ts", [Status, Out])}
    end.

-spec copy_exec(string(), string()) -> ok.
copy_exec(From, To) ->
    Tmp = To ++ ".beamdiag-tmp",
    case file:copy(From, Tmp) of
        {ok, _} -> ok;
        {error, Why} -> throw({?MODULE, {file, "copy to", Tmp, Why}})
    end,
    ok = file_op("chmod", Tmp, file:change_mode(Tmp, 8#755)),
    ok = file_op("rename to", To, file:rename(Tmp, To)).

-spec mkdir_p(string()) -> ok.
mkdir_p(Dir) ->
    file_op("create", Dir, filelib:ensure_dir(filename:join(Dir, "x"))).

-spec write_file(string(), iodata()) -> ok.
write_file(Path, Data) ->
    file_op("write", Path, file:write_file(Path, Data)).

-spec file_op(string(), string(), ok | {error, term()}) -> ok.
file_op(_Op, _Path, ok) -> ok;
file_op(Op, Path, {error, Why}) -> throw({?MODULE, {file, Op, Path, Why}}).

-spec make_temp_dir() -> string().
make_temp_dir() ->
    Base =
        case os:getenv("TMPDIR") of
            false -> "/tmp";
            "" -> "/tmp";
            T -> T
        end,
    Dir = filename:join(
        Base,
        "beamdiag-emu-type-" ++ os:getpid() ++ "-" ++
            integer_to_list(erlang:unique_integer([positive]))
    ),
    ok = file_op("create", Dir, file:make_dir(Dir)),
    Dir.

%%% Running programs

-spec exe(string()) -> string().
exe(Name) ->
    case os:find_executable(Name) of
        false -> throw({?MODULE, {not_found, Name}});
        Path -> Path
    end.

-spec all_exe([string()]) -> boolean().
all_exe(Names) ->
    lists:all(fun(N) -> os:find_executable(N) =/= false end, Names).

-spec run(string(), [string()], string(), [{string(), string() | false}], fun((iodata()) -> ok)) ->
    ok.
run(Exe, Args, Dir, Env, P) ->
    case run(Exe, Args, Dir, Env, P, nothrow) of
        ok -> ok;
        {error, Reason} -> throw({?MODULE, Reason})
    end.

%% Runs a program with explicit arguments, streaming its output lines to
%% the progress fun and keeping the last 20 for an error report.
-spec run(string(), [string()], string(), [{string(), string() | false}], fun((iodata()) -> ok),
          nothrow) -> ok | {error, term()}.
run(Exe, Args, Dir, Env, P, nothrow) ->
    Port = open_port(
        {spawn_executable, Exe},
        [{args, Args}, {cd, Dir}, {env, Env}, {line, 4096}, binary, exit_status,
         stderr_to_stdout, use_stdio, hide]
    ),
    case collect_lines(Port, P, []) of
        {0, _} ->
            ok;
        {Status, Tail} ->
            Cmd = lists:join(" ", [filename:basename(Exe) | Args]),
            {error, {command_failed, Cmd, Status, lists:join("\n", lists:reverse(Tail))}}
    end.

-spec collect_lines(port(), fun((iodata()) -> ok), [binary()]) -> {integer(), [binary()]}.
collect_lines(Port, P, Tail) ->
    receive
        {Port, {data, {Flag, Line}}} ->
            P(["  ", Line, case Flag of eol -> "\n"; noeol -> "" end]),
            collect_lines(Port, P, lists:sublist([Line | Tail], 20));
        {Port, {exit_status, Status}} ->
            {Status, Tail}
    end.

%% Runs a program and returns its exit status and output.
-spec run_output(string(), [string()]) -> {integer(), string()}.
run_output(Exe, Args) ->
    Port = open_port(
        {spawn_executable, Exe},
        [{args, Args}, binary, exit_status, stderr_to_stdout, use_stdio, hide]
    ),
    run_output_loop(Port, []).

-spec run_output_loop(port(), [binary()]) -> {integer(), string()}.
run_output_loop(Port, Acc) ->
    receive
        {Port, {data, D}} -> run_output_loop(Port, [D | Acc]);
        {Port, {exit_status, S}} -> {S, unicode:characters_to_list(lists:reverse(Acc))}
    end.

%%% The installed system

-spec erts_version() -> string().
erts_version() ->
    erlang:system_info(version).

-spec bin_dir() -> string().
bin_dir() ->
    filename:join([code:root_dir(), "erts-" ++ erts_version(), "bin"]).

-spec otp_version() -> string().
otp_version() ->
    Rel = erlang:system_info(otp_release),
    case file:read_file(filename:join([code:root_dir(), "releases", Rel, "OTP_VERSION"])) of
        {ok, B} -> string:trim(binary_to_list(B));
        _ -> Rel
    end.

-spec jobs() -> pos_integer().
jobs() ->
    case erlang:system_info(logical_processors_available) of
        N when is_integer(N), N > 0 -> N;
        _ -> erlang:system_info(schedulers_online)
    end.
