#!/usr/bin/env escript
%% Compiles beamdiag's beams again with the compiler of the release this
%% runs on, from their abstract code (debug_info): one set of modules for
%% beamdiag_beams. Run inside an OTP root by scripts/beam-sets.sh.
%%   beam-set.escript EBIN OUT CACHE
%% OUT gets a beam per module and the manifest beamdiag.set (a binary term:
%% the release, the compiler's version, and for each module the md5 of the
%% EBIN beam it was compiled from). A module whose EBIN beam is unchanged
%% since the last run keeps its beam; beams of modules gone from EBIN go.
%% CACHE keeps every beam compiled, by the md5 of the abstract code it came
%% from without its annotations, and of the lines they name but for those
%% of lists: rebar3 compiles the test profile again for EUnit and for
%% Common Test, and the beams differ where the code does not (in the
%% options they record, and in the annotations of the abstract code:
%% Common Test's compile runs a parse transform that annotates lists anew).
%% Exit 1 when a module cannot be compiled.
-mode(compile).

main([In, Out, Cache]) ->
    T0 = erlang:monotonic_time(millisecond),
    Manifest = filename:join(Out, "beamdiag.set"),
    Before = case file:read_file(Manifest) of
                 {ok, B} -> try maps:get(modules, binary_to_term(B)) catch _:_ -> [] end;
                 {error, _} -> []
             end,
    Beams = [{list_to_atom(filename:basename(F, ".beam")), F}
             || F <- lists:sort(filelib:wildcard(filename:join(In, "*.beam")))],
    Jobs = [{M, F, Md5} || {M, F} <- Beams,
                           {ok, Bin} <- [file:read_file(F)], Md5 <- [erlang:md5(Bin)]],
    Todo = [J || {M, _, Md5} = J <- Jobs,
                 not (lists:member({M, Md5}, Before)
                      andalso filelib:is_regular(target(Out, M)))],
    ok = filelib:ensure_dir(filename:join(Cache, "x")),
    Results = pmap(fun({M, F, _}) -> {M, compile_one(M, F, Out, Cache)} end, Todo),
    case [{M, Why} || {M, {error, Why}} <- Results] of
        [] ->
            Keep = [M || {M, _, _} <- Jobs],
            _ = [file:delete(F) || F <- filelib:wildcard(filename:join(Out, "*.beam")),
                                   not lists:member(list_to_atom(filename:basename(F, ".beam")), Keep)],
            Term = #{release => list_to_integer(erlang:system_info(otp_release)),
                     compiler => compiler_vsn(),
                     modules => [{M, Md5} || {M, _, Md5} <- Jobs]},
            Tmp = Manifest ++ ".tmp." ++ os:getpid(),
            ok = file:write_file(Tmp, term_to_binary(Term)),
            ok = file:rename(Tmp, Manifest),
            io:format("beam-sets: OTP ~s set: ~b modules, ~b compiled, ~b from the cache, "
                      "in ~b ms~n",
                      [erlang:system_info(otp_release), length(Jobs),
                       length([R || {_, compiled} = R <- Results]),
                       length([R || {_, cached} = R <- Results]),
                       erlang:monotonic_time(millisecond) - T0]);
        Failed ->
            _ = file:delete(Manifest),
            [io:format(standard_error, "beam-sets: cannot compile ~s with OTP ~s: ~tp~n",
                       [M, erlang:system_info(otp_release), Why]) || {M, Why} <- Failed],
            halt(1)
    end;
main(_) ->
    io:format(standard_error, "usage: beam-set.escript EBIN OUT CACHE~n", []),
    halt(2).

target(Out, M) ->
    filename:join(Out, atom_to_list(M) ++ ".beam").

compile_one(M, File, Out, Cache) ->
    try compile_forms(M, File, Out, Cache)
    catch Class:Why:St -> {error, {Class, Why, St}}
    end.

%% `compiled' or `cached', or an error.
compile_forms(M, File, Out, Cache) ->
    case beam_lib:chunks(File, [abstract_code]) of
        {ok, {M, [{abstract_code, {raw_abstract_v1, Forms}}]}} ->
            Bare = [erl_parse:map_anno(fun(_) -> 0 end, F) || F <- Forms],
            Lines = lists:usort(lines(Forms, [])),
            Key = filename:join(Cache, hex(erlang:md5(term_to_binary({Bare, Lines}))) ++ ".beam"),
            case file:read_file(Key) of
                {ok, Bin} ->
                    ok = file:write_file(target(Out, M), Bin),
                    cached;
                {error, _} ->
                    case compile:forms(Forms, [binary, return_errors, deterministic]) of
                        {ok, M, Bin} -> store(Bin, Key, target(Out, M));
                        {ok, M, Bin, _} -> store(Bin, Key, target(Out, M));
                        {error, Errors, _} -> {error, Errors}
                    end
            end;
        Other ->
            {error, {no_abstract_code, Other}}
    end.

%% Into the cache through a file of this run's own: another build may
%% store the same key at the same time.
store(Bin, Key, Target) ->
    Tmp = Key ++ ".tmp." ++ os:getpid(),
    ok = file:write_file(Tmp, Bin),
    ok = file:rename(Tmp, Key),
    ok = file:write_file(Target, Bin),
    compiled.

%% The lines of every node of the abstract code but lists' (cons, nil).
lines({nil, _}, Acc) ->
    Acc;
lines({cons, _, H, Tl}, Acc) ->
    lines(Tl, lines(H, Acc));
lines(Node, Acc) when is_tuple(Node), tuple_size(Node) >= 2, is_atom(element(1, Node)) ->
    [_, Anno | Rest] = tuple_to_list(Node),
    Line = try erl_anno:line(Anno) catch _:_ -> none end,
    lines(Rest, case Line of none -> lines(Anno, Acc); _ -> [Line | Acc] end);
lines(Node, Acc) when is_tuple(Node) ->
    lines(tuple_to_list(Node), Acc);
lines([H | T], Acc) ->
    lines(T, lines(H, Acc));
lines(_, Acc) ->
    Acc.

hex(Bin) ->
    lists:flatten([io_lib:format("~2.16.0b", [B]) || <<B>> <= Bin]).

compiler_vsn() ->
    ok = application:load(compiler),
    {ok, V} = application:get_key(compiler, vsn),
    V.

%% One process per module, as many at a time as there are schedulers.
pmap(F, Items) ->
    pmap(F, Items, erlang:system_info(schedulers_online), 0, []).

pmap(_F, [], _Max, 0, Acc) ->
    Acc;
pmap(F, [I | Is], Max, Running, Acc) when Running < Max ->
    Self = self(),
    _ = spawn_link(fun() -> Self ! {done, F(I)} end),
    pmap(F, Is, Max, Running + 1, Acc);
pmap(F, Is, Max, Running, Acc) ->
    receive {done, R} -> pmap(F, Is, Max, Running - 1, [R | Acc]) end.
