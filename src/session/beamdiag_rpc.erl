%%% @doc Remote calls that do not wait behind the node's own work.
%%%
%%% `erpc:call/5' runs the call in a process spawned on the target at
%%% normal priority: on a node whose schedulers are busy with many runnable
%%% processes that process waits its turn behind all of them (measured on a
%%% saturated lock-counting node with 64 runnable writers on 2 schedulers:
%%% 530 to 590 ms for `erlang:node/0', against 0 to 12 ms at high
%%% priority). Every call a session makes is a few BIFs or a start of the
%%% agent, which itself runs at high priority, so each goes through here:
%%% the same call, in a process spawned at high (or max) priority.
%%%
%%% The process runs `erpc:execute_call/4' of the target's own kernel:
%%% the wire form of erpc, which OTP keeps compatible between releases
%%% (a node calls nodes two releases older or newer with it; checked on
%%% OTP 25, 27 and 29: the same exit reasons, `{Ref, return, Value}',
%%% `{Ref, throw, T}', `{Ref, exit, E}', `{Ref, error, R, Stack}'). Only
%%% the spawn option is added. Results and exceptions are those of
%%% `erpc:call/5'; a call on this node runs in a process of its own too,
%%% at the same priority.
%%%
%%% ```
%%% 1> beamdiag_rpc:call('app@host', erlang, system_info, [otp_release], 5000).
%%% "25"
%%% '''
-module(beamdiag_rpc).

-export([call/5, call/6]).

-type priority() :: high | max.

%%%===================================================================
%%% API
%%%===================================================================

%% @doc As `erpc:call/5', at high priority on the target.
-spec call(node(), module(), atom(), [term()], timeout()) -> term().
call(Node, M, F, A, Timeout) ->
    call(Node, M, F, A, Timeout, high).

%% @doc As `erpc:call/5', at the given priority on the target (`max' only
%% for a call that must never wait for the node's high-priority work,
%% such as a read of the lock counters before the report is due).
-spec call(node(), module(), atom(), [term()], timeout(), priority()) -> term().
call(Node, M, F, A, Timeout, Priority) when
    is_atom(Node), is_atom(M), is_atom(F), is_list(A),
    (Priority =:= high orelse Priority =:= max)
->
    Res = make_ref(),
    ReqId = erlang:spawn_request(Node, erpc, execute_call, [Res, M, F, A],
                                 [{reply, error_only}, monitor, {priority, Priority}]),
    receive
        {spawn_reply, ReqId, error, Reason} ->
            spawn_failed(Reason);
        {'DOWN', ReqId, process, _, Reason} ->
            result(Res, Reason)
    after Timeout ->
        %% As erpc: the call is abandoned; a late result is dropped here.
        _ = erlang:spawn_request_abandon(ReqId),
        _ = erlang:demonitor(ReqId, [flush]),
        receive {spawn_reply, ReqId, _, _} -> ok after 0 -> ok end,
        erlang:error({erpc, timeout})
    end.

%%%===================================================================
%%% Internal
%%%===================================================================

result(Res, {Res, return, Value}) -> Value;
result(Res, {Res, throw, Value}) -> throw(Value);
result(Res, {Res, exit, Reason}) -> exit({exception, Reason});
result(Res, {Res, error, Reason, Stack}) -> erlang:error({exception, Reason, Stack});
result(_Res, noconnection) -> erlang:error({erpc, noconnection});
result(_Res, Other) -> exit({signal, Other}).

-spec spawn_failed(term()) -> no_return().
spawn_failed(noconnection) -> erlang:error({erpc, noconnection});
spawn_failed(Reason) -> erlang:error({erpc, Reason}).
