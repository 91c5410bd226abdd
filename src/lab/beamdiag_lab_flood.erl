%%% @doc Lab scenario `mailbox_flood': a mailbox that floods, and its
%%% workload.
%%%
%%% Eight producers send small messages to one registered consumer as fast
%%% as they can; the consumer takes one message a millisecond. The queue
%%% grows by hundreds of thousands of messages a second, which is what makes
%%% `process_info(P, memory)' (it walks the whole queue) stall a caller.
%%%
%%% The flood is capped for a shared machine: the producers count what they
%%% sent and the consumer what it took (one `atomics' array), and every
%%% producer pauses while the queue is above `?CAP' messages (about 112
%%% bytes each on OTP 25: about 1.6 GB; the queue grows for about ten seconds at this machine's 1 to 1.5 million messages a second). The workers end at the workload's time bound,
%%% and with the node when the lab stops.
%%%
%%% ```
%%% 1> {ok, Lab} = beamdiag_lab:start(mailbox_flood, #{duration => 60}).
%%% 2> beamdiag:diagnose(beamdiag_lab:node(Lab), #{cookie => beamdiag_lab:cookie(Lab)}).
%%% 3> beamdiag_lab:stop(Lab).
%%% '''
-module(beamdiag_lab_flood).

-export([scenarios/0]).
%% Workloads, called on the lab node.
-export([flood/3]).
%% Lab workloads: run on the lab node from the scenario's `load' MFA.
-ignore_xref([{flood, 3}]).

-define(CONSUMER, beamdiag_lab_flooded).
%% The queue's bound, in messages; producers pause above it.
-define(CAP, 14000000).
%% Sends between two looks at the counters.
-define(BATCH, 1000).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The flood scenario.
-spec scenarios() -> [beamdiag_lab:scenario()].
scenarios() ->
    [#{name => mailbox_flood,
       summary => <<"eight producers flood one consumer that takes a message a millisecond "
                    "(capped at 14M queued messages, about 1.6 GB)">>,
       emu_args => ["+S", "2:2"], load => {?MODULE, flood, ['$duration_ms', 8, ?CAP]},
       modules => [beamdiag_lab_ledger],
       warmup_ms => 500,
       expect => [message_queue_growth]}].

%% @doc A registered consumer that takes one message a millisecond, and N
%% producers that send to it as fast as they can while its queue holds
%% fewer than Cap messages.
-spec flood(pos_integer(), pos_integer(), pos_integer()) -> ok.
flood(Ms, N, Cap) ->
    beamdiag_lab_ledger:owner(Ms, fun() ->
        %% 1: messages sent, 2: messages taken.
        Counts = atomics:new(2, [{signed, false}]),
        persistent_term:put({?MODULE, counts}, Counts),
        C = spawn_link(fun() -> consumer(Counts) end),
        true = register(?CONSUMER, C),
        [C | [spawn_link(fun() -> producer(C, Counts, Cap) end) || _ <- lists:seq(1, N)]]
    end).

%%%===================================================================
%%% Internal
%%%===================================================================

consumer(Counts) ->
    receive
        _ ->
            atomics:add(Counts, 2, 1),
            receive
            after 1 -> ok
            end
    end,
    consumer(Counts).

producer(C, Counts, Cap) ->
    case atomics:get(Counts, 1) - atomics:get(Counts, 2) >= Cap of
        true ->
            receive
            after 50 -> ok
            end;
        false ->
            send(C, ?BATCH),
            atomics:add(Counts, 1, ?BATCH)
    end,
    producer(C, Counts, Cap).

send(_C, 0) ->
    ok;
send(C, I) ->
    C ! {item, I},
    send(C, I - 1).
