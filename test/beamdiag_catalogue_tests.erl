-module(beamdiag_catalogue_tests).
-include_lib("eunit/include/eunit.hrl").

required_ids_test() ->
    Ids = beamdiag_catalogue:ids(),
    [?assert(lists:member(Id, Ids)) || Id <- [busy_wait, cpu_starvation, cpu_throttling,
        scheduler_blocking, high_system_cpu, dirty_cpu_gc, scheduler_imbalance, cpu_saturated,
        schedulers_exceed_cpus]],
    ?assertEqual(length(Ids), length(lists:usort(Ids))).

docs_in_step_test() ->
    File = filename:join([beamdiag_test_lib:top(), "docs", "FINDINGS.md"]),
    {ok, Doc} = file:read_file(File),
    Want = binary:split(iolist_to_binary(beamdiag_catalogue:markdown()), <<"\n">>, [global]),
    Have = binary:split(Doc, <<"\n">>, [global]),
    %% The first line that differs, not two whole documents.
    Diff = [{N, W, H} || {N, W, H} <- lists:zip3(lists:seq(1, min(length(Want), length(Have))),
                                                  lists:sublist(Want, length(Have)),
                                                  lists:sublist(Have, length(Want))), W =/= H],
    ?assertEqual({[], length(Want)}, {lists:sublist(Diff, 1), length(Have)}).

unknown_id_crashes_test() ->
    ?assertError({unknown_finding, nope}, beamdiag_catalogue:entry(nope)).

%% The catalogue shows what users get: on a node at the documented
%% defaults, every fix is the catalogue's text, word for word; the fitted
%% ones are the catalogue's parts (never replaced wholesale).
fix_is_the_catalogue_text_test() ->
    Defaults = maps:from_list([{K, D} || #{key := K, default := D, read := true}
                                             <- beamdiag_flags:table()]),
    Node = Defaults#{otp_release => <<"27">>, bind_type => <<"unbound">>},
    [?assertEqual({Id, maps:get(fix, beamdiag_catalogue:entry(Id))},
                  {Id, beamdiag_fix_text:fix(Id, Node)})
     || Id <- beamdiag_catalogue:ids()],
    Fitted = [Id || Id <- beamdiag_catalogue:ids(),
                    maps:is_key(fitted, beamdiag_catalogue:entry(Id))],
    ?assertEqual(lists:sort([busy_wait, cpu_starvation, cpu_throttling, high_system_cpu,
                             dirty_cpu_gc, scheduler_imbalance, allocator_contention]),
                 lists:sort(Fitted)).

%% A fitted fix keeps the catalogue's words around the parts it fits.
fitted_fix_keeps_the_catalogue_words_test() ->
    Rabbit = #{otp_release => <<"25">>, sbwt => <<"none">>, sbwtdcpu => <<"none">>,
               sbwtdio => <<"none">>, bind_type => <<"thread_no_node_processor_spread">>},
    [begin
         #{fitted := Parts} = beamdiag_catalogue:entry(Id),
         Fix = beamdiag_fix_text:fix(Id, Rabbit),
         [?assertMatch({Id, {_, _}}, {Id, binary:match(Fix, B)}) || B <- Parts, is_binary(B)]
     end || Id <- [busy_wait, cpu_starvation, cpu_throttling, high_system_cpu, dirty_cpu_gc,
                   scheduler_imbalance, allocator_contention]].
