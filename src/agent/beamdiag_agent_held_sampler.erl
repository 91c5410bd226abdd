%%% @doc The stand-in for the system monitor when the node's is taken: a
%%% sampler that finds a process holding its scheduler without the
%%% runtime's `long_schedule' events. Runs on the target node (erts,
%%% kernel and stdlib only); started by `beamdiag_agent_sysmon', which
%%% folds the samples into its report.
%%%
%%% Why answers, not statuses. A process inside a plain NIF handles no
%%% signal until the NIF returns, so `process_info/2' asked of it from
%%% another scheduler is answered only then, and says `waiting' (it reads
%%% the process at its next `receive'); a process running Erlang code
%%% answers within its time slice, well under a millisecond. So a process
%%% that takes `?HELD_MS' ms or more to answer held its scheduler for at
%%% least that long, and the answer's `current_function' is where it was
%%% held (for a NIF, the Erlang function that called it).
%%%
%%% Where the samplers run. A process waiting on the held scheduler runs
%%% only in the holder's gaps, and its timers fire there (each scheduler
%%% keeps its own): it then sees the holder idle. So up to `?SAMPLERS'
%%% samplers run at high priority, each bound to one normal scheduler
%%% (spread over them; the `scheduler' spawn option, undocumented, present
%%% on OTP 25 to 29; unbound where it is refused). Their periods are
%%% jittered (a fixed period locks onto the holder's cycle). A sampler
%%% that wakes `?HELD_MS' ms or more late was itself on a held scheduler:
%%% it samples nothing that tick, and counts a sign.
%%%
%%% What they do. With nothing to sample, only look for a sign: each
%%% every `?IDLE_MS' ms (a hold is seen when a look falls inside it). At a
%%% new sign, a sampler that
%%% was on time walks the process table once (`process_info(P, status)'
%%% for every process, each answer timed), and the processes that took
%%% `?HELD_MS' ms or more to answer become the candidates (at most
%%% `?CANDIDATES', slowest first), shared with every sampler through the
%%% watcher. Then each sampler asks each candidate
%%% `[current_function, registered_name, initial_call]' every `?TICK_MS'
%%% ms (10 Hz each; a sampler on the held scheduler skips its late ticks).
%%% Walks: at
%%% most `?WALKS' a session, `?WALK_GAP_MS' ms apart, none above
%%% `?WALK_MAX' processes, each cut at `?WALK_MS' ms. The samplers end
%%% with the watcher (they monitor it).
%%%
%%% The aggregate (`new/0', `add/2', `entries/1', `info/1'), kept by the
%%% watcher, per process: samples, held samples (`count'), the longest run
%%% of held samples in a row in the same function (`consecutive'), the
%%% longest answer (`longest_ms', a lower bound of the longest hold) and
%%% the time held in all (`total_ms', estimated: each held sample stands
%%% for the time since the one before, at most one sampler's period), the
%%% time from its first sample to its last (`watched_ms'), and the late
%%% answers that followed a garbage collection (`collected': the minor
%%% collection count moved since the sample before; a large heap is
%%% collected on a dirty scheduler and the process answers after it, so
%%% those are not counted as held).
%%%
%%% Cost, measured on OTP 25 (2 schedulers, 10,000 idle processes, the
%%% CPU of every thread of the VM from /proc, 10 s side by side three
%%% times): the 2 samplers with no sign added 6 to 14 ms of CPU per 10 s
%%% (0.06% to 0.14% of one core, mostly waking sleeping schedulers). A
%%% walk at 10,000 processes: 3.6 to 4.8 ms of CPU, against 4.6 to 7.3 ms
%%% for the start walk measured beside it. Not measured: a CPU-bound node,
%%% where the schedulers do not sleep and a look costs microseconds.
%%%
%%% ```
%%% 1> Samplers = beamdiag_agent_held_sampler:start(self(), []).
%%% 2> receive {beamdiag_held, M} -> beamdiag_agent_held_sampler:add(M, beamdiag_agent_held_sampler:new()) end.
%%% '''
-module(beamdiag_agent_held_sampler).

-export([start/2, share/2, new/0, add/2, found/1, candidates/1, entries/1, info/1]).

-export_type([aggregate/0, raw_entry/0, info/0, walk/0]).

-type aggregate() :: #{atom() => term()}.
-type raw_entry() :: #{atom() => term()}.
%% What info/1 says of the samplers (the watcher adds their number,
%% `samplers').
-type info() :: #{
    samples := non_neg_integer(),
    signs := non_neg_integer(),
    walks := [walk()],
    candidates := non_neg_integer(),
    rate_hz := pos_integer(),
    held_ms := pos_integer(),
    bounds := #{samplers | candidates | walks | walk_max | walk_ms => pos_integer()},
    samplers => non_neg_integer()
}.
%% One walk of the table at a sign: skipped above the bound, else how many
%% processes it read, how many were slow, and whether it stopped early.
-type walk() :: #{
    walk_us := non_neg_integer(),
    skipped => too_many_processes,
    read => non_neg_integer(),
    slow => non_neg_integer(),
    truncated => boolean()
}.

%% An answer this slow (ms) means the process held its scheduler.
-define(HELD_MS, 10).
%% The samplers' combined period (ms): each sampler's is this times their
%% number, jittered by up to a fifth either way.
-define(TICK_MS, 100).
%% A sampler's period while there is nothing to sample (ms): it only looks
%% for a sign then, and waking idle schedulers costs more than the look.
-define(IDLE_MS, 500).
-define(SAMPLERS, 4).
-define(CANDIDATES, 8).
-define(WALKS, 3).
-define(WALK_GAP_MS, 1000).
-define(WALK_MAX, 50000).
-define(WALK_MS, 200).
%% A sampler whose candidates were not held for this long (ms) may walk
%% again at the next sign.
-define(QUIET_MS, 2000).
%% Processes kept in the aggregate.
-define(MAX_PIDS, 32).
%% The shared atomics: signs so far, walks so far, the last walk's time.
-define(SIGNS, 1).
-define(WALKS_DONE, 2).
-define(LAST_WALK, 3).
%% ...and the last time a sampler found a candidate held.
-define(HELD_AT, 4).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Starts the samplers for Watcher, which gets their messages as
%% `{beamdiag_held, Msg}' (to fold with `add/2') and shares the
%% candidates with `share/2'; Skip: pids never sampled (the agent's own).
-spec start(pid(), [pid()]) -> [pid()].
start(Watcher, Skip) ->
    Online = erlang:system_info(schedulers_online),
    N = min(Online, ?SAMPLERS),
    Shared = atomics:new(4, [{signed, true}]),
    %% (Monotonic time may be negative: the first walk is due at once.)
    Now = erlang:monotonic_time(millisecond),
    atomics:put(Shared, ?LAST_WALK, Now - ?WALK_GAP_MS),
    atomics:put(Shared, ?HELD_AT, Now - ?QUIET_MS),
    Scheds = lists:usort([1 + (I * Online) div N || I <- lists:seq(0, N - 1)]),
    [beamdiag_agent_spawn:bound(Sched, fun() -> init(Watcher, Shared, Sched, ?TICK_MS, Skip) end,
                                [{priority, high}])
     || Sched <- Scheds].

%% @doc Gives every sampler the candidates.
-spec share([pid()], [pid()]) -> ok.
share(Samplers, Candidates) ->
    _ = [S ! {beamdiag_held_candidates, Candidates} || S <- Samplers],
    ok.

%% @doc An empty aggregate.
-spec new() -> aggregate().
new() ->
    #{pids => #{}, samples => 0, signs => 0, walks => [], candidates => []}.

%% @doc Folds one sampler message into the aggregate.
-spec add(term(), aggregate()) -> aggregate().
add({samples, Period, Rows}, Agg = #{samples := N}) ->
    lists:foldl(fun(Row, A) -> sample(Row, Period, A) end,
                Agg#{samples := N + length(Rows)}, Rows);
add({late, _Sched, _LateMs}, Agg = #{signs := S}) ->
    Agg#{signs := S + 1};
add({walked, Info, Found}, Agg = #{walks := Ws, candidates := Cs}) ->
    Agg#{walks := lists:sublist(Ws ++ [Info], ?WALKS),
         candidates := lists:sublist(Cs ++ (Found -- Cs), ?CANDIDATES)};
add(_, Agg) ->
    Agg.

%% @doc Whether a sampler message found a process held.
-spec found(term()) -> boolean().
found({samples, _, Rows}) ->
    lists:any(fun(Row) -> held(Row) end, Rows);
found(_) ->
    false.

%% @doc The candidates so far, for `share/2'.
-spec candidates(aggregate()) -> [pid()].
candidates(#{candidates := Cs}) ->
    Cs.

%% @doc The processes seen held at least once, the most held first, as
%% raw entries (`where': held samples by `{M, F, A}'; the watcher names
%% the rest).
-spec entries(aggregate()) -> [raw_entry()].
entries(#{pids := Pids}) ->
    Held = [E || E = #{count := C} <- maps:values(Pids), C > 0],
    [(maps:without([run, first_at, last_at, last_fun, gcs], E))#{
         watched_ms => maps:get(last_at, E) - maps:get(first_at, E)}
     || {_, E} <- lists:reverse(lists:keysort(1, [{maps:get(total_ms, E), E} || E <- Held]))].

%% @doc What the samplers did: for the report's `sampler' entry.
-spec info(aggregate()) -> info().
info(#{samples := N, signs := S, walks := Ws, candidates := Cs}) ->
    #{samples => N, signs => S, walks => Ws, candidates => length(Cs),
      rate_hz => 1000 div ?TICK_MS, held_ms => ?HELD_MS,
      bounds => #{samplers => ?SAMPLERS, candidates => ?CANDIDATES, walks => ?WALKS,
                  walk_max => ?WALK_MAX, walk_ms => ?WALK_MS}}.

%%%===================================================================
%%% Internal: the samplers
%%%===================================================================

init(Watcher, Shared, Sched, Period, Skip) ->
    MRef = erlang:monitor(process, Watcher),
    Now = now_ms(),
    loop(#{watcher => Watcher, mref => MRef, shared => Shared, sched => Sched,
           period => Period, skip => [self(), Watcher | Skip], candidates => [],
           signs_seen => 0, due => Now + jitter(Period)}).

loop(S = #{mref := MRef, due := Due}) ->
    receive
        {'DOWN', MRef, process, _, _} ->
            ok;
        {beamdiag_held_candidates, Cs} ->
            loop(S#{candidates := Cs})
    after max(0, Due - now_ms()) ->
        loop(tick(S))
    end.

tick(S = #{watcher := W, shared := Shared, sched := Sched, period := Period, due := Due}) ->
    Now = now_ms(),
    case Now - Due of
        Late when Late >= ?HELD_MS ->
            %% This sampler's own scheduler was held: its answers would
            %% be late too. A sign for the others.
            atomics:add(Shared, ?SIGNS, 1),
            W ! {beamdiag_held, {late, Sched, Late}},
            S#{due := now_ms() + jitter(Period)};
        _ ->
            S2 = #{candidates := Cs} = sample(maybe_walk(S, Now)),
            Next = case Cs of
                       [] -> ?IDLE_MS;
                       _ -> Period
                   end,
            S2#{due := now_ms() + jitter(Next)}
    end.

%% A walk at a sign not seen before, when no candidate has been found held
%% for ?QUIET_MS (or there are none), within the session's walk budget. The candidates found are sampled at once, and go to the
%% other samplers through the watcher.
maybe_walk(S = #{shared := Shared, signs_seen := Seen, watcher := W, skip := Skip,
                 candidates := Cs}, Now) ->
    Signs = atomics:get(Shared, ?SIGNS),
    case Signs > Seen andalso Now - atomics:get(Shared, ?HELD_AT) >= ?QUIET_MS
        andalso may_walk(Shared, Now) of
        true ->
            {Info, Found} = walk(Skip),
            W ! {beamdiag_held, {walked, Info, Found}},
            S#{signs_seen := Signs, candidates := lists:sublist(Cs ++ (Found -- Cs), ?CANDIDATES)};
        false ->
            S#{signs_seen := Signs}
    end.

may_walk(Shared, Now) ->
    Last = atomics:get(Shared, ?LAST_WALK),
    Now - Last >= ?WALK_GAP_MS
        andalso atomics:compare_exchange(Shared, ?LAST_WALK, Last, Now) =:= ok
        andalso atomics:add_get(Shared, ?WALKS_DONE, 1) =< ?WALKS.

%% One timed status read per process; the slowest answers are the
%% candidates.
walk(Skip) ->
    T0 = erlang:monotonic_time(microsecond),
    case erlang:system_info(process_count) > ?WALK_MAX of
        true ->
            {#{skipped => too_many_processes, walk_us => 0}, []};
        false ->
            Pids = erlang:processes() -- Skip,
            {Slow, Read, Cut} = walk(Pids, T0, T0 + ?WALK_MS * 1000, [], 0),
            T1 = erlang:monotonic_time(microsecond),
            Found = [P || {_, P} <- beamdiag_agent_top:largest(?CANDIDATES, Slow)],
            {#{read => Read, slow => length(Slow), walk_us => T1 - T0, truncated => Cut}, Found}
    end.

walk([], _, _, Slow, Read) ->
    {Slow, Read, false};
walk(_, T, Deadline, Slow, Read) when T > Deadline ->
    {Slow, Read, true};
walk([P | Ps], T0, Deadline, Slow, Read) ->
    _ = erlang:process_info(P, status),
    T1 = erlang:monotonic_time(microsecond),
    Slow2 = case T1 - T0 >= ?HELD_MS * 1000 of
                true -> lists:sublist([{T1 - T0, P} | Slow], 4 * ?CANDIDATES);
                false -> Slow
            end,
    walk(Ps, T1, Deadline, Slow2, Read + 1).

%% Each candidate asked once, each answer timed; the rows go to the
%% watcher.
sample(S = #{candidates := []}) ->
    S;
sample(S = #{candidates := Cs, watcher := W, period := Period, shared := Shared}) ->
    Rows = [Row || P <- Cs, Row <- [ask(P)], Row =/= gone],
    W ! {beamdiag_held, {samples, Period, Rows}},
    _ = case lists:any(fun(Row) -> held(Row) end, Rows) of
            true -> atomics:put(Shared, ?HELD_AT, now_ms());
            false -> ok
        end,
    S.

ask(P) ->
    T0 = erlang:monotonic_time(microsecond),
    case erlang:process_info(P, [current_function, registered_name, initial_call,
                                 garbage_collection]) of
        [{_, Fun}, {_, Name}, {_, Init}, {_, GC}] ->
            T1 = erlang:monotonic_time(microsecond),
            Gcs = case lists:keyfind(minor_gcs, 1, GC) of
                      {_, N} -> N;
                      false -> undefined
                  end,
            {P, T1 - T0, Fun, Name, Init, T1 div 1000, Gcs};
        _ ->
            gone
    end.

held(Row) ->
    element(2, Row) >= ?HELD_MS * 1000.

jitter(Period) ->
    Period - Period div 5 + erlang:phash2(erlang:unique_integer(), 2 * (Period div 5) + 1).

now_ms() ->
    erlang:monotonic_time(millisecond).

%%%===================================================================
%%% Internal: the aggregate
%%%===================================================================

sample(Row = {P, Us, Fun, Name, Init, At, Gcs}, Period, Agg = #{pids := Pids}) ->
    case maps:find(P, Pids) of
        {ok, E = #{gcs := Gcs0}} ->
            %% A late answer with a collection since the sample before
            %% may be the collection's (a large heap is collected on a
            %% dirty scheduler, and the process answers after it): it is
            %% counted apart, not as held.
            Collected = is_integer(Gcs0) andalso is_integer(Gcs) andalso Gcs =/= Gcs0,
            E2 = case held(Row) andalso Collected of
                     true -> update(E#{collected := maps:get(collected, E) + 1}, false, Us, Fun,
                                    At, Period);
                     false -> update(E, held(Row), Us, Fun, At, Period)
                 end,
            Agg#{pids := Pids#{P := E2#{gcs := Gcs}}};
        error when map_size(Pids) < ?MAX_PIDS ->
            E0 = #{pid => P, name => Name, initial_call => Init, samples => 0, count => 0,
                   run => 0, consecutive => 0, longest_ms => 0, total_ms => 0, collected => 0,
                   where => #{}, first_at => At, last_at => At - ?TICK_MS,
                   last_fun => undefined, gcs => Gcs},
            Agg#{pids := Pids#{P => update(E0, held(Row), Us, Fun, At, Period)}};
        error ->
            Agg
    end.

update(E = #{samples := N}, false, _Us, Fun, At, _Period) ->
    E#{samples := N + 1, run := 0, last_at := At, last_fun := Fun};
update(E = #{samples := N, count := C, run := Run, consecutive := Con, longest_ms := L,
             total_ms := Tot, where := W, last_at := Last, last_fun := LastFun},
       true, Us, Fun, At, Period) ->
    Run2 = case Run > 0 andalso LastFun =:= Fun of
               true -> Run + 1;
               false -> 1
           end,
    Spacing = max(0, min(At - Last, Period)),
    E#{samples := N + 1, count := C + 1, run := Run2, consecutive := max(Con, Run2),
       longest_ms := max(L, Us div 1000), total_ms := Tot + Spacing,
       where := maps:update_with(Fun, fun(K) -> K + 1 end, 1, W),
       last_at := At, last_fun := Fun}.
