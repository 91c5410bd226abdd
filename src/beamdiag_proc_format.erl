%%% @doc The TOP PROCESSES section of the text report, from the process
%%% data `beamdiag_agent_procs:finish/1' returns: the processes with the
%%% largest share of the node's reductions, the mailboxes, the largest
%%% heaps. Returns iodata; the caller makes the report safe for a terminal
%%% (names and labels come from the target).
%%%
%%% ```
%%% 1> io:put_chars(beamdiag_proc_format:text(Procs)).
%%% TOP PROCESSES (9.8 s between the walks; every process walked: 1,204 and 1,206)
%%% ...
%%% '''
-module(beamdiag_proc_format).

-export([text/1, scope/1]).

-define(ROWS, 5).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The section, or a line saying why it is missing.
-spec text(map()) -> iolist().
text(#{error := E}) ->
    ["TOP PROCESSES\n  not collected: ", beamdiag_text:safe(E, 200), "\n"];
text(P = #{top_reductions := Top}) ->
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
text(_) ->
    "".

%% @doc Which processes the walks covered, in words.
-spec scope(map()) -> iolist().
scope(P = #{mode := Mode, scanned := [S0, S1], process_count := [C0, C1]}) ->
    Span = maps:get(span_ms, P, 0) / 1000,
    What = case Mode of
               all -> io_lib:format("all ~b processes, ~b at the end", [S0, S1]);
               sampled -> io_lib:format("a sample of ~b of ~b processes", [S0, C0]);
               registered -> io_lib:format("only the ~b registered of ~b processes", [S0, C1])
           end,
    Trunc = case maps:get(truncated, P, false) of
                true -> ", a walk cut short by its time limit";
                false -> ""
            end,
    [io_lib:format("~.1f s apart, ", [Span]), What, Trunc].

%%%===================================================================
%%% Internal
%%%===================================================================

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
    io_lib:format("  ~12ts  ~6.1f%  ~ts~ts~n",
                  [count(maps:get(reductions, E)), 100 * Share, who(E, 50), where(E)]).

queues(Qs) ->
    case [E || E = #{queue := [_, Q1]} <- Qs, Q1 > 0] of
        [] ->
            "  mailboxes: none with messages at the end\n";
        Rows ->
            ["  mailboxes (messages at start -> end)\n",
             [io_lib:format("  ~12ts -> ~-9ts  ~ts~n",
                            [qstart(Q0), count(Q1), who(E, 50)])
              || E = #{queue := [Q0, Q1]} <- lists:sublist(Rows, ?ROWS)]]
    end.

heaps([]) ->
    "";
heaps(Hs) ->
    ["  heaps (memory at the end, change over the window)\n",
     [io_lib:format("  ~12ts ~10ts  ~ts~ts~n",
                    [beamdiag_proc_rules:bytes(M1), growth(M0, M1), who(E, 50), like(E)])
      || E = #{memory := [M0, M1]} <- lists:sublist(Hs, ?ROWS), is_integer(M1)]].

growth(M0, M1) when is_integer(M0) ->
    [case M1 >= M0 of true -> "+"; false -> "-" end, beamdiag_proc_rules:bytes(abs(M1 - M0))];
growth(_, _) ->
    "new".

like(#{like := N}) when is_integer(N), N > 1 -> io_lib:format(", ~b like it", [N]);
like(_) -> "".

where(#{current := C, monitored_by := M}) when M > 0 ->
    io_lib:format(" in ~ts, ~b monitors", [beamdiag_text:safe(C, 40), M]);
where(#{current := C}) ->
    [" in ", beamdiag_text:safe(C, 40)];
where(_) ->
    "".

who(E, Max) ->
    beamdiag_text:safe(beamdiag_proc_rules:who(E), Max).

qstart(null) -> "new";
qstart(N) -> count(N).

count(N) when N >= 1000000 -> io_lib:format("~.1fM", [N / 1.0e6]);
count(N) when N >= 10000 -> io_lib:format("~.1fk", [N / 1.0e3]);
count(N) -> integer_to_list(N).
