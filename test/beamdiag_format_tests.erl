-module(beamdiag_format_tests).
-include_lib("eunit/include/eunit.hrl").

capture(Name) ->
    beamdiag_test_lib:fixture_capture(Name).

%% The busy_wait capture widened to 128 schedulers: each recorded scheduler
%% thread is cloned under new ids and names, with its wall-time counters.
wide(N) ->
    C = #{samples := Samples, settings := S} = capture("busy_wait"),
    Wide = [widen(X, N) || X <- Samples],
    C#{samples => Wide, settings => S#{schedulers => N, schedulers_online => N,
                                       dirty_cpu_schedulers => 0}}.

widen(Sample = #{threads := Ts, vm := Vm = #{swt := Swt}}, N) ->
    [{_, T1}] = [{Tid, T} || {Tid, T = #{name := <<"1_scheduler">>}} <- maps:to_list(Ts)],
    {1, A, Tot} = lists:keyfind(1, 1, Swt),
    Others = maps:filter(fun(_, #{name := Nm}) ->
                             element(1, beamdiag_threads:classify(Nm)) =/= scheduler andalso
                             element(1, beamdiag_threads:classify(Nm)) =/= dirty_cpu
                         end, Ts),
    Scheds = maps:from_list([{1000000 + I, T1#{name => iolist_to_binary([integer_to_list(I), "_scheduler"])}}
                             || I <- lists:seq(1, N)]),
    Sample#{threads => maps:merge(Others, Scheds),
            vm => Vm#{swt => [{I, A, Tot} || I <- lists:seq(1, N)],
                      run_queues => lists:duplicate(N + 2, 0)}}.

eighty_columns_with_128_schedulers_test() ->
    D = beamdiag:analyse(wide(128)),
    ?assertEqual(128, maps:get(n, maps:get(scheduler, maps:get(by_type, maps:get(ledger, D))))),
    Text = iolist_to_binary(beamdiag_format_text:diagnosis(D, #{colour => false})),
    Lines = binary:split(Text, <<"\n">>, [global]),
    Long = [L || L <- Lines, string:length(L) > 80],
    ?assertEqual([], Long),
    %% By type, not by thread: the report does not grow with the schedulers.
    ?assert(length(Lines) < 80).

text_has_findings_before_ledger_test() ->
    Text = iolist_to_binary(beamdiag_format_text:diagnosis(beamdiag:analyse(capture("busy_wait")),
                                                            #{colour => false})),
    {F, _} = binary:match(Text, <<"FINDINGS">>),
    {L, _} = binary:match(Text, <<"TIME LEDGER">>),
    ?assert(F < L),
    ?assertEqual(nomatch, binary:match(Text, <<"\e[">>)).

colour_only_when_asked_test() ->
    Text = iolist_to_binary(beamdiag_format_text:diagnosis(beamdiag:analyse(capture("busy_wait")),
                                                            #{colour => true})),
    ?assertMatch({_, _}, binary:match(Text, <<"\e[">>)).

json_document_test() ->
    Doc = beamdiag_format_json:document(beamdiag:analyse(capture("busy_wait"))),
    ?assertEqual(<<"beamdiag.diagnosis/1">>, maps:get(schema, Doc)),
    [?assert(maps:is_key(K, Doc)) || K <- [node, otp_release, window_s, threads, totals, findings]],
    [T | _] = maps:get(threads, Doc),
    [?assert(maps:is_key(K, T)) || K <- [name, type, scheduler_id, busy, on_cpu, user, sys, runq,
                                          off_cpu, spin, blocked]],
    [#{id := busy_wait} | _] = maps:get(findings, Doc),
    %% Encodes, and the settings never carry the emulator's argument vector.
    Json = iolist_to_binary(beamdiag_format_json:diagnosis(beamdiag:analyse(capture("busy_wait")))),
    ?assertEqual(nomatch, binary:match(Json, <<"setcookie">>)).

%% A diagnosis made now says how long after the call it was ready, in the
%% JSON (seconds) and in the text header; one re-read from a capture does
%% not.
ready_time_test() ->
    D = beamdiag:analyse(capture("busy_wait")),
    ?assertNot(maps:is_key(ready_s, beamdiag_format_json:document(D))),
    ?assertEqual(7.56, maps:get(ready_s, beamdiag_format_json:document(D#{ready_ms => 7560}))),
    Text = fun(X) -> iolist_to_binary(beamdiag_format_text:diagnosis(X, #{colour => false})) end,
    ?assertEqual(nomatch, binary:match(Text(D), <<"after the call">>)),
    ?assertMatch({_, _}, binary:match(Text(D#{ready_ms => 7560}), <<", ready 7.6 s after the call">>)).

%% The microstates note fits the node: restart with -emu_type lcnt where
%% the lock-counting emulator (extra states) is installed beside the stock
%% one, build it where it is not.
msacc_note_fits_the_node_test() ->
    C = #{settings := S} = capture("busy_wait"),
    Text = fun(Installed) ->
        D = beamdiag:analyse(C#{settings => S#{lcnt_emulator_installed => Installed}}),
        iolist_to_binary(beamdiag_format_text:diagnosis(D, #{colour => false}))
    end,
    With = Text(true),
    Without = Text(false),
    ?assertMatch({_, _}, binary:match(With, <<"default states only">>)),
    ?assertMatch({_, _}, binary:match(With, <<"restart the\n  node with -emu_type lcnt">>)),
    ?assertEqual(nomatch, binary:match(With, <<"beamdiag emu-type build --install\n">>)),
    ?assertMatch({_, _}, binary:match(Without, <<"beamdiag emu-type build --install\n">>)).

%% A saved capture read back keeps as binaries the msacc state names this VM
%% has no atom for (the lock-counting emulator's alloc and timers): the text
%% report prints them (it crashed on them).
msacc_state_names_as_binaries_test() ->
    D = #{ledger := L = #{msacc := M = #{by_type := ByType}}} = beamdiag:analyse(capture("busy_wait")),
    ByType2 = maps:map(fun(_, R = #{shares := S}) -> R#{shares => S#{<<"alloc">> => 0.25}} end, ByType),
    Text = iolist_to_binary(beamdiag_format_text:diagnosis(D#{ledger := L#{msacc := M#{by_type := ByType2}}},
                                                            #{colour => false})),
    ?assertNotEqual(nomatch, binary:match(Text, <<"alloc 25.0%">>)).
