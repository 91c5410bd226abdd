%%% @doc The TOP PROCESSES section of the text report, from the process
%%% data `beamdiag_agent_processes:finish/2' returns: the processes with the
%%% largest share of the node's reductions, the mailboxes, the largest
%%% heaps. Returns iodata; the caller makes the report safe for a terminal
%%% (names and labels come from the target).
%%%
%%% ```
%%% 1> io:put_chars(beamdiag_format_procs:text(Procs)).
%%% TOP PROCESSES (9.8 s between the walks; every process walked: 1,204 and 1,206)
%%% ...
%%% '''
-module(beamdiag_format_procs).

-export([text/1, text/2, line/1, compare_text/1]).

-define(ROWS, 5).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The section, or a line saying why it is missing.
-spec text(beamdiag_agent_processes:report()) -> iolist().
text(P) ->
    text(P, []).

%% @doc The section with the Erlang sampler's hot stacks of the top
%% process, when the sampler ran (`--erlang'): its stacks per process, as
%% `beamdiag_agent_sampler' returns them.
-spec text(beamdiag_agent_processes:report(), [beamdiag_agent_sampler:process_stacks()]) ->
    iolist().
text(P = #{top_reductions := [Top | _]}, ByProcess) when ByProcess =/= [] ->
    [text(P, []), hot_stacks(Top, ByProcess)];
text(#{error := E}, _) ->
    ["TOP PROCESSES\n  not collected: ", beamdiag_safe_text:safe(E, 200), "\n"];
text(P = #{top_reductions := Top}, _) ->
    Total = maps:get(reductions, P, 0),
    [
        io_lib:format("TOP PROCESSES (walks ~ts)~n", [scope(P)]),
        notes(P),
        "  by reductions        share  process\n",
        case Top of
            [] -> "  none\n";
            _ -> [reds_line(E, Total) || E <- lists:sublist(Top, ?ROWS)]
        end,
        queues(maps:get(queues, P, [])),
        heaps(maps:get(heaps, P, []))
    ];
text(_, _) ->
    "".

%% @doc One line: the process with the largest share of the reductions
%% and the longest mailbox (watch's frame).
-spec line(beamdiag_agent_processes:report()) -> iolist().
line(#{error := _}) ->
    "processes: not collected";
line(P = #{top_reductions := Top}) ->
    Total = maps:get(reductions, P, 0),
    Reds = case Top of
               [E | _] when Total > 0 ->
                   io_lib:format("top ~ts ~s", [who_short(E), beamdiag_units:pct(maps:get(reductions, E) / Total)]);
               _ -> "top -"
           end,
    Q = case [E || E = #{queue := [_, Q1]} <- maps:get(queues, P, []), Q1 >= 100] of
            [QE = #{queue := [_, QL]} | _] -> io_lib:format("; mailbox ~ts ~ts", [who_short(QE), beamdiag_units:count(QL)]);
            [] -> ""
        end,
    ["processes: ", Reds, Q];
line(_) ->
    "".

%% @doc The PROCESSES section of a comparison.
-spec compare_text([beamdiag_compare:process_change()]) -> iolist().
compare_text([]) ->
    "\nPROCESSES (A -> B)\n  no process data in either, or nothing changed\n";
compare_text(Rows) ->
    ["\nPROCESSES (A -> B): share of reductions, queue and memory at the end\n",
     [io_lib:format("  ~-28ts ~6ts -> ~-6ts q ~ts -> ~ts  mem ~ts -> ~ts~n",
                    [beamdiag_safe_text:safe(K, 28), beamdiag_units:pct(SA), beamdiag_units:pct(SB), opt(QA), opt(QB),
                     opt_bytes(MA), opt_bytes(MB)])
      || #{process := K, share := [SA, SB], queue := [QA, QB], memory := [MA, MB]} <- Rows]].

%% @doc Which processes the walks covered, in words.
-spec scope(beamdiag_agent_processes:report()) -> iolist().
scope(P = #{mode := Mode, scanned := [S0, S1], process_count := [C0, C1]}) ->
    Span = maps:get(span_ms, P, 0) / 1000,
    What = case Mode of
               all -> io_lib:format("all ~b processes, ~b at the end", [S0, S1]);
               sampled -> io_lib:format("a sample of ~b of ~b processes", [S0, C0]);
               registered -> io_lib:format("only the ~b registered of ~b processes", [S0, C1]);
               %% A capture read back where the mode's atom is unknown.
               Other -> io_lib:format("~ts: ~b of ~b processes", [beamdiag_safe_text:safe(Other, 20), S0, C1])
           end,
    Trunc = case maps:get(truncated, P, false) of
                true -> ", a walk cut short by its time limit";
                false -> ""
            end,
    [io_lib:format("~.1f s apart, ", [Span]), What, Trunc].

%%%===================================================================
%%% Internal
%%%===================================================================

opt(null) -> "-";
opt(N) -> beamdiag_units:count(N).

opt_bytes(null) -> "-";
opt_bytes(N) -> beamdiag_units:bytes(N).

hot_stacks(Top = #{pid := Pid}, ByProcess) ->
    case [B || B = #{pid := P} <- ByProcess, P =:= Pid] of
        [#{samples := N, stacks := Stacks}] ->
            [io_lib:format("  hot stacks of ~ts (Erlang sampler, ~b samples of it running)~n",
                           [who_short(Top), N]),
             [io_lib:format("  ~5.1f%  ~ts~n", [100 * C / N, beamdiag_safe_text:safe(leaf(S), 66)])
              || #{stack := S, count := C} <- lists:sublist(Stacks, 3)]];
        [] ->
            io_lib:format("  the Erlang sampler never found ~ts running~n", [who(Top, 40)])
    end.

%% The innermost frames of a folded stack, innermost first.
leaf(Stack) ->
    lists:join(" < ", lists:sublist(lists:reverse(Stack), 3)).

notes(#{mode := sampled, limit := L}) ->
    io_lib:format("  above ~b processes every k-th process is read (the iterator of OTP 28)~n", [L]);
notes(#{mode := registered, limit := L}) ->
    io_lib:format("  above ~b processes, before OTP 28 (no iterator), the table is not listed~n",
                  [L]);
notes(_) ->
    "".

reds_line(E, Total) ->
    Share = case Total of
                0 -> 0.0;
                _ -> maps:get(reductions, E) / Total
            end,
    [io_lib:format("  ~12ts  ~6.1f%  ~ts~n",
                   [beamdiag_units:count(maps:get(reductions, E)), 100 * Share, who(E, 56)]),
     where(E)].

queues(Qs) ->
    case [E || E = #{queue := [_, Q1]} <- Qs, Q1 > 0] of
        [] ->
            "  mailboxes: none with messages at the end\n";
        Rows ->
            ["  mailboxes (messages at start -> end)\n",
             [[io_lib:format("  ~12ts -> ~-9ts  ~ts~ts~n",
                             [qstart(Q0), beamdiag_units:count(Q1), who(E, 52), queue_memory(E)]),
               spawner(E)]
              || E = #{queue := [Q0, Q1]} <- lists:sublist(Rows, ?ROWS)]]
    end.

%% The memory a long queue holds; "~" when estimated (the agent does not
%% ask a process with a long queue for its memory).
queue_memory(E = #{memory := [_, M1], queue := [_, Q1]}) when is_integer(M1), Q1 >= 10000 ->
    [", ", tilde(E), beamdiag_units:bytes(M1), estimated(E)];
queue_memory(_) ->
    "".

tilde(#{memory_estimated := true}) -> "~";
tilde(_) -> "".

estimated(#{memory_estimated := true}) -> " (estimated)";
estimated(_) -> "".

heaps([]) ->
    "";
heaps(Hs) ->
    ["  heaps (memory at the end, change over the window)\n",
     [[io_lib:format("  ~12ts ~10ts  ~ts~ts~ts~n",
                     [[tilde(E), beamdiag_units:bytes(M1)], growth(M0, M1, E), who_short(E),
                      like(E), estimated(E)]),
       spawner(E)]
      || E = #{memory := [M0, M1]} <- lists:sublist(Hs, ?ROWS), is_integer(M1)]].

growth(M0, M1, _) when is_integer(M0) ->
    [case M1 >= M0 of true -> "+"; false -> "-" end, beamdiag_units:bytes(abs(M1 - M0))];
growth(_, _, #{born := false}) ->
    %% It did not answer the start walk: its growth is unknown.
    "unread";
growth(_, _, _) ->
    "new".

like(#{like := N}) when is_integer(N), N > 1 -> io_lib:format(", ~b like it", [N]);
like(_) -> "".

%% Where it was at the end, and who spawned it, under the process's line.
where(E = #{current := C, monitored_by := M}) when M > 0 ->
    [io_lib:format("~24sin ~ts, ~b monitors~n", ["", beamdiag_safe_text:safe(C, 40), M]), own(E),
     spawner(E)];
where(E = #{current := C}) ->
    [io_lib:format("~24sin ~ts~n", ["", beamdiag_safe_text:safe(C, 50)]), own(E), spawner(E)];
where(E) ->
    spawner(E).

%% The innermost frame of the user's code that led there, when the
%% current function is not theirs.
own(#{own := Own} = E) when is_binary(Own) ->
    At = case maps:get(own_at, E, null) of
             null -> "";
             A -> [" (", beamdiag_safe_text:safe(A, 40), ")"]
         end,
    io_lib:format("~24scalled from ~ts~ts~n", ["", beamdiag_safe_text:safe(Own, 50), At]);
own(_) ->
    "".

%% Who spawned a process that nothing else names (beamdiag_proc_rules).
spawner(E) ->
    case beamdiag_proc_rules:spawned_by(E) of
        [] -> "";
        By -> io_lib:format("~24s~ts~n", ["", beamdiag_safe_text:safe(iolist_to_binary(By), 56)])
    end.

who_short(E = #{pid := Pid}) ->
    case {maps:get(name, E, null), maps:get(label, E, null)} of
        {N, _} when is_binary(N) -> beamdiag_safe_text:safe(N, 24);
        {null, L} when is_binary(L) -> beamdiag_safe_text:safe(L, 24);
        _ -> [beamdiag_safe_text:safe(Pid, 16), " ", beamdiag_safe_text:safe(maps:get(initial_call, E, <<>>), 60)]
    end.

%% The spawner has a line of its own under the process (where/1): the
%% column is too narrow for both.
who(E, Max) ->
    beamdiag_safe_text:safe(beamdiag_proc_rules:who(maps:remove(parent, E)), Max).

qstart(null) -> "new";
qstart(N) -> beamdiag_units:count(N).

