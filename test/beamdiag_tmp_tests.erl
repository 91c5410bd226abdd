%%% EUnit tests of beamdiag_tmp: temporary paths under TMPDIR.
-module(beamdiag_tmp_tests).

-include_lib("eunit/include/eunit.hrl").

path_test() ->
    Old = os:getenv("TMPDIR"),
    try
        os:putenv("TMPDIR", "/var/tmp"),
        A = beamdiag_tmp:path("beamdiag-x"),
        ?assertEqual("/var/tmp", filename:dirname(A)),
        ?assertMatch("beamdiag-x-" ++ _, filename:basename(A)),
        ?assertNotEqual(A, beamdiag_tmp:path("beamdiag-x")),
        %% An empty TMPDIR counts as unset.
        os:putenv("TMPDIR", ""),
        ?assertEqual("/tmp", filename:dirname(beamdiag_tmp:path("beamdiag-x")))
    after
        case Old of
            false -> os:unsetenv("TMPDIR");
            _ -> os:putenv("TMPDIR", Old)
        end
    end.
