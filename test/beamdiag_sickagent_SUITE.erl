%%% Sick nodes seen from the agent: a plain NIF holding a scheduler 100 ms
%%% at a time (nif_long) and a flooded mailbox (mailbox_flood), on OTP 25
%%% and 29; the raw signal first (long schedules counted on the node, the
%%% queue's length and growth read from it), then the diagnosis and its
%%% latency from the call. A node whose system monitor is taken keeps it;
%%% one whose slot was free gets it back, also when the agent is killed; a
%%% healthy node gets no new finding.
-module(beamdiag_sickagent_SUITE).
-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0, groups/0, suite/0, init_per_group/2, end_per_group/2, init_per_testcase/2,
         end_per_testcase/2]).
-export([nif_long/1, mailbox_flood/1, sysmon_taken/1, sysmon_taken_nif/1,
         sysmon_back_when_killed/1, healthy/1, first_calls_in_words/1, back_to_back/1,
         cpu_throttling/1]).

%% Diagnoses a case may make when the host spoils one (long_schedule_try/2).
-define(TRIES, 3).
-define(WINDOW, 5).

-spec suite() -> [tuple()].
suite() -> [{timetrap, {minutes, 4}}].

-spec all() -> [term()].
all() ->
    [{group, otp25}, {group, otp29}].

-spec groups() -> [term()].
groups() ->
    [{otp25, [], [nif_long, mailbox_flood, sysmon_taken, sysmon_taken_nif,
                  sysmon_back_when_killed, healthy, first_calls_in_words, back_to_back]},
     {otp29, [], [nif_long, mailbox_flood, sysmon_taken_nif, cpu_throttling]}].

-spec init_per_group(atom(), list()) -> list() | {skip, term()}.
init_per_group(otp25, Config) ->
    [{lab_opts, #{duration => 60}}, {otp, 25} | Config];
init_per_group(otp29, Config) ->
    case beamdiag_test_lib:otp_exec(29) of
        {ok, Exec} -> [{lab_opts, #{duration => 60, exec => Exec}}, {otp, 29} | Config];
        Skip -> Skip
    end.

-spec end_per_group(atom(), list()) -> ok.
end_per_group(_, _) ->
    ok.

-spec init_per_testcase(atom(), list()) -> list().
init_per_testcase(first_calls_in_words, Config) ->
    Config;
init_per_testcase(Case, Config) ->
    Scenario = case Case of
                   sysmon_taken -> idle;
                   sysmon_back_when_killed -> idle;
                   healthy -> idle;
                   back_to_back -> idle;
                   sysmon_taken_nif -> nif_long;
                   _ -> Case
               end,
    %% On OTP 29 the flood is a variation: sixteen producers, a consumer
    %% that computes 100 us a message.
    Opts = case {Case, ?config(otp, Config)} of
               {mailbox_flood, 29} ->
                   (?config(lab_opts, Config))#{params => #{producers => 16,
                                                            work => {busy_us, 100}}};
               _ ->
                   ?config(lab_opts, Config)
           end,
    {ok, Lab} = beamdiag_lab:start(Scenario, Opts),
    [{lab, Lab} | Config].

-spec end_per_testcase(atom(), list()) -> ok.
end_per_testcase(_, Config) ->
    case proplists:get_value(lab, Config) of
        undefined -> ok;
        Lab -> beamdiag_lab:stop(Lab)
    end.

%%% Cases

%% The NIF holds its scheduler: the node's own system monitor counts the
%% long schedules; then the diagnosis names the process and where it was
%% held, advises no scheduler balance flag, and comes within the window
%% plus 2 s of the call.
-spec nif_long(list()) -> term().
nif_long(Config) ->
    Lab = ?config(lab, Config),
    Peer = maps:get(peer, Lab),
    %% Raw signal: long schedules of 50 ms or more over 2 s, counted on the
    %% node by a monitor of the test's own (then freed for the session).
    Events = beamdiag_test_lib:eval(Peer,
        "undefined = erlang:system_monitor(),"
        "Self = self(),"
        "spawn(fun() -> erlang:system_monitor(self(), [{long_schedule, 50}]),"
        "               receive after 2000 -> ok end,"
        "               erlang:system_monitor(undefined),"
        "               {messages, Ms} = erlang:process_info(self(), messages),"
        "               Self ! {sysmon_events, Ms} end),"
        "receive {sysmon_events, Ms} ->"
        "    [{T, In} || {monitor, _, long_schedule, I} <- Ms,"
        "                {timeout, T} <- [lists:keyfind(timeout, 1, I)],"
        "                {in, In} <- [lists:keyfind(in, 1, I)]]"
        "after 10000 -> []"
        "end."),
    ct:pal("long schedules on the node in 2 s: ~b, longest ~p ms", [length(Events),
                                                                   lists:max([0 | [T || {T, _} <- Events]])]),
    ?assert(length(Events) >= 8),
    ?assert(lists:max([T || {T, _} <- Events]) >= 90),
    %% The rule leaves out a long schedule seen in and out of Erlang while
    %% the scheduler threads waited for a CPU a quarter of the window or
    %% more (the OS, not the code, may have stretched it): a try without
    %% the finding is measured again on that fact, read by the test.
    {D, Took, L} = long_schedule_try(Lab, ?TRIES),
    #{findings := F, capture := C} = D,
    #{long_schedules := LS} = maps:get(extras, C),
    ?assertEqual(watching, maps:get(state, LS)),
    M = maps:get(metrics, L),
    %% The process and the function: the NIF's caller (the runtime records
    %% the Erlang function that called the NIF), and the NIF library.
    ?assertEqual(<<"beamdiag_lab_sick:call_loop/3">>, maps:get(function, M)),
    ?assert(maps:get(count, M) >= 10),
    ?assert(maps:get(longest_ms, M) >= 90),
    Ev = iolist_to_binary(lists:join("\n", maps:get(evidence, L))),
    ?assertMatch({_, _}, binary:match(Ev, <<"beamdiag_lab_nif: spin/1">>)),
    %% The NIF's caller, spawned from a fun that tail-called its loop, is
    %% named by its spawner, as the walks name processes.
    ?assertMatch({match, _}, re:run(Ev, "<[0-9.]+> \\(erlang:apply/2, spawned by <[0-9.]+>\\)"), Ev),
    ?assertMatch({_, _}, binary:match(maps:get(fix, L), <<"ERL_NIF_DIRTY_JOB_CPU_BOUND">>)),
    ?assertMatch({_, _}, binary:match(maps:get(fix, L), <<"enif_schedule_nif">>)),
    %% No scheduler balance flag advised anywhere.
    ?assertEqual([], [X || X = #{id := scheduler_imbalance} <- F]),
    Fixes = iolist_to_binary([maps:get(fix, X) || X <- F, maps:get(id, X) =/= long_schedule]),
    ?assertEqual([], [Flag || Flag <- [<<"+scl">>, <<"+sub">>, <<"+sbt">>],
                              binary:match(Fixes, Flag) =/= nomatch]),
    on_time(Took),
    %% The system monitor is free again.
    ?assertEqual(undefined, erpc:call(beamdiag_lab:node(Lab), erlang, system_monitor, [])).

%% Eight producers flood one consumer: the queue read from the node grows
%% by more than 100,000 messages a second; then the diagnosis names the
%% consumer with its growth, the memory it holds (estimated) and the time
%% to memory exhaustion, and the process data is in the JSON even when the
%% capture is partial.
-spec mailbox_flood(list()) -> term().
mailbox_flood(Config) ->
    Lab = ?config(lab, Config),
    Node = beamdiag_lab:node(Lab),
    Peer = maps:get(peer, Lab),
    Len = "{message_queue_len, Q} = erlang:process_info(whereis(beamdiag_lab_flooded), "
          "message_queue_len), Q.",
    T0 = erlang:monotonic_time(millisecond),
    Q0 = beamdiag_test_lib:eval(Peer, Len),
    timer:sleep(500),
    Q1 = beamdiag_test_lib:eval(Peer, Len),
    %% Over the time measured, the reads' own included.
    Ms = erlang:monotonic_time(millisecond) - T0,
    Rate = round((Q1 - Q0) * 1000 / Ms),
    ct:pal("queue ~b -> ~b in ~b ms: ~b messages/s", [Q0, Q1, Ms, Rate]),
    ?assert(Rate > 100000),
    {D, Took} = timed_diagnose(Lab),
    #{findings := F, capture := C} = D,
    ct:pal("findings ~p; took ~b ms; complete ~p; notes ~p",
           [[{Id, S} || #{id := Id, severity := S} <- F], Took, maps:get(complete, C),
            maps:get(notes, C)]),
    Procs = maps:get(procs, maps:get(extras, C)),
    [Flooded | _] = [E || E = #{name := <<"beamdiag_lab_flooded">>} <- maps:get(queues, Procs)],
    ct:log("flooded ~p", [Flooded]),
    ?assert(maps:get(memory_estimated, Flooded)),
    [G] = [X || X = #{id := message_queue_growth} <- F],
    M = maps:get(metrics, G),
    ?assertEqual(<<"beamdiag_lab_flooded">>, maps:get(name, M)),
    ?assert(maps:get(queue_rate, M) > 50000),
    ?assert(maps:get(memory_estimated, M)),
    ?assert(is_integer(maps:get(seconds_to_exhaustion, M))),
    Ev = iolist_to_binary(lists:join("\n", maps:get(evidence, G))),
    ct:log("~ts", [Ev]),
    ?assertMatch({_, _}, binary:match(Ev, <<"runs out of memory in ~">>)),
    ?assertMatch({_, _}, binary:match(Ev, <<"estimated">>)),
    Text = beamdiag_format_text:diagnosis(D, #{}),
    ct:log("~ts", [Text]),
    ?assertMatch({_, _}, binary:match(Text, <<"beamdiag_lab_flooded">>)),
    Json = iolist_to_binary(beamdiag_format_json:diagnosis(D)),
    ?assertMatch({_, _}, binary:match(Json, <<"\"processes\":{">>)),
    on_time(Took),
    %% A report cut short returns at once; the agent puts the monitor back
    %% as it ends, within seconds.
    ok = beamdiag_test_lib:wait_until(
           fun() -> erpc:call(Node, erlang, system_monitor, [], 2000) =:= undefined end, 5000),
    ?assertEqual(undefined, erpc:call(Node, erlang, system_monitor, [])).

%% A process of the lab node's own takes its system monitor, as RabbitMQ's
%% sysmon handler does (it ends on `stop'): the holder and the monitor's
%% setting, checked to be the holder's.
take_sysmon(Peer) ->
    Holder = beamdiag_test_lib:eval(Peer,
        "P = spawn(fun() -> erlang:system_monitor(self(), [{long_gc, 500}, busy_port]),"
        "                   receive stop -> ok end end), P."),
    %% Once the holder has run: its monitor.
    ok = beamdiag_test_lib:await(
           fun() -> case beamdiag_test_lib:eval(Peer, "erlang:system_monitor().") of
                        {Holder, _} -> true;
                        _ -> false
                    end
           end,
           10000),
    Before = beamdiag_test_lib:eval(Peer, "erlang:system_monitor()."),
    ?assertMatch({Holder, _}, Before),
    {Holder, Before}.

%% A node whose system monitor is taken (by a process of its own, as
%% RabbitMQ's sysmon handler does) keeps it, and the report says so.
-spec sysmon_taken(list()) -> term().
sysmon_taken(Config) ->
    Lab = ?config(lab, Config),
    Peer = maps:get(peer, Lab),
    {Holder, Before} = take_sysmon(Peer),
    #{capture := C} = element(1, timed_diagnose(Lab)),
    After = beamdiag_test_lib:eval(Peer, "erlang:system_monitor()."),
    ct:pal("before ~p after ~p; notes ~p", [Before, After, maps:get(notes, C)]),
    ?assertEqual(Before, After),
    #{long_schedules := LS} = maps:get(extras, C),
    ?assertEqual(taken, maps:get(state, LS)),
    ?assert(lists:any(fun(N) -> binary:match(N, <<"system monitor is taken">>) =/= nomatch end,
                      maps:get(notes, C))),
    Holder ! stop.

%% The NIF of nif_long on a node whose system monitor is taken: the slot
%% is left alone and the sampler stands in. Raw signal first: the holder
%% is the node's own process, and the NIF's caller, asked for its current
%% function from each scheduler in turn, answers 50 ms late or more at
%% least once (inside a plain NIF it handles no signal; its status at the
%% answer is that of its next receive, so the wait is the signal). Then
%% the diagnosis: a long_schedule finding from the sampler naming the
%% process, its function and the NIF library, no balance flag advised,
%% and the monitor the same after.
-spec sysmon_taken_nif(list()) -> term().
sysmon_taken_nif(Config) ->
    Lab = ?config(lab, Config),
    Peer = maps:get(peer, Lab),
    {Holder, Before} = take_sysmon(Peer),
    {Caller, Waits} = beamdiag_test_lib:eval(Peer,
        "[Nif] = [P || P <- erlang:processes(),"
        "              erlang:process_info(P, current_function)"
        "                  =:= {current_function, {beamdiag_lab_sick, call_loop, 3}}],"
        "Self = self(),"
        "Ask = fun A(0, Acc) -> Acc;"
        "          A(N, Acc) ->"
        "              receive after 40 + rand:uniform(40) -> ok end,"
        "              T0 = erlang:monotonic_time(millisecond),"
        "              {current_function, F} = erlang:process_info(Nif, current_function),"
        "              A(N - 1, [{erlang:monotonic_time(millisecond) - T0, F} | Acc])"
        "      end,"
        "Ps = [spawn_opt(fun() -> Self ! {self(), Ask(20, [])} end,"
        "                [{scheduler, K}, {priority, high}])"
        "      || K <- lists:seq(1, erlang:system_info(schedulers_online))],"
        "{pid_to_list(Nif), lists:append([receive {P, W} -> W after 20000 -> [] end || P <- Ps])}."),
    Late = [W || {W, {beamdiag_lab_sick, call_loop, 3}} <- Waits, W >= 50],
    ct:pal("the NIF's caller ~s answered ~b of ~b asks 50 ms late or more (longest ~b ms)",
           [Caller, length(Late), length(Waits), lists:max([0 | [W || {W, _} <- Waits]])]),
    ?assert(length(Late) >= 1),
    %% As in nif_long: a hold in and out of Erlang is left out while the
    %% scheduler threads waited for a CPU a quarter of the window or more.
    {D, _Took, L} = long_schedule_try(Lab, ?TRIES),
    #{findings := F, capture := C} = D,
    After = beamdiag_test_lib:eval(Peer, "erlang:system_monitor()."),
    #{long_schedules := LS} = maps:get(extras, C),
    ?assertEqual(Before, After),
    ?assertEqual(taken, maps:get(state, LS)),
    ?assertEqual(sampler, maps:get(source, LS)),
    ?assert(lists:any(fun(N) -> binary:match(N, <<"system monitor is taken by">>) =/= nomatch end,
                      maps:get(notes, C))),
    M = maps:get(metrics, L),
    %% (The pid as the node writes it.)
    ?assertEqual(list_to_binary(Caller), maps:get(pid, M)),
    ?assertEqual(<<"beamdiag_lab_sick:call_loop/3">>, maps:get(function, M)),
    ?assertEqual(<<"sampler">>, maps:get(source, M)),
    ?assert(maps:get(count, M) >= 3),
    ?assert(maps:get(longest_ms, M) >= 50),
    Ev = iolist_to_binary(lists:join("\n", maps:get(evidence, L))),
    ?assertMatch({_, _}, binary:match(Ev, <<"beamdiag_lab_nif: spin/1">>)),
    ?assertMatch({_, _}, binary:match(Ev, <<"estimates from the samples' spacing">>)),
    ?assertEqual([], [X || X = #{id := scheduler_imbalance} <- F]),
    Fixes = iolist_to_binary([maps:get(fix, X) || X <- F, maps:get(id, X) =/= long_schedule]),
    ?assertEqual([], [Flag || Flag <- [<<"+scl">>, <<"+sub">>, <<"+sbt">>],
                              binary:match(Fixes, Flag) =/= nomatch]),
    %% Nothing of the session is left on the node.
    beamdiag_test_lib:agent_gone(Lab),
    ?assertEqual(Before, beamdiag_test_lib:eval(Peer, "erlang:system_monitor().")),
    Holder ! stop.

%% The agent killed outright mid-window: its watcher frees the system
%% monitor it took and its helper puts msacc back.
-spec sysmon_back_when_killed(list()) -> term().
sysmon_back_when_killed(Config) ->
    Lab = ?config(lab, Config),
    Node = beamdiag_lab:node(Lab),
    erlang:set_cookie(Node, beamdiag_lab:cookie(Lab)),
    true = net_kernel:connect_node(Node),
    {ok, Loaded} = beamdiag_loader:load(Node, beamdiag_agent:modules()),
    ?assertEqual(undefined, erpc:call(Node, erlang, system_monitor, [])),
    {ok, Agent, Ref} = erpc:call(Node, beamdiag_agent, start,
                                 [self(), #{duration_ms => 20000, interval_ms => 1000}]),
    receive {beamdiag, Ref, {tick, _}} -> ok after 10000 -> ct:fail(no_tick) end,
    Taken = erpc:call(Node, erlang, system_monitor, []),
    ct:pal("during the session: ~p", [Taken]),
    ?assertMatch({_, [_ | _]}, Taken),
    exit(Agent, kill),
    %% Both are put back within 500 ms: the system monitor free and the
    %% msacc counters still (read without touching the flag), then the
    %% flag itself.
    ok = beamdiag_test_lib:wait_until(
           fun() ->
               erpc:call(Node, erlang, system_monitor, []) =:= undefined andalso
                   not beamdiag_test_lib:msacc_on(Node)
           end, 500),
    ?assertEqual(undefined, erpc:call(Node, erlang, system_monitor, [])),
    ?assertNot(erpc:call(Node, erlang, system_flag, [microstate_accounting, false])),
    beamdiag_loader:unload(Node, Loaded).

%% An idle node: no long schedule, no mailbox finding.
-spec healthy(list()) -> term().
healthy(Config) ->
    {#{findings := F, capture := C}, _} = timed_diagnose(?config(lab, Config)),
    ct:pal("findings ~p; long schedules ~p",
           [[Id || #{id := Id} <- F], maps:get(long_schedules, maps:get(extras, C), none)]),
    ?assertEqual([], [Id || #{id := Id} <- F,
                            lists:member(Id, [long_schedule, message_queue_growth])]).

%% The first calls' errors are sentences, with the waits they tried.
-spec first_calls_in_words(list()) -> term().
first_calls_in_words(_Config) ->
    Rel = iolist_to_binary(beamdiag_loader:format_error(
                             {target_facts, 'n@h', {timeout, [2000, 3000]}})),
    ?assertEqual(<<"n@h did not answer the release read within 2.0 s and 3.0 s (tried twice): "
                   "it is overloaded or a scheduler is held (a NIF that does not yield); run "
                   "beamdiag on its host for a host-side view">>, Rel),
    Start = iolist_to_binary(beamdiag_collect:format_error(
                               {agent_start, 'n@h', {timeout, [2500, 2500]}})),
    ?assertMatch({_, _}, binary:match(Start, <<"did not start the agent within 2.5 s and 2.5 s">>)),
    %% A node that is not there: no raw term.
    {error, {M, R}} = beamdiag_loader:load('nobody@127.0.0.1', [beamdiag_agent]),
    Text = iolist_to_binary(M:format_error(R)),
    ct:pal("~ts", [Text]),
    ?assertEqual(nomatch, binary:match(Text, <<"{">>)).

%% Two sessions back to back, the first one's agent slow to remove its
%% modules (held, as a throttled node holds it, between its last tick and
%% its delete): the second session does not reuse the modules the first
%% is about to delete; it waits for them to go, loads its own, and
%% finishes its window with every sample (the report is not cut at the
%% window's end plus the slack here: the window must run whole).
-spec back_to_back(list()) -> term().
back_to_back(Config) ->
    Lab = ?config(lab, Config),
    Node = beamdiag_lab:node(Lab),
    Cookie = beamdiag_lab:cookie(Lab),
    {ok, Node} = beamdiag_remote:connect(atom_to_list(Node), #{cookie => Cookie}),
    %% The first session reports to a relay on the node, which suspends
    %% its agent as soon as it has sent its last tick, before its last
    %% word and its delete, and lets it go on when told.
    {ok, Loaded} = beamdiag_loader:load(Node, beamdiag_agent:modules()),
    ?assertEqual(lists:sort(beamdiag_agent:modules()), lists:sort(Loaded)),
    {ok, Tokens, _} = erl_scan:string(
        "spawn_opt(fun() ->"
        "    Loop = fun L(Agent) ->"
        "               receive"
        "                   {beamdiag, _, {start, #{agent := A}}} = M -> Test ! M, L(A);"
        "                   {beamdiag, _, finishing} = M ->"
        "                       erlang:suspend_process(Agent), Test ! M, L(Agent);"
        "                   resume -> erlang:resume_process(Agent), L(Agent);"
        "                   stop -> ok;"
        "                   M -> Test ! M, L(Agent)"
        "               end"
        "           end,"
        "    Loop(undefined)"
        "end, [{priority, high}])."),
    {ok, Exprs} = erl_parse:parse_exprs(Tokens),
    {value, Relay, _} = erpc:call(Node, erl_eval, exprs, [Exprs, [{'Test', self()}]]),
    Cpu0 = beamdiag_test_lib:host_cpu(),
    {ok, Agent1, Ref} = erpc:call(Node, beamdiag_agent, start,
                                  [Relay, #{duration_ms => 2000, interval_ms => 500,
                                            unload => Loaded}]),
    last_tick(Ref, Cpu0),
    ?assert(is_process_alive_on(Node, Agent1)),
    %% The second session, while the first agent still holds its modules.
    Self = self(),
    T0 = erlang:monotonic_time(millisecond),
    1 = erlang:trace_pattern({beamdiag_loader, settled, 3}, true, [call_count]),
    Second = spawn(fun() ->
        Self ! {second, catch beamdiag:diagnose(Node, #{cookie => Cookie, duration => 3,
                                                          slack => infinity})}
    end),
    %% The second session waits for the first agent's modules to go: its
    %% loader has looked more than once.
    ok = beamdiag_test_lib:await(fun() -> settle_looks() >= 2 end, 10000),
    %% The first agent goes on: its last word, then its delete and purge.
    Relay ! resume,
    receive {beamdiag, Ref, {done, _}} -> ok after 20000 -> ct:fail(first_not_done) end,
    Relay ! stop,
    R = receive {second, X} -> X after 30000 -> exit(Second, kill), ct:fail(second_hung) end,
    _ = erlang:trace_pattern({beamdiag_loader, settled, 3}, false, [call_count]),
    Took = erlang:monotonic_time(millisecond) - T0,
    ct:pal("second session: ~ts in ~b ms",
           [case R of
                {ok, #{capture := C0}} -> io_lib:format("complete ~p, ~b samples, notes ~p",
                                                        [maps:get(complete, C0),
                                                         length(maps:get(samples, C0)),
                                                         maps:get(notes, C0)]);
                _ -> io_lib:format("~0p", [R])
            end, Took]),
    ?assertMatch({ok, #{capture := #{complete := true}}}, R),
    {ok, #{capture := C}} = R,
    ?assert(length(maps:get(samples, C)) >= 4),
    beamdiag_test_lib:agent_gone(Lab).

%%% Helpers

%% A diagnosis and its long_schedule finding, with the node's scheduler
%% threads read by the test from /proc around it. Without the finding,
%% while those threads waited for a CPU a quarter of the window or more
%% (the rule leaves a hold out then), or while the host's CPUs were 0.85
%% busy or more (/proc/stat), the try is recorded and made again, Tries in
%% all; after the last, a starved skip if those threads waited a quarter
%% of the window, else a failure that says what the long-schedule watch
%% saw.
long_schedule_try(Lab, Tries) ->
    {Cpu0, Sched0} = {beamdiag_test_lib:host_cpu(), beamdiag_test_lib:sched_stat(maps:get(os_pid, Lab))},
    {D, Took} = timed_diagnose(Lab),
    #{runq := Runq} = Sched = beamdiag_test_lib:sched_wait_since(Sched0),
    Host = beamdiag_test_lib:host_busy_since(Cpu0),
    #{findings := F, capture := C} = D,
    #{long_schedules := LS} = maps:get(extras, C),
    ct:pal("findings ~p; took ~b ms; complete ~p; notes ~p~nscheduler threads (test's /proc): "
           "~p; host ~.2f busy~nlong schedules ~P",
           [[{Id, S} || #{id := Id, severity := S} <- F], Took, maps:get(complete, C),
            maps:get(notes, C), Sched, Host, maps:without([events], LS), 60]),
    case [X || X = #{id := long_schedule} <- F] of
        [X] ->
            {D, Took, X};
        [] when Runq >= 0.25, Tries > 1 ->
            beamdiag_test_lib:retried("no long_schedule finding: the scheduler threads waited for a CPU ~.2f of "
                    "the window (0.25 or more, read from /proc)", [Runq]),
            long_schedule_try(Lab, Tries - 1);
        %% On a host with no CPU to spare the sampler that stands in for
        %% a taken system monitor looks less often than it asks to (seen
        %% on OTP 29 at 2.00 of 2 CPUs busy: 3 walks in 5 s, no
        %% candidate): measured again; the last try is judged as above.
        [] when Tries > 1 ->
            case beamdiag_test_lib:retry_on_loaded_host(
                   Cpu0, "no long_schedule finding: the scheduler threads waited for a CPU ~.2f",
                   [Runq]) of
                true -> long_schedule_try(Lab, Tries - 1);
                false -> no_long_schedule(Runq, LS)
            end;
        [] ->
            no_long_schedule(Runq, LS)
    end.

%% No long_schedule finding after the last try: a starved skip when the
%% test's own reading shows the scheduler threads waiting for a CPU a
%% quarter of the window or more, else a failure that says what the
%% long-schedule watch saw (its state, source, the sampler's counts and
%% the processes it found, bounded).
no_long_schedule(Runq, LS) ->
    case Runq >= 0.25 of
        true ->
            beamdiag_test_lib:starved("no long_schedule finding: the scheduler threads waited "
                                      "for a CPU ~.2f of the window (0.25 or more, read from "
                                      "/proc)", [Runq]);
        false ->
            %% What the rule weighed first (a failure's first line is what
            %% a CI run shows): each process's kind of hold, count, total
            %% and function, over the watch's span.
            Ps = [{maps:get(native, P), maps:get(count, P), maps:get(total_ms, P), maps:get(in, P)}
                  || P <- lists:sublist(maps:get(processes, LS, []), 3)],
            ct:fail("no long_schedule finding: schedulers waited for a CPU ~.2f; watch ~p ~p over "
                    "~b ms: ~0p; the watch saw: ~P",
                    [Runq, maps:get(state, LS), maps:get(source, LS, events),
                     maps:get(span_ms, LS, 0), Ps, maps:without([events], LS), 40])
    end.

%% The first session's last tick (`finishing'). An agent that ran out of
%% time instead (its last tick past its hard deadline) ends without it:
%% on a host whose CPUs were 0.95 busy or more since Cpu0, measured here,
%% that is a counted starved skip; on a host with CPU to spare it fails,
%% with what the agent sent.
last_tick(Ref, Cpu0) ->
    receive
        {beamdiag, Ref, finishing} ->
            ok;
        {beamdiag, Ref, {End, _} = Other} when End =:= aborted; End =:= partial_extras;
                                                 End =:= done ->
            Busy = beamdiag_test_lib:host_busy_since(Cpu0),
            Got = lists:flatten(io_lib:format("~0P", [Other, 12])),
            case Busy >= 0.95 of
                true ->
                    beamdiag_test_lib:starved("the first agent ended without its last tick "
                                              "(~ts); the host's CPUs ~.2f busy", [Got, Busy]);
                false ->
                    ct:fail({no_last_tick, Got, {host_busy, Busy}})
            end
    after 20000 ->
        ct:fail({no_last_tick, nothing_in_20_s,
                 {host_busy, beamdiag_test_lib:host_busy_since(Cpu0)}})
    end.

%% How many times a session's loader has looked whether an ending agent's
%% modules are gone (beamdiag_loader:settled/3, counted on this node).
settle_looks() ->
    case erlang:trace_info({beamdiag_loader, settled, 3}, call_count) of
        {call_count, N} when is_integer(N) -> N;
        {call_count, false} -> 0
    end.

is_process_alive_on(Node, Pid) ->
    erpc:call(Node, erlang, is_process_alive, [Pid]).

%% A CPU-bound node under a 0.2-CPU quota (the lab's cgroup; OTP 25's is
%% checked by beamdiag_lab_SUITE): the raw signal first, the cgroup's own
%% counters say most periods over 2 s were throttled; then the diagnosis
%% names the throttling, on time.
-spec cpu_throttling(list()) -> term().
cpu_throttling(Config) ->
    Lab = ?config(lab, Config),
    Dir = maps:get(cgroup, Lab),
    {P0, T0} = throttled(Dir),
    timer:sleep(2000),
    {P1, T1} = throttled(Dir),
    ct:pal("cgroup over 2 s: ~b periods, ~b throttled", [P1 - P0, T1 - T0]),
    ?assert(P1 - P0 >= 10),
    ?assert((T1 - T0) / (P1 - P0) > 0.5),
    {D, Took} = timed_diagnose(Lab),
    #{findings := F, ledger := L} = D,
    ct:pal("findings ~p; took ~b ms; host-only ~p; cgroup ~p",
           [[{Id, S} || #{id := Id, severity := S} <- F], Took, maps:get(host_only, D, false),
            maps:get(cgroup, L)]),
    ?assert(lists:member(cpu_throttling, [Id || #{id := Id, severity := S} <- F,
                                                S =:= critical orelse S =:= warning])),
    on_time(Took).

%% The cgroup's periods and throttled periods (cpu.stat, v1 and v2 alike).
throttled(Dir) ->
    {ok, B} = file:read_file(filename:join(Dir, "cpu.stat")),
    Kv = [list_to_tuple(binary:split(Line, <<" ">>)) || Line <- binary:split(B, <<"\n">>, [global]),
                                                       Line =/= <<>>],
    {binary_to_integer(proplists:get_value(<<"nr_periods">>, Kv)),
     binary_to_integer(proplists:get_value(<<"nr_throttled">>, Kv))}.

timed_diagnose(Lab) ->
    T0 = erlang:monotonic_time(millisecond),
    {ok, D} = beamdiag:diagnose(beamdiag_lab:node(Lab), #{cookie => beamdiag_lab:cookie(Lab),
                                                          duration => ?WINDOW}),
    {D, erlang:monotonic_time(millisecond) - T0}.

on_time(Took) ->
    beamdiag_test_lib:on_time(Took, ?WINDOW).
