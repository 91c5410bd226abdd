%%% @doc Lock-counting advice, in one place: what relieves contention on
%%% each lock class (the knowledge base, `class/1'), fitted to the node's
%%% release and allocator flags (`class/4', `allocator/2'); what fits a
%%% contended ETS table (`ets/1'); and how to count the locks of a node on
%%% the stock emulator (`emulator/1', `msacc_split/1', `session/0'). The
%%% lock rules, the ledger's notes, the text report and `beamdiag emu-type'
%%% all take their words from here.
%%%
%%% ```
%%% 1> beamdiag_lock_advice:ets(#{write_concurrency => <<"false">>}).
%%% <<"fix: create the table with {write_concurrency, true} (or auto) and ...">>
%%% '''
-module(beamdiag_lock_advice).

-export([class/1, class/4, ets/1, allocator/2, emulator/1, msacc_split/1, session/0]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc What a lock class protects and what relieves contention on it, or
%% `undefined' for a class the knowledge base does not know.
-spec class(binary()) -> {binary(), binary()} | undefined.
class(<<"db_hash_slot">>) ->
    {<<"a group of hash buckets of one ETS table with write_concurrency">>,
     <<"spread the writes over more keys or shard the table per scheduler">>};
class(<<"erl_db_catree_base_node">>) ->
    {<<"a subtree of an ordered_set ETS table with write_concurrency">>,
     <<"spread the writes over more keys or shard the table per scheduler">>};
class(<<"erl_db_catree_route_node">>) ->
    {<<"a routing node of an ordered_set ETS table with write_concurrency">>,
     <<"spread the writes over more keys or shard the table per scheduler">>};
class(<<"db_tab">>) ->
    {<<"a whole ETS table (the table lock; every write without write_concurrency)">>,
     <<"create the table with {write_concurrency, true} or shard it">>};
class(<<"alcu_allocator">>) ->
    {<<"one instance of a memory allocator">>,
     <<"give dirty schedulers their own instances with +Mdai max">>};
class(<<"run_queue">>) ->
    {<<"a scheduler's run queue (enqueue, dequeue, work stealing)">>,
     <<"fewer, longer-running processes; no more schedulers (+S) than cores; OTP 28 "
       "or later, whose work stealing does not wait on busy run queues">>};
class(<<"process_table">>) ->
    {<<"the process table (spawn, exit, erlang:processes/0)">>,
     <<"stop listing all processes on a timer">>};
class(<<"erts_mmap">>) ->
    {<<"the VM's memory map (carrier creation and release)">>,
     <<"preallocate a super carrier (+MMscs N, in MB) so carriers come from it, "
       "and let carriers be cached longer (+MMmcs)">>};
class(<<"mseg">>) ->
    {<<"the segment cache of memory carriers">>,
     <<"a super carrier (+MMscs N) and larger multiblock carriers (+MBlmbcs)">>};
class(<<"port_lock">>) ->
    {<<"one port (socket, file, driver instance)">>,
     <<"spread the traffic over more ports (connection pools) or let one process "
       "own each port">>};
class(<<"port_sched_lock">>) ->
    {<<"the task queue of one port">>,
     <<"fewer processes sending to the same port; batch writes">>};
class(<<"drv_ev_state">>) ->
    {<<"the poll-set state of file descriptors (I/O event registration)">>,
     <<"fewer sockets switching between active and passive; {active, N} instead of once">>};
class(<<"pix_lock">>) ->
    {<<"a slot of the process index (process lookup by pid, exit, link)">>,
     <<"less pid lookup traffic: fewer monitors, links and is_process_alive calls">>};
class(<<"atom_tab">>) ->
    {<<"the atom table (creating atoms, binary_to_atom, list_to_atom)">>,
     <<"stop creating atoms at run time; use binary_to_existing_atom">>};
class(<<"proc_main">>) ->
    {<<"the main lock of one process (its state, heap, scheduling)">>,
     <<"shard the process or stop others from inspecting it">>};
class(<<"proc_status">>) ->
    {<<"the scheduling state of one process">>,
     <<"fewer processes signalling the same process; less dirty work per process">>};
class(<<"proc_btm">>) ->
    {<<"the timer of one process (receive ... after)">>,
     <<"fewer timeouts set and cancelled on the same process">>};
class(<<"proc_link">>) ->
    {<<"the links and monitors of one process">>,
     <<"fewer monitors on the same process">>};
class(<<"proc_msgq">>) ->
    {<<"the message queue of one process">>,
     <<"shard the receiver or use {message_queue_data, off_heap}">>};
class(<<"dist_entry">>) ->
    {<<"the connection to one other node">>,
     <<"spread traffic over more connections or send less over distribution">>};
class(_) ->
    undefined.

%% @doc The advice for a contended lock class (the knowledge base's, or
%% `Fix' for a class it does not know), fitted to the node's OTP release
%% (`unknown' when the lock data does not say) and to the allocator flags
%% the node already has: a super carrier (+MMscs) or dirty allocator
%% instances (+Mdai).
-spec class(binary(), non_neg_integer() | unknown, beamdiag_agent_vm:settings(), binary()) ->
    binary().
class(Class, Release, Settings, Fix) ->
    fitted(Class, Settings, release_fix(Class, Release, Fix)).

%% @doc The fix for a contended ETS table that fits the table's options
%% (`ets:info/1' values as the agent reports them).
-spec ets(beamdiag_lock_data:table() | #{}) -> binary().
ets(#{write_concurrency := <<"false">>}) ->
    <<"fix: create the table with {write_concurrency, true} (or auto) and "
      "{decentralized_counters, true}; if it stays hot, use one table per scheduler">>;
ets(#{write_concurrency := _}) ->
    <<"fix: the table already has write_concurrency, so the writers hit the same keys "
      "(the same hash-slot locks): spread hot keys (a key per scheduler, "
      "{Key, erlang:system_info(scheduler_id)}, summed when read) or use one table per "
      "scheduler; decentralized_counters only helps inserts and deletes">>;
ets(_) ->
    <<"fix: {write_concurrency, true} and {decentralized_counters, true}, or one table "
      "per scheduler">>.

%% @doc The fix for a contended allocator, from the dirty allocator
%% instances the lock data counted (`unknown' when it could not) or else
%% from the node's +Mdai.
-spec allocator(non_neg_integer() | unknown, beamdiag_agent_vm:settings()) -> binary().
allocator(0, _Settings) ->
    <<"the dirty schedulers share one instance (+Mdai 0): start the node with +Mdai max">>;
allocator(N, _Settings) when is_integer(N) ->
    iolist_to_binary(io_lib:format(
        "dirty schedulers already have their own instances (~b); the contention is between "
        "normal schedulers freeing memory another allocated: look for large messages and "
        "binaries crossing processes", [N]));
allocator(_, Settings) ->
    fitted(<<"alcu_allocator">>, Settings,
           <<"if the dirty schedulers share one instance, start the node with +Mdai max">>).

%% @doc How to count the locks of a node on the stock emulator: what to give
%% `beamdiag emu-type build' for it,
%% from the node's settings (`beamdiag_agent_vm:settings/0'): the exact OTP
%% source it needs, the command, and the restart. The build must run where
%% the node's Erlang is installed, by a beamdiag that this OTP can run.
-spec emulator(beamdiag_agent_vm:settings()) -> binary().
emulator(Settings = #{lcnt_emulator_installed := true}) ->
    Otp = version(maps:get(otp_version, Settings, undefined), <<"?">>),
    iolist_to_binary([
        "locks not counted: the node runs OTP ", Otp, " on the stock emulator, and the "
        "lock-counting emulator is installed beside it: restart the node with -emu_type lcnt "
        "(for a release: add it to vm.args, or ERL_FLAGS=\"-emu_type lcnt\") and diagnose "
        "again"
    ]);
emulator(Settings) ->
    Rel = version(maps:get(otp_release, Settings, undefined), <<"?">>),
    Otp = version(maps:get(otp_version, Settings, undefined), Rel),
    Erts = version(maps:get(erts_version, Settings, undefined), <<"?">>),
    Tarball = ["otp_src_", Otp, ".tar.gz"],
    iolist_to_binary([
        "locks not counted: the node runs OTP ", Otp, " (ERTS ", Erts, ") on the stock emulator. "
        "To name contended locks, build the lock-counting emulator for exactly that "
        "release where the node's Erlang is installed (its machine or container, as root, "
        "with a beamdiag escript that OTP ", Rel, " loads: build it there with rebar3 if "
        "in doubt): beamdiag emu-type build --install "
        "--otp-src ", Tarball, ", the source from "
        "https://github.com/erlang/otp/releases/download/OTP-", Otp, "/", Tarball,
        " (for Debian's erlang packages --add-deb-src fetches it instead); then restart "
        "the node with -emu_type lcnt"
    ]).

%% A version number from a node's settings (which come from the target:
%% anything else becomes the default).
-spec version(term(), binary()) -> binary().
version(V, Default) when is_binary(V), byte_size(V) =< 32 ->
    case re:run(V, "^[0-9]+(\\.[0-9]+)*$", [{capture, none}]) of
        match -> V;
        nomatch -> Default
    end;
version(_, Default) ->
    Default.

%% @doc The end of the microstate note of the text report when the
%% emulator records only the default states: how to get the extra states.
-spec msacc_split(beamdiag_agent_vm:settings()) -> iolist().
msacc_split(Settings) ->
    case maps:get(lcnt_emulator_installed, Settings, false) of
        true -> "restart the\n  node with -emu_type lcnt (installed beside this "
                "emulator, extra states)\n";
        _ -> "build the\n  lock-counting emulator with extra states: beamdiag "
             "emu-type build --install\n"
    end.

%% @doc Where a finding that needs lock names sends the user when the node
%% does not count locks.
-spec session() -> string().
session() ->
    "run the lock session for the lock names: the notes say which lock-counting "
    "emulator to build for this node (beamdiag emu-type build) and how to start it".

%%%===================================================================
%%% Internal
%%%===================================================================

%% The advice for a contended lock class, fitted to the allocator flags the node already
%% has: a super carrier (+MMscs) or dirty allocator instances (+Mdai).
-spec fitted(binary(), beamdiag_agent_vm:settings(), binary()) -> binary().
fitted(Class, Settings, Fix) when Class =:= <<"erts_mmap">>; Class =:= <<"mseg">> ->
    case safe_setting(mmscs, Settings) of
        undefined ->
            Fix;
        Scs when Scs =:= <<"0">> ->
            Fix;
        Scs ->
            iolist_to_binary(
              ["a super carrier is already reserved (+MMscs ", Scs, " MB): if the node's "
               "memory outgrows it, carriers come from the OS again, so raise it to what the "
               "node holds at peak; and let carriers be cached longer (+MMmcs)"])
    end;
fitted(<<"alcu_allocator">>, Settings, Fix) ->
    case safe_setting(mdai, Settings) of
        Dai when Dai =:= undefined; Dai =:= <<"0">> ->
            Fix;
        Dai ->
            iolist_to_binary(
              ["dirty schedulers already have their own allocator instances (+Mdai ", Dai,
               "): the contention is between threads freeing memory another allocated; look "
               "for large messages and binaries crossing processes"])
    end;
fitted(_Class, _Settings, Fix) ->
    Fix.

%% Run-queue advice depends on the node's release: OTP 28 reworked work
%% stealing (OTP pull request 9594: the victim's run-queue lock is only
%% tried, busy victims are skipped and revisited last, up to half of a
%% victim's queue is stolen at once and a stolen process runs directly).
-spec release_fix(binary(), non_neg_integer() | unknown, binary()) -> binary().
release_fix(<<"run_queue">>, Rel, _Fix) when is_integer(Rel), Rel < 28 ->
    <<"upgrade to OTP 28 or later, whose work stealing only tries a victim's run-queue "
      "lock and moves on when it is taken, and steals up to half a queue at once (about "
      "ten times less run_queue lock wait on a reported workload); until then, fewer, "
      "longer-running processes (batch short jobs), and no more schedulers (+S) than "
      "the node has cores">>;
release_fix(<<"run_queue">>, Rel, _Fix) when is_integer(Rel) ->
    <<"this release already steals work without waiting on busy run queues (a failed "
      "steal counts as a collision, not as wait), so the wait left comes from processes "
      "being woken into other schedulers' queues and from long steals: fewer wake-ups "
      "across schedulers (batch messages to the same process, fewer, longer-running "
      "processes) and no more schedulers (+S) than the node has cores">>;
release_fix(_Class, _Rel, Fix) ->
    Fix.

%% A setting that came from the target, for advice that quotes it: a short
%% printable binary, or `undefined'.
safe_setting(Key, Settings) ->
    case maps:get(Key, Settings, undefined) of
        V when is_binary(V), byte_size(V) =< 32 ->
            case re:run(V, "^[A-Za-z0-9_.]+$", [{capture, none}]) of
                match -> V;
                nomatch -> undefined
            end;
        _ ->
            undefined
    end.

