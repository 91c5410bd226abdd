%%% EUnit tests of the agent on this node: microstate accounting stays off
%%% until the slice at the end of the window, only the slice's samples carry
%%% its counters, and the flag is back as it was found afterwards.
-module(beamdiag_agent_tests).

-include_lib("eunit/include/eunit.hrl").

msacc_slice_test_() ->
    {timeout, 30, [
        {"msacc covers the end of the window only", fun slice/0},
        {"msacc already on: every sample carries it, and it stays on", fun already_on/0},
        {"slice longer than the window: the whole window", fun whole/0}
    ]}.

slice() ->
    false = erlang:system_flag(microstate_accounting, false),
    Self = self(),
    %% A watcher reads the flag while the window runs (reading it means
    %% setting it, so it puts back what it read at once).
    Watcher = spawn_link(fun() -> Self ! {flags, watch([])} end),
    {ok, D} = beamdiag:diagnose(#{duration => 1.6, interval => 200, msacc_span => 0.4,
                                  locks => false}),
    Watcher ! stop,
    Flags = receive {flags, F} -> F after 5000 -> error(no_watcher) end,
    #{capture := #{samples := Samples}, ledger := #{msacc := M, window_s := W}} = D,
    With = [S || S = #{vm := #{msacc := [_ | _]}} <- Samples],
    ?assertEqual(false, has_msacc(hd(Samples))),
    ?assert(has_msacc(lists:last(Samples))),
    %% 0.4 s of 1.6 s at 200 ms ticks: the last three samples.
    ?assert(length(With) >= 3 andalso length(With) =< 4),
    #{span_s := Span, by_type := #{scheduler := _}} = M,
    ?assert(Span >= 0.35 andalso Span =< 0.75),
    ?assert(W > 1.4),
    %% Off for the first part of the window, on at its end, off afterwards.
    ?assertEqual(false, hd(Flags)),
    ?assert(lists:member(true, Flags)),
    ?assertNot(erlang:system_flag(microstate_accounting, false)).

already_on() ->
    _ = erlang:system_flag(microstate_accounting, true),
    try
        {ok, D} = beamdiag:diagnose(#{duration => 0.6, interval => 200, msacc_span => 0.2,
                                      locks => false}),
        #{capture := #{samples := Samples}, ledger := #{msacc := #{span_s := Span}, window_s := W}} = D,
        ?assert(lists:all(fun has_msacc/1, Samples)),
        ?assert(abs(Span - W) < 1.0e-6),
        ?assert(erlang:system_flag(microstate_accounting, true))
    after
        erlang:system_flag(microstate_accounting, false)
    end.

whole() ->
    {ok, D} = beamdiag:diagnose(#{duration => 0.6, interval => 200, msacc_span => 5,
                                  locks => false}),
    #{capture := #{samples := Samples}, ledger := #{msacc := #{span_s := Span}, window_s := W}} = D,
    ?assert(lists:all(fun has_msacc/1, Samples)),
    ?assert(abs(Span - W) < 1.0e-6),
    ?assertNot(erlang:system_flag(microstate_accounting, false)).

has_msacc(#{vm := #{msacc := [_ | _]}}) -> true;
has_msacc(_) -> false.

watch(Acc) ->
    receive
        stop -> lists:reverse(Acc)
    after 50 ->
        Was = erlang:system_flag(microstate_accounting, true),
        _ = erlang:system_flag(microstate_accounting, Was),
        watch([Was | Acc])
    end.
