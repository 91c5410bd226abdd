%%% Helpers shared by the Common Test suites.
-module(beamdiag_test_lib).

-export([missing/1, fixture/1]).

%% A tool the suite needs is missing: skipped on a developer's machine,
%% a failure in CI, where the set-up must have installed it.
missing(Why) ->
    case os:getenv("CI") of
        "true" -> ct:fail(["CI must install what this suite needs: " | Why]);
        _ -> {skip, Why}
    end.

%% A file under test/fixtures, found from where the beamdiag modules were
%% loaded, whatever directory the suite runs in.
fixture(Rel) ->
    fixture(filename:dirname(filename:dirname(code:which(beamdiag))), Rel).

fixture("/", Rel) ->
    error({no_fixture, Rel});
fixture(Dir, Rel) ->
    F = filename:join([Dir, "test", "fixtures", Rel]),
    case filelib:is_regular(F) of
        true -> F;
        false -> fixture(filename:dirname(Dir), Rel)
    end.
