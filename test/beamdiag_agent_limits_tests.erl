%%% The node's limits read on this node, and the atoms' sources: a
%%% process making atoms from strings is caught running, with its
%%% functions.
-module(beamdiag_agent_limits_tests).
-include_lib("eunit/include/eunit.hrl").

counts_test() ->
    C = beamdiag_agent_limits:counts(),
    ?assertEqual([atoms, ets_tables, ports, processes], lists:sort(maps:keys(C))),
    [?assert(is_integer(N) andalso is_integer(L) andalso N =< L)
     || [N, L] <- maps:values(C), L =/= erlang:system_info(ets_limit)],
    ?assertEqual(erlang:system_info(atom_limit), lists:last(maps:get(atoms, C))).

sources_test_() ->
    {timeout, 30, fun sources/0}.

sources() ->
    Self = self(),
    Leaker = spawn(fun() -> leak(0, Self) end),
    receive started -> ok end,
    try
        A0 = erlang:system_info(atom_count),
        R = beamdiag_agent_limits:sources(erlang:processes(), #{}),
        ?debugFmt("~p", [R]),
        %% Raw signal: the table grew while the looks ran.
        ?assert(erlang:system_info(atom_count) > A0),
        #{processes := Ps, rounds := 5, atoms := [_, _]} = R,
        LeakerText = list_to_binary(pid_to_list(Leaker)),
        [E] = [E || E = #{pid := P} <- Ps, P =:= LeakerText],
        ?assert(maps:get(samples, E) >= 3),
        ?assert(lists:member(<<"beamdiag_agent_limits_tests:leak/2">>, maps:get(functions, E))),
        %% A BIF shows in a sample only when the process is caught at its
        %% call: when it does, it is marked.
        ?assert(lists:all(fun(F) -> F =:= <<"erlang:list_to_atom/1">> end,
                          maps:get(makes_atoms, E)))
    after
        exit(Leaker, kill)
    end.

%% A loop that turns strings into new atoms, never pausing.
leak(N, Parent) ->
    _ = [list_to_atom("beamdiag_test_leak_" ++ integer_to_list(N + I)) || I <- lists:seq(1, 100)],
    case N of
        0 -> Parent ! started;
        _ -> ok
    end,
    leak(N + 100, Parent).
