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
    ?assertEqual(iolist_to_binary(beamdiag_catalogue:markdown()), Doc).

unknown_id_crashes_test() ->
    ?assertError({unknown_finding, nope}, beamdiag_catalogue:entry(nope)).
