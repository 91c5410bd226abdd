%%% @doc The evidence of the cluster's own findings (pure): the node that
%%% is the odd one out (`cluster_outlier', from beamdiag_outliers' figures)
%%% and a host its members share (`shared_host_contention', from
%%% beamdiag_cluster_analysis' figures), each figure set beside the
%%% cluster's median in words.
%%%
%%% ```
%%% 1> beamdiag_cluster_evidence:host_evidence(Host).
%%% [<<"37 of the 200 members on this host waited for a CPU ...">>, ...]
%%% 2> #{id := cluster_outlier} = beamdiag_cluster_evidence:outlier_finding(Outlier).
%%% '''
-module(beamdiag_cluster_evidence).

-export([host_evidence/1, outlier_finding/1]).

%% A figure stands out as a ratio only against a median at least this
%% large (a share of 0.5%, 0.01 CPUs, 1000 reductions per second).
-define(RATIO_FLOOR, #{cpus_used => 0.01, reductions_per_s => 1000.0}).
-define(SHARE_RATIO_FLOOR, 0.005).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The evidence lines of a shared host's contention: which findings
%% were taken off how many of its members and how long they waited, what
%% the host's CPUs did, what its members used, and what this session
%% used there when it ran there (`session': `#{cpu_s := CPU seconds}').
-spec host_evidence(beamdiag_cluster_analysis:host()) -> [binary()].
host_evidence(H = #{members := Ms, lifted := Lifted, cpus_used := Used}) ->
    N = length(Ms),
    [iolist_to_binary(L) || L <- [lifted_line(Lf, N) || Lf <- Lifted] ++
                                  [host_line(H),
                                   io_lib:format("its ~b members used ~.2f CPUs in all over the "
                                                 "window", [N, float(Used)])] ++
                                  session_line(maps:get(session, H, null))].

%% @doc The finding that says a node is the odd one out, with the figures.
-spec outlier_finding(beamdiag_outliers:node_outlier()) -> beamdiag_finding:finding().
outlier_finding(#{figures := Figs}) ->
    {Top, More} = lead(Figs),
    Evidence = [headline(Top) | [line(F) || F <- lists:sublist(More, 3)]],
    Metrics = maps:from_list(
        lists:append([[{metric(K, value), V}, {metric(K, median), Med}, {metric(K, mad), Mad},
                       {metric(K, z), Z}]
                      || #{figure := K, value := V, median := Med, mad := Mad, z := Z}
                             <- [Top | More]])),
    Figures = [beamdiag_finding:figure(K, V, unit(K))
               || #{figure := K, value := V} <- [Top | More]],
    beamdiag_finding:new(cluster_outlier, warning, Evidence, Metrics, #{figures => Figures}).


%%%===================================================================
%%% Internal
%%%===================================================================

lifted_line(#{id := cpu_starvation, nodes := Nodes, runq_share := #{median := Med, max := Max}},
            N) ->
    io_lib:format("~b of the ~b members on this host waited for a CPU while they had work: "
                  "median ~s, worst ~s of their schedulers' wall time (cpu_starvation, said "
                  "here once for the host instead of on each member)",
                  [length(Nodes), N, beamdiag_units:pct(Med), beamdiag_units:pct(Max)]);
lifted_line(#{id := Id, nodes := Nodes}, N) ->
    io_lib:format("~b of the ~b members on this host had ~s while their schedulers mostly "
                  "waited for a CPU (on one less than a quarter of their busy time): the wait "
                  "is the host's, said here once instead of on each member",
                  [length(Nodes), N, Id]).

host_line(#{cpus := Cpus, busy := Busy, load := Load}) ->
    ["the host: ",
     case Cpus of
         null -> "CPUs unknown";
         _ -> io_lib:format("~b CPUs", [round(Cpus)])
     end,
     case Busy of
         #{median := Med, max := Max} ->
             io_lib:format(", ~s busy over the window (as its members read /proc/stat; ~s at "
                           "most)", [beamdiag_units:pct(Med), beamdiag_units:pct(Max)]);
         null -> ""
     end,
     case Load of
         null -> "";
         _ -> io_lib:format(", load average ~.1f", [float(Load)])
     end].

session_line(#{cpu_s := S}) ->
    [io_lib:format("this diagnosis ran on this host too: its own process used ~.2f CPU-seconds "
                   "of it", [float(S)])];
session_line(_) ->
    [].


metric(K, Part) -> list_to_atom(atom_to_list(K) ++ "_" ++ atom_to_list(Part)).

unit(cpus_used) -> cpus;
unit(reductions_per_s) -> per_s;
unit(_) -> share.

%% "this node's schedulers are 3.4x busier than the cluster's median (82%
%% of scheduler wall time vs median 24%, spread 3 points)"
headline(F) ->
    [compared(F), " (", value_text(F), ")"].

line(F = #{figure := K}) ->
    [label(K), ": ", value_text(F), ", ", how_far(F)].

%% The figure the finding leads with: the first that stands out, in the
%% order a reader weighs them.
lead(Figs) ->
    Order = [busy, cpus_used, on_cpu, runq, spin, sys, blocked, reductions_per_s],
    [Lead | _] = lists:sort(fun(#{figure := A}, #{figure := B}) ->
                                    index(A, Order) =< index(B, Order)
                            end, Figs),
    {Lead, Figs -- [Lead]}.

index(X, L) -> length(lists:takewhile(fun(Y) -> Y =/= X end, L)).

compared(F = #{figure := K, value := V, median := Med}) ->
    Up = V >= Med,
    case ratio(K, V, Med) of
        {ok, R} -> ratio_words(K, Up, io_lib:format("~sx", [num(R)]));
        none -> [points_subject(K), " ", how_far(F)]
    end.

ratio(K, V, Med) ->
    Floor = maps:get(K, ?RATIO_FLOOR, ?SHARE_RATIO_FLOOR),
    case Med >= Floor andalso V >= Floor of
        true when V >= Med -> {ok, V / Med};
        true -> {ok, Med / V};
        false -> none
    end.

ratio_words(busy, true, R) -> ["this node's schedulers are ", R, " busier than the cluster's median"];
ratio_words(busy, false, R) -> ["this node's schedulers are ", R, " less busy than the cluster's median"];
ratio_words(cpus_used, true, R) -> ["this node uses ", R, " the CPU of the cluster's median node"];
ratio_words(cpus_used, false, R) -> ["this node uses ", R, " less CPU than the cluster's median node"];
ratio_words(reductions_per_s, true, R) ->
    ["this node runs ", R, " the reductions per second of the cluster's median node"];
ratio_words(reductions_per_s, false, R) ->
    ["this node runs ", R, " fewer reductions per second than the cluster's median node"];
ratio_words(K, true, R) ->
    ["this node's schedulers spend ", R, " more time ", state_words(K), " than the cluster's median"];
ratio_words(K, false, R) ->
    ["this node's schedulers spend ", R, " less time ", state_words(K), " than the cluster's median"].

points_subject(cpus_used) -> "this node's CPU use is";
points_subject(reductions_per_s) -> "this node's reductions per second are";
points_subject(K) -> ["this node's schedulers' time ", state_words(K), " is"].

state_words(on_cpu) -> "on a CPU";
state_words(spin) -> "spinning";
state_words(runq) -> "waiting for a CPU";
state_words(sys) -> "in the kernel";
state_words(blocked) -> "blocked";
state_words(busy) -> "busy".

how_far(#{figure := K, value := V, median := Med}) ->
    case unit(K) of
        share -> io_lib:format("~s points ~s the cluster's median", [num(100 * abs(V - Med)), above(V, Med)]);
        cpus -> io_lib:format("~.2f CPUs ~s the cluster's median", [float(abs(V - Med)), above(V, Med)]);
        per_s -> [beamdiag_units:rate(abs(V - Med)), "/s ", above(V, Med), " the cluster's median"]
    end.

above(V, Med) when V >= Med -> "above";
above(_, _) -> "below".

value_text(#{figure := K, value := V, median := Med, mad := Mad, p10 := P10, p90 := P90}) ->
    [fig(K, V), vs(K), " vs median ", fig(K, Med), "; spread: MAD ", spread_text(K, Mad),
     ", p10-p90 ", fig(K, P10), " to ", fig(K, P90)].

vs(cpus_used) -> "";
vs(reductions_per_s) -> "";
vs(_) -> " of scheduler wall time".

spread_text(K, Mad) ->
    case unit(K) of
        share -> [num(100 * Mad), " points"];
        cpus -> io_lib:format("~.2f CPUs", [float(Mad)]);
        per_s -> [beamdiag_units:rate(Mad), "/s"]
    end.

label(cpus_used) -> "CPUs used";
label(reductions_per_s) -> "reductions";
label(busy) -> "scheduler busy";
label(on_cpu) -> "scheduler on CPU";
label(spin) -> "scheduler spin";
label(runq) -> "scheduler runq wait";
label(sys) -> "scheduler kernel time";
label(blocked) -> "scheduler blocked".

fig(cpus_used, V) -> io_lib:format("~.2f CPUs", [float(V)]);
fig(reductions_per_s, V) -> [beamdiag_units:rate(V), "/s"];
fig(_, V) -> [num(100 * V), "%"].

num(X) when abs(X) >= 100 -> integer_to_list(round(X));
num(X) when abs(X) >= 10 -> io_lib:format("~.1f", [float(X)]);
num(X) -> io_lib:format("~.1f", [float(X)]).


