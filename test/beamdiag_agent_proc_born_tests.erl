%%% EUnit tests of the newborn's groups on this VM: 150 processes spawned
%%% by one process beside 20 spawned by another are grouped by what they
%%% run and who spawned them, the larger group first, the spawner named;
%%% a growth under the bound, or a sampled walk, reads nothing.
-module(beamdiag_agent_proc_born_tests).
-include_lib("eunit/include/eunit.hrl").

groups_test() ->
    Base = maps:from_list([{P, x} || P <- erlang:processes()]),
    Self = self(),
    Spawn = fun(N) ->
                spawn(fun() ->
                          register(beamdiag_born_test_spawner, self()),
                          [spawn(timer, sleep, [10000]) || _ <- lists:seq(1, N)],
                          Self ! spawned,
                          %% Out of this module's code: the identity reads
                          %% leave out processes in beamdiag_agent* code.
                          timer:sleep(infinity)
                      end)
            end,
    S1 = Spawn(150),
    receive spawned -> ok end,
    S2 = spawn(fun() -> [spawn(timer, sleep, [10000]) || _ <- lists:seq(1, 20)],
                        Self ! spawned, timer:sleep(infinity) end),
    receive spawned -> ok end,
    try
        Names = beamdiag_agent_proc_identity:names(),
        Grew = length(erlang:processes()) - map_size(Base),
        #{read := Read, groups := [G1, G2 | _]} =
            beamdiag_agent_proc_born:read(all, erlang:processes(), Base, Grew, Names),
        %% The 170 children and their two spawners.
        ?assertEqual(172, Read),
        ?assertMatch(#{count := 150, initial_call := <<"timer:sleep/1">>,
                       current := <<"timer:sleep/1">>,
                       parent := #{name := <<"beamdiag_born_test_spawner">>}}, G1),
        ?assertEqual(20, maps:get(count, G2)),
        ?assertEqual(list_to_binary(pid_to_list(S2)), maps:get(pid, maps:get(parent, G2))),
        ?assertEqual(#{}, beamdiag_agent_proc_born:read(all, erlang:processes(), Base, 99, Names)),
        ?assertEqual(#{}, beamdiag_agent_proc_born:read(sampled, erlang:processes(), Base, Grew,
                                                        Names))
    after
        exit(S1, kill),
        exit(S2, kill)
    end.
