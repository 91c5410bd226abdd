%%% @doc Building the lock-counting emulator from OTP source: configure
%%% (`--with-microstate-accounting=extra' and the applications it does not
%%% need left out) and make only `beam.lcnt.smp' and `erl_child_setup.lcnt',
%%% in a temporary copy of the source.
%%%
%%% ```
%%% 1> beamdiag_emu_build:configure_args().
%%% ["--with-microstate-accounting=extra", "--without-javac", ...]
%%% '''
-module(beamdiag_emu_build).

-export([build_in/4, configure_args/0, jobs/0]).

-define(CONFIGURE_ARGS, [
    "--with-microstate-accounting=extra",
    "--without-javac",
    "--without-wx",
    "--without-odbc",
    "--without-jinterface",
    "--without-ssl"
]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The arguments given to OTP's `configure'.
-spec configure_args() -> [string()].
configure_args() ->
    ?CONFIGURE_ARGS.

%% @doc Gets the source into Tmp, checks its version, configures and builds;
%% returns the directory holding the built files and what to add to the
%% source's description.
-spec build_in(string(), beamdiag_emu_source:source(), beamdiag_emu_type:settled(), string()) ->
    {string(), string()}.
build_in(Tmp, Source, Opts = #{progress := P, jobs := Jobs}, Vsn) ->
    {Src, Note} = beamdiag_emu_source:fetch_source(Tmp, Source, Opts),
    ok = beamdiag_emu_source:check_version(Src, Vsn),
    Env = [{"ERL_TOP", Src}, {"MAKEFLAGS", false}, {"MAKELEVEL", false}],
    P(["configuring ", Src, "\n"]),
    ok = beamdiag_emu_os:run(filename:join(Src, "configure"), ?CONFIGURE_ARGS, Src, Env, P),
    J = "-j" ++ integer_to_list(Jobs),
    P("building the lock-counting emulator (several minutes)\n"),
    Make = beamdiag_emu_os:exe("make"),
    ok = beamdiag_emu_os:run(Make, ["-C", "erts/lib_src", "lcnt", J], Src, Env, P),
    ok = beamdiag_emu_os:run(Make, ["-C", "erts/emulator", "lcnt", J], Src, Env, P),
    Built = filelib:wildcard(filename:join([Src, "bin", "*", hd(beamdiag_emu_install:files())])),
    case Built of
        [Beam | _] ->
            Dir = filename:dirname(Beam),
            case [F || F <- beamdiag_emu_install:files(),
                       not filelib:is_regular(filename:join(Dir, F))] of
                [] -> {Dir, Note};
                Missing -> throw({beamdiag_emu_type, {not_built, Missing}})
            end;
        [] ->
            throw({beamdiag_emu_type, {not_built, [hd(beamdiag_emu_install:files())]}})
    end.

%% @doc Parallel make jobs by default: the logical processors available.
-spec jobs() -> pos_integer().
jobs() ->
    case erlang:system_info(logical_processors_available) of
        N when is_integer(N), N > 0 -> N;
        _ -> erlang:system_info(schedulers_online)
    end.
