%%% @doc A diagnosis from the host alone: the window of a node on this host
%%% read from /proc, the cgroup files and perf, without asking the node.
%%%
%%% Two ways in. `diagnose/2' on request (an OS pid, or a node with no
%%% distribution or whose cookie the operator does not have): the host
%%% sampler and, when perf is usable, perf on the whole OS process run
%%% for the window; perf's samples of the threads found hot are kept.
%%% `start/2', `arm/1' then `finish/2' for `beamdiag:diagnose/2': the
%%% sampler starts with the call, while the node is being connected to;
%%% when the node has not answered in the answer time, `arm/1' starts perf
%%% on the hot threads for the rest of the window; if it still has not
%%% answered at the window's end, `finish/2' builds the diagnosis from the
%%% host view alone.
%%% `cancel/1' drops the view when the node answered.
%%%
%%% ```
%%% 1> {ok, D} = beamdiag_host_session:diagnose("4242", #{duration => 6}).
%%% 2> [Id || #{id := Id} <- maps:get(findings, D)].
%%% [scheduler_held_native]
%%% '''
-module(beamdiag_host_session).

-export([diagnose/2, start/2, arm/1, arm/2, armed/1, finish/2, unreached/2, finish_late/2, explains_slowness/1,
         keep_in_reserve/1, perf_done/2, with_held_perf/2, cancel/1, format_error/1]).
%% Called as Module:format_error/1 on an {error, {Module, Reason}} value.
-ignore_xref([{format_error, 1}]).

-export_type([handle/0, options/0, context/0]).

%% The options of diagnose/2 and start/2.
-type options() :: #{
    duration => number(),
    interval => pos_integer(),
    perf => boolean(),
    progress => fun((non_neg_integer(), pos_integer()) -> term()) | undefined,
    ready_by => integer() | infinity,
    proc_root => file:filename(),
    node => iodata()
}.
%% What the session says when it finishes the window from the host
%% (finish/2, unreached/2, finish_late/2): how long the node was given, what
%% distribution saw, how the node was to be reached (shown as it is), why
%% the agent was late, what the agent sent and what else the session read
%% (the capture's extras: the lock data).
-type context() :: #{
    waited_ms => integer(),
    distribution => binary(),
    attach => beamdiag_attach_plan:public() | #{},
    why => binary(),
    agent => #{info := term(), extras := map()},
    extras => map()
}.

-opaque handle() :: #{
    sampler := pid(),
    os_pid := pos_integer(),
    located := beamdiag_host_locate:located(),
    node := binary(),
    t0 := integer(),
    duration_ms := pos_integer(),
    interval_ms := pos_integer(),
    ready_by := integer() | infinity,
    perf := boolean(),
    proc_root := file:filename(),
    progress := fun((non_neg_integer(), pos_integer()) -> term()) | undefined,
    whole_perf => {pid(), reference(), file:filename()},
    %% The threads perf runs on (none: the whole process).
    perf_tids => [integer()],
    perf_names => [binary()],
    %% Why perf did not run, when it did not.
    perf_skipped => binary(),
    %% perf's result, once its message came (`perf_done/2').
    perf_result => {ok, binary(), [integer()]} | {error, binary()}
}.

-define(PERF_HZ, 199).
-define(PERF_OFF, <<"turned off for this diagnosis (--no-perf)">>).
%% Time kept after perf and the analysis for the report itself.
-define(REPORT_MS, 300).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The host-only diagnosis of a node on this host, given as an OS pid
%% (integer or digits) or a node name: the window sampled from the host.
%% Options: `duration' (seconds, 10), `interval' (ms between samples,
%% 1000), `perf' (true: perf samples the node when it can), `progress',
%% `ready_by' (monotonic ms by which the report is due), `proc_root'.
-spec diagnose(string() | binary() | integer(), options()) ->
    {ok, beamdiag_diagnosis:diagnosis()} | {error, {module(), term()}}.
diagnose(Target, Opts) ->
    Root = maps:get(proc_root, Opts, "/proc"),
    case beamdiag_host_locate:locate(Target, #{proc_root => Root}) of
        {ok, Located} ->
            H = start(Located, Opts#{node => node_name(Target, Located)}),
            Secs = perf_seconds(maps:get(duration_ms, H)),
            H2 = case {maps:get(perf, H), Secs >= 1} of
                     {true, true} -> H#{whole_perf => perf(maps:get(os_pid, H), [], Secs)};
                     {false, _} -> H#{perf_skipped => ?PERF_OFF};
                     {true, false} -> H#{perf_skipped => <<"the window is too short for it">>}
                 end,
            {ok, window(H2, #{unresponsive => false, reason => requested})};
        {error, _} = E ->
            E
    end.

%% @doc Starts the host view of a located node now. Options as
%% `diagnose/2', and `node' (its name, for the report).
-spec start(beamdiag_host_locate:located(), options()) -> handle().
start(Located = #{os_pid := OsPid}, Opts) ->
    Interval = maps:get(interval, Opts, 1000),
    Root = maps:get(proc_root, Opts, "/proc"),
    T0 = erlang:monotonic_time(millisecond),
    #{
        sampler => beamdiag_host_view:start(OsPid, #{interval_ms => Interval, proc_root => Root}),
        os_pid => OsPid,
        located => Located,
        node => iolist_to_binary(maps:get(node, Opts, integer_to_list(OsPid))),
        t0 => T0,
        duration_ms => max(1, round(maps:get(duration, Opts, 10) * 1000)),
        interval_ms => Interval,
        ready_by => maps:get(ready_by, Opts, infinity),
        perf => maps:get(perf, Opts, true) =/= false,
        proc_root => Root,
        progress => maps:get(progress, Opts, undefined)
    }.

%% @doc The node has not answered yet: when perf is usable, it starts
%% sampling the scheduler threads found hot for the rest of the window, so
%% that a host-only diagnosis at the window's end can name their native
%% code. The node may still answer: then `cancel/1'.
-spec arm(handle()) -> handle().
arm(H) ->
    arm(H, #{}).

%% @doc As `arm/1'; `max_seconds' caps perf's run (a node that answers
%% needs a second or two of the held thread to name its native code, not
%% the rest of the window).
-spec arm(handle(), #{max_seconds => pos_integer()}) -> handle().
arm(H = #{whole_perf := _}, _Opts) ->
    H;
arm(H = #{perf := false}, _Opts) ->
    H#{perf_skipped => ?PERF_OFF};
arm(H = #{sampler := S, os_pid := OsPid, t0 := T0, duration_ms := D}, Opts) ->
    Secs = min(maps:get(max_seconds, Opts, beamdiag_opts:max_seconds(window)),
               perf_seconds(T0 + D - erlang:monotonic_time(millisecond))),
    case Secs >= 1 of
        true ->
            Samples = beamdiag_host_view:snapshot(S),
            Ledger = beamdiag_ledger:build(capture(H, Samples, none)),
            Hot0 = beamdiag_host_rules:hot_threads(Ledger),
            case [{Tid, Name} || #{tid := Tid, name := Name} <- Hot0] of
                [] -> H#{perf_skipped => <<"no scheduler thread looked held while there was "
                                           "time left in the window to profile it">>};
                Hot -> (maps:remove(perf_skipped, H))#{
                           whole_perf => perf(OsPid, [T || {T, _} <- Hot], Secs),
                           perf_tids => [T || {T, _} <- Hot],
                           perf_names => [N || {_, N} <- Hot]}
            end;
        false ->
            H#{perf_skipped => maps:get(perf_skipped, H, <<"too little of the window was left">>)}
    end.

%% @doc Whether perf runs (`arm/1' found held threads).
-spec armed(handle()) -> boolean().
armed(H) ->
    maps:is_key(whole_perf, H).

%% @doc Finishes the window from the host view alone: the node did not
%% answer. Context: `waited_ms' (how long it was given), `distribution'
%% (what the distribution layer saw, in words), `extras' (what the session
%% read besides, for the capture's extras: the lock data). perf samples the hot
%% threads for what is left of the window, unless `arm/1' started it.
-spec finish(handle(), context()) -> beamdiag_diagnosis:diagnosis().
finish(H, Context) ->
    window(arm(H), Context#{unresponsive => true, reason => unresponsive}).

%% @doc Finishes the window from the host view alone: the node runs but
%% could not be reached over distribution (a wrong cookie, TLS refused,
%% its port closed...), which says nothing of how it answers. Context:
%% `waited_ms', `distribution' (why, in words), `attach' (what was
%% resolved of how to reach it). perf samples the hot threads for what is
%% left of the window.
-spec unreached(handle(), context()) -> beamdiag_diagnosis:diagnosis().
unreached(H, Context) ->
    window(arm(H), Context#{unresponsive => false, reason => unreachable}).

%% @doc Finishes the window from the host view alone: the node answered,
%% but its agent could not make the report on time (its samples came too
%% slowly, or a previous session's agent was still leaving). Context:
%% `why' (that, in words, for the report's top line), `waited_ms', `agent'
%% (what the agent sent, if anything: `#{info, extras}'), `extras' (as for
%% `finish/2'). perf runs only if
%% `arm/1' started it.
-spec finish_late(handle(), context()) -> beamdiag_diagnosis:diagnosis().
finish_late(H, Context) ->
    window(H, Context#{reason => slow}).

%% @doc Whether the host view alone explains the node's slowness, so that
%% a report made from it now (`finish_late/2') names the cause: its OS process is
%% stopped or gone, or the host's rules find something at warning or
%% above (a cgroup quota that throttles it, the kernel taking its time, a
%% scheduler thread perf showed held in native code, dirty IO schedulers
%% blocked in the kernel). Takes one sample now (a few milliseconds).
-spec explains_slowness(handle()) -> boolean().
explains_slowness(H = #{sampler := S, os_pid := OsPid, proc_root := Root}) ->
    case process_state(Root, OsPid) of
        State when State =:= stopped; State =:= zombie; State =:= gone ->
            true;
        _ ->
            Capture = capture(H, beamdiag_host_view:snapshot(S), none),
            Perf = maps:get(held_perf, beamdiag_host_view:told(S), none),
            #{findings := F} = beamdiag_host_rules:analyse(Capture, #{perf => Perf}),
            lists:any(fun(Finding) -> beamdiag_finding:at_least(Finding, warning) end, F)
    end.

%% @doc The node answered: the view is kept in reserve for `finish_late/2',
%% without samples in between (its first and the one `finish_late/2' takes make
%% its window); perf, if armed, goes on.
-spec keep_in_reserve(handle()) -> ok.
keep_in_reserve(#{sampler := S}) ->
    beamdiag_host_view:pause(S).

%% @doc The node answered and its agent made the capture: when perf ran
%% on scheduler threads the host view found held (`arm/2'), its samples
%% of those threads join the capture with the host view's figures of the
%% node's scheduler threads over the window (`extras.held_perf': threads,
%% window, and perf's top symbols or why perf could not name them), so
%% that the analysis (`beamdiag_host_rules:held_findings/1') names the
%% native code; perf is waited for until the report is due. The view is
%% dropped. Without perf, the capture as it is. The capture is analysed
%% once, after this (beamdiag_diagnose).
-spec with_held_perf(handle(), beamdiag_capture:capture()) -> beamdiag_capture:capture().
with_held_perf(H = #{whole_perf := _, sampler := S}, C) ->
    Tids = maps:get(perf_tids, H, []),
    Perf = case perf_result(H) of
               {ok, Script, _} -> {ok, beamdiag_host_rules:perf_top(Script, Tids)};
               {error, Why} -> {error, Why}
           end,
    Ledger = beamdiag_ledger:build(capture(H, beamdiag_host_view:stop(S), none)),
    ok = cancel(maps:remove(whole_perf, H)),
    Held = #{tids => Tids, perf => Perf, window_s => maps:get(window_s, Ledger, 0.0),
             threads => [maps:with([tid, name, type, on_cpu, runq, user, nvcsw], R)
                         || R = #{type := scheduler} <- maps:get(threads, Ledger, [])]},
    Extras = maps:get(extras, C, #{}),
    %% A word on what perf saw when it names no NIF holding the threads.
    Notes = maps:get(notes, C, []) ++
        case beamdiag_host_rules:held_findings(Held) of
            [] -> held_note(Perf, maps:get(perf_names, H, []));
            _ -> []
        end,
    C#{extras => Extras#{held_perf => Held}, notes => Notes};
with_held_perf(H, C) ->
    ok = cancel(H),
    C.

%% What perf said of the threads that looked held, when no
%% `scheduler_held_native' is made of it.
held_note({ok, #{samples := N, top := [#{symbol := Sym, dso := Dso, share := Sh} | _]}}, Names) ->
    [iolist_to_binary(
       io_lib:format("perf on the scheduler thread(s) that looked held (~ts) for a second or two, "
                     "~b samples: ~ts (~ts) ~b%; scheduler_held_native needs the thread held "
                     "over the window (a CPU wanted 90% of it, never sleeping) and its samples "
                     "in one native library above a yielding NIF's 90% with 95% confidence",
                     [lists:join(", ", Names), N, Sym, filename:basename(Dso), round(100 * Sh)]))];
held_note({ok, _}, _Names) ->
    [];
held_note({error, Why}, Names) ->
    [iolist_to_binary(
       io_lib:format("perf could not say what the scheduler thread(s) that looked held (~ts) "
                     "ran: ~ts", [lists:join(", ", Names), Why]))].

%% @doc perf's message came to the process that armed it, before the
%% report needed it: the result is kept in the handle for the report, and
%% perf's top symbols of the held threads go to the view, where
%% `explains_slowness/1' reads them (a scheduler perf shows held by native code
%% explains a node too slow to answer). Other messages: `ignore'.
-spec perf_done(handle(), term()) -> handle() | ignore.
perf_done(H = #{whole_perf := {Pid, MRef, _}, sampler := S}, {?MODULE, Pid, R}) ->
    erlang:demonitor(MRef, [flush]),
    _ = case R of
            {ok, Script, Tids = [_ | _]} ->
                beamdiag_host_view:tell(S, held_perf, {ok, beamdiag_host_rules:perf_top(Script, Tids)});
            _ ->
                ok
        end,
    H#{perf_result => R};
perf_done(_H, _Msg) ->
    ignore.

%% @doc Drops the host view (the node answered), perf included.
-spec cancel(handle()) -> ok.
cancel(H = #{sampler := S}) ->
    unlink(S),
    exit(S, kill),
    case maps:find(whole_perf, H) of
        {ok, {Pid, MRef, Dir}} ->
            exit(Pid, kill),
            erlang:demonitor(MRef, [flush]),
            _ = file:del_dir_r(Dir),
            ok;
        error ->
            ok
    end.

%% @doc Turns an error reason of this module into a sentence.
-spec format_error(term()) -> iolist().
format_error({perf_crashed, Why}) ->
    io_lib:format("perf's run crashed: ~0P", [Why, 10]).

%%%===================================================================
%%% Internal
%%%===================================================================

%% Waits for the end of the window, then for perf (until the report is
%% due), and analyses.
window(H = #{sampler := S, t0 := T0, duration_ms := D}, Context) ->
    wait_until(T0 + D, H),
    Samples = beamdiag_host_view:stop(S),
    Perf = case maps:is_key(whole_perf, H) of
               true -> perf_result(H);
               false -> none
           end,
    {PerfCtx, Tids} = case Perf of
                          {ok, Script0, Ts} -> {{script, Script0}, Ts};
                          Other -> {Other, []}
                      end,
    Capture0 = capture(H, Samples, maps:get(agent, Context, none)),
    %% What the session read besides (the lock data) joins the extras.
    Capture = Capture0#{extras := maps:merge(maps:get(extras, Capture0),
                                             maps:get(extras, Context, #{}))},
    Ledger = beamdiag_ledger:build(Capture),
    HotTids = [Tid || #{tid := Tid} <- beamdiag_host_rules:hot_threads(Ledger)],
    PerfTop = case PerfCtx of
                  {script, Script} ->
                      %% The hot threads' samples (perf ran on the hot threads
                      %% already, or on the whole process).
                      Keep = case Tids of [] -> HotTids; _ -> Tids end,
                      case Keep of
                          [] -> none;
                          _ -> {ok, beamdiag_host_rules:perf_top(Script, Keep)}
                      end;
                  _ ->
                      PerfCtx
              end,
    Skipped = case {Perf, maps:find(perf_skipped, H)} of
                  {none, {ok, Why}} -> #{perf_skipped => Why};
                  _ -> #{}
              end,
    Ctx = (maps:merge(maps:without([agent, extras], Context), Skipped))#{
                   os_pid => maps:get(os_pid, H), node => maps:get(node, H),
                   located => maps:get(how, maps:get(located, H)),
                   window_s => D / 1000, perf => PerfTop,
                   process_state => process_state(maps:get(proc_root, H), maps:get(os_pid, H))},
    %% The context goes with the capture, so a saved capture is analysed
    %% again the same way (beamdiag:analyse/1).
    Extras = maps:get(extras, Capture),
    beamdiag_host_rules:analyse(Capture#{extras => Extras#{host_view => Ctx}}, Ctx).

wait_until(Until, H) ->
    Now = erlang:monotonic_time(millisecond),
    case Now >= Until of
        true ->
            ok;
        false ->
            progress(H, Now),
            receive after min(1000, Until - Now) -> ok end,
            wait_until(Until, H)
    end.

progress(#{progress := undefined}, _) -> ok;
progress(#{progress := P, t0 := T0, duration_ms := D}, Now) ->
    _ = P(Now - T0, D),
    ok.

%% The samples as the agent's (the ledger reads them, and the memory
%% ledger their resident memory), the host's and cgroup's memory at the
%% end of the window in the extras.
%% With what an agent sent before the report fell back on the host view
%% (`finish_late/2'): its settings fill in what the host cannot see, and its
%% start walk and long schedules join the extras.
capture(H, Samples, #{info := Info, extras := AgentExtras}) when is_map(Info) ->
    C = #{settings := Settings, extras := Extras} = capture(H, Samples, none),
    Kept = maps:with([procs, long_schedules], AgentExtras),
    C#{settings := maps:merge(maps:get(settings, Info, #{}), Settings),
       extras := maps:merge(Kept, Extras)};
capture(H = #{os_pid := OsPid, proc_root := Root}, Samples, _) ->
    Settings = maps:merge(beamdiag_host_view:settings(Samples), flags(Root, OsPid)),
    Memory = case Samples of
                 [_ | _] -> maps:get(memory, lists:last(Samples), #{});
                 [] -> #{}
             end,
    Info = #{node => maps:get(node, H), settings => Settings,
             wall_start_ms => erlang:system_time(millisecond) -
                 (erlang:monotonic_time(millisecond) - maps:get(t0, H))},
    beamdiag_capture:new(Info, [host_sample(S) || S <- Samples],
                         #{interval_ms => maps:get(interval_ms, H),
                           duration_ms => maps:get(duration_ms, H),
                           extras => #{host_only => true, os_pid => OsPid, memory => Memory}}).

%% A host view's sample as the capture keeps it: of its memory, the node's
%% resident set alone (the memory ledger's account of a host-only report);
%% the host's and the cgroup's at the window's end are in the extras.
host_sample(S = #{memory := #{rss := Rss}}) -> S#{memory := #{rss => Rss}};
host_sample(S) -> maps:remove(memory, S).

%% The state of the node's OS process at the end of the window (proc(5)):
%% running, sleeping, stopped (SIGSTOP, or held by a debugger), zombie or
%% gone.
process_state(Root, OsPid) ->
    case file:read_file(filename:join([Root, integer_to_list(OsPid), "stat"])) of
        {ok, Bin} ->
            case beamdiag_agent_procfs:stat_fields(Bin) of
                {ok, _, [<<"T", _/binary>> | _]} -> stopped;
                {ok, _, [<<"t", _/binary>> | _]} -> stopped;
                {ok, _, [<<"Z", _/binary>> | _]} -> zombie;
                {ok, _, [<<"R", _/binary>> | _]} -> running;
                {ok, _, [_ | _]} -> sleeping;
                _ -> unknown
            end;
        {error, _} ->
            gone
    end.

%% The node's emulator flags from its command line (erlexec passes +F as
%% -F to the emulator), read as the agent reads them on the node.
flags(Root, OsPid) ->
    case file:read_file(filename:join([Root, integer_to_list(OsPid), "cmdline"])) of
        {ok, Bin} ->
            case binary:split(Bin, <<0>>, [global, trim_all]) of
                [_Exe | Args] -> beamdiag_agent_vm:parse_flags(Args);
                [] -> #{}
            end;
        {error, _} ->
            #{}
    end.

%% perf on the process (Tids = []) or on some of its threads, for Secs
%% seconds, in a process of its own: {Pid, MRef}; it sends back the
%% script's text and the threads it sampled, or an error in words.
perf(OsPid, Tids, Secs) ->
    Self = self(),
    Dir = temp_dir(),
    {Pid, MRef} = spawn_monitor(fun() ->
        R = try
                case beamdiag_perf:record(OsPid, #{duration => Secs, frequency => ?PERF_HZ,
                                                   call_graph => none, dir => Dir,
                                                   tids => Tids, user_only => true}) of
                    {ok, #{script := Path}} ->
                        {ok, Script} = file:read_file(Path),
                        {ok, Script, Tids};
                    {error, {M, Why}} ->
                        {error, iolist_to_binary(M:format_error(Why))}
                end
            after
                _ = file:del_dir_r(Dir)
            end,
        Self ! {?MODULE, self(), R}
    end),
    {Pid, MRef, Dir}.

%% Whole seconds of perf in what is left of the window, less two: perf's
%% start, and its naming of the symbols after, took 2.4 s together on a
%% host with a load of 30 (1.5 s and 0.9 s); both then fit before the
%% report is due. None when less than 2.5 s is left.
perf_seconds(LeftMs) when LeftMs < 2500 -> 0;
perf_seconds(LeftMs) -> max(1, (LeftMs - 2000) div 1000).

%% perf's result: kept by `perf_done/2', or waited for until the report
%% is due.
perf_result(#{perf_result := R}) ->
    R;
perf_result(#{whole_perf := Run, ready_by := ReadyBy}) ->
    perf_result(Run, ReadyBy).

perf_result({Pid, MRef, Dir}, ReadyBy) ->
    Wait = case ReadyBy of
               infinity -> 60000;
               _ -> beamdiag_agent_deadline:left(ReadyBy - ?REPORT_MS)
           end,
    receive
        {?MODULE, Pid, R} ->
            erlang:demonitor(MRef, [flush]),
            R;
        {'DOWN', MRef, process, Pid, Why} ->
            {error, iolist_to_binary(format_error({perf_crashed, Why}))}
    after Wait ->
        exit(Pid, kill),
        erlang:demonitor(MRef, [flush]),
        _ = file:del_dir_r(Dir),
        {error, <<"perf did not finish before the report was due">>}
    end.

temp_dir() ->
    beamdiag_tmp:path("beamdiag-host").

node_name(Target, #{os_pid := OsPid}) ->
    case beamdiag_host_locate:target(Target) of
        {node, Name} -> Name;
        {os_pid, _} -> "OS process " ++ integer_to_list(OsPid)
    end.
