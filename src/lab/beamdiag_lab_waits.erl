%%% @doc Lab scenarios of a node that waits instead of burning: who waits
%%% on whom.
%%%
%%% <ul>
%%% <li>`fifo_open': one process opens, with a plain `file:open/2', a FIFO
%%% that nobody writes. The node's file server waits for the opener's io
%%% server, which is blocked in open(2) on a dirty I/O scheduler; `callers'
%%% processes (default 8) that each call `file:read_file_info/1' every
%%% 100 ms wait behind it, in gen:call. The node makes the FIFO in a folder
%%% of its own, in its own file system (a node in a container has its own
%%% /tmp); it is written once and removed when the lab stops, which lets
%%% the open return.</li>
%%% <li>`busy_dist': the node starts a second node (its peer, killed after
%%% the workload's time bound at the latest) and `senders' processes
%%% (default 8) send it 64 kB binaries as fast as they can, while a
%%% controller stops the peer's OS process 90% of each second (SIGSTOP,
%%% SIGCONT): the peer reads slowly, the distribution buffer fills and
%%% every sender is suspended (busy_dist_port).</li>
%%% <li>`busy_pipe': `loggers' processes (default 8) write 1 kB lines with
%%% `port_command/2' to a port program that never reads its standard input
%%% (`sleep', as a log shipper that has stalled): the pipe fills, the
%%% driver's queue passes its busy limit and every logger is suspended
%%% (busy_port). The program ends 30 s after the workload's time bound.</li>
%%% </ul>
%%%
%%% ```
%%% 1> {ok, Lab} = beamdiag_lab:start(fifo_open, #{duration => 60}).
%%% '''
-module(beamdiag_lab_waits).

-export([scenarios/0, params/1]).
%% Run on this host when the lab stops.
-export([release_fifo/1, release_peer/1]).
%% Workloads, called on the lab node.
-export([fifo_dir/0, fifo_open/3, unblock_fifo/0, busy_dist/3, peer_os_pid/0, busy_pipe/2]).
-ignore_xref([{fifo_dir, 0}, {fifo_open, 3}, {unblock_fifo, 0}, {busy_dist, 3}, {peer_os_pid, 0}, {params, 1},
              {release_fifo, 1}, {release_peer, 1}, {busy_pipe, 2}]).

-export_type([params/0]).

%% The variation, merged over the scenario's defaults (which give each key).
-type params() :: #{callers => 1..1000, senders => 1..100, bytes => 64..16777216,
                    loggers => 1..100}.

-define(PEER_KEEPER, beamdiag_lab_peer_keeper).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The wait scenarios.
-spec scenarios() -> [beamdiag_lab:scenario()].
scenarios() ->
    [#{name => fifo_open,
       summary => <<"a plain file:open of a FIFO that nobody writes holds the file server; 8 "
                    "processes calling file:read_file_info wait behind it (params: callers)">>,
       emu_args => [], load => {?MODULE, fifo_open, ['$duration_ms', '$params', '$prepared']},
       params => #{callers => 8},
       %% The FIFO's folder is named on this host: the workload ships
       %% alone, without the project's other modules.
       prepare => {?MODULE, fifo_dir, []},
       release => {?MODULE, release_fifo, []},
       modules => [beamdiag_lab_ledger],
       warmup_ms => 500,
       expect => [wait_chain]},
     #{name => busy_dist,
       summary => <<"8 processes send 64 kB binaries to a peer node stopped 90% of each second: "
                    "the distribution buffer fills and they are suspended (params: senders, "
                    "bytes)">>,
       emu_args => [], load => {?MODULE, busy_dist, ['$duration_ms', '$params', '$cookie']},
       params => #{senders => 8, bytes => 65536},
       release => {?MODULE, release_peer, []},
       modules => [beamdiag_lab_ledger],
       warmup_ms => 2000,
       expect => [busy_port]},
     #{name => busy_pipe,
       summary => <<"8 loggers write lines to a port program that never reads its standard "
                    "input: the pipe fills and they are suspended (params: loggers)">>,
       emu_args => [], load => {?MODULE, busy_pipe, ['$duration_ms', '$params']},
       params => #{loggers => 8},
       modules => [beamdiag_lab_ledger],
       warmup_ms => 1000,
       expect => [busy_port]}].

%% @doc The variation checked.
-spec params(beamdiag_lab:params()) -> {ok, params()} | {error, {beamdiag_lab, term()}}.
params(P) ->
    Bad = maps:filter(fun(callers, N) -> not (is_integer(N) andalso N >= 1 andalso N =< 1000);
                         (senders, N) -> not (is_integer(N) andalso N >= 1 andalso N =< 100);
                         (bytes, N) -> not (is_integer(N) andalso N >= 64 andalso N =< 16777216);
                         (loggers, N) -> not (is_integer(N) andalso N >= 1 andalso N =< 100);
                         (_, _) -> true
                      end, P),
    case map_size(Bad) of
        0 -> {ok, P};
        _ -> {error, {beamdiag_lab, {params, waits, Bad}}}
    end.

%% @doc The lab node's FIFO written once (the blocked open returns) and
%% removed.
-spec release_fifo(beamdiag_lab:lab()) -> ok.
release_fifo(#{peer := Peer}) ->
    _ = catch peer:call(Peer, ?MODULE, unblock_fifo, [], 5000),
    ok.

%% @doc On the lab node: the FIFO written once and removed.
-spec unblock_fifo() -> ok.
unblock_fifo() ->
    case persistent_term:get({?MODULE, fifo}, undefined) of
        undefined ->
            ok;
        Fifo ->
            %% A writer's open returns at once while a reader waits;
            %% bounded in case none does.
            _ = os:cmd("timeout 2 sh -c 'echo > \"" ++ Fifo ++ "\"' 2>/dev/null"),
            _ = file:delete(Fifo),
            _ = file:del_dir(filename:dirname(Fifo)),
            ok
    end.

%% @doc The peer of a busy_dist node killed (it may be stopped).
-spec release_peer(beamdiag_lab:lab()) -> ok.
release_peer(#{peer := Peer}) ->
    case catch peer:call(Peer, ?MODULE, peer_os_pid, [], 5000) of
        OsPid when is_list(OsPid) -> _ = os:cmd("kill -9 " ++ OsPid ++ " 2>/dev/null"), ok;
        _ -> ok
    end.

%% @doc A new folder's path for the FIFO (made by the workload).
-spec fifo_dir() -> {ok, file:filename()}.
fifo_dir() ->
    {ok, beamdiag_tmp:path("beamdiag_lab_fifo")}.

%% @doc The FIFO, its opener and the callers, for Ms milliseconds.
-spec fifo_open(pos_integer(), params(), file:filename()) -> ok.
fifo_open(Ms, P, Dir) ->
    ok = file:make_dir(Dir),
    Fifo = filename:join(Dir, "fifo"),
    "ok\n" = os:cmd("mkfifo '" ++ Fifo ++ "' && echo ok"),
    persistent_term:put({?MODULE, fifo}, Fifo),
    beamdiag_lab_ledger:owner(Ms, fun() ->
        Opener = spawn_link(fun() -> _ = file:open(Fifo, [read]), receive stop -> ok end end),
        [Opener | [spawn_link(fun() -> caller() end) || _ <- lists:seq(1, maps:get(callers, P))]]
    end).

%% @doc The peer, the senders and the controller that stops the peer, for
%% Ms milliseconds.
-spec busy_dist(pos_integer(), params(), atom()) -> ok.
busy_dist(Ms, P, Cookie) ->
    Erl = os:find_executable("erl"),
    Timeout = os:find_executable("timeout"),
    Name = list_to_atom("beamdiag_lab_slow_peer_" ++ os:getpid()),
    %% `timeout' kills the peer after the time bound whatever its state (a
    %% stopped node does not see its stdin close).
    {ok, Peer, Node} = peer:start(#{name => Name, connection => standard_io,
                                    exec => {Timeout, ["-s", "KILL", integer_to_list(Ms div 1000 + 30),
                                                       Erl]},
                                    args => ["-setcookie", atom_to_list(Cookie), "-hidden"]}),
    OsPid = peer:call(Peer, os, getpid, []),
    %% Keeps the peer's OS pid for the release, and lets the peer go on and
    %% stops it when the workload ends.
    Keeper = spawn(fun() -> keeper(Peer, OsPid) end),
    true = register(?PEER_KEEPER, Keeper),
    true = net_kernel:connect_node(Node),
    %% A name nobody has there: the peer decodes each message and drops it.
    Sink = {beamdiag_lab_sink, Node},
    beamdiag_lab_ledger:owner(Ms, fun() ->
        Bin = binary:copy(<<7>>, maps:get(bytes, P)),
        Ctrl = spawn_link(fun() -> control(OsPid) end),
        Keeper ! {watch, Ctrl},
        [Ctrl | [spawn_link(fun() -> sender(Sink, Bin) end) || _ <- lists:seq(1, maps:get(senders, P))]]
    end).

%% @doc The peer's OS pid (for the release).
-spec peer_os_pid() -> string() | undefined.
peer_os_pid() ->
    case whereis(?PEER_KEEPER) of
        undefined -> undefined;
        K ->
            K ! {os_pid, self()},
            receive {os_pid, P} -> P after 2000 -> undefined end
    end.

%%%===================================================================
%%% Internal
%%%===================================================================

%% @doc The stalled program's port and the loggers that write to it, for
%% Ms milliseconds.
-spec busy_pipe(pos_integer(), params()) -> ok.
busy_pipe(Ms, P) ->
    beamdiag_lab_ledger:owner(Ms, fun() ->
        Self = self(),
        %% The port's owner: it opens the port and keeps it.
        Owner = spawn_link(fun() ->
                               Port = open_port({spawn, "sleep " ++ integer_to_list(Ms div 1000 + 30)},
                                                [binary]),
                               Self ! {port, Port},
                               receive stop -> ok end
                           end),
        Port = receive {port, Pt} -> Pt end,
        Line = binary:copy(<<"log line ">>, 113),
        [Owner | [spawn_link(fun() -> logger(Port, Line) end)
                  || _ <- lists:seq(1, maps:get(loggers, P))]]
    end).

logger(Port, Line) ->
    true = erlang:port_command(Port, Line),
    logger(Port, Line).

caller() ->
    _ = file:read_file_info("/"),
    receive after 100 -> ok end,
    caller().

sender(Sink, Bin) ->
    Sink ! Bin,
    sender(Sink, Bin).

%% The peer stopped 900 ms of each second.
control(OsPid) ->
    _ = os:cmd("kill -STOP " ++ OsPid),
    receive after 900 -> ok end,
    _ = os:cmd("kill -CONT " ++ OsPid),
    receive after 100 -> ok end,
    control(OsPid).

keeper(Peer, OsPid) ->
    receive
        {watch, Ctrl} ->
            MRef = erlang:monitor(process, Ctrl),
            keeper(Peer, OsPid, MRef);
        {os_pid, From} ->
            From ! {os_pid, OsPid},
            keeper(Peer, OsPid)
    end.

keeper(Peer, OsPid, MRef) ->
    receive
        {os_pid, From} ->
            From ! {os_pid, OsPid},
            keeper(Peer, OsPid, MRef);
        {'DOWN', MRef, process, _, _} ->
            _ = os:cmd("kill -CONT " ++ OsPid),
            catch peer:stop(Peer),
            _ = os:cmd("kill -9 " ++ OsPid ++ " 2>/dev/null"),
            ok
    end.
