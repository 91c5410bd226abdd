%%% EUnit tests of the exit codes: every error reason of every module
%%% (walked from the clauses of its format_error/1) maps to the README's
%%% code, every command reports errors through that one mapping and lists
%%% the codes it can return in its help.
-module(beamdiag_exit_codes_tests).

-include_lib("eunit/include/eunit.hrl").

%% The README: 2 usage (bad arguments, bad node name, no cookie), 3 the
%% node cannot be reached, 4 the run failed.
usage_reasons() ->
    [
        {beamdiag_cli, {unknown_option, "--x"}},
        {beamdiag_cli, {missing_value, "--duration"}},
        {beamdiag_cli, {bad_value, "--duration", "x", "not a number"}},
        {beamdiag_cli, {missing_argument, "NODE"}},
        {beamdiag_cli, {extra_argument, "y"}},
        {beamdiag_node_name, {bad_node, "no-at-sign"}},
        {beamdiag_remote, no_cookie},
        {beamdiag_remote, {bad_cookie, {length, 300}}},
        {beamdiag_remote, {bad_cookie, not_utf8}},
        {beamdiag_remote, {cookie_file, "/nonexistent", enoent}},
        {beamdiag_lab, {unknown_scenario, "nope", [busy_wait]}},
        {beamdiag_lab, {bad_variation, ets_hot, "threads=3", [writers]}},
        {beamdiag_lab, {bad_variation, ets_hot, writers, 0, [writers]}},
        {beamdiag_experiment, {unknown_lab, "nope"}},
        {beamdiag_experiment, {bad_workload, "nope"}},
        {beamdiag_experiment, {no_module, "nope"}},
        {beamdiag_experiment, {no_function, "lists", "nope"}},
        {beamdiag_experiment, {bad_variant, "+nope"}},
        {beamdiag_cluster, {too_many_nodes, 600, 500}},
        {beamdiag_cluster, {bad_line, "nodes.txt", 3, <<"no-at-sign">>}},
        {beamdiag_cluster, {no_nodes, "nodes.txt"}},
        {beamdiag_cluster, {nodes_file, "nodes.txt", enoent}}
    ].

unreachable_reasons() ->
    [
        {beamdiag_remote, {no_distribution, {{shutdown, {failed_to_start_child, net_kernel,
                                                         {'EXIT', nodistribution}}},
                                             {child, undefined, net_sup_dynamic,
                                              {erl_distribution, start_link,
                                               [[x@localhost, longnames], false, net_sup_dynamic]},
                                              permanent, false, 1000, supervisor,
                                              [erl_distribution]}}}},
        {beamdiag_remote, {unreachable, 'a@127.0.0.1', not_registered, ["b", "c"]}},
        {beamdiag_remote, {unreachable, 'a@127.0.0.1', no_epmd}},
        {beamdiag_remote, {unreachable, 'a@127.0.0.1', refused}},
        {beamdiag_remote, {unreachable, 'a@127.0.0.1', {no_answer, 10000}}},
        {beamdiag_remote, {unreachable, 'a@127.0.0.1',
                           {wrong_cookie, [{{file, <<"/c">>}, <<"sha256:00000000">>}]}}},
        {beamdiag_remote, {unreachable, 'a@127.0.0.1', {port_closed, {127, 0, 0, 1}, 4000}}},
        {beamdiag_remote, {unreachable, 'a@127.0.0.1',
                           {tls, {tls_alert, {certificate_required, "required\n"}}}}},
        {beamdiag_remote, {unreachable, 'a@127.0.0.1',
                           {tls_options, {beamdiag_attach_plan, {unreadable_tls_file, keyfile, "/k",
                                                            eacces}}}}},
        {beamdiag_remote, {unreachable, 'a@127.0.0.1', {speaks_tls, 4000}}},
        {beamdiag_remote, {unreachable, 'a@127.0.0.1', {speaks_plain, 4000}}},
        {beamdiag_remote, {unreachable, 'a@127.0.0.1', {not_distribution, 22}}},
        {beamdiag_remote, {unreachable, 'a@127.0.0.1', {status, <<"not_allowed">>}}},
        {beamdiag_remote, {unreachable, 'a@127.0.0.1', {no_port, ["b"]}}},
        {beamdiag_remote, {unreachable, 'a@127.0.0.1', {unknown_name, ["b"]}}},
        {beamdiag_remote, {own_dist, 'a@127.0.0.1', [{"-proto_dist", ["inet_tls"]},
                                                     {"-ssl_dist_optfile", []}]}},
        {beamdiag_remote, {own_mode, 'a@127.0.0.1', longnames}},
        {beamdiag, {host_only, {beamdiag_remote, {unreachable, 'a@127.0.0.1', {speaks_tls, 1}}},
                    #{}}},
        {beamdiag_cluster, {members, 'a@127.0.0.1', {error, {erpc, noconnection}}}},
        {beamdiag, {elsewhere, "db1", {unreachable, 'a@db1', {no_answer, 10000}}}}
    ].

expected(Reason) ->
    case {lists:member(Reason, usage_reasons()), lists:member(Reason, unreachable_reasons())} of
        {true, _} -> 2;
        {_, true} -> 3;
        _ -> 4
    end.

named_reasons_test_() ->
    [?_assertEqual({R, expected(R)}, {R, beamdiag_cli:exit_code(R)})
     || R <- usage_reasons() ++ unreachable_reasons()].

%% Every clause of every format_error/1 in the application, its pattern
%% turned into a term (each variable an atom): all that are not named above
%% as usage or unreachable are run failures, 4. A reason added to any
%% module is walked here without a change to this test.
%% It parses every module's source: seconds on a loaded host, past
%% EUnit's default 5 s.
every_reason_test_() ->
    {timeout, 60, fun every_reason/0}.

every_reason() ->
    Reasons = all_reasons(),
    ?assert(length(Reasons) > 80),
    Named = usage_reasons() ++ unreachable_reasons(),
    Wrong = [{R, Code, Want}
             || R <- Reasons,
                Want <- [case lists:any(fun(N) -> same_clause(N, R) end, Named) of
                             true -> expected(hd([N || N <- Named, same_clause(N, R)]));
                             false -> 4
                         end],
                Code <- [beamdiag_cli:exit_code(R)], Code =/= Want],
    ?assertEqual([], Wrong).

%% An unreachable node is one line on standard error, then its code.
unreachable_is_one_line_test_() ->
    [?_test(begin
                {Code, Err} = fail(R),
                ?assertEqual(3, Code),
                [Line] = binary:split(Err, <<"\n">>, [global, trim]),
                ?assertMatch(<<"beamdiag: ", _/binary>>, Line)
            end) || R <- unreachable_reasons()].

%% Every command's help lists the codes its spec declares, with their
%% meaning; every command can fail on usage (2) and succeed (0).
help_lists_exit_codes_test_() ->
    [?_test(begin
                #{exit_codes := Codes} = Mod:spec(),
                ?assert(lists:member(0, Codes) andalso lists:member(2, Codes)),
                ?assertEqual([], Codes -- [0, 1, 2, 3, 4]),
                Help = iolist_to_binary(beamdiag_cli:usage(Mod:spec())),
                [_, Tail] = binary:split(Help, <<"\nexit codes:\n">>),
                Listed = [binary_to_integer(hd(binary:split(string:trim(L), <<" ">>)))
                          || L <- binary:split(Tail, <<"\n">>, [global, trim])],
                ?assertEqual(lists:usort(Codes), Listed)
            end) || {_, Mod, _} <- beamdiag_cli:commands()].

%% No command returns an exit code of its own making: a literal 1 to 4 at
%% the end of any function or branch of a beamdiag_cli_* module would be a
%% second mapping.
no_literal_exit_codes_test_() ->
    [?_assertEqual({Mod, []}, {Mod, literal_tails(Mod)})
     || {_, Mod, _} <- beamdiag_cli:commands()].

%% Each command, given a reason it can meet, returns the mapped code.
commands_use_the_mapping_test_() ->
    Cases = [
        {2, ["diagnose", "no-at-sign", "--cookie-file", "/dev/null"]},
        {2, ["watch", "no-at-sign", "--cookie-file", "/dev/null"]},
        {2, ["cluster", "no-at-sign", "--cookie-file", "/dev/null"]},
        {2, ["diagnose", "no-at-sign", "--cluster", "--cookie-file", "/dev/null"]},
        {2, ["flame", "no-at-sign", "--cookie-file", "/dev/null"]},
        {2, ["diagnose", "a@b", "--cookie-file", "/nonexistent/cookie"]},
        {2, ["lab", "no_such_scenario"]},
        {2, ["experiment"]},
        {2, ["experiment", "--workload", "nonsense"]},
        {2, ["flavor", "frobnicate"]},
        {2, ["catalogue", "extra"]},
        {4, ["report", "/nonexistent/x.capture"]},
        {4, ["compare", "/nonexistent/a.capture", "/nonexistent/b.capture"]}
    ],
    [{string:join(Args, " "),
      ?_test(begin
                 {Code, _, Err} = run(Args),
                 ?assertEqual({Args, Want}, {Args, Code}),
                 ?assertNotEqual(nomatch, binary:match(Err, <<"beamdiag">>))
             end)} || {Want, Args} <- Cases].

%%% Helpers

run(Args) ->
    beamdiag_test_lib:cli(Args).

fail(Reason) ->
    _ = beamdiag_test_lib:collect_io(),
    Code = beamdiag_cli:fail(Reason, beamdiag_test_lib:capture_io()),
    {_Out, Err} = beamdiag_test_lib:collect_io(),
    {Code, Err}.

all_reasons() ->
    ok = case application:load(beamdiag) of
             ok -> ok;
             {error, {already_loaded, _}} -> ok
         end,
    {ok, Mods} = application:get_key(beamdiag, modules),
    [{M, instance(P)}
     || M <- Mods, {format_error, 1} <- [F || F <- M:module_info(exports)],
        {clause, _, [P], _, _} <- format_error_clauses(M)].

format_error_clauses(M) ->
    {ok, {M, [{abstract_code, {raw_abstract_v1, Forms}}]}} =
        beam_lib:chunks(code:which(M), [abstract_code]),
    hd([Cs || {function, _, format_error, 1, Cs} <- Forms]).

%% A term matching a pattern, each variable the atom x.
instance({var, _, _}) -> x;
instance({atom, _, A}) -> A;
instance({integer, _, I}) -> I;
instance({string, _, S}) -> S;
instance({nil, _}) -> [];
instance({cons, _, H, T}) -> [instance(H) | instance(T)];
instance({tuple, _, Es}) -> list_to_tuple([instance(E) || E <- Es]);
instance({map, _, Fs}) -> maps:from_list([{instance(K), instance(V)} || {_, _, K, V} <- Fs]);
instance({match, _, {var, _, _}, P}) -> instance(P);
instance({match, _, P, _}) -> instance(P);
instance({char, _, C}) -> C;
instance({float, _, F}) -> F;
instance({op, _, '++', {string, _, S}, T}) -> S ++ instance(T);
instance({op, _, '++', {nil, _}, T}) -> instance(T);
instance({bin, _, _}) -> <<>>;
instance(_) -> x.

%% Whether two reasons of a module fall in the same format_error clause.
same_clause({M, A}, {M, B}) -> clause_of(M, A) =:= clause_of(M, B);
same_clause(_, _) -> false.

clause_of(M, Reason) ->
    Cs = format_error_clauses(M),
    hd([I || {I, {clause, L, Ps, Gs, _}} <- lists:enumerate(Cs),
             match(Ps, Gs, L, Reason)] ++ [none]).

match(Ps, Gs, L, Reason) ->
    case erl_eval:match_clause([{clause, L, Ps, Gs, [{atom, L, true}]}], [Reason],
                               erl_eval:new_bindings(), none) of
        {_, _} -> true;
        nomatch -> false
    end.

%% Integer literals 1 to 4 returned at the end of a function or a branch.
literal_tails(Mod) ->
    {ok, {Mod, [{abstract_code, {raw_abstract_v1, Forms}}]}} =
        beam_lib:chunks(code:which(Mod), [abstract_code]),
    [{F, A, Line} || {function, _, F, A, Cs} <- Forms, F =/= spec,
                     {integer, Line, N} <- lists:flatmap(fun clause_tails/1, Cs),
                     N >= 1, N =< 4].

clause_tails({clause, _, _, _, Body}) -> tails(lists:last(Body)).

tails({'case', _, _, Cs}) -> lists:flatmap(fun clause_tails/1, Cs);
tails({'if', _, Cs}) -> lists:flatmap(fun clause_tails/1, Cs);
tails({'receive', _, Cs}) -> lists:flatmap(fun clause_tails/1, Cs);
tails({'receive', _, Cs, _, After}) -> lists:flatmap(fun clause_tails/1, Cs) ++ tails(lists:last(After));
tails({'try', _, Body, Of, Catch, _}) ->
    tails(lists:last(Body)) ++ lists:flatmap(fun clause_tails/1, Of ++ Catch);
tails({block, _, Body}) -> tails(lists:last(Body));
tails(E) -> [E].
