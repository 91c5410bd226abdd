%%% @doc The installed Erlang system and the lock-counting emulator in it:
%%% the ERTS and OTP versions and binary directory, whether the emulator's
%%% files are there, installing them beside the installed emulator (so that
%%% `erl -emu_type lcnt' starts them), and checking that it starts, counts
%%% locks and has the extra microstate accounting states.
%%%
%%% ```
%%% 1> beamdiag_emu_install:present(beamdiag_emu_install:bin_dir()).
%%% false
%%% '''
-module(beamdiag_emu_install).

-export([files/0, present/1, install/3, installed_matching/1, verify_installed/1]).
-export([erts_version/0, bin_dir/0, otp_version/0]).

-define(LCNT_BEAM, "beam.lcnt.smp").
-define(CHILD_SETUP, "erl_child_setup.lcnt").
-define(FILES, [?LCNT_BEAM, ?CHILD_SETUP]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The emulator's files: the lock-counting emulator and its child
%% setup program.
-spec files() -> [string()].
files() ->
    ?FILES.

%% @doc Whether a directory holds all of the emulator's files.
-spec present(string()) -> boolean().
present(Dir) ->
    lists:all(fun(F) -> filelib:is_regular(filename:join(Dir, F)) end, ?FILES).

%% @doc Copies the emulator's files from a directory into the installed
%% system and checks that it works.
-spec install(string(), string(), fun((iodata()) -> ok)) -> ok.
install(From, Vsn, P) ->
    BinDir = bin_dir(),
    _ = [ok = beamdiag_emu_os:copy_exec(filename:join(From, F), filename:join(BinDir, F))
         || F <- ?FILES],
    P(["installed ", lists:join(" and ", ?FILES), " in ", BinDir, "\n"]),
    case verify_installed(Vsn) of
        ok ->
            P("checked: `erl -emu_type lcnt' starts, counts locks and has the extra "
              "microstate accounting states\n");
        {error, Why} ->
            throw({beamdiag_emu_type, {verify_failed, Why}})
    end.

%% @doc Whether the emulator is installed for this ERTS version and works.
-spec installed_matching(string()) -> boolean().
installed_matching(Vsn) ->
    present(bin_dir()) andalso verify_installed(Vsn) =:= ok.

%% @doc Starts `erl -emu_type lcnt' and checks its version, lock counting and
%% extra microstate accounting.
-spec verify_installed(string()) -> ok | {error, string()}.
verify_installed(Vsn) ->
    Erl = filename:join([code:root_dir(), "bin", "erl"]),
    Expr =
        "io:format(\"~s ~p ~p~n\", [erlang:system_info(version), "
        "erlang:system_info(lock_counting), "
        "lists:all(fun(#{counters := C}) -> maps:is_key(alloc, C) end, "
        "erlang:statistics(microstate_accounting))]), erlang:halt().",
    Args = ["-emu_type", "lcnt", "-noshell", "-noinput", "-eval", Expr],
    case beamdiag_emu_os:run_output(Erl, Args) of
        {0, Out} ->
            case string:lexemes(Out, " \n") of
                [Vsn, "true", "true"] -> ok;
                [Vsn, "true", "false"] -> {error, "no extra microstate accounting states"};
                _ -> {error, "unexpected answer: " ++ Out}
            end;
        {Status, Out} ->
            {error, io_lib:format("exit status ~b: ~ts", [Status, Out])}
    end.

%% @doc The running ERTS version.
-spec erts_version() -> string().
erts_version() ->
    erlang:system_info(version).

%% @doc The installed ERTS binary directory.
-spec bin_dir() -> string().
bin_dir() ->
    filename:join([code:root_dir(), "erts-" ++ erts_version(), "bin"]).

%% @doc The installed OTP version (for example 27.3.4), or else its release.
-spec otp_version() -> string().
otp_version() ->
    Rel = erlang:system_info(otp_release),
    case file:read_file(filename:join([code:root_dir(), "releases", Rel, "OTP_VERSION"])) of
        {ok, B} -> string:trim(binary_to_list(B));
        _ -> Rel
    end.
