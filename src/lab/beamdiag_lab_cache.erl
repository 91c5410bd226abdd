%%% @doc Cache lab scenarios: decoding atom-heavy terms, with and without Redis.
%%%
%%% `scenarios/0' describes the scenarios for the lab runner, which starts
%%% a peer node with the scenario's emulator arguments, loads the `load'
%%% module (and the `modules' it needs) there and calls its function:
%%%
%%% <ul>
%%% <li>`redis_cache': starts a real `redis-server' on 127.0.0.1 on a free
%%% port (no persistence, not daemonized, bounded by `timeout' and killed
%%% when the scenario ends), stores atom-heavy terms encoded with
%%% `term_to_binary(T, [{compressed, 6}])', and workers GET a value and
%%% `binary_to_term' it on every request, as the field report's service did.</li>
%%% <li>`atom_decode': the same decode in a loop, no Redis.</li>
%%% <li>`erlang_cpu': plain Erlang work (sorting, small maps), for the
%%% Erlang-level sampler.</li>
%%% </ul>
%%%
%%% The start function returns at once; the workload stops by itself after
%%% `duration' seconds, or when its owner (by default the caller's group
%%% leader, which for a call over distribution lives on the calling node)
%%% goes away, or on `stop/1'.
%%%
%%% ```
%%% 1> beamdiag_lab_cache:start(atom_decode, #{duration => 30}).
%%% {ok, <0.95.0>}
%%% 2> beamdiag_lab_cache:ops(atom_decode).
%%% 1234
%%% '''
-module(beamdiag_lab_cache).

-export([
    scenarios/0,
    start/2,
    stop/1,
    ops/1,
    redis_os_pid/1,
    atom_term/1,
    start_redis/1,
    stop_redis/1,
    format_error/1
]).
%% start/2, stop/1: the scenarios' load and stop MFAs on the lab node; ops/1,
%% redis_os_pid/1: peer:call by beamdiag_profile_SUITE and bench/sampler_overhead.escript.
-ignore_xref([{start, 2}, {stop, 1}, {ops, 1}, {redis_os_pid, 1}]).
%% Called by bench/cache_tier.escript.
-ignore_xref([{atom_term, 1}, {start_redis, 1}, {stop_redis, 1}]).
%% Called as Module:format_error/1 on an {error, {Module, Reason}} value.
-ignore_xref([{format_error, 1}]).

-export_type([scenario/0, redis/0, options/0]).

-type scenario() :: #{
    name := atom(),
    summary := binary(),
    emu_args := [string()],
    load := {module(), atom(), [term()]},
    modules => [module()]
}.
-type name() :: redis_cache | atom_decode | erlang_cpu.
%% The options of start/2.
-type options() :: #{
    duration => 1..600,
    workers => pos_integer(),
    atoms => pos_integer(),
    keys => pos_integer(),
    owner => pid() | undefined
}.
-type redis() :: #{port := inet:port_number(), os_pid := non_neg_integer(), erl_port := port()}.

-define(MAX_DURATION, 600).

%% The workers loop until they are killed.
-dialyzer({no_return, controller/3}).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The scenarios of this lab.
-spec scenarios() -> [scenario()].
scenarios() ->
    [
        #{
            name => redis_cache,
            summary =>
                <<"Workers GET atom-heavy terms from a local redis-server and "
                  "binary_to_term them on every request (term_to_binary with "
                  "{compressed, 6}); the field report's 31% of CPU in binary_to_term.">>,
            emu_args => ["+JPperf", "true"],
            load => {?MODULE, start, [redis_cache, '$duration_ms']},
            stop => {?MODULE, stop, [redis_cache]},
            modules => [?MODULE, beamdiag_resp]
        },
        #{
            name => atom_decode,
            summary =>
                <<"Workers decode a big atom-heavy term in a loop: binary_to_term "
                  "spends its time in the atom table.">>,
            emu_args => ["+JPperf", "true"],
            load => {?MODULE, start, [atom_decode, '$duration_ms']},
            modules => [?MODULE]
        },
        #{
            name => erlang_cpu,
            summary =>
                <<"Workers sort lists and build small maps in plain Erlang: a CPU-bound "
                  "node whose profile is Erlang code, for the Erlang-level sampler and "
                  "its overhead.">>,
            emu_args => ["+JPperf", "true"],
            load => {?MODULE, start, [erlang_cpu, '$duration_ms']},
            modules => [?MODULE]
        }
    ].

%% @doc Starts a scenario's workload on this node and returns at once.
%% Options: `duration' (s, default 60, at most 600), `workers' (default the
%% online schedulers), `atoms' (distinct atoms per term, default 20000),
%% `keys' (Redis keys, default 8), `owner' (a pid; the workload stops when
%% it dies; default the caller's group leader).
-spec start(name(), options() | pos_integer()) ->
    {ok, pid()} | {error, {?MODULE, term()}}.
start(Name, DurationMs) when is_integer(DurationMs) ->
    start(Name, #{duration => max(1, min(?MAX_DURATION, (DurationMs + 999) div 1000))});
start(Name, Opts0) when Name =:= redis_cache; Name =:= atom_decode; Name =:= erlang_cpu ->
    Opts = maps:merge(
        #{duration => 60, workers => erlang:system_info(schedulers_online), atoms => 20000,
          keys => 8, owner => group_leader()},
        Opts0),
    D = maps:get(duration, Opts),
    true = is_integer(D) andalso D > 0 andalso D =< ?MAX_DURATION,
    Caller = self(),
    {Pid, Mon} = spawn_monitor(fun() -> controller(Name, Opts, Caller) end),
    receive
        {Pid, started} ->
            erlang:demonitor(Mon, [flush]),
            {ok, Pid};
        {Pid, {error, _} = E} ->
            erlang:demonitor(Mon, [flush]),
            E;
        {'DOWN', Mon, process, Pid, Reason} ->
            {error, {?MODULE, {crashed, Reason}}}
    after 30000 ->
        exit(Pid, kill),
        {error, {?MODULE, start_timeout}}
    end.

%% @doc Stops a running scenario (and its redis-server).
-spec stop(name()) -> ok.
stop(Name) ->
    case whereis(reg(Name)) of
        undefined -> ok;
        Pid ->
            Mon = monitor(process, Pid),
            Pid ! stop,
            receive {'DOWN', Mon, _, _, _} -> ok after 10000 -> exit(Pid, kill), ok end
    end.

%% @doc Requests (GET + decode, or decodes) done so far by a running scenario.
-spec ops(name()) -> non_neg_integer().
ops(Name) ->
    case persistent_term:get({?MODULE, Name}, undefined) of
        undefined -> 0;
        Ref -> counters:get(Ref, 1)
    end.

%% @doc The OS pid of a running scenario's redis-server (that of its
%% `timeout' wrapper when there is one), or `undefined'.
-spec redis_os_pid(name()) -> non_neg_integer() | undefined.
redis_os_pid(Name) ->
    persistent_term:get({?MODULE, Name, redis}, undefined).

%% @doc An atom-heavy term: records as tuples of atoms, lists of atoms,
%% `N' distinct atoms in all.
-spec atom_term(pos_integer()) -> term().
atom_term(N) ->
    [
        {record, list_to_atom("user_field_" ++ integer_to_list(I)),
         list_to_atom("status_" ++ integer_to_list(I rem 97)),
         [list_to_atom("tag_" ++ integer_to_list((I * 7 + J) rem N)) || J <- lists:seq(1, 4)],
         I}
     || I <- lists:seq(1, N div 5)
    ].

%% @doc Starts `redis-server' on 127.0.0.1 on a free port, as a port of this
%% node, without persistence, wrapped in `timeout' so it cannot outlive
%% `MaxSeconds'; waits until it answers PING.
-spec start_redis(pos_integer()) -> {ok, redis()} | {error, {?MODULE, term()}}.
start_redis(MaxSeconds) ->
    case os:find_executable("redis-server") of
        false ->
            {error, {?MODULE, redis_missing}};
        Redis ->
            Port = free_port(),
            RedisArgs = ["--port", integer_to_list(Port), "--bind", "127.0.0.1",
                         "--save", "", "--appendonly", "no", "--daemonize", "no",
                         "--protected-mode", "yes", "--loglevel", "warning"],
            {Exe, Args} = case os:find_executable("timeout") of
                false -> {Redis, RedisArgs};
                T -> {T, ["--signal=TERM", integer_to_list(MaxSeconds), Redis | RedisArgs]}
            end,
            EP = open_port({spawn_executable, Exe},
                           [{args, Args}, binary, exit_status, stderr_to_stdout, hide]),
            {os_pid, OsPid} = erlang:port_info(EP, os_pid),
            R = #{port => Port, os_pid => OsPid, erl_port => EP},
            case wait_ping(Port, 50) of
                ok -> {ok, R};
                {error, _} = E -> stop_redis(R), E
            end
    end.

%% @doc Stops a redis-server started by `start_redis/1'.
-spec stop_redis(redis()) -> ok.
stop_redis(#{port := Port, os_pid := OsPid, erl_port := EP}) ->
    _ = case beamdiag_resp:connect(Port, 1000) of
        {ok, C} ->
            _ = beamdiag_resp:command(C, [<<"SHUTDOWN">>, <<"NOSAVE">>], 2000),
            beamdiag_resp:close(C);
        _ ->
            ok
    end,
    _ = kill(OsPid),
    catch port_close(EP),
    ok.

%% @doc Turns an error reason into a sentence.
-spec format_error(term()) -> iolist().
format_error(redis_missing) -> "redis-server is not installed (Debian: apt-get install redis-server)";
format_error(redis_not_ready) -> "redis-server did not answer PING within 5 s";
format_error(start_timeout) -> "the scenario did not start within 30 s";
format_error({load, Mod, Why}) -> io_lib:format("cannot load ~s: ~p", [Mod, Why]);
format_error({crashed, R}) -> io_lib:format("the scenario crashed while starting: ~p", [R]);
format_error({redis, R}) -> ["Redis: ", beamdiag_resp:format_error(R)].

%%%===================================================================
%%% Internal
%%%===================================================================

reg(redis_cache) -> beamdiag_lab_cache_redis_cache;
reg(atom_decode) -> beamdiag_lab_cache_atom_decode;
reg(erlang_cpu) -> beamdiag_lab_cache_erlang_cpu.

controller(Name, Opts = #{duration := D, workers := W, owner := Owner}, Caller) ->
    process_flag(trap_exit, true),
    true = register(reg(Name), self()),
    Ops = counters:new(1, [write_concurrency]),
    persistent_term:put({?MODULE, Name}, Ops),
    OwnerMon = case is_pid(Owner) of
        true -> monitor(process, Owner);
        false -> undefined
    end,
    case setup(Name, Opts) of
        {ok, Loop, Cleanup} ->
            Workers = [spawn_link(fun() -> Loop(Ops) end) || _ <- lists:seq(1, W)],
            Caller ! {self(), started},
            erlang:send_after(D * 1000, self(), stop),
            wait(OwnerMon),
            [begin unlink(Pid), exit(Pid, kill) end || Pid <- Workers],
            Cleanup(),
            persistent_term:erase({?MODULE, Name});
        {error, _} = E ->
            persistent_term:erase({?MODULE, Name}),
            Caller ! {self(), E}
    end.

wait(OwnerMon) ->
    receive
        stop -> ok;
        {'DOWN', OwnerMon, process, _, _} -> ok;
        {'EXIT', _, normal} -> wait(OwnerMon);
        {Port, {data, _}} when is_port(Port) -> wait(OwnerMon);
        {Port, {exit_status, _}} when is_port(Port) -> wait(OwnerMon);
        {'EXIT', _, Reason} -> logger:warning("beamdiag_lab_cache: worker died: ~p", [Reason])
    end.

setup(erlang_cpu, _Opts) ->
    {ok, fun(Ops) -> cpu_loop(Ops) end, fun() -> ok end};
setup(atom_decode, #{atoms := N}) ->
    Bin = term_to_binary(atom_term(N), [{compressed, 6}]),
    {ok, fun(Ops) -> decode_loop(Bin, Ops) end, fun() -> ok end};
setup(redis_cache, #{atoms := N, keys := K, duration := D}) ->
    case start_redis(D + 30) of
        {ok, R = #{port := Port, os_pid := OsPid}} ->
            persistent_term:put({?MODULE, redis_cache, redis}, OsPid),
            case seed(Port, N, K) of
                ok ->
                    Loop = fun(Ops) ->
                        {ok, C} = beamdiag_resp:connect(Port, 2000),
                        redis_loop(C, K, Ops)
                    end,
                    {ok, Loop, fun() ->
                        stop_redis(R),
                        persistent_term:erase({?MODULE, redis_cache, redis})
                    end};
                {error, _} = E ->
                    stop_redis(R),
                    E
            end;
        {error, _} = E ->
            E
    end.

seed(Port, N, K) ->
    case beamdiag_resp:connect(Port, 2000) of
        {ok, C} ->
            Res = lists:foldl(
                fun(I, ok) ->
                        Key = <<"beamdiag:lab:", (integer_to_binary(I))/binary>>,
                        Val = term_to_binary({I, atom_term(N)}, [{compressed, 6}]),
                        case beamdiag_resp:command(C, [<<"SET">>, Key, Val]) of
                            {ok, _} -> ok;
                            {error, {_, R}} -> {error, {?MODULE, {redis, R}}}
                        end;
                   (_, Err) -> Err
                end, ok, lists:seq(1, K)),
            beamdiag_resp:close(C),
            Res;
        {error, {_, R}} ->
            {error, {?MODULE, {redis, R}}}
    end.

cpu_loop(Ops) ->
    L = [rand:uniform(1000) || _ <- lists:seq(1, 200)],
    M = lists:foldl(fun(X, A) -> A#{X rem 32 => X} end, #{}, lists:sort(L)),
    _ = map_size(M),
    counters:add(Ops, 1, 1),
    cpu_loop(Ops).

decode_loop(Bin, Ops) ->
    _ = binary_to_term(Bin),
    counters:add(Ops, 1, 1),
    decode_loop(Bin, Ops).

redis_loop(C, K, Ops) ->
    Key = <<"beamdiag:lab:", (integer_to_binary(rand:uniform(K)))/binary>>,
    {ok, Bin} = beamdiag_resp:command(C, [<<"GET">>, Key]),
    _ = binary_to_term(Bin),
    counters:add(Ops, 1, 1),
    redis_loop(C, K, Ops).

free_port() ->
    {ok, L} = gen_tcp:listen(0, [{ip, {127, 0, 0, 1}}]),
    {ok, Port} = inet:port(L),
    ok = gen_tcp:close(L),
    Port.

wait_ping(_Port, 0) ->
    {error, {?MODULE, redis_not_ready}};
wait_ping(Port, N) ->
    case beamdiag_resp:connect(Port, 500) of
        {ok, C} ->
            R = beamdiag_resp:command(C, [<<"PING">>], 1000),
            beamdiag_resp:close(C),
            case R of
                {ok, <<"PONG">>} -> ok;
                _ -> timer:sleep(100), wait_ping(Port, N - 1)
            end;
        {error, _} ->
            timer:sleep(100),
            wait_ping(Port, N - 1)
    end.

kill(OsPid) ->
    case os:find_executable("kill") of
        false ->
            ok;
        Kill ->
            P = open_port({spawn_executable, Kill},
                          [{args, ["-TERM", integer_to_list(OsPid)]}, exit_status, hide,
                           stderr_to_stdout]),
            receive {P, {exit_status, _}} -> ok after 5000 -> ok end
    end.
