-module(beamdiag_lab_tests).
-include_lib("eunit/include/eunit.hrl").

%% A lab node that cannot boot is an error in words; for a scenario on the
%% lock-counting emulator it says how to check for it and build it.
peer_start_error_test() ->
    Text = fun(Name) ->
               iolist_to_binary(beamdiag_lab:format_error(
                                    {peer_start, Name, {boot_failed, {exit_status, 1}}}))
           end,
    ?assertMatch({_, _}, binary:match(Text(ets_hot), <<"beamdiag emu-type build --install">>)),
    ?assertMatch({_, _}, binary:match(Text(ets_hot), <<"{boot_failed,{exit_status,1}}">>)),
    ?assertEqual(nomatch, binary:match(Text(nif_stuck), <<"emu-type">>)).

%% peer raises when the node's emulator exits at boot; start/2 returns it.
boot_failure_is_an_error_test_() ->
    {timeout, 60, fun() ->
        R = beamdiag_lab:start(nif_stuck, #{extra_args => ["-emu_flavor", "nonesuch"],
                                            duration => 5}),
        ?assertMatch({error, {beamdiag_lab, {peer_start, nif_stuck, _}}}, R)
    end}.
