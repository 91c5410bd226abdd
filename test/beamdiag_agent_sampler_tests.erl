%%% EUnit tests of the Erlang-level CPU sampler on this node, two runs of
%%% its least duration (1 s) side by side: a process that spins is found
%%% in its own function, the counts agree with each other and with the
%%% rate, stacks are cut at `depth' and their number at `max_stacks', the
%%% caller's priority is put back, and bad options crash.
-module(beamdiag_agent_sampler_tests).

-include_lib("eunit/include/eunit.hrl").

-define(SPIN, <<"beamdiag_agent_sampler_tests:spin/1">>).

sampler_test_() ->
    {setup, fun runs/0, fun(#{spinner := S}) -> exit(S, kill) end,
     fun(Ctx) -> [
         {"the spinning process is found where it spins", fun() -> found(Ctx) end},
         {"the counts agree", fun() -> counts(Ctx) end},
         {"stacks cut at depth", fun() -> depth(Ctx) end},
         {"stacks bounded by max_stacks", fun() -> max_stacks(Ctx) end},
         {"the caller's priority is put back", fun() -> priority(Ctx) end}
     ] end}.

%% Both runs at once, while a process spins.
runs() ->
    Spinner = spawn(fun() -> spin(0) end),
    Self = self(),
    Run = fun(Tag, Opts) ->
                  spawn_link(fun() ->
                                     Before = erlang:process_info(self(), priority),
                                     R = beamdiag_agent_sampler:run(Opts),
                                     After = erlang:process_info(self(), priority),
                                     Self ! {Tag, R, Before, After}
                             end)
          end,
    _ = Run(deep, #{duration => 1, frequency => 50, depth => 3}),
    _ = Run(few, #{duration => 1, frequency => 50, max_stacks => 1}),
    Get = fun(Tag) -> receive {Tag, R, B, A} -> {R, B, A} after 20000 -> error({no_run, Tag}) end end,
    {Deep, B1, A1} = Get(deep),
    {Few, B2, A2} = Get(few),
    #{spinner => Spinner, deep => Deep, few => Few, priorities => [{B1, A1}, {B2, A2}]}.

spin(N) ->
    spin(N + 1).

found(#{spinner := Spinner, deep := R}) ->
    #{stacks := Stacks, processes := Procs} = R,
    ?assert(lists:any(fun(K) -> lists:member(?SPIN, K) end, maps:keys(Stacks))),
    Key = list_to_binary(pid_to_list(Spinner)),
    [P] = [P || P = #{pid := K} <- Procs, K =:= Key],
    #{samples := N, stacks := [#{stack := Top, count := C} | _]} = P,
    ?assert(N >= 1 andalso C =< N),
    ?assertEqual(?SPIN, lists:last(Top)),
    ?assertEqual(<<"erlang">>, hd(Top)).

counts(#{deep := R, few := F}) ->
    [begin
         #{stacks := Stacks, samples := S, ticks := T, looked_at := L, list_reads := LR,
           skipped_ticks := Sk, duration_ms := D, process_count := PC, processes := Ps} = X,
         %% Every sample is one stack counted.
         ?assertEqual(S, lists:sum(maps:values(Stacks))),
         ?assert(S =< L),
         %% 50 Hz for a second (the first tick at once), some skipped when
         %% every asker was still out.
         ?assert(T >= 1 andalso T =< 51),
         ?assert(Sk =< T),
         %% A second, less the last tick's rounding to the millisecond.
         ?assert(D >= 999),
         %% The list read once at the start, again only every 10 s.
         ?assertEqual(1, LR),
         ?assert(PC > 0),
         %% At most ten processes, most samples first, each its own stacks.
         ?assert(length(Ps) =< 10),
         Ns = [N || #{samples := N} <- Ps],
         ?assertEqual(lists:reverse(lists:sort(Ns)), Ns),
         ?assert(lists:sum(Ns) =< S),
         [?assert(lists:sum([C || #{count := C} <- St]) =< N andalso length(St) =< 10)
          || #{samples := N, stacks := St} <- Ps]
     end || X <- [R, F]].

depth(#{deep := #{stacks := Stacks}}) ->
    ?assert(map_size(Stacks) > 0),
    [?assert(length(K) =< 4 andalso hd(K) =:= <<"erlang">>) || K <- maps:keys(Stacks)].

max_stacks(#{few := #{stacks := Stacks, samples := S}}) ->
    %% One stack, and the rest counted together.
    ?assert(map_size(Stacks) =< 2),
    case maps:find([<<"erlang">>, <<"[other stacks]">>], Stacks) of
        {ok, Other} -> ?assert(Other < S);
        error -> ?assertEqual(1, map_size(Stacks))
    end.

priority(#{priorities := Ps}) ->
    [?assertEqual({{priority, normal}, {priority, normal}}, P) || P <- Ps].

bad_options_test_() ->
    [?_assertError({badmatch, false}, beamdiag_agent_sampler:run(O))
     || O <- [#{duration => 0}, #{duration => 601}, #{duration => 1.0}, #{frequency => 0},
              #{frequency => 1001}]].

defaults_test() ->
    D = beamdiag_agent_sampler:defaults(),
    ?assertMatch(#{duration := 10, frequency := 97, per_tick := 200, refresh := 10,
                   max_list := 100000, depth := 64, max_stacks := 50000, askers := 4}, D).
