-module(beamdiag_flags_tests).
-include_lib("eunit/include/eunit.hrl").

%% The documented defaults, as erl(1) of OTP 25, 27 and 29 states them.
documented_defaults_test() ->
    ?assertEqual(<<"medium">>, beamdiag_flags:default(sbwt)),
    ?assertEqual(<<"short">>, beamdiag_flags:default(sbwtdcpu)),
    ?assertEqual(<<"short">>, beamdiag_flags:default(sbwtdio)),
    ?assertEqual(<<"medium">>, beamdiag_flags:default(swt)),
    ?assertEqual(<<"true">>, beamdiag_flags:default(scl)),
    ?assertEqual(<<"false">>, beamdiag_flags:default(sub)),
    ?assertEqual(<<"0">>, beamdiag_flags:default(sfwi)),
    ?assertEqual(<<"0">>, beamdiag_flags:default(mdai)).

%% The agent fills in exactly the table's defaults for the flags it reads.
agent_defaults_are_the_table_test() ->
    Table = maps:from_list([{K, D} || #{key := K, default := D, read := true}
                                          <- beamdiag_flags:table(), is_binary(D)]),
    ?assertEqual(Table, beamdiag_agent_vm:parse_flags([])).

%% Every flag the agent reads is read from the argument vector, including
%% those that share a prefix with another (-sbwt and -sbwtdcpu).
agent_reads_every_read_flag_test() ->
    Read = [{K, O} || #{key := K, option := O, read := true} <- beamdiag_flags:table()],
    Args = lists:append([[<<"-", O/binary>>, <<"v", O/binary>>] || {_, O} <- Read]),
    Parsed = beamdiag_agent_vm:parse_flags(Args),
    [?assertEqual({K, <<"v", O/binary>>}, {K, maps:get(K, Parsed)}) || {K, O} <- Read].

%% The busy-wait rule assumes the table's defaults for flags the settings
%% lack: the evidence names them.
busy_wait_rule_defaults_from_the_table_test() ->
    C = capture("busy_wait"),
    S = maps:without(beamdiag_flags:busy_wait_keys(), maps:get(settings, C)),
    #{findings := F} = beamdiag:analyse(C#{settings => S}),
    [#{evidence := Ev}] = [X || X = #{id := busy_wait} <- F],
    Want = iolist_to_binary(["busy-wait flags in effect: +sbwt ", beamdiag_flags:default(sbwt),
                             " +sbwtdcpu ", beamdiag_flags:default(sbwtdcpu),
                             " +sbwtdio ", beamdiag_flags:default(sbwtdio)]),
    ?assert(lists:member(Want, [iolist_to_binary(E) || E <- Ev])),
    ?assertEqual(<<"busy-wait flags in effect: +sbwt medium +sbwtdcpu short +sbwtdio short">>,
                 Want).

%% A fix on a node whose settings lack the flags is the fix for a node at
%% the table's defaults.
fix_defaults_from_the_table_test() ->
    Defaults = maps:from_list([{K, D} || #{key := K, default := D, read := true}
                                             <- beamdiag_flags:table()]),
    [?assertEqual({Id, beamdiag_fix_text:fix(Id, Defaults#{otp_release => <<"27">>})},
                  {Id, beamdiag_fix_text:fix(Id, #{otp_release => <<"27">>})})
     || Id <- beamdiag_catalogue:ids()].

%% The fixes advise only flags of the table, with the values it lists.
advised_flags_are_the_table_test() ->
    Advised = [F || #{flag := F} <- beamdiag_fix_text:advised_flags()],
    Options = [O || #{option := O} <- beamdiag_flags:table()],
    ?assertEqual([], Advised -- Options),
    [?assert(lists:member(F, Advised))
     || F <- [<<"sbwt">>, <<"sbwtdcpu">>, <<"sbwtdio">>, <<"swt">>, <<"scl">>, <<"sub">>,
              <<"sbt">>, <<"S">>, <<"Mdai">>, <<"MMscs">>, <<"MMmcs">>, <<"MBlmbcs">>]].

%% The HTML report shows every flag the agent reads in a flag group, and
%% marks a value that is not the default.
html_shows_every_read_flag_test() ->
    Read = [K || #{key := K, read := true} <- beamdiag_flags:table()],
    Grouped = lists:append([beamdiag_flags:group(G) || G <- [scheduling, memory, emulator]]),
    ?assertEqual(lists:sort(Read), lists:sort(Grouped)),
    C = capture("busy_wait"),
    S = (maps:get(settings, C))#{sbwtdcpu => <<"none">>},
    Html = iolist_to_binary(beamdiag_format_html:diagnosis(beamdiag:analyse(C#{settings => S}))),
    ?assertMatch({_, _}, binary:match(Html, <<"none (default short)">>)).

%% Each default in the table is the one erl(1) states, in the manual of
%% every OTP release this machine has (the host's, and the OTP 27 and 29
%% roots when they are built).
defaults_in_erl_manual_test_() ->
    Cache = case os:getenv("BEAMDIAG_CACHE") of
                false -> "/var/cache/beamdiag";
                Dir -> Dir
            end,
    Pages = [P || P <- ["/usr/share/man/man1/erl.1.gz" |
                        [filename:join([Cache, "roots", R, "usr/share/man/man1/erl.1.gz"])
                         || R <- ["trixie", "sid"]]],
                  filelib:is_regular(P)],
    [{P, fun() -> defaults_in(P) end} || P <- Pages].

defaults_in(Page) ->
    {ok, Gz} = file:read_file(Page),
    Text0 = re:replace(zlib:gunzip(Gz), "\\\\f[BIRP]|\\\\&|\\\\", "", [global, {return, binary}]),
    Text = re:replace(Text0, "\\s+", " ", [global, {return, binary}]),
    Stated = #{sbwt => "Sets scheduler busy wait threshold\\. Defaults to ([a-z_]+)",
               swt => "Sets scheduler wakeup threshold\\. Defaults to ([a-z_]+)",
               jpperf => "perf`? profiler when running with the JIT on Linux\\. Defaults to ([a-z]+)",
               sfwi => "Interval default to ([0-9]+)"},
    [begin
         {match, Found} = re:run(Text, Re, [global, {capture, [1], binary}]),
         [?assertEqual({K, beamdiag_flags:default(K)}, {K, V}) || [V] <- Found]
     end || {K, Re} <- maps:to_list(Stated)],
    %% +sbwtdcpu, +sbwtdio, +swtdcpu and +swtdio say "As +sbwt (+swt) but
    %% affects dirty CPU (IO) schedulers. Defaults to X".
    [begin
         {match, [[V]]} = re:run(Text, ["As \\+", Base, " but affects dirty ", Kind,
                                        " schedulers\\. Defaults to ([a-z_]+)"],
                                 [{capture, [1], binary}, global]),
         ?assertEqual({K, beamdiag_flags:default(K)}, {K, V})
     end || {K, Base, Kind} <- [{sbwtdcpu, "sbwt", "CPU"}, {sbwtdio, "sbwt", "IO"},
                                {swtdcpu, "swt", "CPU"}, {swtdio, "swt", "IO"}]],
    ?assertMatch({match, _}, re:run(Text, "By default scheduler compaction of load is enabled")),
    ?assertEqual(<<"true">>, beamdiag_flags:default(scl)),
    ?assertMatch({match, _}, re:run(Text, "By default scheduler utilization balancing is "
                                          "disabled")),
    ?assertEqual(<<"false">>, beamdiag_flags:default(sub)).

capture(Name) ->
    beamdiag_test_lib:fixture_capture(Name).
