#!/usr/bin/env escript
%% Redis plus binary_to_term against an ETS tier, for the same atom-heavy
%% term, next to the field report's 6.43x.
%%
%% Starts a real redis-server on 127.0.0.1 (a free port, no persistence,
%% stopped at the end), stores term_to_binary(T, [{compressed, 6}]), then
%% alternates rounds of "GET + binary_to_term" and "ets:lookup" (the term
%% copied out of ETS into the caller's heap) and prints requests per
%% second and the ratio. Needs redis-server and `rebar3 compile'.
%%
%% Usage: bench/cache_tier.escript [ATOMS] [ROUNDS]
-mode(compile).

main(Args) ->
    Ebin = filename:join([filename:dirname(escript:script_name()), "..", "_build", "default",
                          "lib", "beamdiag", "ebin"]),
    true = code:add_patha(Ebin),
    {Atoms, Rounds} = case Args of
        [A, R] -> {list_to_integer(A), list_to_integer(R)};
        [A] -> {list_to_integer(A), 3};
        [] -> {200000, 3}
    end,
    {ok, Redis = #{port := Port}} = beamdiag_lab_cache:start_redis(600),
    try
        Term = beamdiag_lab_cache:atom_term(Atoms),
        Bin = term_to_binary(Term, [{compressed, 6}]),
        io:format("term: ~b atoms, ~.2f MB in memory, ~.2f MB compressed~n",
                  [Atoms, erts_debug:flat_size(Term) * 8 / 1.0e6, byte_size(Bin) / 1.0e6]),
        {ok, C} = beamdiag_resp:connect(Port, 2000),
        {ok, <<"OK">>} = beamdiag_resp:command(C, [<<"SET">>, <<"bench:term">>, Bin]),
        Tab = ets:new(cache_tier, [set, public, {read_concurrency, true}]),
        true = ets:insert(Tab, {<<"bench:term">>, Term}),
        Redis1 = fun() ->
            {ok, B} = beamdiag_resp:command(C, [<<"GET">>, <<"bench:term">>], 30000),
            binary_to_term(B)
        end,
        Ets1 = fun() -> [{_, T}] = ets:lookup(Tab, <<"bench:term">>), T end,
        Term = Redis1(),
        Term = Ets1(),
        Decode1 = fun() -> binary_to_term(Bin) end,
        Get1 = fun() -> {ok, _} = beamdiag_resp:command(C, [<<"GET">>, <<"bench:term">>], 30000) end,
        io:format("parts: GET alone ~.2f/s, binary_to_term alone ~.2f/s~n", [rate(Get1), rate(Decode1)]),
        Results = [{rate(Redis1), rate(Ets1)} || _ <- lists:seq(1, Rounds)],
        [io:format("round ~b: redis+decode ~.2f/s, ets ~.2f/s, ratio ~.2fx~n", [I, R, E, E / R])
         || {I, {R, E}} <- lists:zip(lists:seq(1, Rounds), Results)],
        Rs = lists:sort([R || {R, _} <- Results]),
        Es = lists:sort([E || {_, E} <- Results]),
        Med = fun(L) -> lists:nth((length(L) + 1) div 2, L) end,
        io:format("median: ets ~.2f/s, redis+binary_to_term ~.2f/s: redis path ~.2fx slower "
                  "(field report: 6.43x for a 7 MB compressed term)~n",
                  [Med(Es), Med(Rs), Med(Es) / Med(Rs)]),
        beamdiag_resp:close(C)
    after
        beamdiag_lab_cache:stop_redis(Redis)
    end.

%% Requests per second over at least 2 s (at least 3 requests).
rate(F) ->
    T0 = erlang:monotonic_time(microsecond),
    N = loop(F, T0 + 2000000, 0),
    N / ((erlang:monotonic_time(microsecond) - T0) / 1.0e6).

loop(F, Until, N) ->
    _ = F(),
    case N >= 2 andalso erlang:monotonic_time(microsecond) >= Until of
        true -> N + 1;
        false -> loop(F, Until, N + 1)
    end.
