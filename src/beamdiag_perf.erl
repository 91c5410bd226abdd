%%% @doc Records a native CPU profile of a BEAM node with Linux `perf'.
%%%
%%% `record/2' runs `perf record' (software event `cpu-clock', call graphs,
%%% 97 Hz by default) on the node's OS process for a bounded time, then
%%% `perf script', and writes the script text to a file for
%%% `beamdiag_fold'. perf is started directly as an executable with an
%%% argument list, never through a shell.
%%%
%%% perf attaches to a process id of the machine it runs on, so this must
%%% run on the same host as the target node (or in the same container /
%%% PID namespace). The call chains come from DWARF unwinding by default:
%%% Debian's emulator is built without frame pointers, so frame-pointer
%%% chains that pass through its C code walk into heap data and come out
%%% as `[unknown]' frames (see docs/PROFILING.md). Start the node with
%%% `+JPperf true' (or `map') so that perf can name JIT code from
%%% `/tmp/perf-PID.map'.
%%%
%%% ```
%%% 1> {ok, R} = beamdiag_perf:record(list_to_integer(os:getpid()),
%%%        #{duration => 5, dir => "/tmp/prof"}).
%%% 2> maps:get(script, R).
%%% "/tmp/prof/perf.script"
%%% 3> {ok, P} = beamdiag_fold:fold_file(maps:get(script, R), #{}).
%%% '''
-module(beamdiag_perf).

-export([record/2, script_args/1, record_args/3, find_perf/1, format_error/1, defaults/0]).

-export_type([options/0, result/0]).

-type call_graph() :: dwarf | fp | none.
-type options() :: #{
    duration => pos_integer(),
    frequency => pos_integer(),
    call_graph => call_graph(),
    dwarf_stack => pos_integer(),
    perf => string() | undefined,
    dir => file:filename(),
    max_data => pos_integer(),
    max_script => pos_integer(),
    keep_data => boolean()
}.
-type result() :: #{
    script := file:filename(),
    script_bytes := non_neg_integer(),
    script_truncated := boolean(),
    ospid := pos_integer(),
    duration := pos_integer(),
    frequency := pos_integer(),
    call_graph := call_graph(),
    perf_map := present | missing,
    record_output := binary()
}.

-define(MAX_DURATION, 300).
-define(MAX_FREQUENCY, 999).
-define(OUTPUT_KEEP, 65536).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The defaults: 10 s at 97 Hz with DWARF call chains of 16 KiB of
%% stack, perf.data capped at 512 MiB and the script text at 1 GiB.
-spec defaults() -> options().
defaults() ->
    #{
        duration => 10,
        frequency => 97,
        call_graph => dwarf,
        dwarf_stack => 16384,
        perf => undefined,
        dir => ".",
        max_data => 512 * 1024 * 1024,
        max_script => 1024 * 1024 * 1024,
        keep_data => false
    }.

%% @doc Profiles OS process `OsPid' for `duration' seconds and writes
%% `perf.script' into `dir'. Expected failures: perf missing, not
%% permitted (perf_event_paranoid), the target gone, no samples.
-spec record(pos_integer(), options()) -> {ok, result()} | {error, {?MODULE, term()}}.
record(OsPid, Opts0) when is_integer(OsPid), OsPid > 0 ->
    case options(Opts0) of
        {ok, Opts} -> record1(OsPid, Opts);
        {error, _} = E -> E
    end.

%% @doc The `perf record' arguments (exposed for the docs and tests).
-spec record_args(pos_integer(), file:filename(), options()) -> [string()].
record_args(OsPid, DataFile, Opts) ->
    #{duration := D, frequency := F, call_graph := CG, dwarf_stack := DS, max_data := MD} =
        maps:merge(defaults(), Opts),
    CallGraph = case CG of
        dwarf -> ["--call-graph", "dwarf," ++ integer_to_list(DS)];
        fp -> ["--call-graph", "fp"];
        none -> []
    end,
    ["record", "-e", "cpu-clock", "-F", integer_to_list(F)] ++ CallGraph ++
        ["-p", integer_to_list(OsPid), "-o", DataFile,
         "--max-size", integer_to_list(MD div 1024) ++ "K",
         "--", "sleep", integer_to_list(D)].

%% @doc The `perf script' arguments.
-spec script_args(file:filename()) -> [string()].
script_args(DataFile) ->
    ["script", "-i", DataFile, "--no-inline", "-F", "comm,tid,time,period,event,ip,sym,dso"].

%% @doc The perf executable: the given path, or `perf' on the PATH.
-spec find_perf(string() | undefined) -> {ok, string()} | {error, {?MODULE, term()}}.
find_perf(undefined) ->
    case os:find_executable("perf") of
        false -> {error, {?MODULE, perf_missing}};
        P -> {ok, P}
    end;
find_perf(Path) ->
    case filelib:is_regular(Path) of
        true -> {ok, Path};
        false -> {error, {?MODULE, {perf_not_found, Path}}}
    end.

%% @doc Turns an error reason into a sentence.
-spec format_error(term()) -> iolist().
format_error(perf_missing) ->
    "perf is not installed on this host (Debian: apt-get install linux-perf); "
    "it must run on the same host as the target node";
format_error({perf_not_found, Path}) ->
    io_lib:format("no perf executable at ~ts", [Path]);
format_error({not_permitted, Paranoid, Output}) ->
    io_lib:format(
        "perf may not profile the target (kernel.perf_event_paranoid = ~ts): run as root "
        "or as the node's user with perf_event_paranoid <= 2 (sysctl "
        "kernel.perf_event_paranoid=1), or grant CAP_PERFMON; perf said: ~ts",
        [Paranoid, last_line(Output)]);
format_error({target_gone, OsPid}) ->
    io_lib:format("OS process ~b is gone (the node stopped, or it runs on another host: "
                  "perf must run on the target's host)", [OsPid]);
format_error({other_host, Host}) ->
    io_lib:format("the node runs on host ~ts: perf must run on the node's host (run beamdiag "
                  "there, or use the Erlang-level sampler, --erlang)", [Host]);
format_error({perf_failed, Status, Output}) ->
    io_lib:format("perf exited with status ~b: ~ts", [Status, last_line(Output)]);
format_error({timeout, Seconds}) ->
    io_lib:format("perf did not finish within ~b s", [Seconds]);
format_error({no_samples, OsPid}) ->
    io_lib:format("perf recorded no samples of OS process ~b (the node was idle, or "
                  "perf may not read it)", [OsPid]);
format_error({file, Path, Why}) ->
    io_lib:format("cannot write ~ts: ~ts", [Path, file:format_error(Why)]);
format_error({bad_option, K, V}) ->
    io_lib:format("bad perf option ~p => ~p", [K, V]).

%%%===================================================================
%%% Internal
%%%===================================================================

options(Opts) ->
    Defaults = defaults(),
    case maps:keys(maps:without(maps:keys(Defaults), Opts)) of
        [K | _] ->
            {error, {?MODULE, {bad_option, K, maps:get(K, Opts)}}};
        [] ->
            O = maps:merge(Defaults, Opts),
            check(maps:to_list(O), O)
    end.

check([], O) -> {ok, O};
check([{duration, D} | R], O) when is_integer(D), D >= 1, D =< ?MAX_DURATION -> check(R, O);
check([{frequency, F} | R], O) when is_integer(F), F >= 1, F =< ?MAX_FREQUENCY -> check(R, O);
check([{call_graph, C} | R], O) when C =:= dwarf; C =:= fp; C =:= none -> check(R, O);
check([{dwarf_stack, S} | R], O) when is_integer(S), S >= 1024, S =< 65528 -> check(R, O);
check([{perf, P} | R], O) when P =:= undefined; is_list(P) -> check(R, O);
check([{dir, _} | R], O) -> check(R, O);
check([{max_data, M} | R], O) when is_integer(M), M >= 1048576 -> check(R, O);
check([{max_script, M} | R], O) when is_integer(M), M >= 1024 -> check(R, O);
check([{keep_data, B} | R], O) when is_boolean(B) -> check(R, O);
check([{K, V} | _], _) -> {error, {?MODULE, {bad_option, K, V}}}.

record1(OsPid, Opts = #{perf := PerfOpt, dir := Dir, duration := D}) ->
    maybe_ok([
        fun() -> find_perf(PerfOpt) end,
        fun(_) -> alive(OsPid) end,
        fun(_) -> ensure_dir(Dir) end
    ], undefined, fun(Perf) ->
        Data = filename:join(Dir, "perf.data"),
        Script = filename:join(Dir, "perf.script"),
        logger:info("beamdiag_perf: recording OS pid ~b for ~b s", [OsPid, D]),
        case run(Perf, record_args(OsPid, Data, Opts), D + 60, undefined) of
            {ok, 0, RecOut} ->
                Res = to_script(Perf, Data, Script, Opts),
                _ = case maps:get(keep_data, Opts) of
                    true -> ok;
                    false -> file:delete(Data)
                end,
                case Res of
                    {ok, 0, Bytes, Trunc} when Bytes > 0 ->
                        {ok, #{
                            script => Script,
                            script_bytes => Bytes,
                            script_truncated => Trunc,
                            ospid => OsPid,
                            duration => D,
                            frequency => maps:get(frequency, Opts),
                            call_graph => maps:get(call_graph, Opts),
                            perf_map => perf_map(OsPid),
                            record_output => RecOut
                        }};
                    {ok, 0, _, _} ->
                        {error, {?MODULE, {no_samples, OsPid}}};
                    {ok, Status, _, _} ->
                        {error, {?MODULE, {perf_failed, Status, <<"perf script failed">>}}};
                    {error, _} = E ->
                        E
                end;
            {ok, Status, Out} ->
                _ = file:delete(Data),
                {error, {?MODULE, classify(Status, Out, OsPid)}};
            {error, _} = E ->
                E
        end
    end).

%% Runs the checks in order, passing the first one's value along; calls
%% Then with the perf path when all pass.
maybe_ok([First | Rest], _, Then) ->
    case First() of
        {ok, Perf} ->
            case lists:foldl(
                fun(F, ok) -> F(Perf); (_, Err) -> Err end, ok, Rest)
            of
                ok -> Then(Perf);
                Err -> Err
            end;
        Err ->
            Err
    end.

alive(OsPid) ->
    case filelib:is_dir("/proc/" ++ integer_to_list(OsPid)) of
        true -> ok;
        false -> {error, {?MODULE, {target_gone, OsPid}}}
    end.

ensure_dir(Dir) ->
    case filelib:ensure_dir(filename:join(Dir, "x")) of
        ok -> ok;
        {error, Why} -> {error, {?MODULE, {file, Dir, Why}}}
    end.

perf_map(OsPid) ->
    case filelib:is_regular("/tmp/perf-" ++ integer_to_list(OsPid) ++ ".map") of
        true -> present;
        false -> missing
    end.

classify(Status, Out, OsPid) ->
    Has = fun(S) -> binary:match(Out, S) =/= nomatch end,
    case Has(<<"failed to open">>) andalso Has(<<"perf.data">>) of
        true -> {perf_failed, Status, Out};
        false -> classify1(Has, Status, Out, OsPid)
    end.

classify1(Has, Status, Out, OsPid) ->
    case Has(<<"perf_event_paranoid">>) orelse Has(<<"Permission denied">>)
        orelse Has(<<"Operation not permitted">>) orelse Has(<<"No permission">>)
    of
        true ->
            {not_permitted, paranoid(), Out};
        false ->
            case Has(<<"No such process">>) orelse Has(<<"Couldn't find">>)
                orelse Has(<<"not found">>) orelse alive(OsPid) =/= ok
            of
                true -> {target_gone, OsPid};
                false -> {perf_failed, Status, Out}
            end
    end.

paranoid() ->
    case file:read_file("/proc/sys/kernel/perf_event_paranoid") of
        {ok, B} -> string:trim(B);
        {error, _} -> <<"unknown">>
    end.

%% perf script into a file, stopping at max_script bytes.
to_script(Perf, Data, Script, #{max_script := Max}) ->
    case file:open(Script, [write, raw, binary, delayed_write]) of
        {ok, Fd} ->
            try
                case run(Perf, script_args(Data), 600, {Fd, Max}) of
                    {ok, Status, {Bytes, Trunc}} -> {ok, Status, Bytes, Trunc};
                    {error, _} = E -> E
                end
            after
                ok = file:close(Fd)
            end;
        {error, Why} ->
            {error, {?MODULE, {file, Script, Why}}}
    end.

%% Runs an executable with an argument list; collects its output in
%% memory (bounded, last bytes kept) or streams it to a file (bounded).
run(Exe, Args, TimeoutS, Sink) ->
    Port = open_port({spawn_executable, Exe},
                     [{args, Args}, binary, exit_status, stderr_to_stdout, use_stdio, hide]),
    Deadline = erlang:monotonic_time(millisecond) + TimeoutS * 1000,
    Acc0 = case Sink of
        undefined -> <<>>;
        {_, _} -> {0, false}
    end,
    collect(Port, Sink, Acc0, Deadline, TimeoutS).

collect(Port, Sink, Acc, Deadline, TimeoutS) ->
    Left = max(0, Deadline - erlang:monotonic_time(millisecond)),
    receive
        {Port, {data, D}} ->
            case add(Sink, Acc, D) of
                {stop, Acc2} ->
                    stop_port(Port),
                    {ok, 0, Acc2};
                Acc2 ->
                    collect(Port, Sink, Acc2, Deadline, TimeoutS)
            end;
        {Port, {exit_status, S}} ->
            {ok, S, Acc}
    after Left ->
        stop_port(Port),
        {error, {?MODULE, {timeout, TimeoutS}}}
    end.

add(undefined, Acc, D) ->
    B = <<Acc/binary, D/binary>>,
    case byte_size(B) > ?OUTPUT_KEEP of
        true -> binary:part(B, byte_size(B) - ?OUTPUT_KEEP, ?OUTPUT_KEEP);
        false -> B
    end;
add({Fd, Max}, {N, _}, D) ->
    case N + byte_size(D) > Max of
        true ->
            logger:warning("beamdiag_perf: perf script output cut at ~b bytes", [Max]),
            {stop, {N, true}};
        false ->
            ok = file:write(Fd, D),
            {N + byte_size(D), false}
    end.

stop_port(Port) ->
    case erlang:port_info(Port, os_pid) of
        {os_pid, OsPid} ->
            catch port_close(Port),
            case os:find_executable("kill") of
                false -> ok;
                Kill ->
                    K = open_port({spawn_executable, Kill},
                                  [{args, ["-TERM", integer_to_list(OsPid)]}, exit_status, hide]),
                    receive {K, {exit_status, _}} -> ok after 5000 -> ok end
            end;
        undefined ->
            ok
    end,
    flush(Port).

flush(Port) ->
    receive
        {Port, _} -> flush(Port)
    after 0 -> ok
    end.

last_line(Out) ->
    Lines = [L || L <- binary:split(Out, <<"\n">>, [global, trim_all]), L =/= <<>>],
    case Lines of
        [] -> <<"(no output)">>;
        _ -> lists:last(Lines)
    end.
