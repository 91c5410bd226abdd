#!/usr/bin/env escript
%%! -noshell
%% The layers, called one way: analysis/ never calls format/ or session/;
%% format/ never calls session/; session/ never calls the API module
%% (beamdiag). Each module's folder comes from src/; its calls from the
%% imports of its built beam (every call to another module's function
%% that the compiler can see). The check lists each call that crosses a
%% layer the wrong way and fails if there is one.
%% Usage: scripts/layer-check.escript [EBIN_DIR]
-define(FORBIDDEN, [{"analysis", "format"}, {"analysis", "session"},
                    {"format", "session"}, {"session", "api"}]).

main(Args) ->
    Root = filename:dirname(filename:dirname(filename:absname(escript:script_name()))),
    Ebin = case Args of
               [D] -> D;
               [] -> filename:join(Root, "_build/default/lib/beamdiag/ebin")
           end,
    Src = filename:join(Root, "src"),
    Layer = maps:from_list(
              [{M, layer(M, filename:dirname(F), Src)}
               || F <- filelib:wildcard(filename:join(Src, "**/*.erl")),
                  M <- [list_to_atom(filename:basename(F, ".erl"))]]),
    Crossings =
        lists:usort(
          [{From, M, To, Callee}
           || {M, From} <- maps:to_list(Layer),
              Beam <- [filename:join(Ebin, atom_to_list(M) ++ ".beam")],
              {ok, {_, [{imports, Imports}]}} <- [beam_lib:chunks(Beam, [imports])],
              {Callee, _, _} <- Imports, Callee =/= M,
              To <- [maps:get(Callee, Layer, none)],
              lists:member({From, To}, ?FORBIDDEN)]),
    case Crossings of
        [] ->
            io:format("layer-check: ~b modules, no call crosses a layer the wrong way~n",
                      [map_size(Layer)]);
        _ ->
            [io:format(standard_error, "layer-check: ~s/~s calls ~s/~s~n", [F, M, T, C])
             || {F, M, T, C} <- Crossings],
            halt(1)
    end.

%% The module's folder under src/; in src/ itself, the API module is
%% "api", the options' checks (beamdiag_opts) a room of their own.
layer(beamdiag, Src, Src) -> "api";
layer(_, Src, Src) -> "opts";
layer(_, Dir, _Src) -> filename:basename(Dir).
