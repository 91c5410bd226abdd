%%% @doc The Common Test hook of the project's runs (rebar.config's
%%% ct_opts): it times every suite and prints a table of the wall times at
%%% the end of the run (also written to `suite_times.txt' in the log
%%% folder), and it counts two kinds of skips: the cases skipped because
%%% the host starved them (a reason that starts with "starved:", see
%%% beamdiag_test_lib:starved/2) and those whose pathology the host did not
%%% produce (a reason that starts with "not produced on this host:",
%%% beamdiag_test_lib:not_produced/2). Both are listed at the end of the
%%% run. One starved skip is allowed and two not produced; in CI (CI=true)
%%% one more of either kind fails that case, and so the run: a host that
%%% cannot produce the pathologies is not a green run.
-module(beamdiag_cth).

-export([id/1, init/2, pre_init_per_suite/3, post_end_per_suite/4,
         post_end_per_testcase/5, terminate/1]).

-record(state, {started = #{} :: #{atom() => integer()},
                times = [] :: [{atom(), integer()}],
                starved = [] :: [{atom(), atom(), string()}],
                t0 :: integer()}).

-spec id(term()) -> atom().
id(_Opts) ->
    ?MODULE.

-spec init(term(), term()) -> {ok, #state{}}.
init(_Id, _Opts) ->
    {ok, #state{t0 = now_ms()}}.

-spec pre_init_per_suite(atom(), term(), #state{}) -> {term(), #state{}}.
pre_init_per_suite(Suite, Config, S = #state{started = St}) ->
    {Config, S#state{started = St#{Suite => now_ms()}}}.

-spec post_end_per_suite(atom(), term(), term(), #state{}) -> {term(), #state{}}.
post_end_per_suite(Suite, _Config, Return, S = #state{started = St, times = Ts}) ->
    case maps:find(Suite, St) of
        {ok, T0} -> {Return, S#state{times = [{Suite, now_ms() - T0} | Ts]}};
        error -> {Return, S}
    end.

-spec post_end_per_testcase(atom(), atom(), term(), term(), #state{}) -> {term(), #state{}}.
post_end_per_testcase(Suite, Case, _Config, Return = {skip, Why}, S = #state{starved = Sv}) ->
    %% One line per skip: the file that counts them across runs has a
    %% line each.
    Text = [case C of $\n -> $\s; _ -> C end
            || C <- lists:flatten(io_lib:format("~ts", [reason_text(Why)]))],
    case kind(Text) of
        none ->
            {Return, S};
        {Kind, Allowed} ->
            Counted = [{Suite, Case, Text} | Sv],
            S1 = S#state{starved = Counted},
            %% Earlier CT runs of the same `make test' (scripts/test-run.sh)
            %% count too.
            Total = case recorded(Kind) of
                        undefined -> length([1 || {_, _, T} <- Counted, lists:prefix(Kind, T)]);
                        Before -> Before + 1
                    end,
            record(Suite, Case, Text),
            case os:getenv("CI") =:= "true" andalso Total > Allowed of
                true ->
                    {{fail, lists:flatten(io_lib:format(
                        "CI: ~b cases skipped as \"~s\" (~b allowed): ~p",
                        [Total, Kind, Allowed,
                         [{Su, C} || {Su, C, T} <- Counted, lists:prefix(Kind, T)]]))},
                     S1};
                false ->
                    {Return, S1}
            end
    end;
post_end_per_testcase(_Suite, _Case, _Config, Return, S) ->
    {Return, S}.

%% The skips counted, by the start of their reason, and how many of each
%% a CI run allows.
kind(Text) ->
    case [K || K = {P, _} <- [{"starved:", 1}, {"not produced on this host:", 2}],
               lists:prefix(P, Text)] of
        [K] -> K;
        [] -> none
    end.

-spec terminate(#state{}) -> ok.
terminate(#state{times = Ts, starved = Sv, t0 = T0}) ->
    Total = now_ms() - T0,
    Rows = lists:reverse(lists:keysort(2, Ts)),
    Table = ["\nWall time per suite (s):\n",
             [io_lib:format("  ~-34s ~8.1f~n", [atom_to_list(Su), Ms / 1000]) || {Su, Ms} <- Rows],
             io_lib:format("  ~-34s ~8.1f~n", ["all suites (this run)", Total / 1000]),
             case Sv of
                 [] -> [];
                 _ -> ["Skipped because the host starved them or did not produce their "
                       "pathology:\n",
                       [io_lib:format("  ~s:~s  ~ts~n", [Su, C, Why])
                        || {Su, C, Why} <- lists:reverse(Sv)]]
             end],
    io:format(user, "~ts", [Table]),
    _ = file:write_file(filename:join(logdir(), "suite_times.txt"), Table),
    ok.

%% Skips of a kind (the start of their reason) recorded so far by every
%% CT run of this `make test', one line each in $BEAMDIAG_STARVED_FILE
%% (scripts/test-run.sh empties it first); `undefined' outside `make test'.
recorded(Kind) ->
    case os:getenv("BEAMDIAG_STARVED_FILE") of
        false -> undefined;
        File ->
            case file:read_file(File) of
                {ok, B} ->
                    length([1 || Line <- binary:split(B, <<"\n">>, [global, trim_all]),
                                 [_, Why] <- [binary:split(Line, <<" ">>)],
                                 lists:prefix(Kind, binary_to_list(Why))]);
                {error, _} -> 0
            end
    end.

record(Suite, Case, Why) ->
    case os:getenv("BEAMDIAG_STARVED_FILE") of
        false -> ok;
        File -> _ = file:write_file(File, io_lib:format("~s:~s ~ts~n", [Suite, Case, Why]),
                                    [append]),
                ok
    end.

reason_text(R) when is_list(R) -> R;
reason_text(R) when is_binary(R) -> R;
reason_text({tc_user_skip, R}) -> reason_text(R);
reason_text(R) -> io_lib:format("~p", [R]).

now_ms() ->
    erlang:monotonic_time(millisecond).

%% The run's log folder (rebar.config: _build/test/logs), from where this
%% module was loaded: _build/test/lib/beamdiag/test or .../ebin.
logdir() ->
    Dir = filename:join([filename:dirname(filename:dirname(filename:dirname(filename:dirname(
              code:which(?MODULE))))), "logs"]),
    case filelib:is_dir(Dir) of
        true -> Dir;
        false -> "."
    end.
