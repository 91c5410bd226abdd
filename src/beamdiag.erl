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

-type diagnosis() :: #{
    capture := beamdiag_collect:capture(),
    ledger := beamdiag_ledger:ledger(),
    findings := [beamdiag_finding:finding()]
}.
-type options() :: #{
    duration => number(),
    interval => pos_integer(),
    msacc => boolean(),
    msacc_span => number(),
    locks => boolean(),
    cookie => atom() | binary() | string(),
    cookie_file => file:filename(),
    progress => fun((non_neg_integer(), pos_integer()) -> term())
}.

-define(DEFAULTS, #{
    duration => 10,
    interval => 1000,
    msacc => true,
    msacc_span => 2,
    locks => true,
    progress => undefined
}).
-define(REMOTE_KEYS, [cookie, cookie_file]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Diagnoses the node this runs on. Options (defaults): `duration'
%% seconds (10), `interval' ms between samples (1000), `msacc' (true),
%% `msacc_span' seconds at the end of the window that microstate
%% accounting covers (2; it slows every thread while on, so the default
%% keeps it on for a fifth of the default window),
%% `locks' (true: count locks when the emulator can), `progress' a fun of
%% (ElapsedMs, DurationMs). Unknown options raise `badarg'.
-spec diagnose(options()) -> {ok, diagnosis()} | {error, {module(), term()}}.
diagnose(Opts) ->
    O = options(Opts),
    case beamdiag_collect:run(node(), collect_opts(O, [])) of
        {ok, Capture} -> {ok, analyse(Capture)};
        {error, _} = E -> E
    end.

%% @doc Diagnoses another node, given as "name@host" or an atom; connects as
%% a hidden node when this node is not yet distributed. Also takes `cookie'
%% or `cookie_file'. A target that dies mid-window gives
%% `{error, {beamdiag, {partial, Reason, Diagnosis}}}' with what was gathered.
-spec diagnose(node() | string() | binary(), options()) ->
    {ok, diagnosis()} | {error, {module(), term()}}.
diagnose(Node, Opts) when is_atom(Node) ->
    diagnose(atom_to_list(Node), Opts);
diagnose(NodeStr, Opts) ->
    O = options(Opts),
    case beamdiag_remote:connect(NodeStr, maps:with(?REMOTE_KEYS, O)) of
        {ok, Node} ->
            case beamdiag_loader:load(Node, beamdiag_agent:modules()) of
                {ok, Loaded} ->
                    Result = beamdiag_collect:run(Node, collect_opts(O, Loaded)),
                    case Result of
                        {ok, Capture} ->
                            {ok, analyse(Capture)};
                        {error, {beamdiag_collect, {target_down, Why, Partial}}} when
                            is_map(Partial)
                        ->
                            {error, {beamdiag, {partial, Why, analyse(Partial)}}};
                        {error, {beamdiag_collect, {agent_start, _, _}}} = E ->
                            %% The agent unloads itself when it ends; this
                            %% covers an agent that never started.
                            beamdiag_loader:unload(Node, Loaded),
                            E;
                        {error, _} = E ->
                            %% The agent started: it unloads itself when it
                            %% ends (by its deadline at the latest). Deleting
                            %% its modules here as well would race with it,
                            %% and a purge from here would kill it before it
                            %% put the flags back.
                            E
                    end;
                {error, _} = E ->
                    E
            end;
        {error, _} = E ->
            E
    end.

%% @doc Ledger and findings for a capture (pure).
-spec analyse(beamdiag_collect:capture()) -> diagnosis().
analyse(Capture) ->
    Ledger = beamdiag_ledger:build(Capture),
    #{capture => Capture, ledger => Ledger, findings => beamdiag_rules:findings(Capture, Ledger)}.

%% @doc Validates options and fills in defaults; raises `badarg' with the
%% offending keys on unknown options or bad values.
-spec options(map()) -> map().
options(Opts) ->
    O = beamdiag_opts:merge(Opts, ?DEFAULTS, ?REMOTE_KEYS),
    #{duration := D, interval := I, msacc_span := S} = O,
    (is_number(D) andalso D > 0 andalso D =< 3600) orelse erlang:error({badarg, {duration, D}}),
    (is_number(S) andalso S > 0 andalso S =< 3600) orelse erlang:error({badarg, {msacc_span, S}}),
    (is_integer(I) andalso I >= 10 andalso I =< 60000) orelse erlang:error({badarg, {interval, I}}),
    O.

%% @doc Turns an error reason of this module into a sentence.
-spec format_error(term()) -> iolist().
format_error({partial, Why, _}) ->
    io_lib:format("the target went away mid-window (~p); the partial diagnosis follows", [Why]).

%%%===================================================================
%%% Internal
%%%===================================================================

collect_opts(#{duration := D, interval := I, msacc := M, msacc_span := S, locks := L,
               progress := P}, Unload) ->
    Base = #{
        duration_ms => max(1, round(D * 1000)),
        interval_ms => I,
        msacc => M,
        msacc_ms => max(1, round(S * 1000)),
        locks => L,
        unload => Unload
    },
    case P of
        undefined -> Base;
        _ -> Base#{progress => P}
    end.
