%%% @doc The escript's entry point: loads the code that fits the running
%%% OTP release, all of it (`beamdiag_beams:start/0'), then runs the
%%% command line (`beamdiag_cli:main/1'). A release that none of the
%%% escript's code loads on stops here, before any command starts, with one
%%% line that says which releases it holds code for, and exit code 4.
%%%
%%% Like `beamdiag_beams', this module loads before any choice is made, on
%%% every release: it keeps to code that OTP 25 to 29 all load.
%%%
%%% ```
%%% $ beamdiag --version
%%% beamdiag 0.1.0
%%% '''
-module(beamdiag_boot).

-export([main/1]).
%% main/1: the escript's entry point (escript_emu_args in rebar.config).
-ignore_xref([{main, 1}]).

%% The run failed (beamdiag_cli's exit codes).
-define(EXIT_FAILED, 4).

%% @doc Escript entry point.
-spec main([string()]) -> no_return().
main(Args) ->
    case beamdiag_beams:start() of
        ok ->
            beamdiag_cli:main(Args);
        {error, {M, Why}} ->
            io:put_chars(standard_error, ["beamdiag: ", M:format_error(Why), "\n"]),
            erlang:halt(?EXIT_FAILED, [{flush, true}])
    end.
