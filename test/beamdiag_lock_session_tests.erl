%%% EUnit tests of the lock reader's side that needs no lock-counting
%%% emulator: a node that does not count locks (this one, on the plain
%%% emulator) or cannot be reached gives `none' at once, bad options
%%% crash, `data/2' returns the reader's answer, says when the reader is
%%% gone or silent, and the sentences. The readings of a counting node are
%%% tested in beamdiag_locks_SUITE, which starts one.
-module(beamdiag_lock_session_tests).

-include_lib("eunit/include/eunit.hrl").

-define(OPTS, #{window_ms => 500, ready_by => infinity}).

lock_session_test_() ->
    [{timeout, 30, T} || T <- [
        {"this node", fun this_node/0},
        {"a node that cannot be reached: none, at once", fun unreachable/0},
        {"bad options crash", fun bad_options/0},
        {"data/2 returns the reader's answer", fun data_answered/0},
        {"data/2 waits for the reader's answer past its own wait", fun data_late/0},
        {"data/2: the reader gone", fun data_gone/0},
        {"data/2: a reader that never answers", fun data_silent/0},
        {"sentences", fun sentences/0}
    ]].

this_node() ->
    T0 = erlang:monotonic_time(millisecond),
    R = beamdiag_lock_session:start(node(), ?OPTS),
    case erlang:system_info(lock_counting) of
        false ->
            ?assertEqual(none, R),
            %% The node said so: no wait for the start's bound (1 s).
            ?assert(erlang:monotonic_time(millisecond) - T0 < 1000);
        true ->
            %% Run on the lock-counting emulator: the readings come.
            {ok, L} = R,
            {ok, Data} = beamdiag_lock_session:data(L, infinity),
            ?assert(is_map(Data))
    end.

unreachable() ->
    %% This node is not distributed: the call fails at once.
    T0 = erlang:monotonic_time(millisecond),
    ?assertEqual(none, beamdiag_lock_session:start('nobody@nowhere.invalid', ?OPTS)),
    ?assert(erlang:monotonic_time(millisecond) - T0 < 1000).

bad_options() ->
    ?assertError(function_clause, beamdiag_lock_session:start(node(), #{window_ms => 0,
                                                                        ready_by => infinity})),
    ?assertError(function_clause, beamdiag_lock_session:start(node(), #{window_ms => 1.5,
                                                                        ready_by => infinity})),
    ?assertError(function_clause, beamdiag_lock_session:start(node(), #{window_ms => 500})).

%% A reader speaks the session's protocol: `{data, From, Tag, Until}',
%% answered `{Tag, Reply}'.
data_answered() ->
    _ = mailbox(),
    Data = #{window_s => 1.0, locks => []},
    Reader = reader(fun(From, Tag, Until) -> From ! {Tag, {ok, Data#{until => Until}}} end),
    T0 = erlang:monotonic_time(millisecond),
    {ok, Got} = beamdiag_lock_session:data(Reader, 2000),
    %% The deadline handed over is the caller's wait, from its call.
    #{until := Until} = Got,
    ?assert(Until >= T0 + 2000 andalso Until =< erlang:monotonic_time(millisecond) + 2000),
    ?assertEqual(Data, maps:remove(until, Got)),
    ?assertEqual(infinity, until(beamdiag_lock_session:data(Reader, infinity))),
    %% Nothing of the exchange is left behind.
    ?assertEqual([], mailbox()).

data_late() ->
    %% A reading that ends past the wait (up to a reading's bound, 0.8 s,
    %% later) is still taken.
    Reader = reader(fun(From, Tag, _) ->
                            receive after 300 -> ok end,
                            From ! {Tag, {error, {beamdiag_lock_session, no_reading}}}
                    end),
    ?assertEqual({error, {beamdiag_lock_session, no_reading}},
                 beamdiag_lock_session:data(Reader, 0)).

data_gone() ->
    _ = mailbox(),
    {Dead, MRef} = spawn_monitor(fun() -> ok end),
    receive {'DOWN', MRef, process, Dead, _} -> ok end,
    ?assertEqual({error, {beamdiag_lock_session, {gone, noproc}}},
                 beamdiag_lock_session:data(Dead, 1000)),
    Crashing = reader(fun(_, _, _) -> exit(boom) end),
    ?assertEqual({error, {beamdiag_lock_session, {gone, boom}}},
                 beamdiag_lock_session:data(Crashing, 1000)),
    ?assertEqual([], mailbox()).

data_silent() ->
    _ = mailbox(),
    Silent = spawn(fun() -> receive stop -> ok end end),
    T0 = erlang:monotonic_time(millisecond),
    ?assertEqual({error, {beamdiag_lock_session, no_answer}},
                 beamdiag_lock_session:data(Silent, 0)),
    %% The wait and a reading's bound (0.8 s), no less.
    ?assert(erlang:monotonic_time(millisecond) - T0 >= 800),
    Silent ! stop,
    ?assertEqual([], mailbox()).

sentences() ->
    ?assertEqual(<<"no reading of the lock counters came back in time (each waited at most "
                   "0.8 s)">>, text(no_reading)),
    ?assertEqual(<<"only the reading at the start came back in time">>,
                 text({baseline_only, #{}})),
    ?assertEqual(<<"the lock reader did not answer">>, text(no_answer)),
    ?assertEqual(<<"the lock reader ended (killed)">>, text({gone, killed})).

%%% Helpers

%% Answers every request until it is killed or its answer ends it.
reader(Answer) ->
    spawn(fun() -> serve(Answer) end).

serve(Answer) ->
    receive {data, From, Tag, Until} -> Answer(From, Tag, Until) end,
    serve(Answer).

until({ok, #{until := U}}) -> U.

text(Reason) ->
    iolist_to_binary(beamdiag_lock_session:format_error(Reason)).

mailbox() ->
    receive M -> [M | mailbox()] after 0 -> [] end.
