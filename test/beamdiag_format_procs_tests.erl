%%% EUnit tests of the TOP PROCESSES section: a process spawned from a fun
%%% is named by its fun and by who spawned it (a line of its own under it);
%%% a named or proc_lib process is not given its spawner.
-module(beamdiag_format_procs_tests).

-include_lib("eunit/include/eunit.hrl").

%%% Fixtures

%% A process spawned from a fun as the agent names it
%% (beamdiag_agent_proc_identity), and a registered proc_lib server.
spawned() ->
    #{pid => <<"<0.645.0>">>, name => null, label => null,
      initial_call => <<"a fun in holdex_worker:start/1">>, spawn_call => <<"erlang:apply/2">>,
      current => <<"lists:foldl/3">>, monitored_by => 0, reductions => 900, queue => [0, 3],
      memory => [1000, 2000], heap_words => 100, born => false, status => <<"running">>,
      like => null, parent => #{pid => <<"<0.600.0>">>, name => <<"holdex_sup">>}}.

server() ->
    #{pid => <<"<0.90.0>">>, name => <<"holdex_store">>, label => null,
      initial_call => <<"holdex_store:init/1">>, spawn_call => <<"proc_lib:init_p/5">>,
      current => <<"gen_server:loop/7">>, monitored_by => 0, reductions => 100, queue => [0, 0],
      memory => [1000, 1000], heap_words => 100, born => false, status => <<"waiting">>,
      like => null, parent => #{pid => <<"<0.600.0>">>, name => <<"holdex_sup">>}}.

procs(Es) ->
    #{mode => all, limit => 50000, span_ms => 5000, reductions => 1000,
      process_count => [100, 100], scanned => [100, 100], walk_us => [100, 100],
      truncated => false, top_reductions => Es, queues => Es, heaps => [], heap_growth => []}.

text(P) ->
    unicode:characters_to_binary(beamdiag_format_procs:text(P)).

%%% Tests

%% The top processes: the fun names the process, its spawner has a line
%% under the process's own (the column has no room for both); the server
%% has none.
spawned_by_test() ->
    T = text(procs([spawned(), server()])),
    ?assertMatch({_, _}, binary:match(T, <<"  <0.645.0> (a fun in holdex_worker:start/1)\n"
                                          "                        in lists:foldl/3\n"
                                          "                        spawned by holdex_sup <0.600.0>\n">>)),
    ?assertMatch({_, _}, binary:match(T, <<"holdex_store <0.90.0> (holdex_store:init/1)\n"
                                          "                        in gen_server:loop/7\n">>)),
    %% Once under each list the process is in (reductions, mailboxes).
    ?assertEqual(2, length(binary:matches(T, <<"spawned by">>))).

%% In a finding's evidence (one line, wrapped later) the spawner goes
%% inside the parentheses; a spawner with no name by its pid.
who_test_() ->
    Who = fun(E) -> iolist_to_binary(beamdiag_proc_rules:who(E)) end,
    [?_assertEqual(<<"<0.645.0> (a fun in holdex_worker:start/1, spawned by holdex_sup <0.600.0>)">>,
                   Who(spawned())),
     ?_assertEqual(<<"<0.645.0> (erlang:apply/2, spawned by <0.600.0>)">>,
                   Who((spawned())#{initial_call := <<"erlang:apply/2">>,
                                    parent := #{pid => <<"<0.600.0>">>, name => null}})),
     ?_assertEqual(<<"holdex_store <0.90.0> (holdex_store:init/1)">>, Who(server())),
     %% A name or a label names it already.
     ?_assertEqual(<<"label worker <0.645.0> (a fun in holdex_worker:start/1)">>,
                   Who((spawned())#{label := <<"worker">>})),
     %% Read from a capture made before parents were read: no spawner.
     ?_assertEqual(<<"<0.645.0> (a fun in holdex_worker:start/1)">>,
                   Who(maps:remove(parent, spawned()))),
     ?_assertEqual(<<"<0.645.0> (a fun in holdex_worker:start/1)">>,
                   Who((spawned())#{parent := null}))].
