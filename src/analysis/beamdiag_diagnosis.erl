%%% @doc A diagnosis from a capture (pure): the time ledger, the memory
%%% ledger (beamdiag_memory_ledger) and the findings, or, for a capture seen from the host alone, the host's rules.
%%%
%%% ```
%%% 1> #{ledger := L, findings := F} = beamdiag_diagnosis:analyse(Capture).
%%% '''
-module(beamdiag_diagnosis).

-export([analyse/1]).

-export_type([diagnosis/0]).

%% A diagnosis: the raw capture, the time ledger and the findings.
-type diagnosis() :: #{
    capture := beamdiag_capture:capture(),
    ledger := beamdiag_ledger:ledger(),
    memory => beamdiag_memory_ledger:memory(),
    findings := [beamdiag_finding:finding()],
    %% Seen from the host alone (beamdiag_host_session), and how.
    host_only => true,
    host_view => beamdiag_host_rules:host_view(),
    %% Milliseconds of wall time from the call to the diagnosis (diagnose/1,2).
    ready_ms => non_neg_integer()
}.

%% @doc Ledger and findings for a capture.
-spec analyse(beamdiag_capture:capture()) -> beamdiag_diagnosis:diagnosis().
analyse(Capture = #{extras := #{host_only := true, host_view := Context}}) ->
    %% Seen from the host alone (beamdiag_host_session).
    beamdiag_host_rules:analyse(Capture, Context);
analyse(Capture) ->
    Ledger = beamdiag_ledger:build(Capture),
    Memory = beamdiag_memory_ledger:build(Capture),
    Findings = beamdiag_rules:findings(Capture, Ledger) ++
        beamdiag_memory_rules:findings(Memory, Capture) ++
        beamdiag_alloc_rules:findings(Memory, Capture),
    #{capture => Capture, ledger => Ledger, memory => Memory,
      findings => beamdiag_finding:sort(Findings)}.

