%%% @doc One walk of the process table, on the target (erts, kernel and
%%% stdlib only): which processes to read, and one pass over them that
%%% reads three cheap items each and ranks as it reads.
%%%
%%% The items (`items/1'): `reductions', `message_queue_len', `heap_size'
%%% (constant time, about 0.5 us each; not `total_heap_size', which counts
%%% the message fragments in the queue and so walks it: measured on OTP 25,
%%% 4 times the walk's cost at 10,000 idle processes and 20 ms for one
%%% queue of 3 million), and the initial call when the caller asks for it;
%%% the walk adds `status', to count the suspended processes. Every read
%%% goes through beamdiag_agent_pinfo: a process that does not answer in
%%% time is set aside (`stalled') and the walk goes on without it.
%%%
%%% Which processes (`pids/2'). Up to the walk's bound every process
%%% (`all'); above it the table is not listed: on OTP 28 and later
%%% `erlang:processes_iterator/0' walks it one process at a time and keeps
%%% every k-th process (`sampled'); before OTP 28, where the only listing is
%%% `erlang:processes/0', only the registered processes (`registered').
%%% A walk also stops after `?WALK_MS' of wall time (`truncated').
%%%
%%% The ranking is beamdiag_agent_top's: the tops the caller asks for are
%%% kept in the one pass.
%%%
%%% ```
%%% 1> {all, Pids} = beamdiag_agent_proc_walk:pids(erlang:system_info(process_count), 50000).
%%% 2> Now = erlang:monotonic_time(microsecond).
%%% 3> {_, #{queues := Q}, false, []} = beamdiag_agent_proc_walk:walk(
%%%        Pids, Now, beamdiag_agent_proc_walk:items(false), #{}, #{}, false,
%%%        #{queues => beamdiag_agent_top:new(10), heaps => beamdiag_agent_top:new(32)}).
%%% 4> beamdiag_agent_top:pids(Q).
%%% '''
-module(beamdiag_agent_proc_walk).

-export([pids/2, new_registered/1, items/1, walk/7, to_tuple/1, queue_key/3]).

-export_type([mode/0, figures/0, tops/0]).

%% How the processes a walk reads were chosen.
-type mode() :: all | sampled | registered.
%% A process's items as a tuple: reductions, queue length, young heap
%% (words), and the initial call when it was asked for.
-type figures() :: {non_neg_integer(), non_neg_integer(), non_neg_integer()}
                 | {non_neg_integer(), non_neg_integer(), non_neg_integer(), term()}.
%% What a walk ranks (the kinds asked for) and counts.
-type tops() :: #{reductions => beamdiag_agent_top:top(),
                  queues := beamdiag_agent_top:top(),
                  heaps := beamdiag_agent_top:top(),
                  walked => non_neg_integer(),
                  suspended => {non_neg_integer(), [pid()]}}.

%% A walk stops after this long (wall time).
-define(WALK_MS, 500).
%% The items every walk reads, in this order: to_tuple/1 matches them by
%% position.
-define(ITEMS, [reductions, message_queue_len, heap_size]).
%% Suspended processes kept by a walk (all are counted).
-define(SUSPENDED, 16).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The processes to walk when the node has Count of them, and how
%% they were chosen: every one up to Max, above it every k-th process
%% from the iterator (OTP 28+) and the registered ones, or the registered
%% ones alone.
-spec pids(non_neg_integer(), non_neg_integer()) -> {mode(), [pid()]}.
pids(Count, Max) when Count =< Max ->
    {all, erlang:processes()};
pids(Count, Max) ->
    case erlang:function_exported(erlang, processes_iterator, 0) of
        true -> {sampled, stride(Count, Max) ++ registered_pids()};
        false -> {registered, registered_pids()}
    end.

%% @doc The processes registered since a walk whose figures are Base (a
%% sampled walk reads the same processes at both ends, and the registered
%% ones).
-spec new_registered(#{pid() => figures()}) -> [pid()].
new_registered(Base) ->
    [P || P <- registered_pids(), not is_map_key(P, Base)].

%% @doc The items a walk reads; with `true', the initial call too (to
%% count the processes like a large heap: under load it costs more than
%% the three others together).
-spec items(boolean()) -> [atom()].
items(false) -> ?ITEMS;
items(true) -> ?ITEMS ++ [initial_call].

%% @doc One walk over Pids, started at StartUs (monotonic microseconds),
%% reading Items (from `items/1'): `{Walked, Tops, Truncated, Stalled}'.
%% Walked, only when Keep is true: `{Pid, figures()}' for every process.
%% Tops: the largest keys of the kinds asked for in Tops0 (`reductions':
%% over the window, from Base, the start walk's figures; `queues': at the
%% start (no `reductions' asked) the length, at the end its growth plus
%% its length; `heaps': the young heap), kept as `{Pid, figures()}' in one
%% pass; `walked', the count read; `suspended', the processes found
%% suspended (all counted, the first ?SUSPENDED kept). Stops ?WALK_MS
%% after StartUs; a process that does not answer is left out and listed
%% in Stalled (beamdiag_agent_pinfo). Unread: the processes the start walk
%% could not read, left out of the reductions (what they took before the
%% window is unknown; counted from zero, one would show more than the
%% whole node took).
-spec walk([pid()], integer(), [atom()], #{pid() => figures()}, #{pid() => term()}, boolean(),
           tops()) ->
          {[{pid(), figures()}], tops(), boolean(), [beamdiag_agent_pinfo:stalled()]}.
walk(Pids, StartUs, Items, Base, Unread, Keep, Tops0) ->
    Reds0 = maps:get(reductions, Tops0, none),
    #{queues := Qs0, heaps := Hs0} = Tops0,
    %% Each answer is made a tuple in the reader (to_tuple/1), so that only
    %% the tuple comes back.
    Fun = fun(P, {T, Status}, {Reds, Qs, Hs, N, Acc, Susp}) ->
                  Susp2 = case Status of
                              suspended -> suspended(P, Susp);
                              _ -> Susp
                          end,
                  case Reds of
                      none ->
                          %% The start walk: queues by length.
                          {Reds, beamdiag_agent_top:consider(element(2, T), P, T, Qs),
                           beamdiag_agent_top:consider(element(3, T), P, T, Hs), N + 1,
                           kept(Keep, P, T, Acc), Susp2};
                      _ ->
                          Reds2 = case {Base, Unread} of
                                      {#{P := BT}, _} ->
                                          beamdiag_agent_top:consider(element(1, T) - element(1, BT),
                                                                      P, T, Reds);
                                      {_, #{P := _}} ->
                                          Reds;
                                      _ ->
                                          beamdiag_agent_top:consider(element(1, T), P, T, Reds)
                                  end,
                          {Reds2,
                           beamdiag_agent_top:consider(queue_key(P, T, Base), P, T, Qs),
                           beamdiag_agent_top:consider(element(3, T), P, T, Hs), N + 1,
                           kept(Keep, P, T, Acc), Susp2}
                  end
          end,
    {{Reds, Qs, Hs, N, Acc, {SuspN, SuspPids}}, Stalled, Trunc} =
        beamdiag_agent_pinfo:fold(Fun, {Reds0, Qs0, Hs0, 0, [], {0, []}}, Pids, Items ++ [status],
                                  #{deadline => StartUs + ?WALK_MS * 1000,
                                    convert => fun ?MODULE:to_tuple/1}),
    {Acc, (tops(Reds, Qs, Hs, N))#{suspended => {SuspN, lists:reverse(SuspPids)}}, Trunc,
     Stalled}.

%% @doc A process's items as a tuple, from a read of `items/1' (with the
%% walk's `status' after them: then `{Tuple, Status}'). The match follows
%% the items' order: reductions, message_queue_len, heap_size, then the
%% initial call when it was asked for, then the status.
-spec to_tuple([{atom(), term()}]) -> figures() | {figures(), atom()}.
to_tuple([{_, R}, {_, Q}, {_, H}, {status, S}]) -> {{R, Q, H}, S};
to_tuple([{_, R}, {_, Q}, {_, H}, {_, I}, {status, S}]) -> {{R, Q, H, I}, S};
to_tuple([{_, R}, {_, Q}, {_, H}]) -> {R, Q, H};
to_tuple([{_, R}, {_, Q}, {_, H}, {_, I}]) -> {R, Q, H, I}.

%% @doc The key an end walk ranks a queue by: its growth over the window
%% (from Base, the start walk's figures) plus its length at the end; 0 for
%% a queue empty at both ends.
-spec queue_key(pid(), figures(), #{pid() => figures()}) -> non_neg_integer().
queue_key(P, T, Base) ->
    Q0 = case Base of
             #{P := BT} -> element(2, BT);
             _ -> 0
         end,
    Q1 = element(2, T),
    case Q1 > 0 orelse Q0 > 0 of
        true -> max(0, Q1 - Q0) + Q1;
        false -> 0
    end.

%%%===================================================================
%%% Internal
%%%===================================================================

%% The registered processes (the runtime's name table; no process is
%% asked).
registered_pids() ->
    [P || N <- erlang:registered(), P <- [erlang:whereis(N)], is_pid(P)].

%% Every k-th process from the iterator (OTP 28+), at most Max of them.
stride(Count, Max) ->
    K = max(1, (Count + Max - 1) div Max),
    Iter = dynamic(erlang, processes_iterator, []),
    stride(Iter, K, 0, Max, []).

stride(_Iter, _K, _I, 0, Acc) ->
    Acc;
stride(Iter, K, I, Left, Acc) ->
    case dynamic(erlang, processes_next, [Iter]) of
        none -> Acc;
        {P, Iter2} when I rem K =:= 0 -> stride(Iter2, K, I + 1, Left - 1, [P | Acc]);
        {_, Iter2} -> stride(Iter2, K, I + 1, Left, Acc)
    end.

%% The processes found suspended (on a busy port, or by
%% erlang:suspend_process/1): all counted, the first ?SUSPENDED kept.
suspended(P, {N, Ps}) when N < ?SUSPENDED -> {N + 1, [P | Ps]};
suspended(_P, {N, Ps}) -> {N + 1, Ps}.

tops(none, Qs, Hs, N) -> #{queues => Qs, heaps => Hs, walked => N};
tops(Reds, Qs, Hs, N) -> #{reductions => Reds, queues => Qs, heaps => Hs, walked => N}.

kept(true, P, T, Acc) -> [{P, T} | Acc];
kept(false, _P, _T, Acc) -> Acc.

%% A call to a function that exists only on some OTP releases (checked by
%% the caller with erlang:function_exported/3): not resolved at compile
%% time, so the module loads on every release.
dynamic(M, F, A) ->
    erlang:apply(M, F, A).
