%%% Processes for tests to find in a walk: their code is in a module whose
%%% name does not start with beamdiag_agent (the walk leaves out the agent's
%%% own processes by their current function's module).
-module(beamdiag_test_loops).

-export([busy/0, sink/0, nested/0]).

%% Runs until told to stop.
busy() ->
    receive stop -> ok after 0 -> spin(10000), busy() end.

%% Sleeps in stdlib's code, called from its own (not a tail call: its
%% frame stays on the stack).
nested() ->
    lists:foreach(fun(_) -> timer:sleep(infinity) end, [1]),
    ok.

%% Never reads its mailbox.
sink() ->
    receive never_sent -> ok end.

spin(0) -> ok;
spin(N) -> _ = erlang:phash2(N), spin(N - 1).
