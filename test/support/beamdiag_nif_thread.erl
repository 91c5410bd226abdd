%%% The Erlang side of test/fixtures/nif/beamdiag_nif_thread.c: loads the
%%% NIF from the given path and starts its threads for Ms milliseconds.
-module(beamdiag_nif_thread).

-export([run/2, start/1]).

run(SoPathNoExt, Ms) ->
    ok = erlang:load_nif(SoPathNoExt, 0),
    start(Ms).

start(_Ms) ->
    erlang:nif_error(not_loaded).
