-module(beamdiag_elixir_names_tests).

-include_lib("eunit/include/eunit.hrl").

%% {Module (without "Elixir."), Function, Arity, what Elixir 1.14's
%% Exception.format_mfa/3 prints for them}, each taken from Elixir itself.
golden() ->
    [{<<"Shop.Pricing">>, <<"-total/1-fun-0-">>, 2, <<"anonymous fn/2 in Shop.Pricing.total/1">>},
     %% A nested fn: Elixir's compiler numbers it on (flat), so it reads alike.
     {<<"Shop.Pricing">>, <<"-total/1-fun-1-">>, 2, <<"anonymous fn/2 in Shop.Pricing.total/1">>},
     %% An older compiler's nesting: the outer fn quoted as a name.
     {<<"Foo">>, <<"-\"-total/1-fun-0-\"/2-fun-0-">>, 1,
      <<"anonymous fn/1 in Foo.\"\\\"-total/1-fun-0-\\\"\"/2">>},
     {<<"Shop.Pricing">>, <<"total">>, 1, <<"Shop.Pricing.total/1">>},
     {<<"Enum">>, <<"reduce">>, 3, <<"Enum.reduce/3">>},
     %% Operators: bare when Elixir calls them after a dot, else quoted.
     {<<"Kernel">>, <<"+">>, 2, <<"Kernel.+/2">>},
     {<<"Kernel">>, <<"<~>">>, 2, <<"Kernel.<~>/2">>},
     {<<"Kernel">>, <<"..">>, 2, <<"Kernel.\"..\"/2">>},
     {<<"Foo">>, <<"->">>, 2, <<"Foo.\"->\"/2">>},
     {<<"Foo">>, <<"{}">>, 0, <<"Foo.\"{}\"/0">>},
     {<<"Foo">>, <<"\\\\">>, 2, <<"Foo.\\\\/2">>},
     %% Protocols and their implementations are modules like any other.
     {<<"Enumerable.List">>, <<"reduce">>, 3, <<"Enumerable.List.reduce/3">>},
     {<<"Enumerable">>, <<"impl_for">>, 1, <<"Enumerable.impl_for/1">>},
     %% The compiler's -inlined- functions and comprehensions: quoted.
     {<<"Foo">>, <<"-inlined-__info__/1-">>, 1, <<"Foo.\"-inlined-__info__/1-\"/1">>},
     {<<"Foo">>, <<"-total/1-lc$^0/1-0-">>, 1, <<"Foo.\"-total/1-lc$^0/1-0-\"/1">>},
     {<<"Foo">>, <<"-fun.x/1-">>, 1, <<"Foo.\"-fun.x/1-\"/1">>},
     {<<"Foo">>, <<"-a/b/2-fun-0-">>, 3, <<"anonymous fn/3 in Foo.\"a/b\"/2">>},
     {<<"Foo">>, <<"-/2-fun-0-">>, 1, <<"anonymous fn/1 in Foo.\"\"/2">>},
     %% Names Elixir writes bare, and those it must quote.
     {<<"Foo">>, <<"valid?">>, 1, <<"Foo.valid?/1">>},
     {<<"Foo">>, <<"save!">>, 1, <<"Foo.save!/1">>},
     {<<"Foo">>, <<"nil">>, 0, <<"Foo.nil/0">>},
     {<<"Foo">>, <<"__struct__">>, 0, <<"Foo.__struct__/0">>},
     {<<"Foo">>, <<"café"/utf8>>, 1, <<"Foo.café/1"/utf8>>},
     {<<"Foo">>, <<"Bar">>, 1, <<"Foo.\"Bar\"/1">>},
     {<<"Foo">>, <<"1a">>, 1, <<"Foo.\"1a\"/1">>},
     {<<"Foo">>, <<"foo bar">>, 1, <<"Foo.\"foo bar\"/1">>},
     {<<"Foo">>, <<"a\"b">>, 1, <<"Foo.\"a\\\"b\"/1">>},
     {<<"Foo">>, <<"a\\b">>, 1, <<"Foo.\"a\\\\b\"/1">>},
     {<<"Foo">>, <<"a#{b}">>, 1, <<"Foo.\"a\\#{b}\"/1">>},
     %% A module named Elixir.* that is no alias.
     {<<"Foo.bar">>, <<"baz">>, 1, <<":\"Elixir.Foo.bar\".baz/1">>},
     {<<"foo">>, <<"baz">>, 1, <<":\"Elixir.foo\".baz/1">>}].

%% As the agent gives names (atoms as they are).
agent_names_test_() ->
    [?_assertEqual(Want, beamdiag_elixir_names:mfa(
                           <<"Elixir.", M/binary, ":", F/binary, "/", (integer_to_binary(A))/binary>>))
     || {M, F, A, Want} <- golden()].

%% As perf frames name JIT code: `$' (kept: it marks JIT code), atoms
%% quoted as Erlang quotes them.
perf_frames_test_() ->
    [?_assertEqual(<<"$", Want/binary>>, beamdiag_elixir_names:mfa(
                           unicode:characters_to_binary(io_lib:format("$~tw:~tw/~b",
                                                          [binary_to_atom(<<"Elixir.", M/binary>>),
                                                           binary_to_atom(F), A]))))
     || {M, F, A, Want} <- golden()].

%% What a perf map writes after the arity stays; the code header is no
%% function.
perf_suffix_test_() ->
    [?_assertEqual(<<"$Shop.Pricing.total/1-CodeInfoPrologue">>,
                   beamdiag_elixir_names:mfa(<<"$'Elixir.Shop.Pricing':total/1-CodeInfoPrologue">>)),
     ?_assertEqual(<<"$Elixir.Shop.Pricing::codeHeader">>,
                   beamdiag_elixir_names:mfa(<<"$Elixir.Shop.Pricing::codeHeader">>))].

%% Erlang's modules, and whatever is no function name, as they are.
not_elixir_test_() ->
    [?_assertEqual(N, beamdiag_elixir_names:mfa(N))
     || N <- [<<"lists:foldl/3">>, <<"$lists:foldl/3">>, <<"gen_server:loop/7">>,
              <<"$erlang:'-apply/2-fun-0-'/1">>, <<"$global::process_main">>, <<"[beam.smp]">>,
              <<"erts_atom_put">>, <<"[unknown] (/memfd:vmem (deleted))">>, <<"undefined">>,
              <<"Elixir.Foo">>, <<"Elixir.Foo:bar">>, <<"Elixir.Foo:bar/x">>, <<"">>,
              <<"$'Elixir.Foo:bar/1">>]].

%% Inside free text (a finding's evidence), each Elixir name is rewritten
%% and the rest left alone.
text_test_() ->
    [?_assertEqual(<<"<0.88.0> (anonymous fn/2 in Shop.Pricing.total/1) took 99.9% of the "
                     "reductions; it was in Enum.reduce/3, called from lists:foldl/3.">>,
                   beamdiag_elixir_names:text(
                     <<"<0.88.0> (Elixir.Shop.Pricing:-total/1-fun-0-/2) took 99.9% of the "
                       "reductions; it was in Elixir.Enum:reduce/3, called from lists:foldl/3.">>)),
     ?_assertEqual(<<"held in $Shop.Codec.decode/1 < $anonymous fn/1 in Shop.Codec.run/0 (40%)">>,
                   beamdiag_elixir_names:text(
                     <<"held in $'Elixir.Shop.Codec':decode/1 < "
                       "$'Elixir.Shop.Codec':'-run/0-fun-0-'/1 (40%)">>)),
     ?_assertEqual(<<"no Elixir here: lists:foldl/3">>,
                   beamdiag_elixir_names:text("no Elixir here: lists:foldl/3")),
     ?_assertEqual(<<"Shop.A.f/10, Shop.B.g/2">>,
                   beamdiag_elixir_names:text(<<"Elixir.Shop.A:f/10, Elixir.Shop.B:g/2">>)),
     %% A process registered under its module's name, and a table so named.
     ?_assertEqual(<<"the mailbox of Holdex.Store <0.643.0> (?) grew; table Shop.Cache, "
                     "in Holdex.Store.handle_cast/2; Elixir.lower stays">>,
                   beamdiag_elixir_names:text(<<"the mailbox of Elixir.Holdex.Store <0.643.0> (?) "
                                                "grew; table Elixir.Shop.Cache, in "
                                                "Elixir.Holdex.Store:handle_cast/2; Elixir.lower stays">>)),
     ?_assertEqual(<<"odd Elixir.Shop.Store:'x y' left whole">>,
                   beamdiag_elixir_names:text(<<"odd Elixir.Shop.Store:'x y' left whole">>)),
     %% The agent's name for a process spawned from a fun, and its spawner.
     ?_assertEqual(<<"<0.645.0> (anonymous fn in Holdex.Worker.start/1, spawned by Holdex.Sup "
                     "<0.600.0>); a fun in lists:foldl/3 stays">>,
                   beamdiag_elixir_names:text(<<"<0.645.0> (a fun in Elixir.Holdex.Worker:start/1, "
                                                "spawned by Elixir.Holdex.Sup <0.600.0>); "
                                                "a fun in lists:foldl/3 stays">>))].

%% A process spawned from a fun in an Elixir module, and its spawner
%% registered under its module's name, in Elixir's words; an Erlang
%% module's fun keeps Erlang's.
spawned_from_fun_test() ->
    E = #{pid => <<"<0.645.0>">>, name => null, initial_call => <<"a fun in Elixir.Holdex.Worker:start/1">>,
          spawn_call => <<"erlang:apply/2">>, current => <<"Elixir.Enum:reduce_range/5">>,
          parent => #{pid => <<"<0.600.0>">>, name => <<"Elixir.Holdex.Sup">>}},
    D = #{capture => #{extras => #{procs => #{top_reductions => [E],
                                              queues => [E#{initial_call := <<"a fun in holdex:go/0">>}]}}}},
    #{capture := #{extras := #{procs := #{top_reductions := [P], queues := [Q]}}}} =
        beamdiag_elixir_names:diagnosis(D#{findings => []}),
    ?assertMatch(#{initial_call := <<"anonymous fn in Holdex.Worker.start/1">>,
                   spawn_call := <<"erlang:apply/2">>, current := <<"Enum.reduce_range/5">>,
                   parent := #{pid := <<"<0.600.0>">>, name := <<"Holdex.Sup">>}}, P),
    ?assertEqual(<<"a fun in holdex:go/0">>, maps:get(initial_call, Q)),
    ?assertEqual(<<"<0.645.0> (anonymous fn in Holdex.Worker.start/1, spawned by Holdex.Sup "
                   "<0.600.0>)">>, iolist_to_binary(beamdiag_proc_rules:who(P))).

%% A fix in Elixir's terms.
fix_test_() ->
    [?_assertEqual(<<"Create the table with the :ets.new/2 options write_concurrency: true and "
                     "decentralized_counters: true.">>,
                   beamdiag_elixir_names:fix(
                     <<"Create the table with the ets:new/2 options {write_concurrency, true} and "
                       "{decentralized_counters, true}.">>)),
     ?_assertEqual(<<"make producers wait (GenServer.call instead of cast); "
                     "message_queue_data: :off_heap">>,
                   beamdiag_elixir_names:fix(<<"make producers wait (gen_server:call instead of "
                                               "cast); {message_queue_data, off_heap}">>)),
     %% Flags and paths are no calls.
     ?_assertEqual(<<"+S N:N, or +sbwt none in vm.args; see http://host:80/x">>,
                   beamdiag_elixir_names:fix(<<"+S N:N, or +sbwt none in vm.args; see "
                                               "http://host:80/x">>))].

%% Every fix of the catalogue, said to an Elixir node, keeps no Erlang
%% call or option tuple: a fix added with one the translation does not
%% know fails here.
catalogue_fixes_in_elixir_test_() ->
    [{atom_to_list(Id),
      ?_assertEqual(nomatch, re:run(beamdiag_elixir_names:fix(Fix),
                                    "(?<![.:A-Za-z0-9_])[a-z_]+:[a-z_]+[/(]|\\{[a-z_]+, ",
                                    [{capture, first, binary}]))}
     || #{id := Id, fix := Fix} <- beamdiag_catalogue:entries()].

%% A diagnosis for the text report: names in the top processes, the
%% profile's frames and the evidence, the fix only on an Elixir node.
diagnosis_test() ->
    Fix = <<"use {message_queue_data, off_heap}">>,
    D = #{capture => #{settings => #{elixir => true},
                       extras => #{procs => #{top_reductions =>
                                                  [#{pid => <<"<0.1.0>">>,
                                                     initial_call => <<"Elixir.Shop.Pricing:-total/1-fun-0-/2">>,
                                                     current => <<"lists:foldl/3">>,
                                                     own => <<"Elixir.Holdex.Pricing:total/1">>,
                                                     own_at => <<"lib/holdex/pricing.ex:12">>,
                                                     reductions => 5}],
                                              heap_growth => [#{pid => <<"<0.2.0>">>,
                                                                name => <<"Elixir.Holdex.Store">>,
                                                                current => <<"Elixir.Holdex.Store:handle_cast/2">>}],
                                              born => #{read => 9,
                                                        groups => [#{count => 9,
                                                                     initial_call => <<"Elixir.Shop.Worker:init/1">>,
                                                                     current => <<"gen_server:loop/7">>,
                                                                     parent => #{pid => <<"<0.3.0>">>,
                                                                                 name => <<"Elixir.Shop.Sup">>}}]}},
                                   profile => #{profile => #{stacks => #{[<<"scheduler">>, <<"$'Elixir.Enum':reduce/3">>] => 3,
                                                                         [<<"scheduler">>, <<"$'Elixir.Enum':reduce/3-CodeInfoPrologue">>] => 1},
                                                             samples => 4}}}},
          findings => [#{evidence => [<<"in Elixir.Enum:reduce/3">>], fix => Fix}]},
    #{capture := #{extras := #{procs := #{top_reductions := [P], heap_growth := [G],
                                          born := #{groups := [B]}},
                               profile := #{profile := Prof}}},
      findings := [F]} = beamdiag_elixir_names:diagnosis(D),
    %% A registered module name, in every list of processes.
    ?assertMatch(#{name := <<"Holdex.Store">>, current := <<"Holdex.Store.handle_cast/2">>}, G),
    ?assertMatch(#{initial_call := <<"Shop.Worker.init/1">>, parent := #{name := <<"Shop.Sup">>}},
                 B),
    ?assertEqual(<<"anonymous fn/2 in Shop.Pricing.total/1">>, maps:get(initial_call, P)),
    ?assertEqual(<<"lists:foldl/3">>, maps:get(current, P)),
    %% The user's innermost frame, in Elixir's words.
    ?assertEqual(<<"Holdex.Pricing.total/1">>, maps:get(own, P)),
    ?assertEqual(<<"lib/holdex/pricing.ex:12">>, maps:get(own_at, P)),
    ?assertEqual(#{[<<"scheduler">>, <<"$Enum.reduce/3">>] => 3,
                   [<<"scheduler">>, <<"$Enum.reduce/3-CodeInfoPrologue">>] => 1},
                 maps:get(stacks, Prof)),
    ?assertEqual([<<"in Enum.reduce/3">>], maps:get(evidence, F)),
    ?assertEqual(<<"use message_queue_data: :off_heap">>, maps:get(fix, F)),
    %% Not an Elixir node: the fix as written.
    #{findings := [F2]} = beamdiag_elixir_names:diagnosis(
                             D#{capture := (maps:get(capture, D))#{settings := #{}}}),
    ?assertEqual(Fix, maps:get(fix, F2)).

%% A JIT frame named the Elixir way is still counted as Erlang code by the
%% profile's figures; native frames stay native.
frame_kind_test_() ->
    [?_assertEqual(Kind, beamdiag_fold_frame:kind(beamdiag_elixir_names:mfa(F)))
     || {F, Kind} <- [{<<"$'Elixir.Shop.Pricing':'-total/1-fun-0-'/2">>, erlang},
                      {<<"$'Elixir.Enum':reduce/3">>, erlang},
                      {<<"Elixir.Enum:reduce/3">>, erlang},
                      {<<"$'Elixir.Kernel':'+'/2">>, erlang},
                      {<<"$lists:foldl/3">>, erlang},
                      {<<"erts_schedule">>, native},
                      {<<"[beam.smp]">>, unnamed_native},
                      {<<"$global::process_main">>, native},
                      {<<"memcpy.part.0">>, native}]].
