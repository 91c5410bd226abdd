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
%% Called as Module:format_error/1 on an {error, {Module, Reason}} value.
-ignore_xref([{format_error, 1}]).

-ifdef(TEST).
-export([with_callers/2, with_findings/2, map_advice/1, pid_text/2]).
-endif.

-export_type([options/0, result/0, kept/0, perf/0]).

%% profile/3's options (see there). Open: the flame command passes its
%% whole options map, whose other keys are not read.
-type options() :: #{
    duration => pos_integer(),
    frequency => pos_integer(),
    erlang => boolean(),
    call_graph => auto | dwarf | fp | none,
    prefer => native | erlang,
    out => file:filename(),
    perf => string() | undefined,
    rules => boolean(),
    atom() => term()
}.
%% The result and what a diagnosis keeps of it (beamdiag_profile_rules).
-type result() :: beamdiag_profile_rules:result().
-type kept() :: beamdiag_profile_rules:kept().
-type perf() :: beamdiag_profile_rules:perf().

%% @doc Profiles a connected node: `{ok, #{profile, findings, method, ...}}'.
%% Options: `duration' (s, 10), `frequency' (Hz, 97), `erlang' (use the
%% Erlang sampler instead of perf), `call_graph' (auto | dwarf | fp |
%% none), `prefer' (native, or erlang: the Erlang-level sampler runs
%% beside perf on every node, for the Erlang callers no perf mode shows
%% of native code),
%% `out' (perf's working directory), `perf' (the perf executable), `rules'
%% (true: the profile rules read the profile, once, and their findings
%% come with it; false when a diagnosis runs them with its other rules).
%% Progress and warnings go to `Log'.
-spec profile(node(), options(), fun((iodata()) -> term())) ->
    {ok, result()} | {error, {module(), term()}}.
profile(Node, Opts = #{erlang := true}, Err) ->
    D = maps:get(duration, Opts, 10),
    Hz = min(maps:get(frequency, Opts, 97), 199),
    Err(io_lib:format("sampling Erlang stacks on ~p for ~b s at ~b Hz...~n", [Node, D, Hz])),
    case sample(Node, #{duration => D, frequency => Hz}) of
        {ok, R = #{stacks := Stacks}} ->
            P = beamdiag_fold:from_counts(Stacks),
            {ok, with_findings(#{profile => P, method => erlang, node => Node,
                                 sampler => maps:remove(stacks, R)}, Opts)};
        {error, _} = E ->
            E
    end;
profile(Node, Opts, Err) ->
    Out = maps:get(out, Opts, "beamdiag-flame"),
    case os_pid(Node) of
        {ok, OsPid} ->
            D = maps:get(duration, Opts, 10),
            Target = beamdiag_perf:target(OsPid),
            _ = case Target of
                #{perf_map := missing, perf_flag := Flag, ns_pid := NsPid} ->
                    Err(io_lib:format(
                          "warning: no perf map for ~ts (+JPperf ~ts; looked for perf-~b.map in "
                          "its +JPperfdirectory, its own /tmp through /proc/~b/root, and /tmp): "
                          "its JIT code will have no names~ts~n",
                          [pid_text(OsPid, Target), Flag, NsPid, OsPid, map_advice(Flag)]));
                _ ->
                    ok
            end,
            %% An emulator without names for its C functions (sid's OTP 29)
            %% leaves perf unable to say what the native code does, and no
            %% perf mode here reaches the Erlang caller of a BIF or NIF
            %% (frame pointers end at the first C frame of Debian's
            %% emulators, DWARF at the first JIT frame): the Erlang-level
            %% sampler runs beside perf, at 47 Hz, for both; and always
            %% with `prefer => erlang' (the flame graph, read for its
            %% Erlang callers).
            Callers = case maps:get(native_names, Target) =:= false orelse
                           maps:get(prefer, Opts, native) =:= erlang of
                true -> start_callers(Node, D);
                false -> none
            end,
            Err(io_lib:format("recording ~ts (~p) with perf for ~b s...~n",
                              [pid_text(OsPid, Target), Node, D])),
            PerfOpts = #{duration => D, frequency => maps:get(frequency, Opts, 97),
                         call_graph => maps:get(call_graph, Opts, auto), dir => Out,
                         perf => maps:get(perf, Opts, undefined)},
            case beamdiag_perf:record(OsPid, PerfOpts) of
                {ok, Rec = #{script := Script, call_graph := CG, perf_map := Map}} ->
                    %% Frame-pointer chains are garbage rootwards of the
                    %% first unknown frame: keep the leafward part.
                    Unknown = case CG of
                        fp -> cut;
                        _ -> keep
                    end,
                    FoldOpts = case Map of
                        missing -> #{unknown => Unknown};
                        _ -> #{perf_map => Map, unknown => Unknown}
                    end,
                    T0 = erlang:monotonic_time(millisecond),
                    case beamdiag_fold:fold_file(Script, FoldOpts) of
                        {ok, P} ->
                            Wall = (maps:get(wall_ms, Rec))#{
                                       fold => erlang:monotonic_time(millisecond) - T0},
                            Perf = (maps:with([call_graph, call_graph_reason, perf_map, duration,
                                               frequency, script_bytes, script_truncated, target,
                                               ospid], Rec))#{wall_ms => Wall},
                            {ok, with_findings(
                                   with_callers(wait_callers(Callers),
                                                #{profile => P, method => perf, node => Node,
                                                  perf => Perf}), Opts)};
                        {error, _} = E ->
                            E
                    end;
                {error, _} = E ->
                    E
            end;
        {error, _} = E ->
            E
    end.

%% What to do about a missing perf map, for a node with that +JPperf flag.
map_advice(F) when F =:= <<"true">>; F =:= <<"map">> ->
    " (a node in a container writes it into its own /tmp; +JPperfdirectory on OTP 28 and later "
    "says where)";
map_advice(_) ->
    "; start the node with +JPperf true".

%% The Erlang-level sampler over the same window, in a process of its own.
%% No monitor: sample/2 turns every failure into a value, and a 'DOWN'
%% arriving while the stacks are folded would not be the fold's own.
start_callers(Node, D) ->
    Self = self(),
    Ref = make_ref(),
    _ = spawn(fun() -> Self ! {Ref, sample(Node, #{duration => D, frequency => 47})} end),
    {Ref, D}.

wait_callers(none) ->
    none;
wait_callers({Ref, D}) ->
    receive
        {Ref, R} -> R
    after (D + 40) * 1000 ->
        {error, {?MODULE, {remote, exit, timeout}}}
    end.

%% The sampler's stacks stay beside the perf profile (`callers'); the
%% knowledge base reads both.
with_callers({ok, #{stacks := Stacks}}, R) ->
    R#{callers => beamdiag_fold:from_counts(Stacks)};
with_callers(none, R) ->
    R;
with_callers({error, {M, Why}}, R) ->
    %% Said in the profile's header, not dropped.
    R#{callers_error => iolist_to_binary(M:format_error(Why))}.

%% The profile rules' one run, over the profile and the callers beside it.
with_findings(R = #{profile := P}, Opts) ->
    case maps:get(rules, Opts, true) of
        true -> R#{findings => beamdiag_profile_rules:findings(P, maps:with([callers], R))};
        false -> R
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
    case beamdiag_loader:load(Node, beamdiag_agent_sampler:modules()) of
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

%% The node's OS pid on this host, once it is known to run on this host's
%% kernel (its boot id is this host's; its host name when either cannot
%% be read). A node in a container says the pid it has in its own PID
%% namespace: perf and the perf map want the host's, which
%% beamdiag_host_pid finds by that pid and the node's start time.
os_pid(Node) ->
    try
        NsPid = list_to_integer(erpc:call(Node, os, getpid, [], 5000)),
        case same_kernel(Node) of
            {false, There} ->
                {error, {beamdiag_perf, {other_host, There}}};
            true ->
                Start = case erpc:call(Node, file, read_file, ["/proc/self/stat"], 5000) of
                            {ok, Stat} ->
                                case beamdiag_host_pid:start_ticks(Stat) of
                                    {ok, T} -> T;
                                    error -> undefined
                                end;
                            {error, _} ->
                                undefined
                        end,
                beamdiag_host_pid:host_pid("/proc", NsPid, #{start => Start})
        end
    catch
        Class:Reason -> {error, {?MODULE, {remote, Class, Reason}}}
    end.

same_kernel(Node) ->
    Boot = "/proc/sys/kernel/random/boot_id",
    case {file:read_file(Boot), erpc:call(Node, file, read_file, [Boot], 5000)} of
        {{ok, Id}, {ok, Id}} ->
            true;
        {{ok, _}, {ok, _}} ->
            {false, erpc:call(Node, net_adm, localhost, [], 5000)};
        _ ->
            {ok, Here} = inet:gethostname(),
            There = erpc:call(Node, net_adm, localhost, [], 5000),
            case hd(string:split(There, ".")) =:= hd(string:split(Here, ".")) of
                true -> true;
                false -> {false, There}
            end
    end.

%% "OS process 48213", and its own pid when a PID namespace gives it
%% another.
pid_text(OsPid, #{ns_pid := OsPid}) ->
    io_lib:format("OS process ~b", [OsPid]);
pid_text(OsPid, #{ns_pid := NsPid}) ->
    io_lib:format("OS process ~b (~b in its own PID namespace)", [OsPid, NsPid]).
