%%% @doc The OTP source of exactly the installed version: a given tree
%%% (copied, since configure and make write into it), a tarball, or on
%%% Debian `apt-get source erlang' of the installed package version (or,
%%% when a mirror serves only its upstream tarball, that tarball without
%%% Debian's patches). The version of the source is checked against the
%%% installed ERTS before anything is built.
%%%
%%% ```
%%% 1> beamdiag_emu_source:source(#{otp_src => "otp_src_25.3.2.tar.gz"}).
%%% {{tarball, "/root/otp_src_25.3.2.tar.gz"}, "otp_src_25.3.2.tar.gz"}
%%% '''
-module(beamdiag_emu_source).

-export([source/1, fetch_source/3, check_version/2]).

-export_type([source/0]).

%% Where the OTP source comes from.
-type source() :: {dir, string()} | {tarball, string()} | debian.

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The source the build options name, and how to describe it.
-spec source(beamdiag_emu_type:settled()) -> {source(), string()}.
source(#{otp_src := undefined}) ->
    {debian, "Debian source package"};
source(#{otp_src := Path}) ->
    case {filelib:is_dir(Path), filelib:is_regular(Path)} of
        {true, _} -> {{dir, filename:absname(Path)}, Path};
        {_, true} -> {{tarball, filename:absname(Path)}, Path};
        _ -> throw({beamdiag_emu_type, {no_source, Path}})
    end.

%% @doc Gets the source into Tmp: the directory of its OTP tree and what to
%% add to the source's description.
-spec fetch_source(string(), source(), beamdiag_emu_type:settled()) -> {string(), string()}.
fetch_source(Tmp, {dir, Dir}, #{progress := P}) ->
    %% Configure and make write into the tree: build in a copy.
    Root = otp_root(Dir),
    P(["copying the OTP source in ", Root, " to ", Tmp, "\n"]),
    Copy = filename:join(Tmp, "otp"),
    ok = beamdiag_emu_os:run(beamdiag_emu_os:exe("cp"), ["-a", Root, Copy], Tmp, [], P),
    {Copy, ""};
fetch_source(Tmp, {tarball, File}, #{progress := P}) ->
    P(["unpacking ", File, "\n"]),
    ok = beamdiag_emu_os:run(beamdiag_emu_os:exe("tar"), ["-xf", File, "-C", Tmp], Tmp, [], P),
    {otp_root(Tmp), ""};
fetch_source(Tmp, debian, Opts = #{progress := P}) ->
    Version =
        case beamdiag_emu_os:run_output(beamdiag_emu_os:exe("dpkg-query"),
                                        ["-W", "-f=${Version}", "erlang-base"]) of
            {0, V} when V =/= "" -> V;
            _ -> throw({beamdiag_emu_type, no_debian_erlang})
        end,
    ok = beamdiag_emu_apt:ensure_deb_src(Opts),
    Spec = "erlang=" ++ Version,
    P(["fetching the source of ", Spec, " with apt-get source\n"]),
    AptEnv = [{"DEBIAN_FRONTEND", "noninteractive"}],
    AptGet = beamdiag_emu_os:exe("apt-get"),
    case beamdiag_emu_os:run(AptGet, ["source", "-q", Spec], Tmp, AptEnv, P, nothrow) of
        ok ->
            {otp_root(Tmp), ""};
        {error, _} ->
            P("apt-get source failed; updating the package lists and retrying\n"),
            ok = beamdiag_emu_apt:apt_update(P),
            case beamdiag_emu_os:run(AptGet, ["source", "-q", Spec], Tmp, AptEnv, P, nothrow) of
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
            Tar = beamdiag_emu_os:exe("tar"),
            ok = beamdiag_emu_os:run(Tar, ["-xf", Tarball, "-C", Tmp], Tmp, [], P),
            ok = beamdiag_emu_os:file_op("delete", Tarball, file:delete(Tarball)),
            {otp_root(Tmp), ": only its upstream tarball " ++ filename:basename(Tarball) ++
                 " (the Debian parts could not be fetched), without Debian's patches"};
        [] ->
            throw({beamdiag_emu_type, Reason})
    end.

%% The directory under Root that holds an OTP source tree.
-spec otp_root(string()) -> string().
otp_root(Root) ->
    Candidates = [Root | filelib:wildcard(filename:join(Root, "*"))],
    case [D || D <- Candidates, is_otp_tree(D)] of
        [D | _] -> D;
        [] -> throw({beamdiag_emu_type, {not_otp_source, Root}})
    end.

-spec is_otp_tree(string()) -> boolean().
is_otp_tree(D) ->
    lists:all(
        fun(F) -> filelib:is_regular(filename:join(D, F)) end,
        ["OTP_VERSION", "configure", "erts/vsn.mk"]
    ).

%% @doc Checks that a source tree is exactly the installed OTP and ERTS.
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
    case {SrcErts, SrcOtp} =:= {ErtsVsn, beamdiag_emu_install:otp_version()} of
        true ->
            ok;
        false ->
            throw({beamdiag_emu_type, {version_mismatch, #{
                installed => #{otp => beamdiag_emu_install:otp_version(), erts => ErtsVsn},
                source => #{otp => SrcOtp, erts => SrcErts}
            }}})
    end.
