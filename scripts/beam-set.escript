#!/usr/bin/env escript
%% Compiles beamdiag's beams again with the compiler of the release this
%% runs on, from their abstract code (debug_info): one set of modules for
%% beamdiag_beams. Run inside an OTP root by scripts/beam-sets.sh.
%%   beam-set.escript EBIN OUT
%% OUT gets a beam per module and the manifest beamdiag.set (a binary term:
%% the release, the compiler's version, and for each module the md5 of the
%% EBIN beam it was compiled from). A module whose EBIN beam is unchanged
%% since the last run keeps its beam; beams of modules gone from EBIN go.
%% Exit 1 when a module cannot be compiled.
-mode(compile).

main([In, Out]) ->
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
    Results = pmap(fun({M, F, _}) -> {M, compile_one(M, F, Out)} end, Todo),
    case [{M, Why} || {M, {error, Why}} <- Results] of
        [] ->
            Keep = [M || {M, _, _} <- Jobs],
            _ = [file:delete(F) || F <- filelib:wildcard(filename:join(Out, "*.beam")),
                                   not lists:member(list_to_atom(filename:basename(F, ".beam")), Keep)],
            Term = #{release => list_to_integer(erlang:system_info(otp_release)),
                     compiler => compiler_vsn(),
                     modules => [{M, Md5} || {M, _, Md5} <- Jobs]},
            ok = file:write_file(Manifest ++ ".tmp", term_to_binary(Term)),
            ok = file:rename(Manifest ++ ".tmp", Manifest),
            io:format("beam-sets: OTP ~s set: ~b modules, ~b compiled, in ~b ms~n",
                      [erlang:system_info(otp_release), length(Jobs), length(Todo),
                       erlang:monotonic_time(millisecond) - T0]);
        Failed ->
            _ = file:delete(Manifest),
            [io:format(standard_error, "beam-sets: cannot compile ~s with OTP ~s: ~tp~n",
                       [M, erlang:system_info(otp_release), Why]) || {M, Why} <- Failed],
            halt(1)
    end;
main(_) ->
    io:format(standard_error, "usage: beam-set.escript EBIN OUT~n", []),
    halt(2).

target(Out, M) ->
    filename:join(Out, atom_to_list(M) ++ ".beam").

compile_one(M, File, Out) ->
    try compile_forms(M, File, Out)
    catch Class:Why:St -> {error, {Class, Why, St}}
    end.

compile_forms(M, File, Out) ->
    case beam_lib:chunks(File, [abstract_code]) of
        {ok, {M, [{abstract_code, {raw_abstract_v1, Forms}}]}} ->
            case compile:forms(Forms, [binary, return_errors, deterministic]) of
                {ok, M, Bin} -> file:write_file(target(Out, M), Bin);
                {ok, M, Bin, _} -> file:write_file(target(Out, M), Bin);
                {error, Errors, _} -> {error, Errors}
            end;
        Other ->
            {error, {no_abstract_code, Other}}
    end.

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
