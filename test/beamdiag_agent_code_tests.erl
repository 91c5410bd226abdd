%%% EUnit tests of loading and removing modules on this node, with small
%%% modules compiled here: several loaded at once, or none when one beam
%%% is refused (not a beam, another module's, old code still there, an
%%% on_load function); removed and purged, ending a process still in the
%%% old code, and a module never loaded passed over.
-module(beamdiag_agent_code_tests).

-include_lib("eunit/include/eunit.hrl").

-define(A, beamdiag_code_test_a).
-define(B, beamdiag_code_test_b).
-define(C, beamdiag_code_test_c).
-define(ON_LOAD, beamdiag_code_test_on_load).

code_test_() ->
    {foreach, fun clean/0, fun(_) -> clean() end, [{timeout, 30, T} || T <- [
        {"loaded at once", fun loaded/0},
        {"not a beam: none loaded", fun not_a_beam/0},
        {"another module's beam", fun wrong_name/0},
        {"old code still there", fun not_purged/0},
        {"an on_load function", fun on_load/0},
        {"removed and purged", fun unloaded/0},
        {"a process in the old code is ended by the purge", fun purge_ends/0}
    ]]}.

loaded() ->
    ?assertEqual(ok, beamdiag_agent_code:load([{?A, beam(?A, 1)}, {?B, beam(?B, 2)}])),
    ?assertEqual({1, 2}, {?A:v(), ?B:v()}),
    ?assert(erlang:module_loaded(?A) andalso erlang:module_loaded(?B)).

not_a_beam() ->
    ?assertEqual({error, {?B, badfile}},
                 beamdiag_agent_code:load([{?A, beam(?A, 1)}, {?B, <<"not a beam">>},
                                           {?C, beam(?C, 3)}])),
    %% All or none.
    ?assertEqual([false, false, false], [erlang:module_loaded(M) || M <- [?A, ?B, ?C]]).

wrong_name() ->
    ?assertEqual({error, {?B, badfile}}, beamdiag_agent_code:load([{?B, beam(?A, 1)}])),
    ?assertEqual([false, false], [erlang:module_loaded(M) || M <- [?A, ?B]]).

not_purged() ->
    ok = beamdiag_agent_code:load([{?A, beam(?A, 1)}]),
    ok = beamdiag_agent_code:load([{?A, beam(?A, 2)}]),
    ?assert(erlang:check_old_code(?A)),
    %% A third version while the first is old code: refused, with the
    %% others of the batch.
    ?assertEqual({error, {?A, not_purged}},
                 beamdiag_agent_code:load([{?B, beam(?B, 5)}, {?A, beam(?A, 3)}])),
    ?assertEqual(2, ?A:v()),
    ?assertNot(erlang:module_loaded(?B)).

%% Alone: the runtime refuses to commit it. (In a batch with other
%% modules OTP 25's finish_loading/1 raises system_limit instead; no
%% module of beamdiag's has an on_load function.) The refused module is
%% left waiting for its on_load, a state no delete or purge ends (OTP 25):
%% a name of its own, that no other test loads or removes.
on_load() ->
    ?assertEqual({error, {?ON_LOAD, on_load}},
                 beamdiag_agent_code:load([{?ON_LOAD, beam(?ON_LOAD, 3,
                                                           [{attribute, 1, on_load, {v, 0}}])}])),
    ?assertNot(erlang:module_loaded(?ON_LOAD)).

unloaded() ->
    ok = beamdiag_agent_code:load([{?A, beam(?A, 1)}, {?B, beam(?B, 2)}]),
    %% A module never loaded is passed over.
    ?assertEqual(ok, beamdiag_agent_code:unload([?A, ?C, ?B])),
    ?assertEqual([false, false], [erlang:module_loaded(M) || M <- [?A, ?B]]),
    %% Purged by processes of their own, soon after.
    ok = beamdiag_test_lib:await(fun() -> not erlang:check_old_code(?A) andalso
                                           not erlang:check_old_code(?B) end, 5000),
    ?assertError(undef, ?A:v()).

purge_ends() ->
    ok = beamdiag_agent_code:load([{?A, beam(?A, 1)}]),
    P = spawn(?A, wait, []),
    MRef = erlang:monitor(process, P),
    ok = beamdiag_test_lib:await(fun() -> erlang:process_info(P, current_function) =:=
                                           {current_function, {?A, wait, 0}} end, 5000),
    ok = beamdiag_agent_code:unload([?A]),
    receive {'DOWN', MRef, process, P, Why} -> ?assertEqual(killed, Why)
    after 5000 -> error(still_running) end,
    %% The caller, not in that code, goes on.
    ?assert(is_process_alive(self())),
    ok = beamdiag_test_lib:await(fun() -> not erlang:check_old_code(?A) end, 5000).

%%% Helpers

%% A module M with v() -> V, and wait() that waits for ever.
beam(M, V) ->
    beam(M, V, []).

beam(M, V, Extra) ->
    Forms = [{attribute, 1, module, M}, {attribute, 1, export, [{v, 0}, {wait, 0}]}] ++ Extra ++
            [{function, 2, v, 0, [{clause, 2, [], [], [{integer, 2, V}]}]},
             {function, 3, wait, 0, [{clause, 3, [], [],
                                      [{'receive', 3, [{clause, 3, [{atom, 3, never}], [],
                                                        [{atom, 3, ok}]}]}]}]}],
    {ok, M, Bin} = compile:forms(Forms, [binary]),
    Bin.

clean() ->
    [begin
         _ = code:purge(M),
         _ = code:delete(M),
         _ = code:purge(M)
     end || M <- [?A, ?B, ?C]],
    ok.
