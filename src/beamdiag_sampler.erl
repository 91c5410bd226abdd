%%% @doc An Erlang-level CPU sampler that runs on the target node.
%%%
%%% `run/1' executes on the node being profiled (it depends on erts,
%%% kernel and stdlib only, so `profile/2' can load it over distribution):
%%% at a prime rate (97 Hz by default) it looks at a bounded set of
%%% processes, and for those whose status is `running' or `runnable' takes
%%% `process_info(P, current_stacktrace)' and counts the stack. The result
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
%%% 1> {ok, R} = beamdiag_sampler:profile('app@host', #{duration => 5}).
%%% 2> maps:get(samples, R).
%%% 812
%%% '''
-module(beamdiag_sampler).

-export([run/1, profile/2, defaults/0, format_error/1]).

-export_type([options/0, result/0]).

-type options() :: #{
    duration => pos_integer(),
    frequency => pos_integer(),
    per_tick => pos_integer(),
    refresh => pos_integer(),
    max_list => pos_integer(),
    depth => pos_integer(),
    max_stacks => pos_integer()
}.
-type result() :: #{
    stacks := #{[binary()] => pos_integer()},
    samples := non_neg_integer(),
    ticks := non_neg_integer(),
    looked_at := non_neg_integer(),
    list_reads := non_neg_integer(),
    process_count := non_neg_integer(),
    duration_ms := non_neg_integer()
}.

-define(HOT_MAX, 64).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc 10 s at 97 Hz, 500 processes a tick, the process list re-read at
%% most every 10 s and only while the node has at most 100,000 processes.
-spec defaults() -> options().
defaults() ->
    #{
        duration => 10,
        frequency => 97,
        per_tick => 500,
        refresh => 10,
        max_list => 100000,
        depth => 64,
        max_stacks => 50000
    }.

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
        samples => 0,
        ticks => 0,
        looked_at => 0,
        list_reads => 0
    },
    St = loop(Now, St0),
    #{
        stacks => maps:get(stacks, St),
        samples => maps:get(samples, St),
        ticks => maps:get(ticks, St),
        looked_at => maps:get(looked_at, St),
        list_reads => maps:get(list_reads, St),
        process_count => erlang:system_info(process_count),
        duration_ms => (erlang:monotonic_time(microsecond) - Now) div 1000
    }.

%% @doc Loads this module onto `Node', runs the sampler there and unloads
%% it again (unless the node had it already). The call times out 30 s
%% after the duration.
-spec profile(node(), options()) -> {ok, result()} | {error, {?MODULE, term()}}.
profile(Node, Opts) ->
    D = maps:get(duration, maps:merge(defaults(), Opts)),
    case load(Node) of
        {ok, Loaded} ->
            try erpc:call(Node, ?MODULE, run, [Opts], (D + 30) * 1000) of
                R -> {ok, R}
            catch
                Class:Reason -> {error, {?MODULE, {remote, Class, Reason}}}
            after
                unload(Node, Loaded)
            end;
        {error, _} = E ->
            E
    end.

%% @doc Turns an error reason into a sentence.
-spec format_error(term()) -> iolist().
format_error({load, Node, Why}) ->
    io_lib:format("cannot load the sampler onto ~p: ~p", [Node, Why]);
format_error({remote, Class, Reason}) ->
    io_lib:format("the sampler failed on the target: ~p:~p", [Class, Reason]).

%%%===================================================================
%%% Internal
%%%===================================================================

load(Node) ->
    try erpc:call(Node, code, is_loaded, [?MODULE], 10000) of
        {file, _} ->
            {ok, false};
        false ->
            {?MODULE, Bin, File} = code:get_object_code(?MODULE),
            case erpc:call(Node, code, load_binary, [?MODULE, File, Bin], 10000) of
                {module, ?MODULE} -> {ok, true};
                Err -> {error, {?MODULE, {load, Node, Err}}}
            end
    catch
        Class:Reason -> {error, {?MODULE, {load, Node, {Class, Reason}}}}
    end.

unload(_Node, false) ->
    ok;
unload(Node, true) ->
    _ = catch erpc:call(Node, code, delete, [?MODULE], 10000),
    _ = catch erpc:call(Node, code, soft_purge, [?MODULE], 10000),
    ok.

loop(Now, St = #{stop := Stop}) when Now >= Stop ->
    St;
loop(Now, St0 = #{interval := I}) ->
    St = tick(refresh(Now, St0)),
    Next = Now + I,
    After = erlang:monotonic_time(microsecond),
    Wait = max(0, (Next - After) div 1000),
    receive
    after Wait -> ok
    end,
    loop(max(Next, erlang:monotonic_time(microsecond)), St).

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

tick(St = #{snapshot := Snap, cursor := Cur, hot := Hot, opts := #{per_tick := PT}}) ->
    Size = tuple_size(Snap),
    N = min(max(0, PT - length(Hot)), Size),
    {Window, Cur2} = window(Snap, Cur, N, Size, []),
    Self = self(),
    Candidates = lists:usort(Hot ++ Window) -- [Self],
    {St2, NewHot} = lists:foldl(fun look/2, {St, []}, Candidates),
    St2#{
        cursor := Cur2,
        hot := lists:sublist(NewHot, ?HOT_MAX),
        ticks := maps:get(ticks, St2) + 1,
        looked_at := maps:get(looked_at, St2) + length(Candidates)
    }.

window(_Snap, Cur, 0, _Size, Acc) ->
    {Acc, Cur};
window(Snap, Cur, N, Size, Acc) when Cur > Size ->
    window(Snap, 1, N, Size, Acc);
window(Snap, Cur, N, Size, Acc) ->
    window(Snap, Cur + 1, N - 1, Size, [element(Cur, Snap) | Acc]).

look(P, {St, Hot}) ->
    case erlang:process_info(P, status) of
        {status, S} when S =:= running; S =:= runnable ->
            case erlang:process_info(P, current_stacktrace) of
                {current_stacktrace, Stack} -> {count(Stack, St), [P | Hot]};
                undefined -> {St, Hot}
            end;
        _ ->
            {St, Hot}
    end.

count(Stack, St = #{stacks := Stacks, samples := N, opts := #{depth := D, max_stacks := Max}}) ->
    Frames = [frame(F) || F <- lists:sublist(Stack, D)],
    Key = [<<"erlang">> | lists:reverse(Frames)],
    Stacks2 = case Stacks of
        #{Key := C} -> Stacks#{Key := C + 1};
        _ when map_size(Stacks) < Max -> Stacks#{Key => 1};
        _ -> maps:update_with([<<"erlang">>, <<"[other stacks]">>], fun(X) -> X + 1 end, 1, Stacks)
    end,
    St#{stacks := Stacks2, samples := N + 1}.

frame({M, F, A, _}) when is_list(A) ->
    frame({M, F, length(A), []});
frame({M, F, A, _}) ->
    <<(atom_to_binary(M))/binary, ":", (atom_to_binary(F))/binary, "/",
      (integer_to_binary(A))/binary>>;
frame(_) ->
    <<"[unknown]">>.
