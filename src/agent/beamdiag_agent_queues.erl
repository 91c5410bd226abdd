%%% @doc The queue watch: the queue lengths of a few processes (the
%%% longest queues at the window's start, and those that did not answer
%%% the start walk), read all through the window without ever making a
%%% tick wait. Runs on the target node (erts, kernel and stdlib only).
%%%
%%% A flooded process answers a read of its queue only between its garbage
%%% collections (see beamdiag_agent_pinfo), which take seconds when its
%%% heap holds millions of messages: a read made for a tick and cut at the
%%% tick's deadline may never get an answer in a whole window. So each
%%% watched process has a reader of its own that asks, waits as long as it
%%% takes, writes the answer and the time it came into an `atomics' array,
%%% and asks again `period_ms' later. A tick reads the array: constant
%%% time, one read a slot, whatever the processes do. Each entry keeps the
%%% first answer and the latest, with their times, so the growth is
%%% measured between two real answers.
%%%
%%% Each reader reads `message_queue_len' and `heap_size' (neither walks
%%% the queue); the readers are linked to the process that started them and
%%% are killed by `stop/1' (or die with it).
%%%
%%% ```
%%% 1> W = beamdiag_agent_queues:start([whereis(code_server)], #{}).
%%% 2> beamdiag_agent_queues:read(W).
%%% #{<<"<0.50.0>">> => #{queue => 0, heap_words => 4185, t => ..., first => ..., first_t => ...}}
%%% 3> beamdiag_agent_queues:stop(W).
%%% '''
-module(beamdiag_agent_queues).

-export([start/2, read/1, stop/1, readers/1]).

-export_type([watch/0, reading/0]).

-opaque watch() :: {queues, [{pid(), binary(), pos_integer()}], atomics:atomics_ref(), [pid()]}.
%% Times are monotonic nanoseconds, the clock of the agent's samples.
-type reading() :: #{queue := non_neg_integer(), heap_words := non_neg_integer(),
                     t := integer(), first := non_neg_integer(), first_t := integer()}.

%% Slots a watched process: the latest queue, heap and time, the first
%% queue and time, the answers so far.
-define(SLOTS, 6).
-define(PERIOD_MS, 100).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Starts a reader for each process (at most a few: the caller
%% bounds the list). Options: `period_ms' (default 100).
-spec start([pid()], #{period_ms => pos_integer()}) -> watch().
start(Pids0, Opts) ->
    Pids = lists:usort(Pids0),
    Period = maps:get(period_ms, Opts, ?PERIOD_MS),
    A = atomics:new(max(1, ?SLOTS * length(Pids)), [{signed, true}]),
    Slots = [{P, list_to_binary(pid_to_list(P)), I} || {I, P} <- lists:enumerate(Pids)],
    Readers = [spawn_opt(fun() -> reader(P, A, (I - 1) * ?SLOTS, Period) end,
                         [link, {priority, high}])
               || {P, _, I} <- Slots],
    {queues, Slots, A, Readers}.

%% @doc The readings so far, by pid text; a process not answered yet is
%% left out.
-spec read(watch()) -> #{binary() => reading()}.
read({queues, Slots, A, _}) ->
    maps:from_list(
      [{Text, #{queue => atomics:get(A, B + 1), heap_words => atomics:get(A, B + 2),
                t => atomics:get(A, B + 3), first => atomics:get(A, B + 4),
                first_t => atomics:get(A, B + 5)}}
       || {_, Text, I} <- Slots,
          B <- [(I - 1) * ?SLOTS],
          atomics:get(A, B + 6) > 0]).

%% @doc The readers' pids (left out of the process walks).
-spec readers(watch()) -> [pid()].
readers({queues, _, _, Readers}) ->
    Readers.

%% @doc Ends the readers (one waiting for a process's answer ends too).
-spec stop(watch()) -> ok.
stop({queues, _, _, Readers}) ->
    _ = [begin unlink(R), exit(R, kill) end || R <- Readers],
    ok.

%%%===================================================================
%%% Internal
%%%===================================================================

reader(P, A, B, Period) ->
    case erlang:process_info(P, [message_queue_len, heap_size]) of
        [{message_queue_len, Q}, {heap_size, H}] ->
            T = erlang:monotonic_time(nanosecond),
            _ = case atomics:get(A, B + 6) of
                    0 ->
                        atomics:put(A, B + 4, Q),
                        atomics:put(A, B + 5, T);
                    _ ->
                        ok
                end,
            atomics:put(A, B + 1, Q),
            atomics:put(A, B + 2, H),
            atomics:put(A, B + 3, T),
            atomics:add(A, B + 6, 1),
            receive
            after Period -> ok
            end,
            reader(P, A, B, Period);
        undefined ->
            ok
    end.
