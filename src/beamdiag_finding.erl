%%% @doc A finding: a catalogued problem with the numbers that prove it.
%%%
%%% Rules build findings with `new/4'; the title, fix and caveat come from
%%% `beamdiag_catalogue', the evidence and metrics from the rule.
%%%
%%% ```
%%% 1> F = beamdiag_finding:new(busy_wait, warning,
%%%        [<<"schedulers on CPU 61% of the window, busy 12%">>],
%%%        #{spin_share => 0.49}).
%%% 2> maps:get(fix, F).
%%% <<"Start the node with +sbwt none ...">>
%%% '''
-module(beamdiag_finding).

-export([new/4, sort/1, severity_rank/1, at_least/2]).

-export_type([finding/0, severity/0]).

-type severity() :: critical | warning | info.
-type finding() :: #{
    id := beamdiag_catalogue:id(),
    severity := severity(),
    title := binary(),
    evidence := [binary()],
    metrics := #{atom() => number() | binary()},
    fix := binary(),
    when_not := binary()
}.

%%%===================================================================
%%% API
%%%===================================================================

%% @doc A finding for a catalogued id, with the rule's evidence lines and the
%% raw numbers behind them.
-spec new(beamdiag_catalogue:id(), severity(), [iodata()], #{atom() => number() | binary()}) ->
    finding().
new(Id, Severity, Evidence, Metrics) when
    Severity =:= critical; Severity =:= warning; Severity =:= info
->
    #{title := Title, fix := Fix, when_not := WhenNot} = beamdiag_catalogue:entry(Id),
    #{
        id => Id,
        severity => Severity,
        title => Title,
        evidence => [iolist_to_binary(E) || E <- Evidence],
        metrics => Metrics,
        fix => Fix,
        when_not => WhenNot
    }.

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
