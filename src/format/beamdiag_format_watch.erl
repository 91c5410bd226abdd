%%% @doc The live view's screen (beamdiag_watch): a diagnosis of the
%%% sliding window as one screen that fits 80 columns whatever the number
%%% of schedulers: the header, the CPU line, the memory line, the busiest process and
%%% longest mailbox of the last walk, the ledger by thread type with the
%%% outlier threads, and the findings.
%%%
%%% ```
%%% 1> io:put_chars(beamdiag_format_watch:frame(D, #{colour => false, tick => 1})).
%%% '''
-module(beamdiag_format_watch).

-export([frame/2]).

-export_type([options/0]).

%% frame/2's options: `colour' (false), `tick' (0), `clock' (""), and
%% `interval' (ms), which the @doc names but the header does not show.
-type options() :: #{colour => boolean(), tick => non_neg_integer(), clock => iodata(),
                     interval => pos_integer()}.

-define(WIDTH, 80).
-define(OUTLIERS, 3).
-define(FINDINGS, 4).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc One screen for a diagnosis, at most 80 columns wide. Options:
%% `colour' (false), `tick' (a counter shown in the header), `interval'
%% (ms, shown in the header), `clock' (a time text for the header).
-spec frame(beamdiag_diagnosis:diagnosis(), options()) -> iolist().
frame(D = #{capture := C, ledger := L, findings := F}, Opts) ->
    Colour = maps:get(colour, Opts, false),
    [
        header(C, L, Opts),
        cpu_line(L),
        memory_line(maps:get(memory, D, #{})),
        procs_line(C),
        "\n",
        ledger(L, Colour),
        outliers(beamdiag_ledger:outliers(L, ?OUTLIERS), Colour),
        "\n",
        findings(F, Colour)
    ].

%%%===================================================================
%%% Internal
%%%===================================================================

header(C, L, Opts) ->
    S = maps:get(settings, C, #{}),
    Left = io_lib:format("beamdiag watch ~ts", [beamdiag_safe_text:safe(maps:get(node, C, <<"?">>), 40)]),
    Right = io_lib:format("~ts tick ~b, ~.1f s", [maps:get(clock, Opts, ""), maps:get(tick, Opts, 0),
                                                 float(maps:get(window_s, L, 0.0))]),
    [pad(Left, ?WIDTH - 1 - string:length(Right)), " ", Right, "\n",
     io_lib:format("OTP ~ts, ~b schedulers, ~b dirty cpu, +sbwt ~ts; q or Ctrl-C quits~n",
                   [beamdiag_safe_text:safe(maps:get(otp_release, S, <<"?">>), 4),
                    maps:get(schedulers_online, S, 0),
                    maps:get(dirty_cpu_schedulers_online, S, 0),
                    beamdiag_safe_text:safe(maps:get(sbwt, S, <<"?">>), 10)])].

cpu_line(#{totals := T, host := H, cgroup := Cg}) when map_size(T) > 0 ->
    Host = case H of
               #{ncpu := N, busy := B} ->
                   io_lib:format(", host ~b CPUs ~s busy, steal ~s", [N, beamdiag_units:pct(B), beamdiag_units:pct(maps:get(steal, H, 0.0))]);
               _ -> ""
           end,
    Throttle = case maps:get(throttled_ratio, Cg, undefined) of
                   R when is_number(R), R > 0 -> [", throttled ", beamdiag_units:pct(R)];
                   _ -> ""
               end,
    io_lib:format("CPU: node ~.2f of ~.2f~ts~ts~n",
                  [float(maps:get(cpus_used, T, 0.0)), float(maps:get(cpus_available, T, 0.0)),
                   Host, Throttle]);
cpu_line(_) ->
    "CPU: no per-thread figures\n".

%% The memory ledger in a line: the resident memory and its rate, the VM's
%% total, and the VM's part that changed fastest.
memory_line(#{accounts := #{rss := #{last := R, rate := RR}, total := #{last := V}} = Acc}) ->
    Parts = [{abs(Rate), P, Rate} || P <- [processes, binary, ets, atom, code, other],
                                     #{rate := Rate} <- [maps:get(P, Acc, none)]],
    Fastest = case lists:reverse(lists:sort(Parts)) of
                  [{_, P, Rate} | _] -> io_lib:format("; fastest ~s ~s/s", [P, beamdiag_units:signed_bytes(Rate)]);
                  [] -> ""
              end,
    [cut(io_lib:format("memory: resident ~s (~s/s), VM ~s~ts",
                       [beamdiag_units:bytes(R), beamdiag_units:signed_bytes(RR), beamdiag_units:bytes(V), Fastest]),
         ?WIDTH), "\n"];
memory_line(_) ->
    "".


%% The top process and the longest mailbox from the latest process walk.
procs_line(#{extras := #{procs := P}}) ->
    [cut(beamdiag_format_procs:line(P), ?WIDTH), "\n"];
procs_line(_) ->
    "".

ledger(#{by_type := ByType, threads := Threads}, Colour) when Threads =/= [] ->
    Types = [T || T <- [scheduler, dirty_cpu, dirty_io, aux, poll],
                  maps:is_key(T, ByType)],
    [
        "TIME LEDGER (share of wall time, by thread type)\n",
        io_lib:format("~-15s ~3s ~6s ~6s ~6s ~6s ~6s  ~s~n",
                      ["type", "n", "run", "spin", "block", "runq", "idle", legend(Colour)]),
        [row(atom_to_list(T), maps:get(n, Row, 0), beamdiag_ledger:state_shares(Row), Colour)
         || T <- Types, Row <- [maps:get(T, ByType)]]
    ];
ledger(_, _) ->
    "TIME LEDGER\n  no per-thread figures yet\n".

row(Label, N, P, Colour) ->
    [io_lib:format("~-15ts ~3b ~6s ~6s ~6s ~6s ~6s  ",
                   [Label, N | [beamdiag_units:pct(maps:get(K, P)) || K <- beamdiag_ledger:states()]]),
     bar(P, 20, Colour), "\n"].

outliers([], _Colour) ->
    "";
outliers(Top, Colour) ->
    ["outliers:\n",
     [row(beamdiag_safe_text:safe(Name, 15), 1, beamdiag_ledger:state_shares(T), Colour)
      || T = #{name := Name} <- Top]].

findings([], _Colour) ->
    "FINDINGS: none\n";
findings(F, Colour) ->
    Shown = lists:sublist(F, ?FINDINGS),
    ["FINDINGS\n",
     [[colour(Sev, io_lib:format("~-10s", ["[" ++ string:uppercase(atom_to_list(Sev)) ++ "]"]), Colour),
       " ", cut([atom_to_list(Id), ": ", Title], ?WIDTH - 12), "\n",
       case Ev of
           [E | _] -> ["           ", cut(E, ?WIDTH - 12), "\n"];
           [] -> ""
       end] || #{severity := Sev, id := Id, title := Title, evidence := Ev} <- Shown],
     case length(F) > ?FINDINGS of
         true -> io_lib:format("  and ~b more~n", [length(F) - ?FINDINGS]);
         false -> ""
     end].

%% A bar of Width characters: one glyph per layer, coloured on a terminal.
bar(P, Width, Colour) ->
    Layers = [{run, $#}, {spin, $~}, {blocked, $!}, {runq, $r}],
    Counts = [{K, G, round(maps:get(K, P) * Width)} || {K, G} <- Layers],
    Used = lists:sum([N || {_, _, N} <- Counts]),
    Cells = [[paint(K, lists:duplicate(N, G), Colour) || {K, G, N} <- Counts, N > 0],
             lists:duplicate(max(0, Width - Used), $.)],
    case Used > Width of
        true -> lists:sublist(lists:flatten([lists:duplicate(N, G) || {_, G, N} <- Counts]), Width);
        false -> Cells
    end.

legend(false) -> "#run ~spin !block rq";
legend(true) -> [paint(run, "#", true), "run ", paint(spin, "~", true), "spin ",
                 paint(blocked, "!", true), "block ", paint(runq, "r", true), "q"].

paint(_, Text, false) -> Text;
paint(run, Text, true) -> ["\e[34m", Text, "\e[0m"];
paint(spin, Text, true) -> ["\e[33m", Text, "\e[0m"];
paint(blocked, Text, true) -> ["\e[31m", Text, "\e[0m"];
paint(runq, Text, true) -> ["\e[35m", Text, "\e[0m"].

colour(_, Text, false) -> Text;
colour(critical, Text, true) -> ["\e[1;31m", Text, "\e[0m"];
colour(warning, Text, true) -> ["\e[1;33m", Text, "\e[0m"];
colour(_, Text, true) -> ["\e[36m", Text, "\e[0m"].



pad(Text, Width) ->
    S = lists:flatten(Text),
    case string:length(S) of
        N when N >= Width -> string:slice(S, 0, Width);
        N -> S ++ lists:duplicate(Width - N, $\s)
    end.

cut(Text, Width) ->
    beamdiag_safe_text:cut(Text, Width).

