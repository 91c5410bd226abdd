%%% @doc Diagnoses every node of a cluster over the same wall-clock window
%%% and points at the odd one out.
%%%
%%% The members are the seed node and the nodes it is connected to
%%% (`erlang:nodes()' on the seed; hidden nodes are not members), or a list
%%% of node names (`nodes'), for clusters that are not fully meshed. This
%%% node connects to each member as a hidden node and leaves nothing behind:
%%% the agents remove their modules when they end, and every connection this
%%% session opened is closed at its end.
%%%
%%% Hundreds of members stay cheap and comparable. First, at most
%%% `concurrency' members at a time are connected and given the agent's
%%% modules (read once for all of them); a member not ready within 5 s of
%%% its own start is given up, and when it runs on this host, what this
%%% host's /proc shows of it over the window goes with its reason
%%% (`beamdiag_host_glance'). Each member prepared gets its collector at
%%% once, whose agent sets itself up (its flags, the start walk) while the
%%% others are prepared and then waits (the agent's `go'). The windows open
%%% together when every agent is ready (or 2 s after the last member was
%%% prepared: one ready later samples what is left), all with the same
%%% wall-clock end, so that every window covers the same seconds and none
%%% holds any member's start, hundreds of them on a few cores. Each
%%% member's window start (its wall clock) is kept, and the report says
%%% how far apart the starts were and how long all windows overlap. The
%%% report is due `slack' after the common end: a member whose agent has
%%% not sent two samples by then is reported from what it sent (a partial
%%% capture), one that sent nothing (within a few seconds of grace) is
%%% listed, with the reason in words, and the rest of the report stands.
%%% Where the session's time went is in `timing' (`phases_ms'). The
%%% members file is read by `beamdiag_cluster_members', the members are
%%% connected and given the agent by `beamdiag_cluster_pool', and their
%%% windows are opened together and gathered by `beamdiag_cluster_start'.
%%%
%%% The analysis (`beamdiag_outliers:nodes/1') gives each figure's
%%% distribution over the nodes and the outliers; each outlier gets a
%%% finding of its own, `cluster_outlier', that says in figures how it
%%% differs from the cluster's median. Members that share a host (the
%%% kernel's boot id each reads) are grouped (`hosts'), and the host's
%%% contention is said once, for the host (`shared_host_contention'), not
%%% on each member; on a contended shared host a member is an outlier only
%%% when it stands out on a figure of its own demand
%%% (`beamdiag_cluster_analysis').
%%%
%%% ```
%%% 1> {ok, C} = beamdiag_cluster:diagnose("app@host1", #{duration => 5}).
%%% 2> [N || #{node := N} <- maps:get(outliers, C)].
%%% [<<"app@host3">>]
%%% 3> io:put_chars(beamdiag_format_text:cluster(C, #{})).
%%% '''
-module(beamdiag_cluster).

-export([diagnose/2, read_nodes/1,
         format_error/1]).
%% Called as Module:format_error/1 on an {error, {Module, Reason}} value.
-ignore_xref([{format_error, 1}]).

-export_type([cluster/0, member_result/0, options/0]).

%% A cluster's report and one member's part of it (beamdiag_cluster_analysis).
-type member_result() :: beamdiag_cluster_analysis:member_result().
-type cluster() :: beamdiag_cluster_analysis:cluster().

-define(SCHEMA, <<"beamdiag.cluster/2">>).
%% diagnose/2's own options; the others are beamdiag:diagnose/2's
%% (beamdiag:options()), except `progress', `perf' and `erlang'.
-type options() :: #{
    max_nodes => pos_integer(),
    concurrency => pos_integer(),
    nodes => [node() | string() | binary()] | undefined,
    atom() => term()
}.

-define(DEFAULTS, #{max_nodes => 500, concurrency => 64, nodes => undefined}).
-define(OWN_KEYS, [max_nodes, concurrency, nodes]).
-define(CALL_TIMEOUT, 5000).
%% Members on one host past which their agents do not scan the host's
%% processes (see crowded/1).
-define(CROWDED, 16).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Diagnoses the cluster of NODE (NODE and every node connected to
%% it), or, with `nodes', the nodes listed there (and NODE, unless it is
%% `undefined'). Options: those of `beamdiag:diagnose/2' except `progress',
%% `perf' and `erlang'; `max_nodes' (500: more members is an error, not a
%% storm of connections), `concurrency' (64: members connected and loaded
%% at once), `nodes' (a list of node names).
-spec diagnose(node() | string() | binary() | undefined, options()) ->
    {ok, cluster()} | {error, {module(), term()}}.
diagnose(Node, Opts) when is_atom(Node), Node =/= undefined ->
    diagnose(atom_to_list(Node), Opts);
diagnose(Seed, Opts) when is_map(Opts) ->
    #{max_nodes := Max, concurrency := K, nodes := List} =
        maps:merge(?DEFAULTS, maps:with(?OWN_KEYS, Opts)),
    (is_integer(Max) andalso Max >= 1) orelse erlang:error({badarg, {max_nodes, Max}}),
    (is_integer(K) andalso K >= 1) orelse erlang:error({badarg, {concurrency, K}}),
    DiagOpts = beamdiag_diagnose:options(maps:without(?OWN_KEYS, Opts)),
    (maps:get(perf, DiagOpts) =:= false andalso maps:get(erlang, DiagOpts) =:= false)
        orelse erlang:error({badarg, perf}),
    Before = nodes([visible, hidden]),
    Remote = maps:with([cookie, cookie_file], DiagOpts),
    T0 = erlang:monotonic_time(millisecond),
    W0 = erlang:system_time(millisecond),
    {Cpu0, _} = erlang:statistics(runtime),
    case members(Seed, List, Remote, Before) of
        {ok, SeedNode, _Source, Members} when length(Members) > Max ->
            disconnect_new([SeedNode], Before),
            {error, {?MODULE, {too_many_nodes, length(Members), Max}}};
        {ok, SeedNode, Source, Members} ->
            Tm = erlang:monotonic_time(millisecond),
            {C, _Late, Marks} =
                try
                    R = {_, Late, _} = session(SeedNode, Source, Members, Remote, K, DiagOpts,
                                               Cpu0),
                    beamdiag_cluster_pool:settle(Late),
                    R
                after
                    disconnect_new(Members, Before)
                end,
            T4 = erlang:monotonic_time(millisecond),
            {Cpu4, _} = erlang:statistics(runtime),
            #{prepared := T1, built := T3} = Marks,
            Timing = timing(Marks#{start => T0, members => Tm, closed => T4}),
            {ok, C#{prepare_s => (T1 - T0) / 1000,
                    total_s => (T3 - T0) / 1000,
                    timing => Timing#{cpu_ms => Cpu4 - Cpu0,
                                      started_wall_ms => W0,
                                      done_wall_ms => W0 + T4 - T0}}};
        {error, _} = E ->
            E
    end.

%% @doc Reads a file of node names, one a line: blank lines and lines
%% starting with `#' (after blanks) are skipped, a `#' after a name starts
%% a comment. A line that is not a node name is an error naming the file
%% and the line, as is a file that names no node (see
%% `beamdiag_cluster_members').
-spec read_nodes(file:filename()) -> {ok, [node()]} | {error, {beamdiag_cluster, term()}}.
read_nodes(File) ->
    beamdiag_cluster_members:read_nodes(File).

%% @doc Turns an error reason of this module into a sentence.
-spec format_error(term()) -> iolist().
format_error({members, Node, Why}) ->
    io_lib:format("cannot list the nodes connected to ~ts: ~ts", [safe(Node), erpc_words(Why)]);
format_error({too_many_nodes, N, Max}) ->
    io_lib:format("the cluster has ~b nodes; at most ~b are diagnosed at once "
                  "(raise it with --max-nodes, library option max_nodes)", [N, Max]);
format_error({bad_line, File, N, Line}) ->
    io_lib:format("~ts, line ~b: '~ts' is not a node name (expected name@host, one a line; "
                  "# starts a comment)", [safe(File), N, safe(Line)]);
format_error({bad_line, N, Line}) ->
    io_lib:format("line ~b: '~ts' is not a node name (expected name@host)", [N, safe(Line)]);
format_error({no_nodes, File}) ->
    io_lib:format("~ts lists no node names", [safe(File)]);
format_error({nodes_file, File, Why}) ->
    io_lib:format("cannot read the node list ~ts: ~ts", [safe(File), file:format_error(Why)]);
format_error({prepare_timeout, Ms}) ->
    io_lib:format("did not answer within ~.1f s while being connected and given the agent",
                  [Ms / 1000]);
format_error({no_answer, Ms}) ->
    io_lib:format("its agent sent nothing usable within ~.1f s of the window's end; "
                  "it was told to stop", [Ms / 1000]);
format_error({crashed, _}) ->
    "the diagnosis of this node crashed in beamdiag (a bug; the other nodes are unaffected)";
format_error({agent_start, timeout}) ->
    "the node did not start the agent within 5 s (overloaded or stalled)";
format_error({agent_start, noconnection}) ->
    "the connection to the node dropped before its agent started";
format_error({agent_start, Why}) ->
    io_lib:format("the agent could not start on the node (~ts)", [erpc_words(Why)]);
format_error({target_down, noconnection, N}) ->
    io_lib:format("the connection to the node dropped mid-window after ~b samples", [N]);
format_error({target_down, _, N}) ->
    io_lib:format("the agent ended mid-window after ~b samples", [N]);
format_error(timeout) ->
    "the agent did not send two samples in time".

%%%===================================================================
%%% Internal: members
%%%===================================================================

members(Seed, undefined, Remote, Before) when Seed =/= undefined ->
    case beamdiag_remote:connect(Seed, Remote) of
        {ok, Node} ->
            %% At high priority: on a busy seed a normal-priority call
            %% waits behind every runnable process (beamdiag_rpc).
            try beamdiag_rpc:call(Node, erlang, nodes, [], ?CALL_TIMEOUT) of
                Nodes when is_list(Nodes) -> {ok, Node, seed, lists:usort([Node | Nodes])}
            catch
                Class:Reason ->
                    disconnect_new([Node], Before),
                    {error, {?MODULE, {members, Node, {Class, Reason}}}}
            end;
        {error, _} = E ->
            E
    end;
members(undefined, undefined, _Remote, _Before) ->
    erlang:error({badarg, no_members});
members(Seed, List, _Remote, _Before) when is_list(List) ->
    Names = [to_list(N) || N <- List] ++ [to_list(Seed) || Seed =/= undefined],
    Parsed = [{N, beamdiag_node_name:parse(N)} || N <- Names],
    case [E || {_, {error, _} = E} <- Parsed] of
        [E | _] ->
            E;
        [] ->
            SeedNode = case Seed of
                           undefined -> null;
                           _ -> list_to_atom(to_list(Seed))
                       end,
            {ok, SeedNode, list, lists:usort([N || {_, {ok, N, _}} <- Parsed])}
    end.

to_list(A) when is_atom(A) -> atom_to_list(A);
to_list(B) when is_binary(B) -> unicode:characters_to_list(B);
to_list(L) when is_list(L) -> L.

%% Only the connections this session opened are closed: a node this one
%% was already connected to stays connected.
disconnect_new(Nodes, Before) ->
    [beamdiag_remote:disconnect(N) || N <- Nodes, is_atom(N), N =/= null,
                                      not lists:member(N, Before)],
    ok.

%%%===================================================================
%%% Internal: the phases
%%%===================================================================

%% The session once the members are known: each member connected, given
%% the agent's modules and its agent started and made ready
%% (beamdiag_cluster_pool:prepare/4, arm/2), the windows opened at once
%% (beamdiag_cluster_start:run_all/3), the report built (this node's
%% CPU time from Cpu0 is what the session used, said with its host).
%% Returns the report, the workers given up on, and the moments and
%% figures timing/1 reads.
session(SeedNode, Source, Members, Remote, K, Opts, Cpu0) ->
    Starter = beamdiag_cluster_start:starter(),
    try
        Collect = collect_opts(Opts, Starter),
        {Prepared, Late, Times, Collectors} =
            beamdiag_cluster_pool:prepare(Members, Remote, K, arm(Members, Collect)),
        T1 = erlang:monotonic_time(millisecond),
        Glances = glances([M || {M, {error, _}} <- Prepared]),
        _ = spawn(fun beamdiag_loader:warm/0),
        Host0 = beamdiag_agent_procfs:host("/proc"),
        {Run, RunMarks} = beamdiag_cluster_start:run_all(Collectors, Starter, Opts),
        Load = case {Host0, beamdiag_agent_procfs:host("/proc")} of
                   {{ok, H0}, {ok, H1}} -> beamdiag_cluster_analysis:host_load(H0, H1);
                   _ -> undefined
               end,
        Seen = maps:from_list([{M, beamdiag_host_glance:finish(G)} || {M, G} <- Glances]),
        T2 = erlang:monotonic_time(millisecond),
        Errors = [{M, E} || {M, {error, E}} <- Prepared] ++ [{M, E} || {M, {error, E}} <- Run],
        Results = [{M, R} || {M, {ok, R}} <- Run],
        {Cpu, _} = erlang:statistics(runtime),
        Here = maps:merge(maps:with([boot_id], beamdiag_agent_host:placement("/proc")),
                          #{cpu_s => (Cpu - Cpu0) / 1000}),
        C0 = build(SeedNode, Source, Members, Results, Errors, Seen, maps:get(duration, Opts), Here),
        {ok, HostName} = inet:gethostname(),
        C = C0#{saturated_host => beamdiag_cluster_analysis:saturated_host(
                                    [M || {M, E} <- Errors, unanswered(E)], Load, HostName)},
        T3 = erlang:monotonic_time(millisecond),
        {C, Late, RunMarks#{prepared => T1, results => T2, built => T3, times => Times,
                            run => Run}}
    after
        beamdiag_cluster_start:stop_starter(Starter)
    end.

%% What is done with each member prepared (beamdiag_cluster_pool): its
%% collector is started at once (beamdiag_cluster_start), whose agent
%% sets itself up while the other members are prepared, and then waits
%% for the word that opens every window; it gathers the window, analyses
%% the capture and keeps only the summary row and the findings. On a host
%% with more than ?CROWDED members the agents do not scan its processes.
arm(Members, Collect = #{tag := Tag}) ->
    Crowded = crowded(Members),
    fun(M, Node, Loaded) ->
            C = Collect#{unload => Loaded, host_scan => not lists:member(beamdiag_node_name:host(M), Crowded)},
            beamdiag_cluster_start:collector(M, Node, Tag,
                                             fun() -> member(Node, maps:remove(tag, C)) end)
    end.

%% The hosts with more than ?CROWDED members. Each agent reads every
%% process of its host at the window's start and end (to name what
%% competes for CPUs); with hundreds of members on one host that is
%% hundreds of scans of hundreds of processes, all at the window's start,
%% so there the scan is left out.
crowded(Members) ->
    Counts = lists:foldl(fun(M, Acc) -> maps:update_with(beamdiag_node_name:host(M), fun(X) -> X + 1 end, 1, Acc) end,
                         #{}, Members),
    [H || {H, N} <- maps:to_list(Counts), N > ?CROWDED].

%% The collectors' options: the agent waits for the starter's word, and
%% the report is due the slack after the window the agent runs.
collect_opts(#{duration := D, interval := I, msacc := M, msacc_span := S, procs := P,
               slack := Slack}, #{pid := Starter}) ->
    Due = case Slack of
              infinity -> #{};
              _ -> #{ready_after_ms => round(Slack * 1000)}
          end,
    Due#{duration_ms => max(1, round(D * 1000)), interval_ms => I, msacc => M,
         msacc_ms => max(1, round(S * 1000)), procs => P, go => Starter, tag => make_ref()}.

member(Node, Collect) ->
    case beamdiag_collect:run(Node, Collect) of
        {ok, Capture} ->
            T0 = erlang:monotonic_time(millisecond),
            D = #{findings := F} = beamdiag_diagnosis:analyse(Capture),
            {ok, #{row => beamdiag_cluster_analysis:summary_row(D), findings => F, captured_at => T0,
                   analysed_at => erlang:monotonic_time(millisecond)}};
        {error, {beamdiag_collect, {target_down, Why, Partial}}} ->
            N = case Partial of
                    #{samples := S} -> length(S);
                    _ -> 0
                end,
            Words = case Why of
                        noconnection -> noconnection;
                        _ -> other
                    end,
            {error, {?MODULE, {target_down, Words, N}}};
        {error, {beamdiag_collect, {agent_start, _, {error, {erpc, What}}}}}
          when What =:= timeout; What =:= noconnection ->
            {error, {?MODULE, {agent_start, What}}};
        {error, {beamdiag_collect, {agent_start, _, Why}}} ->
            {error, {?MODULE, {agent_start, Why}}};
        {error, {beamdiag_collect, timeout}} ->
            {error, {?MODULE, timeout}};
        {error, _} = E ->
            E
    end.

%%%===================================================================
%%% Internal: the report
%%%===================================================================

build(Seed, Source, Members, Results, Errors, Seen, Duration, Here) ->
    A = beamdiag_cluster_analysis:analyse([R || {_, R} <- Results], Here),
    #{
        schema => ?SCHEMA,
        seed => case Seed of null -> null; _ -> atom_to_binary(Seed) end,
        source => Source,
        members => [atom_to_binary(M) || M <- Members],
        window_s => float(Duration),
        windows => windows(maps:get(nodes, A)),
        nodes => maps:get(nodes, A),
        spread => maps:get(spread, A),
        outliers => maps:get(outliers, A),
        rest => maps:get(rest, A),
        findings => maps:get(findings, A),
        hosts => maps:get(hosts, A),
        errors => [error_entry(M, E, maps:find(M, Seen)) || {M, E} <- lists:keysort(1, Errors)]
    }.

%% A member that did not answer in time (rather than one refused, or one
%% whose diagnosis crashed).
unanswered({beamdiag_cluster, {no_answer, _}}) -> true;
unanswered({beamdiag_cluster, {prepare_timeout, _}}) -> true;
unanswered({beamdiag_cluster, {agent_start, timeout}}) -> true;
unanswered({beamdiag_cluster, timeout}) -> true;
unanswered({beamdiag_collect, timeout}) -> true;
unanswered({beamdiag_remote, {unreachable, _, {no_answer, _}}}) -> true;
unanswered(_) -> false.

%% A member not diagnosed: the reason in words and, when it runs on this
%% host and its process was found, what this host showed of it over the
%% window (`host').
error_entry(M, E, error) ->
    #{node => atom_to_binary(M), message => iolist_to_binary(words(E))};
error_entry(M, E, {ok, View}) ->
    #{node => atom_to_binary(M), host => View,
      message => iolist_to_binary([words(E), "; ", beamdiag_host_glance:words(View)])}.

%% The members that could not be prepared and run on this host: their OS
%% processes, found from their names, are watched over the window from
%% this host's /proc (nothing is asked of them).
glances(Failed) ->
    lists:append([case beamdiag_host_glance:start(M, #{}) of
                      {ok, G} -> [{M, G}];
                      {error, _} -> []
                  end || M <- Failed]).

%% Where the session's time went, in milliseconds. `phases_ms', which add
%% up to the session: `members' (listing them: the seed's nodes()),
%% `prepare' (connecting to every member and loading the agent; the
%% agents get ready meanwhile), `start' (from the last member prepared to
%% the windows' opening: agents still getting ready), `window', `collect'
%% (from the windows' end to the last capture), `analyse' (from there to
%% the last member's analysis) and `report' (the cluster's analysis, and
%% closing the connections). Then each member's connect and load
%% (median, max, sum), the captures and their analyses from the windows'
%% opening, how many agents were ready when they opened (`ready'), and
%% the older totals (prepare, run from the last member prepared to the
%% last result, the cluster's analysis).
timing(#{start := T0, members := Tm, prepared := T1, go := Go, window_end := EndAt,
         results := T2, built := T3, closed := T4, times := Times, run := Run, ready := Ready}) ->
    Dist = fun(L) ->
                   S = lists:sort(L),
                   case S of
                       [] -> #{median => null, max => null, sum => 0};
                       _ -> #{median => lists:nth((length(S) + 1) div 2, S), max => lists:last(S),
                              sum => lists:sum(S)}
                   end
           end,
    LastCapture = lists:max([EndAt | [A || {_, {ok, #{captured_at := A}}} <- Run]]),
    #{phases_ms => #{members => Tm - T0, prepare => T1 - Tm, start => Go - T1,
                     window => EndAt - Go, collect => max(0, min(T2, LastCapture) - EndAt),
                     analyse => T2 - max(EndAt, min(T2, LastCapture)), report => T4 - T2},
      ready => Ready,
      prepare_ms => T1 - T0,
      connect_ms => Dist([C || #{connect_ms := C} <- maps:values(Times)]),
      load_ms => Dist([L || #{load_ms := L} <- maps:values(Times)]),
      run_ms => T2 - T1,
      analyse_ms => Dist([B - A || {_, {ok, #{captured_at := A, analysed_at := B}}} <- Run]),
      captured_ms => Dist([A - Go || {_, {ok, #{captured_at := A}}} <- Run]),
      analysed_ms => Dist([B - Go || {_, {ok, #{analysed_at := B}}} <- Run]),
      cluster_analysis_ms => T3 - T2}.

%% How far apart the members' windows started (their wall clocks) and how
%% long all of them overlapped.
windows([]) ->
    #{first_start_ms => null, start_spread_s => 0.0, overlap_s => 0.0};
windows(Rows) ->
    Starts = [S || #{window_start_ms := S} <- Rows],
    Ends = [S + W * 1000 || #{window_start_ms := S, window_s := W} <- Rows],
    #{first_start_ms => lists:min(Starts),
      start_spread_s => (lists:max(Starts) - lists:min(Starts)) / 1000,
      overlap_s => max(0.0, (lists:min(Ends) - lists:max(Starts)) / 1000)}.

%% An error of one member, in words (the node's name is on the line
%% already).
words({beamdiag_remote, {unreachable, _, not_registered, _}}) ->
    "cannot reach it: no node of that name is registered on its host";
words({beamdiag_remote, R = {unreachable, Node, _}}) ->
    Text = unicode:characters_to_list(beamdiag_remote:format_error(R)),
    case string:prefix(Text, "cannot reach " ++ atom_to_list(Node) ++ ": ") of
        nomatch -> Text;
        Rest -> ["cannot reach it: ", Rest]
    end;
words({M, R}) when is_atom(M) ->
    try M:format_error(R)
    catch _:_ -> "the diagnosis failed for a reason beamdiag cannot put in words"
    end.

erpc_words({error, {erpc, timeout}}) -> "it did not answer within 5 s";
erpc_words({error, {erpc, noconnection}}) -> "the connection dropped";
erpc_words({error, {erpc, Other}}) -> io_lib:format("the call failed (~0P)", [Other, 4]);
erpc_words({error, undef}) -> "a module it needs is missing there";
erpc_words({Class, Reason}) when is_atom(Class) -> io_lib:format("~s: ~0P", [Class, Reason, 6]);
erpc_words(Other) -> io_lib:format("~0P", [Other, 6]).

safe(B) -> beamdiag_safe_text:safe(B, 120).
