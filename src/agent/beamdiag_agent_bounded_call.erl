%%% @doc The agent's helper for calls that need every scheduler to answer,
%%% run with a deadline. Runs on the target node.
%%%
%%% `statistics(scheduler_wall_time_all)', `statistics(microstate_accounting)'
%%% and the flags that turn them on send a request to every scheduler and
%%% wait for all of them. A scheduler held by a NIF (or a long BIF) answers
%%% only when the NIF returns, so such a call stalls its caller for as long:
%%% forever for a NIF that never yields. The agent therefore makes these
%%% calls through one long-lived helper process: it sends the work, waits at
%%% most the given time, and goes on without the answer when it is late
%%% (the item is missing from that tick). While the helper is still waiting
%%% for a late answer, further calls are not queued behind it: they return
%%% `busy' at once.
%%%
%%% One helper per session, started with the agent (no process per tick:
%%% a call costs a message each way). The helper owns the session's
%%% `scheduler_wall_time' reference (the flag is counted per process and
%%% dropped when its process exits) and runs the session's clean-up funs
%%% (each an `{on_exit, Fun}' message to itself) when it is stopped or when
%%% its owner dies, after any work still queued: a flag whose restore waits
%%% for a held scheduler is put back when that scheduler answers, whatever
%%% happened to the agent.
%%%
%%% ```
%%% 1> P = beamdiag_agent_bounded_call:start(self()).
%%% 2> beamdiag_agent_bounded_call:call(P, fun() -> erlang:statistics(run_queue) end, 200).
%%% {ok, 0}
%%% 3> beamdiag_agent_bounded_call:stop(P).
%%% ok
%%% '''
-module(beamdiag_agent_bounded_call).

-export([start/1, call/3, ask/2, answer/2, once/1, cast/2, stop/1, pid/1, reply/3]).

-ifdef(TEST).
-export([once/2]).
-endif.

%% Internal: the helper's entry point.
-export([init/2]).
%% Spawned by start/1 through proc_lib:spawn_opt/4.
-ignore_xref([{init, 2}]).

-export_type([probe/0, asked/0]).

%% How long once/1 waits (ms).
-define(ONCE_MS, 100).

-opaque probe() :: {probe, pid(), atomics:atomics_ref()}.
%% A call sent with ask/2, whose answer answer/2 waits for.
-opaque asked() :: {asked, reference()} | busy.

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Starts the helper for Owner (the agent): high priority, ends when
%% Owner does.
-spec start(pid()) -> probe().
start(Owner) ->
    Busy = atomics:new(1, []),
    Pid = proc_lib:spawn_opt(?MODULE, init, [Owner, Busy], [{priority, high}]),
    {probe, Pid, Busy}.

%% @doc Runs Fun in the helper and waits at most TimeoutMs for its value:
%% `{ok, Value}', `timeout' (the value, when it comes, is dropped), `busy'
%% (a previous call's work is still running) or `{error, Text}' (Fun
%% raised).
-spec call(probe(), fun(() -> term()), non_neg_integer()) ->
    {ok, term()} | timeout | busy | {error, binary()}.
call(Probe, Fun, TimeoutMs) ->
    answer(ask(Probe, Fun), TimeoutMs).

%% @doc Sends Fun to the helper without waiting, for a caller that does
%% other work meanwhile (two helpers asked at once wait together):
%% answer/2 then waits for its value. `busy' when a previous call's work
%% is still running.
-spec ask(probe(), fun(() -> term())) -> asked().
ask({probe, Pid, Busy}, Fun) ->
    case atomics:get(Busy, 1) of
        0 ->
            atomics:put(Busy, 1, 1),
            %% A reply alias: an answer that comes after the caller stopped
            %% waiting is dropped by the runtime, not left in its mailbox.
            Alias = alias([reply]),
            Pid ! {run, Alias, Fun},
            {asked, Alias};
        _ ->
            busy
    end.

%% @doc The value of a call sent with ask/2, waited for at most TimeoutMs:
%% as call/3 answers.
-spec answer(asked(), non_neg_integer()) -> {ok, term()} | timeout | busy | {error, binary()}.
answer({asked, Alias}, TimeoutMs) ->
    reply(Alias, TimeoutMs, timeout);
answer(busy, _TimeoutMs) ->
    busy.

%% @doc `once/2' with the wait a walk or a session's start allows a
%% figure every scheduler must answer for: ?ONCE_MS.
-spec once(fun(() -> term())) -> {ok, term()} | timeout | {error, binary()}.
once(Fun) ->
    once(Fun, ?ONCE_MS).

%% @doc Runs Fun once in a process of its own and waits at most TimeoutMs
%% for its value, for a caller that has no helper (the process walks):
%% `{ok, Value}', `timeout' (the process is killed: a call waiting for a
%% held scheduler ends there) or `{error, Text}' (Fun raised). A spawn and
%% a monitor a call.
-spec once(fun(() -> term()), non_neg_integer()) -> {ok, term()} | timeout | {error, binary()}.
once(Fun, TimeoutMs) ->
    Self = self(),
    Ref = make_ref(),
    {Pid, MRef} = spawn_opt(fun() -> Self ! {Ref, run(Fun)} end, [monitor, {priority, high}]),
    receive
        {Ref, Reply} ->
            %% (Its answer comes before its 'DOWN'.)
            erlang:demonitor(MRef, [flush]),
            Reply;
        {'DOWN', MRef, process, Pid, Why} ->
            {error, text(exit, Why)}
    after TimeoutMs ->
        exit(Pid, kill),
        receive
            {'DOWN', MRef, process, Pid, _} -> ok
        end,
        receive
            {Ref, Reply} -> Reply
        after 0 -> timeout
        end
    end.

%% @doc The answer to a request sent with a reply alias (`alias([reply])'),
%% or Default when none came within TimeoutMs. An answer that comes later
%% is dropped by the runtime, not left in the caller's mailbox.
-spec reply(reference(), non_neg_integer(), Default) -> term() | Default.
reply(Alias, TimeoutMs, Default) ->
    receive
        {Alias, Reply} -> Reply
    after TimeoutMs ->
        _ = unalias(Alias),
        receive
            {Alias, Reply} -> Reply
        after 0 -> Default
        end
    end.

%% @doc Runs Fun in the helper without waiting (after any work queued).
-spec cast(probe(), fun(() -> term())) -> ok.
cast({probe, Pid, _}, Fun) ->
    Pid ! {run, none, Fun},
    ok.

%% @doc Stops the helper once its queued work is done; it runs its clean-up
%% funs first. Returns at once.
-spec stop(probe()) -> ok.
stop({probe, Pid, _}) ->
    Pid ! stop,
    ok.

%% @doc The helper's pid (left out of the process walk).
-spec pid(probe()) -> pid().
pid({probe, Pid, _}) ->
    Pid.

%%%===================================================================
%%% Internal
%%%===================================================================

%% @private
-spec init(pid(), atomics:atomics_ref()) -> ok.
init(Owner, Busy) ->
    MRef = erlang:monitor(process, Owner),
    loop(MRef, Busy, []).

loop(MRef, Busy, Cleanups) ->
    receive
        {run, ReplyTo, Fun} ->
            Reply = run(Fun),
            _ = case ReplyTo of
                    none -> ok;
                    _ -> ReplyTo ! {ReplyTo, Reply}
                end,
            atomics:put(Busy, 1, 0),
            loop(MRef, Busy, Cleanups);
        {on_exit, Fun} ->
            loop(MRef, Busy, [Fun | Cleanups]);
        stop ->
            cleanup(Cleanups);
        {'DOWN', MRef, process, _, _} ->
            cleanup(Cleanups)
    end.

run(Fun) ->
    try {ok, Fun()}
    catch Class:Reason -> {error, text(Class, Reason)}
    end.

text(Class, Reason) ->
    iolist_to_binary(io_lib:format("~p:~p", [Class, Reason], [{chars_limit, 200}])).

cleanup(Funs) ->
    _ = [catch F() || F <- Funs],
    ok.
