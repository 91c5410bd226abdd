-module(beamdiag_json_tests).
-include_lib("eunit/include/eunit.hrl").

enc(T) -> iolist_to_binary(beamdiag_json:encode(T)).

basic_test() ->
    ?assertEqual(<<"{\"a\":[1,2.5,\"x\",true,null,null],\"b\":\"c\"}">>,
                 enc(#{b => c, a => [1, 2.5, <<"x">>, true, null, undefined]})).

escaping_test() ->
    ?assertEqual(<<"\"\\\"\\\\\\n\\u0001\\u003cscript\\u003e\"">>,
                 enc(<<"\"\\\n", 1, "<script>">>)).

invalid_utf8_replaced_test() ->
    ?assertEqual(<<"\"a\xef\xbf\xbdb\"">>, enc(<<"a", 255, "b">>)).

not_json_raises_test() ->
    ?assertError({not_json, {1, 2}}, enc({1, 2})).
