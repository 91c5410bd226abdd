%%% @doc `beamdiag catalogue': print the finding catalogue as Markdown
%%% (this is how docs/FINDINGS.md is made).
-module(beamdiag_cli_catalogue).

-behaviour(beamdiag_cli).

-export([spec/0, run/2]).

%% @doc The command's arguments.
-spec spec() -> beamdiag_cli:spec().
spec() ->
    #{
        name => "catalogue",
        summary => "Print every finding beamdiag can report, with its fix, as Markdown.",
        exit_codes => [0, 2],
        example => "beamdiag catalogue > docs/FINDINGS.md",
        positional => [],
        options => []
    }.

%% @doc Runs the command.
-spec run(beamdiag_cli:opts(), beamdiag_cli:io()) -> beamdiag_cli:result().
run(_Opts, #{out := Out}) ->
    Out(beamdiag_catalogue:markdown()),
    0.
