-module(beamdiag_catalogue_tests).
-include_lib("eunit/include/eunit.hrl").

required_ids_test() ->
    Ids = beamdiag_catalogue:ids(),
    [?assert(lists:member(Id, Ids)) || Id <- [busy_wait, cpu_starvation, cpu_throttling,
        scheduler_blocking, high_system_cpu, dirty_cpu_gc, scheduler_imbalance, cpu_saturated,
        schedulers_exceed_cpus]],
    ?assertEqual(length(Ids), length(lists:usort(Ids))).

docs_in_step_test() ->
    File = filename:join([filename:dirname(?FILE), "..", "docs", "FINDINGS.md"]),
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
