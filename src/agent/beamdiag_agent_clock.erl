%%% @doc The agent's clock, on the target (erts, kernel and stdlib only):
%%% which tick comes next, when the hard deadline is, and whether a
%%% deadline has passed. Pure arithmetic over monotonic milliseconds, but
%%% for the reads of the clock itself.
%%%
%%% When ticks take more than a quarter of the interval (thousands of
%%% threads on few cores) the agent skips ticks so that sampling stays
%%% under a quarter of the time. A tick's cost here is wall time, the least
%%% of the last three ticks': most of it is waiting, not work. The first
%%% and the last tick are always taken and counted like the others: a tick
%%% that would crowd the last one is skipped, and the one that starts the
%%% microstate-accounting slice never is (`msacc_tick/3').
%%%
%%% The agent's hard deadline is the window's end plus a grace time (5 s,
%%% or twice the costliest tick so far, at most 30 s: a throttled node
%%% stalls whole, and a tick there costs seconds).
%%%
%%% ```
%%% 1> beamdiag_agent_clock:hard_deadline(10000, 3000).
%%% 16000
%%% 2> Start = erlang:monotonic_time(millisecond).
%%% 3> beamdiag_agent_clock:next_tick(1000000, Start, 1, 1000, Start + 5000).
%%% 5
%%% '''
-module(beamdiag_agent_clock).

-export([hard_deadline/2, next_tick/5, msacc_tick/3]).

%% Past the window, the agent cleans up on its own after this long even if
%% nobody asked it to.
-define(GRACE_MS, 5000).
-define(MAX_GRACE_MS, 30000).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The hard deadline of a window that ends at End, after ticks of
%% which the costliest took WorstMs: past the window's end, the agent
%% cleans up on its own after the grace time, or after twice its costliest
%% tick when ticks cost more (a throttled node stalls whole: 2 to 3 s a
%% tick at a fifth of a CPU), never more than ?MAX_GRACE_MS.
-spec hard_deadline(integer(), non_neg_integer()) -> integer().
hard_deadline(End, WorstMs) ->
    End + min(?MAX_GRACE_MS, max(?GRACE_MS, 2 * WorstMs)).

%% @doc The next tick number: the one after K, or later when ticks take
%% so long (Cost, in microseconds) that the next one must wait for sampling
%% to stay under a quarter of the time (Start and End: the window's, in
%% monotonic milliseconds; tick K is due at Start + K x Interval). The last tick, at the window's end, counts
%% too: a tick that would leave it less than three of its costs of rest is
%% skipped, so the last tick comes next.
-spec next_tick(non_neg_integer(), integer(), non_neg_integer(), pos_integer(), integer()) ->
          non_neg_integer().
next_tick(Cost, Start, K, Interval, End) ->
    Now = erlang:monotonic_time(millisecond),
    CostMs = Cost div 1000,
    Earliest = Now + CostMs * 3,
    K2 = max(K, (Earliest - Start + Interval - 1) div Interval),
    case Start + K2 * Interval of
        At when At < End, At + CostMs * 4 > End -> last_tick(Start, Interval, End);
        _ -> K2
    end.

%% @doc The tick to take after K: K2 (from next_tick/5), or the one that
%% starts the microstate-accounting slice (the state's `msacc_from', while
%% `msacc' is still false) when K2 would skip it. That tick is never
%% skipped: its sample is the slice's baseline, and without it the slice would be
%% empty (on a loaded node the guard would otherwise skip to the last tick).
-spec msacc_tick(#{msacc := boolean(), msacc_from := non_neg_integer() | never, atom() => term()},
                 non_neg_integer(), non_neg_integer()) -> non_neg_integer().
msacc_tick(#{msacc := false, msacc_from := From}, K, K2) when is_integer(From), From >= K ->
    min(K2, From);
msacc_tick(_State, _K, K2) ->
    K2.

%%%===================================================================
%%% Internal
%%%===================================================================

%% The tick number whose time is the window's end (or past it).
last_tick(Start, Interval, End) ->
    (End - Start + Interval - 1) div Interval.

