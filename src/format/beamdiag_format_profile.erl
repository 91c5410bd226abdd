%%% @doc The text header of a CPU profile: its figures, counted from the
%%% folded stacks, then what the call-graph mode lost and how to get more.
%%% Read by the text report and by `beamdiag flame'.
%%%
%%% ```
%%% 1> {ok, R} = beamdiag_profile:profile(Node, #{duration => 5}, fun(_) -> ok end).
%%% 2> io:put_chars(beamdiag_format_profile:header(R)).
%%% '''
-module(beamdiag_format_profile).

-export([header/1]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The profile's header: its figures, counted from the folded stacks
%% it writes (`beamdiag_fold:summary/1'), then what the call-graph mode
%% lost and how to get more.
-spec header(beamdiag_profile_rules:result() | beamdiag_profile_rules:kept()) -> iolist().
header(R = #{profile := P, method := M}) ->
    S = beamdiag_fold:summary(P),
    Pct = fun(K) -> beamdiag_units:pct(maps:get(K, S)) end,
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
                           "so a walk that enters it ends there (~s of samples cut short). "
                           "For native call chains: --call-graph dwarf.",
                           [beamdiag_units:pct(maps:get(cut_short_share, S))])];
        #{call_graph := dwarf} when is_map_key(callers, R) ->
            [io_lib:format("DWARF unwinding stops at the first JIT frame: the Erlang callers of "
                           "native code are not on perf's stacks (~s of samples cut short); "
                           "the Erlang-level sampler beside perf names them (below).",
                           [beamdiag_units:pct(maps:get(cut_short_share, S))])];
        #{call_graph := dwarf, target := #{frame_pointers := true, perf_flag := Has}} ->
            %% Never advise a flag the node has.
            [io_lib:format("DWARF unwinding stops at the first JIT frame: the Erlang callers of "
                           "native code are lost (~s of samples cut short). For Erlang call "
                           "chains: --call-graph fp (the node already runs +JPperf ~ts, so its "
                           "JIT code keeps frame pointers), or --erlang.",
                           [beamdiag_units:pct(maps:get(cut_short_share, S)), Has])];
        #{call_graph := dwarf} ->
            [io_lib:format("DWARF unwinding stops at the first JIT frame: the Erlang callers of "
                           "native code are lost (~s of samples cut short). For Erlang call "
                           "chains: start the node with +JPperf true and use --call-graph fp, "
                           "or --erlang.", [beamdiag_units:pct(maps:get(cut_short_share, S))])];
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
        #{callers_error := Failed} ->
            [io_lib:format("The Erlang-level sampler beside perf gave no callers: ~ts.", [Failed])];
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

%%%===================================================================
%%% Internal
%%%===================================================================

%% The most frequent stacks, leaf first, with their shares.
top_stacks(#{stacks := Stacks, samples := N}, K) ->
    Sorted = beamdiag_agent_top:largest(K, 2, maps:to_list(Stacks)),
    [io_lib:format("~ts (~s)", [lists:join(" < ", lists:sublist(lists:reverse(Fr), 4)),
                                beamdiag_units:pct(C / max(N, 1))])
     || {[_Type | Fr], C} <- Sorted].
