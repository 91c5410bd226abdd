%%% @doc The lab: local nodes that reproduce one pathology each, for demos
%%% and tests.
%%%
%%% A scenario is data: the emulator flags of the node, the workload to
%%% start on it (`{Module, Function, Args}', the module and any others
%%% listed in `modules' shipped to the node over its control channel), an optional CPU competitor node and an
%%% optional cgroup CPU quota. `start/2' starts the node with OTP's `peer'
%%% over standard I/O, so the node dies with the session that started it;
%%% every workload also stops on its own after its time bound.
%%%
%%% ```
%%% 1> {ok, Lab} = beamdiag_lab:start(busy_wait, #{duration => 60}).
%%% 2> beamdiag:diagnose(beamdiag_lab:node(Lab), #{cookie => beamdiag_lab:cookie(Lab)}).
%%% 3> beamdiag_lab:stop(Lab).
%%% '''
-module(beamdiag_lab).

-export([scenarios/0, scenario/1, start/2, stop/1, node/1, cookie/1, parse_variation/2,
         format_error/1]).
%% Called as Module:format_error/1 on an {error, {Module, Reason}} value.
-ignore_xref([{format_error, 1}]).

-export_type([scenario/0, lab/0, vary_spec/0, options/0, params/0]).

-type scenario() :: #{
    name := atom(),
    summary := binary(),
    emu_args := [string()],
    load := {module(), atom(), [term()]},
    modules => [module()],
    stop => {module(), atom(), [term()]},
    emu_type => lcnt,
    expect => [atom()],
    competitor => #{cpus := pos_integer()},
    cgroup => #{quota_cpus := float()},
    warmup_ms => non_neg_integer(),
    %% Run on this host before the workload: `{ok, Value}' (the atom
    %% '$prepared' in the load's arguments stands for Value) or an error.
    prepare => {module(), atom(), [term()]},
    %% Run on this host when the lab stops, with the lab appended to the
    %% arguments, before the node goes.
    release => {module(), atom(), [term()]},
    %% The node may ignore SIGTERM and peer:stop: kill its OS process.
    hard_stop => boolean(),
    %% A unit of work for `beamdiag experiment': `Module:unit(Name, Ctx)'
    %% of the load's module.
    unit => #{name := atom(), concurrency := pos_integer(), summary := binary()},
    %% What a run may vary (`start/2''s `vary'), each with its values and
    %% its default; the atom '$vary' in the load's arguments stands for
    %% the whole variation. `schedulers' is the lab's own: `host' starts
    %% the node with the VM's default (one per core), a number N with
    %% +S N:N after the scenario's flags.
    vary => #{atom() => vary_spec()},
    %% The variation's defaults: the atom '$params' in the load's arguments
    %% stands for them, with the `params' of start/2 merged over them and
    %% checked by the load module's `params/1' (`{ok, Params}' or an error).
    params => params()
}.
%% A scenario's parameters. Open here: each load module has its own
%% (beamdiag_lab_flood:params(), ...) and checks them in its params/1.
-type params() :: #{atom() => term()}.
%% The options of start/2.
-type options() :: #{
    duration => pos_integer(),
    extra_args => [string()],
    vary => #{atom() => term()},
    exec => peer:exec(),
    params => params()
}.
-type vary_spec() :: #{values := [atom() | {integer, pos_integer(), pos_integer()}],
                       default := atom() | pos_integer(),
                       help := binary()}.
-type lab() :: #{
    scenario := scenario(),
    node := node(),
    peer := pid(),
    cookie := atom(),
    vary := #{atom() => term()},
    os_pid => string(),
    prepared => term(),
    competitor => pid(),
    cgroup => file:filename()
}.

-define(DEFAULT_DURATION, 120).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Every scenario, from every lab module.
-spec scenarios() -> [scenario()].
scenarios() ->
    beamdiag_lab_ledger:scenarios() ++ beamdiag_lab_locks:scenarios() ++
        beamdiag_lab_cache:scenarios() ++ beamdiag_lab_procs:scenarios() ++
        beamdiag_lab_sick:scenarios() ++ beamdiag_lab_flood:scenarios() ++
        beamdiag_lab_limits:scenarios() ++ beamdiag_lab_waits:scenarios() ++
        beamdiag_lab_memory:scenarios().

%% @doc One scenario by name (atom or string); unknown names are an error value.
-spec scenario(atom() | string()) -> {ok, scenario()} | {error, {beamdiag_lab, term()}}.
scenario(Name) ->
    Str = case Name of A when is_atom(A) -> atom_to_list(A); L -> L end,
    case [S || S = #{name := N} <- scenarios(), atom_to_list(N) =:= Str] of
        [Found] -> {ok, Found};
        [] -> {error, {beamdiag_lab, {unknown_scenario, Str, [N || #{name := N} <- scenarios()]}}}
    end.

%% @doc Starts the scenario's node and its workload. Options: `duration'
%% (seconds the workload runs, default 120), `extra_args' (more emulator
%% flags, e.g. a variant under test), `vary' (what the scenario lets vary,
%% a map checked by `variation/2'), `exec' (how to start `erl', as OTP's
%% `peer' takes it: `{Executable, Args}', e.g. a command that runs another
%% OTP release's `erl' in its own root; default: this machine's `erl'),
%% `params' (the variation of a scenario that has parameters, checked
%% before any node starts).
-spec start(atom() | string() | scenario(), options()) -> {ok, lab()} | {error, {module(), term()}}.
start(Name, Opts) when is_atom(Name); is_list(Name) ->
    case scenario(Name) of
        {ok, S} -> start(S, Opts);
        {error, _} = E -> E
    end;
start(S = #{load := {Mod, _, _}}, Opts = #{params := P}) ->
    case params(S, Mod, P) of
        {ok, All} -> start(S#{params := All}, maps:remove(params, Opts));
        {error, _} = E -> E
    end;
start(S, Opts) when is_map(S) ->
    case variation(S, maps:get(vary, Opts, #{})) of
        {ok, Vary} -> start_varied(S, Vary, Opts);
        {error, _} = E -> E
    end.

%% The variation of a run: the scenario's defaults with what is asked
%% for, each value checked against the scenario's `vary'.
-spec variation(scenario(), #{atom() => term()}) ->
    {ok, #{atom() => term()}} | {error, {beamdiag_lab, term()}}.
variation(S = #{name := Name}, Asked) when is_map(Asked) ->
    Spec = maps:get(vary, S, #{}),
    Defaults = maps:map(fun(_, #{default := D}) -> D end, Spec),
    case [{K, V} || {K, V} <- maps:to_list(Asked), not allowed(maps:get(K, Spec, none), V)] of
        [] -> {ok, maps:merge(Defaults, Asked)};
        [{K, V} | _] -> {error, {?MODULE, {bad_variation, Name, K, V, maps:keys(Spec)}}}
    end.

%% @doc A variation as a user writes it, `KEY=VALUE,...' (`writers=64,
%% table=bag'), read against the scenario's `vary': a number where the
%% key takes numbers, else one of the key's named values.
-spec parse_variation(scenario(), string()) ->
    {ok, #{atom() => term()}} | {error, {beamdiag_lab, term()}}.
parse_variation(S = #{name := Name}, Text) ->
    Spec = maps:get(vary, S, #{}),
    Known = maps:keys(Spec),
    Read = [{P, pair(Spec, string:split(P, "="))} || P <- string:lexemes(Text, ", ")],
    case [P || {P, bad} <- Read] of
        [] -> variation(S, maps:from_list([KV || {_, KV} <- Read]));
        [Bad | _] -> {error, {?MODULE, {bad_variation, Name, Bad, Known}}}
    end.

pair(Spec, [K, V]) ->
    case [Key || Key <- maps:keys(Spec), atom_to_list(Key) =:= string:trim(K)] of
        [Key] ->
            case value(maps:get(Key, Spec), string:trim(V)) of
                {bad, _} -> bad;
                Value -> {Key, Value}
            end;
        [] ->
            bad
    end;
pair(_Spec, _) ->
    bad.

value(#{values := Values}, V) ->
    Named = [A || A <- Values, is_atom(A), atom_to_list(A) =:= V],
    case {Named, string:to_integer(V)} of
        {[A], _} -> A;
        {[], {N, []}} -> N;
        _ -> {bad, V}
    end.

allowed(none, _V) -> false;
allowed(#{default := V}, V) -> true;
allowed(#{values := Values}, V) ->
    lists:any(fun({integer, Min, Max}) -> is_integer(V) andalso V >= Min andalso V =< Max;
                 (A) -> A =:= V
              end, Values).

start_varied(S = #{name := Name, emu_args := Args0, load := {Mod, Fun, FArgs}}, Vary, Opts) ->
    Duration = maps:get(duration, Opts, ?DEFAULT_DURATION),
    Args = Args0 ++ case maps:get(schedulers, Vary, host) of
                        N when is_integer(N) -> ["+S", lists:concat([N, ":", N])];
                        _ -> []
                    end
                 ++ case maps:get(busy_wait, Vary, default) of
                        none -> ["+sbwt", "none", "+sbwtdcpu", "none", "+sbwtdio", "none"];
                        _ -> []
                    end,
    Cookie = list_to_atom("lab_" ++ integer_to_list(erlang:unique_integer([positive])) ++
                          "_" ++ integer_to_list(rand:uniform(1 bsl 40))),
    NodeName = list_to_atom(lists:concat(["beamdiag_lab_", Name, "_", os:getpid(), "_",
                                          erlang:unique_integer([positive])])),
    EmuType = case maps:get(emu_type, S, undefined) of
                  lcnt -> ["-emu_type", "lcnt"];
                  _ -> []
              end,
    PeerArgs = EmuType ++ ["-setcookie", atom_to_list(Cookie), "-hidden"] ++ Args ++
               maps:get(extra_args, Opts, []),
    PeerOpts = maps:merge(#{name => NodeName, connection => standard_io, args => PeerArgs,
                            wait_boot => 30000},
                          maps:with([exec], Opts)),
    %% peer raises when the node's emulator exits at boot (no lock-counting
    %% emulator in that release, say): an error like any other.
    Started = try peer:start(PeerOpts) catch exit:Why -> {error, Why} end,
    case Started of
        {ok, Peer, Node} ->
            Lab0 = #{scenario => S, node => Node, peer => Peer, cookie => Cookie, vary => Vary},
            case setup(Lab0, Mod, Fun, FArgs, Duration) of
                {ok, Lab} ->
                    timer:sleep(maps:get(warmup_ms, S, 1500)),
                    {ok, Lab};
                {error, _} = E ->
                    stop(Lab0),
                    E
            end;
        {error, Reason} ->
            {error, {beamdiag_lab, {peer_start, Name, Reason}}}
    end.

%% @doc Stops the workload, the node, the competitor and removes the cgroup.
-spec stop(lab()) -> ok.
stop(Lab = #{peer := Peer, scenario := S}) ->
    %% A workload with helpers outside the node (a redis-server) stops
    %% them itself before the node goes.
    case maps:find(stop, S) of
        {ok, {M, F, A}} -> catch peer:call(Peer, M, F, A, 15000);
        error -> ok
    end,
    case maps:find(release, S) of
        {ok, {RM, RF, RA}} -> catch apply(RM, RF, RA ++ [Lab]);
        error -> ok
    end,
    case {maps:get(hard_stop, S, false), maps:find(os_pid, Lab)} of
        {true, {ok, OsPid}} -> kill9(OsPid);
        _ -> ok
    end,
    catch peer:stop(Peer),
    remove_perf_files(S, maps:find(os_pid, Lab)),
    case maps:find(competitor, Lab) of
        {ok, C} -> catch peer:stop(C);
        error -> ok
    end,
    case maps:find(cgroup, Lab) of
        {ok, Dir} -> remove_cgroup(Dir);
        error -> ok
    end,
    ok.

%% A node started with +JPperf writes its perf map and its jitdump into
%% /tmp, named by its OS pid, and never removes them (6 to 16 MB a node):
%% the lab's nodes leave none behind.
remove_perf_files(#{emu_args := Args}, {ok, OsPid}) ->
    case lists:member("+JPperf", Args) of
        true ->
            _ = [file:delete(F) || F <- ["/tmp/perf-" ++ OsPid ++ ".map",
                                          "/tmp/jit-" ++ OsPid ++ ".dump"]],
            ok;
        false ->
            ok
    end;
remove_perf_files(_, _) ->
    ok.

%% @doc The lab node's name.
-spec node(lab()) -> node().
node(#{node := N}) -> N.

%% @doc The lab node's cookie.
-spec cookie(lab()) -> atom().
cookie(#{cookie := C}) -> C.

%% @doc Turns an error reason of this module into a sentence.
-spec format_error(term()) -> iolist().
format_error({unknown_scenario, N, Known}) ->
    io_lib:format("no lab scenario '~ts'; known: ~ts",
                  [beamdiag_safe_text:safe(N, 60), lists:join(", ", [atom_to_list(K) || K <- Known])]);
format_error({bad_variation, Name, Text, Known}) ->
    io_lib:format("the ~s scenario cannot vary '~ts'; it varies: ~ts",
                  [Name, beamdiag_safe_text:safe(Text, 60), varies(Known)]);
format_error({bad_variation, Name, K, V, Known}) ->
    io_lib:format("the ~s scenario cannot vary ~ts as ~ts; it varies: ~ts",
                  [Name, beamdiag_safe_text:safe(io_lib:format("~0tp", [K]), 40),
                   beamdiag_safe_text:safe(io_lib:format("~0tp", [V]), 40), varies(Known)]);
format_error({peer_start, Name, Reason}) ->
    io_lib:format("cannot start the ~s lab node: ~0P~ts", [Name, Reason, 12, lcnt_hint(Name)]);
format_error({load, Why}) ->
    ["lab node: ", beamdiag_loader:format_error(Why)];
format_error({cgroup, Why}) ->
    io_lib:format("cannot set up a CPU-quota cgroup (needs root and a writable cgroup "
                  "hierarchy): ~p", [Why]);
format_error({params, Name, Bad}) ->
    io_lib:format("the ~s scenario does not take these parameters: ~0P", [Name, Bad, 12]);
format_error({workload, Reason}) ->
    io_lib:format("the workload did not start: ~p", [Reason]).

%%%===================================================================
%%% Internal
%%%===================================================================

setup(Lab = #{peer := Peer, scenario := S}, Mod, Fun, FArgs, Duration) ->
    Steps = [
        fun(L) -> {ok, L#{os_pid => peer:call(Peer, os, getpid, [], 30000)}} end,
        %% The workload's module and any others it needs.
        fun(L) -> load_all(Peer, lists:usort([Mod | maps:get(modules, S, [])]), L) end,
        fun(L) -> prepare(S, L) end,
        fun(L) -> cgroup(S, L, Duration) end,
        fun(L) -> competitor(S, L, Duration) end,
        fun(L) ->
            %% The atom '$duration_ms' in a scenario's arguments stands for the
            %% workload's time bound, '$cookie' for the node's cookie.
            Args = [case A of
                        '$duration_ms' -> Duration * 1000;
                        '$prepared' -> maps:get(prepared, L);
                        '$vary' -> maps:get(vary, L);
                        '$params' -> maps:get(params, S);
                        '$cookie' -> maps:get(cookie, L);
                        _ -> A
                    end || A <- FArgs],
            case catch peer:call(Peer, Mod, Fun, Args, 30000) of
                ok -> {ok, L};
                {ok, _} -> {ok, L};
                Other -> {error, {beamdiag_lab, {workload, Other}}}
            end
        end
    ],
    lists:foldl(fun(Step, {ok, L}) -> Step(L); (_, E) -> E end, {ok, Lab}, Steps).

%% A variation: only a scenario with parameters takes one, checked by
%% its load module.
params(#{params := Defaults}, Mod, P) when is_map(P) ->
    {module, Mod} = code:ensure_loaded(Mod),
    Mod:params(maps:merge(Defaults, P));
params(#{name := Name}, _Mod, P) ->
    {error, {beamdiag_lab, {params, Name, P}}}.

%% Ships modules with the one loader for every node, so the lab runs on
%% another OTP release too; the node dies with the lab, and the modules
%% with it.
load_all(Peer, Mods, Lab) ->
    case beamdiag_loader:load({peer, Peer}, Mods) of
        {ok, _} -> {ok, Lab};
        {error, {beamdiag_loader, Why}} -> {error, {beamdiag_lab, {load, Why}}}
    end.

%% The scenario's step on this host before its workload (a NIF built).
prepare(#{prepare := {M, F, A}}, Lab) ->
    case apply(M, F, A) of
        {ok, Value} -> {ok, Lab#{prepared => Value}};
        {error, _} = E -> E
    end;
prepare(_, Lab) ->
    {ok, Lab}.

%% SIGKILL to the node's OS process, then wait (up to 5 s) until it is gone.
kill9(OsPid) ->
    _ = os:cmd("kill -9 " ++ OsPid ++ " 2>/dev/null"),
    wait_gone(OsPid, 50).

wait_gone(_OsPid, 0) ->
    ok;
wait_gone(OsPid, N) ->
    case filelib:is_dir("/proc/" ++ OsPid) of
        true -> timer:sleep(100), wait_gone(OsPid, N - 1);
        false -> ok
    end.

%% A second node that burns the given number of CPUs, competing with the lab
%% node for the host's cores.
competitor(#{competitor := #{cpus := N}}, Lab, Duration) ->
    Name = list_to_atom(lists:concat(["beamdiag_lab_competitor_", os:getpid(), "_",
                                      erlang:unique_integer([positive])])),
    case peer:start(#{name => Name, connection => standard_io,
                      args => ["-hidden", "+S", integer_to_list(N)]}) of
        {ok, C, _} ->
            Lab2 = Lab#{competitor => C},
            case load_all(C, [beamdiag_lab_ledger], Lab2) of
                {ok, _} ->
                    ok = peer:call(C, beamdiag_lab_ledger, burn, [Duration * 1000, N * 2]),
                    {ok, Lab2};
                E ->
                    E
            end;
        {error, Reason} ->
            {error, {beamdiag_lab, {peer_start, competitor, Reason}}}
    end;
competitor(_, Lab, _) ->
    {ok, Lab}.

%% Puts the lab node into a cgroup of its own with a CPU quota.
cgroup(#{cgroup := #{quota_cpus := Q}}, Lab = #{peer := Peer}, _Parent) ->
    OsPid = peer:call(Peer, os, getpid, []),
    case cgroup_dir() of
        {ok, Version, Base} ->
            Dir = filename:join(Base, "beamdiag_lab_" ++ OsPid),
            Period = 100000,
            Quota = integer_to_list(round(Q * Period)),
            Writes =
                case Version of
                    1 -> [{"cpu.cfs_period_us", integer_to_list(Period)},
                          {"cpu.cfs_quota_us", Quota},
                          {"cgroup.procs", OsPid}];
                    2 -> [{"cpu.max", Quota ++ " " ++ integer_to_list(Period)},
                          {"cgroup.procs", OsPid}]
                end,
            case file:make_dir(Dir) of
                R when R =:= ok; R =:= {error, eexist} ->
                    case write_all(Dir, Writes) of
                        ok -> {ok, Lab#{cgroup => Dir}};
                        {error, Why} ->
                            remove_cgroup(Dir),
                            {error, {beamdiag_lab, {cgroup, Why}}}
                    end;
                {error, Why} ->
                    {error, {beamdiag_lab, {cgroup, Why}}}
            end;
        {error, Why} ->
            {error, {beamdiag_lab, {cgroup, Why}}}
    end;
cgroup(_, Lab, _) ->
    {ok, Lab}.

%% The CPU cgroup of this process, where the lab's own cgroup goes.
cgroup_dir() ->
    case beamdiag_agent_cgroup:locate("/proc", os:getpid()) of
        {ok, #{version := V, dir := D}} -> {ok, V, D};
        {error, {_, Why}} -> {error, Why}
    end.

write_all(_Dir, []) ->
    ok;
write_all(Dir, [{F, V} | Rest]) ->
    case file:write_file(filename:join(Dir, F), V) of
        ok -> write_all(Dir, Rest);
        {error, Why} -> {error, {F, Why}}
    end.

%% The node is stopped by now; an empty cgroup can be removed. Retry while
%% the kernel finishes moving the exiting threads out.
remove_cgroup(Dir) ->
    remove_cgroup(Dir, 20).

remove_cgroup(Dir, 0) ->
    _ = file:del_dir(Dir),
    ok;
remove_cgroup(Dir, N) ->
    case file:del_dir(Dir) of
        ok -> ok;
        {error, enoent} -> ok;
        {error, _} ->
            timer:sleep(100),
            remove_cgroup(Dir, N - 1)
    end.

varies([]) -> "nothing";
varies(Known) -> lists:join(", ", [atom_to_list(A) || A <- lists:sort(Known)]).

%% A scenario on the lock-counting emulator fails to boot where that OTP
%% has none: say how to check and build it.
lcnt_hint(Name) ->
    case scenario(atom_to_list(Name)) of
        {ok, #{emu_type := lcnt}} ->
            "; it runs `erl -emu_type lcnt': `beamdiag emu-type status' says whether that "
            "OTP has the lock-counting emulator, `beamdiag emu-type build --install' builds it";
        _ ->
            ""
    end.

