%%% @doc The members of a cluster that share a host (pure): which they
%%% are, what their host's CPUs did over the window, and which of the
%%% members' findings measure that host rather than the member, so that
%%% they are said once, for the host.
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
%%% report says it once (`shared_host_contention'). A member alone on its
%%% host keeps it: there it is that member's own finding.
%%%
%%% ```
%%% 1> {Hosts, Results2} = beamdiag_cluster_analysis:hosts(Results).
%%% 2> [{N, length(Ms)} || #{name := N, members := Ms} <- Hosts].
%%% [{<<"db1">>, 200}]
%%% '''
-module(beamdiag_cluster_analysis).

-export([hosts/1, host_of/1, own_outliers/3]).

-export_type([host/0]).

%% One host and its members' figures over the window: the host's CPUs,
%% how busy they were (from each member's /proc/stat over its own window:
%% the median and the largest), its load average (median), the members'
%% schedulers' runnable-wait shares and the CPUs they used in all; and the
%% findings lifted from its members, each with the members it was taken
%% from and how long they waited for a CPU (their `runq_share': median,
%% largest).
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
    lifted := [#{id := atom(), severity := beamdiag_finding:severity(), nodes := [binary()],
                 runq_share := #{median := float(), max := float()}}]
}.

%% The findings that measure a shared host's contention, at these
%% severities.
-define(HOST_FINDINGS, [cpu_starvation]).
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
-spec hosts([#{row := map(), findings := [beamdiag_finding:finding()]}]) ->
    {[host()], [#{row := map(), findings := [beamdiag_finding:finding()]}]}.
hosts(Results) ->
    Groups = maps:groups_from_list(fun(#{row := Row}) -> key(Row) end, Results),
    Lifted = maps:map(fun(_, Rs) -> length(Rs) >= 2 end, Groups),
    Results2 = [lift(R, maps:get(key(Row), Lifted)) || R = #{row := Row} <- Results],
    Hosts = [host(Key, Rs) || {Key, Rs} <- maps:to_list(Groups)],
    Sorted = lists:sort(fun(#{members := A, key := KA}, #{members := B, key := KB}) ->
                                {length(A), KB} >= {length(B), KA}
                        end, Hosts),
    {Sorted, Results2}.

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
-spec own_outliers([map()], [map()], [host()]) -> [map()].
own_outliers(Outliers, Rows, Hosts) ->
    Contended = [K || H = #{key := K} <- Hosts, contended(H)],
    HostOf = maps:from_list([{maps:get(node, Row), key(Row)} || Row <- Rows]),
    [O || O = #{node := N, figures := Figs} <- Outliers,
          not lists:member(maps:get(N, HostOf, none), Contended)
              orelse lists:any(fun(#{figure := K}) -> not lists:member(K, ?HOST_FIGURES) end,
                               Figs)].

%% @doc The host a summary row says its member runs on: its boot id when
%% it read one, else its host name, else its node name's host part.
-spec host_of(map()) -> binary().
host_of(Row) ->
    key(Row).

%%%===================================================================
%%% Internal
%%%===================================================================

%% A host two members or more share whose CPUs were contended.
contended(#{members := [_, _ | _], lifted := [_ | _]}) -> true;
contended(#{members := [_, _ | _], busy := #{median := B}}) -> B >= ?CONTENDED;
contended(_) -> false.

key(#{host := #{id := Id}}) when is_binary(Id), Id =/= <<>> -> Id;
key(#{host := #{name := Name}}) when is_binary(Name), Name =/= <<>> -> Name;
key(#{node := Node}) -> node_host(Node).

node_host(Node) ->
    case binary:split(Node, <<"@">>) of
        [_, H] -> H;
        _ -> <<>>
    end.

name(Rows) ->
    case [N || #{host := #{name := N}} <- Rows, is_binary(N), N =/= <<>>] of
        [N | _] -> N;
        [] -> node_host(maps:get(node, hd(Rows)))
    end.

lift(R, false) ->
    R;
lift(R = #{row := Row, findings := Fs}, true) ->
    R#{row := Row#{findings := [F || F <- maps:get(findings, Row, []), not lifted(F)]},
       findings := [F || F <- Fs, not lifted(F)]}.

lifted(#{id := Id, severity := S}) ->
    lists:member(Id, ?HOST_FINDINGS) andalso lists:member(S, ?HOST_SEVERITIES).

host(Key, Results) ->
    Rows = [Row || #{row := Row} <- Results],
    HostFig = fun(K) -> [V || #{host := H} <- Rows, V <- [maps:get(K, H, null)], is_number(V)] end,
    Busy = HostFig(busy),
    Taken = case length(Results) >= 2 of
                true -> [{Id, S, maps:get(node, Row), maps:get(runq_share, M, 0.0)}
                         || #{row := Row, findings := Fs} <- Results,
                            F = #{id := Id, severity := S, metrics := M} <- Fs, lifted(F)];
                false -> []
            end,
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
                   severity => worst([S || {I, S, _, _} <- Taken, I =:= Id]),
                   nodes => lists:sort([N || {I, _, N, _} <- Taken, I =:= Id]),
                   runq_share => dist([Q || {I, _, _, Q} <- Taken, I =:= Id])}
                 || Id <- lists:usort([I || {I, _, _, _} <- Taken])]}.

worst(Severities) ->
    hd(lists:sort(fun(A, B) -> beamdiag_finding:severity_rank(A) =< beamdiag_finding:severity_rank(B) end,
                  Severities)).

dist([]) -> #{median => 0.0, max => 0.0};
dist(Vs) -> #{median => float(median(Vs)), max => float(lists:max(Vs))}.

median_or_null([]) -> null;
median_or_null(Vs) -> median(Vs).

median(Vs) ->
    beamdiag_stats:percentile(Vs, 50).
