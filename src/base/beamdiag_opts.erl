%%% @doc Option maps: defaults merged in one place, unknown keys rejected.
%%%
%%% Library entry points take a map of options; a key the entry point does
%%% not know is a caller's mistake and raises `badarg' naming it and the
%%% keys that are allowed.
%%%
%%% ```
%%% 1> beamdiag_opts:merge(#{duration => 5}, #{duration => 10, interval => 1000}, []).
%%% #{duration => 5, interval => 1000}
%%% 2> beamdiag_opts:merge(#{durtion => 5}, #{duration => 10}, []).
%%% ** exception error: bad argument: {unknown_options, [durtion], allowed, [duration]}
%%% '''
-module(beamdiag_opts).

-export([merge/3, max_seconds/1]).

%% @doc The options over the defaults. `Extra' lists keys that are allowed
%% without a default.
%% (Left open: every module's options come through here, each of its own
%% type; the caller's spec names the result's.)
-spec merge(map(), map(), [atom()]) -> map().
merge(Opts, Defaults, Extra) when is_map(Opts), is_map(Defaults), is_list(Extra) ->
    Allowed = lists:usort(maps:keys(Defaults) ++ Extra),
    case maps:keys(Opts) -- Allowed of
        [] -> maps:merge(Defaults, Opts);
        Unknown -> erlang:error({badarg, {unknown_options, Unknown, allowed, Allowed}})
    end;
merge(Opts, _Defaults, _Extra) ->
    erlang:error({badarg, Opts}).

%% @doc The one set of limits on seconds that every entry point checks
%% against: a window (`window', an hour; also a microstate span, the
%% slack and the answer time) and a perf recording (`perf', five minutes:
%% perf's output grows with it, and a diagnosis with `perf' records the
%% whole window).
-spec max_seconds(window | perf) -> pos_integer().
max_seconds(window) -> 3600;
max_seconds(perf) -> 300.
