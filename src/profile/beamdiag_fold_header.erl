%%% @doc A `perf script' sample's header line, and the thread type it names.
%%%
%%% The header is `COMM  TID [CPU] TIME: PERIOD EVENT: [inline frame]'; the
%%% comm (thread name) may hold spaces, and the time token (`123.456:')
%%% anchors the parse. The thread type is the comm with its thread numbers
%%% removed (`scheduler', `dirty_cpu', `dirty_io', `aux', `poll', ...), so
%%% all schedulers add up in one tower of the flamegraph.
%%%
%%% ```
%%% 1> beamdiag_fold_header:parse(<<"1_scheduler 4712 [001] 12.5: 1001 cpu-clock:">>).
%%% {ok, <<"1_scheduler">>, <<>>}
%%% 2> beamdiag_fold_header:thread_type(<<"1_scheduler">>).
%%% <<"scheduler">>
%%% '''
-module(beamdiag_fold_header).

-export([parse/1, thread_type/1]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The comm and the inline frame (`<<>>' when perf recorded a call
%% chain) of a header line, or `error' when the line is no header.
-spec parse(binary()) -> {ok, Comm :: binary(), Inline :: binary()} | error.
parse(Line) ->
    Tokens = binary:split(Line, <<" ">>, [global, trim_all]),
    header(Tokens, []).

%% @doc The thread type of a perf `comm' (thread name), numbers removed:
%% `1_scheduler' and `erts_sched_1' are both `<<"scheduler">>'.
-spec thread_type(binary()) -> binary().
thread_type(Comm) ->
    case strip_number(Comm) of
        <<"scheduler">> -> <<"scheduler">>;
        <<"sched">> -> <<"scheduler">>;
        <<"dirty_cpu_sch">> -> <<"dirty_cpu">>;
        <<"dcpus">> -> <<"dirty_cpu">>;
        <<"dirty_io_sche">> -> <<"dirty_io">>;
        <<"dirty_io_sch">> -> <<"dirty_io">>;
        <<"dios">> -> <<"dirty_io">>;
        <<"aux">> -> <<"aux">>;
        <<"poller">> -> <<"poll">>;
        <<"poll">> -> <<"poll">>;
        <<"async">> -> <<"async">>;
        <<"sys_sig_dispatc">> -> <<"sys_sig_dispatch">>;
        <<"ssig_disp">> -> <<"sys_sig_dispatch">>;
        <<"sys_msg_dispatc">> -> <<"sys_msg_dispatch">>;
        <<"smsg_disp">> -> <<"sys_msg_dispatch">>;
        <<"runq_sup">> -> <<"runq_supervisor">>;
        <<"beam.smp">> -> <<"main">>;
        Other -> beamdiag_fold_frame:sanitize(Other)
    end.

%%%===================================================================
%%% Internal
%%%===================================================================

header([], _) ->
    error;
header([Tok | Rest], Before) ->
    case is_time(Tok) of
        true when Before =/= [] -> header_after(Rest, Before);
        _ -> header(Rest, [Tok | Before])
    end.

header_after(Rest, Before) ->
    %% Before is reversed: tid (and maybe [cpu]) first, then the comm.
    CommTokens = case Before of
        [<<"[", _/binary>>, _Tid | C] -> C;
        [_Tid | C] -> C
    end,
    case CommTokens of
        [] ->
            error;
        _ ->
            Comm = iolist_to_binary(lists:join(<<" ">>, lists:reverse(CommTokens))),
            {ok, Comm, inline(Rest)}
    end.

%% After the time: optional period, the event name ending in ':', then an
%% inline frame when perf recorded no call chain.
inline([]) -> <<>>;
inline([P, E | Frame]) ->
    case beamdiag_fold_frame:is_digits(P) of
        true -> inline_event([E | Frame]);
        false -> inline_event([P, E | Frame])
    end;
inline(Other) -> inline_event(Other).

inline_event([E | Frame]) ->
    case binary:last(E) of
        $: when Frame =/= [] -> iolist_to_binary(lists:join(<<" ">>, Frame));
        _ -> <<>>
    end.

is_time(Tok) ->
    byte_size(Tok) > 2 andalso binary:last(Tok) =:= $: andalso
        is_time1(binary:part(Tok, 0, byte_size(Tok) - 1), false).

is_time1(<<>>, Dot) -> Dot;
is_time1(<<$., R/binary>>, false) -> is_time1(R, true);
is_time1(<<C, R/binary>>, Dot) when C >= $0, C =< $9 -> is_time1(R, Dot);
is_time1(_, _) -> false.

strip_number(Comm) ->
    C1 = case Comm of
        <<"erts_", R/binary>> -> R;
        _ -> Comm
    end,
    strip_trailing_number(strip_leading_number(C1)).

strip_leading_number(<<C, R/binary>> = B) when C >= $0, C =< $9 ->
    case drop_digits(R) of
        <<"_", R2/binary>> when R2 =/= <<>> -> R2;
        _ -> B
    end;
strip_leading_number(B) ->
    B.

drop_digits(<<C, R/binary>>) when C >= $0, C =< $9 -> drop_digits(R);
drop_digits(B) -> B.

strip_trailing_number(B) ->
    case binary:matches(B, <<"_">>) of
        [] -> B;
        Ms ->
            {P, _} = lists:last(Ms),
            Tail = binary:part(B, P + 1, byte_size(B) - P - 1),
            case beamdiag_fold_frame:is_digits(Tail) andalso P > 0 of
                true -> binary:part(B, 0, P);
                false -> B
            end
    end.
