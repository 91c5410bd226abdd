%%% EUnit tests of beamdiag_host_pid on a /proc tree written here: pid 100
%%% and 200 are beams that are both pid 1 in PID namespaces of their own
%%% (two containers), started at clock ticks 5000 and 6000; 300 is a shell,
%%% pid 1 in a third namespace; 400 a beam in this host's namespace.
-module(beamdiag_host_pid_tests).
-include_lib("eunit/include/eunit.hrl").

tree() ->
    Root = filename:join("/tmp", "beamdiag_host_pid_" ++ os:getpid() ++ "_" ++
                             integer_to_list(erlang:unique_integer([positive]))),
    [write(Root, Pid, Comm, NsPids, Start)
     || {Pid, Comm, NsPids, Start} <- [{100, "beam.smp", [100, 1], 5000},
                                       {200, "beam.smp", [200, 1], 6000},
                                       {300, "bash", [300, 1], 7000},
                                       {400, "beam.smp", [400], 8000}]],
    Root.

write(Root, Pid, Comm, NsPids, Start) ->
    Dir = filename:join(Root, integer_to_list(Pid)),
    ok = filelib:ensure_dir(filename:join(Dir, "x")),
    ok = file:write_file(filename:join(Dir, "comm"), [Comm, "\n"]),
    ok = file:write_file(filename:join(Dir, "status"),
                         ["Name:\t", Comm, "\nState:\tS (sleeping)\nTgid:\t", integer_to_list(Pid),
                          "\nNSpid:", [["\t", integer_to_list(P)] || P <- NsPids],
                          "\nCapEff:\t000001ffffffffff\n"]),
    %% A name with a space and a parenthesis, as a thread may have.
    ok = file:write_file(filename:join(Dir, "stat"),
                         io_lib:format("~b (~s x) y) S 1 1 1 0 -1 4194560 101 0 0 0 0 0 0 0 20 "
                                       "0 1 0 ~b 3133440 382 18446744073709551615 0 0 0\n",
                                       [Pid, Comm, Start])).

host_pid_test_() ->
    {setup, fun tree/0, fun(Root) -> os:cmd("rm -rf '" ++ Root ++ "'") end,
     fun(Root) ->
             [?_assertEqual(1, beamdiag_host_pid:ns_pid(Root, 100)),
              ?_assertEqual(400, beamdiag_host_pid:ns_pid(Root, 400)),
              %% Gone: its own pid is the one given.
              ?_assertEqual(999, beamdiag_host_pid:ns_pid(Root, 999)),
              %% The start time tells the two containers' pid 1 apart.
              ?_assertEqual({ok, 200}, beamdiag_host_pid:host_pid(Root, 1, #{start => 6000})),
              ?_assertEqual({ok, 100}, beamdiag_host_pid:host_pid(Root, 1, #{start => 5000})),
              ?_assertEqual({error, {beamdiag_host_pid, {ambiguous, 1, [100, 200]}}},
                            beamdiag_host_pid:host_pid(Root, 1, #{})),
              ?_assertEqual({error, {beamdiag_host_pid, {not_found, 1}}},
                            beamdiag_host_pid:host_pid(Root, 1, #{start => 7000})),
              %% In this host's namespace, the pid is the host's.
              ?_assertEqual({ok, 400}, beamdiag_host_pid:host_pid(Root, 400, #{start => 8000})),
              ?_assertEqual({ok, 400}, beamdiag_host_pid:host_pid(Root, 400, #{})),
              %% 100 is a host pid, but no node's own.
              ?_assertEqual({error, {beamdiag_host_pid, {not_found, 100}}},
                            beamdiag_host_pid:host_pid(Root, 100, #{}))]
     end}.

start_ticks_test_() ->
    [?_assertEqual({ok, 147745},
                   beamdiag_host_pid:start_ticks(
                     <<"18128 (cat) R 18125 18125 21912 0 -1 4194304 101 0 0 0 0 0 0 0 20 0 1 0 "
                       "147745 3133440 382 18446744073709551615 94227787022336\n">>)),
     ?_assertEqual({ok, 42}, beamdiag_host_pid:start_ticks(
                               <<"7 (a) b (c)) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 42 0">>)),
     ?_assertEqual(error, beamdiag_host_pid:start_ticks(<<"7 (short) S 1 2 3">>)),
     ?_assertEqual(error, beamdiag_host_pid:start_ticks(<<"no name at all">>)),
     ?_assertEqual(error, beamdiag_host_pid:start_ticks(<<>>))].

messages_test() ->
    [?assertEqual(nomatch, string:find(lists:flatten(beamdiag_host_pid:format_error(E)), "\n"))
     || E <- [{not_found, 1}, {ambiguous, 1, [100, 200]}]].
