%%% @doc `beamdiag flame NODE': a CPU profile of a live node as a flame graph.
%%%
%%% By default the native profile: `perf record' on the node's OS process
%%% (this command must run on the node's host: perf attaches to a local
%%% process id), folded per thread type. With `--erlang' the Erlang-level
%%% sampler runs on the node instead (over distribution; works from any
%%% host, needs no perf). Writes `profile.folded', `flame.svg' and
%%% `top.txt' into `--output-dir' and prints the top tables, the `[unknown]'
%%% frame share and the findings; everything it prints or writes as text
%%% goes through `beamdiag_safe_text' (function and process names come from
%%% the target and from perf).
%%%
%%% ```
%%% $ beamdiag flame app@host --duration 10 --output-dir /tmp/flame
%%% '''
-module(beamdiag_cli_flame).

-behaviour(beamdiag_cli).

-export([spec/0, run/2]).
%% Called by the tests only.
-ifdef(TEST).
-export([report/2]).
-endif.

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The command's arguments.
-spec spec() -> beamdiag_cli:spec().
spec() ->
    OutputDir = #{key => output_dir, long => "--output-dir", type => string,
                  default => "beamdiag-flame", metavar => "DIR",
                  help => "directory for profile.folded, flame.svg, top.txt"},
    PerfBinary = #{key => perf_binary, long => "--perf-binary", type => string, metavar => "PATH",
                   help => "the perf executable (default: perf on the PATH)"},
    #{
        name => "flame",
        summary => "Profile a node's CPU (perf, or the Erlang-level sampler) into a flame graph.",
        exit_codes => [0, 1, 2, 3, 4],
        example => "beamdiag flame app@host --duration 10 --output-dir /tmp/flame",
        positional => [#{key => node, help => "the node (name@host)", required => true,
                         metavar => "NODE"}],
        options => beamdiag_cli_options:pick([
            {duration, #{type => {integer, 1, 300}, default => 10, help => "seconds to sample"}},
            #{key => frequency, long => "--frequency", type => {integer, 1, 999}, default => 97,
              metavar => "HZ", help => "samples per second per thread"},
            OutputDir,
            {erlang, "Erlang-level sampler on the node instead of perf (any host)"},
            #{key => call_graph, long => "--call-graph", type => {enum, [auto, dwarf, fp, none]},
              default => auto, help => "perf call-chain method (auto: dwarf where the "
                                       "emulator names its C functions, else fp when the node's "
                                       "JIT keeps frame pointers and has a perf map; the Erlang "
                                       "callers, which no perf mode shows of native code, come "
                                       "from the Erlang-level sampler beside perf: erlang.svg)"},
            PerfBinary,
            cookie, cookie_file,
            {fail_on, #{type => {enum, [critical, warning, info, none]}, default => none}},
            %% Former names, kept for one release: --out took a directory
            %% (perf's -o is a file), --perf a path (diagnose --perf is a
            %% switch).
            beamdiag_cli_options:deprecated("--out", OutputDir),
            beamdiag_cli_options:deprecated("--perf", PerfBinary)
        ])
    }.

%% @doc Connects, profiles, writes the files, prints the summary.
-spec run(beamdiag_cli:opts(), beamdiag_cli:io()) -> beamdiag_cli:result().
run(Opts = #{node := NodeStr}, IO = #{err := Err}) ->
    RemoteOpts = maps:with([cookie, cookie_file], Opts),
    case beamdiag_remote:connect(NodeStr, RemoteOpts) of
        {ok, Node} ->
            try
                case beamdiag_profile:profile(Node, profile_opts(Opts), Err) of
                    {ok, Result} ->
                        %% Elixir's functions named the Elixir way, in
                        %% the files too.
                        write_and_print(beamdiag_elixir_names:flame(Result), Opts, IO);
                    {error, Error} ->
                        beamdiag_cli:fail(Error, IO)
                end
            after
                beamdiag_remote:disconnect(Node)
            end;
        {error, Error} ->
            beamdiag_cli:fail(Error, IO)
    end.

%% @doc The printed summary of a profile result, as terminal-safe UTF-8
%% (control characters and invalid UTF-8 from names as `?').
-spec report(beamdiag_profile_rules:result(), beamdiag_cli:opts()) -> binary().
report(Result = #{profile := P, findings := Findings}, _Opts) ->
    beamdiag_safe_text:report([
        beamdiag_format_profile:header(Result),
        "\n",
        beamdiag_fold:format_top("Erlang functions", beamdiag_fold:top(P, #{kind => erlang, limit => 15})),
        "\n",
        beamdiag_fold:format_top("Native functions", beamdiag_fold:top(P, #{kind => native, limit => 15})),
        "\n",
        case Findings of
            [] -> "No findings.\n";
            _ -> ["Findings:\n", [finding_text(F) || F <- Findings]]
        end
    ]).

%%%===================================================================
%%% Internal
%%%===================================================================

%% The profiler's options: the output directory and the perf executable
%% under the names beamdiag_profile reads.
profile_opts(Opts) ->
    Rest = maps:without([output_dir, perf_binary], Opts),
    %% A flame graph is read for its call chains: the Erlang callers when
    %% the node allows them.
    Rest#{out => output_dir(Opts), perf => maps:get(perf_binary, Opts, undefined),
          prefer => erlang}.

output_dir(Opts) ->
    maps:get(output_dir, Opts, "beamdiag-flame").

write_and_print(Result = #{profile := P, findings := Findings, node := Node}, Opts, IO = #{out := Print}) ->
    Dir = output_dir(Opts),
    Text = report(Result, Opts),
    %% The Erlang-level sampler's stacks beside perf's: the Erlang callers.
    Callers = case Result of
        #{callers := C = #{samples := N}} when N > 0 ->
            [{"erlang.folded", beamdiag_fold:to_iolist(C)},
             {"erlang.svg", beamdiag_format_flamegraph:svg(
                              C, #{title => io_lib:format("~p (Erlang stacks)", [Node]),
                                   subtitle => subtitle(#{profile => C, method => erlang})})}];
        _ ->
            []
    end,
    Files = [
        {"profile.folded", beamdiag_fold:to_iolist(P)},
        {"flame.svg", beamdiag_format_flamegraph:svg(P, #{title => io_lib:format("~p", [Node]),
                                                     subtitle => subtitle(Result)})},
        {"top.txt", Text}
    ] ++ Callers,
    case write_all(Dir, Files) of
        ok ->
            Print(Text),
            Print(["\nwrote ", beamdiag_safe_text:safe(filename:join(Dir, "flame.svg")),
                   ", profile.folded, top.txt",
                   [[", ", Name] || {Name, _} <- Callers], "\n"]),
            beamdiag_cli:findings_code(Findings, Opts);
        {error, Path, Why} ->
            beamdiag_cli:fail({beamdiag_cli, {write, Path, Why}}, IO)
    end.

write_all(Dir, Files) ->
    case filelib:ensure_dir(filename:join(Dir, "x")) of
        ok ->
            lists:foldl(
                fun({Name, Data}, ok) ->
                        Path = filename:join(Dir, Name),
                        case file:write_file(Path, Data) of
                            ok -> ok;
                            {error, Why} -> {error, Path, Why}
                        end;
                   (_, Err) -> Err
                end, ok, Files);
        {error, Why} ->
            {error, Dir, Why}
    end.

subtitle(#{profile := P, method := Method}) ->
    S = beamdiag_fold:summary(P),
    io_lib:format("~s profile, ~b samples; Erlang function on the stack ~s, unnamed JIT "
                  "frame ~s, unnamed native frame ~s, cut short ~s",
                  [Method, maps:get(samples, S)
                   | [beamdiag_units:pct(maps:get(K, S))
                      || K <- [erlang_share, unnamed_jit_share, unnamed_native_share, cut_short_share]]]).

%% Titles and evidence one line each; the fix may span lines.
finding_text(#{severity := Sev, title := T, evidence := Ev, fix := Fix}) ->
    [
        io_lib:format("  [~s] ~ts~n", [Sev, beamdiag_safe_text:safe(T)]),
        [["    - ", beamdiag_safe_text:safe(E), "\n"] || E <- Ev],
        ["    fix: ", beamdiag_safe_text:chars(Fix), "\n"]
    ].

