%%% @doc A capture: what one window on a node gave, the map the ledger
%%% and the rules read. Every session that makes one makes it here
%%% (`new/3'); saved captures are beamdiag_capture_file's.
%%%
%%% ```
%%% 1> C = beamdiag_capture:new(#{settings => Settings, node => <<"a@h">>}, Samples, #{}).
%%% 2> maps:get(interval_ms, C).
%%% 1000
%%% '''
-module(beamdiag_capture).

-export([new/3]).

-export_type([capture/0, info/0, fields/0]).

%% A capture: what one window on a node gave. samples and settings are
%% all the ledger needs; the rest describes the run.
-type capture() :: #{
    samples := [beamdiag_agent_tick:sample()],
    settings := beamdiag_agent_vm:settings(),
    schema => binary(),
    node => binary(),
    interval_ms => non_neg_integer(),
    duration_ms => non_neg_integer(),
    wall_start_ms => integer(),
    extras => map(),
    complete => boolean(),
    notes => [binary()],
    cgroup_location => map(),
    msacc_was_on => boolean()
}.

%% What the agent said at its start, as new/3 reads it (other keys are
%% not read).
-type info() :: #{
    settings := beamdiag_agent_vm:settings(),
    node => binary(),
    wall_start_ms => integer(),
    cgroup_location => map(),
    msacc_was_on => boolean(),
    atom() => term()
}.
%% The fields new/3 takes from the caller (others are not read).
-type fields() :: #{
    interval_ms => non_neg_integer(),
    duration_ms => non_neg_integer(),
    extras => map(),
    complete => boolean(),
    notes => [binary()],
    atom() => term()
}.

-define(SCHEMA, <<"beamdiag.capture/1">>).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Builds a capture, the map the ledger and the rules read, from what
%% the agent said at its start (`node', `settings', `wall_start_ms', and
%% `cgroup_location' and `msacc_was_on' when it said them), the samples,
%% oldest first, and the fields that describe the run: `interval_ms'
%% (default: the time between the first two samples, 1000 with fewer),
%% `duration_ms' (default: the samples' span), `extras' (none), `complete'
%% (true) and `notes' (none). Every session that makes a capture makes it
%% here.
-spec new(info(), [beamdiag_agent_tick:sample()], fields()) -> capture().
new(Info = #{settings := Settings}, Samples, Fields) ->
    Base = #{
        schema => ?SCHEMA,
        node => maps:get(node, Info, <<>>),
        settings => Settings,
        interval_ms => interval(Samples),
        duration_ms => span(Samples),
        wall_start_ms => maps:get(wall_start_ms, Info, 0),
        samples => Samples,
        extras => #{},
        complete => true,
        notes => []
    },
    maps:merge(maps:merge(Base, maps:with([cgroup_location, msacc_was_on], Info)),
               maps:with([interval_ms, duration_ms, extras, complete, notes], Fields)).

%%%===================================================================
%%% Internal
%%%===================================================================

interval([#{t := A}, #{t := B} | _]) -> max(1, (B - A) div 1000000);
interval(_) -> 1000.

span([#{t := T0} | _] = Samples) ->
    #{t := T1} = lists:last(Samples),
    max(1, (T1 - T0) div 1000000);
span([]) ->
    0.
