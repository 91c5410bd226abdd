%%% @doc Lab scenarios for sick nodes: a NIF that holds its scheduler.
%%%
%%% The NIF's C source ships in priv/ (`beamdiag_lab_nif.c'). When one of
%%% these scenarios starts, `prepare/0' builds it on this host with gcc
%%% against the running OTP's `erl_nif.h', in a temporary folder that is
%%% removed as soon as the library is read. The library's bytes go to the
%%% lab node, which writes them into a folder of its own temporary folder
%%% and loads them (a NIF built against OTP 25's header loads on later
%%% releases: NIF 2.x minors are backward compatible). `release/1' removes
%%% that folder when the lab stops; a node held by the NIF ignores SIGTERM,
%%% so the lab kills these nodes with SIGKILL.
%%%
%%% - `nif_stuck': one process calls the plain NIF 200 ms at a time, in a
%%%   loop, while 200 processes wake every millisecond: the node cannot
%%%   finish a distribution handshake.
%%% - `nif_long': the same NIF 100 ms at a time, with a 1 ms sleep between
%%%   calls: the node stays reachable.
%%% - `nif_yield': the yielding variant doing the same work (control).
%%% - `dirty_io_blocked': every dirty IO scheduler blocked in open(2) of a
%%%   FIFO that nobody writes (as on a hung NFS mount: open(2) of a FIFO
%%%   for reading waits in the kernel until a writer comes), and more opens
%%%   queued behind them; `dirty_io_blocked_sdio4' the same with +SDio 4.
%%%
%%% ```
%%% 1> {ok, Lab} = beamdiag_lab:start(nif_stuck, #{duration => 60}).
%%% 2> net_adm:ping(beamdiag_lab:node(Lab)).
%%% pang
%%% 3> beamdiag_lab:stop(Lab).
%%% '''
-module(beamdiag_lab_sick).

-export([scenarios/0, prepare/0, release/1, format_error/1]).
%% Workloads, called on the lab node.
-export([nif_loop/5, nif_bound/4, fifo_open/3, native_leak/4]).
%% Called on the lab node from the scenarios' prepare, release and load MFAs.
-ignore_xref([{prepare, 0}, {release, 1}, {nif_loop, 5}, {nif_bound, 4},
              {fifo_open, 3}, {native_leak, 4}]).
%% Called as Module:format_error/1 on an {error, {Module, Reason}} value.
-ignore_xref([{format_error, 1}]).

-include_lib("kernel/include/file.hrl").

-define(WAKERS, 200).
-define(SRC, "beamdiag_lab_nif.c").

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The sick-node scenarios.
-spec scenarios() -> [beamdiag_lab:scenario()].
scenarios() ->
    Common = #{emu_args => [], modules => [beamdiag_lab_nif, beamdiag_lab_ledger],
               prepare => {?MODULE, prepare, []}, release => {?MODULE, release, []},
               hard_stop => true},
    [
        Common#{name => nif_stuck,
                summary => <<"a plain NIF holding a scheduler 200 ms at a time, 200 processes "
                             "waking every 1 ms: the node fails distribution handshakes">>,
                load => {?MODULE, nif_loop, ['$duration_ms', '$prepared', spin, 200, 0]},
                expect => [scheduler_held_native]},
        Common#{name => nif_long,
                summary => <<"the same NIF 100 ms at a time with a 1 ms sleep between calls: "
                             "the node stays reachable">>,
                load => {?MODULE, nif_loop, ['$duration_ms', '$prepared', spin, 100, 1]},
                expect => [scheduler_held_native]},
        Common#{name => nif_held,
                summary => <<"the plain NIF 200 ms at a time, again and again, from a process "
                             "bound to the last scheduler; nothing else runs there, so the "
                             "other schedulers are free and the node answers">>,
                load => {?MODULE, nif_bound, ['$duration_ms', '$prepared', spin, 200]},
                expect => [scheduler_held_native]},
        Common#{name => native_leak,
                summary => <<"a NIF that mallocs 2 MiB fifteen times a second and never frees: "
                             "the resident memory grows by 30 MiB/s, the VM's accounts stay "
                             "flat (stops at 1,500 MiB)">>,
                load => {?MODULE, native_leak, ['$duration_ms', '$prepared', 2097152, 15]},
                warmup_ms => 1000,
                expect => [native_memory]},
        Common#{name => nif_yield,
                summary => <<"the same work in a NIF that yields (enif_consume_timeslice, "
                             "enif_schedule_nif): negative control">>,
                load => {?MODULE, nif_loop, ['$duration_ms', '$prepared', spin_yield, 200, 0]},
                expect => []}
    ] ++
    [#{name => Name, emu_args => Args, modules => [beamdiag_lab_ledger],
       release => {?MODULE, release, []}, hard_stop => true,
       summary => iolist_to_binary(
                    ["every dirty IO scheduler blocked in open(2) of a FIFO nobody writes, as on "
                     "a hung NFS mount, ", Which, ", and 4 more opens queued behind them",
                     case Warm of
                         true -> "; every module of kernel, stdlib and compiler loaded before "
                                 "(as in a release in embedded mode), so the node still "
                                 "accepts connections";
                         false -> "; nothing loaded before: the node cannot load the code a "
                                  "distribution handshake needs"
                     end]),
       load => {?MODULE, fifo_open, ['$duration_ms', 4, Warm]},
       expect => [dirty_io_blocked]}
     || {Name, Args, Which, Warm} <-
            [{dirty_io_blocked, [], "10 of 10 (the default)", true},
             {dirty_io_blocked_sdio4, ["+SDio", "4"], "4 of 4 (+SDio 4)", true},
             {dirty_io_blocked_cold, [], "10 of 10 (the default)", false}]].

%% @doc Builds the NIF on this host: `{ok, SoBytes}', or an error value
%% when gcc, erl_nif.h or the source is missing or the build fails. Nothing
%% is left on disk.
-spec prepare() -> {ok, binary()} | {error, {?MODULE, term()}}.
prepare() ->
    Include = filename:join([code:root_dir(), "usr", "include"]),
    Gcc = os:find_executable("gcc"),
    case {Gcc, filelib:is_regular(filename:join(Include, "erl_nif.h")), source()} of
        {false, _, _} -> {error, {?MODULE, no_gcc}};
        {_, false, _} -> {error, {?MODULE, {no_header, Include}}};
        {_, _, error} -> {error, {?MODULE, no_source}};
        {_, true, {ok, Src}} -> build(Gcc, Include, Src)
    end.

%% @doc Removes the node's copy of the library (called on this host when
%% the lab stops, before the node is killed).
-spec release(beamdiag_lab:lab()) -> ok.
release(#{os_pid := OsPid}) ->
    Dir = node_dir(OsPid),
    %% The node's own file system, as seen from here (the node may run in
    %% a mount namespace of its own); once the node is gone, this host's.
    Seen = filename:join(["/proc", OsPid, "root" ++ Dir]),
    _ = case filelib:is_dir(Seen) of
            true -> file:del_dir_r(Seen);
            false -> file:del_dir_r(Dir)
        end,
    ok;
release(_) ->
    ok.

%% @doc Turns an error reason of this module into a sentence.
-spec format_error(term()) -> iolist().
format_error(no_gcc) ->
    "cannot build the lab's NIF: gcc is not installed";
format_error({no_header, Include}) ->
    io_lib:format("cannot build the lab's NIF: erl_nif.h is not in ~ts (install the "
                  "Erlang development headers, e.g. Debian's erlang-dev)", [Include]);
format_error(no_source) ->
    "cannot build the lab's NIF: its source " ?SRC " is missing from beamdiag's priv folder";
format_error({gcc, Out}) ->
    io_lib:format("cannot build the lab's NIF: gcc said: ~ts",
                  [beamdiag_safe_text:safe(Out, 2000)]);
format_error({tmp, Why}) ->
    io_lib:format("cannot build the lab's NIF: no temporary folder (~ts)",
                  [file:format_error(Why)]).

%% @doc Writes the library into the node's temporary folder, loads it and
%% starts the load: one process calling `beamdiag_lab_nif:Fun(CallMs)' in a
%% loop with SleepMs between calls, and ?WAKERS processes waking every
%% millisecond; all stop after Ms.
-spec nif_loop(pos_integer(), binary(), spin | spin_yield, pos_integer(), non_neg_integer()) ->
    ok | {error, term()}.
nif_loop(Ms, So, Fun, CallMs, SleepMs) ->
    Path = write_nif(So),
    case beamdiag_lab_nif:load(Path) of
        ok ->
            beamdiag_lab_ledger:owner(Ms, fun() ->
                Caller = spawn_link(fun() -> call_loop(Fun, CallMs, SleepMs) end),
                [Caller | [spawn_link(fun waker/0) || _ <- lists:seq(1, ?WAKERS)]]
            end);
        {error, _} = E ->
            E
    end.

%% @doc Makes a FIFO in the node's temporary folder and starts as many
%% processes as there are dirty IO schedulers, plus Queued, each opening it
%% for reading (a raw open: the dirty IO scheduler itself blocks in
%% open(2) until a writer comes; a plain one would hold the file server
%% instead). With Warm, every module of kernel, stdlib and compiler is
%% loaded first, as a release in embedded mode has them: loading code
%% reads files, which now wait behind the blocked opens. After Ms the
%% openers are killed and the FIFO is opened for reading and writing,
%% which never blocks and lets every waiting open return.
-spec fifo_open(pos_integer(), non_neg_integer(), boolean()) -> ok | {error, term()}.
fifo_open(Ms, Queued, Warm) ->
    _ = Warm andalso load_all([kernel, stdlib, compiler]),
    Dir = node_dir(os:getpid()),
    Fifo = filename:join(Dir, "fifo"),
    ok = filelib:ensure_dir(Fifo),
    _ = os:cmd("mkfifo " ++ Fifo),
    case file:read_file_info(Fifo) of
        {ok, #file_info{type = other}} ->
            N = erlang:system_info(dirty_io_schedulers) + Queued,
            beamdiag_lab_ledger:owner(Ms, fun() ->
                Owner = self(),
                %% When the owner ends, the blocked opens are let go.
                _ = spawn(fun() -> release_fifo(Fifo, monitor(process, Owner)) end),
                [spawn(fun() -> _ = file:open(Fifo, [read, raw, binary]) end)
                 || _ <- lists:seq(1, N)]
            end);
        Other ->
            {error, {no_fifo, Fifo, Other}}
    end.

%% @doc As `nif_loop/5' with the NIF Fun called CallMs at a time without
%% a pause (the process yields between calls), from one process bound to
%% the last normal scheduler (the
%% `scheduler' spawn option, present on OTP 25 to 29), and one process on
%% each other scheduler that wakes every 10 ms: a process left queued on
%% the held scheduler is stolen by the others, so the node answers.
-spec nif_bound(pos_integer(), binary(), spin | spin_yield, pos_integer()) -> ok | {error, term()}.
nif_bound(Ms, So, Fun, CallMs) ->
    Path = write_nif(So),
    case beamdiag_lab_nif:load(Path) of
        ok ->
            Last = erlang:system_info(schedulers_online),
            beamdiag_lab_ledger:owner(Ms, fun() ->
                %% A waker on each other scheduler: those wake every 10 ms
                %% (their timers are their own) and, before going back to
                %% sleep, steal the processes left queued on the held one.
                [bound(Last, fun() -> held_loop(Fun, CallMs) end)
                 | [bound(K, fun() -> tick(10) end) || K <- lists:seq(1, Last - 1)]]
            end);
        {error, _} = E ->
            E
    end.

%% @doc Loads the NIF and calls its leak_malloc/1 with Bytes PerS times a
%% second, from one process, for Ms milliseconds, up to 1,500 MiB.
-spec native_leak(pos_integer(), binary(), pos_integer(), pos_integer()) -> ok | {error, term()}.
native_leak(Ms, So, Bytes, PerS) ->
    Path = write_nif(So),
    case beamdiag_lab_nif:load(Path) of
        ok ->
            beamdiag_lab_ledger:owner(Ms, fun() ->
                [spawn_link(fun() -> malloc_loop(Bytes, PerS, (1500 bsl 20) div Bytes) end)]
            end);
        {error, _} = E ->
            E
    end.

%%%===================================================================
%%% Internal
%%%===================================================================

malloc_loop(_Bytes, _PerS, 0) ->
    receive stop -> ok end;
malloc_loop(Bytes, PerS, Left) ->
    ok = beamdiag_lab_nif:leak_malloc(Bytes),
    receive after 1000 div PerS -> ok end,
    malloc_loop(Bytes, PerS, Left - 1).

%% The library's bytes written into the node's temporary folder: its path
%% without the extension.
write_nif(So) ->
    Path = filename:join(node_dir(os:getpid()), "beamdiag_lab_nif"),
    ok = filelib:ensure_dir(Path),
    ok = file:write_file(Path ++ ".so", So),
    Path.

%% Loads every module of the applications that are there.
load_all(Apps) ->
    _ = [case application:load(App) of
             R when R =:= ok; element(1, R) =:= error ->
                 {ok, Mods} = case application:get_key(App, modules) of
                                  undefined -> {ok, []};
                                  Found -> Found
                              end,
                 code:ensure_modules_loaded(Mods)
         end || App <- Apps],
    true.

%% Waits for the workload's owner to end (it kills the openers), then lets
%% the opens go: a port opens the FIFO read-write (which never blocks), so
%% every open waiting in the kernel returns; twice, for the opens that
%% were queued.
release_fifo(Fifo, MRef) ->
    receive {'DOWN', MRef, process, _, _} -> ok end,
    [begin
         Port = open_port({spawn_executable, "/bin/sh"},
                          [{args, ["-c", "exec 3<>\"$0\"", Fifo]}, exit_status]),
         receive {Port, {exit_status, _}} -> ok after 2000 -> catch port_close(Port) end,
         timer:sleep(200)
     end || _ <- [1, 2]],
    ok.

node_dir(OsPid) ->
    filename:join("/tmp", "beamdiag_lab_nif_" ++ OsPid).

call_loop(Fun, CallMs, SleepMs) ->
    ok = beamdiag_lab_nif:Fun(CallMs),
    receive
    after SleepMs -> ok
    end,
    call_loop(Fun, CallMs, SleepMs).

%% A linked process bound to scheduler K (called through apply: the option
%% is not in spawn_opt's documented type).
bound(K, F) ->
    erlang:apply(erlang, spawn_opt, [F, [link, {scheduler, K}]]).

%% The NIF again and again; between calls the process yields, so that its
%% scheduler passes through its loop (where thread progress, which code
%% loading and new connections wait for, is reported) without ever
%% sleeping: it is always runnable.
held_loop(Fun, CallMs) ->
    ok = beamdiag_lab_nif:Fun(CallMs),
    erlang:yield(),
    held_loop(Fun, CallMs).

tick(Ms) ->
    receive
    after Ms -> ok
    end,
    tick(Ms).

waker() ->
    receive
    after 1 -> ok
    end,
    _ = erlang:phash2(erlang:monotonic_time()),
    waker().

build(Gcc, Include, Src) ->
    Tmp = beamdiag_tmp:path("beamdiag_nif"),
    case file:make_dir(Tmp) of
        ok ->
            try
                C = filename:join(Tmp, ?SRC),
                So = filename:join(Tmp, "beamdiag_lab_nif.so"),
                ok = file:write_file(C, Src),
                Port = open_port({spawn_executable, Gcc},
                                 [{args, ["-O2", "-g", "-fPIC", "-shared", "-I" ++ Include,
                                          "-o", So, C]},
                                  exit_status, stderr_to_stdout, binary, hide]),
                case collect(Port, <<>>) of
                    {0, _} ->
                        {ok, Bin} = file:read_file(So),
                        {ok, Bin};
                    {_, Out} ->
                        {error, {?MODULE, {gcc, Out}}}
                end
            after
                _ = file:del_dir_r(Tmp)
            end;
        {error, Why} ->
            {error, {?MODULE, {tmp, Why}}}
    end.

collect(Port, Acc) ->
    receive
        {Port, {data, D}} -> collect(Port, <<Acc/binary, D/binary>>);
        {Port, {exit_status, S}} -> {S, Acc}
    after 60000 ->
        catch port_close(Port),
        {timeout, Acc}
    end.

%% The C source, from the application's priv folder or from inside the
%% escript's archive, which `rebar3 escriptize' packs priv into.
source() ->
    Priv = case code:priv_dir(beamdiag) of
               D when is_list(D) -> D;
               {error, bad_name} ->
                   filename:join(filename:dirname(filename:dirname(code:which(?MODULE))), "priv")
           end,
    case erl_prim_loader:get_file(filename:join(Priv, ?SRC)) of
        {ok, Bin, _} -> {ok, Bin};
        error -> error
    end.
