%%% @doc A small JSON encoder (OTP 25 has no `json' module).
%%%
%%% Maps become objects (atom, binary or integer keys, sorted), lists arrays,
%%% binaries strings (invalid UTF-8 is replaced, control characters
%%% escaped), `true', `false' and `null' themselves, other atoms strings,
%%% `undefined' null. Anything else is a bug in the caller and raises.
%%%
%%% ```
%%% 1> iolist_to_binary(beamdiag_json:encode(#{a => [1, 2.5, <<"x">>]})).
%%% <<"{\"a\":[1,2.5,\"x\"]}">>
%%% '''
-module(beamdiag_json).

-export([encode/1]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Encodes a term as JSON text.
-spec encode(term()) -> iolist().
encode(true) -> <<"true">>;
encode(false) -> <<"false">>;
encode(null) -> <<"null">>;
encode(undefined) -> <<"null">>;
encode(A) when is_atom(A) -> string(atom_to_binary(A));
encode(B) when is_binary(B) -> string(B);
encode(I) when is_integer(I) -> integer_to_binary(I);
encode(F) when is_float(F) -> float_to_binary(F, [short]);
encode(L) when is_list(L) -> [$[, join([encode(E) || E <- L]), $]];
encode(M) when is_map(M) ->
    Pairs = lists:sort([{key(K), V} || {K, V} <- maps:to_list(M)]),
    [${, join([[string(K), $:, encode(V)] || {K, V} <- Pairs]), $}];
encode(Other) ->
    error({not_json, Other}).

%%%===================================================================
%%% Internal
%%%===================================================================

key(K) when is_atom(K) -> atom_to_binary(K);
key(K) when is_binary(K) -> K;
key(K) when is_integer(K) -> integer_to_binary(K);
key(K) -> error({not_json_key, K}).

join([]) -> [];
join([H | T]) -> [H | [[$, | E] || E <- T]].

string(B) ->
    [$", escape(valid_utf8(B), <<>>), $"].

escape(<<>>, Acc) -> Acc;
escape(<<$", R/binary>>, Acc) -> escape(R, <<Acc/binary, "\\\"">>);
escape(<<$\\, R/binary>>, Acc) -> escape(R, <<Acc/binary, "\\\\">>);
escape(<<$\n, R/binary>>, Acc) -> escape(R, <<Acc/binary, "\\n">>);
escape(<<$\r, R/binary>>, Acc) -> escape(R, <<Acc/binary, "\\r">>);
escape(<<$\t, R/binary>>, Acc) -> escape(R, <<Acc/binary, "\\t">>);
%% < and > escaped so that JSON embedded in HTML cannot close a script tag.
escape(<<$<, R/binary>>, Acc) -> escape(R, <<Acc/binary, "\\u003c">>);
escape(<<$>, R/binary>>, Acc) -> escape(R, <<Acc/binary, "\\u003e">>);
escape(<<C, R/binary>>, Acc) when C < 32 ->
    escape(R, <<Acc/binary, (iolist_to_binary(io_lib:format("\\u~4.16.0b", [C])))/binary>>);
escape(<<C, R/binary>>, Acc) -> escape(R, <<Acc/binary, C>>).

valid_utf8(B) ->
    case unicode:characters_to_binary(B, utf8, utf8) of
        Good when is_binary(Good) -> Good;
        {_, Good, Rest} -> <<Good/binary, "\xef\xbf\xbd", (valid_utf8(skip1(Rest)))/binary>>
    end.

skip1(<<_, R/binary>>) -> R;
skip1(<<>>) -> <<>>.
