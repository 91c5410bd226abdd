%%% A JSON reader for the suites, which read the CLI's output as a user's
%%% tool would (OTP 25 has no json module). Objects become maps with binary
%%% keys, arrays lists, null `null'. Raises on anything that is not JSON
%%% (RFC 8259: no control characters or bad UTF-8 in strings, numbers
%%% without leading zeros or a bare dot, nothing after the value).
-module(beamdiag_test_json).

-export([decode/1]).

decode(Bin) when is_binary(Bin) ->
    {V, Rest} = value(ws(Bin)),
    <<>> = ws(Rest),
    V.

value(<<"{", R/binary>>) -> object(ws(R), #{});
value(<<"[", R/binary>>) -> array(ws(R), []);
value(<<"\"", R/binary>>) -> string(R, <<>>);
value(<<"true", R/binary>>) -> {true, R};
value(<<"false", R/binary>>) -> {false, R};
value(<<"null", R/binary>>) -> {null, R};
value(B) -> number(B).

object(<<"}", R/binary>>, M) when map_size(M) =:= 0 -> {M, R};
object(<<"\"", R0/binary>>, M) ->
    {K, R1} = string(R0, <<>>),
    <<":", R2/binary>> = ws(R1),
    {V, R3} = value(ws(R2)),
    case ws(R3) of
        <<",", R4/binary>> -> object(ws(R4), M#{K => V});
        <<"}", R4/binary>> -> {M#{K => V}, R4}
    end.

array(<<"]", R/binary>>, []) -> {[], R};
array(B, Acc) ->
    {V, R1} = value(B),
    case ws(R1) of
        <<",", R2/binary>> -> array(ws(R2), [V | Acc]);
        <<"]", R2/binary>> -> {lists:reverse([V | Acc]), R2}
    end.

string(<<"\"", R/binary>>, Acc) -> {Acc, R};
string(<<"\\u", H:4/binary, "\\u", L:4/binary, R/binary>>, Acc)
  when H >= <<"D800">>, H =< <<"DBFF">>, L >= <<"DC00">>, L =< <<"DFFF">> ->
    C = 16#10000 + ((hex4(H) - 16#D800) bsl 10) + (hex4(L) - 16#DC00),
    string(R, <<Acc/binary, C/utf8>>);
string(<<"\\u", H:4/binary, R/binary>>, Acc) ->
    C = case hex4(H) of
            S when S >= 16#D800, S =< 16#DFFF -> 16#FFFD;
            V -> V
        end,
    string(R, <<Acc/binary, C/utf8>>);
string(<<"\\", C, R/binary>>, Acc) ->
    E = case C of
            $n -> $\n; $t -> $\t; $r -> $\r; $b -> $\b; $f -> $\f;
            $" -> $"; $\\ -> $\\; $/ -> $/
        end,
    string(R, <<Acc/binary, E>>);
string(<<C, _/binary>>, _) when C < 32 -> error({json_control_character, C});
string(<<C/utf8, R/binary>>, Acc) -> string(R, <<Acc/binary, C/utf8>>).

hex4(H) ->
    {match, _} = re:run(H, "^[0-9a-fA-F]{4}$"),
    binary_to_integer(H, 16).

number(B) ->
    {match, [{0, _}]} = re:run(B, "^-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?(?![0-9.eE+-])",
                               [{capture, first, index}]),
    {Num, R} = lists:splitwith(fun(C) -> lists:member(C, "-+.eE0123456789") end,
                               binary_to_list(B)),
    V = case lists:member($., Num) orelse lists:member($e, Num) orelse lists:member($E, Num) of
            true -> float_value(Num);
            false -> list_to_integer(Num)
        end,
    {V, list_to_binary(R)}.

%% "1e-4" has no dot, which list_to_float wants.
float_value(Num) ->
    case lists:member($., Num) of
        true -> list_to_float(Num);
        false ->
            [M, E] = string:split(string:lowercase(Num), "e"),
            list_to_float(M ++ ".0e" ++ E)
    end.

ws(<<C, R/binary>>) when C =:= $\s; C =:= $\t; C =:= $\n; C =:= $\r -> ws(R);
ws(B) -> B.
