-module(beamdiag_fix_text_tests).
-include_lib("eunit/include/eunit.hrl").

%% RabbitMQ 3.10 as Debian starts it.
rabbit() ->
    #{otp_release => <<"25">>, sbwt => <<"none">>, sbwtdcpu => <<"none">>,
      sbwtdio => <<"none">>, swt => <<"medium">>, scl => <<"true">>, sub => <<"false">>,
      mdai => <<"0">>, mmscs => <<"0">>, bind_type => <<"thread_no_node_processor_spread">>}.

defaults() ->
    #{otp_release => <<"27">>, sbwt => <<"medium">>, sbwtdcpu => <<"short">>,
      sbwtdio => <<"short">>, swt => <<"medium">>, scl => <<"true">>, sub => <<"false">>,
      mdai => <<"0">>, mmscs => <<"0">>, bind_type => <<"unbound">>}.

%% The field case: +sbwt none on the node, "+sbwt none, +swt low" advised.
high_system_cpu_on_rabbitmq_test() ->
    Fix = beamdiag_fix_text:fix(high_system_cpu, rabbit()),
    ?assertEqual(nomatch, re:run(Fix, "\\+swt (very_)?low")),
    ?assertMatch({match, _}, re:run(Fix, "busy waiting is already off")),
    ?assertMatch({match, _}, re:run(Fix, "\\+swt high")).

high_system_cpu_with_swt_high_already_test() ->
    Fix = beamdiag_fix_text:fix(high_system_cpu, (defaults())#{swt => <<"high">>}),
    ?assertMatch({match, _}, re:run(Fix, "\\+swt is already high")).

busy_wait_names_only_missing_flags_test() ->
    Fix = beamdiag_fix_text:fix(busy_wait, (defaults())#{sbwt => <<"none">>}),
    ?assertMatch({match, _}, re:run(Fix, "Start the node with \\+sbwtdcpu none \\+sbwtdio none "
                                         "\\(in vm.args, or ERL_FLAGS\\) \\(\\+sbwt none is already set\\)")).

throttling_with_busy_wait_off_test() ->
    Fix = beamdiag_fix_text:fix(cpu_throttling, rabbit()),
    ?assertEqual(nomatch, re:run(Fix, "turn busy waiting off")),
    ?assertMatch({match, _}, re:run(Fix, "already off")).

mdai_in_place_test() ->
    Fix = beamdiag_fix_text:fix(dirty_cpu_gc, (defaults())#{mdai => <<"max">>}),
    ?assertEqual(nomatch, re:run(Fix, "with \\+Mdai max")),
    ?assertMatch({match, _}, re:run(Fix, "already have allocator instances")).

imbalance_flags_in_place_test() ->
    Fix = beamdiag_fix_text:fix(scheduler_imbalance,
                                (defaults())#{scl => <<"false">>, sub => <<"true">>}),
    ?assertEqual(nomatch, re:run(Fix, "try \\+")).

starvation_names_binding_test() ->
    ?assertMatch({match, _}, re:run(beamdiag_fix_text:fix(cpu_starvation, rabbit()), "\\+sbt u")),
    ?assertEqual(nomatch, re:run(beamdiag_fix_text:fix(cpu_starvation, defaults()), "\\+sbt")).

%% Every flag any fix advises, on any of these nodes, is one of the
%% advised flags with a value the table lists; none is a flag the node has.
advice_only_from_the_table_test() ->
    Table = [{F, V} || #{flag := F, values := Vs} <- beamdiag_fix_text:advised_flags(), V <- Vs],
    Flags = [F || {F, _} <- Table],
    [begin
         Fix = beamdiag_fix_text:fix(Id, S),
         {match, Ms} = case re:run(Fix, "\\+([A-Za-z]+) ([A-Za-z_0-9:]+)",
                                   [global, {capture, all_but_first, binary}]) of
                           nomatch -> {match, []};
                           M -> M
                       end,
         [?assert(lists:member(F, Flags)) || [F, _] <- Ms],
         [?assert(lists:member({F, V}, Table) orelse V =:= <<"Q">> orelse V =:= <<"N">>)
          || [F, V] <- Ms, lists:member(F, [<<"sbwt">>, <<"sbwtdcpu">>, <<"sbwtdio">>,
                                            <<"swt">>, <<"scl">>, <<"sub">>, <<"sbt">>])]
     end || Id <- beamdiag_catalogue:ids(), S <- [rabbit(), defaults()]].

%% Each flag documented in erl(1) is there, with the values advised, in
%% the manual of every OTP release this machine has (the host's, and the
%% OTP 27 and 29 roots when they are built).
flags_in_erl_manual_test_() ->
    Cache = case os:getenv("BEAMDIAG_CACHE") of
                false -> "/var/cache/beamdiag";
                C -> C
            end,
    Pages = [P || P <- ["/usr/share/man/man1/erl.1.gz" |
                        [filename:join([Cache, "roots", R, "usr/share/man/man1/erl.1.gz"])
                         || R <- ["trixie", "sid"]]],
                  filelib:is_regular(P)],
    [{P, fun() -> flags_in(P) end} || P <- Pages].

flags_in(Page) ->
    {ok, Gz} = file:read_file(Page),
    Text = re:replace(zlib:gunzip(Gz), "\\\\f[BIRP]|\\\\&|\\\\", "", [global, {return, binary}]),
    [begin
         {match, Lines} = re:run(Text, ["^\\s*\\+", F, " ([^\\n]*)$"],
                                 [multiline, global, {capture, [1], binary}]),
         %% OTP 25's page ends a lone placeholder with a colon (+P Number:).
         Alts = lists:append([binary:split(string:trim(hd(binary:split(L, <<" ">>)), trailing, ":"),
                                           <<"|">>, [global])
                              || [L] <- Lines]),
         [?assert({F, V, lists:member(V, Alts)} =:= {F, V, true}) || V <- Vs, V =/= <<"N:N">>,
                                                                     F =/= <<"sbt">>]
     end || #{flag := F, values := Vs, doc := erl} <- beamdiag_fix_text:advised_flags()],
    %% +sbt lists its bind types in a table: u is unbound.
    [?assertMatch({B, {match, _}}, {B, re:run(Text, ["\\n", B, "(:?\\s*\\n(\\.[^\\n]*\\n|\\s*\\n)*| - )",
                                                      Name, " - "])})
     || {B, Name} <- [{"u", "unbound"}, {"db", "default_bind"}]].

%% Flags advised only where the node's release documents them.
release_gates_advice_test() ->
    ?assert(beamdiag_fix_text:documented(<<"Mdai">>, #{otp_release => <<"25">>})),
    ?assertNot(beamdiag_fix_text:documented(<<"Mdai">>, #{otp_release => <<"23">>})),
    ?assertNot(beamdiag_fix_text:documented(<<"swt_low">>, #{otp_release => <<"27">>})),
    Fix = beamdiag_fix_text:fix(dirty_cpu_gc, (defaults())#{otp_release => <<"23">>}),
    ?assertEqual(nomatch, re:run(Fix, "with \\+Mdai max")).
