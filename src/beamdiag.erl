%%% @doc beamdiag: explains where a live BEAM node's CPU time goes.
%%%
%%% The public API. `diagnose/1' samples the node it runs on (from a remote
%%% shell or iex); `diagnose/2' samples another node over distribution,
%%% shipping the agent there and removing it afterwards. Both return a
%%% diagnosis: the raw capture, the time ledger and the findings. Printing
%%% is separate: `beamdiag_format_text:diagnosis/2',
%%% `beamdiag_format_json:diagnosis/1'.
%%%
%%% ```
%%% 1> {ok, D} = beamdiag:diagnose(#{duration => 5}).
%%% 2> [{Id, Sev} || #{id := Id, severity := Sev} <- maps:get(findings, D)].
%%% [{busy_wait, warning}]
%%% 3> io:put_chars(beamdiag_format_text:diagnosis(D, #{})).
%%% '''
%%% From Elixir: `{:ok, d} = :beamdiag.diagnose(%{duration: 5})'.
-module(beamdiag).

-export([diagnose/1, diagnose/2, analyse/1, options/1, format_error/1]).

-export_type([diagnosis/0, options/0]).

%% A diagnosis: beamdiag_diagnosis:diagnosis(), named here for callers.
-type diagnosis() :: beamdiag_diagnosis:diagnosis().
%% diagnose/1,2's options (beamdiag_diagnose:options(), which says each).
-type options() :: beamdiag_diagnose:options().

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Diagnoses the node this runs on. Options (defaults): `duration_s'
%% (10, also `duration'), `interval_ms' between samples (1000, also
%% `interval'), `msacc' (true),
%% `msacc_span' seconds at the end of the window that microstate
%% accounting covers (2; it slows every thread while on, so the default
%% keeps it on for a fifth of the default window),
%% `locks' (true: count locks when the emulator can), `procs' (true: walk the
%% process table at the window's start and end), `progress' a fun of
%% (ElapsedMs, DurationMs), `perf' (false; true or a map of perf options:
%% a perf profile over the same window joins the capture, its findings the
%% diagnosis; a profile that fails leaves a note in the capture's
%% `extras.profile_error'), `erlang' (false; true: the Erlang-level sampler
%% over the window instead of perf, its stacks also kept per process),
%% `slack' (1.5: seconds after the window, counted from this call, by
%% which the report is due; a node whose ticks come later than that, once
%% two have come, is reported on from those, marked partial; `infinity'
%% waits for the agent's last word).
%% Unknown options raise `badarg'.
-spec diagnose(options()) -> {ok, diagnosis()} | {error, {module(), term()}}.
diagnose(Opts) ->
    beamdiag_diagnose:run_local(Opts).

%% @doc Diagnoses another node, given as "name@host" or an atom; connects as
%% a hidden node when this node is not yet distributed. Also takes `cookie'
%% or `cookie_file'. A target that dies mid-window gives
%% `{error, {beamdiag, {partial, Reason, Diagnosis}}}' with what was gathered.
%%
%% A node on this host is also watched from the host from the call's start
%% (`beamdiag_host_session'): when it has not finished the handshake within a
%% second, or has not let the agent load within `answer_timeout' seconds
%% (auto: half the window, 2 to 5 s), perf starts on the threads the host
%% sees held; if it still has not let the agent load by the window's end,
%% the window is finished from the host alone and the diagnosis is marked
%% `host_only'. `host_only'
%% (true), `os_pid', or an OS pid in place of the node's name ask for that
%% host-only diagnosis at once (a node without distribution, or whose
%% cookie is not at hand). A node that answers is watched too: when the
%% host view sees a scheduler thread held (it wants a CPU the whole time
%% and never sleeps), perf samples that thread for a second or two, and a
%% native function holding it is named (`scheduler_held_native');
%% `held_perf' (true) false turns perf off on every path.
-spec diagnose(node() | string() | binary(), options()) ->
    {ok, diagnosis()} | {error, {module(), term()}}.
diagnose(Node, Opts) ->
    beamdiag_diagnose:run_remote(Node, Opts).

%% @doc Ledger and findings for a capture (pure).
-spec analyse(beamdiag_capture:capture()) -> diagnosis().
analyse(Capture) ->
    beamdiag_diagnosis:analyse(Capture).

%% @doc Validates options and fills in defaults; raises `badarg' with the
%% offending keys on unknown options or bad values.
-spec options(options()) -> options().
options(Opts) ->
    beamdiag_diagnose:options(Opts).

%% @doc Turns an error reason of this module into a sentence.
-spec format_error(term()) -> iolist().
format_error({host_only, {M, Why}, _}) ->
    [M:format_error(Why), "; the report from the host alone follows"];
format_error({partial, Why, _}) ->
    io_lib:format("the target went away mid-window (~p); the partial diagnosis follows", [Why]);
format_error({profile_crashed, Why}) ->
    io_lib:format("the perf profile crashed: ~p", [Why]);
format_error({elsewhere, Host, Why}) ->
    [beamdiag_remote:format_error(Why),
     io_lib:format(". The node runs on ~ts: beamdiag run there diagnoses it from the host "
                   "side even when it does not answer (beamdiag diagnose NODE --host-only, "
                   "or its OS pid)", [beamdiag_safe_text:safe(Host, 100)])].

