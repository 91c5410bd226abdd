%%% @doc Experiments: does a change of emulator flags (or of workload) really
%%% help under the same load? Runs each arm on fresh nodes, alternately, and
%%% reports every figure against the first arm with a confidence interval.
%%%
%%% An arm is a workload and a variant (a string of emulator flags,
%%% `"default"' for none). Each run starts a fresh lab node with the arm's
%%% flags, starts the closed-loop driver on it (`beamdiag_agent_workload': C
%%% workers each calling the unit of work again and again), lets it warm
%%% up, then measures for the window while diagnosing the node for the
%%% ledger. The statistics come from `beamdiag_stats', the text and JSON
%%% from `beamdiag_format_experiment'.
%%% Runs go A B A B ... so that drift of the host cancels out.
%%%
%%% Per run: throughput (units/s), OS CPU seconds per unit (the ledger's
%%% on-CPU time of every thread over the window, divided by the units done
%%% in it), scheduler utilization (busy share of the normal schedulers),
%%% the node's CPUs, and latency p50/p99/p99.9 of a unit. Each arm is
%%% compared with the first by a paired bootstrap over runs (run i of the
%%% arm against run i of the first arm, 2000 resamples, fixed seed) of the
%%% relative change of the means, with its 95% interval, and a verdict:
%%% better, worse, or no difference at this noise when the interval holds 0.
%%%
%%% Workloads: `{lab, Name}' for the lab scenarios that have a unit of work
%%% (see `lab_units/0': one step of the scenario's own load, from its lab
%%% module), or `{mfa, Module, Function}', a function of arity 0 that does
%%% one unit; its module is shipped to the node.
%%%
%%% ```
%%% 1> {ok, W} = beamdiag_experiment:workload("lab:busy_wait").
%%% 2> {ok, R} = beamdiag_experiment:run(#{workloads => [W],
%%%        variants => ["default", "+sbwt none +sbwtdcpu none +sbwtdio none"],
%%%        runs => 3, duration => 5}).
%%% 3> io:put_chars(beamdiag_format_experiment:text(R)).
%%% '''
-module(beamdiag_experiment).

-export([run/1, workload/1, format_error/1]).
%% Called as Module:format_error/1 on an {error, {Module, Reason}} value.
-ignore_xref([{format_error, 1}]).

-export_type([workload/0, result/0, options/0, settled/0]).

-type workload() :: {lab, atom()} | {mfa, module(), atom()}.
%% An experiment's result (beamdiag_experiment_stats:result()).
-type result() :: beamdiag_experiment_stats:result().
%% What `progress' is called with: a run starts (its number k of total,
%% the run and arm) or is done (with its result).
-type progress_event() :: #{event := run_start | run_done, k := pos_integer(),
                            total := pos_integer(), atom() => term()}.
%% run/1's options (see there).
-type options() :: #{
    workloads := [workload()],
    variants => [string()],
    runs => 1..100,
    duration => number(),
    warmup => number(),
    concurrency => 1..100000 | undefined,
    reservoir => 100..1000000,
    bootstrap => 100..100000,
    progress => fun((progress_event()) -> term()) | undefined
}.
%% The options with the defaults filled in (options/1).
-type settled() :: #{
    workloads := [workload()],
    variants := [string()],
    runs := 1..100,
    duration := number(),
    warmup := number(),
    concurrency := 1..100000 | undefined,
    reservoir := 100..1000000,
    bootstrap := 100..100000,
    progress := fun((progress_event()) -> term()) | undefined
}.

-define(SCHEMA, <<"beamdiag.experiment/1">>).
-define(DEFAULTS, #{
    workloads => [],
    variants => ["default"],
    runs => 3,
    duration => 5,
    warmup => 2,
    concurrency => undefined,
    reservoir => 20000,
    bootstrap => 2000,
    progress => undefined
}).
-define(MAX_VARIANT_ARGS, 40).
%% The driver's own time to gather its workers' reservoirs.
-define(STOP_TIMEOUT, 15000).
%%%===================================================================
%%% API
%%%===================================================================

%% @doc Runs an experiment. Options (defaults): `workloads' (required, a
%% list of `workload()'), `variants' (["default"]), `runs' per arm (3),
%% `duration' of the measured window in seconds (5), `warmup' seconds (2),
%% `concurrency' (the workload's default), `reservoir' latency samples per
%% run (20000), `bootstrap' resamples (2000), `progress' a fun of one event
%% map. Arms are every workload with every variant; the first is the
%% baseline.
-spec run(options()) -> {ok, result()} | {error, {beamdiag_experiment, term()}}.
run(Opts0) ->
    Opts = options(Opts0),
    case arms(Opts) of
        {ok, Arms} ->
            #{runs := N} = Opts,
            Schedule = [{R, A} || R <- lists:seq(1, N), A <- Arms],
            Total = length(Schedule),
            Started = erlang:monotonic_time(millisecond),
            case run_schedule(Schedule, 1, Total, Opts, []) of
                {ok, Runs} ->
                    Result = #{
                        kind => experiment,
                        schema => ?SCHEMA,
                        started_ms => erlang:system_time(millisecond),
                        elapsed_s => (erlang:monotonic_time(millisecond) - Started) / 1000,
                        settings => settings(Opts),
                        arms => [maps:without([unit, code, emu_args], A) || A <- Arms],
                        runs => Runs
                    },
                    {ok, Result#{summary => beamdiag_experiment_stats:summarise(Result)}};
                {error, _} = E ->
                    E
            end;
        {error, _} = E ->
            E
    end.

%% @doc Validates options and fills in defaults; raises `badarg' on unknown
%% keys or bad values.
%% (Anything else than a map raises `badarg' too.)
-spec options(options()) -> settled().
options(Opts) when is_map(Opts) ->
    O = beamdiag_opts:merge(Opts, ?DEFAULTS, []),
    #{workloads := Ws, variants := Vs, runs := N, duration := D, warmup := Wu,
      concurrency := C, reservoir := Res, bootstrap := B} = O,
    check(is_list(Ws) andalso Ws =/= [], workloads, Ws),
    check(is_list(Vs) andalso Vs =/= [] andalso lists:all(fun io_lib:printable_unicode_list/1, Vs),
          variants, Vs),
    check(is_integer(N) andalso N >= 1 andalso N =< 100, runs, N),
    check(is_number(D) andalso D >= 1 andalso D =< beamdiag_opts:max_seconds(window), duration, D),
    check(is_number(Wu) andalso Wu >= 0 andalso Wu =< 600, warmup, Wu),
    check(C =:= undefined orelse (is_integer(C) andalso C >= 1 andalso C =< 100000),
          concurrency, C),
    check(is_integer(Res) andalso Res >= 100 andalso Res =< 1000000, reservoir, Res),
    check(is_integer(B) andalso B >= 100 andalso B =< 100000, bootstrap, B),
    O;
options(Other) ->
    erlang:error({badarg, Other}).

%% @doc Parses a workload given on the command line: `lab:NAME' or
%% `Module:Function' (arity 0, the module on the code path). Creates the
%% module's atom only when a `.beam' file of that name is on the path.
-spec workload(string()) -> {ok, workload()} | {error, {beamdiag_experiment, term()}}.
workload("lab:" ++ Name) ->
    case [L || L <- maps:keys(lab_units()), atom_to_list(L) =:= Name] of
        [Lab] -> {ok, {lab, Lab}};
        [] -> {error, {beamdiag_experiment, {unknown_lab, Name}}}
    end;
workload(Str) when is_list(Str) ->
    case string:split(Str, ":") of
        [M, F] when M =/= "", F =/= "", length(Str) =< 255 ->
            case valid_name(M) andalso valid_name(F) of
                true -> user_workload(M, F);
                false -> {error, {beamdiag_experiment, {bad_workload, Str}}}
            end;
        _ ->
            {error, {beamdiag_experiment, {bad_workload, Str}}}
    end.

%% @doc A workload as text, as `workload/1' reads it.
-spec workload_name(workload()) -> binary().
workload_name({lab, L}) -> iolist_to_binary(["lab:", atom_to_list(L)]);
workload_name({mfa, M, F}) -> iolist_to_binary([atom_to_list(M), ":", atom_to_list(F)]).

%% @doc The lab scenarios that have a unit of work, with the unit (one step
%% of the scenario's load, `Module:unit(Name, Context)' of its lab module),
%% the default concurrency and the scenario's emulator flags (its
%% lock-counting emulator is not used).
-spec lab_units() -> #{atom() => #{unit := beamdiag_agent_workload:unit(),
                                   concurrency := pos_integer(), summary := binary(),
                                   emu_args := [string()]}}.
lab_units() ->
    maps:from_list(
      [{Name, #{unit => {lab, Mod, U}, concurrency => C, summary => Summary, emu_args => Args}}
       || #{name := Name, load := {Mod, _, _}, emu_args := Args,
            unit := #{name := U, concurrency := C, summary := Summary}} <- beamdiag_lab:scenarios()]).

%% @doc Turns an error reason of this module into a sentence.
-spec format_error(term()) -> iolist().
format_error({unknown_lab, Name}) ->
    io_lib:format("no lab workload '~ts' with a unit of work; known: ~ts",
                  [beamdiag_safe_text:safe(Name, 80),
                   lists:join(", ", [atom_to_list(K) || K <- lists:sort(maps:keys(lab_units()))])]);
format_error({bad_workload, S}) ->
    io_lib:format("'~ts' is not a workload: give lab:NAME or Module:Function", [beamdiag_safe_text:safe(S, 80)]);
format_error({no_module, M}) ->
    io_lib:format("no module ~ts on the code path (add its directory with --pa)", [beamdiag_safe_text:safe(M, 80)]);
format_error({no_function, M, F}) ->
    io_lib:format("~ts does not export ~ts/0", [beamdiag_safe_text:safe(M, 80), beamdiag_safe_text:safe(F, 80)]);
format_error({bad_variant, V}) ->
    io_lib:format("variant '~ts' is not a list of emulator flags", [beamdiag_safe_text:safe(V, 80)]);
format_error({run_failed, Run, Arm, {M, R}}) when is_atom(M) ->
    io_lib:format("run ~b of arm ~b failed: ~ts", [Run, Arm, M:format_error(R)]);
format_error({run_failed, Run, Arm, R}) ->
    io_lib:format("run ~b of arm ~b failed: ~p", [Run, Arm, R]);
format_error({driver, Why}) ->
    io_lib:format("the load driver failed: ~p", [Why]).

%%%===================================================================
%%% Internal
%%%===================================================================

check(true, _, _) -> ok;
check(false, K, V) -> erlang:error({badarg, {K, V}}).

valid_name(S) ->
    lists:all(fun(C) -> (C >= $a andalso C =< $z) orelse (C >= $A andalso C =< $Z) orelse
                            (C >= $0 andalso C =< $9) orelse C =:= $_ end, S).

%% The module must be on the code path before its name becomes an atom;
%% the function must then already exist as an atom.
user_workload(M, F) ->
    case code:where_is_file(M ++ ".beam") of
        non_existing ->
            {error, {beamdiag_experiment, {no_module, M}}};
        _ ->
            Mod = list_to_atom(M),
            case code:ensure_loaded(Mod) of
                {module, Mod} ->
                    try list_to_existing_atom(F) of
                        Fun ->
                            case erlang:function_exported(Mod, Fun, 0) of
                                true -> {ok, {mfa, Mod, Fun}};
                                false -> {error, {beamdiag_experiment, {no_function, M, F}}}
                            end
                    catch
                        error:badarg -> {error, {beamdiag_experiment, {no_function, M, F}}}
                    end;
                _ ->
                    {error, {beamdiag_experiment, {no_module, M}}}
            end
    end.

arms(#{workloads := Ws, variants := Vs, concurrency := C}) ->
    try
        Arms = [arm(W, V, C) || W <- Ws, V <- Vs],
        {ok, [A#{index => I} || {I, A} <- lists:enumerate(Arms)]}
    catch
        throw:{arm_error, E} -> E
    end.

arm(W, V, C) ->
    Flags = case variant_args(V) of
                {ok, Fl} -> Fl;
                {error, _} = E -> throw({arm_error, E})
            end,
    {Unit, LabArgs, DefC, Code} =
        case W of
            {lab, L} ->
                #{unit := U, concurrency := DC, emu_args := A} = maps:get(L, lab_units()),
                {U, A, DC, []};
            {mfa, M, F} ->
                case code:get_object_code(M) of
                    {M, _, File} ->
                        %% OTP's own modules are on the node already, in
                        %% its release's version: used as they are there.
                        Ship = case lists:prefix(code:lib_dir(), File) of
                                   true -> [];
                                   false -> [M]
                               end,
                        {{mfa, M, F}, [], 4, Ship};
                    error -> throw({arm_error, {error, {beamdiag_experiment,
                                                        {no_module, atom_to_list(M)}}}})
                end
        end,
    #{
        workload => workload_name(W),
        variant => unicode:characters_to_binary(V),
        emu_args => LabArgs ++ Flags,
        unit => Unit,
        code => Code,
        concurrency => case C of undefined -> DefC; _ -> C end
    }.

variant_args("default") ->
    {ok, []};
variant_args(V) ->
    Args = string:lexemes(V, " \t"),
    Ok = length(Args) =< ?MAX_VARIANT_ARGS andalso
        lists:all(fun(A) -> length(A) =< 200 end, Args) andalso
        case Args of
            [[C | _] | _] -> C =:= $+ orelse C =:= $-;
            [] -> false
        end,
    case Ok of
        true -> {ok, Args};
        false -> {error, {beamdiag_experiment, {bad_variant, V}}}
    end.

run_schedule([], _K, _Total, _Opts, Acc) ->
    {ok, lists:reverse(Acc)};
run_schedule([{R, Arm = #{index := I}} | Rest], K, Total, Opts, Acc) ->
    progress(Opts, #{event => run_start, k => K, total => Total, run => R, arm => I,
                     variant => maps:get(variant, Arm), workload => maps:get(workload, Arm)}),
    case run_one(Arm, Opts) of
        {ok, Run0} ->
            Run = Run0#{arm => I, run => R, seq => K},
            progress(Opts, #{event => run_done, k => K, total => Total, result => Run}),
            run_schedule(Rest, K + 1, Total, Opts, [Run | Acc]);
        {error, Why} ->
            {error, {beamdiag_experiment, {run_failed, R, I, Why}}}
    end.

run_one(Arm, #{duration := D, warmup := Wu, reservoir := Res}) ->
    #{emu_args := Args, unit := Unit, code := Code, concurrency := C} = Arm,
    BoundS = ceil(Wu + D) + 60,
    DriverOpts = #{unit => Unit, concurrency => C, bound_ms => BoundS * 1000,
                   reservoir => Res},
    %% The lab ships the driver, the lab workload's module or the user's.
    Scenario = #{name => experiment, summary => <<"experiment run">>, emu_args => Args,
                 load => {beamdiag_agent_workload, start, [DriverOpts]},
                 modules => beamdiag_agent_workload:modules() ++ [M || {lab, M, _} <- [Unit]] ++ Code,
                 warmup_ms => round(Wu * 1000)},
    case beamdiag_lab:start(Scenario, #{duration => BoundS}) of
        {ok, Lab} ->
            try
                measure(Lab, D)
            catch
                %% peer:call re-raises what failed on the node.
                error:Why -> {error, {beamdiag_experiment, {driver, Why}}}
            after
                beamdiag_lab:stop(Lab)
            end;
        {error, {_, _} = E} ->
            {error, E}
    end.

measure(Lab = #{peer := Peer}, D) ->
    Node = beamdiag_lab:node(Lab),
    ok = peer:call(Peer, beamdiag_agent_workload, measure, [start], 20000),
    Diag = beamdiag_diagnose:run_remote(Node, #{cookie => beamdiag_lab:cookie(Lab), duration => D,
                                     msacc => false, locks => false}),
    M = peer:call(Peer, beamdiag_agent_workload, measure, [stop], ?STOP_TIMEOUT + 10000),
    case Diag of
        {ok, Diagnosis} -> {ok, figures(M, Diagnosis)};
        {error, E} -> {error, E}
    end.

figures(#{units := Units, elapsed_s := El, latency_us := Lat}, D = #{ledger := L}) ->
    Throughput = Units / max(El, 1.0e-9),
    Window = maps:get(window_s, L, 0.0),
    OnCpu = case maps:get(on_cpu, maps:get(totals, L, #{}), undefined) of
                V when is_number(V) -> V;
                _ -> 0.0
            end,
    UnitsInWindow = Throughput * Window,
    Sched = maps:get(scheduler, maps:get(by_type, L, #{}), #{}),
    #{
        units => Units,
        elapsed_s => El,
        throughput => Throughput,
        window_s => Window,
        on_cpu_s => OnCpu,
        cpus_used => maps:get(cpus_used, maps:get(totals, L, #{}), 0.0),
        cpu_us_per_unit => case UnitsInWindow > 0 of
                               true -> 1.0e6 * OnCpu / UnitsInWindow;
                               false -> 0.0
                           end,
        sched_util => beamdiag_ledger:share(busy, Sched, maps:get(wall, Sched, 0.0)),
        spin_share => beamdiag_ledger:share(spin, Sched, maps:get(wall, Sched, 0.0)),
        p50_us => maps:get(p50, Lat),
        p99_us => maps:get(p99, Lat),
        p999_us => maps:get(p999, Lat),
        latency_samples => maps:get(n, Lat),
        findings => [Id || #{id := Id} <- maps:get(findings, D)],
        diagnosis => D
    }.

settings(Opts = #{workloads := Ws}) ->
    maps:without([progress], Opts#{workloads => [workload_name(W) || W <- Ws]}).

progress(#{progress := undefined}, _) -> ok;
progress(#{progress := F}, Event) -> _ = F(Event), ok.

