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
-export([nif_loop/5]).
%% Called on the lab node from the scenarios' prepare, release and load MFAs.
-ignore_xref([{prepare, 0}, {release, 1}, {nif_loop, 5}]).
%% Called as Module:format_error/1 on an {error, {Module, Reason}} value.
-ignore_xref([{format_error, 1}]).

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
        Common#{name => nif_yield,
                summary => <<"the same work in a NIF that yields (enif_consume_timeslice, "
                             "enif_schedule_nif): negative control">>,
                load => {?MODULE, nif_loop, ['$duration_ms', '$prepared', spin_yield, 200, 0]},
                expect => []}
    ].

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
    Dir = node_dir(os:getpid()),
    Path = filename:join(Dir, "beamdiag_lab_nif"),
    ok = filelib:ensure_dir(Path),
    ok = file:write_file(Path ++ ".so", So),
    case beamdiag_lab_nif:load(Path) of
        ok ->
            beamdiag_lab_ledger:owner(Ms, fun() ->
                Caller = spawn_link(fun() -> call_loop(Fun, CallMs, SleepMs) end),
                [Caller | [spawn_link(fun waker/0) || _ <- lists:seq(1, ?WAKERS)]]
            end);
        {error, _} = E ->
            E
    end.

%%%===================================================================
%%% Internal
%%%===================================================================

node_dir(OsPid) ->
    filename:join("/tmp", "beamdiag_lab_nif_" ++ OsPid).

call_loop(Fun, CallMs, SleepMs) ->
    ok = beamdiag_lab_nif:Fun(CallMs),
    receive
    after SleepMs -> ok
    end,
    call_loop(Fun, CallMs, SleepMs).

waker() ->
    receive
    after 1 -> ok
    end,
    _ = erlang:phash2(erlang:monotonic_time()),
    waker().

build(Gcc, Include, Src) ->
    Tmp = filename:join(tmp_root(), lists:concat(["beamdiag_nif_", os:getpid(), "_",
                                                  erlang:unique_integer([positive])])),
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

tmp_root() ->
    case os:getenv("TMPDIR") of
        false -> "/tmp";
        "" -> "/tmp";
        T -> T
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
