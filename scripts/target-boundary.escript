#!/usr/bin/env escript
%%! -noshell
%% The target boundary: every module named beamdiag_agent* runs on the node
%% under study, so it may call only erts, kernel, stdlib and other
%% beamdiag_agent* modules. An xref query over the built beams lists any
%% other module they call; the check fails if there is one.
%% Usage: scripts/target-boundary.escript [EBIN_DIR]
main(Args) ->
    logger:set_primary_config(level, none),
    Ebin = case Args of
               [D] -> D;
               [] -> "_build/default/lib/beamdiag/ebin"
           end,
    {ok, _} = xref:start(?MODULE, [{xref_mode, functions}]),
    ok = xref:set_default(?MODULE, [{warnings, false}, {verbose, false}]),
    _ = [{ok, _} = xref:add_application(?MODULE, code:lib_dir(App), [{builtins, true}])
         || App <- [erts, kernel, stdlib]],
    {ok, _} = xref:add_directory(?MODULE, Ebin, [{builtins, true}]),
    %% '$M_EXPR' stands for calls through a variable, which xref cannot
    %% follow; they are listed below, not counted as crossings.
    Query = "(Mod) range (E | \"beamdiag_agent.*\" : Mod)"
            " - (\"beamdiag_agent.*\" : Mod + erts : App + kernel : App + stdlib : App"
            " + '$M_EXPR' : Mod)",
    {ok, Outside} = xref:q(?MODULE, Query),
    case Outside of
        [] ->
            io:format("target boundary: beamdiag_agent* calls only erts, kernel, stdlib and itself~n");
        _ ->
            Targets = lists:join(" + ", ["'" ++ atom_to_list(M) ++ "' : Mod" || M <- Outside]),
            {ok, Calls} = xref:q(?MODULE, lists:flatten(["(E | \"beamdiag_agent.*\" : Mod) || (",
                                                         Targets, ")"])),
            io:format(standard_error, "target boundary broken: beamdiag_agent* modules call ~p~n",
                      [Outside]),
            _ = [io:format(standard_error, "  ~p -> ~p~n", [F, T]) || {F, T} <- Calls],
            halt(1)
    end.
