%%% @doc `beamdiag cluster NODE': diagnose NODE and every node connected to
%%% it over the same window; a row per node, each node's findings and the
%%% node whose ledger differs from the rest.
-module(beamdiag_cli_cluster).

-behaviour(beamdiag_cli).

-export([spec/0, run/2]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The command's arguments.
-spec spec() -> beamdiag_cli:spec().
spec() ->
    #{
        name => "cluster",
        summary => "Diagnose every node connected to NODE at once; point at outliers.",
        exit_codes => [0, 1, 2, 3, 4],
        example => "beamdiag cluster app@db1 --cookie-file /etc/app/cookie --duration 10",
        positional => [#{key => node, metavar => "NODE", required => true,
                         help => "any node of the cluster, name@host"}],
        options => beamdiag_cli_diagnose:node_options() ++ [
            #{key => duration, long => "--duration", type => {float, 0.2, 3600.0}, default => 10.0,
              metavar => "SECONDS", help => "length of the window"},
            #{key => interval, long => "--interval", type => {integer, 10, 60000},
              default => 1000, metavar => "MS", help => "time between samples"},
            #{key => json, long => "--json", type => boolean, default => false,
              help => "print one JSON document (schema beamdiag.cluster/1)"},
            #{key => out, long => "--out", type => string, metavar => "FILE",
              help => "write the report to FILE instead of standard output"},
            #{key => fail_on, long => "--fail-on", type => {enum, [critical, warning, info]},
              help => "exit 1 when a finding on any node is at least this severe"}
        ]
    }.

%% @doc Runs the command. Also takes the options of `diagnose' (those it
%% does not use are ignored), so that `diagnose --cluster' can call it.
-spec run(map(), beamdiag_cli:io()) -> beamdiag_cli:result().
run(Opts = #{node := Node}, IO = #{err := Err}) ->
    LibOpts = maps:merge(
        maps:with([cookie, cookie_file], Opts),
        #{duration => maps:get(duration, Opts, 10.0),
          interval => maps:get(interval, Opts, 1000),
          msacc => not maps:get(no_msacc, Opts, false),
          msacc_span => maps:get(msacc_span, Opts, 2.0),
          locks => not maps:get(no_locks, Opts, false)}),
    Err(io_lib:format("beamdiag: diagnosing the cluster of ~ts for ~.1f s\n",
                      [Node, float(maps:get(duration, LibOpts))])),
    case beamdiag_cluster:diagnose(Node, LibOpts) of
        {ok, C} ->
            Text = case maps:get(json, Opts, false) of
                       true -> [beamdiag_json:encode(beamdiag_cluster:document(C)), "\n"];
                       false -> beamdiag_cluster:text(C)
                   end,
            case beamdiag_cli:emit(Text, Opts, IO) of
                0 ->
                    beamdiag_cli:findings_code(
                      [F || D <- maps:values(maps:get(diagnoses, C)), F <- maps:get(findings, D)],
                      Opts);
                Code ->
                    Code
            end;
        {error, Error} ->
            beamdiag_cli:fail(Error, IO)
    end.
