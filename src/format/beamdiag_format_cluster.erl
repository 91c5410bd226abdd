%%% @doc The cluster report's words for the hosts its members share: the
%%% evidence of `shared_host_contention' (`beamdiag_cluster' builds the
%%% finding from `beamdiag_cluster_analysis''s figures). Pure.
%%%
%%% ```
%%% 1> beamdiag_format_cluster:host_evidence(Host).
%%% [<<"37 of the 200 members on this host waited for a CPU ...">>, ...]
%%% '''
-module(beamdiag_format_cluster).

-export([host_evidence/1]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The evidence lines of a shared host's contention: which findings
%% were taken off how many of its members and how long they waited, what
%% the host's CPUs did, what its members used, and what this session
%% used there when it ran there (`session': `#{cpu_s := CPU seconds}').
-spec host_evidence(beamdiag_cluster_analysis:host() | map()) -> [binary()].
host_evidence(H = #{members := Ms, lifted := Lifted, cpus_used := Used}) ->
    N = length(Ms),
    [iolist_to_binary(L) || L <- [lifted_line(Lf, N) || Lf <- Lifted] ++
                                  [host_line(H),
                                   io_lib:format("its ~b members used ~.2f CPUs in all over the "
                                                 "window", [N, float(Used)])] ++
                                  session_line(maps:get(session, H, null))].

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

