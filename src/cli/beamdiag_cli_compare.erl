%%% @doc `beamdiag compare A B': two saved captures side by side, each delta
%%% tested against the per-tick noise of both.
-module(beamdiag_cli_compare).

-behaviour(beamdiag_cli).

-export([spec/0, run/2]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The command's arguments.
-spec spec() -> beamdiag_cli:spec().
spec() ->
    #{
        name => "compare",
        summary => "Compare two saved captures: ledger deltas beyond noise, findings.",
        exit_codes => [0, 2, 4],
        example => "beamdiag compare before.capture after.capture",
        positional => [#{key => a, metavar => "A", required => true,
                         help => "the baseline capture (diagnose --save)"},
                       #{key => b, metavar => "B", required => true,
                         help => "the capture to compare with it"}],
        options => beamdiag_cli_options:pick([
            {json, "print one JSON document (schema beamdiag.compare/1)"},
            {out, "write the comparison to FILE instead of standard output"},
            {html, "also write the comparison as a self-contained HTML report to FILE"},
            #{key => alpha, long => "--alpha", type => {float, 1.0e-6, 0.2}, default => 0.01,
              metavar => "P", help => "significance level of each test"}
        ])
    }.

%% @doc Runs the command. Exit code 0 whatever the deltas.
-spec run(beamdiag_cli:opts(), beamdiag_cli:io()) -> beamdiag_cli:result().
run(#{a := FA, b := FB} = Opts, IO) ->
    case {beamdiag_capture_file:load(FA), beamdiag_capture_file:load(FB)} of
        {{ok, A}, {ok, B}} ->
            C = beamdiag_compare:compare(A, B, #{alpha => maps:get(alpha, Opts)}),
            Text = case maps:get(json, Opts) of
                       true -> [beamdiag_json:encode(beamdiag_compare:document(C)), "\n"];
                       false -> beamdiag_format_compare:text(C)
                   end,
            case beamdiag_cli:emit(Text, Opts, IO) of
                0 -> beamdiag_cli:html(fun() -> beamdiag_format_html:compare(beamdiag_compare:document(C)) end, Opts, IO);
                Code -> Code
            end;
        {{error, Error}, _} ->
            beamdiag_cli:fail(Error, IO);
        {_, {error, Error}} ->
            beamdiag_cli:fail(Error, IO)
    end.
