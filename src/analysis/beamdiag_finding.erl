%%% @doc A finding: a catalogued problem with the numbers that prove it.
%%%
%%% Rules build findings with `new/4' or `new/5'; the title, fix and caveat
%%% come from `beamdiag_catalogue' (the fix fitted to the node by
%%% `beamdiag_fix_text' when the rule passes one), the evidence, metrics and
%%% figures from the rule. A figure is a number with its unit and, when it
%%% is a part of another figure, the name of that whole: the property test
%%% over recorded captures checks every figure against its physical bound
%%% without reading the text.
%%%
%%% ```
%%% 1> F = beamdiag_finding:new(busy_wait, warning,
%%%        [<<"schedulers on CPU 61% of the window, busy 12%">>],
%%%        #{spin_share => 0.49}).
%%% 2> maps:get(fix, F).
%%% <<"Start the node with +sbwt none ...">>
%%% '''
-module(beamdiag_finding).

-export([new/4, new/5, figure/3, figure/4, sort/1, severity_rank/1, at_least/2]).

-export_type([finding/0, severity/0, figure/0, unit/0]).

-type severity() :: critical | warning | info.
-type finding() :: #{
    id := beamdiag_catalogue:id(),
    severity := severity(),
    title := binary(),
    evidence := [binary()],
    metrics := #{atom() => number() | binary()},
    figures := [figure()],
    fix := binary(),
    when_not := binary()
}.
%% cpus: CPU time over wall time; cpu_s: CPU time (the kernel's on-CPU
%% account); wall_s: wall time of one or more threads (runnable-wait,
%% BEAM busy time, msacc states); share: a part over its whole, 0 to 1;
%% count: events; per_s: events per second of wall time.
-type unit() :: cpus | cpu_s | wall_s | share | count | per_s.
%% scope: whose figure it is (the node's threads over the window, the
%% node's threads over a span of it such as msacc's slice, the whole host,
%% or the window); part_of: the figure this one is a part of (never above
%% it).
-type figure() :: #{
    name := atom(),
    value := number(),
    unit := unit(),
    scope := node | span | host | window,
    part_of => atom()
}.

%%%===================================================================
%%% API
%%%===================================================================

%% @doc A finding for a catalogued id, with the rule's evidence lines and the
%% raw numbers behind them.
-spec new(beamdiag_catalogue:id(), severity(), [iodata()], #{atom() => number() | binary()}) ->
    finding().
new(Id, Severity, Evidence, Metrics) ->
    new(Id, Severity, Evidence, Metrics, #{}).

%% @doc As `new/4', with the figures behind the evidence and, optionally, a
%% fix fitted to the node and a title fitted to the evidence in place of
%% the catalogue's.
-spec new(beamdiag_catalogue:id(), severity(), [iodata()], #{atom() => number() | binary()},
          #{figures => [figure()], fix => iodata(), title => iodata()}) -> finding().
new(Id, Severity, Evidence, Metrics, Opts) when
    Severity =:= critical; Severity =:= warning; Severity =:= info
->
    #{title := Title, fix := Fix, when_not := WhenNot} = beamdiag_catalogue:entry(Id),
    #{
        id => Id,
        severity => Severity,
        title => iolist_to_binary(maps:get(title, Opts, Title)),
        evidence => [iolist_to_binary(E) || E <- Evidence],
        metrics => Metrics,
        figures => maps:get(figures, Opts, []),
        fix => iolist_to_binary(maps:get(fix, Opts, Fix)),
        when_not => WhenNot
    }.

%% @doc A figure of the node's threads.
-spec figure(atom(), number(), unit()) -> figure().
figure(Name, Value, Unit) ->
    figure(Name, Value, Unit, #{}).

%% @doc A figure with its scope (default node) and the figure it is part of.
-spec figure(atom(), number(), unit(), #{scope => node | span | host | window, part_of => atom()}) ->
    figure().
figure(Name, Value, Unit, Opts) when is_number(Value) ->
    maps:merge(#{name => Name, value => Value, unit => Unit, scope => node},
               maps:with([scope, part_of], Opts)).

%% @doc Most severe first; ties keep the order the rules produced.
-spec sort([finding()]) -> [finding()].
sort(Findings) ->
    lists:sort(
        fun(#{severity := A}, #{severity := B}) -> severity_rank(A) =< severity_rank(B) end,
        Findings
    ).

%% @doc 0 for critical, 1 for warning, 2 for info.
-spec severity_rank(severity()) -> 0..2.
severity_rank(critical) -> 0;
severity_rank(warning) -> 1;
severity_rank(info) -> 2.

%% @doc True when the finding is at least as severe as the given level.
-spec at_least(finding(), severity()) -> boolean().
at_least(#{severity := S}, Level) ->
    severity_rank(S) =< severity_rank(Level).
