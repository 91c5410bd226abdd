#!/usr/bin/env escript
%%! -noshell
%% The layers: which folder of src/ may call which, as data
%% (scripts/layers.eterm), checked from the built beams. Every module of
%% src/ must have its beam; its calls come from xref over those beams, its
%% remote types from their abstract code (debug_info). A call or a type
%% from one folder into another that the data does not allow fails the
%% check, and so does a cycle in the data itself. At the end the folder
%% graph as measured is printed, edge by edge, with the count of module
%% pairs behind each edge.
%% Usage: scripts/layer-check.escript [EBIN_DIR]

main(Args) ->
    logger:set_primary_config(level, none),
    Root = filename:dirname(filename:dirname(filename:absname(escript:script_name()))),
    Ebin = case Args of
               [D] -> D;
               [] -> filename:join(Root, "_build/default/lib/beamdiag/ebin")
           end,
    Layers = layers(filename:join(Root, "scripts/layers.eterm")),
    Src = filename:join(Root, "src"),
    Folder = maps:from_list([{M, folder(M, F, Src, Layers)}
                             || F <- filelib:wildcard(filename:join(Src, "**/*.erl")),
                                M <- [list_to_atom(filename:basename(F, ".erl"))]]),
    map_size(Folder) > 0 orelse fail("no modules under ~ts", [Src]),
    Missing = [M || M <- maps:keys(Folder), not filelib:is_regular(beam(Ebin, M))],
    Missing =:= [] orelse fail("no beam in ~ts for ~p (build first)", [Ebin, lists:sort(Missing)]),
    Pairs = lists:usort(calls(Ebin, Folder) ++ types(Ebin, Folder)),
    Edges = [{maps:get(A, Folder), maps:get(B, Folder), A, B, Kind}
             || {Kind, A, B} <- Pairs, maps:get(A, Folder) =/= maps:get(B, Folder)],
    Wrong = [E || {F, T, _, _, _} = E <- Edges, not lists:member(T, maps:get(F, Layers))],
    Graph = count([{F, T} || {F, T, _, _} <- lists:usort([{F, T, A, B} || {F, T, A, B, _} <- Edges])]),
    [io:format("  ~s -> ~s (~b module pairs)~n", [F, T, N]) || {{F, T}, N} <- Graph],
    case Wrong of
        [] ->
            io:format("layer-check: ~b modules, ~b beams read, ~b folder edges, "
                      "all allowed by scripts/layers.eterm; no cycle~n",
                      [map_size(Folder), map_size(Folder), length(Graph)]);
        _ ->
            [io:format(standard_error, "layer-check: ~s/~s ~s ~s/~s, not allowed~n",
                       [F, A, verb(K), T, B]) || {F, T, A, B, K} <- Wrong],
            halt(1)
    end.

%% The data, each folder with what it may name; a folder may name only
%% folders listed before it (so the allowed graph has no cycle).
layers(File) ->
    Terms = case file:consult(File) of
                {ok, Ts} -> Ts;
                {error, Why} -> fail("cannot read ~ts: ~ts", [File, file:format_error(Why)])
            end,
    lists:foldl(
      fun({F, Allowed}, Seen) when is_atom(F), is_list(Allowed) ->
              maps:is_key(F, Seen) andalso fail("~s is listed twice in ~ts", [F, File]),
              case [A || A <- Allowed, not maps:is_key(A, Seen)] of
                  [] -> Seen#{F => Allowed};
                  Up -> fail("~s may name ~p, which are not listed before it in ~ts: "
                             "the layers would have a cycle", [F, Up, File])
              end;
         (T, _) ->
              fail("~ts: not {Folder, [Folder]}: ~p", [File, T])
      end, #{}, Terms).

folder(beamdiag, F, Src, _Layers) when is_list(F) ->
    filename:dirname(F) =:= Src orelse fail("beamdiag.erl must be in src/", []),
    api;
folder(M, F, Src, Layers) ->
    Dir = filename:dirname(F),
    Dir =/= Src orelse fail("~s is in src/ itself: every module but the API lives in a folder", [M]),
    Name = list_to_atom(filename:basename(Dir)),
    maps:is_key(Name, Layers) orelse fail("folder src/~s (of ~s) is not in scripts/layers.eterm", [Name, M]),
    Name.

beam(Ebin, M) ->
    filename:join(Ebin, atom_to_list(M) ++ ".beam").

%% Module-to-module calls, as xref sees them in the beams.
calls(Ebin, Folder) ->
    {ok, _} = xref:start(?MODULE, [{xref_mode, modules}]),
    ok = xref:set_default(?MODULE, [{warnings, false}, {verbose, false}]),
    {ok, _} = xref:add_directory(?MODULE, Ebin),
    {ok, ME} = xref:q(?MODULE, "ME"),
    [{call, A, B} || {A, B} <- ME, A =/= B, maps:is_key(A, Folder), maps:is_key(B, Folder)].

%% Remote types (Mod:type()) named in each beam's abstract code.
types(Ebin, Folder) ->
    [{type, M, T} || M <- maps:keys(Folder), T <- remote_types(beam(Ebin, M)),
                     T =/= M, maps:is_key(T, Folder)].

remote_types(Beam) ->
    case beam_lib:chunks(Beam, [abstract_code]) of
        {ok, {_, [{abstract_code, {raw_abstract_v1, Forms}}]}} ->
            lists:usort(walk(Forms, []));
        _ ->
            fail("~ts has no abstract code (compile with debug_info)", [Beam])
    end.

walk({remote_type, _, [{atom, _, M}, _, Args]}, Acc) -> walk(Args, [M | Acc]);
walk(T, Acc) when is_tuple(T) -> walk(tuple_to_list(T), Acc);
walk([H | T], Acc) -> walk(T, walk(H, Acc));
walk(_, Acc) -> Acc.

count(Edges) ->
    lists:foldl(fun(E, [{E, N} | Rest]) -> [{E, N + 1} | Rest];
                   (E, Acc) -> [{E, 1} | Acc]
                end, [], lists:reverse(lists:sort(Edges))).

verb(call) -> "calls";
verb(type) -> "names a type of".

fail(Fmt, Args) ->
    io:format(standard_error, "layer-check: " ++ Fmt ++ "~n", Args),
    halt(1).
