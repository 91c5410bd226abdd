%%% EUnit tests of the profile session's own steps, on recorded perf output
%%% (test/fixtures/perf) and on this VM: the rules' one run over the fold,
%%% the Erlang callers kept beside it or their error said, the advice for
%%% a missing perf map by the node's +JPperf flag, and a real Erlang-level
%%% profile of this node.
-module(beamdiag_profile_tests).
-include_lib("eunit/include/eunit.hrl").

fold(Name) ->
    {ok, P} = beamdiag_fold:fold_file(beamdiag_test_lib:fixture(filename:join("perf", Name)), #{}),
    P.

%% The recorded atom-decoding capture: the rules run once over it, and
%% find what the profile rules find over the same fold; with `rules =>
%% false' (a diagnosis runs them with its other rules) none run.
findings_once_test() ->
    P = fold("dwarf_atom_decode.txt"),
    R = #{profile => P, method => perf},
    #{findings := F} = beamdiag_profile:with_findings(R, #{}),
    ?assertEqual(beamdiag_profile_rules:findings(P, #{}), F),
    ?assertMatch([#{id := hot_function} | _], F),
    ?assertEqual(R, beamdiag_profile:with_findings(R, #{rules => false})).

%% The sampler's stacks are folded beside the perf profile; a sampler that
%% failed leaves its error in words, and none leaves the result as it is.
callers_test() ->
    Stacks = #{[<<"erlang">>, <<"app:work/1">>, <<"lists:map/2">>] => 30,
               [<<"erlang">>, <<"app:idle/0">>] => 10},
    #{callers := C} = beamdiag_profile:with_callers({ok, #{stacks => Stacks}}, #{}),
    ?assertEqual(beamdiag_fold:from_counts(Stacks), C),
    ?assertEqual(#{a => 1}, beamdiag_profile:with_callers(none, #{a => 1})),
    #{callers_error := E} = beamdiag_profile:with_callers(
                              {error, {beamdiag_profile, {remote, exit, timeout}}}, #{}),
    ?assertEqual(<<"the sampler failed on the target: exit:timeout">>, E).

%% A node that asked for a perf map and has none (a container's own /tmp)
%% is pointed at the folder; one that did not ask is told the flag.
map_advice_test() ->
    [?assertMatch({_, _}, binary:match(iolist_to_binary(beamdiag_profile:map_advice(F)),
                                       <<"+JPperfdirectory">>)) || F <- [<<"true">>, <<"map">>]],
    [?assertEqual(<<"; start the node with +JPperf true">>,
                  iolist_to_binary(beamdiag_profile:map_advice(F))) || F <- [<<"false">>, none]].

pid_text_test() ->
    ?assertEqual(<<"OS process 48213">>,
                 iolist_to_binary(beamdiag_profile:pid_text(48213, #{ns_pid => 48213}))),
    ?assertEqual(<<"OS process 48213 (7 in its own PID namespace)">>,
                 iolist_to_binary(beamdiag_profile:pid_text(48213, #{ns_pid => 7}))).

format_error_test() ->
    ?assertEqual(<<"cannot load the sampler: no such file or directory">>,
                 iolist_to_binary(beamdiag_profile:format_error(
                                    {sampler_load, node(), {file, enoent}}))).

%% An Erlang-level profile of this VM while a process of the test burns a
%% loop of its own: the burner's function is in the profile, the rules ran
%% over it, and the progress line went to the log.
erlang_profile_of_this_node_test_() ->
    {timeout, 30, fun() ->
        Burner = spawn(fun Spin() -> _ = lists:seq(1, 1000), Spin() end),
        Log = self(),
        try
            {ok, R} = beamdiag_profile:profile(node(), #{erlang => true, duration => 1},
                                               fun(T) -> Log ! {log, iolist_to_binary(T)} end),
            #{method := erlang, profile := P, findings := F, sampler := S} = R,
            ?assert(is_list(F)),
            ?assertNot(maps:is_key(stacks, S)),
            Text = iolist_to_binary(io_lib:format("~p", [P])),
            ?assertMatch({_, _}, binary:match(Text, <<"erlang_profile_of_this_node_test_">>)),
            receive {log, L} -> ?assertMatch({_, _}, binary:match(L, <<"sampling Erlang stacks">>))
            after 0 -> ?assert(false)
            end
        after
            exit(Burner, kill)
        end
    end}.
