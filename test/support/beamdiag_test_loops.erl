%%% Processes for tests to find in a walk: their code is in a module whose
%%% name does not start with beamdiag_agent (the walk leaves out the agent's
%%% own processes by their current function's module).
-module(beamdiag_test_loops).

-export([busy/0, sink/0, nested/0, spawn_fun/0, spawn_tail_call/0, spawn_frames/1]).

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

%% A process spawned from a fun that waits in it: the fun's frame is its
%% stack's outermost (and only) one.
spawn_fun() ->
    spawn(fun() -> receive stop -> ok end end).

%% A process spawned from a fun that tail-calls sink/0: the fun leaves no
%% frame.
spawn_tail_call() ->
    spawn(fun() -> sink() end).

%% A process spawned from a fun N frames above a wait, of two functions
%% in turn (the runtime folds a run of one function's frames into one).
spawn_frames(N) ->
    spawn(fun() -> 1 + frames_a(N) end).

frames_a(0) -> receive stop -> 0 end;
frames_a(N) -> 1 + frames_b(N - 1).

frames_b(0) -> receive stop -> 0 end;
frames_b(N) -> 1 + frames_a(N - 1).

spin(0) -> ok;
spin(N) -> _ = erlang:phash2(N), spin(N - 1).
