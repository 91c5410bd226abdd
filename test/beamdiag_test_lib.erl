%%% Helpers shared by the Common Test suites.
-module(beamdiag_test_lib).

-export([missing/1]).

%% A tool the suite needs is missing: skipped on a developer's machine,
%% a failure in CI, where the set-up must have installed it.
missing(Why) ->
    case os:getenv("CI") of
        "true" -> ct:fail(["CI must install what this suite needs: " | Why]);
        _ -> {skip, Why}
    end.
