%%% @doc The connection pool of a cluster diagnosis: connects to each
%%% member (hidden) and gives it the agent's modules, at most K members at
%%% a time, each within its own bound.
%%%
%%% The agent's code is read once, for every member
%%% (`beamdiag_loader:objects/1'), and this node's distribution is started
%%% before the first member is connected. A member not connected and
%%% loaded within 5 s of its own start is given up (`prepare_timeout'): the
%%% others do not wait for it. Its worker goes on (a connection or a load
%%% cannot be cut halfway without leaving something behind) and removes
%%% whatever it loaded when it ends; `settle/1' waits for those before the
%%% session closes its connections. Each member prepared is handed at once
%%% to the caller's `arm' function (in `beamdiag_cluster', the one that
%%% starts its collector), so that its agent gets ready while the others
%%% are prepared.
%%%
%%% The errors are `beamdiag_cluster''s (`{error, {beamdiag_cluster,
%%% Reason}}'), put in words by `beamdiag_cluster:format_error/1'.
%%%
%%% ```
%%% 1> Arm = fun(M, Node, Loaded) -> {M, Node, Loaded} end.
%%% 2> {Result, Late, Times, Armed} =
%%%        beamdiag_cluster_pool:prepare(['a@host1', 'b@host2'], #{cookie => shop}, 64, Arm).
%%% 3> Result.
%%% [{'a@host1',{ok,[...]}},
%%%  {'b@host2',{error,{beamdiag_cluster,{prepare_timeout,5000}}}}]
%%% 4> beamdiag_cluster_pool:settle(Late).
%%% ok
%%% '''
-module(beamdiag_cluster_pool).

-export([prepare/4, settle/1]).
%% Called by the tests only.
-ifdef(TEST).
-export([run/5]).
-endif.

-export_type([arm/0, late/0, times/0]).

%% What the caller does with each member prepared: given the member, its
%% node and what was loaded there (for the unload at its end).
-type arm() :: fun((node(), node(), term()) -> term()).
%% The workers given up on, for settle/1.
-type late() :: [{pid(), reference(), node()}].
%% Each prepared member's connect and load times.
-type times() :: #{node() => #{connect_ms := non_neg_integer(), load_ms := non_neg_integer()}}.
-type result() :: {ok, term()} | {error, term()}.

%% A member not connected and loaded within this long of its own start
%% is given up (listed with the reason); the others do not wait for it.
-define(PREPARE_MS, 5000).
%% How long the session's end waits for the members given up on to remove
%% what they loaded (their loader calls are bounded, each 10 s at most).
-define(SETTLE_MS, 10000).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Connects to each member and loads the agent's modules, at most K
%% members at a time; the code is read once, for every member. A member
%% not prepared within 5 s of its own start is given up: the rest do not
%% wait for it, and its worker, which removes what it loaded when it
%% ends, is returned among the late ones (for `settle/1'). Each member
%% prepared is passed to Arm at once. Returns each member's result
%% (`{ok, Loaded}' or `{error, Reason}'), in member order, the late
%% workers, each prepared member's connect and load times, and what Arm
%% returned, in the order the members were prepared.
-spec prepare([node()], beamdiag_remote:options(), pos_integer(), arm()) ->
    {[{node(), result()}], late(), times(), [term()]}.
prepare(Members, Remote, K, Arm) ->
    case beamdiag_loader:objects(beamdiag_agent:modules()) of
        {ok, Code} ->
            %% This node's distribution is started first, then every
            %% member is connected side by side (each under its own bound).
            _ = case Members of
                    [M1 | _] -> beamdiag_remote:distribute(atom_to_list(M1));
                    [] -> ok
                end,
            run(Members, K, fun(M) -> work(M, Remote, Code) end, Arm, ?PREPARE_MS);
        {error, _} = E ->
            {[{M, E} || M <- Members], [], #{}, []}
    end.

%% @doc Waits (at most 10 s in all) for the workers given up on to end,
%% so that what they loaded is gone before the connections close. A
%% worker whose member is not connected has loaded nothing there (it is
%% still connecting: to a stopped node, until the handshake's own timeout,
%% seconds later): it is ended at once, not waited for.
-spec settle(late()) -> ok.
settle(Late) ->
    Connected = nodes([visible, hidden]),
    {Wait, Stop} = lists:partition(fun({_, _, M}) -> lists:member(M, Connected) end, Late),
    _ = [begin
             exit(Pid, kill),
             erlang:demonitor(MRef, [flush])
         end || {Pid, MRef, _} <- Stop],
    Until = erlang:monotonic_time(millisecond) + ?SETTLE_MS,
    _ = [receive
             {'DOWN', MRef, process, Pid, _} -> ok
         after beamdiag_agent_deadline:left(Until) ->
             exit(Pid, kill),
             erlang:demonitor(MRef, [flush])
         end || {Pid, MRef, _} <- Wait],
    %% A result that crossed the word `late' is not left in the mailbox.
    _ = [receive {_, Pid, _} -> ok after 0 -> ok end || {Pid, _, _} <- Late],
    ok.

%%%===================================================================
%%% Internal
%%%===================================================================

%% One member's work: connect, then load the code.
work(M, Remote, Code) ->
    T0 = erlang:monotonic_time(millisecond),
    case beamdiag_remote:connect(atom_to_list(M), Remote) of
        {ok, Node} ->
            T1 = erlang:monotonic_time(millisecond),
            R = beamdiag_loader:load_objects(Node, Code),
            {R, #{connect_ms => T1 - T0, load_ms => erlang:monotonic_time(millisecond) - T1},
             Node};
        {error, _} = E ->
            {E, #{}, M}
    end.

%% The pool: Work(M) gives {Result, Times, Node} for member M, run in a
%% worker of its own, at most K at a time, each given up Ms after its
%% start.
run(Members, K, Work, Arm, Ms) ->
    Self = self(),
    Tag = make_ref(),
    Start = fun(M) ->
                {Pid, MRef} = spawn_monitor(fun() -> late_or_send(Self, Tag, Work(M)) end),
                {Pid, {M, MRef, erlang:monotonic_time(millisecond) + Ms}}
            end,
    P = #{tag => Tag, start => Start, k => K, arm => Arm, ms => Ms},
    #{done := Done, late := Late, armed := Armed} =
        next(P, #{running => #{}, queue => Members, done => #{}, late => [], armed => []}),
    Result = [{M, element(1, maps:get(M, Done))} || M <- Members],
    Times = maps:from_list([{M, T} || {M, {{ok, _}, T, _}} <- maps:to_list(Done)]),
    {Result, Late, Times, lists:reverse(Armed)}.

%% A worker given up on (told `late') removes what it loaded, then ends;
%% else it sends its result and waits for the pool to take it (`ack'):
%% the word `late' may cross the result, and then, as when the pool is
%% gone, what was loaded is removed here.
late_or_send(Pool, Tag, Result) ->
    Drop = fun() ->
                   case Result of
                       {{ok, Loaded}, _, Node} -> beamdiag_loader:unload(Node, Loaded);
                       _ -> ok
                   end
           end,
    receive
        {Tag, late} -> Drop()
    after 0 ->
        MRef = erlang:monitor(process, Pool),
        Pool ! {Tag, self(), Result},
        receive
            {Tag, ack} -> ok;
            {Tag, late} -> Drop();
            {'DOWN', MRef, process, Pool, _} -> Drop()
        end
    end.

next(P = #{start := Start, k := K}, S = #{running := Running, queue := [M | Queue]})
  when map_size(Running) < K ->
    {Pid, V} = Start(M),
    next(P, S#{running := Running#{Pid => V}, queue := Queue});
next(_P, S = #{running := Running, queue := []}) when map_size(Running) =:= 0 ->
    S;
next(P, S) ->
    pool(P, S).

pool(P = #{tag := Tag, arm := Arm, ms := Ms},
     S = #{running := Running, done := Done, late := Late}) ->
    Next = lists:min([D || {_, _, D} <- maps:values(Running)]),
    receive
        {Tag, Pid, Result} when is_map_key(Pid, Running) ->
            {M, MRef, _} = maps:get(Pid, Running),
            erlang:demonitor(MRef, [flush]),
            Pid ! {Tag, ack},
            S2 = case Result of
                     {{ok, Loaded}, _, Node} ->
                         S#{armed := [Arm(M, Node, Loaded) | maps:get(armed, S)]};
                     _ ->
                         S
                 end,
            next(P, S2#{running := maps:remove(Pid, Running), done := Done#{M => Result}});
        {'DOWN', MRef, process, Pid, Why} when is_map_key(Pid, Running) ->
            {M, MRef, _} = maps:get(Pid, Running),
            next(P, S#{running := maps:remove(Pid, Running),
                       done := Done#{M => {{error, {beamdiag_cluster, {crashed, Why}}}, #{}, M}}})
    after beamdiag_agent_deadline:left(Next) ->
        %% Given up: told so, and kept (monitored) for settle/1. A result
        %% that crossed the word is never acknowledged: the worker removes
        %% what it loaded.
        Over = [{Pid, M, MRef} || {Pid, {M, MRef, D}} <- maps:to_list(Running), D =< Next],
        _ = [Pid ! {Tag, late} || {Pid, _, _} <- Over],
        Done2 = lists:foldl(fun({_, M, _}, Acc) ->
                                Acc#{M => {{error, {beamdiag_cluster, {prepare_timeout, Ms}}}, #{},
                                           M}}
                            end, Done, Over),
        next(P, S#{running := maps:without([Pid || {Pid, _, _} <- Over], Running), done := Done2,
                   late := [{Pid, MRef, M} || {Pid, M, MRef} <- Over] ++ Late})
    end.
