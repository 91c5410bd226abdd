%%% @doc The Common Test hook of the project's runs (rebar.config's
%%% ct_opts): it times every suite and prints a table of the wall times at
%%% the end of the run (also written to `suite_times.txt' in the log
%%% folder), and it lists every skip of the run, one line each in
%%% $BEAMDIAG_STARVED_FILE: a case's own skip, a configuration function's
%%% (once per suite and reason), and the automatic skips after a
%%% configuration function crashed, as "broken:" (scripts/test-run.sh
%%% fails the run on those). Two kinds are counted against a quota: the
%%% cases skipped because the host starved them (a reason that starts with
%%% "starved:", see beamdiag_test_lib:starved/2) and those whose pathology
%%% the host did not produce ("not produced on this host:",
%%% beamdiag_test_lib:not_produced/2). One starved skip is allowed and two
%%% not produced; in CI (CI=true) one more of either kind fails that case,
%%% and so the run: a host that cannot produce the pathologies is not a
%%% green run.
-module(beamdiag_cth).

-export([id/1, init/2, pre_init_per_suite/3, post_end_per_suite/4,
         pre_init_per_testcase/4, post_end_per_testcase/5, on_tc_skip/4, terminate/1]).
%% The one writer of the run's skip list, for the test lib's retries too.
-export([record/3]).

-record(state, {started = #{} :: #{atom() => {integer(), cpu()}},
                %% Each suite's wall time and the host's busy CPUs over it
                %% (from /proc/stat, apart from every beamdiag module).
                times = [] :: [{atom(), integer(), float()}],
                %% The same for each case (by suite, group and case), written
                %% to case_times.txt: which cases wait and which compute.
                case_started = #{} :: #{term() => {integer(), cpu()}},
                cases = [] :: [{term(), integer(), float()}],
                starved = [] :: [{atom(), atom(), string()}],
                %% The cases whose own skip was counted, and the skips of
                %% configuration functions (a suite's, a group's, a case's
                %% init) already counted, by suite and reason.
                seen = #{} :: #{{atom(), term()} => true},
                t0 :: integer()}).

-type cpu() :: #{all := non_neg_integer(), idle := non_neg_integer()} | undefined.

-spec id(term()) -> atom().
id(_Opts) ->
    ?MODULE.

-spec init(term(), term()) -> {ok, #state{}}.
init(_Id, _Opts) ->
    {ok, #state{t0 = now_ms()}}.

-spec pre_init_per_suite(atom(), term(), #state{}) -> {term(), #state{}}.
pre_init_per_suite(Suite, Config, S = #state{started = St}) ->
    {Config, S#state{started = St#{Suite => {now_ms(), host_cpu()}}}}.

-spec post_end_per_suite(atom(), term(), term(), #state{}) -> {term(), #state{}}.
post_end_per_suite(Suite, _Config, Return, S = #state{started = St, times = Ts}) ->
    case maps:find(Suite, St) of
        {ok, Start} -> {Return, S#state{times = [since(Suite, Start) | Ts]}};
        error -> {Return, S}
    end.

-spec pre_init_per_testcase(atom(), term(), term(), #state{}) -> {term(), #state{}}.
pre_init_per_testcase(Suite, Case, Config, S = #state{case_started = St}) ->
    Key = {Suite, group_of(Config), case_name(Case)},
    {Config, S#state{case_started = St#{Key => {now_ms(), host_cpu()}}}}.

-spec post_end_per_testcase(atom(), atom(), term(), term(), #state{}) -> {term(), #state{}}.
post_end_per_testcase(Suite, Case0, Config, Return, S0) ->
    skipped(Suite, Case0, Return, case_timed(Suite, Case0, Config, S0)).

case_timed(Suite, Case, Config, S = #state{case_started = St, cases = Cs}) ->
    Key = {Suite, group_of(Config), case_name(Case)},
    case maps:take(Key, St) of
        {Start, St1} -> S#state{case_started = St1, cases = [since(Key, Start) | Cs]};
        error -> S
    end.

skipped(Suite, Case0, Return = {skip, Why}, S0 = #state{seen = Seen}) ->
    Case = case_name(Case0),
    S = S0#state{seen = Seen#{{Suite, Case} => true}},
    Text = one_line(Why),
    case kind(Text) of
        none ->
            record(Suite, Case, Text),
            {Return, S#state{starved = [{Suite, Case, Text} | S#state.starved]}};
        {Kind, Allowed} ->
            Counted = [{Suite, Case, Text} | S#state.starved],
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
skipped(_Suite, _Case, Return, S) ->
    {Return, S}.

%% @doc Every other skip: the cases a configuration function skipped (an
%% init_per_suite or init_per_group returning `{skip, Why}', counted once
%% by suite and reason), and the automatic skips, which follow a
%% configuration function that crashed or failed: those are recorded as
%% "broken:", and scripts/test-run.sh fails the run on them (a case that
%% never ran is not green).
-spec on_tc_skip(atom(), term(), term(), #state{}) -> #state{}.
on_tc_skip(Suite, Name, {Kind, Why}, S = #state{seen = Seen, starved = Sv}) ->
    Case = case_name(Name),
    case maps:is_key({Suite, Case}, Seen) of
        true ->
            %% Its own skip, counted when it ended.
            S;
        false ->
            Text = case Kind of
                       tc_auto_skip -> "broken: " ++ one_line(Why);
                       _ -> one_line(Why)
                   end,
            Key = {Suite, {reason, Text}},
            case maps:is_key(Key, Seen) of
                true ->
                    S;
                false ->
                    record(Suite, Case, Text),
                    S#state{seen = Seen#{Key => true}, starved = [{Suite, Case, Text} | Sv]}
            end
    end;
on_tc_skip(_Suite, _Name, _Why, S) ->
    S.

case_name({Case, Group}) when is_atom(Case), is_atom(Group) -> Case;
case_name({init_per_group, _} = C) -> C;
case_name({end_per_group, _} = C) -> C;
case_name(C) -> C.

%% A reason on one line: the file that counts skips across runs has a
%% line each.
one_line(Why) ->
    [case C of $\n -> $\s; _ -> C end
     || C <- lists:flatten(io_lib:format("~ts", [reason_text(Why)]))].

%% The skips counted, by the start of their reason, and how many of each
%% a CI run allows.
kind(Text) ->
    case [K || K = {P, _} <- [{"starved:", 1}, {"not produced on this host:", 2}],
               lists:prefix(P, Text)] of
        [K] -> K;
        [] -> none
    end.

-spec terminate(#state{}) -> ok.
terminate(#state{times = Ts, cases = Cs, starved = Sv, t0 = T0}) ->
    Total = now_ms() - T0,
    Rows = lists:reverse(lists:keysort(2, Ts)),
    Table = ["\nWall time per suite (s), and the host's busy CPUs over it (of ",
             integer_to_list(cpus()), "):\n",
             [io_lib:format("  ~-34s ~8.1f ~6.2f~n", [atom_to_list(Su), Ms / 1000, Busy])
              || {Su, Ms, Busy} <- Rows],
             io_lib:format("  ~-34s ~8.1f~n", ["all suites (this run)", Total / 1000]),
             case Sv of
                 [] -> [];
                 _ -> ["Skipped (starved: the host starved them; not produced: the host "
                       "did not produce their pathology; broken: a configuration function "
                       "failed, so they never ran):\n",
                       [io_lib:format("  ~s:~w  ~ts~n", [Su, C, Why])
                        || {Su, C, Why} <- lists:reverse(Sv)]]
             end],
    io:format(user, "~ts", [Table]),
    _ = file:write_file(filename:join(logdir(), "suite_times.txt"), Table),
    _ = file:write_file(filename:join(logdir(), "case_times.txt"),
                        [io_lib:format("~8.1f ~6.2f ~s ~w ~w~n", [Ms / 1000, Busy, Su, G, C])
                         || {{Su, G, C}, Ms, Busy} <- lists:reverse(lists:keysort(2, Cs))],
                        [append]),
    ok.

%% The host's CPU counters, by the test lib's own /proc/stat reader
%% (apart from every beamdiag module); `undefined' if it cannot read them.
host_cpu() ->
    try beamdiag_test_lib:host_cpu()
    catch _:_ -> undefined
    end.

%% The wall time since Start and the CPUs the host kept busy meanwhile.
since(Key, {T0, Cpu0}) ->
    Busy = try beamdiag_test_lib:host_busy_since(Cpu0) * cpus()
           catch _:_ -> 0.0
           end,
    {Key, now_ms() - T0, Busy}.

cpus() ->
    case erlang:system_info(logical_processors_available) of
        N when is_integer(N) -> N;
        _ -> erlang:system_info(logical_processors)
    end.

group_of(Config) when is_list(Config) ->
    case proplists:get_value(tc_group_properties, Config) of
        Props when is_list(Props) -> proplists:get_value(name, Props);
        _ -> undefined
    end;
group_of(_) -> undefined.

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

%% @doc Appends a line to the run's list (nothing outside `make test'):
%% the suite, the case and the reason, on one line.
-spec record(atom(), term(), iodata()) -> ok.
record(Suite, Case, Why) ->
    case os:getenv("BEAMDIAG_STARVED_FILE") of
        false -> ok;
        File -> _ = file:write_file(File, io_lib:format("~s:~w ~ts~n", [Suite, Case, one_line(Why)]),
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
