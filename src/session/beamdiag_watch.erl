%%% @doc A live view of a node: the agent streams ticks, and each tick the
%%% ledger and findings are computed over a sliding window of the last few
%%% samples.
%%%
%%% The session is data the caller drives: `start/2' connects, ships the
%%% agent and starts it with a long window; `next/2' waits for the next
%%% tick and returns the diagnosis of the sliding window; `stop/1' ends the
%%% agent, which puts back every flag it changed and unloads itself.
%%% Every 5 s the agent walks the process table once and the frame shows
%%% the process with the largest share of the reductions and the longest
%%% mailbox since the last walk (`procs => false' turns it off).
%%% `frame/2' renders a diagnosis as one screen that fits 80 columns
%%% whatever the number of schedulers (aggregated by thread type, plus the
%%% outliers). Printing is the CLI's job (`beamdiag_cli_watch'). The agent
%%% is spoken to through `beamdiag_client', as a collection window does.
%%%
%%% ```
%%% 1> {ok, S0} = beamdiag_watch:start("app@host", #{interval => 1000}).
%%% 2> {ok, S1, D} = beamdiag_watch:next(S0, 5000).
%%% 3> io:put_chars(beamdiag_watch:frame(D, #{colour => false, tick => 1})).
%%% 4> beamdiag_watch:stop(S1).
%%% '''
-module(beamdiag_watch).

-export([start/2, next/2, stop/1, frame/2, format_error/1]).
%% Called as Module:format_error/1 on an {error, {Module, Reason}} value.
-ignore_xref([{format_error, 1}]).

-export_type([session/0]).

-opaque session() :: #{
    node := node(),
    client := beamdiag_client:client(),
    loaded := [module()],
    info := map() | undefined,
    samples := [beamdiag_agent:sample()],
    window := pos_integer(),
    ticks := non_neg_integer(),
    interval := pos_integer(),
    procs => map()
}.

-define(DEFAULTS, #{interval => 1000, duration => infinity, window => 2, msacc => false,
                   procs => true}).
%% How often the agent walks the process table for the view, in ms.
-define(PROCS_EVERY_MS, 5000).
-define(REMOTE_KEYS, [cookie, cookie_file]).
%% An agent needs a bounded window; "until stopped" is a day.
-define(LONG_MS, 86400000).
-define(CALL_TIMEOUT, 5000).
-define(WIDTH, 80).
-define(OUTLIERS, 3).
-define(FINDINGS, 4).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Validates options and fills in defaults: `interval' ms between
%% ticks (1000), `duration' seconds or `infinity' (infinity: a day),
%% `window' samples per ledger (2: the last interval), `msacc' (false:
%% microstate accounting costs a little on every state change, so a
%% long-running view leaves it off unless asked), `cookie', `cookie_file'.
%% Unknown options raise `badarg'.
-spec options(map()) -> map().
options(Opts) when is_map(Opts) ->
    O = beamdiag_opts:merge(Opts, ?DEFAULTS, ?REMOTE_KEYS),
    #{interval := I, duration := D, window := W} = O,
    (is_integer(I) andalso I >= 100 andalso I =< 60000) orelse erlang:error({badarg, {interval, I}}),
    (D =:= infinity orelse (is_number(D) andalso D > 0)) orelse erlang:error({badarg, {duration, D}}),
    (is_integer(W) andalso W >= 2 andalso W =< 600) orelse erlang:error({badarg, {window, W}}),
    O.

%% @doc Connects to the node (this node when given `node()'), loads the
%% agent there and starts it.
-spec start(node() | string() | binary(), map()) ->
    {ok, session()} | {error, {module(), term()}}.
start(Node, Opts) when Node =:= node() ->
    start_agent(Node, [], options(Opts));
start(Node, Opts) when is_atom(Node) ->
    start(atom_to_list(Node), Opts);
start(NodeStr, Opts) ->
    O = options(Opts),
    case beamdiag_remote:connect(NodeStr, maps:with(?REMOTE_KEYS, O)) of
        {ok, Node} ->
            case beamdiag_loader:load(Node, beamdiag_agent:modules()) of
                {ok, Loaded} -> start_agent(Node, Loaded, O);
                {error, _} = E -> E
            end;
        {error, _} = E ->
            E
    end.

%% @doc Waits up to Timeout ms for the next tick. Returns the diagnosis of
%% the sliding window once it holds two samples, `{wait, Session}' before
%% that or when nothing came in time, `{done, Session}' when the agent's
%% window ended, or an error when the target went away.
-spec next(session(), timeout()) ->
    {ok, session(), beamdiag:diagnosis()} | {wait, session()} | {done, session()}
    | {error, {beamdiag_watch, term()}}.
next(S, Timeout) ->
    next(S, Timeout, case Timeout of
                         infinity -> infinity;
                         _ -> erlang:monotonic_time(millisecond) + Timeout
                     end).

%% @doc Ends the agent; it restores the flags it changed and unloads its
%% modules from the target.
-spec stop(session()) -> ok.
stop(#{client := Client}) ->
    beamdiag_client:stop(Client, ?CALL_TIMEOUT).

%% @doc One screen for a diagnosis, at most 80 columns wide. Options:
%% `colour' (false), `tick' (a counter shown in the header), `interval'
%% (ms, shown in the header), `clock' (a time text for the header).
-spec frame(beamdiag:diagnosis(), map()) -> iolist().
frame(#{capture := C, ledger := L, findings := F}, Opts) ->
    Colour = maps:get(colour, Opts, false),
    [
        header(C, L, Opts),
        cpu_line(L),
        procs_line(C),
        "\n",
        ledger(L, Colour),
        outliers(maps:get(threads, L, []), Colour),
        "\n",
        findings(F, Colour)
    ].

%% @doc Turns an error reason of this module into a sentence.
-spec format_error(term()) -> iolist().
format_error({target_down, Why}) ->
    io_lib:format("the target went away (~ts)", [beamdiag_client:ended({down, Why})]);
format_error({aborted, Why}) ->
    io_lib:format("the agent stopped (~ts)", [beamdiag_client:ended({aborted, Why})]);
format_error({agent_start, _, _} = Why) ->
    beamdiag_client:format_error(Why).

%%%===================================================================
%%% Internal: session
%%%===================================================================

next(S = #{client := Client}, Timeout, Until) ->
    case beamdiag_client:next(Client, Timeout) of
        {event, {start, Info}} ->
            next(S#{info => Info}, left(Until), Until);
        {event, {procs, Report}} ->
            next(S#{procs => Report}, left(Until), Until);
        {event, {tick, Sample}} ->
            S2 = push(Sample, S),
            case diagnosis(S2) of
                undefined -> {wait, S2};
                D -> {ok, S2, D}
            end;
        {event, {done, _}} ->
            beamdiag_client:close(Client),
            {done, S};
        {event, {aborted, Why}} ->
            beamdiag_client:close(Client),
            {error, {beamdiag_watch, {aborted, Why}}};
        {event, _} ->
            %% Words a view does not show (finishing, the deadline's moves).
            next(S, left(Until), Until);
        {down, Why} ->
            {error, {beamdiag_watch, {target_down, Why}}};
        timeout ->
            {wait, S}
    end.

left(infinity) -> infinity;
left(Until) -> max(0, Until - erlang:monotonic_time(millisecond)).

start_agent(Node, Loaded, Opts = #{interval := I, duration := D, window := W, msacc := M}) ->
    Duration = case D of
                   infinity -> ?LONG_MS;
                   _ -> max(I, round(D * 1000))
               end,
    %% A watch window lasts until it is stopped: the agent walks the
    %% process table every few seconds instead (one walk each) and reports
    %% the processes since the last walk.
    AgentOpts = #{duration_ms => Duration, interval_ms => I, msacc => M,
                  procs => maps:get(procs, Opts), procs_every => max(1, ?PROCS_EVERY_MS div I),
                  unload => Loaded},
    case beamdiag_client:start(Node, AgentOpts) of
        {ok, Client} ->
            {ok, #{node => Node, client => Client, loaded => Loaded,
                   info => undefined, samples => [], window => W, ticks => 0,
                   interval => I}};
        {error, {beamdiag_client, Why}} ->
            beamdiag_loader:unload(Node, Loaded),
            {error, {beamdiag_watch, Why}}
    end.

%% The newest sample first, at most Window kept.
push(Sample, S = #{samples := Samples, window := W, ticks := T}) ->
    S#{samples => lists:sublist([Sample | Samples], W), ticks => T + 1}.

diagnosis(S = #{info := Info, samples := Samples, interval := I}) when is_map(Info),
                                                                      length(Samples) >= 2 ->
    Extras = case S of
                 #{procs := P} -> #{procs => P};
                 _ -> #{}
             end,
    beamdiag_diagnosis:analyse(beamdiag_capture:new(Info, lists:reverse(Samples),
                                          #{interval_ms => I, extras => Extras}));
diagnosis(_) ->
    undefined.

%%%===================================================================
%%% Internal: the screen
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

outliers(Threads, Colour) ->
    case beamdiag_outliers:threads(Threads, ?OUTLIERS) of
        [] -> "";
        Top -> ["outliers:\n",
                [row(beamdiag_safe_text:safe(Name, 15), 1, beamdiag_ledger:state_shares(T), Colour)
                 || T = #{name := Name} <- Top]]
    end.

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

