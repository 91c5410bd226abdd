%%% @doc `beamdiag metrics NODE': the Prometheus endpoint of
%%% `beamdiag_metrics', served from a node with nothing installed for as
%%% long as the command runs (see `beamdiag_metrics_remote').
-module(beamdiag_cli_metrics).

-behaviour(beamdiag_cli).

-export([spec/0, run/2]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The command's arguments.
-spec spec() -> beamdiag_cli:spec().
spec() ->
    #{
        name => "metrics",
        summary => "Serve a node's time ledger as Prometheus metrics from that node while this runs.",
        exit_codes => [0, 2, 3, 4],
        example => "beamdiag metrics app@db1 --cookie-file /etc/app/cookie --port 9568 --duration 600",
        positional => [#{key => node, metavar => "NODE", required => true,
                         help => "the node, name@host"}],
        options => beamdiag_cli_options:pick([
            cookie, cookie_file,
            #{key => port, long => "--port", type => {integer, 0, 65535}, default => 9568,
              metavar => "PORT", help => "TCP port on the node's host (0: any free port)"},
            #{key => any, long => "--any", type => boolean, default => false,
              help => "listen on every interface of the node's host, not only loopback"},
            {interval, #{type => {integer, 100, 60000}}},
            {duration, #{type => {float, 1.0, 86400.0}, default => 3600.0,
                         help => "serve for this long, then remove everything (Ctrl-C also does)"}}
        ])
    }.

%% @doc Runs the command: serves until the duration ends.
-spec run(beamdiag_cli:opts(), beamdiag_cli:io()) -> beamdiag_cli:result().
run(Opts = #{node := Node, port := Port, interval := I, duration := D}, IO = #{err := Err}) ->
    Ip = case maps:get(any, Opts) of true -> any; false -> loopback end,
    Started = fun(Bound) ->
        Err(io_lib:format("beamdiag: serving ~ts's metrics at http://~s:~b/metrics on its host "
                          "for ~b s; Ctrl-C stops and removes everything~n",
                          [Node, case Ip of any -> "HOST"; loopback -> "127.0.0.1" end, Bound,
                           round(D)]))
    end,
    LibOpts = maps:merge(maps:with([cookie, cookie_file], Opts),
                         #{port => Port, ip => Ip, interval => I, duration => D,
                           started => Started}),
    case beamdiag_metrics_remote:run(Node, LibOpts) of
        {ok, #{samples := _}} ->
            Err(["beamdiag: metrics endpoint stopped; nothing left on ", Node, "\n"]),
            0;
        {error, Error} ->
            beamdiag_cli:fail(Error, IO)
    end.
