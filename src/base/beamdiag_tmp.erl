%%% @doc Temporary paths, in one place: under `TMPDIR' (an empty one
%%% counts as unset), else /tmp, named for beamdiag, this OS process and a
%%% number unique in this VM, so that two sessions never share one.
%%%
%%% ```
%%% 1> beamdiag_tmp:path("beamdiag-perf").
%%% "/tmp/beamdiag-perf-4242-7"
%%% '''
-module(beamdiag_tmp).

-export([path/1]).

%%%===================================================================
%%% API
%%%===================================================================

%% The folder temporary files go in.
root() ->
    case os:getenv("TMPDIR") of
        false -> "/tmp";
        "" -> "/tmp";
        T -> T
    end.

%% @doc A new path under `root/0': Prefix, this OS pid and a unique number,
%% joined by dashes. Nothing is created.
-spec path(string()) -> file:filename().
path(Prefix) ->
    filename:join(root(), lists:concat([Prefix, "-", os:getpid(), "-",
                                        erlang:unique_integer([positive])])).
