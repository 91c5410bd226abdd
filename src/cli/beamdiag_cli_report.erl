%%% @doc `beamdiag report FILE': re-render a saved capture (or saved
%%% experiment results) with the current rules, as text, JSON or HTML.
-module(beamdiag_cli_report).

-behaviour(beamdiag_cli).

-export([spec/0, run/2]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The command's arguments.
-spec spec() -> beamdiag_cli:spec().
spec() ->
    #{
        name => "report",
        summary => "Re-render a saved capture (diagnose --save) or experiment results.",
        exit_codes => [0, 1, 2, 4],
        example => "beamdiag report node.capture --html node.html",
        positional => [#{key => file, metavar => "FILE", required => true,
                         help => "a file written by --save"}],
        options => beamdiag_cli_options:pick([json, out, html, fail_on])
    }.

%% @doc Runs the command.
-spec run(beamdiag_cli:opts(), beamdiag_cli:io()) -> beamdiag_cli:result().
run(Opts = #{file := File}, IO) ->
    case beamdiag_capture_file:read(File) of
        {ok, {diagnosis, D}} ->
            beamdiag_cli_diagnose:output(D, maps:remove(save, Opts), IO);
        {ok, {experiment, E}} ->
            beamdiag_cli_experiment:output(E, maps:remove(save, Opts), IO);
        {error, Error} ->
            beamdiag_cli:fail(Error, IO)
    end.
