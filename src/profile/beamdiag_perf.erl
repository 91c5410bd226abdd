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

-include_lib("kernel/include/file.hrl").

-export([record/2, format_error/1, target/1]).
%% Called as Module:format_error/1 on an {error, {Module, Reason}} value.
-ignore_xref([{format_error, 1}]).
%% Called by the tests only.
-ifdef(TEST).
-export([record_args/3, choose_call_graph/1, access/2]).
-endif.

-export_type([options/0, result/0, target/0, access/0]).

%% What decides whether perf may run here (in this OS process and those it
%% starts): kernel.perf_event_paranoid, the effective capabilities
%% CAP_PERFMON and CAP_SYS_ADMIN, and the seccomp mode.
-type access() :: #{
    paranoid := integer() | unknown,
    perfmon := boolean() | unknown,
    sys_admin := boolean() | unknown,
    seccomp := off | strict | filter | unknown
}.

-type call_graph() :: auto | dwarf | fp | none.
%% What /proc says about the target: its +JPperf flag (as given, or
%% `none'), +JPperfdirectory, its pid in its own PID namespace, and where
%% its perf map is (seen from here) or `missing'.
-type target() :: #{
    perf_flag := binary() | none,
    perf_directory := binary() | undefined,
    ns_pid := pos_integer(),
    perf_map := file:filename() | missing,
    frame_pointers := boolean(),
    native_names := boolean()
}.
-type options() :: #{
    duration => pos_integer(),
    frequency => pos_integer(),
    call_graph => call_graph(),
    dwarf_stack => pos_integer(),
    perf => string() | undefined,
    dir => file:filename(),
    max_data => pos_integer(),
    max_script => pos_integer(),
    keep_data => boolean(),
    %% Sample only these threads of the process (`perf record -t').
    tids => [pos_integer()],
    %% Only user-mode samples (`cpu-clock:u'): no kernel symbols to load.
    user_only => boolean()
}.
-type result() :: #{
    script := file:filename(),
    script_bytes := non_neg_integer(),
    script_truncated := boolean(),
    ospid := pos_integer(),
    duration := pos_integer(),
    frequency := pos_integer(),
    call_graph := dwarf | fp | none,
    call_graph_reason := binary(),
    perf_map := file:filename() | missing,
    target := target(),
    wall_ms := #{record := non_neg_integer(), script := non_neg_integer()},
    record_output := binary()
}.

-define(MAX_FREQUENCY, 999).
-define(OUTPUT_KEEP, 65536).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The defaults: 10 s at 97 Hz, the call-graph mode chosen for the
%% target (`auto', see `choose_call_graph/1'), DWARF call chains copying
%% 64 KiB of stack (16 KiB stops inside the emulator's C code before the
%% first JIT frame in binary_to_term), perf.data capped at 512 MiB and the
%% script text at 1 GiB.
-spec defaults() -> options().
defaults() ->
    #{
        duration => 10,
        frequency => 97,
        call_graph => auto,
        dwarf_stack => 65528,
        perf => undefined,
        dir => ".",
        max_data => 512 * 1024 * 1024,
        max_script => 1024 * 1024 * 1024,
        keep_data => false,
        tids => [],
        user_only => false
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
    #{duration := D, frequency := F, call_graph := CG, dwarf_stack := DS, max_data := MD,
      tids := Tids, user_only := UserOnly} = maps:merge(defaults(), Opts),
    Event = case UserOnly of
        true -> "cpu-clock:u";
        false -> "cpu-clock"
    end,
    Who = case Tids of
        [] -> ["-p", integer_to_list(OsPid)];
        _ -> ["-t", lists:flatten(lists:join(",", [integer_to_list(T) || T <- Tids]))]
    end,
    CallGraph = case CG of
        dwarf -> ["--call-graph", "dwarf," ++ integer_to_list(DS)];
        fp -> ["--call-graph", "fp"];
        none -> [];
        auto -> error({badarg, {call_graph, auto}})
    end,
    %% -N -B: no build-id cache in ~/.debug and no build-id pass over
    %% every object at the end (the script is made at once, from the same
    %% files). --no-bpf-event: no side-band thread for BPF programs, whose
    %% 1 s poll held perf up to a second past the window.
    ["record", "-N", "-B", "--no-bpf-event", "-e", Event, "-F", integer_to_list(F)] ++
        CallGraph ++
        Who ++ ["-o", DataFile,
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
        false -> {error, {?MODULE, {perf_missing, access()}}};
        P -> {ok, P}
    end;
find_perf(Path) ->
    case filelib:is_regular(Path) of
        true -> {ok, Path};
        false -> {error, {?MODULE, {perf_not_found, Path}}}
    end.

%% @doc Turns an error reason into a sentence.
-spec format_error(term()) -> iolist().
format_error({perf_missing, Access}) ->
    ["perf is not installed here (Debian: apt-get install linux-perf); it must run on the "
     "node's host or in its container. ", access_text(Access), without_perf()];
format_error({perf_not_found, Path}) ->
    io_lib:format("no perf executable at ~ts", [Path]);
format_error({not_permitted, Access, Output}) ->
    ["perf may not profile the target: ", access_text(Access),
     "Run as root, or grant CAP_PERFMON (a container: --cap-add PERFMON, or the pod's "
     "securityContext), or lower kernel.perf_event_paranoid to 1 on the host (sysctl); perf "
     "said: ", refusal(Output), ". ", without_perf()];
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

%% @doc What decides here whether perf may run (see access/2).
-spec access() -> access().
access() ->
    %% Small files, read whole (a 4 MiB read of a sysctl file fails
    %% with enomem).
    Read = fun(F) ->
                   case file:read_file(F) of
                       {ok, B} -> B;
                       {error, _} -> <<>>
                   end
           end,
    access(Read("/proc/sys/kernel/perf_event_paranoid"), Read("/proc/self/status")).

%% @doc The same from the text of /proc/sys/kernel/perf_event_paranoid and
%% of /proc/self/status (pure): `CapEff' holds CAP_SYS_ADMIN (bit 21) and
%% CAP_PERFMON (bit 38), `Seccomp' the mode (0 off, 1 strict, 2 filter).
-spec access(binary(), binary()) -> access().
access(ParanoidText, Status) ->
    Paranoid = try binary_to_integer(string:trim(ParanoidText))
               catch error:badarg -> unknown
               end,
    Fields = maps:from_list([{K, string:trim(V)}
                             || L <- binary:split(Status, <<"\n">>, [global]),
                                [K, V] <- [binary:split(L, <<":">>)]]),
    Caps = case maps:find(<<"CapEff">>, Fields) of
               {ok, Hex} -> try binary_to_integer(Hex, 16) catch error:badarg -> unknown end;
               error -> unknown
           end,
    Bit = fun(N) when is_integer(Caps) -> Caps band (1 bsl N) =/= 0;
             (_) -> unknown
          end,
    #{paranoid => Paranoid,
      sys_admin => Bit(21),
      perfmon => Bit(38),
      seccomp => case maps:find(<<"Seccomp">>, Fields) of
                     {ok, <<"0">>} -> off;
                     {ok, <<"1">>} -> strict;
                     {ok, <<"2">>} -> filter;
                     _ -> unknown
                 end}.

%%%===================================================================
%%% Internal
%%%===================================================================

%% Why perf may not run here, in sentences, from what access/0 read.
access_text(#{paranoid := P, perfmon := Pm, sys_admin := Sa, seccomp := Sc}) ->
    Privileged = Pm =:= true orelse Sa =:= true,
    [case P of
         unknown -> "";
         _ when P >= 3 -> io_lib:format("kernel.perf_event_paranoid is ~b: no unprivileged "
                                        "process may use perf. ", [P]);
         2 -> "kernel.perf_event_paranoid is 2: an unprivileged process may sample the user "
              "space of its own user's processes only, not the kernel. ";
         _ -> io_lib:format("kernel.perf_event_paranoid is ~b. ", [P])
     end,
     case {Privileged, Pm, Sa} of
         {true, _, _} -> "This process has CAP_PERFMON or CAP_SYS_ADMIN. ";
         {false, unknown, _} -> "";
         {false, _, _} -> "This process has neither CAP_PERFMON nor CAP_SYS_ADMIN. "
     end,
     case Sc of
         filter when not Privileged ->
             "A seccomp filter is on (a container runtime's default profile refuses "
             "perf_event_open to a process without CAP_PERFMON or CAP_SYS_ADMIN). ";
         filter ->
             "A seccomp filter is on (a profile may refuse perf_event_open). ";
         strict ->
             "Seccomp is in strict mode: no perf_event_open. ";
         _ ->
             ""
     end,
     "A node in a container is seen by perf on its host as well: beamdiag diagnose --perf "
     "run there profiles it. "].

%% What the report lacks without perf.
without_perf() ->
    "The diagnosis is whole without perf but for what perf alone sees: the CPU time below "
    "Erlang, in the emulator's C functions (garbage collection, ETS, copying terms), NIFs "
    "and the kernel, and the Erlang functions of JIT code named from the perf map "
    "(+JPperf true).".

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
check([{duration, D} | R], O) when is_integer(D), D >= 1 ->
    case D =< beamdiag_opts:max_seconds(perf) of
        true -> check(R, O);
        false -> {error, {?MODULE, {bad_option, duration, D}}}
    end;
check([{frequency, F} | R], O) when is_integer(F), F >= 1, F =< ?MAX_FREQUENCY -> check(R, O);
check([{call_graph, C} | R], O) when C =:= auto; C =:= dwarf; C =:= fp; C =:= none -> check(R, O);
check([{dwarf_stack, S} | R], O) when is_integer(S), S >= 1024, S =< 65528 -> check(R, O);
check([{perf, P} | R], O) when P =:= undefined; is_list(P) -> check(R, O);
check([{dir, _} | R], O) -> check(R, O);
check([{max_data, M} | R], O) when is_integer(M), M >= 1048576 -> check(R, O);
check([{max_script, M} | R], O) when is_integer(M), M >= 1024 -> check(R, O);
check([{keep_data, B} | R], O) when is_boolean(B) -> check(R, O);
check([{user_only, B} | R], O) when is_boolean(B) -> check(R, O);
check([{tids, Ts} | R], O) when is_list(Ts) ->
    case lists:all(fun(T) -> is_integer(T) andalso T > 0 end, Ts) of
        true -> check(R, O);
        false -> {error, {?MODULE, {bad_option, tids, Ts}}}
    end;
check([{K, V} | _], _) -> {error, {?MODULE, {bad_option, K, V}}}.

record1(OsPid, Opts0 = #{perf := PerfOpt, dir := Dir, duration := D}) ->
    maybe_ok([
        fun() -> find_perf(PerfOpt) end,
        fun(_) -> alive(OsPid) end,
        fun(_) -> ensure_dir(Dir) end
    ], undefined, fun(Perf) ->
        Data = filename:join(Dir, "perf.data"),
        Script = filename:join(Dir, "perf.script"),
        Target = target(OsPid),
        {CG, Why} = case maps:get(call_graph, Opts0) of
            auto -> choose_call_graph(Target);
            Asked -> {Asked, <<"asked for">>}
        end,
        Opts = Opts0#{call_graph := CG},
        logger:info("beamdiag_perf: recording OS pid ~b for ~b s", [OsPid, D]),
        T0 = erlang:monotonic_time(millisecond),
        case run(Perf, record_args(OsPid, Data, Opts), D + 60, undefined) of
            {ok, 0, RecOut} ->
                T1 = erlang:monotonic_time(millisecond),
                %% A copy of the perf map as it was at the end of the
                %% window: the node may be gone when the stacks are folded.
                Map = copy_map(Target, Dir),
                Res = to_script(Perf, Data, Script, Opts),
                T2 = erlang:monotonic_time(millisecond),
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
                            call_graph => CG,
                            call_graph_reason => Why,
                            perf_map => Map,
                            target => Target,
                            wall_ms => #{record => T1 - T0, script => T2 - T1},
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

%% @doc What /proc tells about a target: its +JPperf flags (the emulator's
%% command line), its pid in its own PID namespace (a container's), and its
%% perf map, looked for where the target wrote it: `+JPperfdirectory'
%% (OTP 28+) or its own /tmp, both seen through `/proc/PID/root', then this
%% host's /tmp.
-spec target(pos_integer()) -> target().
target(OsPid) ->
    P = "/proc/" ++ integer_to_list(OsPid),
    Args = case file:read_file(P ++ "/cmdline") of
        {ok, B} -> binary:split(B, <<0>>, [global, trim_all]);
        {error, _} -> []
    end,
    Flag = flag_value(<<"-JPperf">>, Args),
    Dir = case flag_value(<<"-JPperfdirectory">>, Args) of
        none -> undefined;
        D -> D
    end,
    NsPid = beamdiag_host_pid:ns_pid("/proc", OsPid),
    MapName = "perf-" ++ integer_to_list(NsPid) ++ ".map",
    Candidates =
        [filename:join([P ++ "/root", binary_to_list(strip_root(Dir)), MapName])
         || Dir =/= undefined] ++
        [filename:join([P, "root", "tmp", MapName]),
         "/tmp/perf-" ++ integer_to_list(OsPid) ++ ".map"],
    %% A map older than the process was left by another one with the same
    %% pid (a container's pids start again at 1 each time): not its map.
    Since = started_at(P),
    Map = case [F || F <- Candidates, written_since(F, Since)] of
        [F | _] -> F;
        [] -> missing
    end,
    #{perf_flag => Flag, perf_directory => Dir, ns_pid => NsPid, perf_map => Map,
      frame_pointers => lists:member(Flag, [<<"true">>, <<"map">>, <<"fp">>]),
      native_names => native_names(P ++ "/exe")}.

%% When the process started, in seconds since the epoch (the boot time
%% from /proc/stat, and the start from /proc/PID/stat in clock ticks,
%% beamdiag_host_pid:start_ticks/1); 0 when either cannot be read.
started_at(P) ->
    try
        {ok, Stat} = file:read_file(P ++ "/stat"),
        {ok, Start} = beamdiag_host_pid:start_ticks(Stat),
        {ok, Host} = file:read_file("/proc/stat"),
        [_, After] = binary:split(Host, <<"\nbtime ">>),
        [Btime | _] = binary:split(After, <<"\n">>),
        binary_to_integer(Btime) + Start div beamdiag_agent_procfs:clock_ticks()
    catch
        _:_ -> 0
    end.

%% Whether a file is there, written at or after Since (seconds; the clock
%% ticks' rounding allowed for).
written_since(F, Since) ->
    case file:read_file_info(F, [{time, posix}]) of
        {ok, #file_info{type = regular, mtime = M}} -> M >= Since - 1;
        _ -> false
    end.

%% Whether the emulator names its internal C functions (perf can name
%% erts_atom_put): Debian's OTP 25 and 27 export about 4,800 functions,
%% sid's OTP 29 about 330 and none of the internal ones.
native_names(Exe) ->
    case filelib:file_size(Exe) of
        N when N > 0, N =< 256 * 1024 * 1024 ->
            case file:read_file(Exe) of
                {ok, B} -> binary:match(B, <<0, "erts_atom_put", 0>>) =/= nomatch;
                {error, _} -> true
            end;
        _ ->
            true
    end.

%% @doc The call-graph mode for a target, and why (measured in
%% docs/PROFILING.md). DWARF by default: native call chains from the
%% objects' unwind tables, named, up to the first JIT frame, which the perf
%% map names; that is what the knowledge base reads (binary_to_term_1,
%% erts_atom_put). Frame pointers when the JIT keeps them (`+JPperf true',
%% `map' or `fp'), the perf map names its code and the emulator's C
%% functions have no names anyway (stripped to its exports, as sid's OTP
%% 29): then Erlang call chains are the most a profile can name; native
%% callers are lost (Debian's C code keeps no frame pointers).
-spec choose_call_graph(target()) -> {fp | dwarf, binary()}.
choose_call_graph(#{frame_pointers := true, perf_map := Map, perf_flag := F,
                    native_names := false}) when Map =/= missing ->
    {fp, <<"the node runs with +JPperf ", F/binary, ", so its JIT code keeps frame pointers, "
           "and its emulator does not name its C functions">>};
choose_call_graph(#{frame_pointers := true, perf_map := Map, perf_flag := F}) when Map =/= missing ->
    {dwarf, <<"the emulator names its C functions, which DWARF unwinding follows up to the "
              "first JIT frame (named from the perf map; +JPperf ", F/binary, ")">>};
choose_call_graph(#{frame_pointers := true, perf_flag := F}) ->
    {dwarf, <<"the node runs with +JPperf ", F/binary, " but no perf map was found">>};
choose_call_graph(#{perf_flag := none}) ->
    {dwarf, <<"the node runs without +JPperf: its JIT code keeps no frame pointers">>};
choose_call_graph(#{perf_flag := F}) ->
    {dwarf, <<"the node runs with +JPperf ", F/binary, ": its JIT code keeps no frame pointers">>}.

flag_value(Flag, [Flag, V | _]) -> V;
flag_value(Flag, [_ | Rest]) -> flag_value(Flag, Rest);
flag_value(_, []) -> none.

strip_root(<<"/", R/binary>>) -> strip_root(R);
strip_root(D) -> D.

%% Copies the target's perf map next to the recording (at most 256 MiB).
copy_map(#{perf_map := missing}, _Dir) ->
    missing;
copy_map(#{perf_map := Map}, Dir) ->
    Copy = filename:join(Dir, "perf.map"),
    case filelib:file_size(Map) =< 256 * 1024 * 1024 andalso file:copy(Map, Copy) of
        {ok, _} -> Copy;
        _ -> missing
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
            {not_permitted, access(), Out};
        false ->
            case Has(<<"No such process">>) orelse Has(<<"Couldn't find">>)
                orelse Has(<<"not found">>) orelse alive(OsPid) =/= ok
            of
                true -> {target_gone, OsPid};
                false -> {perf_failed, Status, Out}
            end
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
    Left = beamdiag_agent_deadline:left(Deadline),
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

%% The line of perf's output that says it was refused (its last line is
%% advice on making a setting permanent).
refusal(Out) ->
    Lines = [string:trim(L) || L <- binary:split(Out, <<"\n">>, [global, trim_all])],
    case [L || L <- Lines, lists:any(fun(W) -> binary:match(L, W) =/= nomatch end,
                                     [<<"limited">>, <<"not permitted">>, <<"Permission">>,
                                      <<"No permission">>])] of
        [L | _] -> L;
        [] -> last_line(Out)
    end.

last_line(Out) ->
    Lines = [L || L <- binary:split(Out, <<"\n">>, [global, trim_all]), L =/= <<>>],
    case Lines of
        [] -> <<"(no output)">>;
        _ -> lists:last(Lines)
    end.
