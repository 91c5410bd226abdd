-module(beamdiag_beams_tests).

-include_lib("eunit/include/eunit.hrl").

%% The newest set whose compiler's window (its release and the two after
%% it) holds the running release; past every window, the newest older set
%% is only tried.
choose_test_() ->
    [?_assertEqual(Want, beamdiag_beams:choose(Rel, Sets))
     || {Rel, Sets, Want} <- [{25, [25, 27], {loads, 25}},
                              {26, [25, 27], {loads, 25}},
                              {27, [25, 27], {loads, 27}},
                              {28, [25, 27], {loads, 27}},
                              {29, [25, 27], {loads, 27}},
                              {29, [27, 25], {loads, 27}},
                              {30, [25, 27], {beyond, 27}},
                              {29, [25], {beyond, 25}},
                              {28, [25], {beyond, 25}},
                              {25, [27], none},
                              {26, [27], none},
                              {25, [unknown], none},
                              {29, [unknown, 27], {loads, 27}}]].

%% The release each compiler version ships with; a version no release is
%% known to ship is unknown, not a guess.
release_of_compiler_test_() ->
    [?_assertEqual(Want, beamdiag_beams:release_of_compiler(V))
     || {V, Want} <- [{"8.2.3", 25}, {"8.3.2", 26}, {"8.4.1", 26}, {"8.5", 27}, {"8.6.1", 27},
                      {"9.0.2", 28}, {"9.1", 28}, {"10.0", 29}, {"10.2.1", 29},
                      {"8.1.1", unknown}, {"11.0", unknown}, {"junk", unknown}, {"", unknown}]].

%% The modules that load before a set is chosen must load on every
%% release from 25 to 29: OTP 29 refuses the binary-matching instructions
%% of OTP 25's compiler (that is how the escript died mid-command there),
%% so these two keep to none.
start_modules_match_no_binaries_test_() ->
    [{atom_to_list(M), ?_assertEqual([], binary_matching(M))} || M <- [beamdiag_boot, beamdiag_beams]].

%% The check above sees binary matching where there is some.
binary_matching_seen_test() ->
    ?assertNotEqual([], binary_matching(beamdiag_host_locate)).

%% The code path's set is this build's own, compiled by this release.
code_path_set_test() ->
    [Own | _] = beamdiag_beams:releases(),
    ?assertEqual(list_to_integer(erlang:system_info(otp_release)), Own),
    {ok, Objs} = beamdiag_beams:objects(Own, [beamdiag_agent]),
    ?assertMatch([{beamdiag_agent, <<"FOR1", _/binary>>, _}], Objs).

%% A set of another release, when this build has one (scripts/beam-sets.sh
%% made it with that release's compiler): its beams come from that
%% compiler, and were compiled from this build's beams.
built_set_test() ->
    Here = list_to_integer(erlang:system_info(otp_release)),
    case beamdiag_beams:releases() -- [Here] of
        [] ->
            %% No other OTP's compiler at hand: nothing to check here (the
            %% suites that need one check that it was built).
            ok;
        [R | _] ->
            Mods = beamdiag_agent:modules(),
            {ok, Objs} = beamdiag_beams:objects(R, Mods),
            ?assertEqual(Mods, [M || {M, _, _} <- Objs]),
            [?assertEqual(R, beamdiag_loader:built_on(B)) || {_, B, _} <- Objs],
            ?assertMatch({error, {beamdiag_beams, {no_such_set, 99}}},
                         beamdiag_beams:objects(99, Mods))
    end.

no_set_message_test() ->
    Msg = lists:flatten(beamdiag_beams:format_error({no_set, 29, [25]})),
    ?assertNotEqual(nomatch, string:find(Msg, "OTP 25")),
    ?assertNotEqual(nomatch, string:find(Msg, "OTP 29 cannot load")),
    ?assertEqual(nomatch, string:find(Msg, "\n")).

%%% Helpers

%% The binary-matching instructions in a module's code.
binary_matching(M) ->
    {M, Bin, _} = code:get_object_code(M),
    {beam_file, M, _, _, _, Funs} = beam_disasm:file(Bin),
    Prefixes = ["bs_start_match", "bs_get", "bs_skip", "bs_test", "bs_match", "bs_save",
                "bs_restore", "bs_set_position", "bs_get_position", "bs_context"],
    lists:usort([{F, A, Op}
                 || {function, F, A, _, Code} <- Funs, I <- Code, is_tuple(I) orelse is_atom(I),
                    Op <- [op(I)],
                    lists:any(fun(P) -> lists:prefix(P, atom_to_list(Op)) end, Prefixes)]).

op(I) when is_atom(I) -> I;
op(I) -> element(1, I).
