%%% @doc Brings a start-walk process report forward with the queue
%%% watch's readings the ticks carried: what a capture cut short keeps of
%%% the queues' growth. Pure; runs on the operator's side, over the report
%%% (`beamdiag_agent_processes:snapshot/1') and the samples a collector
%%% kept.
%%%
%%% Each watched queue's end becomes its latest reading, and its start the
%%% walk's length or, for a process that did not answer the walk, its first
%%% reading; `queue_ms' is the time between the two. An estimated memory
%%% grows with the queue (beamdiag_agent_proc_memory's estimate); a
%%% process the walk could not read takes the estimate from the readings
%%% alone. Samples of earlier agents carry plain lengths (`queues'), read
%%% at the sample's time.
%%%
%%% ```
%%% 1> Snap = #{t_ns => 0, word_bytes => 8, span_ms => 0, partial => start,
%%%             queues => [#{pid => <<"<0.1.0>">>, queue => [10, 10], memory => [2000, 2000],
%%%                          memory_estimated => false}]}.
%%% 2> beamdiag_proc_forward:forward(Snap, [#{t => 2000000000,
%%%        queues => #{<<"<0.1.0>">> => 500}}]).
%%% #{queues => [#{queue => [10,500], ...}], span_ms => 2000, partial => start_and_ticks, ...}
%%% '''
-module(beamdiag_proc_forward).

-export([forward/2]).

-export_type([sample/0]).

%% What forward/2 reads of a sample: a tick's, or an earlier agent's,
%% which had `queues' instead of `queue_reads'.
-type sample() :: #{t := integer(),
                    queue_reads => #{binary() => beamdiag_agent_queues:reading()},
                    queues => #{binary() => non_neg_integer()},
                    atom() => term()}.

%%%===================================================================
%%% API
%%%===================================================================

%% @doc A start-walk report brought forward with the queue watch's
%% readings of the latest sample that has them (Samples newest first, as a
%% collector keeps them), marked `partial => start_and_ticks'; the report
%% as it was when no sample has readings or there are no samples.
-spec forward(beamdiag_agent_processes:report(), [sample()]) -> beamdiag_agent_processes:report().
forward(R = #{queues := Qs}, Samples = [_ | _]) ->
    T0 = case R of
             #{t_ns := TN} when is_integer(TN), TN =/= 0 -> TN;
             _ -> maps:get(t, lists:last(Samples))
         end,
    W = maps:get(word_bytes, R, 8),
    case [S || S = #{queue_reads := _} <- Samples] of
        [#{queue_reads := Reads, t := T} | _] ->
            Qs2 = [entry(E, maps:find(Pid, Reads), T0, W) || E = #{pid := Pid} <- Qs],
            R#{queues := Qs2, span_ms := max(0, (T - T0) div 1000000),
               partial := start_and_ticks};
        [] ->
            case [S || S = #{queues := _} <- Samples] of
                [#{queues := Lengths, t := T} | _] ->
                    SpanMs = max(0, (T - T0) div 1000000),
                    Qs2 = [case maps:find(Pid, Lengths) of
                               {ok, Q1} when is_integer(Q0) ->
                                   memory(E#{queue := [Q0, Q1]}, Q1 - Q0);
                               _ -> E
                           end || E = #{pid := Pid, queue := [Q0, _]} <- Qs],
                    R#{queues := Qs2, span_ms := SpanMs, partial := start_and_ticks};
                [] ->
                    R
            end
    end;
forward(R, _) ->
    R.

%%%===================================================================
%%% Internal
%%%===================================================================

entry(E = #{queue := [Q0, _]}, {ok, #{queue := Q1, t := T1, heap_words := H} = Rd}, T0, W) ->
    {Start, StartT} = case Q0 of
                          _ when is_integer(Q0) -> {Q0, T0};
                          _ -> {maps:get(first, Rd), maps:get(first_t, Rd)}
                      end,
    E2 = E#{queue := [Start, Q1], queue_ms => max(0, (T1 - StartT) div 1000000)},
    case E of
        #{memory := [null, _]} ->
            %% Not read at the start: the estimate from the readings alone.
            M = beamdiag_agent_proc_memory:estimate(H, Q1, W),
            E2#{memory := [null, M], heap_words => H, memory_estimated := true};
        _ ->
            memory(E2, Q1 - Start)
    end;
entry(E, _, _, _) ->
    E.

%% An estimated memory grows with the queue.
memory(E = #{memory_estimated := true, memory := [M0, _]}, Dq) when is_integer(M0) ->
    E#{memory := [M0, beamdiag_agent_proc_memory:grown(M0, Dq)]};
memory(E, _) ->
    E.
