-module(beamdiag_loader_tests).

-include_lib("eunit/include/eunit.hrl").

plan(Sets, T, C) ->
    beamdiag_loader:plan(#{sets => Sets, target => T, compiler => C}).

%% Beams load on the release that compiled them and the two after it: the
%% newest set that loads goes over, whether the target can compile or not.
beams_within_two_releases_test() ->
    ?assertEqual({beams, 25}, plan([25], 25, false)),
    ?assertEqual({beams, 25}, plan([25], 26, false)),
    ?assertEqual({beams, 25}, plan([25], 27, false)),
    ?assertEqual({beams, 27}, plan([25, 27], 27, false)),
    ?assertEqual({beams, 27}, plan([25, 27], 28, true)),
    ?assertEqual({beams, 27}, plan([25, 27], 29, false)),
    ?assertEqual({beams, 25}, plan([25, 27], 26, false)),
    ?assertEqual({beams, 25}, plan([27, 25], 25, true)),
    ?assertEqual({beams, 29}, plan([29], 29, true)).

%% No set loads there: compiled on the target when it can be.
newer_target_compiles_test() ->
    ?assertEqual(compile, plan([25], 28, true)),
    ?assertEqual(compile, plan([25], 29, true)),
    ?assertEqual(compile, plan([25, 27], 30, true)),
    ?assertEqual({refuse, no_compiler}, plan([25], 29, false)),
    ?assertEqual({refuse, no_compiler}, plan([25, 27], 30, false)),
    ?assertEqual({refuse, no_compiler}, plan([25], 28, false)).

%% OTP 25 refuses code from 26 and later, by any distance.
older_target_compiles_test() ->
    ?assertEqual(compile, plan([26], 25, true)),
    ?assertEqual(compile, plan([27, 29], 25, true)),
    ?assertEqual({refuse, no_compiler}, plan([29], 25, false)),
    ?assertEqual({refuse, no_compiler}, plan([27], 26, false)).

unknown_build_test() ->
    ?assertEqual(compile, plan([unknown], 27, true)),
    ?assertEqual({beams, 27}, plan([unknown, 27], 29, false)),
    ?assertEqual({refuse, unknown_build}, plan([unknown], 27, false)).

%% This build's beams were compiled here, by this release's compiler.
built_on_here_test() ->
    {beamdiag_loader, Bin, _} = code:get_object_code(beamdiag_loader),
    ?assertEqual(list_to_integer(erlang:system_info(otp_release)),
                 beamdiag_loader:built_on(Bin)),
    ?assertEqual(unknown, beamdiag_loader:built_on(<<"not a beam">>)).

%% The agent goes over as abstract code: every target module carries it.
agent_has_abstract_code_test() ->
    [begin
         {M, Bin, _} = code:get_object_code(M),
         ?assertMatch({ok, {M, [{abstract_code, {raw_abstract_v1, [_ | _]}}]}},
                      beam_lib:chunks(Bin, [abstract_code]))
     end || M <- lists:usort(beamdiag_agent:modules() ++ beamdiag_agent_sampler:modules())].

%% The refusal is one line naming both releases and what to do.
refusal_message_test() ->
    Msg = lists:flatten(beamdiag_loader:format_error(
              {refuse, no_compiler, 'app@host', #{sets => [25], target => 29, runs_on => 25,
                                                  compiler => false}})),
    ?assertEqual(nomatch, string:find(Msg, "\n")),
    ?assertNotEqual(nomatch, string:find(Msg, "OTP 29")),
    ?assertNotEqual(nomatch, string:find(Msg, "OTP 25")),
    ?assertNotEqual(nomatch, string:find(Msg, "25 to 27")),
    ?assertNotEqual(nomatch, string:find(Msg, "27 to 29")),
    ?assertNotEqual(nomatch, string:find(Msg, "compiler application")),
    Msg2 = lists:flatten(beamdiag_loader:format_error(
               {refuse, unknown_build, 'app@host', #{sets => [unknown], target => 29,
                                                     runs_on => 27, compiler => false}})),
    ?assertEqual(nomatch, string:find(Msg2, "\n")),
    ?assertNotEqual(nomatch, string:find(Msg2, "OTP 27")).
