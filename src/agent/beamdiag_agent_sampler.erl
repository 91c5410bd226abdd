%%% @doc An Erlang-level CPU sampler that runs on the target node.
%%%
%%% `run/1' executes on the node being profiled (it depends on erts,
%%% kernel and stdlib only, so `beamdiag_profile' can load it over
%%% distribution):
%%% at a prime rate (97 Hz by default) it looks at a bounded set of
%%% processes, and for those whose status is `running' or `runnable' takes
%%% `process_info(P, [current_function, current_stacktrace])' and counts the
%%% stack, with the current function as its leaf when the stacktrace lacks
%%% it (a BIF's trap continuation, `erts_internal:binary_to_term_trap/1'). The result
%%% is folded stacks, `[<<"erlang">>, RootFrame, ..., LeafFrame]' to counts,
%%% the same shape `beamdiag_fold' produces.
%%%
%%% Bounds, for nodes with a million processes: the process list is read
%%% at most once per `refresh' seconds, and not at all above `max_list'
%%% processes after the first read (the snapshot is reused); each tick
%%% looks at no more than `per_tick' processes: the hot set (processes
%%% found running or runnable recently, at most 64) plus the next window
%%% of the snapshot, so the whole snapshot is covered round-robin. Each
%%% stack is cut at `depth' frames and the number of distinct stacks at
%%% `max_stacks'. The run stops by itself after `duration' seconds.
%%%
%%% Bias: a running process answers `process_info' at its next signal
%%% check, so stacks lean towards those points; processes outside the hot
%%% set are found only when the window reaches them.
%%%
%%% ```
%%% 1> {ok, R} = beamdiag_profile:profile('app@host', #{erlang => true, duration => 5}, fun(_) -> ok end).
%%% 2> maps:get(samples, R).
%%% 812
%%% '''
-module(beamdiag_agent_sampler).

-export([run/1, defaults/0, modules/0]).
%% Called on the target through erpc:call/5 by beamdiag_profile
%% (and bench/sampler_overhead.escript).
-ignore_xref([{run, 1}]).

-export_type([options/0, result/0, process_stacks/0]).

-type options() :: #{
    duration => pos_integer(),
    frequency => pos_integer(),
    per_tick => pos_integer(),
    refresh => pos_integer(),
    max_list => pos_integer(),
    depth => pos_integer(),
    max_stacks => pos_integer(),
    askers => pos_integer()
}.
-type result() :: #{
    stacks := #{[binary()] => pos_integer()},
    samples := non_neg_integer(),
    ticks := non_neg_integer(),
    looked_at := non_neg_integer(),
    list_reads := non_neg_integer(),
    skipped_ticks := non_neg_integer(),
    process_count := non_neg_integer(),
    duration_ms := non_neg_integer(),
    processes := [process_stacks()]
}.
%% One process's hot stacks: how often it was seen running, and where.
-type process_stacks() :: #{pid := binary(), samples := pos_integer(),
                            stacks := [#{stack := [binary()], count := pos_integer()}]}.

-define(HOT_MAX, 64).
%% Stacks kept per process, for at most ?PROCS_MAX processes: the hot
%% stacks of the processes that ran most (their pids are matched with the
%% diagnosis' top processes). The result keeps ?PROCS_TOP processes with
%% ?STACKS_TOP stacks each.
-define(PROCS_MAX, 256).
-define(STACKS_PER_PROC, 100).
-define(PROCS_TOP, 10).
-define(STACKS_TOP, 10).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc 10 s at 97 Hz, 200 processes a tick, the process list re-read at
%% most every 10 s and only while the node has at most 100,000 processes.
-spec defaults() -> options().
defaults() ->
    #{
        duration => 10,
        frequency => 97,
        per_tick => 200,
        refresh => 10,
        max_list => 100000,
        depth => 64,
        max_stacks => 50000,
        askers => 4
    }.

%% @doc The modules the sampler needs on the target: itself alone. It is
%% shipped beside a running agent (`diagnose --perf'), whose modules the
%% loader will not reuse while that agent may still delete them, so it
%% calls none of them.
-spec modules() -> [module()].
modules() ->
    [?MODULE].

%% @doc Samples this node; returns when `duration' has passed.
-spec run(options()) -> result().
run(Opts0) ->
    Opts = maps:merge(defaults(), Opts0),
    #{duration := D, frequency := Hz} = Opts,
    true = is_integer(D) andalso D >= 1 andalso D =< 600,
    true = is_integer(Hz) andalso Hz >= 1 andalso Hz =< 1000,
    Now = erlang:monotonic_time(microsecond),
    St0 = #{
        opts => Opts,
        start => Now,
        stop => Now + D * 1000000,
        interval => 1000000 div Hz,
        snapshot => {},
        cursor => 1,
        next_refresh => Now,
        hot => [],
        stacks => #{},
        by_pid => #{},
        samples => 0,
        ticks => 0,
        looked_at => 0,
        list_reads => 0,
        idle => [],
        busy => 0,
        skipped => 0
    },
    %% High priority so that ticks stay on time on a busy node; the old
    %% priority is put back. The askers call process_info: a running
    %% process answers only at its next signal check, which can be tens of
    %% milliseconds into a long BIF, so the sampler itself never waits.
    Old = process_flag(priority, high),
    Self = self(),
    #{askers := NA, depth := Depth} = Opts,
    Askers = [spawn_link(fun() -> asker(Self, Depth) end) || _ <- lists:seq(1, NA)],
    St = try
        drain(loop(Now, St0#{idle := Askers, askers => Askers}), 1000)
    after
        [begin unlink(A), exit(A, kill) end || A <- Askers],
        process_flag(priority, Old)
    end,
    #{
        stacks => maps:get(stacks, St),
        samples => maps:get(samples, St),
        ticks => maps:get(ticks, St),
        looked_at => maps:get(looked_at, St),
        list_reads => maps:get(list_reads, St),
        skipped_ticks => maps:get(skipped, St),
        process_count => erlang:system_info(process_count),
        duration_ms => (erlang:monotonic_time(microsecond) - Now) div 1000,
        processes => top_processes(maps:get(by_pid, St))
    }.

%%%===================================================================
%%% Internal
%%%===================================================================

loop(Now, St = #{stop := Stop}) when Now >= Stop ->
    St;
loop(Now, St0 = #{interval := I}) ->
    St = tick(refresh(Now, St0)),
    Next = Now + I,
    loop(Next, results(Next, St)).

%% Takes the askers' answers until the next tick is due.
results(Next, St) ->
    Wait = max(0, Next - erlang:monotonic_time(microsecond)) div 1000,
    receive
        {found, Asker, Found} ->
            results(Next, found(Asker, Found, St))
    after Wait ->
        St
    end.

%% Waits a little for answers still out at the end.
drain(St = #{busy := 0}, _) ->
    St;
drain(St, Ms) ->
    receive
        {found, Asker, Found} -> drain(found(Asker, Found, St), Ms)
    after Ms ->
        St
    end.

found(Asker, Found, St = #{idle := Idle, busy := B, hot := Hot}) ->
    St2 = lists:foldl(fun({Pid, Key}, Acc) -> count_pid(Pid, Key, count(Key, Acc)) end, St,
                      Found),
    NewHot = lists:sublist(lists:usort([P || {P, _} <- Found] ++ Hot), ?HOT_MAX),
    St2#{idle := [Asker | Idle], busy := B - 1, hot := NewHot}.

asker(Sampler, Depth) ->
    receive
        {look, Pids} ->
            Found = lists:filtermap(fun(P) -> look(P, Depth) end, Pids),
            Sampler ! {found, self(), Found},
            asker(Sampler, Depth)
    end.

%% Re-reads the process list when it is due and the node is small enough;
%% a big node keeps its first snapshot.
refresh(Now, St = #{next_refresh := NR, snapshot := Snap, opts := Opts}) when Now >= NR ->
    #{refresh := R, max_list := Max} = Opts,
    Count = erlang:system_info(process_count),
    case Count =< Max orelse tuple_size(Snap) =:= 0 of
        true ->
            St#{snapshot := list_to_tuple(erlang:processes()),
                cursor := 1,
                next_refresh := Now + R * 1000000,
                list_reads := maps:get(list_reads, St) + 1};
        false ->
            St#{next_refresh := Now + R * 1000000}
    end;
refresh(_Now, St) ->
    St.

%% Hands this tick's candidates to the idle askers; with none idle the
%% tick is skipped (counted).
tick(St = #{idle := []}) ->
    St#{ticks := maps:get(ticks, St) + 1, skipped := maps:get(skipped, St) + 1};
tick(St = #{snapshot := Snap, cursor := Cur, hot := Hot, idle := Idle, busy := B,
            askers := Askers, opts := #{per_tick := PT}}) ->
    Size = tuple_size(Snap),
    N = min(max(0, PT - length(Hot)), Size),
    {Window, Cur2} = window(Snap, Cur, N, Size, []),
    Self = self(),
    Candidates = lists:usort(Hot ++ Window) -- [Self | Askers],
    Batches = split(Candidates, length(Idle)),
    {Used, Rest} = lists:split(length(Batches), Idle),
    _ = [A ! {look, Batch} || {A, Batch} <- lists:zip(Used, Batches)],
    St#{
        cursor := Cur2,
        hot := [],
        idle := Rest,
        busy := B + length(Used),
        ticks := maps:get(ticks, St) + 1,
        looked_at := maps:get(looked_at, St) + length(Candidates)
    }.

%% Up to N non-empty batches of about equal size.
split([], _) ->
    [];
split(L, N) ->
    Size = (length(L) + N - 1) div N,
    split_n(L, Size).

split_n([], _) -> [];
split_n(L, Size) when length(L) =< Size -> [L];
split_n(L, Size) ->
    {H, T} = lists:split(Size, L),
    [H | split_n(T, Size)].

window(_Snap, Cur, 0, _Size, Acc) ->
    {Acc, Cur};
window(Snap, Cur, N, Size, Acc) when Cur > Size ->
    window(Snap, 1, N, Size, Acc);
window(Snap, Cur, N, Size, Acc) ->
    window(Snap, Cur + 1, N - 1, Size, [element(Cur, Snap) | Acc]).

look(P, Depth) ->
    case erlang:process_info(P, status) of
        {status, S} when S =:= running; S =:= runnable ->
            case erlang:process_info(P, [current_function, current_stacktrace]) of
                [{current_function, Fun}, {current_stacktrace, Stack}] ->
                    Frames = [frame(F) || F <- lists:sublist(with_current(Fun, Stack), Depth)],
                    {true, {P, [<<"erlang">> | lists:reverse(Frames)]}};
                undefined ->
                    false
            end;
        _ ->
            false
    end.

%% A BIF that traps (binary_to_term of a large term, ...) runs as its trap
%% continuation, which is the current function but not on the stacktrace:
%% it becomes the leaf, above the Erlang function that called the BIF.
with_current({M, F, A}, Stack = [{M, F, A, _} | _]) -> Stack;
with_current({M, F, A}, Stack) -> [{M, F, A, []} | Stack];
with_current(_, Stack) -> Stack.

count(Key, St = #{stacks := Stacks, samples := N, opts := #{max_stacks := Max}}) ->
    Stacks2 = case Stacks of
        #{Key := C} -> Stacks#{Key := C + 1};
        _ when map_size(Stacks) < Max -> Stacks#{Key => 1};
        _ -> maps:update_with([<<"erlang">>, <<"[other stacks]">>], fun(X) -> X + 1 end, 1, Stacks)
    end,
    St#{stacks := Stacks2, samples := N + 1}.

%% The stacks of one process, for a bounded number of processes.
count_pid(Pid, Key, St = #{by_pid := By}) ->
    case By of
        #{Pid := {N, Stacks}} ->
            Stacks2 = case Stacks of
                          #{Key := C} -> Stacks#{Key := C + 1};
                          _ when map_size(Stacks) < ?STACKS_PER_PROC -> Stacks#{Key => 1};
                          _ -> maps:update_with([<<"erlang">>, <<"[other stacks]">>],
                                                fun(X) -> X + 1 end, 1, Stacks)
                      end,
            St#{by_pid := By#{Pid := {N + 1, Stacks2}}};
        _ when map_size(By) < ?PROCS_MAX ->
            St#{by_pid := By#{Pid => {1, #{Key => 1}}}};
        _ ->
            St
    end.

top_processes(By) ->
    Ranked = largest(?PROCS_TOP, [{P, N, S} || {P, {N, S}} <- maps:to_list(By)]),
    [#{pid => list_to_binary(pid_to_list(P)), samples => N,
       stacks => [#{stack => K, count => C}
                  || {K, C} <- largest(?STACKS_TOP, maps:to_list(S))]}
     || {P, N, S} <- Ranked].

frame({M, F, A, _}) when is_list(A) ->
    frame({M, F, length(A), []});
frame({M, F, A, _}) ->
    Name = <<(atom_to_binary(M))/binary, ":", (atom_to_binary(F))/binary, "/",
             (integer_to_binary(A))/binary>>,
    case binary:match(Name, [<<";">>, <<"\n">>]) of
        nomatch -> Name;
        _ -> binary:replace(Name, [<<";">>, <<"\n">>], <<"_">>, [global])
    end;
frame(_) ->
    <<"[unknown]">>.

%% The N pairs with the largest second element (beamdiag_agent_top's
%% largest/3, here so that the sampler ships alone; see modules/0).
largest(N, Pairs) ->
    lists:sublist(lists:reverse(lists:keysort(2, Pairs)), N).
