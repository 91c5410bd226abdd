%%% @doc `beamdiag emu-type': builds and installs the lock-counting emulator.
%%%
%%% `beamdiag emu-type build' (named after `erl -emu_type'; `flavor' is an
%%% alias) calls `beamdiag_emu_type:build/1' and streams the
%%% build output to standard error; `beamdiag emu-type status' says whether
%%% `erl -emu_type lcnt' works on this machine.
%%%
%%% ```
%%% 1> beamdiag_cli:run(["emu-type", "status"]).
%%% ERTS 13.1.5 (OTP 25.2.3): lock-counting emulator not installed
%%% 0
%%% '''
-module(beamdiag_cli_emu_type).

-behaviour(beamdiag_cli).

-export([spec/0, run/2]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The command's arguments, as data.
-spec spec() -> beamdiag_cli:spec().
spec() ->
    #{
        name => "emu-type",
        aliases => ["flavor"],
        summary =>
            "Builds the lock-counting emulator (with extra microstate accounting) "
            "for the installed ERTS, and installs it for `erl -emu_type lcnt'.",
        exit_codes => [0, 2, 4],
        example => "beamdiag emu-type build --install --add-deb-src --cache /var/cache/beamdiag",
        positional => [
            #{
                key => action,
                metavar => "build|status",
                help => "build: build (and with --install install) the emulator; "
                        "status: say whether it is installed",
                required => true
            }
        ],
        options => [
            #{
                key => otp_src,
                long => "--otp-src",
                type => string,
                metavar => "DIR|TARBALL",
                help => "OTP source of exactly the installed version (default: Debian's "
                        "source package via apt-get source)"
            },
            #{
                key => install,
                long => "--install",
                type => boolean,
                default => false,
                help => "install beside the running emulator (needs root)"
            },
            #{
                key => add_deb_src,
                long => "--add-deb-src",
                type => boolean,
                default => false,
                help => "add a deb-src entry for the configured Debian mirrors if apt has none"
            },
            #{
                key => cache,
                long => "--cache",
                type => string,
                metavar => "DIR",
                help => "keep the built binaries in DIR/<erts-version>/ and reuse them"
            }
        ]
    }.

%% @doc Runs `emu-type build' or `emu-type status'.
-spec run(beamdiag_cli:opts(), beamdiag_cli:io()) -> beamdiag_cli:result().
run(#{action := "status"}, #{out := Out}) ->
    #{erts_version := V, otp_version := O, bin_dir := D, installed := I, working := W} =
        beamdiag_emu_type:status(),
    State =
        case {I, W} of
            {false, _} -> "not installed";
            {true, true} -> ["installed in ", D, " and working"];
            {true, false} -> ["installed in ", D, " but it does not start or does not match"]
        end,
    Out(["ERTS ", V, " (OTP ", O, "): lock-counting emulator ", State, "\n"]),
    0;
run(Opts = #{action := "build"}, IO = #{out := Out, err := Err}) ->
    BuildOpts = #{
        otp_src => maps:get(otp_src, Opts, undefined),
        install => maps:get(install, Opts, false),
        add_deb_src => maps:get(add_deb_src, Opts, false),
        cache => maps:get(cache, Opts, undefined),
        progress => Err
    },
    case beamdiag_emu_type:build(BuildOpts) of
        {ok, Report} ->
            Out(report(Report)),
            0;
        {error, Error} ->
            beamdiag_cli:fail(Error, IO)
    end;
run(#{action := Other}, IO) ->
    beamdiag_cli:usage_error(["emu-type: unknown action '", beamdiag_safe_text:safe(Other, 40),
                              "' (build or status)"], IO).

%%%===================================================================
%%% Internal
%%%===================================================================

-spec report(beamdiag_emu_type:report()) -> iolist().
report(R = #{action := Action, erts_version := V}) ->
    What =
        case Action of
            already_installed -> "already installed; nothing done";
            installed_from_cache -> "installed from the cache";
            from_cache -> "found in the cache";
            built -> io_lib:format("built in ~b s", [maps:get(seconds, R, 0)])
        end,
    [
        "lock-counting emulator for ERTS ", V, ": ", What, "\n",
        case R of
            #{installed := true, bin_dir := D} -> ["installed in ", D, "; start nodes with erl -emu_type lcnt\n"];
            #{} -> ""
        end,
        case R of
            #{cache_dir := C} -> ["cache: ", C, "\n"];
            #{} -> ""
        end
    ].
