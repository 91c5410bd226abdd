%%% @doc A `perf script' sample's header line, and the thread type it names.
%%%
%%% The header is `COMM  TID [CPU] TIME: PERIOD EVENT: [inline frame]'; the
%%% comm (thread name) may hold spaces, and the time token (`123.456:')
%%% anchors the parse. The thread type is the comm with its thread numbers
%%% removed (`scheduler', `dirty_cpu', `dirty_io', `aux', `poll', ...), so
%%% all schedulers add up in one tower of the flamegraph.
%%%
%%% `parse/1' reads any line. The folder's fast path uses `split/2' instead:
%%% it cuts a header of the usual shape at its time token, so the text
%%% before the time (comm, tid, cpu: the same for every sample of a
%%% thread) can be looked up in a cache and `comm/1' runs once per thread,
%%% while `inline/1' reads what follows the time. For any line `split/2'
%%% accepts, `comm/1' and `inline/1' give what `parse/1' gives.
%%%
%%% ```
%%% 1> beamdiag_fold_header:parse(<<"1_scheduler 4712 [001] 12.5: 1001 cpu-clock:">>).
%%% {ok, <<"1_scheduler">>, <<>>}
%%% 2> beamdiag_fold_header:thread_type(<<"1_scheduler">>).
%%% <<"scheduler">>
%%% '''
-module(beamdiag_fold_header).

-export([parse/1, frame/1, split/2, colon/0, comm/1, inline/1, thread_type/1]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The comm and the inline frame (`<<>>' when perf recorded a call
%% chain) of a header line, or `error' when the line is no header.
-spec parse(binary()) -> {ok, Comm :: binary(), Inline :: binary()} | error.
parse(Line) ->
    Tokens = binary:split(Line, <<" ">>, [global, trim_all]),
    header(Tokens, []).

%% @doc The thread id, symbol (its offset cut) and library of a sample
%% recorded without a call graph, whose frame stands on its header line:
%% "  comm  TID  TIME:  PERIOD  EVENT:  IP  SYM+OFF (DSO)".
-spec frame(binary()) -> {integer(), binary(), binary()} | skip.
frame(Line) ->
    case binary:split(Line, <<" (">>, [global]) of
        [_] ->
            skip;
        Parts ->
            Dso0 = lists:last(Parts),
            Head = iolist_to_binary(lists:join(<<" (">>, lists:droplast(Parts))),
            Dso = case binary:last(Dso0) of
                      $) -> binary:part(Dso0, 0, byte_size(Dso0) - 1);
                      _ -> Dso0
                  end,
            case binary:split(Head, <<":">>, [global]) of
                [Pre | Rest = [_ | _]] ->
                    %% After "EVENT:" come the address and the symbol.
                    AfterEvent = lists:last(Rest),
                    case {tid(Pre), string:lexemes(AfterEvent, " ")} of
                        {{ok, Tid}, [_Ip | SymParts = [_ | _]]} ->
                            Sym = strip_offset(iolist_to_binary(lists:join(<<" ">>, SymParts))),
                            {Tid, Sym, Dso};
                        _ ->
                            skip
                    end;
                _ ->
                    skip
            end
    end.

%% "  comm-with spaces  TID  TIME" -> the TID (the field before the time).
%% @doc A header of the usual shape cut at its time token: `{Prefix,
%% After}', the text before the time token and the text after its `:'.
%% The first `:' of the line must end the time token, which must follow a
%% space and some text and be followed by a space or the line's end; any
%% other line is `slow' (read it with `parse/1'). `ColonPattern' is `colon/0',
%% compiled once: a pattern compiled at each call costs more than the
%% rest of the split.
-spec split(binary(), binary:cp()) -> {Prefix :: binary(), After :: binary()} | slow.
split(Line, ColonPattern) ->
    case binary:match(Line, ColonPattern) of
        {Colon, 1} when Colon > 2 ->
            case after_colon(Line, Colon) of
                true -> time_token(Line, Line, 0, Colon, none, false, 0, false, false);
                false -> slow
            end;
        _ ->
            slow
    end.

%% @doc The pattern `split/2' looks for.
-spec colon() -> binary:cp().
colon() ->
    binary:compile_pattern(<<":">>).

%% @doc The comm named by the text before a header's time token
%% (`split/2'), or `error' when that text names none.
-spec comm(binary()) -> {ok, binary()} | error.
comm(Prefix) ->
    case binary:split(Prefix, <<" ">>, [global, trim_all]) of
        [] ->
            error;
        Tokens ->
            case header_after([], lists:reverse(Tokens)) of
                {ok, Comm, _} -> {ok, Comm};
                error -> error
            end
    end.

%% @doc The inline frame held by the text after a header's time token
%% (`split/2'): `<<>>' when perf recorded a call chain.
-spec inline(binary()) -> binary().
inline(After) ->
    inline_tokens(binary:split(After, <<" ">>, [global, trim_all])).

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
            {ok, Comm, inline_tokens(Rest)}
    end.

%% After the time: optional period, the event name ending in ':', then an
%% inline frame when perf recorded no call chain.
inline_tokens([]) -> <<>>;
inline_tokens([P, E | Frame]) ->
    case beamdiag_fold_frame:is_digits(P) of
        true -> inline_event([E | Frame]);
        false -> inline_event([P, E | Frame])
    end;
inline_tokens(Other) -> inline_event(Other).

inline_event([E | Frame]) ->
    case binary:last(E) of
        $: when Frame =/= [] -> iolist_to_binary(lists:join(<<" ">>, Frame));
        _ -> <<>>
    end.

%% The time token's `:' ends the line or is followed by a space.
after_colon(Line, Colon) when byte_size(Line) =:= Colon + 1 -> true;
after_colon(Line, Colon) -> binary:at(Line, Colon + 1) =:= $\s.

%% The time token ends at the `:' (at Colon): it is the text after the
%% last space before it, digits and one dot, at least two bytes, and the
%% text before that space is not only spaces. No token before it ends in
%% `:', so none is a time token, as `parse/1' would find. Read in one pass
%% from the line's start (one match context for the whole pass; a walk
%% back from the `:' makes one a byte). Sp: the last space so far, SpText:
%% whether some text came before it; Dots and Bad: what the token after it
%% holds so far; Text: whether some text came so far.
time_token(<<C, R/binary>>, Line, I, Colon, Sp, SpText, Dots, Bad, Text) when I < Colon ->
    if
        C =:= $\s -> time_token(R, Line, I + 1, Colon, I, Text, 0, false, Text);
        C >= $0, C =< $9 -> time_token(R, Line, I + 1, Colon, Sp, SpText, Dots, Bad, true);
        C =:= $. -> time_token(R, Line, I + 1, Colon, Sp, SpText, Dots + 1, Bad, true);
        true -> time_token(R, Line, I + 1, Colon, Sp, SpText, Dots, true, true)
    end;
time_token(_, Line, _I, Colon, Sp, true, 1, false, _Text) when is_integer(Sp), Sp =< Colon - 3 ->
    {binary:part(Line, 0, Sp), binary:part(Line, Colon + 1, byte_size(Line) - Colon - 1)};
time_token(_, _Line, _I, _Colon, _Sp, _SpText, _Dots, _Bad, _Text) ->
    slow.

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

tid(Pre) ->
    case lists:reverse(string:lexemes(Pre, " ")) of
        [_Time, TidB | _] ->
            try {ok, binary_to_integer(TidB)} catch error:badarg -> error end;
        _ ->
            error
    end.

strip_offset(Sym) ->
    case binary:split(Sym, <<"+0x">>) of
        [S, _] -> S;
        [S] -> S
    end.
