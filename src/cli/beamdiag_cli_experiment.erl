%%% @doc `beamdiag experiment': run a workload on fresh nodes under each
%%% variant of emulator flags, alternately, and say which variant is better
%%% beyond the run-to-run noise.
-module(beamdiag_cli_experiment).

-behaviour(beamdiag_cli).

-export([spec/0, run/2, output/3]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The command's arguments.
-spec spec() -> beamdiag_cli:spec().
spec() ->
    #{
        name => "experiment",
        summary => "Measure flag variants (or workloads) against each other on fresh nodes.",
        exit_codes => [0, 2, 4],
        example => "beamdiag experiment --workload lab:busy_wait --variants default "
                   "\"+sbwt none +sbwtdcpu none +sbwtdio none\" --runs 5 --duration 5",
        positional => [],
        options => beamdiag_cli_options:pick([
            #{key => workload, long => "--workload", type => {list, string}, default => [],
              metavar => "W", help => "lab:NAME or Module:Function (arity 0, one unit of "
                                      "work); several make several arms"},
            #{key => variants, long => "--variants", type => {list, string}, default => [],
              metavar => "FLAGS",
              help => "emulator flags per arm, one quoted string each; 'default' (the "
                      "default) adds none"},
            #{key => runs, long => "--runs", type => {integer, 1, 100}, default => 3,
              help => "runs per arm"},
            {duration, #{type => {float, 1.0, float(beamdiag_opts:max_seconds(window))}, default => 5.0,
                         help => "measured window per run"}},
            #{key => warmup, long => "--warmup", type => {float, 0.0, 600.0}, default => 2.0,
              metavar => "SECONDS", help => "load before the window opens"},
            #{key => concurrency, long => "--concurrency", type => {integer, 1, 100000},
              metavar => "C", help => "workers calling the unit (default: the workload's)"},
            #{key => pa, long => "--pa", type => {list, string}, default => [], metavar => "DIR",
              help => "add DIR to the code path (for Module:Function workloads)"},
            {json, "print one JSON document (schema beamdiag.experiment/1)"},
            {out, "write the results to FILE instead of standard output"},
            {save, "also save the results with every run's capture "
                   "(beamdiag report FILE re-renders them)"},
            {html, "also write the results as a self-contained HTML report to FILE"}
        ])
    }.

%% @doc Runs the command.
-spec run(beamdiag_cli:opts(), beamdiag_cli:io()) -> beamdiag_cli:result().
run(#{workload := []}, IO) ->
    beamdiag_cli:usage_error("experiment: give at least one --workload", IO);
run(Opts = #{workload := Ws}, IO = #{err := Err}) ->
    _ = [code:add_patha(D) || D <- maps:get(pa, Opts)],
    case workloads(Ws, []) of
        {ok, Workloads} ->
            Variants = case maps:get(variants, Opts) of
                           [] -> ["default"];
                           Vs -> Vs
                       end,
            LibOpts0 = #{workloads => Workloads, variants => Variants,
                         runs => maps:get(runs, Opts), duration => maps:get(duration, Opts),
                         warmup => maps:get(warmup, Opts), progress => progress(Err)},
            LibOpts = case maps:find(concurrency, Opts) of
                          {ok, C} -> LibOpts0#{concurrency => C};
                          error -> LibOpts0
                      end,
            case beamdiag_experiment:run(LibOpts) of
                {ok, Result} ->
                    output(Result, Opts, IO);
                {error, Error} ->
                    beamdiag_cli:fail(Error, IO)
            end;
        {error, Error} ->
            beamdiag_cli:fail(Error, IO)
    end.

%% @doc Prints or writes experiment results as the options ask (`json',
%% `out', `save', `html'); returns the exit code, the first failure's.
-spec output(beamdiag_experiment_stats:result(), beamdiag_cli:opts(), beamdiag_cli:io()) ->
    beamdiag_cli:result().
output(Result, Opts, IO = #{err := Err}) ->
    Text = case maps:get(json, Opts, false) of
               true -> [beamdiag_json:encode(beamdiag_format_experiment:document(Result)), "\n"];
               false -> beamdiag_format_experiment:text(Result)
           end,
    Written = beamdiag_cli:emit(Text, Opts, IO),
    Saved = case maps:find(save, Opts) of
                {ok, SaveFile} ->
                    case beamdiag_capture_file:save(SaveFile, Result) of
                        ok ->
                            Err(["beamdiag: results saved to ", SaveFile, "\n"]),
                            0;
                        {error, Error} ->
                            beamdiag_cli:fail(Error, IO)
                    end;
                error ->
                    0
            end,
    Html = beamdiag_cli:html(
             fun() -> beamdiag_format_html:experiment(beamdiag_format_experiment:document(Result)) end,
             Opts, IO),
    hd([Code || Code <- [Written, Saved, Html], Code =/= 0] ++ [0]).

%%%===================================================================
%%% Internal
%%%===================================================================

workloads([], Acc) ->
    {ok, lists:reverse(Acc)};
workloads([W | Rest], Acc) ->
    case beamdiag_experiment:workload(W) of
        {ok, X} -> workloads(Rest, [X | Acc]);
        {error, _} = E -> E
    end.

progress(Err) ->
    fun(#{event := run_start, k := K, total := T, workload := W, variant := V}) ->
            Err(io_lib:format("beamdiag: run ~b/~b: ~ts, flags ~ts ...", [K, T, W, V]));
       (#{event := run_done, result := #{throughput := Tp, cpu_us_per_unit := Cu,
                                         p99_us := P99}}) ->
            Err(io_lib:format(" ~.1f units/s, ~.2f us CPU/unit, p99 ~ts us~n",
                              [float(Tp), float(Cu), p99(P99)]));
       (_) ->
            ok
    end.

p99(undefined) -> "-";
p99(X) -> integer_to_list(round(X)).
