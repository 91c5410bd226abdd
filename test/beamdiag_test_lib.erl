%%% Helpers shared by the Common Test suites.
-module(beamdiag_test_lib).

-export([missing/1, fixture/1, escript/0]).

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

%% The built escript, found above where the beamdiag modules were loaded
%% from (`_build/PROFILE/lib/beamdiag/ebin'), whatever directory the suite
%% runs in: `{ok, Path}', or `error' when it has not been built.
escript() ->
    escript(filename:dirname(code:which(beamdiag))).

escript(Dir) ->
    E = filename:join([Dir, "_build", "default", "bin", "beamdiag"]),
    case filelib:is_regular(E) of
        true -> {ok, E};
        false when Dir =:= "/" -> error;
        false -> escript(filename:dirname(Dir))
    end.
