%%% EUnit tests of a start-walk report brought forward with the queue
%%% watch's readings: the walk's start length and the latest reading, over
%%% the time between them; a process the walk could not read takes its
%%% first reading as its start; samples of earlier agents carry plain
%%% lengths.
-module(beamdiag_proc_forward_tests).

-include_lib("eunit/include/eunit.hrl").

-define(T0, 1000000000).

forward_test() ->
    Reads = #{<<"<0.1.0>">> => #{queue => 5100, heap_words => 10, t => ?T0 + 2000000000,
                                 first => 200, first_t => ?T0 + 100000000},
              <<"<0.2.0>">> => #{queue => 9000, heap_words => 1000, t => ?T0 + 3000000000,
                                 first => 1000, first_t => ?T0 + 1000000000}},
    Samples = [#{t => ?T0 + 3000000000, queue_reads => Reads}, #{t => ?T0}],
    #{queues := [A, B], span_ms := 3000, partial := start_and_ticks} =
        beamdiag_proc_forward:forward(snapshot(), Samples),
    ?assertMatch(#{queue := [100, 5100], queue_ms := 2000, memory := [11200, 571200]}, A),
    ?assertMatch(#{queue := [1000, 9000], queue_ms := 2000, memory := [null, 1016000],
                   heap_words := 1000, memory_estimated := true}, B).

%% Samples of an earlier agent: plain lengths at the sample's time.
old_samples_test() ->
    Old = [#{t => ?T0 + 2000000000, queues => #{<<"<0.1.0>">> => 300}}, #{t => ?T0}],
    #{queues := [A, B], span_ms := 2000, partial := start_and_ticks} =
        beamdiag_proc_forward:forward(snapshot(), Old),
    ?assertMatch(#{queue := [100, 300], memory := [11200, 33600]}, A),
    %% Not read at the start and no reading: as it was.
    ?assertMatch(#{queue := [null, null]}, B).

%% The latest sample with readings counts; a memory that was read, not
%% estimated, stays as read.
latest_and_read_memory_test() ->
    Snap = (snapshot())#{queues => [#{pid => <<"<0.1.0>">>, queue => [100, 100],
                                      memory => [5000, 5000], memory_estimated => false}]},
    R = fun(Q, T) -> #{<<"<0.1.0>">> => #{queue => Q, heap_words => 10, t => T,
                                          first => 100, first_t => ?T0}} end,
    Samples = [#{t => ?T0 + 4000000000},
               #{t => ?T0 + 3000000000, queue_reads => R(700, ?T0 + 3000000000)},
               #{t => ?T0 + 1000000000, queue_reads => R(200, ?T0 + 1000000000)},
               #{t => ?T0}],
    #{queues := [A], span_ms := 3000} = beamdiag_proc_forward:forward(Snap, Samples),
    ?assertEqual(#{pid => <<"<0.1.0>">>, queue => [100, 700], queue_ms => 3000,
                   memory => [5000, 5000], memory_estimated => false}, A).

%% No samples, or none with readings: the report as it was.
unchanged_test() ->
    Snap = snapshot(),
    ?assertEqual(Snap, beamdiag_proc_forward:forward(Snap, [])),
    ?assertEqual(Snap, beamdiag_proc_forward:forward(Snap, [#{t => ?T0 + 1000}, #{t => ?T0}])),
    NoQueues = #{span_ms => 0},
    ?assertEqual(NoQueues, beamdiag_proc_forward:forward(NoQueues, [#{t => ?T0}])).

%% A report without its walk's time counts from the oldest sample.
no_walk_time_test() ->
    Snap = maps:remove(t_ns, snapshot()),
    Samples = [#{t => ?T0 + 5000000000, queues => #{<<"<0.1.0>">> => 100}}, #{t => ?T0}],
    ?assertMatch(#{span_ms := 5000}, beamdiag_proc_forward:forward(Snap, Samples)).

%% A recorded window (a RabbitMQ queue backing up): its report's queues
%% as the start walk saw them, and its samples (newest first, as a
%% collector keeps them), the newest carrying the watch's reading of the
%% queue that grew: that queue's end is the reading, over the window.
capture_test() ->
    #{samples := Oldest, extras := #{procs := #{queues := Recorded}}} =
        beamdiag_test_lib:fixture_capture("rabbitmq_backlog"),
    [Newest | _] = Samples0 = lists:reverse(Oldest),
    #{t := T0} = lists:last(Samples0),
    #{t := T1} = Newest,
    Start = [E#{queue := [Q0, Q0], memory := [M0, M0], memory_estimated => Est}
             || {E = #{queue := [Q0, _], memory := [M0, _]}, Est} <- lists:zip(Recorded,
                                                                              [true, false])],
    [#{pid := Grew, queue := [_, Q1]}, #{pid := Other}] = Recorded,
    Snap = #{span_ms => 0, t_ns => T0, word_bytes => 8, partial => start, queues => Start},
    Reading = #{queue => Q1, heap_words => 100, t => T1, first => 0, first_t => T0},
    Samples = [Newest#{queue_reads => #{Grew => Reading}} | tl(Samples0)],
    #{queues := [A, B], span_ms := Span, partial := start_and_ticks} =
        beamdiag_proc_forward:forward(Snap, Samples),
    ?assertEqual((T1 - T0) div 1000000, Span),
    ?assert(Span > 3000),
    [#{queue := [Q0a, _], memory := [M0a, _]} | _] = Start,
    ?assertMatch(#{pid := Grew, queue := [Q0a, Q1], queue_ms := Span}, A),
    ?assertEqual([M0a, M0a + (Q1 - Q0a) * 112], maps:get(memory, A)),
    %% No reading for the other: as the start walk saw it.
    ?assertEqual(lists:nth(2, Start), B),
    ?assertEqual(Other, maps:get(pid, B)).

snapshot() ->
    #{span_ms => 0, t_ns => ?T0, word_bytes => 8, partial => start,
      queues => [#{pid => <<"<0.1.0>">>, queue => [100, 100], memory => [11200, 11200],
                   memory_estimated => true},
                 #{pid => <<"<0.2.0>">>, queue => [null, null], memory => [null, null],
                   memory_estimated => true, answered => false}]}.
