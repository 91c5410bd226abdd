%%% EUnit tests of what names a process to a person, on processes of this
%%% node: a registered proc_lib server (its proc_lib initial call, not
%%% proc_lib's own), processes spawned from a fun (named by the fun when
%%% its frame is the stack's outermost, with who spawned them), one that
%%% did not answer, one gone, beamdiag's own helpers (left out), and the
%%% count of processes like a large heap.
-module(beamdiag_agent_proc_identity_tests).

-include_lib("eunit/include/eunit.hrl").

-define(SCOPE, beamdiag_proc_identity_test_scope).
-define(PARENT, beamdiag_proc_identity_test_parent).
%% Frames below a fun: more than a stack read gives (64 at most).
-define(FRAMES, 80).

%% A pg scope is a gen_server: registered, started through proc_lib.
server_test() ->
    {ok, Srv} = pg:start(?SCOPE),
    Watchers = [spawn(fun() -> erlang:monitor(process, Srv), receive stop -> ok end end)
                || _ <- [1, 2]],
    try
        wait_until(fun() -> monitors(Srv) =:= 2 end),
        Names = beamdiag_agent_proc_identity:names(),
        ?assertEqual(?SCOPE, maps:get(Srv, Names)),
        Ids = beamdiag_agent_proc_identity:read([Srv], #{}),
        [E] = beamdiag_agent_proc_identity:entries([Srv], fun info/1, #{}, Names, Ids),
        ?assertMatch(#{pid := _, name := <<"beamdiag_proc_identity_test_scope">>,
                       initial_call := <<"pg:init/1">>, spawn_call := <<"proc_lib:init_p/5">>,
                       label := null, monitored_by := 2, status := <<"waiting">>,
                       like := null, reductions := 42}, E),
        ?assertEqual(list_to_binary(pid_to_list(Srv)), maps:get(pid, E)),
        ?assertMatch(<<"gen_server:", _/binary>>, maps:get(current, E)),
        ?assertNot(is_map_key(answered, E)),
        %% Every frame is OTP's (pg, gen_server, proc_lib): no frame of the
        %% user's own.
        ?assertNot(is_map_key(own, E)),
        %% With a count of processes like it.
        [#{like := 3}] = beamdiag_agent_proc_identity:entries([Srv], fun info/1,
                                                              #{<<"pg:init/1">> => 3}, Names, Ids)
    after
        [W ! stop || W <- Watchers],
        exit(Srv, kill)
    end.

%% A process in stdlib's code (timer:sleep/1, from lists:foreach/2) that
%% its own module sent there: the innermost frame of that module is named,
%% with its file and line; OTP's frames are not.
own_frame_test() ->
    P = spawn(beamdiag_test_loops, nested, []),
    try
        wait_until(fun() -> erlang:process_info(P, current_function) =:=
                                {current_function, {timer, sleep, 1}} end),
        Ids = beamdiag_agent_proc_identity:read([P], #{}),
        [E] = beamdiag_agent_proc_identity:entries([P], fun info/1, #{}, #{}, Ids),
        ?assertEqual(<<"timer:sleep/1">>, maps:get(current, E)),
        ?assertEqual(<<"beamdiag_test_loops:nested/0">>, maps:get(own, E)),
        ?assertMatch({match, _}, re:run(maps:get(own_at, E), "beamdiag_test_loops\\.erl:[0-9]+$"))
    after
        exit(P, kill)
    end.

%% A process spawned from a fun and waiting in it: the runtime says
%% erlang:apply/2 (spawn_call); the fun, its stack's one frame, names it,
%% and its parent is this process, named from the registered names. (The
%% funs are beamdiag_test_loops': a process running code of this module,
%% beamdiag_agent*, would be taken for one of beamdiag's helpers.)
fun_test() ->
    true = register(?PARENT, self()),
    P = beamdiag_test_loops:spawn_fun(),
    try
        wait_until(fun() -> in_fun(P, "-spawn_fun/0-fun-") end),
        Ids = beamdiag_agent_proc_identity:read([P], #{}),
        [E] = beamdiag_agent_proc_identity:entries([P], fun info/1, #{},
                                                   beamdiag_agent_proc_identity:names(), Ids),
        ?assertMatch(#{name := null, initial_call := <<"a fun in beamdiag_test_loops:spawn_fun/0">>,
                       spawn_call := <<"erlang:apply/2">>, monitored_by := 0,
                       parent := #{name := <<"beamdiag_proc_identity_test_parent">>}}, E),
        ?assertEqual(list_to_binary(pid_to_list(self())), maps:get(pid, maps:get(parent, E)))
    after
        unregister(?PARENT),
        P ! stop
    end.

%% A fun that tail-called a named function left no frame of its own: the
%% outermost frame is that function's, so no guess (erlang:apply/2); the
%% parent, not registered, by its pid alone.
tail_call_test() ->
    P = beamdiag_test_loops:spawn_tail_call(),
    try
        wait_until(fun() -> erlang:process_info(P, current_function) =:=
                                {current_function, {beamdiag_test_loops, sink, 0}} end),
        Ids = beamdiag_agent_proc_identity:read([P], #{}),
        [E] = beamdiag_agent_proc_identity:entries([P], fun info/1, #{}, #{}, Ids),
        ?assertMatch(#{initial_call := <<"erlang:apply/2">>, spawn_call := <<"erlang:apply/2">>,
                       parent := #{name := null}}, E),
        ?assertEqual(list_to_binary(pid_to_list(self())), maps:get(pid, maps:get(parent, E)))
    after
        exit(P, kill)
    end.

%% A stack as deep as the backtrace depth may have lost its outermost
%% frames (the fun's among them): no guess. A few frames below the fun
%% leave it named.
full_stack_test() ->
    Shallow = beamdiag_test_loops:spawn_frames(3),
    Deep = beamdiag_test_loops:spawn_frames(?FRAMES),
    try
        wait_until(fun() -> waiting_in_frames(Shallow) andalso waiting_in_frames(Deep) end),
        {current_stacktrace, St} = erlang:process_info(Deep, current_stacktrace),
        {current_stacktrace, Whole} = erlang:process_info(Shallow, current_stacktrace),
        %% Cut at the depth (64 at most on any release): the fun's frame
        %% is gone from the deep one, the outermost of the shallow one.
        ?assert(length(St) =< 64),
        ?assertMatch({beamdiag_test_loops, F, 1, _} when F =:= frames_a; F =:= frames_b,
                     lists:last(St)),
        %% (Its arity counts the fun's free variable: N.)
        ?assertMatch({beamdiag_test_loops, '-spawn_frames/1-fun-0-', 1, _}, lists:last(Whole)),
        Ids = beamdiag_agent_proc_identity:read([Shallow, Deep], #{}),
        [S, D] = beamdiag_agent_proc_identity:entries([Shallow, Deep], fun info/1, #{}, #{}, Ids),
        ?assertEqual(<<"a fun in beamdiag_test_loops:spawn_frames/1">>, maps:get(initial_call, S)),
        ?assertEqual(<<"erlang:apply/2">>, maps:get(initial_call, D))
    after
        Shallow ! stop,
        Deep ! stop
    end.

%% A process known not to answer is not asked: it gets what the runtime
%% knows without it; one gone since is left out.
unanswered_and_gone_test() ->
    P = spawn(fun() -> receive stop -> ok end end),
    {Gone, MRef} = spawn_monitor(fun() -> ok end),
    receive {'DOWN', MRef, process, Gone, _} -> ok end,
    try
        Names = #{P => held_one},
        Ids = beamdiag_agent_proc_identity:read([P, Gone], #{P => 350}),
        ?assertMatch([#{name := <<"held_one">>, answered := false, waited_ms := 350,
                        initial_call := <<"?">>, current := <<"?">>, status := <<"?">>,
                        parent := null, reductions := 42}],
                     beamdiag_agent_proc_identity:entries([P, Gone], fun info/1, #{}, Names,
                                                          Ids))
    after
        P ! stop
    end.

%% beamdiag's own helpers on the node (running beamdiag_agent* code) are
%% left out, as the agent itself is.
own_helpers_test() ->
    Probe = beamdiag_agent_bounded_call:start(self()),
    Helper = beamdiag_agent_bounded_call:pid(Probe),
    try
        wait_until(fun() ->
                       case erlang:process_info(Helper, current_function) of
                           {current_function, {M, _, _}} ->
                               lists:prefix("beamdiag_agent", atom_to_list(M));
                           _ -> false
                       end
                   end),
        Ids = beamdiag_agent_proc_identity:read([Helper], #{}),
        ?assertEqual([], beamdiag_agent_proc_identity:entries([Helper], fun info/1, #{}, #{}, Ids))
    after
        beamdiag_agent_bounded_call:stop(Probe)
    end.

%% The longest waits first, at most N, named from the runtime's table.
stalled_entries_test() ->
    [A, B, C] = [list_to_pid(T) || T <- ["<0.1.0>", "<0.2.0>", "<0.3.0>"]],
    ?assertEqual([#{pid => <<"<0.2.0>">>, name => <<"b">>, waited_ms => 900},
                  #{pid => <<"<0.3.0>">>, name => null, waited_ms => 300}],
                 beamdiag_agent_proc_identity:stalled_entries([{A, 100}, {B, 900}, {C, 300}],
                                                              #{B => b}, 2)).

%% The count of processes like each large heap, from the end walk's
%% initial calls: proc_lib's own for proc_lib processes, none for a fun's
%% erlang:apply/2, none for a walk that did not read every process.
like_counts_test() ->
    {ok, Srv} = pg:start(?SCOPE),
    try
        [A, B, C, D] = [list_to_pid(T) || T <- ["<0.1.0>", "<0.2.0>", "<0.3.0>", "<0.4.0>"]],
        End = #{A => {0, 0, 0, {m, f, 1}}, D => {0, 0, 0, {erlang, apply, 2}},
                Srv => {0, 0, 0, {proc_lib, init_p, 5}}},
        Walked = [{A, {0, 0, 0, {m, f, 1}}}, {B, {0, 0, 0, {m, f, 1}}},
                  {C, {0, 0, 0, {x, y, 0}}}, {D, {0, 0, 0, {erlang, apply, 2}}},
                  {Srv, {0, 0, 0, {proc_lib, init_p, 5}}}],
        ?assertEqual(#{<<"m:f/1">> => 2, <<"pg:init/1">> => 1},
                     beamdiag_agent_proc_identity:like_counts(all, [A, D, Srv], End, Walked)),
        ?assertEqual(#{}, beamdiag_agent_proc_identity:like_counts(all, [D], End, Walked)),
        ?assertEqual(#{}, beamdiag_agent_proc_identity:like_counts(registered, [A], End, Walked)),
        ?assertEqual(#{}, beamdiag_agent_proc_identity:like_counts(sampled, [A], End, Walked))
    after
        exit(Srv, kill)
    end.

%%% Helpers

info(_P) ->
    #{reductions => 42}.

%% Whether P is in a fun of beamdiag_test_loops whose name begins with
%% Prefix.
in_fun(P, Prefix) ->
    case erlang:process_info(P, current_function) of
        {current_function, {beamdiag_test_loops, F, 0}} -> lists:prefix(Prefix, atom_to_list(F));
        _ -> false
    end.

waiting_in_frames(P) ->
    case erlang:process_info(P, [current_function, status]) of
        [{current_function, {beamdiag_test_loops, F, 1}}, {status, waiting}] ->
            F =:= frames_a orelse F =:= frames_b;
        _ ->
            false
    end.

monitors(P) ->
    {monitored_by, Ms} = erlang:process_info(P, monitored_by),
    length(Ms).

wait_until(F) ->
    wait_until(F, 100).

wait_until(F, 0) ->
    ?assert(F());
wait_until(F, N) ->
    case F() of
        true -> ok;
        false -> timer:sleep(10), wait_until(F, N - 1)
    end.

%% A read whose stack does not begin with the current function came from
%% two instants (seen on a running gen_server of an Elixir release: Enum's
%% function beside the stack of gen_server:loop/7) and is read again; a
%% stack that begins with it, with an arity or the arguments, agrees, and
%% so does a read without a stack.
stack_agrees_test() ->
    Loop = {current_stacktrace, [{gen_server, loop, 7, []}, {proc_lib, init_p_do_apply, 3, []}]},
    ?assertNot(beamdiag_agent_proc_identity:stack_agrees(
                 [{current_function, {'Elixir.Enum', '-reduce/3-lists^foldl/2-0-', 3}}, Loop])),
    ?assert(beamdiag_agent_proc_identity:stack_agrees([{current_function, {gen_server, loop, 7}}, Loop])),
    ?assert(beamdiag_agent_proc_identity:stack_agrees(
              [{current_function, {m, f, 2}}, {current_stacktrace, [{m, f, [a, b], []}]}])),
    ?assert(beamdiag_agent_proc_identity:stack_agrees(
              [{current_function, {erlang, hibernate, 3}}, {current_stacktrace, []}])),
    %% Own read: this process's current function and stack agree.
    ?assert(beamdiag_agent_proc_identity:stack_agrees(
              erlang:process_info(self(), [current_function, current_stacktrace]))).
