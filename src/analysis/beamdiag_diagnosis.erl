%%% @doc A diagnosis from a capture (pure): the time ledger and the
%%% findings, or, for a capture seen from the host alone, the host's rules.
%%%
%%% ```
%%% 1> #{ledger := L, findings := F} = beamdiag_diagnosis:analyse(Capture).
%%% '''
-module(beamdiag_diagnosis).

-export([analyse/1]).

%% @doc Ledger and findings for a capture.
-spec analyse(beamdiag_capture:capture()) -> beamdiag:diagnosis().
analyse(Capture = #{extras := #{host_only := true, host_view := Context}}) ->
    %% Seen from the host alone (beamdiag_host).
    beamdiag_host_rules:analyse(Capture, Context);
analyse(Capture) ->
    Ledger = beamdiag_ledger:build(Capture),
    #{capture => Capture, ledger => Ledger, findings => beamdiag_rules:findings(Capture, Ledger)}.

