%%% @doc A Prometheus endpoint inside the node: the time ledger's ratios
%%% over the last interval, served by `beamdiag_agent_http', a bounded
%%% HTTP/1.1 responder on `gen_tcp' (no inets needed). `beamdiag metrics
%%% NODE' serves the same text from a node with nothing installed (see
%%% `beamdiag_cli_metrics').
%%%
%%% A sampler process takes one sample of this node each interval (the
%%% agent's `beamdiag_agent_tick:sample/1': /proc per thread, scheduler wall
%%% time, cgroup counters), keeps the last two, builds the ledger between
%%% them and renders the exposition text, which the responder serves as
%%% it is. Scrapes cost nothing but a copy of the text.
%%%
%%% It is long-running, so it is careful about what it turns on:
%%% `scheduler_wall_time' is reference counted per process (turning it off
%%% drops only this process's reference, and the runtime drops it when the
%%% process dies); microstate accounting costs a little on every state
%%% change of every thread and is global, so it stays off unless `msacc =>
%%% true' is given, and is then put back as it was found when the sampler
%%% stops. The metric names are documented in docs/METRICS.md.
%%%
%%% ```
%%% 1> {ok, Pid} = beamdiag_metrics:start(#{port => 9568, interval => 1000}).
%%% 2> httpc:request("http://127.0.0.1:9568/metrics").
%%% 3> beamdiag_metrics:stop(Pid).
%%% '''
%%% In a supervision tree: `beamdiag_metrics:child_spec(#{port => 9568})'.
%%% From Elixir: `:beamdiag_metrics.start(%{port: 9568})'.
-module(beamdiag_metrics).

-behaviour(gen_server).

-export([start/1, start_link/1, stop/1, child_spec/1, exposition/3,
         warming_up/0, scrape/1, format_error/1]).
%% gen_server callbacks.
-export([init/1, handle_call/3, handle_cast/2, handle_info/2, terminate/2]).
%% Called as Module:format_error/1 on an {error, {Module, Reason}} value.
-ignore_xref([{format_error, 1}]).
%% Called by the tests only.
-ifdef(TEST).
-export([text/1, memory_metrics/2]).
-endif.

-define(DEFAULTS, #{port => 9568, interval => 1000, ip => loopback, path => "/metrics",
                    msacc => false}).
-define(TYPES, [scheduler, dirty_cpu, dirty_io, aux, poll]).
%% A share is left out when its denominator is below this many CPUs (the
%% ratio of two tiny numbers swings: 0.18 to 0.43 on an idle node); the
%% absolute figure beside it says the same without the swing.
-define(MIN_CPUS, 0.05).
%% Likewise a share of CFS periods over fewer periods than this (an idle
%% cgroup runs a few periods a second).
-define(MIN_PERIODS, 10).

-export_type([options/0]).

%% The options start/1 takes; all optional (?DEFAULTS).
-type options() :: #{
    port => inet:port_number(),
    interval => 100..60000,
    ip => loopback | any | inet:ip_address(),
    path => string(),
    msacc => boolean()
}.
%% The options with the defaults filled in (options/1).
-type config() :: #{
    port := inet:port_number(),
    interval := 100..60000,
    ip := loopback | any | inet:ip_address(),
    path := string(),
    msacc := boolean()
}.
%% The sampler's state: its options, the responder, the text it serves,
%% the flags to put back, the agent's tick state and the last sample.
-type state() :: #{
    port := inet:port_number(),
    interval := 100..60000,
    ip := loopback | any | inet:ip_address(),
    path := string(),
    msacc := boolean(),
    http := pid(),
    text := binary(),
    swt_was := boolean(),
    msacc_was := {was, boolean()} | untouched,
    sampler := beamdiag_agent_tick:tick_state(),
    last := beamdiag_agent_tick:sample() | undefined
}.

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Starts the sampler and its HTTP listener, not linked to the
%% caller. Options (defaults): `port' (9568), `ip' (`loopback'; `any' or
%% an address tuple to listen elsewhere), `path' ("/metrics"), `interval'
%% ms between samples (1000), `msacc' (false). Unknown options raise
%% `badarg'; a port in use gives `{error, {beamdiag_metrics, _}}'.
-spec start(options()) -> {ok, pid()} | {error, {beamdiag_metrics, term()}}.
start(Opts) ->
    gen_server:start(?MODULE, options(Opts), []).

%% @doc As `start/1', linked to the caller (for a supervisor).
-spec start_link(options()) -> {ok, pid()} | {error, {beamdiag_metrics, term()}}.
start_link(Opts) ->
    gen_server:start_link(?MODULE, options(Opts), []).

%% @doc Stops the sampler and its listener and puts back the flags.
-spec stop(pid()) -> ok.
stop(Pid) ->
    gen_server:stop(Pid).

%% @doc A child specification for a supervisor.
-spec child_spec(options()) -> supervisor:child_spec().
child_spec(Opts) ->
    #{id => {?MODULE, maps:get(port, options(Opts))},
      start => {?MODULE, start_link, [Opts]},
      restart => permanent,
      shutdown => 5000,
      type => worker,
      modules => [?MODULE]}.

%% @doc Validates options and fills in defaults; raises `badarg'.
-spec options(options()) -> config().
options(Opts) when is_map(Opts) ->
    O = beamdiag_opts:merge(Opts, ?DEFAULTS, []),
    #{port := P, interval := I, ip := Ip, path := Path, msacc := M} = O,
    (is_integer(P) andalso P > 0 andalso P < 65536) orelse erlang:error({badarg, {port, P}}),
    (is_integer(I) andalso I >= 100 andalso I =< 60000) orelse erlang:error({badarg, {interval, I}}),
    (Ip =:= loopback orelse Ip =:= any orelse is_tuple(Ip)) orelse erlang:error({badarg, {ip, Ip}}),
    (is_list(Path) andalso hd(Path) =:= $/) orelse erlang:error({badarg, {path, Path}}),
    is_boolean(M) orelse erlang:error({badarg, {msacc, M}}),
    O;
options(Other) ->
    erlang:error({badarg, Other}).

%% @doc The exposition text for a ledger (pure). `msacc' in the ledger
%% adds the microstate metrics.
-spec text(beamdiag_ledger:ledger()) -> iolist().
text(#{threads := []}) ->
    warming_up();
text(L = #{by_type := ByType, totals := T, window_s := W}) ->
    Types = [Ty || Ty <- ?TYPES, maps:is_key(Ty, ByType)],
    Row = fun(Ty) -> maps:get(Ty, ByType) end,
    Sched = [Ty || Ty <- Types, beamdiag_threads:is_scheduler(Ty)],
    Host = maps:get(host, L, #{}),
    Cg = maps:get(cgroup, L, #{}),
    Wd = max(1.0e-9, float(W)),
    [
        metric(beamdiag_up, "1 when a ledger over the last interval is available.", [{[], 1}]),
        metric(beamdiag_window_seconds, "Length of the interval the figures cover.", [{[], W}]),
        metric(beamdiag_threads, "Threads of each type.",
               [{[{type, Ty}], maps:get(n, Row(Ty), 0)} || Ty <- Types]),
        metric(beamdiag_thread_time_share,
               "Share of each thread type's wall time by state: run (on CPU working), spin "
               "(on CPU busy-waiting), blocked, runq (runnable, waiting for a CPU), idle. "
               "The states of a type add up to 1.",
               [{[{type, Ty}, {state, S}], maps:get(S, Shares)}
                || Ty <- Types, Shares <- [beamdiag_ledger:state_shares(Row(Ty))],
                   S <- beamdiag_ledger:states()]),
        metric(beamdiag_busy_wait_cpus,
               "CPUs the schedulers spent busy-waiting (spin seconds per second).",
               [{[{type, Ty}], field(spin, Row(Ty)) / Wd} || Ty <- Sched]),
        metric(beamdiag_busy_wait_share,
               "Share of the schedulers' CPU time spent busy-waiting (spin / on-CPU); left out "
               "while they use under 0.05 CPUs.",
               [{[{type, Ty}], ratio(field(spin, Row(Ty)), field(on_cpu, Row(Ty)))}
                || Ty <- Sched, field(on_cpu, Row(Ty)) / Wd >= ?MIN_CPUS]),
        metric(beamdiag_blocked_cpus,
               "CPUs' worth of the schedulers' busy time spent blocked off CPU (seconds per second).",
               [{[{type, Ty}], field(blocked, Row(Ty)) / Wd} || Ty <- Sched]),
        metric(beamdiag_blocked_share,
               "Share of the schedulers' busy time spent blocked off CPU (blocked / busy); left "
               "out while they are busy for under 0.05 CPUs.",
               [{[{type, Ty}], ratio(field(blocked, Row(Ty)), field(busy, Row(Ty)))}
                || Ty <- Sched, field(busy, Row(Ty)) / Wd >= ?MIN_CPUS]),
        metric(beamdiag_runnable_wait_share,
               "Share of each thread type's wall time spent runnable, waiting for a CPU.",
               [{[{type, Ty}], ratio(field(runq, Row(Ty)), field(wall, Row(Ty)))} || Ty <- Types]),
        metric(beamdiag_scheduler_utilization,
               "Schedulers' busy time by the BEAM's account (scheduler_wall_time) / wall time.",
               [{[{type, Ty}], ratio(field(busy, Row(Ty)), field(wall, Row(Ty)))} || Ty <- Sched]),
        metric(beamdiag_cpus_used, "CPUs the node's threads used (OS account).",
               [{[], maps:get(cpus_used, T, 0.0)}]),
        metric(beamdiag_cpus_available, "CPUs the node may use: affinity cut by the cgroup quota.",
               [{[], maps:get(cpus_available, T, 0.0)}]),
        metric(beamdiag_host_cpu_busy_share, "Share of the host's CPU time busy.",
               [{[], V} || V <- [maps:get(busy, Host, undefined)], is_number(V)]),
        metric(beamdiag_host_steal_share, "Share of the host's CPU time stolen by the hypervisor.",
               [{[], V} || V <- [maps:get(steal, Host, undefined)], is_number(V)]),
        metric(beamdiag_cgroup_throttled_share,
               "Share of CFS periods in which the cgroup was throttled; left out over fewer than "
               "10 periods.",
               [{[], V} || V <- [maps:get(throttled_ratio, Cg, undefined)], is_number(V),
                           maps:get(periods, Cg, 0) >= ?MIN_PERIODS]),
        metric(beamdiag_cgroup_throttled_periods, "CFS periods in which the cgroup was throttled.",
               [{[], V} || V <- [maps:get(throttled_periods, Cg, undefined)], is_number(V)]),
        metric(beamdiag_cgroup_throttled_seconds_per_second,
               "Seconds throttled per second of wall time.",
               [{[], V} || V <- [maps:get(throttled_share, Cg, undefined)], is_number(V)]),
        metric(beamdiag_run_queue, "Processes waiting in the normal run queues (average of the samples).",
               [{[], V} || V <- [maps:get(run_queue_avg, maps:get(vm, L, #{}), undefined)],
                           is_number(V)]),
        msacc_metrics(maps:get(msacc, L, #{}), W)
    ].

%% @doc The text served before the first interval has passed.
-spec warming_up() -> iolist().
warming_up() ->
    metric(beamdiag_up, "1 when a ledger over the last interval is available.", [{[], 0}]).

%% @doc The exposition text between two samples of a node, with the cost
%% of the later one (pure but for reading the build's settings map).
-spec exposition(beamdiag_agent_tick:sample(), beamdiag_agent_tick:sample(),
                 beamdiag_agent_vm:settings()) -> iolist().
exposition(Last, Sample, Settings) ->
    Capture = beamdiag_capture:new(#{settings => Settings}, [Last, Sample], #{}),
    [text(beamdiag_ledger:build(Capture)),
     memory_metrics(Last, Sample),
     metric(beamdiag_sample_cost_seconds, "Time the last sample took.",
            [{[], maps:get(tick_cost_us, Sample, 0) / 1.0e6}])].

%% @doc The memory ledger's figures at the later sample, and their change
%% a second between the two (pure): the OS's account (`rss', `anon') and
%% the VM's (`erlang:memory/0' by type, `vm_total').
-spec memory_metrics(beamdiag_agent_tick:sample(), beamdiag_agent_tick:sample()) -> iolist().
memory_metrics(Last, Sample) ->
    A = memory_accounts(Last),
    B = memory_accounts(Sample),
    Dt = erlang:convert_time_unit(maps:get(t, Sample, 0) - maps:get(t, Last, 0), native,
                                  nanosecond) / 1.0e9,
    [metric(beamdiag_memory_bytes,
            "Memory by account: rss and anon (the OS's, /proc), vm_total and each type of "
            "erlang:memory/0 (the VM's).",
            [{[{account, K}], V} || {K, V} <- lists:sort(maps:to_list(B))]),
     metric(beamdiag_memory_growth_bytes_per_second,
            "Change of each memory account between the last two samples, in bytes a second.",
            [{[{account, K}], (V - maps:get(K, A)) / Dt}
             || Dt > 0, {K, V} <- lists:sort(maps:to_list(B)), maps:is_key(K, A)])].

memory_accounts(#{memory := #{vm := Vm, os := Os}}) ->
    OsPart = case Os of
                 #{} -> maps:with([rss, anon], Os);
                 _ -> #{}
             end,
    VmPart = maps:from_list([{case K of total -> vm_total; _ -> K end, V}
                             || {K, V} <- maps:to_list(Vm), is_integer(V)]),
    maps:merge(VmPart, OsPart);
memory_accounts(_) ->
    #{}.

%% @doc Fetches the endpoint over HTTP/1.0 on a real socket and returns the
%% body (for tests and for a quick look from a shell).
-spec scrape(options()) -> {ok, binary()} | {error, {beamdiag_metrics, term()}}.
scrape(Opts) ->
    #{port := Port, path := Path} = options(Opts),
    case gen_tcp:connect({127, 0, 0, 1}, Port, [binary, {active, false}], 5000) of
        {ok, S} ->
            ok = gen_tcp:send(S, ["GET ", Path, " HTTP/1.0\r\nHost: localhost\r\n\r\n"]),
            Reply = recv_all(S, <<>>),
            gen_tcp:close(S),
            case Reply of
                {ok, <<"HTTP/1.", _, " 200", _/binary>> = R} ->
                    [_, Body] = string:split(R, <<"\r\n\r\n">>),
                    {ok, Body};
                {ok, R} ->
                    {error, {beamdiag_metrics, {http_status, hd(string:split(R, <<"\r\n">>))}}};
                {error, Why} ->
                    {error, {beamdiag_metrics, {scrape, Why}}}
            end;
        {error, Why} ->
            {error, {beamdiag_metrics, {scrape, Why}}}
    end.

%% @doc Turns an error reason of this module into a sentence.
-spec format_error(term()) -> iolist().
format_error({http, {beamdiag_agent_http, R}}) ->
    beamdiag_agent_http:format_error(R);
format_error({scrape, Why}) ->
    io_lib:format("cannot fetch the metrics: ~0p", [Why]);
format_error({http_status, Line}) ->
    io_lib:format("the metrics endpoint answered ~ts", [Line]).

%%%===================================================================
%%% gen_server
%%%===================================================================

%% @private
-spec init(config()) -> {ok, state()} | {stop, {beamdiag_metrics, term()}}.
init(O = #{port := Port, ip := Ip, interval := I, msacc := WantMsacc, path := Path}) ->
    process_flag(trap_exit, true),
    case beamdiag_agent_http:start_link(#{owner => self(), port => Port, ip => Ip, path => Path}) of
        {ok, Http} ->
            ok = beamdiag_agent_http:set(Http, warming_up()),
            Swt = erlang:system_flag(scheduler_wall_time, true),
            MsaccWas = case WantMsacc of
                           true -> {was, erlang:system_flag(microstate_accounting, true)};
                           false -> untouched
                       end,
            OsPid = os:getpid(),
            Cg = case beamdiag_agent_cgroup:locate("/proc", OsPid) of
                     {ok, Loc} -> Loc;
                     {error, _} = E -> E
                 end,
            Sampler = #{pid => OsPid, proc_root => "/proc", msacc => WantMsacc,
                        cgroup_location => Cg,
                        held => beamdiag_agent_file:new(beamdiag_agent_file:budget("/proc"))},
            self() ! tick,
            {ok, O#{http => Http, text => iolist_to_binary(warming_up()), swt_was => Swt,
                    msacc_was => MsaccWas, sampler => Sampler, last => undefined,
                    interval => I}};
        {error, Why} ->
            {stop, {beamdiag_metrics, {http, Why}}}
    end.

%% @private
-spec handle_call(term(), gen_server:from(), state()) -> {reply, term(), state()}.
handle_call(text, _From, S = #{text := T}) ->
    {reply, T, S};
handle_call(_, _From, S) ->
    {reply, {error, unknown_call}, S}.

%% @private
-spec handle_cast(term(), state()) -> {noreply, state()}.
handle_cast(_, S) ->
    {noreply, S}.

%% @private
-spec handle_info(term(), state()) -> {noreply, state()} | {stop, term(), state()}.
handle_info(tick, S = #{sampler := Sampler0, last := Last, http := Http, interval := I}) ->
    erlang:send_after(I, self(), tick),
    {Sample, Sampler} = beamdiag_agent_tick:sample(Sampler0),
    S2 = case Last of
             undefined ->
                 S;
             _ ->
                 Text = iolist_to_binary(exposition(Last, Sample, beamdiag_agent_vm:settings())),
                 ok = beamdiag_agent_http:set(Http, Text),
                 S#{text => Text}
         end,
    {noreply, S2#{last => Sample, sampler => Sampler}};
handle_info({'EXIT', Http, Why}, S = #{http := Http}) ->
    {stop, {beamdiag_metrics, {http, {beamdiag_agent_http, {gone, Why}}}}, S};
handle_info(_, S) ->
    {noreply, S}.

%% @private
%% Puts back what init changed.
-spec terminate(term(), state()) -> ok.
terminate(_Why, #{http := Http, msacc_was := MsaccWas}) ->
    %% The responder is gone, and its port closed, when this returns.
    ok = beamdiag_agent_http:stop(Http),
    case MsaccWas of
        {was, Was} -> _ = erlang:system_flag(microstate_accounting, Was);
        untouched -> ok
    end,
    _ = erlang:system_flag(scheduler_wall_time, false),
    ok.

%%%===================================================================
%%% Internal
%%%===================================================================

recv_all(S, Acc) ->
    case gen_tcp:recv(S, 0, 5000) of
        {ok, D} -> recv_all(S, <<Acc/binary, D/binary>>);
        {error, closed} -> {ok, Acc};
        {error, _} = E -> E
    end.

metric(_Name, _Help, []) ->
    [];
metric(Name, Help, Values) ->
    N = atom_to_list(Name),
    ["# HELP ", N, " ", Help, "\n# TYPE ", N, " gauge\n",
     [[N, labels(Ls), " ", number(V), "\n"] || {Ls, V} <- Values]].

labels([]) -> "";
labels(Ls) -> ["{", lists:join(",", [[atom_to_list(K), "=\"", label_value(V), "\""] || {K, V} <- Ls]), "}"].

label_value(V) when is_atom(V) -> label_value(atom_to_binary(V));
label_value(V) when is_binary(V) ->
    binary:replace(binary:replace(binary:replace(V, <<"\\">>, <<"\\\\">>, [global]),
                                  <<"\"">>, <<"\\\"">>, [global]),
                   <<"\n">>, <<"\\n">>, [global]).

number(V) when is_integer(V) -> integer_to_list(V);
number(V) when is_float(V) -> float_to_list(V, [short]);
number(_) -> "NaN".

field(K, Row) ->
    case maps:get(K, Row, undefined) of
        V when is_number(V) -> float(V);
        _ -> 0.0
    end.

ratio(_, D) when D =< 0 -> 0.0;
ratio(N, D) -> max(0.0, min(1.0, N / D)).

msacc_metrics(#{by_type := ByType}, W) when map_size(ByType) > 0 ->
    [
        metric(beamdiag_msacc_enabled, "1 when microstate accounting is on for these metrics.",
               [{[], 1}]),
        metric(beamdiag_msacc_state_share,
               "Share of each thread type's accounted time in each microstate.",
               [{[{type, Ty}, {state, S}], V}
                || {Ty, #{shares := Sh}} <- lists:sort(maps:to_list(ByType)),
                   {S, V} <- lists:sort(maps:to_list(Sh))]),
        metric(beamdiag_dirty_gc_share,
               "Share of the dirty CPU schedulers' accounted time spent in garbage collection.",
               [{[], gc_share(maps:get(dirty_cpu, ByType, #{}))}]),
        metric(beamdiag_dirty_gc_cpus, "CPUs spent in garbage collection on dirty CPU schedulers.",
               [{[], gc_seconds(maps:get(dirty_cpu, ByType, #{})) / max(1.0e-9, W)}])
    ];
msacc_metrics(_, _) ->
    metric(beamdiag_msacc_enabled, "1 when microstate accounting is on for these metrics.",
           [{[], 0}]).

gc_share(#{shares := Sh}) -> float(maps:get(gc, Sh, 0) + maps:get(gc_full, Sh, 0));
gc_share(_) -> 0.0.

gc_seconds(#{seconds := Sec}) -> float(maps:get(gc, Sec, 0) + maps:get(gc_full, Sec, 0));
gc_seconds(_) -> 0.0.
