%%% beamdiag_rpc answers as erpc:call/5 does, and runs the call at the
%%% priority asked for.
-module(beamdiag_rpc_tests).

-include_lib("eunit/include/eunit.hrl").

same_results_as_erpc_test() ->
    Calls = [{erlang, node, []}, {erlang, throw, [x]}, {erlang, error, [y]},
             {erlang, exit, [z]}, {beamdiag_no_such_module, f, []},
             {erlang, exit, [kill]}],
    [?assertEqual(outcome(fun() -> erpc:call(node(), M, F, A, 5000) end),
                  outcome(fun() -> beamdiag_rpc:call(node(), M, F, A, 5000) end))
     || {M, F, A} <- Calls].

%% process_flag/2 returns the priority the call's process had.
priority_test() ->
    ?assertEqual(high, beamdiag_rpc:call(node(), erlang, process_flag, [priority, normal], 5000)),
    ?assertEqual(max, beamdiag_rpc:call(node(), erlang, process_flag, [priority, normal], 5000,
                                        max)).

timeout_test() ->
    %% In a process of its own: other tests may leave words in this one's
    %% mailbox.
    Self = self(),
    Pid = spawn(fun() ->
                    R = try beamdiag_rpc:call(node(), timer, sleep, [2000], 50)
                        catch C:E -> {C, E}
                        end,
                    %% Nothing of the abandoned call is left in the mailbox.
                    timer:sleep(100),
                    Self ! {self(), R, erlang:process_info(self(), messages)}
                end),
    receive
        {Pid, R, Msgs} ->
            ?assertEqual({error, {erpc, timeout}}, R),
            ?assertEqual({messages, []}, Msgs)
    after 5000 ->
        error(no_answer)
    end.

%% A node that cannot be reached fails as with erpc.
no_connection_test() ->
    Node = 'beamdiag_nobody@nohost',
    ?assertEqual(outcome(fun() -> erpc:call(Node, erlang, node, [], 1000) end),
                 outcome(fun() -> beamdiag_rpc:call(Node, erlang, node, [], 1000) end)).

outcome(F) ->
    try {ok, F()}
    catch
        error:{exception, R, [{M, Fn, A, _} | _]} -> {error, exception, R, {M, Fn, A}};
        Class:Reason -> {Class, strip(Reason)}
    end.

strip({exception, R, _Stack}) -> {exception, R};
strip(R) -> R.
