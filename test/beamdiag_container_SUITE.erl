%%% A node in a container: its own PID namespace (`unshare --pid --fork
%%% --mount-proc', where it is pid 1) and its own /tmp (a tmpfs of its
%%% mount namespace), started with +JPperf true, so that its perf map is
%%% /tmp/perf-1.map in its own /tmp. Diagnosed with --perf from the host,
%%% perf records the host's pid and names the node's JIT frames from that
%%% map; run inside the container (its namespaces entered, as kubectl exec
%%% does) without the capabilities perf needs, the diagnosis is made
%%% without perf and says why.
-module(beamdiag_container_SUITE).

-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0, suite/0, init_per_suite/1, end_per_suite/1]).
-export([perf_from_the_host/1, inside_without_perf/1]).

-define(WINDOW, "3").

suite() ->
    [{timetrap, {minutes, 3}}].

all() ->
    [perf_from_the_host, inside_without_perf].

init_per_suite(Config) ->
    Tools = [os:find_executable(T) || T <- ["unshare", "nsenter", "setpriv", "perf", "epmd"]],
    case {beamdiag_test_lib:escript(), lists:member(false, Tools), os:cmd("id -u")} of
        {error, _, _} ->
            beamdiag_test_lib:missing("the escript is not built (rebar3 escriptize)");
        {_, true, _} ->
            beamdiag_test_lib:missing("unshare, nsenter, setpriv (util-linux), perf or epmd missing");
        {_, _, Id} when Id =/= "0\n" ->
            {skip, "a PID namespace of its own needs root"};
        {{ok, _}, false, _} ->
            case lists:prefix("/tmp/", code:which(beamdiag_lab_ledger)) of
                true -> {skip, "the build is under /tmp, which the container's own /tmp hides"};
                false -> start_container(Config)
            end
    end.

start_container(Config) ->
    case beamdiag_test_lib:escript() of
        {ok, Escript} ->
            %% The host's epmd, started here: one started by the node would
            %% live in its namespace and die with it.
            _ = os:cmd("epmd -daemon"),
            Name = "beamdiag_ns_" ++ integer_to_list(erlang:unique_integer([positive])),
            Cookie = "ns" ++ integer_to_list(rand:uniform(1 bsl 40)),
            Ebin = filename:dirname(code:which(beamdiag_lab_ledger)),
            Inner = lists:flatten(
                      ["mount -t tmpfs -o mode=1777 tmpfs /tmp && exec erl -sname ", Name,
                       " -setcookie ", Cookie, " -noinput +JPperf true -pa ", Ebin,
                       " -eval 'spawn(fun() -> beamdiag_lab_ledger:burn(170000, 1) end)'"]),
            Port = open_port({spawn_executable, os:find_executable("unshare")},
                             [{args, ["--pid", "--fork", "--mount-proc", "sh", "-c", Inner]},
                              exit_status, binary, stderr_to_stdout, hide]),
            {os_pid, Unshare} = erlang:port_info(Port, os_pid),
            Node = Name ++ "@" ++ short_host(),
            {ok, _} = beamdiag_test_lib:poll(
                        fun() ->
                                case beamdiag_remote:connect(Node,
                                                             #{cookie => list_to_atom(Cookie)}) of
                                    {ok, N} -> {true, N};
                                    Error -> {false, Error}
                                end
                        end, 30000),
            %% The node's host pid: unshare's child (sh, then erl, erlexec and
            %% beam.smp, each exec'd in turn).
            {ok, Children} = file:read_file(lists:concat(["/proc/", Unshare, "/task/", Unshare,
                                                          "/children"])),
            [HostPid] = [binary_to_integer(C) || C <- binary:split(Children, <<" ">>,
                                                                   [global, trim_all])],
            [{escript, Escript}, {node, Node}, {cookie, Cookie}, {host_pid, HostPid},
             {port, Port} | Config]
    end.

end_per_suite(Config) ->
    case proplists:get_value(host_pid, Config) of
        undefined -> ok;
        %% pid 1 of its namespace: its end ends the namespace.
        Pid -> _ = os:cmd("kill -9 " ++ integer_to_list(Pid)), ok
    end,
    catch port_close(?config(port, Config)),
    ok.

%%%===================================================================
%%% Cases
%%%===================================================================

%% From the host: the node says it is pid 1; perf records its host pid and
%% reads the map in the node's own /tmp, named with its own pid.
perf_from_the_host(Config) ->
    Node = list_to_atom(?config(node, Config)),
    HostPid = ?config(host_pid, Config),
    %% The container as set up: the node is pid 1 in its namespace, its map
    %% is in its own /tmp (the host's /tmp has none).
    ?assertEqual("1", erpc:call(Node, os, getpid, [])),
    ?assertEqual(1, beamdiag_host_pid:ns_pid("/proc", HostPid)),
    ?assert(filelib:is_regular(lists:concat(["/proc/", HostPid, "/root/tmp/perf-1.map"]))),
    ?assertNot(filelib:is_regular("/tmp/perf-1.map")),
    {Code, Out, Err} = beamdiag_test_lib:run_exe(
                         ?config(escript, Config),
                         ["diagnose", ?config(node, Config), "--perf", "--json", "--duration",
                          ?WINDOW],
                         [{"BEAMDIAG_COOKIE", ?config(cookie, Config)}]),
    ct:pal("exit ~b~n~ts", [Code, Err]),
    ?assertEqual(0, Code),
    ?assertEqual(nomatch, string:find(Err, "no profile")),
    J = beamdiag_test_json:decode(Out),
    %% The raw signal: the burner kept a scheduler busy.
    #{<<"busy">> := B, <<"wall">> := W} = maps:get(<<"scheduler">>, maps:get(<<"by_type">>, J)),
    ct:pal("scheduler busy ~.3f of wall time", [B / W]),
    ?assert(B / W > 0.3),
    %% perf ran on the host's pid and named the burner's JIT frame.
    #{<<"perf">> := Perf, <<"top">> := Top} = profile(J),
    ct:pal("perf: ~p~ntop: ~p", [Perf, lists:sublist(Top, 8)]),
    ?assertEqual(#{<<"os_pid">> => HostPid, <<"ns_pid">> => 1, <<"perf_map">> => true},
                 maps:with([<<"os_pid">>, <<"ns_pid">>, <<"perf_map">>], Perf)),
    Names = [N || #{<<"name">> := N} <- Top],
    ?assert(lists:any(fun(N) -> binary:match(N, <<"beamdiag_lab_ledger:burn_loop/1">>) =/= nomatch
                      end, Names)),
    beamdiag_test_lib:agent_gone(Node).

%% Inside the container, as kubectl exec runs a command there (its PID and
%% mount namespaces entered), without the capabilities perf needs: the
%% diagnosis is made, and perf's absence is said with its reasons.
inside_without_perf(Config) ->
    HostPid = integer_to_list(?config(host_pid, Config)),
    {Code, Out, Err} = beamdiag_test_lib:run_exe(
                         os:find_executable("nsenter"),
                         ["--target", HostPid, "--pid", "--mount", "--",
                          "setpriv", "--inh-caps=-all", "--bounding-set=-all", "--",
                          ?config(escript, Config), "diagnose", ?config(node, Config), "--perf",
                          "--duration", ?WINDOW],
                         [{"BEAMDIAG_COOKIE", ?config(cookie, Config)}]),
    ct:pal("exit ~b~n~ts~n~ts", [Code, Err, Out]),
    ?assertEqual(0, Code),
    [?assertMatch({_, _}, binary:match(Out, W)) || W <- [<<"FINDINGS">>, <<"TIME LEDGER">>]],
    [?assertNotEqual(nomatch, string:find(Err, W), W)
     || W <- ["no profile: perf may not profile the target", "perf_event_paranoid",
              "neither CAP_PERFMON nor CAP_SYS_ADMIN", "NIFs", "+JPperf true"]],
    beamdiag_test_lib:agent_gone(list_to_atom(?config(node, Config))).

%%%===================================================================
%%% Helpers
%%%===================================================================

profile(#{<<"profile">> := P}) ->
    P.

short_host() ->
    {ok, H} = inet:gethostname(),
    hd(string:split(H, ".")).
