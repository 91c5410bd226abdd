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

-export([profile/3, header/1, format_error/1]).
%% Called as Module:format_error/1 on an {error, {Module, Reason}} value.
-ignore_xref([{format_error, 1}]).

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
%% profile/3's result: the folded profile and how it was taken; with
%% perf, perf's record, and the Erlang sampler's stacks beside it
%% (`callers'); with the Erlang sampler, its result without its stacks
%% (beamdiag_agent_sampler:result()); the profile rules' findings unless
%% the caller runs them.
-type result() :: #{
    profile := beamdiag_fold:profile(),
    method := erlang | perf,
    node := node(),
    perf => perf(),
    callers => beamdiag_fold:profile(),
    sampler => #{processes := [beamdiag_agent_sampler:process_stacks()], atom() => term()},
    findings => [beamdiag_finding:finding()]
}.
%% What a diagnosis keeps of a result in its capture's extras (`profile'):
%% the sampler's stacks per process as `by_process'.
-type kept() :: #{
    profile := beamdiag_fold:profile(),
    method := erlang | perf,
    perf => perf(),
    callers => beamdiag_fold:profile(),
    by_process := [beamdiag_agent_sampler:process_stacks()]
}.
%% perf's record (beamdiag_perf:result() without the script and perf's
%% output), with the fold's wall time.
-type perf() :: #{
    call_graph := dwarf | fp | none,
    call_graph_reason := binary(),
    perf_map := file:filename() | missing,
    duration := pos_integer(),
    frequency := pos_integer(),
    script_bytes := non_neg_integer(),
    script_truncated := boolean(),
    target := beamdiag_perf:target(),
    ospid := pos_integer(),
    wall_ms := #{record := non_neg_integer(), script := non_neg_integer(), fold := integer()}
}.

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

%% The most frequent stacks, leaf first, with their shares.
top_stacks(#{stacks := Stacks, samples := N}, K) ->
    Sorted = lists:sublist(lists:reverse(lists:keysort(2, maps:to_list(Stacks))), K),
    [io_lib:format("~ts (~.1f%)", [lists:join(" < ", lists:sublist(lists:reverse(Fr), 4)),
                                   100 * C / max(N, 1)])
     || {[_Type | Fr], C} <- Sorted].

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
with_callers(_, R) ->
    R.

%% The profile rules' one run, over the profile and the callers beside it.
with_findings(R = #{profile := P}, Opts) ->
    case maps:get(rules, Opts, true) of
        true -> R#{findings => beamdiag_profile_rules:findings(P, maps:with([callers], R))};
        false -> R
    end.

%% @doc The profile's header: its figures, counted from the folded stacks
%% it writes (`beamdiag_fold:summary/1'), then what the call-graph mode
%% lost and how to get more.
-spec header(result() | kept()) -> iolist().
header(R = #{profile := P, method := M}) ->
    S = beamdiag_fold:summary(P),
    Pct = fun(K) -> io_lib:format("~.1f%", [100 * maps:get(K, S)]) end,
    Mode = case R of
        #{perf := #{call_graph := CG}} -> [", call graph ", atom_to_list(CG)];
        _ -> ""
    end,
    [
        io_lib:format("~b samples (~s~s). Samples with an Erlang function on the stack: ~s; "
                      "with an unnamed JIT frame: ~s; with an unnamed native frame: ~s; "
                      "with an address perf could place nowhere: ~s; cut short by the unwinder "
                      "before an Erlang or thread-root frame: ~s.~n",
                      [maps:get(samples, S), M, Mode, Pct(erlang_share), Pct(unnamed_jit_share),
                       Pct(unnamed_native_share), Pct(unplaced_share), Pct(cut_short_share)]),
        [["  - ", N, "\n"] || N <- notes(R, S)]
    ].

notes(R = #{perf := Perf}, S) ->
    Reason = case Perf of
        #{call_graph := CG, call_graph_reason := Why} ->
            [io_lib:format("call graph ~s: ~ts.", [CG, Why])];
        _ ->
            []
    end,
    Lost = case Perf of
        #{call_graph := fp} ->
            [io_lib:format("Frame pointers lose native callers: the emulator's C code keeps none, "
                           "so a walk that enters it ends there (~.1f% of samples cut short). "
                           "For native call chains: --call-graph dwarf.",
                           [100 * maps:get(cut_short_share, S)])];
        #{call_graph := dwarf} when is_map_key(callers, R) ->
            [io_lib:format("DWARF unwinding stops at the first JIT frame: the Erlang callers of "
                           "native code are not on perf's stacks (~.1f% of samples cut short); "
                           "the Erlang-level sampler beside perf names them (below).",
                           [100 * maps:get(cut_short_share, S)])];
        #{call_graph := dwarf, target := #{frame_pointers := true, perf_flag := Has}} ->
            %% Never advise a flag the node has.
            [io_lib:format("DWARF unwinding stops at the first JIT frame: the Erlang callers of "
                           "native code are lost (~.1f% of samples cut short). For Erlang call "
                           "chains: --call-graph fp (the node already runs +JPperf ~ts, so its "
                           "JIT code keeps frame pointers), or --erlang.",
                           [100 * maps:get(cut_short_share, S), Has])];
        #{call_graph := dwarf} ->
            [io_lib:format("DWARF unwinding stops at the first JIT frame: the Erlang callers of "
                           "native code are lost (~.1f% of samples cut short). For Erlang call "
                           "chains: start the node with +JPperf true and use --call-graph fp, "
                           "or --erlang.", [100 * maps:get(cut_short_share, S)])];
        #{call_graph := none} ->
            [<<"No call chains: only the function each sample landed in.">>];
        _ ->
            []
    end,
    Namespace = case Perf of
        #{ospid := O, target := #{ns_pid := N}} when O =/= N ->
            [io_lib:format("The node runs in a PID namespace of its own (a container): perf "
                           "recorded its host pid ~b; it is pid ~b there, and its JIT code was "
                           "named from perf-~b.map in its own /tmp.", [O, N, N])
             || maps:get(perf_map, Perf) =/= missing];
        _ ->
            []
    end,
    Map = case Perf of
        #{perf_map := missing, target := #{perf_flag := Flag}}
          when Flag =:= <<"true">>; Flag =:= <<"map">> ->
            [io_lib:format("No perf map found, although the node runs +JPperf ~ts: its JIT code "
                           "has no names here (a node in a container writes the map into its "
                           "own /tmp; +JPperfdirectory on OTP 28 and later says where).", [Flag])];
        #{perf_map := missing} ->
            [<<"No perf map: the node was not started with +JPperf true (or map), so its JIT "
               "code has no names; restart it with +JPperf true to name Erlang functions.">>];
        _ ->
            []
    end,
    Native = case maps:get(unnamed_native_share, S) >= 0.2 of
        true ->
            [<<"Many native frames have no name: the emulator is stripped down to its "
               "exported functions; its debug symbols (Debian: erlang-base-dbgsym) name the "
               "rest.">>];
        false ->
            []
    end,
    Callers = case R of
        #{callers := C = #{samples := CN}} when CN > 0 ->
            [io_lib:format("Erlang callers from the Erlang-level sampler beside perf (~b samples "
                           "of running processes): ~ts.",
                           [CN, lists:join("; ", [[Stack] || Stack <- top_stacks(C, 3)])])];
        _ ->
            []
    end,
    Reason ++ Lost ++ Namespace ++ Map ++ Native ++ Callers;
notes(_, _) ->
    [].

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
