%%% @doc The running of one diagnosis, behind `beamdiag:diagnose/1,2':
%%% the options checked and their defaults, the node reached (or its host
%%% watched when it does not answer: the host-view race), the agent loaded,
%%% the lock session and the profile beside it, the report due by the
%%% window plus its slack. Errors keep the API's tag, `{beamdiag, Reason}'
%%% (beamdiag:format_error/1). One path: collect, then analyse once (the
%%% profile, the lock data, the attach plan and perf's samples of held
%%% threads join the capture first), then the caller formats.
%%%
%%% A node on this host is raced against its host view (`with_host_view/2'),
%%% a state machine of three named states (`state/1'; `event/3' and
%%% `timeout/2' move between them):
%%%
%%% ```
%%% alone     no host view (its OS process  the worker's result: analysed once, done
%%%           was not found)
%%% watching  the host view samples; the    the worker's progress (handshake, agent
%%%           node has not answered           loaded): -> answered
%%%                                         timeout: perf armed on held threads; at the
%%%                                           window's end, armed: the host's report, done
%%%                                         the worker failed (timed out, busy): the
%%%                                           host's report; unreachable: the same, as
%%%                                           the error's, done
%%% answered  the node answered; the host   timeout: perf on a held thread, a second or two
%%%           view kept in reserve          the worker's capture: perf's samples join it,
%%%                                           analysed once, done
%%%                                         the agent's samples due and missing: the
%%%                                           host's report (late), done
%%% '''
%%%
%%% ```
%%% 1> {ok, D} = beamdiag_diagnose:run_local(#{duration => 2}).
%%% 2> {ok, D2} = beamdiag_diagnose:run_remote("app@host", #{cookie => secret}).
%%% '''
-module(beamdiag_diagnose).

-export([run_local/1, run_remote/2, options/1]).

-export_type([options/0, perf_options/0]).

%% The options of beamdiag:diagnose/1,2.
-type options() :: #{
    %% Seconds and milliseconds, as their names say; `duration' and
    %% `interval' are the same options by their older names.
    duration_s => number(),
    interval_ms => pos_integer(),
    duration => number(),
    interval => pos_integer(),
    msacc => boolean(),
    msacc_span => number(),
    locks => boolean(),
    procs => boolean(),
    cookie => atom() | binary() | string(),
    cookie_file => file:filename(),
    proto_dist => inet_tcp | inet6_tcp | inet_tls | inet6_tls,
    ssl_dist_optfile => file:filename(),
    dist_port => inet:port_number(),
    plan => beamdiag_attach_plan:plan(),
    progress => fun((non_neg_integer(), pos_integer()) -> term()) | undefined,
    perf => boolean() | perf_options(),
    erlang => boolean(),
    slack => number() | infinity,
    host_only => boolean(),
    os_pid => pos_integer() | undefined,
    answer_timeout => number() | auto,
    %% When the call started (os:system_time(millisecond)), for a caller
    %% that began it in another OS process (the escript started again):
    %% the report is due, and said ready, from then.
    started => integer(),
    held_perf => boolean()
}.
%% With `perf', a perf profile of the node's OS process over the same
%% window (this must run on the node's host): `call_graph' (auto | dwarf |
%% fp | none), `frequency' (Hz, 97), `perf' (the executable), `dir' (the
%% working directory; a temporary one, removed afterwards, by default).
-type perf_options() :: #{
    call_graph => auto | dwarf | fp | none,
    frequency => pos_integer(),
    perf => string(),
    dir => file:filename()
}.

-define(DEFAULTS, #{
    duration => 10,
    interval => 1000,
    msacc => true,
    msacc_span => 2,
    locks => true,
    procs => true,
    progress => undefined,
    perf => false,
    erlang => false,
    slack => 1.5,
    host_only => false,
    os_pid => undefined,
    answer_timeout => auto,
    held_perf => true
}).
-define(REMOTE_KEYS, [cookie, cookie_file, proto_dist, ssl_dist_optfile, dist_port, plan]).
%% The earliest a call may say it started, before this one (`started').
-define(STARTED_MAX_MS, 60000).
%% When perf starts on the held threads of a local node that has not
%% finished the handshake (beamdiag_host_session:arm/1).
-define(ARM_MS, 1000).
%% perf's run on a held thread of a node that answers: a second or two
%% names the native code (199 samples a second).
-define(HELD_PERF_S, 2).
%% The least of the window perf needs (beamdiag_host_session: its start, one
%% second, its symbols).
-define(PERF_LEAST_MS, 3500).
%% How long past the time the report is due the lock data is waited for
%% (its last reading starts a second before; beamdiag_lock_session).
-define(LOCKS_CEILING_MS, 250).
%% With no due time, how long the lock data is waited for past the window.
-define(LOCKS_WAIT_MS, 3000).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Diagnoses the node this runs on (beamdiag:diagnose/1).
-spec run_local(options()) -> {ok, beamdiag_diagnosis:diagnosis()} | {error, {module(), term()}}.
run_local(Opts) ->
    T0 = erlang:monotonic_time(millisecond),
    O = due(options(Opts), T0),
    Locks = lock_session(node(), O),
    ready(T0, analysed(profiled(node(), O, fun() ->
                  with_locks(beamdiag_collect:run(node(), collect_opts(O, [])), Locks, O)
              end))).

%% @doc Diagnoses another node (beamdiag:diagnose/2).
-spec run_remote(node() | string() | binary(), options()) ->
    {ok, beamdiag_diagnosis:diagnosis()} | {error, {module(), term()}}.
run_remote(Node, Opts) when is_atom(Node) ->
    run_remote(atom_to_list(Node), Opts);
run_remote(NodeStr, Opts) ->
    T0 = call_start(Opts),
    O = due(options(Opts), T0),
    ready(T0, case host_request(NodeStr, O) of
                  {host_only, Target} ->
                      beamdiag_host_session:diagnose(Target, host_options(O));
                  remote ->
                      case local_host(NodeStr) of
                          true -> with_host_view(NodeStr, O);
                          false -> elsewhere(remote_analysed(remote(NodeStr, O)), NodeStr)
                      end
              end).

%% The names that carry their unit, `duration_s' and `interval_ms', for
%% the older `duration' (seconds) and `interval' (milliseconds); both
%% spellings of one option must agree.
unit_names(Opts) ->
    lists:foldl(fun({Named, Old}, O) ->
                        case {maps:take(Named, O), maps:find(Old, O)} of
                            {error, _} -> O;
                            {{V, O1}, error} -> O1#{Old => V};
                            {{V, O1}, {ok, V}} -> O1;
                            {{V, _}, {ok, W}} -> erlang:error({badarg, {Named, V, Old, W}})
                        end
                end, Opts, [{duration_s, duration}, {interval_ms, interval}]).

%% @doc Validates options and fills in defaults; raises `badarg' with the
%% offending keys on unknown options or bad values.
-spec options(options()) -> options().
options(Opts0) ->
    Opts = unit_names(Opts0),
    O = beamdiag_opts:merge(Opts, ?DEFAULTS, [started | ?REMOTE_KEYS]),
    #{duration := D, interval := I, msacc_span := S} = O,
    Max = beamdiag_opts:max_seconds(window),
    (is_number(D) andalso D > 0 andalso D =< Max) orelse erlang:error({badarg, {duration, D}}),
    (is_number(S) andalso S > 0 andalso S =< Max) orelse erlang:error({badarg, {msacc_span, S}}),
    (is_integer(I) andalso I >= 10 andalso I =< 60000) orelse erlang:error({badarg, {interval, I}}),
    perf_options(maps:get(perf, O)) orelse erlang:error({badarg, {perf, maps:get(perf, O)}}),
    %% perf records the whole window: its limit is checked now, not after it.
    MaxPerf = beamdiag_opts:max_seconds(perf),
    (maps:get(perf, O) =:= false orelse D =< MaxPerf)
        orelse erlang:error({badarg, {duration, D, with_perf_at_most, MaxPerf}}),
    is_boolean(maps:get(erlang, O)) orelse erlang:error({badarg, {erlang, maps:get(erlang, O)}}),
    Slack = maps:get(slack, O),
    (Slack =:= infinity orelse (is_number(Slack) andalso Slack >= 0 andalso Slack =< Max))
        orelse erlang:error({badarg, {slack, Slack}}),
    is_boolean(maps:get(host_only, O)) orelse erlang:error({badarg, {host_only, maps:get(host_only, O)}}),
    OsPid = maps:get(os_pid, O),
    (OsPid =:= undefined orelse (is_integer(OsPid) andalso OsPid > 0))
        orelse erlang:error({badarg, {os_pid, OsPid}}),
    is_boolean(maps:get(held_perf, O)) orelse erlang:error({badarg, {held_perf, maps:get(held_perf, O)}}),
    Answer = maps:get(answer_timeout, O),
    (Answer =:= auto orelse (is_number(Answer) andalso Answer > 0 andalso Answer =< Max))
        orelse erlang:error({badarg, {answer_timeout, Answer}}),
    case maps:find(proto_dist, O) of
        {ok, Proto} -> lists:member(Proto, [inet_tcp, inet6_tcp, inet_tls, inet6_tls])
                           orelse erlang:error({badarg, {proto_dist, Proto}});
        error -> true
    end,
    case maps:find(dist_port, O) of
        {ok, Port} -> (is_integer(Port) andalso Port > 0 andalso Port < 65536)
                          orelse erlang:error({badarg, {dist_port, Port}});
        error -> true
    end,
    O.

%% The call's start in this VM's monotonic clock: now, or `started' when
%% the caller began it earlier elsewhere (at most a minute ago).
call_start(#{started := Started}) when is_integer(Started) ->
    Now = erlang:monotonic_time(millisecond),
    Now - max(0, min(?STARTED_MAX_MS, erlang:system_time(millisecond) - Started));
call_start(_) ->
    erlang:monotonic_time(millisecond).

%% When the report is due: the window and the slack from T0 (the call's
%% start, so connecting and loading count).
due(O = #{slack := infinity}, _T0) ->
    O#{ready_by => infinity};
due(O = #{duration := D, slack := Slack}, T0) ->
    O#{ready_by => T0 + round((D + Slack) * 1000)}.

%% The diagnosis says how long after the call (T0) it was ready: wall time
%% on this host, connecting, the window and the analysis included.
ready(T0, {ok, D}) ->
    {ok, D#{ready_ms => erlang:monotonic_time(millisecond) - T0}};
ready(T0, {error, {beamdiag, {partial, Why, D}}}) ->
    {error, {beamdiag, {partial, Why, D#{ready_ms => erlang:monotonic_time(millisecond) - T0}}}};
ready(_T0, Error) ->
    Error.

perf_options(B) when is_boolean(B) -> true;
perf_options(M) when is_map(M) ->
    lists:all(fun({call_graph, C}) -> lists:member(C, [auto, dwarf, fp, none]);
                 ({frequency, F}) -> is_integer(F) andalso F >= 1 andalso F =< 999;
                 ({perf, P}) -> is_list(P);
                 ({dir, D}) -> is_list(D) orelse is_binary(D);
                 (_) -> false
              end, maps:to_list(M));
perf_options(_) -> false.


%% Connects, loads the agent and runs the window over distribution; Notify
%% hears each step done (connected, loaded). The capture comes back
%% unanalysed: it is analysed once, when nothing more joins it
%% (remote_analysed/1).
remote(NodeStr, O) ->
    remote(NodeStr, O, fun(_) -> ok end).

remote(NodeStr, O, Notify) ->
    case plan(NodeStr, O) of
        {ok, Plan0} ->
            _ = Notify({planned, Plan0}),
            remote_plan(NodeStr, O#{plan => Plan0}, Notify);
        {error, _} = E ->
            E
    end.

%% How to reach the node: given, or made now (beamdiag_attach_plan).
plan(_NodeStr, #{plan := Plan}) ->
    {ok, Plan};
plan(NodeStr, O) ->
    beamdiag_attach_plan:plan(NodeStr, maps:with([cookie, cookie_file, proto_dist, ssl_dist_optfile,
                                             dist_port, located], O)).

remote_plan(NodeStr, O, Notify) ->
    case beamdiag_remote:attach(NodeStr, maps:with(?REMOTE_KEYS, O)) of
        {ok, Node, #{cookie := Used, plan := Plan}} ->
            Attach = beamdiag_attach_plan:public(Plan, Used),
            _ = Notify(connected),
            %% The lock counters are read from here from the start, whatever
            %% becomes of the agent (beamdiag_lock_session).
            Locks = lock_session(Node, O),
            _ = Notify({locks, Locks}),
            case beamdiag_loader:load(Node, beamdiag_agent:modules()) of
                {ok, Loaded} ->
                    _ = Notify(loaded),
                    %% The report's own modules load while the window runs.
                    _ = spawn(fun beamdiag_loader:warm/0),
                    Result = profiled(Node, O, fun() ->
                                 with_attach(with_locks(beamdiag_collect:run(Node, collect_opts(O, Loaded)),
                                                        Locks, O), Attach)
                             end),
                    case Result of
                        {ok, _Capture} ->
                            Result;
                        {error, {beamdiag_collect, {target_down, _, Partial}}} when
                            is_map(Partial)
                        ->
                            Result;
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

%% How the node was reached joins the capture (and so the report and a
%% saved capture).
with_attach({ok, Capture}, Attach) ->
    {ok, put_extra(Capture, attach, Attach)};
with_attach({error, {beamdiag_collect, {target_down, Why, Partial}}}, Attach) when is_map(Partial) ->
    {error, {beamdiag_collect, {target_down, Why, put_extra(Partial, attach, Attach)}}};
with_attach(Other, _Attach) ->
    Other.

put_extra(Capture, K, V) ->
    Capture#{extras => (maps:get(extras, Capture, #{}))#{K => V}}.

%% A node on the lock-counting emulator: its counters read from this side
%% over the window, unless `locks' is off.
lock_session(_Node, #{locks := false}) ->
    none;
lock_session(Node, O = #{duration := D, ready_by := ReadyBy}) ->
    case beamdiag_lock_session:start(Node, #{window_ms => max(1, round(D * 1000)),
                                            ready_by => ReadyBy,
                                            owner => maps:get(lock_owner, O, self())}) of
        {ok, S} -> S;
        none -> none
    end.

%% The lock data joins the capture before it is analysed: the latest
%% reading by the time the report is due.
with_locks({ok, Capture}, Locks, O) ->
    {ok, add_locks(Capture, Locks, O)};
with_locks({error, {beamdiag_collect, {target_down, Why, Partial}}}, Locks, O) when is_map(Partial) ->
    {error, {beamdiag_collect, {target_down, Why, add_locks(Partial, Locks, O)}}};
with_locks(Other, _Locks, _O) ->
    Other.

add_locks(Capture, none, _O) ->
    Capture;
add_locks(Capture, Locks, O) ->
    Extras = maps:get(extras, Capture, #{}),
    Capture#{extras => maps:merge(Extras, lock_extras(Locks, O))}.

%% The lock data as extras: `locks', or `locks_missing' saying why not.
lock_extras(none, _O) ->
    #{};
lock_extras(Locks, #{ready_by := ReadyBy}) ->
    Wait = case ReadyBy of
               infinity -> infinity;
               _ -> beamdiag_agent_deadline:left(ReadyBy + ?LOCKS_CEILING_MS)
           end,
    case beamdiag_lock_session:data(Locks, Wait) of
        {ok, Data} -> #{locks => Data};
        {error, {M, Why}} -> #{locks_missing => iolist_to_binary(M:format_error(Why))}
    end.

%% An OS pid in place of the node, `os_pid' or `host_only': the host-only
%% diagnosis at once.
host_request(_NodeStr, #{os_pid := P}) when is_integer(P) -> {host_only, P};
host_request(NodeStr, #{host_only := true}) -> {host_only, NodeStr};
host_request(NodeStr, _) ->
    case beamdiag_host_locate:target(NodeStr) of
        {os_pid, P} -> {host_only, P};
        {node, _} -> remote
    end.

host_options(#{duration := D, interval := I, ready_by := ReadyBy, progress := P,
               held_perf := HeldPerf}) ->
    Base = #{duration => D, interval => I, ready_by => ReadyBy, perf => HeldPerf},
    case P of
        undefined -> Base;
        _ -> Base#{progress => P}
    end.

local_host(NodeStr) ->
    case beamdiag_node_name:split(NodeStr) of
        {_, Host} when Host =/= "" -> beamdiag_host_locate:is_local_host(Host);
        _ -> false
    end.

%% The node's host is this one: the host view starts with the call, then
%% a worker connects and runs the window as on any node, saying each step
%% it got through, and the race between the two runs as a state machine
%% (the module doc draws it). Once the agent is loaded (or has ticked),
%% the node has answered; the host view is kept until the report, and
%% makes it when the agent's first two samples have not come by the time
%% the report is due and the host view explains why (a throttled node's
%% own reads wait for its quota). Past the answer time, perf starts on the
%% threads the host view finds held; a node that has still not let the
%% agent load by the window's end has not answered: the worker is stopped
%% and the window finished from the host view alone.
with_host_view(NodeStr, O = #{duration := D, progress := P}) ->
    Self = self(),
    Tag = make_ref(),
    Progress = fun(E, T) ->
                   Self ! {Tag, answered},
                   case P of undefined -> ok; _ -> P(E, T) end
               end,
    T0 = erlang:monotonic_time(millisecond),
    AnswerMs = answer_ms(maps:get(answer_timeout, O), D),
    %% Milliseconds on this host (epmd's names, /proc): the worker starts
    %% once the view does, so that it knows whether it has one to fall
    %% back on.
    Located = case O of
                  #{plan := #{located := L0}} ->
                      %% Located already, when the plan was made.
                      {ok, L0};
                  _ ->
                      beamdiag_host_locate:locate(NodeStr, #{timeout => min(1000, AnswerMs)})
              end,
    View = case Located of
               {ok, L} -> {watching, beamdiag_host_session:start(L, (host_options(O))#{node => NodeStr})};
               {error, _} -> none
           end,
    {Worker, MRef} = spawn_monitor(fun() ->
        R = try
                {result, remote(NodeStr, O#{progress := Progress, fallback => fallback(View),
                                            lock_owner => Self, located => Located},
                                fun(Stage) -> Self ! {Tag, stage, Stage} end)}
            catch
                C:Why:St -> {raise, C, Why, St}
            end,
        Self ! {Tag, R}
    end),
    race(#{tag => Tag, worker => Worker, mref => MRef, view => View, stage => connecting,
           t0 => T0, answer_ms => AnswerMs, window_ms => round(D * 1000), located => Located,
           node => NodeStr, opts => O, held_perf => maps:get(held_perf, O)}).

%% The race's state: `alone' (no host view: the node's OS process was not
%% found), `watching' (the host view samples; the node has not answered),
%% `answered' (the node answered; the host view is kept in reserve).
state(#{view := none}) -> alone;
state(#{view := {watching, _}}) -> watching;
state(#{view := {answered, _}}) -> answered.

%% One step of the race: the next event, or the state's timeout.
race(W = #{tag := Tag, worker := Worker, mref := MRef}) ->
    State = state(W),
    receive
        {Tag, _} = Event -> event(State, Event, W);
        {Tag, _, _} = Event -> event(State, Event, W);
        {beamdiag_host_session, _, _} = PerfDone when State =/= alone ->
            perf_done(PerfDone, W);
        {'DOWN', MRef, process, Worker, Why} -> erlang:error({diagnose_worker, Why})
    after timeout_ms(State, W) ->
        timeout(State, W)
    end.

%% When the state times out. perf is armed a second in when the handshake
%% has not finished by then (it takes milliseconds on a node that
%% answers), or at the answer time when the agent has not loaded by then.
%% A node that has not finished the handshake by the window's end has not
%% answered; one that has is given the usual, bounded, course.
timeout_ms(State, W = #{t0 := T0, stage := Stage}) ->
    Armed = maps:get(armed, W, false),
    At = case {State, Armed, Stage} of
             {watching, false, connecting} ->
                 maps:get(next_arm, W, T0 + min(?ARM_MS, maps:get(answer_ms, W)));
             {watching, false, connected} ->
                 maps:get(next_arm, W, T0 + maps:get(answer_ms, W));
             {watching, true, connecting} ->
                 T0 + max(maps:get(answer_ms, W), maps:get(window_ms, W));
             {answered, false, _} ->
                 case maps:get(held_perf, W, true) of
                     %% A node that answers: perf on a thread the host view
                     %% sees held, a second in, for a second or two.
                     true -> maps:get(next_arm, W, T0 + ?ARM_MS);
                     false -> infinity
                 end;
             _ ->
                 infinity
         end,
    beamdiag_agent_deadline:left(At).

%% The worker's steps, in any state.
event(_State, {_, answered}, W = #{view := View}) ->
    %% The host view goes on: a node that answers too slowly for the
    %% report to be on time is reported on from it.
    race(W#{view := answered(View)});
event(_State, {_, stage, loaded}, W = #{view := View}) ->
    %% The agent is loaded: the node answers.
    race(W#{stage := loaded, view := answered(View)});
event(_State, {_, stage, {locks, Locks}}, W) ->
    race(W#{locks => Locks});
event(_State, {_, stage, {planned, Plan}}, W) ->
    race(W#{plan => Plan});
event(_State, {_, stage, NewStage}, W) ->
    race(W#{stage := NewStage});
%% The worker's result.
event(answered, {_, {result, {error, {beamdiag_collect, {due, Agent}}}}},
      W = #{view := {answered, H}, t0 := T0}) ->
    %% The node answered, but its agent's first two samples had not come
    %% when the report was due: the host view makes it, with what the
    %% agent sent.
    stop_listening(W),
    Ms = erlang:monotonic_time(millisecond) - T0,
    {ok, beamdiag_host_session:finish_late(H, #{
        waited_ms => Ms, agent => Agent, extras => host_locks(W),
        why => iolist_to_binary(io_lib:format(
                 "the node answered, but its first two samples had not come when the "
                 "report was due, ~.1f s after the call", [Ms / 1000]))})};
event(watching, {_, {result, {error, Why}}}, W = #{view := {watching, H}, t0 := T0}) ->
    stop_listening(W),
    Waited = erlang:monotonic_time(millisecond) - T0,
    case {timed_out(Why), Why} of
        {true, _} ->
            %% The handshake gave up, or the release read or the agent's
            %% start timed out: what the host saw is all.
            {ok, beamdiag_host_session:finish(H, #{
                waited_ms => Waited, extras => host_locks(W),
                distribution => iolist_to_binary(error_text(Why)),
                attach => plan_public(W)})};
        {false, {beamdiag_loader, {busy, _, _, _}}} ->
            %% A previous session's agent is still leaving (on a saturated
            %% node it may take seconds): the host view makes the report,
            %% saying why.
            {ok, beamdiag_host_session:finish_late(H, #{
                waited_ms => Waited, extras => host_locks(W),
                why => iolist_to_binary(error_text(Why))})};
        {false, _} ->
            case beamdiag_remote:unreachable(Why) of
                true ->
                    %% The node runs here but cannot be reached over
                    %% distribution (wrong cookie, TLS refused, its port
                    %% closed, this VM unable to speak its protocol): the
                    %% window is finished from the host, on time, and the
                    %% error stays the run's.
                    D = beamdiag_host_session:unreached(H, #{
                            waited_ms => Waited,
                            distribution => iolist_to_binary(error_text(Why)),
                            attach => plan_public(W)}),
                    {error, {beamdiag, {host_only, Why, D}}};
                false ->
                    ok = beamdiag_host_session:cancel(H),
                    {error, Why}
            end
    end;
event(answered, {_, {result, {ok, Capture}}}, W = #{view := {answered, H}}) ->
    %% perf's samples of a thread the host saw held, if it ran, join the
    %% capture before its one analysis.
    stop_listening(W),
    remote_analysed({ok, beamdiag_host_session:with_held_perf(H, Capture)});
event(State, {_, Result}, W = #{view := View}) ->
    stop_listening(W),
    _ = case State of
            alone -> ok;
            _ -> beamdiag_host_session:cancel(element(2, View))
        end,
    remote_analysed(result(Result)).

%% perf on the held threads finished: kept for the report, and told to the
%% view (a node whose agent is too slow to answer is explained by a
%% scheduler perf shows held).
perf_done(PerfDone, W = #{view := {Kind, H0}}) ->
    case beamdiag_host_session:perf_done(H0, PerfDone) of
        ignore -> race(W);
        H1 -> race(W#{view := {Kind, H1}})
    end.

%% The state timed out.
timeout(alone, W) ->
    race(W);
timeout(answered, W = #{view := {answered, Held}, t0 := T0}) ->
    Tried = beamdiag_host_session:arm(Held, #{max_seconds => ?HELD_PERF_S}),
    Again = erlang:monotonic_time(millisecond) + ?ARM_MS,
    race(W#{view := {answered, Tried}, next_arm => Again,
            armed => beamdiag_host_session:armed(Tried) orelse
                Again > T0 + maps:get(window_ms, W) - ?PERF_LEAST_MS});
timeout(watching, W = #{view := {watching, Handle}, t0 := T0}) ->
    case maps:get(armed, W, false) of
        false ->
            %% The node may still answer; perf starts on the held threads,
            %% once the host view shows them (tried each second while perf
            %% would still fit in the window).
            H2 = beamdiag_host_session:arm(Handle),
            Next = erlang:monotonic_time(millisecond) + ?ARM_MS,
            Done = beamdiag_host_session:armed(H2) orelse
                Next > T0 + maps:get(window_ms, W) - ?PERF_LEAST_MS,
            race(W#{view := {watching, H2}, armed => Done, next_arm => Next});
        true ->
            %% The window is over and the node has not answered.
            exit(maps:get(worker, W), kill),
            stop_listening(W),
            {ok, beamdiag_host_session:finish(Handle, #{
                waited_ms => erlang:monotonic_time(millisecond) - T0,
                extras => host_locks(W),
                distribution => distribution_seen(W),
                attach => plan_public(W)})}
    end.

%% The race is over: nothing more from the worker is read.
stop_listening(#{tag := Tag, mref := MRef}) ->
    erlang:demonitor(MRef, [flush]),
    flush_answers(Tag).

result({result, R}) -> R;
result({raise, C, Why, St}) -> erlang:raise(C, Why, St).

%% The one analysis of a capture made over distribution; a target that
%% died mid-window leaves a partial diagnosis.
remote_analysed({ok, Capture}) ->
    {ok, beamdiag_diagnosis:analyse(Capture)};
remote_analysed({error, {beamdiag_collect, {target_down, Why, Partial}}}) when is_map(Partial) ->
    {error, {beamdiag, {partial, Why, beamdiag_diagnosis:analyse(Partial)}}};
remote_analysed(Error) ->
    Error.

%% The one analysis of a capture of this node; a partial one stays the
%% collector's error.
analysed({ok, Capture}) ->
    {ok, beamdiag_diagnosis:analyse(Capture)};
analysed(Other) ->
    Other.

%% The lock data read over the window, for a report made from the host
%% view: the host view's window ends when the report is due.
host_locks(W = #{opts := O}) ->
    lock_extras(maps:get(locks, W, none), O).

%% What the collector may fall back on when the agent's samples come too
%% slowly: the host view, when it explains why.
fallback({watching, H}) -> fun() -> beamdiag_host_session:explains_slowness(H) end;
fallback(none) -> false.

%% The host view of a node that has answered: kept in reserve (no samples
%% until the report), never armed.
answered({watching, H}) ->
    ok = beamdiag_host_session:keep_in_reserve(H),
    {answered, H};
answered(View) ->
    View.

%% What was resolved of how to reach the node, for a report made from the
%% host alone.
plan_public(#{plan := Plan}) -> beamdiag_attach_plan:public(Plan, 0);
plan_public(_) -> #{}.

%% The first calls that time out on a node too busy to answer.
timed_out({beamdiag_remote, {unreachable, _, {no_answer, _}}}) -> true;
timed_out({beamdiag_loader, {target_facts, _, {timeout, _}}}) -> true;
timed_out({beamdiag_loader, {compile_failed, _, _, timeout}}) -> true;
timed_out({beamdiag_collect, {agent_start, _, {timeout, _}}}) -> true;
timed_out(_) -> false.

error_text({M, R}) -> M:format_error(R).

flush_answers(Tag) ->
    receive
        {Tag, _} -> flush_answers(Tag);
        {Tag, _, _} -> flush_answers(Tag)
    after 0 -> ok
    end.

%% How long the node is given to finish the handshake: half the window,
%% 2 to 5 s, and never past the window.
answer_ms(auto, D) -> min(round(D * 1000), max(2000, min(5000, round(D * 500))));
answer_ms(S, _D) -> max(100, round(S * 1000)).

%% What the distribution layer saw of a node that did not answer, in words.
distribution_seen(#{stage := Stage, t0 := T0, located := Located}) ->
    S = (erlang:monotonic_time(millisecond) - T0) / 1000,
    iolist_to_binary(
        case Stage of
            connecting ->
                case Located of
                    {ok, #{how := epmd_port, port := Port}} ->
                        io_lib:format("it is registered in epmd (port ~b), but the distribution "
                                      "handshake did not finish in ~.1f s", [Port, S]);
                    {ok, #{epmd := not_registered}} ->
                        "it is not registered in epmd: started without distribution, or it "
                        "could not register";
                    {ok, #{epmd := no_answer}} ->
                        "no epmd answered on this host";
                    {ok, #{epmd := no_epmd}} ->
                        "no epmd runs on this host, and the handshake did not finish";
                    _ ->
                        io_lib:format("the distribution handshake did not finish in ~.1f s", [S])
                end;
            connected ->
                io_lib:format("the handshake finished, but the node did not answer the "
                              "release read and the agent's load in ~.1f s", [S])
        end).

%% A node on another host that does not answer: say so, and where beamdiag
%% can still diagnose it.
elsewhere({error, {beamdiag_remote, Why}}, NodeStr) when element(1, Why) =:= unreachable ->
    {error, {beamdiag, {elsewhere, beamdiag_node_name:host(NodeStr), Why}}};
elsewhere(Result, _NodeStr) ->
    Result.

%% Runs Collect (the agent's window); with `perf', a perf profile of the
%% node over the same window in a process of its own, which joins the
%% capture. Returns Collect's result, its capture not yet analysed.
profiled(_Node, #{perf := false, erlang := false}, Collect) ->
    Collect();
profiled(Node, #{duration := D, perf := Perf, erlang := Erlang}, Collect) ->
    PerfOpts = case Perf of M when is_map(M) -> M; _ -> #{} end,
    {Dir, Temp} = case maps:find(dir, PerfOpts) of
        {ok, Given} -> {Given, false};
        error -> {temp_dir(), true}
    end,
    %% The profile rules run with the diagnosis's other rules (analyse/1).
    ProfOpts = maps:merge(maps:with([call_graph, frequency, perf], PerfOpts),
                          #{duration => max(1, round(D)), out => Dir, erlang => Erlang,
                            rules => false}),
    Self = self(),
    Ref = make_ref(),
    {Pid, MRef} = spawn_monitor(fun() ->
        Self ! {Ref, beamdiag_profile:profile(Node, ProfOpts, fun(_) -> ok end)}
    end),
    Result = Collect(),
    Profile = receive
        {Ref, P} -> P;
        {'DOWN', MRef, process, Pid, Why} -> {error, {beamdiag, {profile_crashed, Why}}}
    end,
    erlang:demonitor(MRef, [flush]),
    _ = case Temp of
        true -> file:del_dir_r(Dir);
        false -> ok
    end,
    with_profile(Result, Profile).

with_profile({ok, Capture}, Profile) ->
    {ok, with_extras(Capture, Profile)};
with_profile({error, {beamdiag_collect, {target_down, Why, Partial}}}, Profile)
  when is_map(Partial) ->
    {error, {beamdiag_collect, {target_down, Why, with_extras(Partial, Profile)}}};
with_profile({error, _} = E, _Profile) ->
    E.

with_extras(Capture, none) ->
    Capture;
with_extras(Capture, {ok, #{profile := P, method := M} = R}) ->
    Extras = maps:get(extras, Capture, #{}),
    %% The folded stacks only: the formats draw the flamegraph when they
    %% print (beamdiag_format_html).
    %% The Erlang sampler's stacks per process, for the top processes.
    ByProcess = maps:get(processes, maps:get(sampler, R, #{}), []),
    Profile = maps:merge(maps:with([perf, callers, callers_error], R),
                         #{profile => P, method => M, by_process => ByProcess}),
    Capture#{extras => Extras#{profile => Profile}};
with_extras(Capture, {error, {M, R}}) ->
    Extras = maps:get(extras, Capture, #{}),
    Capture#{extras => Extras#{profile_error => iolist_to_binary(M:format_error(R))}}.

temp_dir() ->
    beamdiag_tmp:path("beamdiag-perf").

collect_opts(O = #{duration := D, interval := I, msacc := M, msacc_span := S, locks := L,
                   procs := Procs, progress := P, ready_by := ReadyBy}, Unload) ->
    Base = #{
        ready_by => ReadyBy,
        fallback => maps:get(fallback, O, false),
        duration_ms => max(1, round(D * 1000)),
        interval_ms => I,
        msacc => M,
        msacc_ms => max(1, round(S * 1000)),
        locks => L,
        procs => Procs,
        unload => Unload
    },
    maps:merge(here_scan(O), case P of
                                 undefined -> Base;
                                 _ -> Base#{progress => P}
                             end).

%% A node found on this host: the collector reads the host's processes
%% from here too, for a capture the starved node cuts short.
here_scan(O = #{located := {ok, #{os_pid := OsPid}}}) ->
    #{here_scan => #{root => maps:get(proc_root, O, "/proc"), exclude => [OsPid]}};
here_scan(_O) ->
    #{}.
