%%% @doc The finding catalogue: every finding beamdiag can report, in one place.
%%%
%%% The rules (`beamdiag_rules', `beamdiag_lock_rules', `beamdiag_profile_rules')
%%% name a finding by its id and fill in the evidence they measured; the
%%% catalogue supplies the title, what the finding means, the fix and when
%%% not to apply it. `docs/FINDINGS.md' is generated from this module
%%% (`beamdiag catalogue'), and a test keeps the two in step.
%%%
%%% ```
%%% 1> beamdiag_catalogue:entry(busy_wait).
%%% #{id => busy_wait, area => ledger, title => <<"Schedulers burn CPU busy-waiting">>, ...}
%%% '''
-module(beamdiag_catalogue).

-export([entry/1, markdown/0]).
%% Called by the tests only.
-ifdef(TEST).
-export([entries/0, ids/0]).
-endif.

-export_type([entry/0, id/0, part/0, test/0]).

-type id() :: atom().
-type entry() :: #{
    id := id(),
    area := ledger | locks | processes | memory | node | profile | cluster,
    title := binary(),
    meaning := binary(),
    fix := binary(),
    fitted => [part()],
    when_not := binary()
}.

%% A fix that depends on the node is written as parts: text, and the
%% places `beamdiag_fix_text' fits to the node's settings.
%% <ul>
%% <li>`{flags, Wanted, Todo, Done}': flags to advise. When the node lacks
%%   some (of those its release documents), `Todo', where `flags' stands for
%%   the flags it lacks and `already' for a note naming those it has;
%%   otherwise `Done'.</li>
%% <li>`{has, Test, Then, Else}': `Then' when the node's settings pass the
%%   test, where `value' stands for the node's value; otherwise `Else'.
%%   Tests: `{in, Keys, Values}' (every key's value is one of them),
%%   `{changed, Key}' (not the documented default), `{not_in, Key, Values}'
%%   (a missing key counts as the first value).</li>
%% <li>`{documented, Flag, Then, Else}': `Then' when the node's release
%%   documents the flag.</li>
%% </ul>
%% The catalogue shows the general form (every flag advised, the node
%% lacking every setting) and says how it is fitted.
-type part() :: binary() | flags | already | value
              | {flags, [{atom(), binary()}], [part()], [part()]}
              | {has, test(), [part()], [part()]}
              | {documented, binary(), [part()], [part()]}.
-type test() :: {in, [atom()], [binary()]} | {changed, atom()} | {not_in, atom(), [binary()]}.

%%%===================================================================
%%% API
%%%===================================================================

%% @doc All catalogue entries, in the order the docs list them. A fix
%% written as parts (`part()') is in `fitted', and `fix' holds its general
%% form.
-spec entries() -> [entry()].
entries() ->
    [case E of
         #{fix := Parts} when is_list(Parts) -> E#{fix => general(Parts), fitted => Parts};
         _ -> E
     end || E <- written()].

%% @doc The general form of a fix written as parts: every flag advised,
%% the node lacking every setting the parts test.
-spec general([part()]) -> binary().
general(Parts) ->
    iolist_to_binary(general(Parts, <<>>)).

%% The entries as written: a fix that depends on the node as parts.
written() ->
    [
        #{
            id => busy_wait,
            area => ledger,
            title => <<"Schedulers burn CPU busy-waiting">>,
            meaning =>
                <<"The OS counts scheduler threads on CPU for much longer than the BEAM "
                  "counts them busy. Before a scheduler sleeps it spins, looking for work; "
                  "that spinning shows as CPU use in top, in container metrics and on the "
                  "bill, but does no work.">>,
            fix =>
                [{flags, [{sbwt, <<"none">>}, {sbwtdcpu, <<"none">>}, {sbwtdio, <<"none">>}],
                  [<<"Start the node with ">>, flags, <<" (in vm.args, or ERL_FLAGS)">>, already],
                  [<<"Busy waiting is already off on every scheduler type">>, already]},
                 <<". Prove it with `beamdiag experiment` under your own load: OS CPU per unit "
                   "of work should drop while throughput and latency stay within noise.">>],
            when_not =>
                <<"On a dedicated host where nothing else needs the CPU and wake-up "
                  "latency matters more than the CPU bill, the spinning is cheap and buys "
                  "lower latency: leave the default.">>
        },
        #{
            id => cpu_starvation,
            area => ledger,
            title => <<"Scheduler threads wait for a CPU">>,
            meaning =>
                <<"Scheduler threads were runnable but the kernel had no CPU for them: "
                  "another process on the host (or a noisy neighbour, or the hypervisor: "
                  "see steal) takes the cores the BEAM needs. The BEAM counts this time as "
                  "busy, so scheduler utilization looks high while little work is done.">>,
            fix =>
                [<<"Find the competitor (the processes named in the evidence, top -H, the "
                   "host's steal time) and move it away, or give the BEAM cores of its own "
                   "(cpuset, taskset).">>,
                 {has, {not_in, bind_type, [<<"unbound">>]},
                  [<<" The schedulers are bound to cores (bind type ">>, value, <<"): a bound "
                     "scheduler cannot move off a core that a competitor holds; on a shared "
                     "host start the node with +sbt u (unbound) or give it cores of its "
                     "own.">>],
                  []},
                 <<" If the host is simply oversubscribed, lower the node's schedulers to the "
                   "CPUs it really gets (+S N:N) so that its threads do not queue behind each "
                   "other.">>],
            when_not =>
                <<"Short bursts during deploys or batch jobs are expected; act when it "
                  "persists under normal load.">>
        },
        #{
            id => cpu_throttling,
            area => ledger,
            title => <<"The container's CPU quota throttles the node">>,
            meaning =>
                <<"The cgroup's CPU quota ran out inside scheduling periods and the kernel "
                  "stopped every thread of the node until the next period. Scheduler "
                  "threads sit idle-but-busy, latency jumps by up to a period (100 ms by "
                  "default).">>,
            fix =>
                [<<"Raise the CPU limit, or match the schedulers to the quota: +S Q:Q with Q "
                   "the quota in whole CPUs (recent OTP releases do this by default unless +S "
                   "is set)">>,
                 {flags, [{sbwt, <<"none">>}, {sbwtdcpu, <<"none">>}, {sbwtdio, <<"none">>}],
                  [<<", and turn busy waiting off (">>, flags, <<") so spinning does not eat "
                     "the quota">>, already],
                  [<<"; busy waiting is already off, so spinning does not eat the quota">>]},
                 <<".">>],
            when_not =>
                <<"A burst quota that is meant to cap a batch job; then the throttling is "
                  "the intended behaviour.">>
        },
        #{
            id => scheduler_blocking,
            area => ledger,
            title => <<"Busy schedulers are blocked, not running">>,
            meaning =>
                <<"The BEAM counts schedulers busy for longer than the OS had them on a "
                  "CPU or waiting for one: the thread was asleep in the kernel while "
                  "the BEAM believed it was working. Causes: lock waits inside the VM "
                  "(allocators, ETS, run queues), page faults, or NIFs and drivers that "
                  "block in a system call.">>,
            fix =>
                <<"Run the lock session: start the node on the lock-counting emulator "
                  "(`beamdiag emu-type build --install`, then `erl -emu_type lcnt`) and "
                  "diagnose again; it names the lock. Move blocking native code to "
                  "dirty IO schedulers (ERL_NIF_DIRTY_JOB_IO_BOUND). Check major page "
                  "faults in the evidence.">>,
            when_not =>
                <<"Dirty IO schedulers are expected to block on I/O; this finding only "
                  "looks at normal and dirty CPU schedulers.">>
        },
        #{
            id => scheduler_held_native,
            area => ledger,
            title => <<"A scheduler is held in native code">>,
            meaning =>
                <<"A normal scheduler thread ran (or waited for a CPU to run) for the whole "
                  "window without once going back to its scheduler loop: native code (a NIF, "
                  "or a long BIF) holds it and does not yield. The processes queued on that "
                  "scheduler wait, and a node whose scheduler is held can miss distribution "
                  "handshakes and ticks, ignore SIGTERM, and stall every call that needs all "
                  "schedulers. Read from the host alone (/proc/PID/task, and perf on that "
                  "thread), so it is found even when the node does not answer.">>,
            fix =>
                <<"Make the NIF yield: do the work in slices of about a millisecond, report "
                  "each with enif_consume_timeslice and, when it returns 1, continue with "
                  "enif_schedule_nif (or return to Erlang and call again). Or run it on a "
                  "dirty scheduler: declare it with ERL_NIF_DIRTY_JOB_CPU_BOUND (or "
                  "ERL_NIF_DIRTY_JOB_IO_BOUND when it blocks) in its ErlNifFunc entry. "
                  "Scheduler flags (+scl, +sub, +sbt) do not help: the scheduler is not "
                  "idle, it is held.">>,
            when_not =>
                <<"A NIF that returns within about a millisecond is fine on a normal "
                  "scheduler; this finding needs the thread held for the whole window.">>
        },
        #{
            id => dirty_io_blocked,
            area => ledger,
            title => <<"Dirty IO schedulers are blocked in the kernel">>,
            meaning =>
                <<"Dirty IO scheduler threads sat in one system call for most of the window "
                  "(an open, read or fsync that does not return: a hung NFS or FUSE mount, a "
                  "FIFO or device with no other end, a disk that does not answer). Every file "
                  "operation of the node runs on these threads: the file module, prim_file and "
                  "the file server, code loading (the code server reads .beam files) and name "
                  "resolution that reads /etc/hosts or resolv.conf. When all of them are "
                  "blocked, all of that waits, and a node that must load code or look up a "
                  "name to accept a distribution connection stops answering. Read from the "
                  "host (/proc/PID/task: each thread's state, wchan, system call and the file "
                  "behind it), so it is found even when the node does not answer.">>,
            fix =>
                <<"Free the file the calls wait on: the mount (an NFS server that does not "
                  "answer: mount it soft with a timeout, or move the files off it), or the "
                  "FIFO or device with no other end. Keep calls that may hang off the "
                  "node's critical path: open such files from a process that the rest does "
                  "not wait for, or from a port program that can be killed, and put timeouts "
                  "on the callers. More dirty IO schedulers (+SDio, 10 by default, up to "
                  "1024) leave some free for the node's own file work and code loading while "
                  "a few hang, but every hung call still holds one.">>,
            when_not =>
                <<"A dirty IO scheduler in one long read or write of a large file that moves "
                  "(its CPU time and context switches grow) is working, not blocked; this "
                  "finding needs the same call, not run once, for most of the window.">>
        },
        #{
            id => host_memory_low,
            area => ledger,
            title => <<"The node's memory is nearly used up">>,
            meaning =>
                <<"The host's available memory (MemAvailable), or the cgroup's room under its "
                  "memory.max, is below a tenth of the total. Next comes the kernel's OOM "
                  "killer, or the cgroup's, which ends the node without a crash dump.">>,
            fix =>
                <<"Find what holds the memory: the node's resident memory is in the evidence; "
                  "when the node answers, `beamdiag diagnose` names the processes and queues "
                  "that hold it (message_queue_growth). Raise the limit only once the growth "
                  "is understood.">>,
            when_not =>
                <<"A host that keeps its page cache full shows little MemFree, but "
                  "MemAvailable counts the cache it can drop; this finding reads "
                  "MemAvailable.">>
        },
        #{
            id => high_system_cpu,
            area => ledger,
            title => <<"The kernel takes a large share of the node's CPU">>,
            meaning =>
                <<"Much of the node's CPU time is system time: system calls, page faults, "
                  "futex wake-ups, or kernel work triggered by the node (auditd rules, "
                  "file I/O, socket work).">>,
            fix =>
                [<<"Profile the kernel side with `beamdiag flame` (perf shows the system "
                   "calls). Usual causes: many small file or socket writes (batch them); "
                   "auditd or other syscall auditing (exclude the node); page faults from "
                   "memory churn (">>,
                 {has, {changed, mmscs},
                  [<<"a super carrier is already reserved (+MMscs ">>, value, <<")">>],
                  [<<"+MMscs to pre-reserve a super carrier">>]},
                 <<"); futex wake-ups of schedulers that sleep and wake often">>,
                 {has, {in, [sbwt, sbwtdcpu, sbwtdio], [<<"none">>]},
                  [{has, {in, [swt], [<<"high">>, <<"very_high">>]},
                    [<<" (busy waiting is off and +swt is already ">>, value, <<"; a short busy "
                       "wait, +sbwt very_short, keeps a scheduler from sleeping between "
                       "bursts)">>],
                    [<<" (busy waiting is already off, +sbwt none, so an idle scheduler sleeps "
                       "at once: a short busy wait, +sbwt very_short, or a later wake-up, +swt "
                       "high, means fewer sleeps and wake-ups)">>]}],
                  [{has, {in, [swt], [<<"high">>, <<"very_high">>]},
                    [<<" (+swt is already ">>, value, <<")">>],
                    [<<" (+swt high wakes sleeping schedulers later, so fewer of them)">>]}]},
                 <<". Prove a flag with `beamdiag experiment` before keeping it.">>],
            when_not =>
                <<"An I/O-heavy node (proxies, file servers) legitimately spends time in "
                  "the kernel; compare against a healthy baseline with `beamdiag compare`.">>
        },
        #{
            id => dirty_cpu_gc,
            area => ledger,
            title => <<"Garbage collection of large heaps runs on dirty CPU schedulers">>,
            meaning =>
                <<"Processes with large heaps are collected on dirty CPU schedulers. "
                  "Unless the dirty schedulers have allocator instances of their own, "
                  "they share one, and large-heap GC contends on it (the eheap_alloc "
                  "lock).">>,
            fix =>
                [<<"Look at the heaps in the evidence first: a process that holds hundreds "
                   "of megabytes (a backed-up queue, a cache or a big state in a process) is "
                   "the cause; shrink it (backpressure on its queue, data in ETS or "
                   "binaries, split the process). When the heaps are as intended and "
                   "dirty schedulers contend on the allocator: ">>,
                 {has, {changed, mdai},
                  [<<"dirty schedulers already have allocator instances of their own (+Mdai ">>,
                   value, <<").">>],
                  [{documented, <<"Mdai">>,
                    [<<"give dirty schedulers their own allocator instances with +Mdai max "
                       "(OTP 24.2 and later).">>],
                    [<<"this release has no allocator instances for dirty schedulers (+Mdai "
                       "came in OTP 24.2).">>]}]}],
            when_not =>
                <<"+Mdai max costs memory per dirty scheduler; on a memory-tight node with "
                  "little dirty GC leave it.">>
        },
        #{
            id => port_io,
            area => ledger,
            title => <<"Schedulers spend much of their time in port work">>,
            meaning =>
                <<"Port work is the drivers' callbacks, run by the normal schedulers. For "
                  "gen_tcp and gen_udp sockets (the inet driver) each send is a write to the "
                  "socket, made at once, and each read a system call too, so many small "
                  "messages cost the schedulers CPU time in the driver and in the kernel.">>,
            fix =>
                <<"Fewer, larger socket operations. Sending: gather what a process sends in "
                   "a burst into one iolist and send it once, or set {delay_send, true} on "
                   "sockets that send many small packets, so that sends made while the port "
                   "is busy go out in one write (more throughput, a little latency). "
                   "Receiving: {active, N} rather than {active, once} saves a setopts call "
                   "per packet, and a larger {buffer, Bytes} lets one read take more. Measure "
                   "throughput and latency under load before and after (`beamdiag compare` "
                   "sets two captures against their noise); "
                   "`beamdiag flame NODE` shows whether the time is in the socket calls or in "
                   "another driver (a port program, a linked-in driver).">>,
            when_not =>
                <<"A proxy or message router is mostly socket I/O by design; act when port "
                  "work grows without more traffic, or when the node runs out of CPU.">>
        },
        #{
            id => scheduler_imbalance,
            area => ledger,
            title => <<"Work is unevenly spread over the schedulers">>,
            meaning =>
                <<"Some schedulers are much busier than others while the node is not "
                  "saturated: one hot process, or scheduler compaction parks work on a few "
                  "schedulers.">>,
            fix =>
                [<<"Look for a single busy process (`beamdiag flame`, recon:proc_window/3).">>,
                 {flags, [{scl, <<"false">>}, {sub, <<"true">>}],
                  [<<" If the load is many processes, try ">>, flags, already,
                   <<" (no load compaction, balance on utilization) and prove it with "
                     "`beamdiag experiment`.">>],
                  [<<" Load compaction is already off and utilization balancing on">>, already,
                   <<".">>]}],
            when_not =>
                <<"At low load compaction is deliberate: it lets idle schedulers sleep.">>
        },
        #{
            id => cpu_saturated,
            area => ledger,
            title => <<"The node uses all the CPU it has">>,
            meaning =>
                <<"Schedulers are busy and on CPU nearly all the time and the OS confirms "
                  "it: the node is CPU bound, not blocked and not spinning. From the host "
                  "alone (a node that does not answer, or has no distribution) the node's "
                  "threads use nearly all the CPUs it may use; the host cannot tell work "
                  "from busy-waiting.">>,
            fix =>
                <<"Find what burns the CPU with `beamdiag flame` and optimise it, or add "
                  "capacity (more cores, more nodes).">>,
            when_not => <<"A batch job is meant to use every core.">>
        },
        #{
            id => schedulers_exceed_cpus,
            area => ledger,
            title => <<"More schedulers online than CPUs available">>,
            meaning =>
                <<"The node runs more scheduler threads than it has CPUs (cores, affinity "
                  "mask or cgroup quota). The threads then queue for CPUs and preempt each "
                  "other, often in the middle of holding a lock.">>,
            fix =>
                <<"Set the schedulers to the CPUs available: +S N:N, or "
                  "erlang:system_flag(schedulers_online, N) at run time.">>,
            when_not =>
                <<"A node that mostly waits on I/O can carry a few extra schedulers "
                  "without harm.">>
        },
        #{
            id => lock_contention,
            area => locks,
            title => <<"Threads wait on a VM lock">>,
            meaning =>
                <<"Lock counting shows threads waiting on one class of VM lock for a "
                  "noticeable share of the window.">>,
            fix =>
                <<"See the lock class in the evidence; the lock catalogue in "
                  "docs/LOCKS.md says what it protects and how to relieve it.">>,
            when_not => <<"Waits below a fraction of a percent of the window are noise.">>
        },
        #{
            id => ets_contention,
            area => locks,
            title => <<"One ETS table is written by everybody">>,
            meaning =>
                <<"Threads queue on the locks of one ETS table (db_hash_slot, db_tab): "
                  "many processes on many schedulers write the same table.">>,
            fix =>
                <<"Create the table with the ets:new/2 options {write_concurrency, true} (or "
                  "auto) and {decentralized_counters, true}; if it is still hot, shard the data "
                  "over one table per scheduler, as the peep metrics library does.">>,
            when_not =>
                <<"write_concurrency costs memory and makes whole-table operations "
                  "(tab2list, size) slower; a table that is mostly read wants "
                  "read_concurrency instead.">>
        },
        #{
            id => allocator_contention,
            area => locks,
            title => <<"Threads contend on a shared memory allocator">>,
            meaning =>
                <<"Threads wait on an allocator instance lock (alcu_allocator), typically "
                  "eheap_alloc shared by the dirty schedulers during large-heap GC.">>,
            fix =>
                [{has, {changed, mdai},
                  [<<"Dirty schedulers already have their own allocator instances (+Mdai ">>,
                   value, <<"): the contention is between threads freeing memory another "
                            "allocated; look for large messages and binaries crossing "
                            "processes.">>],
                  [{documented, <<"Mdai">>,
                    [<<"+Mdai max gives each dirty scheduler its own allocator instance "
                       "(OTP 24.2 and later).">>],
                    [<<"This release has no allocator instances for dirty schedulers (+Mdai "
                       "came in OTP 24.2).">>]}]}],
            when_not => <<"+Mdai max costs some memory per dirty scheduler.">>
        },
        #{
            id => run_queue_contention,
            area => locks,
            title => <<"Schedulers contend on run queue locks">>,
            meaning =>
                <<"Schedulers wait on each other's run queue locks, mostly during work "
                  "stealing when many short processes wake up and sleep.">>,
            fix =>
                <<"Before OTP 28: upgrade; OTP 28 reworked work stealing (trylock on the "
                  "victim's run queue, skip busy victims, steal up to half a queue, run a "
                  "stolen process directly). On any release: batch work into fewer, "
                  "longer-running processes and keep schedulers (+S) at or below the cores. "
                  "On 28 and later the wait left comes from waking processes into other "
                  "schedulers' queues: fewer cross-scheduler wake-ups.">>,
            when_not => <<"Binding schedulers hurts when the node shares its host.">>
        },
        #{
            id => process_table_contention,
            area => locks,
            title => <<"Something walks the whole process table">>,
            meaning =>
                <<"The process_table lock is contended: code calls erlang:processes/0 "
                  "(observer, metrics, debugging helpers) while processes spawn and exit.">>,
            fix =>
                <<"Find and stop the code that lists all processes on a timer; keep "
                  "registries of the processes you care about instead.">>,
            when_not => <<"One-off debugging sessions are fine.">>
        },
        #{
            id => single_process_bottleneck,
            area => processes,
            title => <<"One process is a bottleneck">>,
            meaning =>
                <<"One process takes so large a share of the node's reductions that it "
                  "alone keeps a scheduler busy (a process runs on one scheduler at a "
                  "time) while the node has idle schedulers, or while other processes wait "
                  "on it: callers blocked in gen_server:call hold a monitor on it, senders "
                  "fill its queue. On the lock-counting emulator the same process's main "
                  "or message-queue lock is contended, and that evidence is in the same "
                  "finding. The evidence names the process, its share, the callers "
                  "waiting and where it was.">>,
            fix =>
                <<"Shard the state: one process per key range or per scheduler, or a "
                  "pool; move the work into the callers (the server hands out what they "
                  "need and they compute); keep read-mostly state in ETS (read_concurrency) "
                  "or persistent_term instead of a server; when callers cast, make them "
                  "call or use a bounded queue so they feel the backpressure. "
                  "{message_queue_data, off_heap} helps a process with a busy queue.">>,
            when_not => <<"A serialisation point that is intended (a writer, a lock) and "
                          "keeps up with its callers.">>
        },
        #{
            id => message_queue_growth,
            area => processes,
            title => <<"A mailbox grows without bound">>,
            meaning =>
                <<"Messages arrive at one process faster than it takes them, for the "
                  "whole window. The queue costs memory (each message is copied into the "
                  "receiver's heap or buffers), every garbage collection of the process "
                  "walks it, and a selective receive scans it: the process gets slower as "
                  "it grows, until the node runs out of memory. Usual causes: producers "
                  "that cast or send without waiting for an answer, a consumer that calls "
                  "a slow service for each message, logging or metrics sent to one "
                  "process.">>,
            fix =>
                <<"Backpressure: make producers wait (gen_server:call instead of cast, "
                  "credit-based flow control, a bounded buffer), or shed load when the "
                  "queue is long (check erlang:process_info(self(), message_queue_len) "
                  "and drop or reject). Spread the work over several consumers. "
                  "{message_queue_data, off_heap} keeps a long queue out of the heap's "
                  "garbage collection but does not stop the growth.">>,
            when_not => <<"A burst that drains after a deploy or a reconnect; act when it "
                          "grows window after window.">>
        },
        #{
            id => long_schedule,
            area => processes,
            title => <<"A process holds its scheduler in native code">>,
            meaning =>
                <<"A process stayed on its scheduler for tens or hundreds of milliseconds "
                  "at a time, in and out of the same NIF or BIF: the runtime's system "
                  "monitor saw it (long_schedule events), or, when the node's system "
                  "monitor is taken by another process and left alone, beamdiag's sampler "
                  "found the process answering that late, again and again, in the same "
                  "function (figures then sampled estimates). While it runs no other process "
                  "gets that scheduler: the "
                  "schedulers look unevenly busy, timers and replies on it are late, and "
                  "calls that need every scheduler (code loading, system flags, "
                  "statistics) wait for it. A NIF should return within about a "
                  "millisecond.">>,
            fix =>
                <<"For a NIF: make it yield (count its work with enif_consume_timeslice and "
                  "continue with enif_schedule_nif), or run it on a dirty scheduler "
                  "(ERL_NIF_DIRTY_JOB_CPU_BOUND in its ErlNifFunc flags, IO_BOUND for "
                  "blocking I/O). For a BIF: give it less work per call (split the input, "
                  "e.g. binary_to_term or term_to_binary on smaller terms, ETS selects "
                  "with a limit and a continuation). No scheduler flag (+scl, +sub, +sbt) "
                  "helps: the process does not give the scheduler back.">>,
            when_not =>
                <<"A one-off long schedule at start-up (a NIF library loading its data) "
                  "is expected; act when it repeats under load.">>
        },
        #{
            id => wait_chain,
            area => processes,
            title => <<"Processes wait on a process that itself waits">>,
            meaning =>
                <<"Many processes wait on one (their monitors on it: callers in gen:call and "
                  "erpc hold one on the process they call), and that process does not run: it "
                  "waits in a call to another process, in a receive, at a port, in a NIF or "
                  "suspended. Its callers stop with it, and their callers with them: a node "
                  "whose work has stopped without burning CPU. The finding names the callers "
                  "(how many, where), each process down the chain, what the chain ends in (a "
                  "file operation blocked in the kernel, a call to another node, a receive "
                  "that never gets its message, a cycle of calls) and how long each did no "
                  "work. Only processes the walks already found are read: the longest queues, "
                  "the most monitored, and what they monitor.">>,
            fix =>
                <<"Fix what the chain ends in: a file operation on a FIFO or a hung mount "
                  "(open such files with the raw option, from a process of their own: a raw "
                  "open runs in the caller, not in the node's file server), a slow node "
                  "(diagnose it), a reply that never "
                  "comes (give the call a timeout and handle it), a cycle of calls (make one "
                  "side cast or reply later with gen_server:reply/2). Then keep one blocked "
                  "call from stopping every caller: a timeout on each call, work handed to "
                  "a process of its own, a pool instead of one server.">>,
            when_not =>
                <<"A server that waits for a moment on a slow dependency while a few callers "
                  "queue: act when the same chain holds across the window.">>
        },
        #{
            id => busy_port,
            area => processes,
            title => <<"Processes are suspended on a busy port">>,
            meaning =>
                <<"Processes that send to a port that says it is busy are suspended until "
                  "it is not: above all the distribution port to a node that reads more "
                  "slowly than this one sends (busy_dist_port: the distribution buffer is "
                  "over dist_buf_busy_limit). A suspended process does nothing, and whatever "
                  "waits on it waits too; the node looks idle. The finding counts the "
                  "suspended processes (the walks read each one's status), says which did no "
                  "work across the window, and names the distribution ports with bytes "
                  "pending, their peer, the buffers and the node's busy limit.">>,
            fix =>
                <<"Find why the peer reads slowly (diagnose it), and send it less: fewer or "
                  "smaller messages, bulk data out of band (a socket of its own), replies "
                  "batched. +zdbbl raises the distribution buffer's busy limit and only "
                  "delays the suspension while the buffer holds the memory. For another "
                  "port: find why it applies back-pressure (a port program or socket peer "
                  "that reads slowly).">>,
            when_not =>
                <<"A burst that drains within the window: a process suspended for a moment "
                  "while a large message goes out is the back-pressure working.">>
        },
        #{
            id => memory_growth,
            area => memory,
            title => <<"The node's memory grows">>,
            meaning =>
                <<"One of the VM's parts (binaries, process heaps, ETS, atoms, code) rose "
                  "steadily over the window, not in a burst and not in the saw of garbage "
                  "collection: at that rate the node runs out of the memory it may use, and "
                  "the OOM killer or the cgroup ends it. The evidence sets the OS's account "
                  "(resident memory) beside the VM's, gives the time until the tightest limit "
                  "and names who grew it: the processes whose memory grew, the processes that "
                  "reference the binaries, or the ETS tables that grew (name, type, objects, "
                  "bytes and owner); processes alike (the same initial call, spawner and "
                  "function) in one line. When the resident memory rose steadily and no part "
                  "did (a heap copied at its collections peaks and falls back; heaps resized "
                  "ahead of their data fill pages the VM already counts), the finding is the "
                  "resident memory's, with the VM's parts beside it: a node whose memory "
                  "grows never gets none.">>,
            fix =>
                <<"Bound what grows: drop references to binaries once passed on, evict from "
                  "state and tables, apply backpressure to producers. The finding's fix names "
                  "the part.">>,
            when_not =>
                <<"A node warming a cache or loading data at start-up grows until it is full; "
                  "watch it over a longer window (beamdiag watch) to see it level off.">>
        },
        #{
            id => allocator_fragmentation,
            area => memory,
            title => <<"Free space the allocators keep in their carriers">>,
            meaning =>
                <<"One allocator type's carriers (the memory it mapped) hold 128 MiB or more "
                  "that no block uses, and its blocks use half of them or less: a burst "
                  "allocated many blocks and freed most, and the few that live keep each "
                  "carrier mapped. erlang:memory/0 counts blocks and does not show it; the OS "
                  "counts it in the resident memory. The evidence gives the type, its carriers "
                  "and blocks, and the resident memory beside them.">>,
            fix =>
                <<"On OTP 26 or later, +M<S>acful de (S the allocator's letter: B binary, E "
                  "ETS, H heap, D std, R driver, F fix, S short-lived) lets the OS reuse the "
                  "free pages of carriers under the utilisation limit; smaller multiblock "
                  "carriers (+M<S>lmbcs) are emptied and given back sooner. The finding's fix "
                  "names the letter, and flags the node already has are named as set. Find "
                  "and spread the burst.">>,
            when_not =>
                <<"Right after a planned burst (a cache loaded, a batch done) the free space is "
                  "reused by the next one: act when the resident memory matters more than "
                  "the allocation speed, or the host runs short.">>
        },
        #{
            id => native_memory,
            area => memory,
            title => <<"Memory grows outside the VM's allocators">>,
            meaning =>
                <<"The node's resident memory rose steadily while erlang:memory/0 stayed "
                  "flat: the VM's allocators do not hold the growth. A NIF, a driver or a "
                  "library allocates with malloc or mmap and does not free.">>,
            fix =>
                <<"Find the native code that allocates: the NIFs and drivers the node loads "
                  "(their resources must have destructors, enif_alloc memory must be freed, "
                  "or use enif_alloc_binary so the VM accounts for it); on a test node, perf "
                  "or heaptrack on malloc shows the caller.">>,
            when_not =>
                <<"A NIF library that keeps a large cache on purpose (a database engine's "
                  "block cache) grows until it reaches its configured size.">>
        },
        #{
            id => node_limit,
            area => node,
            title => <<"The node runs towards one of its limits (atoms, processes, ports)">>,
            meaning =>
                <<"A count the runtime bounds (atoms, processes, ports) is near its limit, or "
                  "grows steadily towards it: the finding gives the count, the limit, the "
                  "growth over the window and the time left at this rate. At the atom limit "
                  "the node stops (atoms are never freed); at the process or port limit every "
                  "spawn, open_port or socket open fails with system_limit. Atoms leak where "
                  "code makes them from outside data (binary_to_term, list_to_atom, "
                  "binary_to_atom): the walker samples the processes running when the atom "
                  "table grows and names them; for processes, ports and ETS tables the "
                  "evidence names who spawned, holds or created the newest (bounded reads at "
                  "the window's end). ETS tables that pile up are reported too: the "
                  "ets_limit the node reports is not enforced since OTP 21, so they cost "
                  "memory, not a crash.">>,
            fix =>
                <<"Atoms: make the code named use existing atoms only (binary_to_term(Bin, "
                  "[safe]), list_to_existing_atom/1, binary_to_existing_atom/2, or keys kept "
                  "as binaries), and restart the node before the table fills; +t only "
                  "postpones it. Processes: bound who spawns them (a pool, processes that end "
                  "with their work). Ports: close what is opened, bound connection counts; "
                  "each socket or file also takes a file descriptor (ulimit -n). ETS: delete "
                  "tables when done, or give them an owner that ends with the work. +P and "
                  "+Q raise the limits, not the memory each process or port holds.">>,
            when_not =>
                <<"A burst that levels off: processes and ports come and go with load, and a "
                  "count that rises in one window and falls in the next is load, not a leak. "
                  "Atoms made once at start-up (code loading, configuration) stop growing; a "
                  "count that grows with every request does not.">>
        },
        #{
            id => hot_function,
            area => profile,
            title => <<"Functions that take a large share of the CPU">>,
            meaning =>
                <<"The profile (perf, or the Erlang-level sampler) shows one function or "
                  "one known family of functions with a large share of the samples: "
                  "decoding atom-heavy terms with binary_to_term, zlib in "
                  "term_to_binary, big copies out of ETS, garbage collection, memcpy, "
                  "regular expressions compiled on every call, native lock waits or "
                  "scheduler busy-waiting.">>,
            fix =>
                <<"Each finding names the functions and their share of the samples; for a "
                  "known family its title and fix are that family's (the table in "
                  "docs/PROFILING.md). For a function the knowledge base does not know, "
                  "read its callers in flame.svg.">>,
            when_not =>
                <<"Work the node exists to do: a hot function is only a problem when it "
                  "is not the job itself, or costs more than it should. Garbage "
                  "collection, copies, ETS reads, lock waits, spinning and functions the "
                  "knowledge base does not know are rated warning at most for that "
                  "reason.">>
        },
        #{
            id => cluster_outlier,
            area => cluster,
            title => <<"This node is the odd one out in its cluster">>,
            meaning =>
                <<"Diagnosed over the same seconds as the rest of its cluster, this node's "
                  "figures lie far above the cluster's median: its robust z-score, the "
                  "distance from the median over the spread of the nodes (1.4826 times the "
                  "median absolute deviation, with a floor so that near-identical nodes do "
                  "not turn jitter into a difference), is 3.5 or more. Nodes that run the "
                  "same code under a balanced load look alike; one that does not gets more "
                  "of the load, or does different work, or runs on a different host.">>,
            fix =>
                <<"Read this node's own findings first: they say where its time goes. Then "
                  "ask why it differs: traffic skewed to it (a hot key, a shard or partition "
                  "leader, a registered process the others call, sticky sessions), a job "
                  "only it runs, different flags or a release the others do not have, or a "
                  "busier host (compare the hosts' CPU and steal).">>,
            when_not =>
                <<"A node with a role of its own (the one that runs the scheduler of "
                  "periodic jobs, the leader, the seed that every other node connects to) "
                  "is expected to differ; the finding then confirms its role.">>
        },
        #{
            id => shared_host_contention,
            area => cluster,
            title => <<"Members of the cluster share a host whose CPUs are contended">>,
            meaning =>
                <<"Several members run on one host (the same kernel: they read the same boot "
                  "id), and over the window their schedulers waited for a CPU while they had "
                  "work, because the host's CPUs were busy with the other members, with the "
                  "diagnosis itself, or with whatever else runs there. That wait is the "
                  "host's, not any one member's: it is said once, for the host, with how many "
                  "members waited and how long, instead of as a cpu_starvation finding on "
                  "each of them. On such a host the BEAM counts a scheduler busy while the OS "
                  "keeps it waiting, so a member whose schedulers mostly waited (ran less than "
                  "a quarter of their busy time) has its scheduler_imbalance and "
                  "scheduler_blocking said here too, and it is not called the odd one out for "
                  "its busy, waiting or blocked shares alone.">>,
            fix =>
                <<"Give the members CPUs of their own: fewer members on the host, or each "
                  "member's schedulers cut to its share of the host's CPUs (+S, +SDcpu), or "
                  "the members placed on CPUs apart (cpusets, taskset, a container's CPU "
                  "limit). Move other busy work off the host. Then diagnose a member alone "
                  "to see what is left that is its own.">>,
            when_not =>
                <<"A test or staging host that runs many small nodes on purpose: the wait "
                  "measures the packing, not the application. On a host whose CPUs were "
                  "mostly idle the members waited for another reason, which their own "
                  "findings show.">>
        }
    ].

%% @doc The entry for one finding id; crashes on an id that is not catalogued.
-spec entry(id()) -> entry().
entry(Id) ->
    case [E || E = #{id := I} <- entries(), I =:= Id] of
        [E] -> E;
        [] -> error({unknown_finding, Id})
    end.

-ifdef(TEST).
%% @doc Every catalogued id.
-spec ids() -> [id()].
ids() ->
    [Id || #{id := Id} <- entries()].
-endif.

%% @doc The catalogue as a Markdown document (docs/FINDINGS.md).
-spec markdown() -> iolist().
markdown() ->
    [
        "# Findings\n\n",
        "Generated by `beamdiag catalogue` from `src/analysis/beamdiag_catalogue.erl`; do not edit.\n\n",
        "| id | area | title |\n|---|---|---|\n",
        [["| `", atom_to_list(Id), "` | ", atom_to_list(A), " | ", T, " |\n"]
         || #{id := Id, area := A, title := T} <- entries()],
        [entry_markdown(E) || E <- entries()]
    ].

%%%===================================================================
%%% Internal
%%%===================================================================

entry_markdown(E = #{id := Id, title := T, meaning := M, fix := F, when_not := W}) ->
    [
        "\n## `", atom_to_list(Id), "`: ", T, "\n\n",
        M, "\n\n",
        "**Fix.** ", F, "\n\n",
        case maps:get(fitted, E, []) of
            [] -> "";
            Parts -> ["**Fitted to the node.** ", fitting(Parts), "\n\n"]
        end,
        "**When not.** ", W, "\n"
    ].

general(Parts, Value) ->
    [general_part(P, Value) || P <- Parts].

general_part(B, _) when is_binary(B) -> B;
general_part(flags, _) -> <<>>;
general_part(already, _) -> <<>>;
general_part(value, Value) -> Value;
general_part({flags, Wanted, Todo, _Done}, _) ->
    [case P of flags -> flag_text(Wanted); _ -> general_part(P, <<>>) end || P <- Todo];
general_part({has, Test, _Then, Else}, _) -> general(Else, example(Test));
general_part({documented, _Flag, Then, _Else}, V) -> general(Then, V).

%% How the general form changes on a node, one sentence per place.
fitting(Parts) ->
    lists:join(" ", lists:append([fitting_part(P, {[], true}) || P <- Parts])).

%% `Ctx': the conditions that lead here, and whether the text here is the
%% general form's.
fitting_part({flags, _Wanted, _Todo, Done}, _Ctx) ->
    [["Flags the node already has are left out of the advice and named as already set; "
      "flags its OTP release does not document are never advised. When it has them all: ",
      quoted(general(Done, <<>>))]];
fitting_part({has, Test, Then, Else}, {Ctx, General}) ->
    Cond = Ctx ++ [test_text(Test)],
    Not = Ctx ++ [test_text({'not', Test})],
    Note = fun(C, Parts, V) ->
                   case Parts of
                       [{has, _, _, _} | _] -> [];
                       _ -> [["When ", lists:join(" and ", C), ": ", quoted(general(Parts, V))]]
                   end
           end,
    Note(Cond, Then, example(Test))
        ++ case General of
               true -> [];
               false -> Note(Not, Else, <<>>)
           end
        ++ lists:append([fitting_part(P, {Cond, false}) || P <- Then, is_tuple(P)])
        ++ lists:append([fitting_part(P, {Not, General}) || P <- Else, is_tuple(P)]);
fitting_part({documented, Flag, _Then, Else}, _Ctx) ->
    [["On a release without +", Flag, ": ", quoted(general(Else, <<>>))]];
fitting_part(_, _Ctx) ->
    [].

quoted(Text) ->
    T = string:trim(iolist_to_binary(Text)),
    ["\"", T, "\"", case binary:last(T) of $. -> ""; _ -> "." end].

test_text({'not', {in, Keys, [V | _]}}) ->
    ["the node does not have ", lists:join(" ", [["+", option(K), " ", V] || K <- Keys])];
test_text({'not', {changed, Key}}) ->
    ["the node does not have +", option(Key), " set"];
test_text({'not', {not_in, Key, [V | _]}}) ->
    ["the node's ", atom_to_list(Key), " is ", V];
test_text({in, Keys, [V | _]}) ->
    ["the node has ", lists:join(" ", [["+", option(K), " ", V] || K <- Keys])];
test_text({changed, Key}) ->
    ["the node has +", option(Key), " set (X)"];
test_text({not_in, Key, [V | _]}) ->
    ["the node's ", atom_to_list(Key), " is X, not ", V].

%% The value the docs show for `value'.
example({in, _Keys, [V | _]}) -> V;
example(_) -> <<"X">>.

flag_text(Wanted) ->
    lists:join(" ", [["+", option(K), " ", V] || {K, V} <- Wanted]).

option(Key) ->
    maps:get(option, beamdiag_flags:flag(Key)).
