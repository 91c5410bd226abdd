%%% @doc Loads and removes beamdiag's modules on the node it runs on, in as
%%% few code barriers as the runtime allows. Runs on the target node (erts
%%% only); the loader (beamdiag_loader) puts this module there first, with
%%% one `erlang:load_module/2', then hands it every other module.
%%%
%%% Why. Each change of the node's code waits until every scheduler has
%%% passed through its loop (thread progress): a scheduler held by a plain
%%% NIF passes only between two calls. On a node with one scheduler held
%%% 200 ms at a time (the `nif_held' lab scenario, OTP 25), one
%%% `erlang:load_module/2' took 0.5 s, twenty of them one after another
%%% 11.4 s, and forty modules prepared with `erlang:prepare_loading/2' and
%%% finished with one `erlang:finish_loading/1' 0.6 s: the runtime commits
%%% a list of prepared modules at once, as `code:atomic_load/1' does, but
%%% without the code server (a process at normal priority, which on a
%%% saturated node answers after every runnable process has run).
%%% Removing costs the same per module (0.6 s for a delete, 0.8 s for a
%%% purge, measured there), and no call removes several at once; so
%%% `unload/1' is meant to run in a process of its own on the target, where
%%% nobody waits for it.
%%%
%%% ```
%%% 1> beamdiag_agent_code:load([{M, Beam}, ...]).
%%% ok
%%% 2> beamdiag_agent_code:unload([M, ...]).
%%% ok
%%% '''
-module(beamdiag_agent_code).

-export([load/1, unload/1]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Loads the modules all at once, or none: the first whose beam the
%% runtime refuses, or the commit's refusal (`not_purged' when old code of
%% one is still there, `on_load_not_allowed'), is returned.
-spec load([{module(), binary()}]) -> ok | {error, {module(), term()}}.
load(Beams) ->
    Prepared = [{M, erlang:prepare_loading(M, Bin)} || {M, Bin} <- Beams],
    case [{M, Why} || {M, {error, Why}} <- Prepared] of
        [] ->
            case erlang:finish_loading([P || {_, P} <- Prepared]) of
                ok -> ok;
                {Why, [M | _]} -> {error, {M, Why}}
            end;
        [Refused | _] ->
            {error, Refused}
    end.

%% @doc Deletes the modules (their code becomes old) one after another,
%% then purges each deleted one in a process of its own that runs no code
%% of ours: a purge ends the processes still in the old code, the caller
%% among them when it runs one of these modules.
-spec unload([module()]) -> ok.
unload(Mods) ->
    Deleted = [M || M <- Mods, (catch erlang:delete_module(M)) =:= true],
    _ = [spawn(erlang, purge_module, [M]) || M <- Deleted],
    ok.
