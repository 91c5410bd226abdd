%%% @doc Puts beamdiag's code on another node, whatever OTP release it runs.
%%%
%%% Compiled code loads on the release that compiled it and on the two
%%% after it; OTP 29 refuses code compiled by OTP 25, and OTP 25 refuses
%%% code compiled by OTP 26 and later. A build holds its modules compiled
%%% by more than one release (`beamdiag_beams': the code path's beams, and
%%% OTP 27's beside them), so the loader first reads the target's release
%%% (one call that changes nothing), then decides with `plan/1':
%%%
%%% <ul>
%%% <li>`{beams, Release}': the set compiled by that release loads there;
%%%     its beams go over and load with `erlang:load_module/2' (not through
%%%     the code server: see atomic_load/2). Nothing on the target
%%%     compiles anything.</li>
%%% <li>`compile': no set loads there (a library build without the other
%%%     sets, or a release past every window), but the target has the
%%%     compiler: each module's abstract code (from its debug_info) goes
%%%     over and `compile:forms/2' compiles it there, all modules at once,
%%%     bounded by a timeout; the result is loaded.</li>
%%% <li>`{refuse, _}': neither; nothing is loaded and the error says which
%%%     release each side runs and what to do.</li>
%%% </ul>
%%%
%%% Nothing is tried and caught: a refused load would make the target log
%%% an error report. A module the target already runs in the same version
%%% is used as it is and left alone; another version is refused rather
%%% than replaced. `unload/2' removes what `load/2' loaded.
%%%
%%% The target is a node (calls at high priority, beamdiag_rpc) or an OTP `peer' started by this
%%% node (`{peer, Pid}', calls over its control connection, as the lab does).
%%%
%%% ```
%%% 1> beamdiag_loader:plan(#{sets => [25, 27], target => 29, compiler => false}).
%%% {beams, 27}
%%% 2> {ok, Loaded} = beamdiag_loader:load('app@host', beamdiag_agent:modules()).
%%% 3> beamdiag_loader:unload('app@host', Loaded).
%%% '''
-module(beamdiag_loader).

-export([load/2, unload/2, warm/0, format_error/1]).
-export([objects/1, load_objects/2]).

-export_type([target/0, plan/0, objects/0]).

-ifdef(TEST).
-export([plan/1, built_on/1]).
-endif.

-type target() :: node() | {peer, pid()}.
-type plan() :: {beams, beamdiag_beams:release()} | compile
              | {refuse, no_compiler | unknown_build}.
%% The code of a set of modules, read once (objects/1) for many targets:
%% the code path's beams as built (their abstract code, for a target that
%% compiles them), and each set's beams as they go over (the code path's
%% stripped of everything but what loading needs: a quarter of the bytes).
-opaque objects() :: #{objects := [{module(), binary(), file:filename()}],
                       requested := [module()],
                       sets := [{beamdiag_beams:release(),
                                 {ok, [{module(), binary(), file:filename()}]}
                                 | {error, {module(), term()}}}]}.

%% Each remote call the loader makes. On a node whose schedulers are all
%% busy, on a host that is itself overloaded, the call's process waits for
%% a scheduler: 5 s proved too short under a load average of 30 on 2 cores.
-define(CALL_TIMEOUT, 10000).
%% The release read: its wait, and the retry's.
-define(FACTS_WAITS, [2000, 3000]).
%% How long a session waits for the agent of a previous one to delete and
%% purge its modules (a throttled node takes seconds), and how often it
%% looks.
-define(SETTLE_MS, 5000).
-define(SETTLE_POLL_MS, 200).
%% Compiling every agent module on a busy target: the bound of the whole.
-define(COMPILE_TIMEOUT, 20000).
%% The module that loads the others on the target in one commit (see
%% atomic_load/2); it goes first, and goes again when the caller did not
%% ask for it.
-define(KIT, beamdiag_agent_code).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Loads the modules onto the target; returns those it loaded (and so
%% must unload). On this node itself it only makes sure they are loaded.
-spec load(target(), [module()]) -> {ok, [module()]} | {error, {module(), term()}}.
load(Node, Mods) when Node =:= node() ->
    _ = [code:ensure_loaded(M) || M <- Mods],
    {ok, []};
load(Target, Mods) ->
    case objects(Mods) of
        {ok, Objects} -> load_objects(Target, Objects);
        {error, _} = E -> E
    end.

%% @doc The modules' code, read once for `load_objects/2' on many targets:
%% the code path's beams as built (for a target that compiles them), and
%% the beams of every set of this build (`beamdiag_beams') as they go over
%% (the code path's stripped of everything but what loading needs: a
%% quarter of the bytes).
-spec objects([module()]) -> {ok, objects()} | {error, {module(), term()}}.
objects(Requested) ->
    Mods = [?KIT | lists:delete(?KIT, Requested)],
    case beamdiag_beams:code_path(Mods) of
        {ok, Objects} ->
            Built = built_on(element(2, hd(Objects))),
            Stripped = [begin
                            {ok, {M, S}} = beam_lib:strip(Bin),
                            {M, S, File}
                        end || {M, Bin, File} <- Objects],
            %% A set without one of the modules (not one of this build's)
            %% is left out: the code path's set or the target's compiler
            %% serves them.
            Others = [{R, Set} || R <- beamdiag_beams:releases(), R =/= Built,
                                  Set <- [beamdiag_beams:objects(R, Mods)],
                                  not is_not_in_set(Set)],
            {ok, #{objects => Objects, requested => Requested,
                   sets => [{Built, {ok, Stripped}} | Others]}};
        {error, _} = E ->
            E
    end.

%% @doc As `load/2', with the code read once by `objects/1'.
-spec load_objects(target(), objects()) -> {ok, [module()]} | {error, {module(), term()}}.
load_objects(Node, #{objects := Objects}) when Node =:= node() ->
    _ = [code:ensure_loaded(M) || {M, _, _} <- Objects],
    {ok, []};
load_objects(Target, Code = #{requested := Requested}) ->
    case load_plan(Target, Code) of
        {ok, Loaded} ->
            case lists:member(?KIT, Loaded) andalso not lists:member(?KIT, Requested) of
                true ->
                    unload(Target, [?KIT]),
                    {ok, lists:delete(?KIT, Loaded)};
                false ->
                    {ok, Loaded}
            end;
        {error, _} = E ->
            E
    end.

load_plan(Target, #{objects := Objects, sets := Sets}) ->
    Releases = [R || {R, _} <- Sets],
    case target_facts(Target, Releases) of
        {ok, Release, Compiler} ->
            Facts = #{sets => Releases, target => Release, compiler => Compiler},
            case plan(Facts) of
                {refuse, Why} ->
                    {error, {?MODULE, {refuse, Why, name(Target), Facts#{runs_on => release()}}}};
                {beams, R} ->
                    case proplists:get_value(R, Sets) of
                        {ok, Beams} -> load_each(Target, [{M, B, F, undefined} || {M, B, F} <- Beams]);
                        {error, _} = E -> E
                    end;
                compile ->
                    ship(compile, Target, Objects)
            end;
        {error, _} = E ->
            E
    end.

%% @doc Removes modules this session loaded onto the target, with the
%% BIFs the code server itself calls (see atomic_load/2): through the
%% kit (beamdiag_agent_code) when this session loaded it too, else one call
%% a module.
-spec unload(target(), [module()]) -> ok.
unload(Node, _Mods) when Node =:= node() ->
    ok;
unload(Target, Mods) ->
    case lists:member(?KIT, Mods) of
        true ->
            %% The kit is ours to remove: it removes them all, in a process
            %% of its own on the target (a removal waits for every
            %% scheduler, seconds on a node with one held).
            _ = (catch call(Target, erlang, spawn, [?KIT, unload, [[M || M <- Mods, M =/= ?KIT] ++ [?KIT]]],
                            ?CALL_TIMEOUT)),
            ok;
        false ->
            _ = [catch call(Target, erlang, delete_module, [M], ?CALL_TIMEOUT) || M <- Mods],
            _ = [catch call(Target, erlang, purge_module, [M], ?CALL_TIMEOUT) || M <- Mods],
            ok
    end.

%% @doc The version decision (pure). `sets': the releases whose compilers
%% compiled this build's sets (`unknown' when it cannot be told);
%% `target': the target's release; `compiler': whether the compiler
%% application is on the target's code path. Code loads on the release
%% that compiled it and the two after it: the newest set that loads there
%% goes over as beams; failing that, the code is compiled on the target,
%% or refused.
-spec plan(#{sets := [beamdiag_beams:release()], target := pos_integer(),
             compiler := boolean() | unknown}) -> plan().
plan(#{sets := Sets, target := Target, compiler := Compiler}) ->
    Loadable = lists:reverse(lists:sort([R || R <- Sets, is_integer(R), Target >= R,
                                              Target =< R + 2])),
    case {Loadable, Compiler} of
        {[R | _], _} -> {beams, R};
        {[], true} -> compile;
        {[], false} ->
            case [R || R <- Sets, is_integer(R)] of
                [] -> {refuse, unknown_build};
                _ -> {refuse, no_compiler}
            end
    end.

%% @doc The OTP release whose compiler compiled a beam: this node's own
%% release when its compiler is the same version, else the release known
%% to ship that compiler version, else `unknown'.
-spec built_on(binary()) -> pos_integer() | unknown.
built_on(Beam) ->
    case beam_lib:chunks(Beam, [compile_info]) of
        {ok, {_, [{compile_info, Info}]}} ->
            case proplists:get_value(version, Info) of
                V when is_list(V) -> beamdiag_beams:release_of_compiler(V);
                _ -> unknown
            end;
        {error, beam_lib, _} ->
            unknown
    end.

%% @doc Turns an error reason of this module into a sentence.
-spec format_error(term()) -> iolist().
format_error({refuse, no_compiler, Node, #{sets := Sets, target := T, runs_on := R}}) ->
    io_lib:format("cannot load the agent onto ~s: it runs OTP ~b, which cannot load the code "
                  "this beamdiag holds (~ts; this beamdiag runs on OTP ~b), and has no compiler "
                  "application on its code path to compile it there; use a beamdiag that holds "
                  "code compiled by OTP ~ts (make build with the OTP 27 root of "
                  "scripts/otp-root.sh trixie covers OTP 25 to 29), or add the compiler "
                  "application to the node's release",
                  [Node, T, windows(Sets), R, loadable_builds(T)]);
format_error({refuse, unknown_build, Node, #{target := T, runs_on := R}}) ->
    io_lib:format("cannot load the agent onto ~s: it runs OTP ~b and has no compiler "
                  "application on its code path, and the OTP release that compiled this "
                  "beamdiag (running on OTP ~b) is not known; use a beamdiag built on OTP ~ts, "
                  "or add the compiler application to the node's release",
                  [Node, T, R, loadable_builds(T)]);
format_error({target_facts, Node, {timeout, Waits}}) ->
    io_lib:format("~s did not answer the release read within ~ts (tried ~s): it is overloaded "
                  "or a scheduler is held (a NIF that does not yield); run beamdiag on its "
                  "host for a host-side view", [Node, waits(Waits), times(length(Waits))]);
format_error({target_facts, Node, {noconnection, _}}) ->
    io_lib:format("~s went away during the release read (the connection dropped)", [Node]);
format_error({target_facts, Node, {Class, Why}}) ->
    io_lib:format("cannot read the OTP release of ~s: the call failed (~ts)",
                  [Node, short(Class, Why)]);
format_error({no_abstract_code, Mod}) ->
    io_lib:format("~s was built without debug_info, so it cannot be compiled on the target",
                  [Mod]);
format_error({compile_failed, Node, Mod, Why}) ->
    io_lib:format("compiling ~s on ~s failed: ~P", [Mod, Node, Why, 20]);
format_error({version_conflict, Node, Mod}) ->
    io_lib:format("~s already runs a different version of ~s; refusing to replace it",
                  [Node, Mod]);
format_error({busy, Node, Ms, true}) ->
    io_lib:format("another beamdiag session is running on ~s: its agent was still there after "
                  "~.1f s; run one session at a time", [Node, Ms / 1000]);
format_error({busy, Node, Ms, false}) ->
    io_lib:format("the modules of a previous beamdiag session on ~s were still being removed "
                  "after ~.1f s; try again in a few seconds", [Node, Ms / 1000]);
format_error({load_failed, Node, Mod, Why}) ->
    io_lib:format("cannot load ~s onto ~s: ~P", [Mod, Node, Why, 20]).

%% @doc Loads beamdiag's own modules here, where the report is made: a
%% library user's node loads them on first use (the escript loads them
%% all at its start, beamdiag_beams), and otherwise the first analysis,
%% at the window's end, waits for them (measured: 68 ms for one report's
%% modules on an idle host; 0.5 s for a cluster's 77 modules on a busy
%% 2-core host). Called in a process of its own while a window runs.
-spec warm() -> ok.
warm() ->
    Mods = [list_to_atom(N) || {N, _, false} <- code:all_available(), lists:prefix("beamdiag", N)],
    _ = code:ensure_modules_loaded(Mods),
    ok.

%%%===================================================================
%%% Internal
%%%===================================================================

%% The target's release, and whether it can compile only when no set of
%% beams loads there: each read with a timeout and one retry
%% (?FACTS_WAITS), so a node that is only slow answers the second, and one
%% that cannot answer costs seconds, not ten. The compiler check asks the
%% code server, which searches the code path for a module not loaded
%% (measured: 2.4 to 5 s on a node whose schedulers a mailbox flood keeps
%% busy, where the release read took 0 to 60 ms). Nothing is loaded or
%% changed there.
target_facts(Target, Sets) ->
    case bounded(Target, erlang, system_info, [otp_release], ?FACTS_WAITS, []) of
        {ok, Rel} ->
            Release = list_to_integer(Rel),
            case plan(#{sets => Sets, target => Release, compiler => false}) of
                {beams, _} ->
                    {ok, Release, unknown};
                _ ->
                    case bounded(Target, code, which, [compile], ?FACTS_WAITS, []) of
                        {ok, Which} -> {ok, Release, is_list(Which)};
                        {error, _} = E -> E
                    end
            end;
        {error, _} = E ->
            E
    end.

bounded(Target, M, F, A, [Wait | More], Tried) ->
    try call(Target, M, F, A, Wait) of
        V -> {ok, V}
    catch
        error:{erpc, timeout} when More =/= [] ->
            bounded(Target, M, F, A, More, [Wait | Tried]);
        error:{erpc, timeout} ->
            {error, {?MODULE, {target_facts, name(Target),
                               {timeout, lists:reverse([Wait | Tried])}}}};
        exit:{timeout, _} when More =/= [] ->
            bounded(Target, M, F, A, More, [Wait | Tried]);
        exit:{timeout, _} ->
            {error, {?MODULE, {target_facts, name(Target),
                               {timeout, lists:reverse([Wait | Tried])}}}};
        error:{erpc, noconnection} ->
            {error, {?MODULE, {target_facts, name(Target), {noconnection, Tried}}}};
        Class:Why ->
            {error, {?MODULE, {target_facts, name(Target), {Class, Why}}}}
    end.


waits(Waits) ->
    lists:join(" and ", [io_lib:format("~.1f s", [W / 1000]) || W <- Waits]).

times(1) -> "once";
times(2) -> "twice";
times(N) -> io_lib:format("~b times", [N]).

short(Class, Why) ->
    io_lib:format("~0tP", [{Class, Why}, 8]).

ship(compile, Target, Objects) ->
    case abstract_code(Objects, []) of
        {ok, Forms} ->
            case compile_all(Target, Forms) of
                {ok, Compiled} -> load_each(Target, Compiled);
                {error, _} = E -> E
            end;
        {error, _} = E ->
            E
    end.

abstract_code([], Acc) ->
    {ok, lists:reverse(Acc)};
abstract_code([{M, Bin, File} | Rest], Acc) ->
    case beam_lib:chunks(Bin, [abstract_code]) of
        {ok, {M, [{abstract_code, {raw_abstract_v1, Forms}}]}} ->
            abstract_code(Rest, [{M, Forms, File} | Acc]);
        _ ->
            {error, {?MODULE, {no_abstract_code, M}}}
    end.

%% Every module compiled on the target at once (one process there each),
%% so that on a busy node they wait for a scheduler side by side; the whole
%% is bounded: past the bound nothing is loaded (a compile still running
%% there ends on its own, its result unused). Each result comes back with its md5 as the target's loader
%% will see it, for the already-loaded check.
compile_all(Target, Forms) ->
    Deadline = erlang:monotonic_time(millisecond) + ?COMPILE_TIMEOUT,
    Self = self(),
    Jobs = [{M, File, spawn_monitor(fun() ->
                 Self ! {self(), compile_one(Target, M, Fs)}
             end)} || {M, Fs, File} <- Forms],
    collect(Target, Jobs, Deadline, []).

%% The compile runs at high priority, in the calling process itself, as
%% the agent does: on a saturated node it would otherwise queue behind
%% every runnable process. erl_eval (stdlib) sets the priority there, since
%% nothing of ours is loaded yet. Optimisation passes are left out: they
%% more than double the compile's CPU time and the agent's hot path is
%% BIFs and file reads; an older compiler ignores options it does not know.
compile_one(Target, M, Forms) ->
    Opts = [binary, return_errors, deterministic, no_spawn_compiler_process,
            no_ssa_opt, no_type_opt, no_bsm_opt],
    {ok, Tokens, _} = erl_scan:string(
        "process_flag(priority, high), compile:forms(Forms, Opts)."),
    {ok, Exprs} = erl_parse:parse_exprs(Tokens),
    %% Bindings as an orddict, which erl_eval takes on every release.
    Bindings = [{'Forms', Forms}, {'Opts', Opts}],
    try call(Target, erl_eval, exprs, [Exprs, Bindings], ?COMPILE_TIMEOUT) of
        {value, {ok, M, Bin}, _} ->
            {ok, Bin, call(Target, beam_lib, md5, [Bin], ?CALL_TIMEOUT)};
        {value, {ok, M, Bin, _Warnings}, _} ->
            {ok, Bin, call(Target, beam_lib, md5, [Bin], ?CALL_TIMEOUT)};
        {value, Other, _} ->
            {error, Other}
    catch
        Class:Why -> {error, {Class, Why}}
    end.

collect(_Target, [], _Deadline, Acc) ->
    {ok, lists:reverse(Acc)};
collect(Target, [{M, File, {Pid, MRef}} | Rest], Deadline, Acc) ->
    Left = beamdiag_agent_deadline:left(Deadline),
    receive
        {Pid, {ok, Bin, {ok, {M, Md5}}}} ->
            erlang:demonitor(MRef, [flush]),
            collect(Target, Rest, Deadline, [{M, Bin, File, Md5} | Acc]);
        {Pid, Other} ->
            erlang:demonitor(MRef, [flush]),
            stop_jobs(Rest),
            {error, {?MODULE, {compile_failed, name(Target), M, Other}}};
        {'DOWN', MRef, process, Pid, Why} ->
            stop_jobs(Rest),
            {error, {?MODULE, {compile_failed, name(Target), M, {down, Why}}}}
    after Left ->
        stop_jobs([{M, File, {Pid, MRef}} | Rest]),
        {error, {?MODULE, {compile_failed, name(Target), M, timeout}}}
    end.

stop_jobs(Jobs) ->
    _ = [begin
             exit(Pid, kill),
             erlang:demonitor(MRef, [flush]),
             receive {Pid, _} -> ok after 0 -> ok end
         end || {_, _, {Pid, MRef}} <- Jobs],
    ok.

%% Which modules are there already, in one call; the others loaded in one
%% more (atomic_load/2): two round trips instead of two or three a
%% module, each a wait for a scheduler on a busy node. The check asks BIFs
%% only, not the code server (a call to a code server that waits behind
%% busy processes for each module cost 2.2 s for ten modules on a
%% saturated lock-counting node). Modules a running agent may still
%% delete are not trusted: see settled/3. Items are {Module, Beam, File,
%% Md5}, the md5 as the target's loader gives it when known, else
%% `undefined': then the target computes it for a module it has already.
load_each(Target, Items) ->
    Mods = [M || {M, _, _, _} <- Items],
    case settled(Target, Mods, erlang:monotonic_time(millisecond) + ?SETTLE_MS) of
        {ok, Flags} ->
            Present = target_md5s(Target, [I || {I, true} <- lists:zip(Items, Flags)]),
            Missing = [I || {I, false} <- lists:zip(Items, Flags)],
            case [M || {M, _, _, Md5} <- Present, remote_md5(Target, M) =/= {ok, Md5}] of
                [M | _] ->
                    {error, {?MODULE, {version_conflict, name(Target), M}}};
                [] ->
                    atomic_load(Target, Missing)
            end;
        {error, _} = E ->
            E;
        unknown ->
            load_one_by_one(Target, target_md5s(Target, Items), [])
    end.

%% The md5 of each beam as the target's loader computes it (beam_lib:md5/1
%% there gives the same as module_info(md5) of the loaded module; this
%% node's release may compute another for code of another release), in
%% one call, for those not known yet.
target_md5s(_Target, []) ->
    [];
target_md5s(Target, Items) ->
    Unknown = [Bin || {_, Bin, _, undefined} <- Items],
    Md5s = case Unknown of
               [] -> [];
               _ -> case catch call(Target, lists, map, [fun beam_lib:md5/1, Unknown],
                                    ?CALL_TIMEOUT) of
                        L when is_list(L), length(L) =:= length(Unknown) -> L;
                        _ -> [error || _ <- Unknown]
                    end
           end,
    fill_md5s(Items, Md5s).

fill_md5s([], _) ->
    [];
fill_md5s([{M, Bin, File, undefined} | Rest], [R | Md5s]) ->
    Md5 = case R of
              {ok, {M, V}} -> V;
              _ -> unknown
          end,
    [{M, Bin, File, Md5} | fill_md5s(Rest, Md5s)];
fill_md5s([Item | Rest], Md5s) ->
    [Item | fill_md5s(Rest, Md5s)].

%% Whether each module is loaded, once no agent is left that may still
%% delete it. An agent registers itself (beamdiag_agent:init/4) until it
%% has deleted the modules it loaded, and its purges leave old code until
%% they are done; a session that reused modules found loaded while an agent
%% was ending would lose them mid-window (undef), and one that loaded beside
%% old code could not delete its own code at its end. So while an agent
%% runs and some of the modules are loaded, or old code of one is left,
%% this waits (polling, bounded): the modules are then either gone and
%% loaded afresh, or left loaded on purpose (an agent on a very large node
%% leaves them, see beamdiag_agent) and reused. A purge waits for every
%% process of the node to say whether it runs the old code: on a saturated
%% node each takes seconds (3.1 s measured with 64 runnable writers on 2
%% schedulers), and a session right after another one there finds them
%% still under way.
settled(Target, Mods, Deadline) ->
    N = length(Mods),
    Args = [[M] || M <- Mods],
    Calls = [{erlang, F, A} || {F, A} <- [{module_loaded, A} || A <- Args] ++
                                         [{check_old_code, A} || A <- Args] ++
                                         [{whereis, [beamdiag_agent]}]],
    {Ms, Fs, As} = lists:unzip3(Calls),
    case catch call(Target, lists, zipwith3, [fun erlang:apply/3, Ms, Fs, As], ?CALL_TIMEOUT) of
        R when is_list(R), length(R) =:= 2 * N + 1 ->
            {Loaded, Rest} = lists:split(N, R),
            {Old, [Agent]} = lists:split(N, Rest),
            %% The kit serves only the load itself: found loaded beside a
            %% running agent (the Erlang sampler shipped beside a
            %% diagnosis's agent), it is used as it is.
            Kept = [L || {M, L} <- lists:zip(Mods, Loaded), M =/= ?KIT],
            Busy = lists:member(true, Old) orelse
                (is_pid(Agent) andalso lists:member(true, Kept)),
            Now = erlang:monotonic_time(millisecond),
            case Busy of
                false ->
                    {ok, Loaded};
                true when Now < Deadline ->
                    timer:sleep(min(?SETTLE_POLL_MS, Deadline - Now)),
                    settled(Target, Mods, Deadline);
                true ->
                    {error, {?MODULE, {busy, name(Target), ?SETTLE_MS, is_pid(Agent)}}}
            end;
        _ ->
            unknown
    end.

%% The modules are loaded without the code server, in two calls each run
%% at high priority (beamdiag_rpc): the kit (beamdiag_agent_code) with
%% `erlang:load_module/2', then every other module by the kit, prepared and
%% committed at once (`erlang:finish_loading/1'). The code server is a
%% process at normal priority: on a node with many runnable processes each
%% of its requests waits behind all of them (measured on a saturated
%% lock-counting node with 64 runnable writers on 2 schedulers: 18.8 s for
%% code:load_binary/3 of one small module, 39 ms for erlang:load_module/2;
%% 5.2 s for code:purge/1, 0.5 s for code:delete/1). And each commit waits
%% until every scheduler has passed through its loop: with one scheduler
%% held by a NIF 200 ms at a time, 0.5 s a module one by one (11.4 s for
%% twenty), 0.6 s for forty at once. The code server does not list modules
%% loaded so (code:all_loaded/0 leaves them out; erlang:module_loaded/1
%% sees them), and beamdiag removes them the same way. A module that fails
%% to load undoes the others.
atomic_load(_Target, []) ->
    {ok, []};
atomic_load(Target, Missing) ->
    {Kit, Others} = lists:partition(fun({M, _, _, _}) -> M =:= ?KIT end, Missing),
    case load_kit(Target, Kit) of
        ok ->
            Mods = [M || {M, _, _, _} <- Others],
            case kit_load(Target, Others) of
                ok ->
                    {ok, [M || {M, _, _, _} <- Kit] ++ Mods};
                {error, {M, What}} ->
                    unload(Target, [M1 || {M1, _, _, _} <- Kit]),
                    {error, {?MODULE, {load_failed, name(Target), M, What}}};
                Other ->
                    unload(Target, [M1 || {M1, _, _, _} <- Kit]),
                    {error, {?MODULE, {load_failed, name(Target), hd(Mods), Other}}}
            end;
        {error, _} = E ->
            E
    end.

kit_load(_Target, []) ->
    ok;
kit_load(Target, Others) ->
    catch call(Target, ?KIT, load, [[{M, Bin} || {M, Bin, _, _} <- Others]], ?CALL_TIMEOUT).

%% The kit, unless it is there already (checked by load_each/2).
load_kit(_Target, []) ->
    ok;
load_kit(Target, [{?KIT, Bin, _, _}]) ->
    case catch call(Target, erlang, load_module, [?KIT, Bin], ?CALL_TIMEOUT) of
        {module, ?KIT} -> ok;
        Other -> {error, {?MODULE, {load_failed, name(Target), ?KIT, Other}}}
    end.

is_not_in_set({error, {beamdiag_beams, {not_in_set, _, _}}}) -> true;
is_not_in_set(_) -> false.

load_one_by_one(_Target, [], Acc) ->
    {ok, lists:reverse(Acc)};
load_one_by_one(Target, [{M, Bin, _File, Md5} | Rest], Acc) ->
    case remote_md5(Target, M) of
        {ok, Md5} ->
            load_one_by_one(Target, Rest, Acc);
        {ok, _Other} ->
            unload(Target, Acc),
            {error, {?MODULE, {version_conflict, name(Target), M}}};
        missing ->
            case catch call(Target, erlang, load_module, [M, Bin], ?CALL_TIMEOUT) of
                {module, M} ->
                    load_one_by_one(Target, Rest, [M | Acc]);
                Other ->
                    unload(Target, Acc),
                    {error, {?MODULE, {load_failed, name(Target), M, Other}}}
            end
    end.

remote_md5(Target, M) ->
    case catch call(Target, erlang, module_loaded, [M], ?CALL_TIMEOUT) of
        true ->
            case catch call(Target, M, module_info, [md5], ?CALL_TIMEOUT) of
                Md5 when is_binary(Md5) -> {ok, Md5};
                _ -> missing
            end;
        _ ->
            missing
    end.

call(Node, M, F, A, Timeout) when is_atom(Node) ->
    beamdiag_rpc:call(Node, M, F, A, Timeout);
call({peer, Peer}, M, F, A, Timeout) ->
    peer:call(Peer, M, F, A, Timeout).

name({peer, Peer}) ->
    case catch peer:call(Peer, erlang, node, [], ?CALL_TIMEOUT) of
        N when is_atom(N) -> N;
        _ -> Peer
    end;
name(Node) ->
    Node.

release() ->
    list_to_integer(erlang:system_info(otp_release)).

%% The releases each set loads on, in words: "OTP 25's (loads on 25 to
%% 27) and OTP 27's (27 to 29)".
windows(Sets) ->
    Known = lists:sort([R || R <- Sets, is_integer(R)]),
    lists:join(" and ", [io_lib:format("code compiled by OTP ~b, which loads on OTP ~b to ~b",
                                       [R, R, R + 2]) || R <- Known]).

%% The releases whose compiled code the target's release loads.
loadable_builds(T) ->
    io_lib:format("~b to ~b", [T - 2, T]).
