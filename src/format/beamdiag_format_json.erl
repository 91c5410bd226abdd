%%% @doc The JSON report, schema "beamdiag.diagnosis/1".
%%%
%%% Top-level keys: `schema', `node', `otp_release', `window_s', `complete',
%%% `settings' (only the flags beamdiag reads; never the emulator's argument
%%% vector), `threads' (per thread: name, type, scheduler id, ledger fields
%%% in seconds), `by_type', `totals', `host', `cgroup', `vm', `msacc',
%%% `locks' (when counted), `processes' (the process walks: top processes
%%% by reductions, mailboxes, heaps; see beamdiag_agent_processes), `findings' (most severe first), `notes',
%%% `profile' (with --perf or --erlang: the method, the figures, the top
%%% functions; from perf also `perf': the OS pid perf recorded, the node's
%%% own in its PID namespace, the call graph, whether a perf map named the
%%% JIT code; names as the node gives them, Elixir's too)
%%% and, for a diagnosis made now (not one re-read from a capture),
%%% `ready_s': wall seconds from the call to the diagnosis.
%%% A diagnosis from the host alone (beamdiag_host_session) carries `host_only'
%%% (true) and `host_view' (why, what distribution saw, the held threads,
%%% perf's top native functions, memory), and no VM figures.
%%% `attach' (in `host_view' for those) says how the node was reached or
%%% tried: `node', `mode', `settings' (each `setting', `value' and `from',
%%% where it came from), `cookie' (`from' and a short `hash', never the
%%% cookie), `cookies_tried', `port' and `notes'.
%%%
%%% ```
%%% 1> iolist_to_binary(beamdiag_format_json:diagnosis(D)).
%%% <<"{\"by_type\":{...},\"findings\":[...],\"schema\":\"beamdiag.diagnosis/1\",...}">>
%%% '''
-module(beamdiag_format_json).

-export([diagnosis/1, cluster/1]).
%% Called by the tests only.
-ifdef(TEST).
-export([document/1]).
-endif.

-define(SCHEMA, <<"beamdiag.diagnosis/1">>).

%% The document the JSON text encodes: the capture's and the ledger's
%% parts as they are (host, cgroup, vm and msacc are the ledger's maps),
%% the threads and findings with their listed keys; from the node, the VM
%% figures and what the capture's extras hold; from the host, its summary.
-type document() :: #{
    schema := binary(),
    node := binary(),
    window_s := float(),
    samples := non_neg_integer(),
    complete := boolean(),
    settings := beamdiag_agent_vm:settings(),
    threads := [beamdiag_ledger:row()],
    by_type := #{beamdiag_threads:type() => beamdiag_ledger:row()},
    totals := beamdiag_ledger:row(),
    host := map(),
    cgroup := map(),
    findings := [beamdiag_finding:finding()],
    notes := [binary()],
    ready_s => float(),
    host_only => true,
    host_view => beamdiag_format_host:summary(),
    otp_release => term(),
    vm => map(),
    msacc => map(),
    processes => beamdiag_agent_processes:report() | #{error := binary()},
    attach => beamdiag_attach_plan:public() | #{},
    locks => beamdiag_lock_data:lock_data(),
    memory => beamdiag_memory_ledger:memory(),
    profile => #{method := erlang | perf,
                 summary := #{atom() => number()},
                 top := [beamdiag_fold:top_row()],
                 perf => #{os_pid := term(), ns_pid := term(), call_graph := term(),
                           perf_map := boolean()}}
}.

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The diagnosis as JSON text, one document, newline-terminated.
-spec diagnosis(beamdiag_diagnosis:diagnosis()) -> iolist().
diagnosis(D) ->
    [beamdiag_json:encode(document(D)), "\n"].

%% @doc A cluster report (see `beamdiag_cluster') as JSON text, schema
%% "beamdiag.cluster/2": everything it holds, every node's findings in full.
-spec cluster(beamdiag_cluster_analysis:cluster()) -> iolist().
cluster(C) ->
    [beamdiag_json:encode(C), "\n"].

%% @doc The diagnosis as the map the JSON text encodes.
-spec document(beamdiag_diagnosis:diagnosis()) -> document().
document(D = #{ready_ms := Ms}) ->
    %% Wall seconds from the call to the diagnosis (a diagnosis made now).
    (document(maps:remove(ready_ms, D)))#{ready_s => Ms / 1000};
document(D = #{host_only := true, capture := C, ledger := L, findings := F}) ->
    %% Seen from the host alone (beamdiag_host_session): no VM figures; the lock
    %% data, read apart from the agent, when the node counts locks.
    Doc = (common(C, L, F))#{
        host_only => true,
        host_view => beamdiag_format_host:summary(D)
    },
    with_locks(Doc, maps:get(extras, C, #{}));
document(D = #{capture := C, ledger := L, findings := F}) ->
    Doc = (common(C, L, F))#{
        otp_release => maps:get(otp_release, maps:get(settings, C)),
        vm => maps:get(vm, L),
        msacc => maps:get(msacc, L)
    },
    Extras = maps:get(extras, C, #{}),
    Doc0 = case Extras of
               #{procs := Procs} -> Doc#{processes => Procs};
               _ -> Doc
           end,
    Doc00 = case Extras of
                #{attach := Attach} -> Doc0#{attach => Attach};
                _ -> Doc0
            end,
    Doc1 = with_memory(with_locks(Doc00, Extras), D),
    case Extras of
        #{profile := R = #{method := M, profile := P}} ->
            Profile = #{method => M, summary => beamdiag_fold:summary(P),
                        top => beamdiag_fold:top(P, #{kind => all, limit => 20})},
            Doc1#{profile => case R of
                                 #{perf := Perf = #{ospid := OsPid, target := #{ns_pid := NsPid}}} ->
                                     %% The pid perf recorded (the host's) and
                                     %% the node's own (a container's).
                                     Profile#{perf => #{os_pid => OsPid, ns_pid => NsPid,
                                                        call_graph => maps:get(call_graph, Perf),
                                                        perf_map => maps:get(perf_map, Perf)
                                                                        =/= missing}};
                                 _ ->
                                     Profile
                             end};
        _ ->
            Doc1
    end.

%%%===================================================================
%%% Internal
%%%===================================================================

with_memory(Doc, #{memory := M}) -> Doc#{memory => M};
with_memory(Doc, _D) -> Doc.

with_locks(Doc, #{locks := Locks}) -> Doc#{locks => Locks};
with_locks(Doc, _Extras) -> Doc.

%% The fields every diagnosis has, seen from the node or from the host.
common(C, L, F) ->
    #{
        schema => ?SCHEMA,
        node => maps:get(node, C),
        window_s => maps:get(window_s, L),
        samples => length(maps:get(samples, C)),
        complete => maps:get(complete, C, true),
        settings => maps:get(settings, C),
        threads => [thread(T) || T <- maps:get(threads, L)],
        by_type => maps:get(by_type, L),
        totals => maps:get(totals, L),
        host => maps:get(host, L),
        cgroup => maps:get(cgroup, L),
        findings => [finding(X) || X <- F],
        notes => maps:get(notes, L)
    }.

thread(T) ->
    maps:with([tid, name, type, index, scheduler_id, wall, busy, on_cpu, user, sys, runq,
               off_cpu, spin, blocked, nvcsw, nivcsw, minflt, majflt], T).

finding(F) ->
    maps:with([id, severity, title, evidence, metrics, figures, fix, when_not], F).
