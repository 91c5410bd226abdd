%%% @doc `beamdiag cluster [NODE] [--nodes FILE]': diagnose every member of
%%% a cluster over the same window; the outliers first, with why they stand
%%% out, then one screen on the rest (`--all' adds a row per node).
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
        summary => "Diagnose every member of a cluster over the same window; the outliers first.",
        exit_codes => [0, 1, 2, 3, 4],
        example => "beamdiag cluster app@db1 --cookie-file /etc/app/cookie --duration 10",
        positional => [#{key => node, metavar => "NODE", required => false,
                         help => "any node of the cluster, name@host: it and the nodes it is "
                                 "connected to are the members (optional with --nodes)"}],
        options => beamdiag_cli_options:pick([
            cookie, cookie_file,
            #{key => nodes, long => "--nodes", type => string, metavar => "FILE",
              help => "the members, one node name a line (blank lines and # comments "
                      "skipped), for clusters that are not fully meshed"},
            #{key => max_nodes, long => "--max-nodes", type => {integer, 1, 100000},
              default => 500, metavar => "N", help => "refuse clusters of more members"},
            #{key => concurrency, long => "--concurrency", type => {integer, 1, 1000},
              default => 64, metavar => "K",
              help => "members connected and loaded at once before the window"},
            duration, interval,
            {slack, "the report is due SECONDS after the windows' common end; a member "
                    "behind by then is reported from the samples it sent, one that sent none "
                    "is listed as not diagnosed"},
            #{key => all, long => "--all", type => boolean, default => false,
              help => "also print a row per node"},
            {json, "print one JSON document (schema beamdiag.cluster/2)"},
            {html, "also write a self-contained HTML report to FILE (a chart per figure "
                   "across the nodes, outliers marked)"},
            out,
            {fail_on, "exit 1 when a finding on any node is at least this severe"}
        ])
    }.

%% @doc Runs the command. Also takes the options of `diagnose' (those it
%% does not use are ignored), so that `diagnose --cluster' can call it.
-spec run(beamdiag_cli:opts(), beamdiag_cli:io()) -> beamdiag_cli:result().
run(Opts, IO) ->
    case {maps:get(node, Opts, undefined), maps:get(nodes, Opts, undefined)} of
        {undefined, undefined} ->
            beamdiag_cli:usage_error("give NODE (a member of the cluster) or --nodes FILE", IO);
        {Node, undefined} ->
            run(Node, undefined, Opts, IO);
        {Node, File} ->
            case beamdiag_cluster:read_nodes(File) of
                {ok, List} -> run(Node, List, Opts, IO);
                {error, Error} -> beamdiag_cli:fail(Error, IO)
            end
    end.

%%%===================================================================
%%% Internal
%%%===================================================================

run(Node, List, Opts, IO = #{err := Err}) ->
    LibOpts = maps:merge(
        maps:with([cookie, cookie_file, max_nodes, concurrency, slack], Opts),
        #{duration => maps:get(duration, Opts, 10.0),
          interval => maps:get(interval, Opts, 1000),
          msacc => not maps:get(no_msacc, Opts, false),
          msacc_span => maps:get(msacc_span, Opts, 2.0),
          locks => not maps:get(no_locks, Opts, false),
          nodes => List}),
    Err(io_lib:format("beamdiag: diagnosing the cluster of ~ts for ~.1f s\n",
                      [case List of
                           undefined -> Node;
                           _ -> io_lib:format("~b listed nodes", [length(List)])
                       end, float(maps:get(duration, LibOpts))])),
    case beamdiag_cluster:diagnose(Node, LibOpts) of
        {ok, C} ->
            Text = case maps:get(json, Opts, false) of
                       true -> beamdiag_format_json:cluster(C);
                       false -> beamdiag_format_text:cluster(C, #{all => maps:get(all, Opts, false)})
                   end,
            Findings = lists:append(maps:values(maps:get(findings, C))),
            case beamdiag_cli:emit(Text, Opts, IO) of
                0 ->
                    case beamdiag_cli:html(fun() -> beamdiag_format_html:cluster(C) end,
                                           maps:with([html], Opts), IO) of
                        0 -> beamdiag_cli:findings_code(Findings, Opts);
                        Code -> Code
                    end;
                Code ->
                    Code
            end;
        {error, Error} ->
            beamdiag_cli:fail(Error, IO)
    end.
