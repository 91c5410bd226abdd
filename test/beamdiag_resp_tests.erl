%%% Tests of the RESP decoder and encoder.
-module(beamdiag_resp_tests).

-include_lib("eunit/include/eunit.hrl").

decode_test_() ->
    [?_assertEqual(Want, beamdiag_resp:decode(In))
     || {In, Want} <- [
            {<<"+OK\r\n">>, {ok, <<"OK">>, <<>>}},
            {<<"-ERR bad\r\nx">>, {ok, {redis_error, <<"ERR bad">>}, <<"x">>}},
            {<<":42\r\n">>, {ok, 42, <<>>}},
            {<<"$3\r\nabc\r\n">>, {ok, <<"abc">>, <<>>}},
            {<<"$-1\r\n">>, {ok, undefined, <<>>}},
            {<<"$5\r\nab">>, more},
            {<<"+OK">>, more},
            {<<"*2\r\n$1\r\na\r\n:1\r\n">>, {ok, [<<"a">>, 1], <<>>}},
            {<<"*2\r\n$1\r\na\r\n">>, more},
            {<<"?x\r\n">>, {error, {bad_type, $?}}},
            {<<":x\r\n">>, {error, {bad_integer, <<"x">>}}},
            {<<"$-5\r\n">>, {error, {bad_length, -5}}}
        ]].

encode_test() ->
    ?assertEqual(<<"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\n10\r\n">>,
                 iolist_to_binary(beamdiag_resp:encode([<<"SET">>, "k", 10]))).

binary_value_test() ->
    V = term_to_binary({a, [b, c]}, [{compressed, 6}]),
    Enc = iolist_to_binary([$$, integer_to_binary(byte_size(V)), "\r\n", V, "\r\n"]),
    ?assertEqual({ok, V, <<>>}, beamdiag_resp:decode(Enc)).
