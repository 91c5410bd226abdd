%%% @doc The lock counters of a node on the lock-counting emulator, read
%%% from this side, in time for the report.
%%%
%%% A process of this node reads the target's counters with BIF calls
%%% only (`erts_debug:lcnt_collect/0', `ets:info/1'), each in a process
%%% spawned there at max priority (beamdiag_rpc): no code of beamdiag's need
%%% be loaded there, and no reading waits behind the node's own work, which
%%% on a saturated lock-counting node is what made the lock data miss the
%%% report (measured on a node with 64 writers on one table and 2
%%% schedulers: a read takes 50 to 100 ms at max priority; a call at normal
%%% priority waits 0.5 s for its turn). Nothing is changed on the target: the
%%% counters are not cleared and the mask is left as it is; a reading at the
%%% start is the baseline the later ones are taken against
%%% (beamdiag_lock_data).
%%%
%%% Readings: the baseline at once; one midway to the last; the last
%%% `?LAST_BEFORE_MS' before the report is due (at the window's end when
%%% nothing is due). `data/2' gives the latest reading that came, so a last
%%% reading that is late or fails leaves the one before: a lock finding a
%%% reading had is never dropped for a later one missing. The process ends
%%% with its owner, or on its own a little after its last reading.
%%%
%%% ```
%%% 1> {ok, L} = beamdiag_lock_session:start('app@host', #{window_ms => 5000, ready_by => infinity}).
%%% 2> timer:sleep(5000), {ok, Data} = beamdiag_lock_session:data(L, 2000).
%%% 3> maps:get(window_s, Data).
%%% 5.01
%%% '''
-module(beamdiag_lock_session).

-export([start/2, data/2, format_error/1]).
%% Called as Module:format_error/1 on an {error, {Module, Reason}} value.
-ignore_xref([{format_error, 1}]).

-export_type([session/0]).

-opaque session() :: pid().

%% The last reading starts this long before the report is due: the read
%% (at most ?READ_MS), the transfer and the summary on this side.
-define(LAST_BEFORE_MS, 1000).
-define(READ_MS, 800).
%% The facts and the baseline at the start.
-define(START_MS, 1000).
%% A midway reading only when the last one is at least this far off.
-define(MID_MIN_MS, 2000).
%% How many of the node's tables are searched for one without a name.
-define(TABLE_SCAN, 2000).
%% How long past its last reading the process waits to be asked.
-define(LINGER_MS, 10000).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Starts reading the lock counters of Node when it counts locks
%% (`none' when it does not, or does not say in time). Options:
%% `window_ms' (the window: the last reading is at its end when nothing
%% is due), `ready_by' (monotonic ms when the report is due, or
%% `infinity'), `owner' (the process the session ends with: the caller by
%% default).
-spec start(node(), #{window_ms := pos_integer(), ready_by := integer() | infinity,
                      owner => pid()}) ->
    {ok, session()} | none.
start(Node, Opts = #{window_ms := W, ready_by := ReadyBy}) when is_integer(W), W > 0 ->
    Owner = maps:get(owner, Opts, self()),
    Self = self(),
    Ref = make_ref(),
    Start = erlang:monotonic_time(millisecond),
    Last = case ReadyBy of
               infinity -> Start + W;
               _ -> max(Start, ReadyBy - ?LAST_BEFORE_MS)
           end,
    Pid = spawn(fun() -> init(Owner, {Self, Ref}, Node, Last) end),
    MRef = erlang:monitor(process, Pid),
    receive
        {Ref, counting} -> erlang:demonitor(MRef, [flush]), {ok, Pid};
        {Ref, not_counting} -> erlang:demonitor(MRef, [flush]), none;
        {'DOWN', MRef, process, Pid, _} -> none
    after ?START_MS ->
        exit(Pid, kill),
        erlang:demonitor(MRef, [flush]),
        none
    end.

%% @doc The lock data of the latest reading, waiting up to Wait ms for the
%% readings planned by then (`infinity': for every reading planned).
-spec data(session(), timeout()) ->
    {ok, beamdiag_lock_data:lock_data()} | {error, {beamdiag_lock_session, term()}}.
data(Pid, Wait) ->
    MRef = erlang:monitor(process, Pid),
    {Until, Bound} = case Wait of
                         infinity -> {infinity, infinity};
                         _ -> {erlang:monotonic_time(millisecond) + Wait, Wait + ?READ_MS}
                     end,
    Pid ! {data, self(), MRef, Until},
    receive
        {MRef, Reply} -> erlang:demonitor(MRef, [flush]), Reply;
        {'DOWN', MRef, process, Pid, Why} -> {error, {?MODULE, {gone, Why}}}
    after Bound ->
        erlang:demonitor(MRef, [flush]),
        {error, {?MODULE, no_answer}}
    end.

%% @doc Turns an error reason of this module into a sentence.
-spec format_error(term()) -> iolist().
format_error(no_reading) ->
    "no reading of the lock counters came back in time (each waited at most 0.8 s)";
format_error({baseline_only, _}) ->
    "only the reading at the start came back in time";
format_error(no_answer) ->
    "the lock reader did not answer";
format_error({gone, Why}) ->
    io_lib:format("the lock reader ended (~0p)", [Why]).

%%%===================================================================
%%% Internal
%%%===================================================================

init(Owner, {Caller, Ref}, Node, Last) ->
    OMRef = erlang:monitor(process, Owner),
    Facts = [schedulers, schedulers_online, dirty_cpu_schedulers_online, otp_release, version,
             {allocator, eheap_alloc}],
    Info = try
               beamdiag_rpc:call(Node, lists, map, [fun erlang:system_info/1, [lock_counting | Facts]],
                                 ?START_MS, max)
           catch _:_ -> failed
           end,
    case Info of
        [true | Values] ->
            Caller ! {Ref, counting},
            Keys = [schedulers, schedulers_online, dirty_cpu_schedulers_online, otp_release,
                    version, eheap_alloc],
            State = #{node => Node, owner => Owner, omref => OMRef,
                      facts => maps:from_list(lists:zip(Keys, Values)),
                      baseline => read(Node), latest => undefined, waiting => []},
            Now = erlang:monotonic_time(millisecond),
            Plan = case Last - Now >= ?MID_MIN_MS of
                       true -> [Now + (Last - Now) div 2, Last];
                       false -> [Last]
                   end,
            loop(State, Plan);
        _ ->
            Caller ! {Ref, not_counting}
    end.

%% Waits for the next planned reading, answering `data' requests: one
%% whose deadline falls after a reading still planned waits for it.
loop(State = #{omref := OMRef}, Plan) ->
    Next = case Plan of
               [At | _] -> beamdiag_agent_deadline:left(At);
               [] -> ?LINGER_MS
           end,
    receive
        {'DOWN', OMRef, process, _, _} ->
            ok;
        {data, From, Tag, Until} ->
            loop(answer(State#{waiting := [{From, Tag, Until} | maps:get(waiting, State)]}, Plan),
                 Plan)
    after Next ->
        case Plan of
            [_ | More] -> loop(answer(reading(State), More), More);
            [] -> ok
        end
    end.

%% Answers the requests that no planned reading is due for.
answer(State = #{waiting := Waiting}, Plan) ->
    {Now, Later} = lists:partition(fun({_, _, Until}) ->
                                       not lists:any(fun(At) -> At =< Until end, Plan)
                                   end, Waiting),
    _ = [From ! {Tag, reply(State)} || {From, Tag, _} <- Now],
    State#{waiting := Later}.

%% A reading against the baseline; a failed one keeps the latest. The
%% tables behind the hottest locks are looked up once each, within the
%% reading's own bound.
reading(State = #{node := Node, baseline := Base, facts := Facts}) ->
    Deadline = erlang:monotonic_time(millisecond) + ?READ_MS,
    case read(Node) of
        {ok, Raw} ->
            Start = case Base of
                        {ok, B} -> B;
                        _ -> none
                    end,
            Data = beamdiag_lock_data:summarise(Raw, Start, #{}),
            Known = maps:get(tables, State, #{}),
            Names = beamdiag_lock_data:table_names(Data),
            New = maps:merge(Known, maps:from_list(
                                      tables(Node, [N || N <- Names, not maps:is_key(N, Known)],
                                             Deadline))),
            Tables = [maps:get(N, New) || N <- Names],
            Trees = case {beamdiag_lock_data:unnamed_trees(Data), State} of
                        {false, _} -> [];
                        {true, #{trees := T}} -> T;
                        {true, _} -> trees(Node, Deadline)
                    end,
            State#{tables => New, trees => Trees,
                   latest := beamdiag_lock_data:with_node(Data, #{facts => Facts,
                                                                  tables => Tables,
                                                                  trees => Trees})};
        {error, _} ->
            State
    end.

reply(#{latest := undefined}) -> {error, {?MODULE, no_reading}};
reply(#{latest := Data}) -> {ok, Data}.

read(Node) ->
    try beamdiag_rpc:call(Node, erts_debug, lcnt_collect, [], ?READ_MS, max) of
        Raw when is_list(Raw) -> {ok, Raw};
        Other -> {error, Other}
    catch
        Class:Why -> {error, {Class, Why}}
    end.

%% The tables' options and owners, with calls of BIFs only: a named
%% table's info by its name; a table without a name of its own (lcnt names
%% its locks after the name it was made with all the same) found among the
%% node's first ?TABLE_SCAN tables by that name. A table not found is said
%% to be gone.
tables(_Node, [], _Deadline) ->
    [];
tables(Node, Names, Deadline) ->
    Entries = try
                  Atoms = [binary_to_atom(N) || N <- Names],
                  Named = rpc(Node, lists, map, [fun ets:info/1, Atoms], Deadline),
                  Infos = case [A || {A, undefined} <- lists:zip(Atoms, Named)] of
                              [] -> Named;
                              Unnamed -> unnamed(Node, Atoms, Named, Unnamed, Deadline)
                          end,
                  Owners = [proplists:get_value(owner, I) || I <- Infos, is_list(I)],
                  Regs = rpc(Node, lists, zipwith, [fun erlang:process_info/2, Owners,
                                                    [registered_name || _ <- Owners]], Deadline),
                  pair(Names, Infos, Regs)
              catch
                  _:_ -> [beamdiag_lock_data:table(N, {undefined, undefined}) || N <- Names]
              end,
    lists:zip(Names, Entries).

%% The node's ordered_set tables with write_concurrency, among its first
%% ?TABLE_SCAN (at most five): lcnt names no table for the tree nodes of
%% such a table made while it counts.
trees(Node, Deadline) ->
    try
        All = lists:sublist(rpc(Node, ets, all, [], Deadline), ?TABLE_SCAN),
        Types = rpc(Node, lists, zipwith, [fun ets:info/2, All, [type || _ <- All]], Deadline),
        Sets = [T || {T, ordered_set} <- lists:zip(All, Types)],
        WCs = rpc(Node, lists, zipwith, [fun ets:info/2, Sets,
                                         [write_concurrency || _ <- Sets]], Deadline),
        Tids = lists:sublist([T || {T, WC} <- lists:zip(Sets, WCs), WC =/= false], 5),
        Infos = rpc(Node, lists, map, [fun ets:info/1, Tids], Deadline),
        Owners = [proplists:get_value(owner, I) || I <- Infos, is_list(I)],
        Regs = rpc(Node, lists, zipwith, [fun erlang:process_info/2, Owners,
                                          [registered_name || _ <- Owners]], Deadline),
        Names = [atom_to_binary(proplists:get_value(name, I, undefined)) || I <- Infos, is_list(I)],
        pair(Names, [I || I <- Infos, is_list(I)], Regs)
    catch
        _:_ -> []
    end.

unnamed(Node, Atoms, Named, Unnamed, Deadline) ->
    All = lists:sublist(rpc(Node, ets, all, [], Deadline), ?TABLE_SCAN),
    TabNames = rpc(Node, lists, zipwith, [fun ets:info/2, All, [name || _ <- All]], Deadline),
    Found = [{Name, Tid} || {Tid, Name} <- lists:zip(All, TabNames), lists:member(Name, Unnamed)],
    Hits = [A || A <- Unnamed, lists:keymember(A, 1, Found)],
    Tids = [proplists:get_value(A, Found) || A <- Hits],
    Extra = maps:from_list(lists:zip(Hits, rpc(Node, lists, map, [fun ets:info/1, Tids], Deadline))),
    [case I of
         undefined -> maps:get(A, Extra, undefined);
         _ -> I
     end || {A, I} <- lists:zip(Atoms, Named)].

rpc(Node, M, F, A, Deadline) ->
    Left = Deadline - erlang:monotonic_time(millisecond),
    Left > 0 orelse erlang:error({erpc, timeout}),
    beamdiag_rpc:call(Node, M, F, A, Left, max).

pair([], [], _) ->
    [];
pair([N | Ns], [I | Is], [R | Rs]) when is_list(I) ->
    [beamdiag_lock_data:table(N, {I, R}) | pair(Ns, Is, Rs)];
pair([N | Ns], [_ | Is], Regs) ->
    [beamdiag_lock_data:table(N, {undefined, undefined}) | pair(Ns, Is, Regs)].
