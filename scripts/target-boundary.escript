#!/usr/bin/env escript
%%! -noshell
%% The target boundary: the modules in src/agent/ are the code that loads
%% on a node under study, so they may call only erts, kernel, stdlib and
%% each other. An xref query over the built beams lists any other module
%% they call; the check fails if there is one. Calls through a module held
%% in a variable (which xref cannot follow), apply/3 included, are
%% forbidden too, except those listed in ?ALLOWED with the reason they
%% are safe; calls of funs
%% ('$M_EXPR':'$F_EXPR') call code that xref has already checked.
%% Every module named beamdiag_agent* must live in src/agent/, and nothing
%% else may.
%% Usage: scripts/target-boundary.escript [EBIN_DIR]
-define(ALLOWED, [
    {{beamdiag_agent_workload, unit, 2},
     "the experiment's driver calls the workload module it was given"},
    {{beamdiag_agent_workload, unit_context, 1},
     "the experiment's driver calls the workload module it was given"},
    {{beamdiag_agent_proc_walk, dynamic, 3},
     "calls a BIF only after erlang:function_exported/3 found it on the node's release"},
    {{beamdiag_agent_proc_identity, dynamic, 3},
     "calls erlang:process_info/2 with an item of OTP 26.2 and later, catching its badarg "
     "on earlier releases"}
]).

main(Args) ->
    logger:set_primary_config(level, none),
    Root = filename:dirname(filename:dirname(filename:absname(escript:script_name()))),
    Ebin = case Args of
               [D] -> D;
               [] -> filename:join(Root, "_build/default/lib/beamdiag/ebin")
           end,
    Agent = [list_to_atom(filename:basename(F, ".erl"))
             || F <- filelib:wildcard(filename:join(Root, "src/agent/*.erl"))],
    Agent =/= [] orelse fail("no modules in src/agent/", []),
    Named = [list_to_atom(filename:basename(F, ".erl"))
             || F <- filelib:wildcard(filename:join(Root, "src/**/beamdiag_agent*.erl"))],
    case {Named -- Agent, [M || M <- Agent, not lists:prefix("beamdiag_agent", atom_to_list(M))]} of
        {[], []} -> ok;
        {Out, In} -> fail("beamdiag_agent* modules outside src/agent/: ~p; "
                          "modules in src/agent/ without the prefix: ~p", [Out, In])
    end,
    {ok, _} = xref:start(?MODULE, [{xref_mode, functions}]),
    ok = xref:set_default(?MODULE, [{warnings, false}, {verbose, false}]),
    _ = [{ok, _} = xref:add_application(?MODULE, code:lib_dir(App), [{builtins, true}])
         || App <- [erts, kernel, stdlib]],
    {ok, _} = xref:add_directory(?MODULE, Ebin, [{builtins, true}]),
    Set = "[" ++ lists:join(", ", ["'" ++ atom_to_list(M) ++ "'" || M <- Agent]) ++ "]",
    Query = lists:flatten(["(Mod) range (E | ", Set, " : Mod) - (", Set, " : Mod"
                           " + erts : App + kernel : App + stdlib : App + '$M_EXPR' : Mod)"]),
    {ok, Outside} = xref:q(?MODULE, Query),
    Outside =:= [] orelse
        begin
            Targets = lists:join(" + ", ["'" ++ atom_to_list(M) ++ "' : Mod" || M <- Outside]),
            {ok, Calls} = xref:q(?MODULE, lists:flatten(["(E | ", Set, " : Mod) || (", Targets, ")"])),
            fail("src/agent/ modules call ~p:~n~ts", [Outside, calls(Calls)])
        end,
    {ok, Var} = xref:q(?MODULE, lists:flatten(["(E | ", Set, " : Mod) || '$M_EXPR' : Mod"])),
    %% '$M_EXPR':'$F_EXPR'/N is a fun called with N arguments; arity -1 is
    %% an apply/3 whose module xref cannot know.
    Dynamic = [C || {_, {_, F, A}} = C <- Var, F =/= '$F_EXPR' orelse A =:= -1],
    Allowed = [MFA || {MFA, _} <- ?ALLOWED],
    case [C || {From, _} = C <- Dynamic, not lists:member(From, Allowed)] of
        [] -> ok;
        Bad -> fail("src/agent/ modules call through a module in a variable "
                    "(name the module, or add the caller to ?ALLOWED with a reason):~n~ts",
                    [calls(Bad)])
    end,
    io:format("target boundary: the ~b modules of src/agent/ call only erts, kernel, stdlib "
              "and each other; ~b call sites through a variable module, each allowed with "
              "a reason~n", [length(Agent), length(Dynamic)]).

calls(Calls) ->
    [io_lib:format("  ~p -> ~p~n", [F, T]) || {F, T} <- Calls].

fail(Fmt, Args) ->
    io:format(standard_error, "target boundary broken: " ++ Fmt ++ "~n", Args),
    halt(1).
