%%% @doc A CPU profile of a connected node on this host: perf (native
%%% frames with JIT symbols through the perf map) or the Erlang-level
%%% sampler, folded and read by the profile rules. Used by `beamdiag flame'
%%% and `beamdiag diagnose --perf'.
%%%
%%% ```
%%% 1> {ok, #{profile := P, findings := F}} =
%%%        beamdiag_profile:profile(Node, #{duration => 10}, fun(_) -> ok end).
%%% '''
-module(beamdiag_profile).

-export([profile/3, format_error/1]).

%% @doc Profiles a connected node: `{ok, #{profile, findings, method, ...}}'.
%% Options: `duration' (s, 10), `frequency' (Hz, 97), `erlang' (use the
%% Erlang sampler instead of perf), `call_graph' (dwarf | fp | none),
%% `out' (perf's working directory), `perf' (the perf executable). Progress
%% and warnings go to `Log'.
-spec profile(node(), map(), fun((iodata()) -> term())) ->
    {ok, map()} | {error, {module(), term()}}.
profile(Node, Opts = #{erlang := true}, Err) ->
    D = maps:get(duration, Opts, 10),
    Hz = min(maps:get(frequency, Opts, 97), 199),
    Err(io_lib:format("sampling Erlang stacks on ~p for ~b s at ~b Hz...~n", [Node, D, Hz])),
    case sample(Node, #{duration => D, frequency => Hz}) of
        {ok, R = #{stacks := Stacks}} ->
            P = beamdiag_fold:from_counts(Stacks),
            {ok, #{profile => P, method => erlang, node => Node, sampler => maps:remove(stacks, R),
                   findings => beamdiag_profile_rules:findings(P, #{})}};
        {error, _} = E ->
            E
    end;
profile(Node, Opts, Err) ->
    Out = maps:get(out, Opts, "beamdiag-flame"),
    case os_pid(Node) of
        {ok, OsPid} ->
            MapFile = "/tmp/perf-" ++ integer_to_list(OsPid) ++ ".map",
            _ = case filelib:is_regular(MapFile) of
                true -> ok;
                false -> Err(["warning: ", MapFile, " is missing: Erlang code will show as "
                              "[unknown]; start the node with +JPperf true (or +JPperf map)\n"])
            end,
            D = maps:get(duration, Opts, 10),
            Err(io_lib:format("recording OS process ~b (~p) with perf for ~b s...~n", [OsPid, Node, D])),
            PerfOpts = #{duration => D, frequency => maps:get(frequency, Opts, 97),
                         call_graph => maps:get(call_graph, Opts, dwarf), dir => Out,
                         perf => maps:get(perf, Opts, undefined)},
            case beamdiag_perf:record(OsPid, PerfOpts) of
                {ok, Rec = #{script := Script}} ->
                    %% Frame-pointer chains are garbage rootwards of the
                    %% first unknown frame: keep the leafward part.
                    Unknown = case maps:get(call_graph, Opts, dwarf) of
                        fp -> cut;
                        _ -> keep
                    end,
                    FoldOpts = case filelib:is_regular(MapFile) of
                        true -> #{perf_map => MapFile, unknown => Unknown};
                        false -> #{unknown => Unknown}
                    end,
                    case beamdiag_fold:fold_file(Script, FoldOpts) of
                        {ok, P} ->
                            {ok, #{profile => P, method => perf, node => Node,
                                   perf => maps:remove(record_output, Rec),
                                   findings => beamdiag_profile_rules:findings(P, #{})}};
                        {error, _} = E ->
                            E
                    end;
                {error, _} = E ->
                    E
            end;
        {error, _} = E ->
            E
    end.

%% @doc Turns an error reason of this module into a sentence.
-spec format_error(term()) -> iolist().
format_error({sampler_load, _Node, {M, Why}}) ->
    ["cannot load the sampler: ", M:format_error(Why)];
format_error({remote, Class, Reason}) ->
    io_lib:format("the sampler failed on the target: ~p:~p", [Class, Reason]).

%%%===================================================================
%%% Internal
%%%===================================================================

%% Loads the sampler onto the node, runs it there and unloads it again
%% (unless the node had it already). The call times out 30 s after the
%% duration.
sample(Node, Opts) ->
    D = maps:get(duration, maps:merge(beamdiag_agent_sampler:defaults(), Opts)),
    case beamdiag_loader:load(Node, [beamdiag_agent_sampler]) of
        {ok, Loaded} ->
            try erpc:call(Node, beamdiag_agent_sampler, run, [Opts], (D + 30) * 1000) of
                R -> {ok, R}
            catch
                Class:Reason -> {error, {?MODULE, {remote, Class, Reason}}}
            after
                beamdiag_loader:unload(Node, Loaded)
            end;
        {error, Why} ->
            {error, {?MODULE, {sampler_load, Node, Why}}}
    end.

%% The node's OS pid, and a check that it is a process of this host.
os_pid(Node) ->
    try
        OsPid = list_to_integer(erpc:call(Node, os, getpid, [], 5000)),
        {ok, Here} = inet:gethostname(),
        There = erpc:call(Node, net_adm, localhost, [], 5000),
        Host = hd(string:split(There, ".")),
        case Host =:= hd(string:split(Here, ".")) of
            false -> {error, {beamdiag_perf, {other_host, There}}};
            true -> {ok, OsPid}
        end
    catch
        Class:Reason -> {error, {?MODULE, {remote, Class, Reason}}}
    end.
