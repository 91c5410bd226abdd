%%% @doc The build cache: a directory per ERTS version (`Cache/<erts-version>/')
%%% holding the lock-counting emulator's binaries and a `BUILD_INFO' file
%%% (ERTS and OTP versions, the source, the configure arguments), so that a
%%% later build for the same ERTS reuses them at once.
%%%
%%% ```
%%% 1> beamdiag_emu_cache:cache_ok("/var/cache/beamdiag/13.1.5", "13.1.5").
%%% true
%%% '''
-module(beamdiag_emu_cache).

-export([cache_ok/2, store_cache/5, fill_cache/3]).

-define(INFO, "BUILD_INFO").

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Whether a cache directory holds the emulator built for an ERTS version.
-spec cache_ok(string(), string()) -> boolean().
cache_ok(Dir, Vsn) ->
    beamdiag_emu_install:present(Dir) andalso
        case file:read_file(filename:join(Dir, ?INFO)) of
            {ok, B} -> re:run(B, ["^erts_version ", Vsn, "$"], [multiline]) =/= nomatch;
            _ -> false
        end.

%% @doc Copies built binaries into a cache directory with their build info.
-spec store_cache(string(), string(), string(), string(), fun((iodata()) -> ok)) -> string().
store_cache(From, CacheDir, Vsn, Desc, P) ->
    ok = beamdiag_emu_os:mkdir_p(CacheDir),
    _ = [ok = beamdiag_emu_os:copy_exec(filename:join(From, F), filename:join(CacheDir, F))
         || F <- beamdiag_emu_install:files()],
    Info = [
        "erts_version ", Vsn, "\n",
        "otp_version ", beamdiag_emu_install:otp_version(), "\n",
        "source ", Desc, "\n",
        "configure ", lists:join(" ", beamdiag_emu_build:configure_args()), "\n"
    ],
    ok = beamdiag_emu_os:write_file(filename:join(CacheDir, ?INFO), Info),
    P(["kept the lock-counting emulator in ", CacheDir, "\n"]),
    CacheDir.

%% @doc Copies an installed emulator into an empty cache.
-spec fill_cache(string() | undefined, string(), fun((iodata()) -> ok)) -> ok.
fill_cache(undefined, _BinDir, _P) ->
    ok;
fill_cache(CacheDir, BinDir, P) ->
    Vsn = beamdiag_emu_install:erts_version(),
    case cache_ok(CacheDir, Vsn) of
        true ->
            ok;
        false ->
            _ = store_cache(BinDir, CacheDir, Vsn, "installed emulator", P),
            ok
    end.
