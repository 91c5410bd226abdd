%%% @doc The cluster's analysis over its members' diagnoses (pure): each
%%% member's summary row (`summary_row/1'), the figures' spread, the
%%% outliers with their `cluster_outlier' finding, the findings the other
%%% nodes share (`analyse/2'), and the members that share a host: which
%%% they are, what their host's CPUs did over the window, and which of the
%%% members' findings measure that host rather than the member, so that
%%% they are said once, for the host. The running of the cluster is
%%% beamdiag_cluster's; the evidence's words beamdiag_cluster_evidence's.
%%%
%%% A member's host is the one it sees itself (the agent reads it,
%%% `beamdiag_agent_host:placement/1'): the kernel's boot id, the same for
%%% every process of one running kernel, containers included, and the
%%% host name; a member that read neither is placed by its node name's host
%%% part. Members with the same boot id share the CPUs of one kernel, and
%%% so each other's load and that of anything else the host runs.
%%%
%%% On a host with two members or more, a member's `cpu_starvation' at
%%% warning or above (its schedulers waited for a CPU with work to do
%%% while the rest of the host used the CPUs) is the host's contention:
%%% the other members, the diagnosing session's own work, whatever else
%%% runs there. It is taken off the member and kept with the host
%%% (`lifted': which members, how much each waited), where the cluster
%%% report says it once (`shared_host_contention'). When the host's CPUs
%%% were contended (such a wait, or CPUs 90% busy or more), so are the
%%% `scheduler_imbalance' and `scheduler_blocking' of a member whose
%%% schedulers mostly waited (on a CPU less than a quarter of the time the
%%% BEAM counted them busy, which counts the time the OS kept them
%%% waiting): they read that wait. A member alone on its host keeps them
%%% all: there they are that member's own.
%%%
%%% Outliers (`own_outliers/3'): on such a contended shared host, a member
%%% must also stand out on a figure of its own demand, not only on the
%%% busy, runnable-wait and blocked shares its wait makes up.
%%%
%%% ```
%%% 1> Rows = [#{row => beamdiag_cluster_analysis:summary_row(D), findings => F}
%%%        || D = #{findings := F} <- Diagnoses].
%%% 2> #{outliers := Out, hosts := Hosts} = beamdiag_cluster_analysis:analyse(Rows, #{}).
%%% 3> [{N, length(Ms)} || #{name := N, members := Ms} <- Hosts].
%%% [{<<"db1">>, 200}]
%%% '''
-module(beamdiag_cluster_analysis).

-export([analyse/2, summary_row/1, host_load/2, saturated_host/3]).

-ifdef(TEST).
-export([analyse/1, hosts/1, own_outliers/3]).
-endif.

-export_type([host/0, summary_row/0, analysis/0, here/0, cluster/0, member_result/0,
              host_load/0]).

%% A cluster's report, as beamdiag_cluster:diagnose/2 gives it.
%% What one member gave: its summary row and its findings in full.
-type member_result() :: #{row := summary_row(),
                          findings := [beamdiag_finding:finding()]}.
-type cluster() :: #{
    schema := binary(),
    seed := binary() | null,
    source := seed | list,
    members := [binary()],
    window_s := float(),
    windows := map(),
    prepare_s => float(),
    total_s => float(),
    timing => map(),
    nodes := [map()],
    spread := #{atom() => beamdiag_outliers:spread()},
    outliers := [map()],
    rest := map(),
    errors := [map()],
    %% The members on this host that did not answer while it was
    %% saturated (saturated_host/3), said once.
    saturated_host => map() | null,
    findings := #{binary() => [beamdiag_finding:finding()]},
    hosts := [map()]
}.


%% One diagnosis in the cluster's terms (summary_row/1): the node, its
%% window, its CPUs and normal schedulers' shares of wall time, its
%% findings in brief, its busiest process and longest mailbox, its host.
-type summary_row() :: #{
    node := binary(),
    window_start_ms := integer(),
    window_s := float(),
    complete := boolean(),
    cpus_used := number(),
    busy := float(),
    on_cpu := float(),
    spin := float(),
    runq := float(),
    sys := float(),
    blocked := float(),
    reductions_per_s := number(),
    findings := [brief()],
    top_process := #{reductions := #{process := binary(), share := float()} | null,
                     mailbox := #{process := binary(), queue := term()} | null} | null,
    host := #{id := binary() | number() | null, name := binary() | number() | null,
              cpus := binary() | number() | null, busy := binary() | number() | null,
              load := number() | null}
}.
-type brief() :: #{id := beamdiag_catalogue:id(), severity := beamdiag_finding:severity()}.
%% An outlier with its cluster_outlier finding and its findings in brief.
-type outlier() :: #{
    node := binary(),
    figures := [beamdiag_outliers:figure_outlier()],
    own_findings := [atom()],
    score := float(),
    finding := beamdiag_finding:finding(),
    findings := [brief()]
}.
%% This session's host and the CPU time its own process used (analyse/2).
-type here() :: #{boot_id => binary(), cpu_s => number()}.
%% This session's host over the members' windows (host_load/2): its CPUs,
%% the share of their time busy, the busy CPUs, the load average at the
%% end (1 min) and the span read.
-type host_load() :: #{ncpu := pos_integer(), busy := float(), cpus := float(),
                       load1 := float() | null, span_s := float()}.
%% The cluster's analysis (analyse/2): every member's row, each figure's
%% spread, the outliers, the rest's shared findings and spread, the hosts.
-type analysis() :: #{
    nodes := [summary_row()],
    spread := #{atom() => beamdiag_outliers:spread()},
    outliers := [outlier()],
    findings := #{binary() => [beamdiag_finding:finding()]},
    hosts := [host()],
    rest := #{n := non_neg_integer(), shared := term(),
              spread := #{atom() => beamdiag_outliers:spread()}}
}.

%% One host and its members' figures over the window: the host's CPUs,
%% how busy they were (from each member's /proc/stat over its own window:
%% the median and the largest), its load average (median), the members'
%% schedulers' runnable-wait shares and the CPUs they used in all; whether
%% it is shared and its CPUs were contended; and the findings lifted from
%% its members, each with the members it was taken from and how long they
%% waited for a CPU (their `runq_share': median, largest).
-type host() :: #{
    key := binary(),
    name := binary(),
    boot_id := binary() | null,
    members := [binary()],
    cpus := number() | null,
    busy := #{median := float(), max := float()} | null,
    load := number() | null,
    runq := #{median := float(), max := float()},
    cpus_used := float(),
    contended := boolean(),
    lifted := [#{id := atom(), severity := beamdiag_finding:severity(), nodes := [binary()],
                 runq_share := #{median := float(), max := float()}}],
    %% Added by host_entry/2 for the report: this session's CPU time when
    %% it ran there, and the finding of the host's contention.
    session => #{cpu_s := number()} | null,
    findings => [beamdiag_finding:finding()]
}.

%% The severities of the findings lifted to a shared host.
%% On a contended shared host, the findings read from busy time that a
%% member whose schedulers mostly waited does not own, and what mostly
%% waited means: on a CPU less than this share of its busy time.
-define(WAIT_FINDINGS, [scheduler_imbalance, scheduler_blocking]).
-define(RAN, 0.25).
-define(HOST_SEVERITIES, [warning, critical]).
%% The outlier figures a contended shared host makes up (own_outliers/3),
%% and the host's CPU busy share from which it counts as contended.
-define(HOST_FIGURES, [busy, runq, blocked]).
-define(CONTENDED, 0.9).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The hosts of the members' results (`#{row := Row, findings :=
%% Findings}', as `beamdiag_cluster' keeps them), most members first, and
%% the results with the findings lifted to a shared host taken off (from
%% the full findings and from the row's brief list).
-spec hosts([#{row := summary_row(), findings := [beamdiag_finding:finding()]}]) ->
    {[host()], [#{row := summary_row(), findings := [beamdiag_finding:finding()]}]}.
hosts(Results) ->
    Groups = maps:groups_from_list(fun(#{row := Row}) -> key(Row) end, Results),
    %% Per host: whether it is shared, and whether its CPUs were contended.
    How = maps:map(fun(_, Rs) -> {length(Rs) >= 2, contended_by(Rs)} end, Groups),
    Taken = [{R, lift(R, maps:get(key(Row), How))} || R = #{row := Row} <- Results],
    Hosts = [(host(Key, [{R, Gone} || {R = #{row := Row}, {_, Gone}} <- Taken, key(Row) =:= Key]))#{
                 contended => Shared andalso Contended}
             || {Key, {Shared, Contended}} <- maps:to_list(How)],
    Sorted = lists:sort(fun(#{members := A, key := KA}, #{members := B, key := KB}) ->
                                {length(A), KB} >= {length(B), KA}
                        end, Hosts),
    {Sorted, [R2 || {_, {R2, _}} <- Taken]}.

%% @doc The outliers (`beamdiag_outliers:nodes/1') that stand out on
%% their own. On a host two members or more share whose CPUs were
%% contended (findings were lifted to it, or its CPUs were ?CONTENDED busy
%% or more), a member's busy share counts the time the OS kept its
%% schedulers waiting for a CPU, and its runnable-wait and blocked shares
%% are that wait itself or follow from it (a lock holder descheduled): they
%% measure the host, which says so once. Such a member is kept only when a
%% figure of its own demand (CPUs used, on-CPU, spin, kernel time,
%% reductions per second) also lies beyond the cluster's spread; its
%% figures are kept whole. Other members are kept as they are.
-spec own_outliers([beamdiag_outliers:node_outlier()], [summary_row()], [host()]) ->
    [beamdiag_outliers:node_outlier()].
own_outliers(Outliers, Rows, Hosts) ->
    Contended = [K || #{key := K, contended := true} <- Hosts],
    HostOf = maps:from_list([{maps:get(node, Row), key(Row)} || Row <- Rows]),
    [O || O = #{node := N, figures := Figs} <- Outliers,
          not lists:member(maps:get(N, HostOf, none), Contended)
              orelse lists:any(fun(#{figure := K}) -> not lists:member(K, ?HOST_FIGURES) end,
                               Figs)].

%% @doc The cluster's analysis over the members' results: the hosts they
%% share (a shared host's contention said once, for the host: see
%% `beamdiag_cluster_analysis'), each figure's spread, the outliers (each
%% with its `cluster_outlier' finding added to its findings), and for the
%% other nodes how many share each finding and the spread of their
%% figures.
-ifdef(TEST).
-spec analyse([member_result()]) -> analysis().
analyse(Results) ->
    analyse(Results, #{}).
-endif.

%% @doc As analyse/1; Here: this session's host (`boot_id') and the CPU time
%% its own process used (`cpu_s'), said with the host when it is one of
%% the members'.
-spec analyse([member_result()], here()) -> analysis().
analyse(Results0, Here) ->
    {Hosts0, Results} = hosts(Results0),
    Hosts = [host_entry(H, Here) || H <- Hosts0],
    Rows = [R || #{row := R} <- Results],
    #{spread := Spread, outliers := All} = beamdiag_outliers:nodes(Rows),
    Out0 = own_outliers(All, Rows, Hosts0),
    Own = maps:from_list([{N, beamdiag_cluster_evidence:outlier_finding(O)} || O = #{node := N} <- Out0]),
    Findings = maps:from_list(
        [{N, beamdiag_finding:sort(case maps:find(N, Own) of
                                       {ok, F} -> [F | Fs];
                                       error -> Fs
                                   end)}
         || #{row := #{node := N}, findings := Fs} <- Results]),
    Brief = fun(N) -> [#{id => Id, severity => S} || #{id := Id, severity := S} <- maps:get(N, Findings)] end,
    Nodes = [R#{findings => Brief(N)} || R = #{node := N} <- Rows],
    Out = [O#{finding => maps:get(N, Own), findings => Brief(N)} || O = #{node := N} <- Out0],
    Odd = maps:keys(Own),
    Rest = [R || R = #{node := N} <- Nodes, not lists:member(N, Odd)],
    #{nodes => Nodes, spread => Spread, outliers => Out, findings => Findings, hosts => Hosts,
      rest => #{n => length(Rest),
                shared => shared(Rest),
                spread => maps:from_list([{K, beamdiag_outliers:spread([maps:get(K, R) || R <- Rest])}
                                          || K <- beamdiag_outliers:figures()])}}.

%% A host of the report: its figures, this session's own CPU time when it
%% ran there, and, when findings were taken off its members, the one
%% finding that says its contention.
host_entry(H = #{boot_id := Id, lifted := Lifted}, Here) ->
    Session = case Here of
                  #{boot_id := Id, cpu_s := S} when is_binary(Id) -> #{cpu_s => S};
                  _ -> null
              end,
    H2 = H#{session => Session},
    H2#{findings => [host_finding(H2) || Lifted =/= []]}.

host_finding(H = #{members := Ms, lifted := Lifted, cpus_used := Used}) ->
    [Worst | _] = beamdiag_finding:sort([#{severity => S} || #{severity := S} <- Lifted]),
    Waiting = lists:usort(lists:append([Ns || #{nodes := Ns} <- Lifted])),
    %% How long the members that waited did (the runnable-wait share of
    %% their schedulers' wall time that cpu_starvation measured).
    Share = lists:max([0.0 | [Max || #{runq_share := #{max := Max}} <- Lifted]]),
    Median = lists:max([0.0 | [Med || #{runq_share := #{median := Med}} <- Lifted]]),
    Busy = case maps:get(busy, H) of
               #{median := B} -> [beamdiag_finding:figure(host_busy, B, share, #{scope => host})];
               null -> []
           end,
    Metrics = maps:from_list([{members, length(Ms)}, {members_waiting, length(Waiting)},
                              {worst_runq_share, Share}, {members_cpus, Used},
                              {runq_share_median, Median}]
                             ++ [{host_busy, B} || #{median := B} <- [maps:get(busy, H)]]),
    beamdiag_finding:new(shared_host_contention, maps:get(severity, Worst),
                         beamdiag_cluster_evidence:host_evidence(H), Metrics,
                         #{figures => [beamdiag_finding:figure(members, length(Ms), count),
                                       beamdiag_finding:figure(members_waiting, length(Waiting), count),
                                       beamdiag_finding:figure(worst_runq_share, Share, share),
                                       beamdiag_finding:figure(members_cpus, Used, cpus,
                                                               #{scope => host})] ++ Busy}).

%% @doc This session's host between two readings of its /proc/stat and
%% /proc/loadavg (`beamdiag_agent_procfs:host/1'): `undefined' when the
%% two readings cannot be set against each other.
-spec host_load(beamdiag_agent_procfs:host(), beamdiag_agent_procfs:host()) ->
    host_load() | undefined.
host_load(#{cpu := C0}, H1 = #{cpu := C1, ncpu := N}) ->
    All = fun(C) -> lists:sum(maps:values(C)) end,
    case All(C1) - All(C0) of
        D when D > 0 ->
            Busy = min(1.0, max(0.0, (beamdiag_agent_host:busy(C1) - beamdiag_agent_host:busy(C0)) / D)),
            #{ncpu => N, busy => Busy, cpus => Busy * N,
              load1 => case maps:find(loadavg, H1) of
                           {ok, {L1, _, _}} -> L1;
                           error -> null
                       end,
              %% /proc/stat counts clock ticks summed over the CPUs.
              span_s => D / N / beamdiag_agent_procfs:clock_ticks()};
        _ ->
            undefined
    end;
host_load(_, _) ->
    undefined.

%% @doc The members that did not answer in time and run on this session's
%% host (their node names' host part is this host's name), when that host
%% was saturated over their windows: its CPUs 90% busy or more, or a load
%% average twice its CPUs or more, and two such members or more. Said
%% once for the host, with its figures, instead of once per member.
%% Unanswered: the members whose agent or connection did not answer in
%% time; HostName: this host's name (`inet:gethostname/0').
-spec saturated_host([node()], host_load() | undefined, string()) -> map() | null.
saturated_host(Unanswered, Load = #{ncpu := N, busy := Busy, load1 := L1}, HostName) ->
    Short = hd(string:split(HostName, ".")),
    Here = [M || M <- Unanswered, on_host(M, Short)],
    Saturated = Busy >= 0.9 orelse (is_float(L1) andalso L1 >= 2 * N),
    case Saturated andalso length(Here) >= 2 of
        true ->
            Load#{members => length(Here),
                  nodes => [atom_to_binary(M) || M <- lists:sublist(lists:sort(Here), 5)]};
        false ->
            null
    end;
saturated_host(_Unanswered, undefined, _HostName) ->
    null.

on_host(Node, Short) ->
    case string:split(atom_to_list(Node), "@") of
        [_, Host] -> lists:member(hd(string:split(Host, ".")), [Short, "localhost", "127", "::1"]);
        _ -> false
    end.

%% @doc The summary figures of one diagnosis: the node's CPUs, the normal
%% schedulers' shares of wall time, reductions per second, findings, and
%% its window (wall-clock start in ms and length in s).
-spec summary_row(beamdiag_diagnosis:diagnosis()) -> summary_row().
summary_row(#{capture := C, ledger := L, findings := F}) ->
    Sched = maps:get(scheduler, maps:get(by_type, L, #{}), #{}),
    Wall = maps:get(wall, Sched, 0.0),
    Share = fun(K) -> beamdiag_ledger:share(K, Sched, Wall) end,
    #{
        node => maps:get(node, C),
        window_start_ms => maps:get(wall_start_ms, C, 0),
        window_s => maps:get(window_s, L, 0.0),
        complete => maps:get(complete, C, true),
        cpus_used => maps:get(cpus_used, maps:get(totals, L, #{}), 0.0),
        busy => Share(busy),
        on_cpu => Share(on_cpu),
        spin => Share(spin),
        runq => Share(runq),
        sys => Share(sys),
        blocked => Share(blocked),
        reductions_per_s => maps:get(reductions_per_s, maps:get(vm, L, #{}), 0.0),
        findings => [#{id => Id, severity => S} || #{id := Id, severity := S} <- F],
        top_process => top_process(maps:get(extras, C, #{})),
        host => host_row(maps:get(settings, C, #{}), maps:get(host, L, #{}))
    }.

%% The member's host as it sees it (its kernel's boot id and host name)
%% and what its /proc/stat showed of it over the window.
host_row(Settings, Host) ->
    Get = fun(K, M) -> case maps:get(K, M, null) of
                           V when is_binary(V); is_number(V) -> V;
                           _ -> null
                       end
          end,
    #{id => Get(boot_id, Settings), name => Get(hostname, Settings),
      cpus => Get(ncpu, Host), busy => Get(busy, Host),
      load => case maps:get(loadavg, Host, null) of
                  [L1 | _] when is_number(L1) -> L1;
                  _ -> null
              end}.

%%%===================================================================
%%% Internal
%%%===================================================================


%% The host a summary row says its member runs on: its boot id when it
%% read one, else its host name, else its node name's host part.
key(#{host := #{id := Id}}) when is_binary(Id), Id =/= <<>> -> Id;
key(#{host := #{name := Name}}) when is_binary(Name), Name =/= <<>> -> Name;
key(#{node := Node}) -> beamdiag_node_name:host(Node).

name(Rows) ->
    case [N || #{host := #{name := N}} <- Rows, is_binary(N), N =/= <<>>] of
        [N | _] -> N;
        [] -> beamdiag_node_name:host(maps:get(node, hd(Rows)))
    end.

%% A member's result with the findings its shared host explains taken
%% off, and those findings: its cpu_starvation at warning or above; on a
%% contended host also its scheduler_imbalance and scheduler_blocking when
%% its schedulers mostly waited (on a CPU less than ?RAN of the time the
%% BEAM counted them busy: the busy time those findings read is the
%% host's wait).
lift(R, {false, _}) ->
    {R, []};
lift(R = #{row := Row, findings := Fs}, {true, Contended}) ->
    Waited = Contended andalso waited(Row),
    Gone = fun(F) -> lifted(F, Waited) end,
    {R#{row := Row#{findings := [F || F <- maps:get(findings, Row, []), not Gone(F)]},
        findings := [F || F <- Fs, not Gone(F)]},
     [F || F <- Fs, Gone(F)]}.

lifted(#{id := cpu_starvation, severity := S}, _Waited) ->
    lists:member(S, ?HOST_SEVERITIES);
lifted(#{id := Id, severity := S}, true) ->
    lists:member(Id, ?WAIT_FINDINGS) andalso lists:member(S, ?HOST_SEVERITIES);
lifted(_, false) ->
    false.

waited(#{busy := Busy, on_cpu := OnCpu}) when is_number(Busy), is_number(OnCpu), Busy > 0 ->
    OnCpu < ?RAN * Busy;
waited(_) ->
    false.

%% Whether a host's CPUs were contended over the window: a member there
%% waited for a CPU with work to do (cpu_starvation at warning or above),
%% or the CPUs were ?CONTENDED busy or more (the members' median).
contended_by(Results) ->
    Starved = [x || #{findings := Fs} <- Results,
                    #{id := cpu_starvation, severity := S} <- Fs, lists:member(S, ?HOST_SEVERITIES)],
    Busy = [B || #{row := #{host := #{busy := B}}} <- Results, is_number(B)],
    Starved =/= [] orelse (Busy =/= [] andalso median(Busy) >= ?CONTENDED).

host(Key, Taken) ->
    Rows = [Row || {#{row := Row}, _} <- Taken],
    HostFig = fun(K) -> [V || #{host := H} <- Rows, V <- [maps:get(K, H, null)], is_number(V)] end,
    Busy = HostFig(busy),
    Lifted = [{Id, S, maps:get(node, Row), maps:get(runq_share, M, 0.0)}
              || {#{row := Row}, Gone} <- Taken, #{id := Id, severity := S, metrics := M} <- Gone],
    #{key => Key,
      name => name(Rows),
      boot_id => case [Id || #{host := #{id := Id}} <- Rows, is_binary(Id)] of
                     [Id | _] -> Id;
                     [] -> null
                 end,
      members => lists:sort([maps:get(node, Row) || Row <- Rows]),
      cpus => median_or_null(HostFig(cpus)),
      busy => case Busy of
                  [] -> null;
                  _ -> #{median => median(Busy), max => lists:max(Busy)}
              end,
      load => median_or_null(HostFig(load)),
      runq => dist([maps:get(runq, Row, 0.0) || Row <- Rows]),
      cpus_used => float(lists:sum([maps:get(cpus_used, Row, 0.0) || Row <- Rows])),
      lifted => [#{id => Id,
                   severity => worst([S || {I, S, _, _} <- Lifted, I =:= Id]),
                   nodes => lists:sort([N || {I, _, N, _} <- Lifted, I =:= Id]),
                   runq_share => dist([Q || {I, _, _, Q} <- Lifted, I =:= Id])}
                 || Id <- lists:usort([I || {I, _, _, _} <- Lifted])]}.

worst(Severities) ->
    hd(lists:sort(fun(A, B) -> beamdiag_finding:severity_rank(A) =< beamdiag_finding:severity_rank(B) end,
                  Severities)).

dist([]) -> #{median => 0.0, max => 0.0};
dist(Vs) -> #{median => float(median(Vs)), max => float(lists:max(Vs))}.

median_or_null([]) -> null;
median_or_null(Vs) -> median(Vs).

median(Vs) ->
    beamdiag_stats:percentile(Vs, 50).

%% How many of the nodes share each finding, most shared first.
shared(Rows) ->
    Counts = lists:foldl(
        fun(#{findings := Fs}, Acc) ->
            lists:foldl(fun(#{id := Id, severity := S}, A) ->
                                maps:update_with(Id, fun(X = #{nodes := K}) -> X#{nodes := K + 1} end,
                                                 #{id => Id, severity => S, nodes => 1}, A)
                        end, Acc, uniq_findings(Fs))
        end, #{}, Rows),
    None = length([R || R = #{findings := []} <- Rows]),
    Sorted = lists:sort(fun(#{nodes := A}, #{nodes := B}) -> A >= B end, maps:values(Counts)),
    #{by_finding => Sorted, without_findings => None}.

uniq_findings(Fs) ->
    maps:values(maps:from_list([{Id, F} || F = #{id := Id} <- Fs])).

%% The process with the largest share of a node's reductions, and the
%% longest mailbox at the end, from the process walks.
top_process(#{procs := P = #{top_reductions := Top}}) ->
    Total = maps:get(reductions, P, 0),
    Reds = case Top of
               [E | _] when Total > 0 ->
                   #{process => proc_key(E), share => maps:get(reductions, E) / Total};
               _ -> null
           end,
    Queue = case maps:get(queues, P, []) of
                [Q = #{queue := [_, QEnd]} | _] -> #{process => proc_key(Q), queue => QEnd};
                _ -> null
            end,
    #{reductions => Reds, mailbox => Queue};
top_process(_) ->
    null.

proc_key(#{name := N}) when is_binary(N) -> N;
proc_key(#{pid := P}) -> P.

