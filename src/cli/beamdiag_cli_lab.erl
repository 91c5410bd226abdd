%%% @doc `beamdiag lab SCENARIO': start a local node that reproduces one
%%% pathology; with `--diagnose', diagnose it at once, as a user would.
-module(beamdiag_cli_lab).

-behaviour(beamdiag_cli).

-export([spec/0, run/2]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The command's arguments.
-spec spec() -> beamdiag_cli:spec().
spec() ->
    #{
        name => "lab",
        summary => "Start a local node that reproduces one pathology ('list' lists them).",
        exit_codes => [0, 2, 3, 4],
        example => "beamdiag lab busy_wait --diagnose --window 5",
        positional => [#{key => scenario, metavar => "SCENARIO", required => true,
                         help => "a scenario name, or 'list'"}],
        options => beamdiag_cli_options:pick([
            {duration, #{type => {integer, 1, beamdiag_opts:max_seconds(window)}, default => 60,
                         help => "how long the node and its load run"}},
            #{key => diagnose, long => "--diagnose", type => boolean, default => false,
              help => "diagnose the node once it runs, then stop it"},
            #{key => vary, long => "--vary", type => string, metavar => "KEY=VALUE,...",
              help => "vary the scenario (e.g. writers=64,table=bag; 'lab list' says what "
                      "each varies)"},
            #{key => window, long => "--window", type => {float, 0.5, 600.0}, default => 5.0,
              metavar => "SECONDS", help => "the diagnosis window with --diagnose"},
            {json, "with --diagnose, print JSON"},
            {out, "with --diagnose, write the report to FILE"},
            {html, "with --diagnose, also write an HTML report to FILE"},
            {save, "with --diagnose, also save the capture to FILE"}
        ])
    }.

%% @doc Runs the command.
-spec run(beamdiag_cli:opts(), beamdiag_cli:io()) -> beamdiag_cli:result().
run(#{scenario := "list"}, #{out := Out}) ->
    Out([[io_lib:format("~-22s ~ts~n", [N, S]),
          [io_lib:format("~-22s   --vary ~s=~ts (default ~ts): ~ts~n",
                         ["", K, values(Vs), value(D), H])
           || {K, #{values := Vs, default := D, help := H}} <- lists:sort(maps:to_list(
                                                                     maps:get(vary, Sc, #{})))]]
         || Sc = #{name := N, summary := S} <- beamdiag_lab:scenarios()]),
    0;
run(Opts = #{scenario := Name, duration := Duration}, IO) ->
    Vary = case {maps:find(vary, Opts), beamdiag_lab:scenario(Name)} of
               {{ok, Text}, {ok, Sc}} -> beamdiag_lab:parse_variation(Sc, Text);
               _ -> {ok, #{}}
           end,
    case Vary of
        {ok, V} -> start(Opts#{vary_map => V}, Name, Duration, IO);
        {error, Error} -> beamdiag_cli:fail(Error, IO)
    end.

%%%===================================================================
%%% Internal
%%%===================================================================

values(Vs) ->
    lists:join("|", [case V of
                         {integer, Min, Max} -> io_lib:format("~b..~b", [Min, Max]);
                         A -> atom_to_list(A)
                     end || V <- Vs]).

value(V) when is_atom(V) -> atom_to_list(V);
value(V) when is_integer(V) -> integer_to_list(V).

start(Opts, Name, Duration, IO = #{err := Err}) ->
    Dur = case maps:get(diagnose, Opts) of
              true -> max(Duration, ceil(maps:get(window, Opts)) + 30);
              false -> Duration
          end,
    Err(["beamdiag: starting lab node for ", Name, "\n"]),
    case beamdiag_lab:start(Name, #{duration => Dur, vary => maps:get(vary_map, Opts)}) of
        {ok, Lab} ->
            try
                case maps:get(diagnose, Opts) of
                    true -> diagnose(Lab, Opts, IO);
                    false -> hold(Lab, Duration, IO)
                end
            after
                beamdiag_lab:stop(Lab)
            end;
        {error, Error} ->
            beamdiag_cli:fail(Error, IO)
    end.

diagnose(Lab, Opts, IO = #{err := Err}) ->
    Node = beamdiag_lab:node(Lab),
    Err(["beamdiag: diagnosing ", atom_to_list(Node), "\n"]),
    case beamdiag:diagnose(Node, #{cookie => beamdiag_lab:cookie(Lab),
                                   duration => maps:get(window, Opts),
                                   progress => beamdiag_cli_diagnose:progress(IO)}) of
        {ok, D} ->
            beamdiag_cli_diagnose:end_progress(IO),
            beamdiag_cli_diagnose:output(D, Opts, IO);
        {error, Error} ->
            beamdiag_cli_diagnose:end_progress(IO),
            beamdiag_cli:fail(Error, IO)
    end.

hold(Lab, Duration, #{out := Out}) ->
    Node = beamdiag_lab:node(Lab),
    Out(io_lib:format("lab node ~s runs for ~b s.~n"
                      "diagnose it from another shell with:~n"
                      "  BEAMDIAG_COOKIE=~s beamdiag diagnose ~s~n",
                      [Node, Duration, beamdiag_lab:cookie(Lab), Node])),
    timer:sleep(Duration * 1000),
    0.
