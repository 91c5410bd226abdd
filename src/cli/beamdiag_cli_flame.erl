%%% @doc `beamdiag flame NODE': a CPU profile of a live node as a flame graph.
%%%
%%% By default the native profile: `perf record' on the node's OS process
%%% (this command must run on the node's host: perf attaches to a local
%%% process id), folded per thread type. With `--erlang' the Erlang-level
%%% sampler runs on the node instead (over distribution; works from any
%%% host, needs no perf). Writes `profile.folded', `flame.svg' and
%%% `top.txt' into `--out' and prints the top tables, the `[unknown]' frame
%%% share and the findings.
%%%
%%% ```
%%% $ beamdiag flame app@host --duration 10 --out /tmp/flame
%%% '''
-module(beamdiag_cli_flame).

-behaviour(beamdiag_cli).

-export([spec/0, run/2, report/2]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The command's arguments.
-spec spec() -> beamdiag_cli:spec().
spec() ->
    #{
        name => "flame",
        summary => "Profile a node's CPU (perf, or the Erlang-level sampler) into a flame graph.",
        exit_codes => [0, 1, 2, 3, 4],
        example => "beamdiag flame app@host --duration 10 --out /tmp/flame",
        positional => [#{key => node, help => "the node (name@host)", required => true,
                         metavar => "NODE"}],
        options => [
            #{key => duration, long => "--duration", type => {integer, 1, 300}, default => 10,
              metavar => "S", help => "seconds to sample"},
            #{key => frequency, long => "--frequency", type => {integer, 1, 999}, default => 97,
              metavar => "HZ", help => "samples per second per thread"},
            #{key => out, long => "--out", type => string, default => "beamdiag-flame",
              metavar => "DIR", help => "directory for profile.folded, flame.svg, top.txt"},
            #{key => erlang, long => "--erlang", type => boolean, default => false,
              help => "Erlang-level sampler on the node instead of perf (any host)"},
            #{key => call_graph, long => "--call-graph", type => {enum, [auto, dwarf, fp, none]},
              default => auto, help => "perf call-chain method (auto: fp when the node's JIT "
                                       "keeps frame pointers and has a perf map, else dwarf)"},
            #{key => perf, long => "--perf", type => string, metavar => "PATH",
              help => "the perf executable (default: perf on the PATH)"},
            #{key => cookie, long => "--cookie", type => string, metavar => "C",
              help => "the node's cookie"},
            #{key => cookie_file, long => "--cookie-file", type => string, metavar => "F",
              help => "file holding the node's cookie"},
            #{key => fail_on, long => "--fail-on", type => {enum, [critical, warning, info, none]},
              default => none, help => "exit 1 when a finding is at least this severe"}
        ]
    }.

%% @doc Connects, profiles, writes the files, prints the summary.
-spec run(map(), beamdiag_cli:io()) -> beamdiag_cli:result().
run(Opts = #{node := NodeStr}, IO = #{err := Err}) ->
    RemoteOpts = maps:with([cookie, cookie_file], Opts),
    case beamdiag_remote:connect(NodeStr, RemoteOpts) of
        {ok, Node} ->
            try
                case beamdiag_profile:profile(Node, Opts, Err) of
                    {ok, Result} ->
                        write_and_print(Result, Opts, IO);
                    {error, Error} ->
                        beamdiag_cli:fail(Error, IO)
                end
            after
                beamdiag_remote:disconnect(Node)
            end;
        {error, Error} ->
            beamdiag_cli:fail(Error, IO)
    end.

%% @doc The printed summary of a profile result.
-spec report(map(), map()) -> iolist().
report(Result = #{profile := P, findings := Findings}, _Opts) ->
    [
        beamdiag_profile:header(Result),
        "\n",
        beamdiag_fold:format_top("Erlang functions", beamdiag_fold:top(P, #{kind => erlang, limit => 15})),
        "\n",
        beamdiag_fold:format_top("Native functions", beamdiag_fold:top(P, #{kind => native, limit => 15})),
        "\n",
        case Findings of
            [] -> "No findings.\n";
            _ -> ["Findings:\n", [finding_text(F) || F <- Findings]]
        end
    ].

%%%===================================================================
%%% Internal
%%%===================================================================

write_and_print(Result = #{profile := P, findings := Findings, node := Node}, Opts, IO = #{out := Print}) ->
    Dir = maps:get(out, Opts, "beamdiag-flame"),
    Text = report(Result, Opts),
    Files = [
        {"profile.folded", beamdiag_fold:to_iolist(P)},
        {"flame.svg", beamdiag_format_flamegraph:svg(P, #{title => io_lib:format("~p", [Node]),
                                                     subtitle => subtitle(Result)})},
        {"top.txt", Text}
    ],
    case write_all(Dir, Files) of
        ok ->
            Print(Text),
            Print(["\nwrote ", filename:join(Dir, "flame.svg"), ", profile.folded, top.txt\n"]),
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
    io_lib:format("~s profile, ~b samples; Erlang function on the stack ~.1f%, unnamed JIT "
                  "frame ~.1f%, unnamed native frame ~.1f%, cut short ~.1f%",
                  [Method, maps:get(samples, S), 100 * maps:get(erlang_share, S),
                   100 * maps:get(unnamed_jit_share, S), 100 * maps:get(unnamed_native_share, S),
                   100 * maps:get(cut_short_share, S)]).

finding_text(#{severity := Sev, title := T, evidence := Ev, fix := Fix}) ->
    [
        io_lib:format("  [~s] ~ts~n", [Sev, T]),
        [["    - ", E, "\n"] || E <- Ev],
        ["    fix: ", Fix, "\n"]
    ].

