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

-export_type([entry/0, id/0]).

-type id() :: atom().
-type entry() :: #{
    id := id(),
    area := ledger | locks | processes | profile | cluster,
    title := binary(),
    meaning := binary(),
    fix := binary(),
    when_not := binary()
}.

%%%===================================================================
%%% API
%%%===================================================================

%% @doc All catalogue entries, in the order the docs list them.
-spec entries() -> [entry()].
entries() ->
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
                <<"Start the node with +sbwt none +sbwtdcpu none +sbwtdio none "
                  "(in vm.args, or ERL_FLAGS). Prove it with `beamdiag experiment` under "
                  "your own load: OS CPU per unit of work should drop while throughput "
                  "and latency stay within noise.">>,
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
                <<"Find the competitor (top -H, the host's steal time) and move it away or "
                  "give the BEAM dedicated cores (cpuset, taskset). If the host is simply "
                  "oversubscribed, lower the node's schedulers to the CPUs it really gets "
                  "(+S N:N) so that its threads do not queue behind each other.">>,
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
                <<"Raise the CPU limit, or match the schedulers to the quota: "
                  "+S Q:Q with Q the quota in whole CPUs (recent OTP releases do this by "
                  "default unless +S is set), and turn busy waiting off "
                  "(+sbwt none +sbwtdcpu none +sbwtdio none) so spinning does not eat the "
                  "quota.">>,
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
                <<"Profile the kernel side with `beamdiag flame` (perf shows the system "
                  "calls). Usual causes: many small file or socket writes (batch them), "
                  "auditd or other syscall auditing (exclude the node), page faults from "
                  "memory churn (+MMscs to pre-reserve a super carrier), futex wake-ups "
                  "of schedulers that sleep and wake often (a later wake-up, +swt high, or "
                  "a short busy wait). The fix printed with a finding is fitted to the "
                  "node's own flags.">>,
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
                <<"Look at the heaps in the evidence first: a process that holds hundreds "
                  "of megabytes (a backed-up queue, a cache or a big state in a process) is "
                  "the cause; shrink it (backpressure on its queue, data in ETS or "
                  "binaries, split the process). When the heaps are as intended and "
                  "dirty schedulers contend on the allocator, give them their own "
                  "instances with +Mdai max (OTP 24.2 and later).">>,
            when_not =>
                <<"+Mdai max costs memory per dirty scheduler; on a memory-tight node with "
                  "little dirty GC leave it.">>
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
                <<"Look for a single busy process (`beamdiag flame`, recon:proc_window/3). "
                  "If the load is many processes, try +scl false (no load compaction) and "
                  "+sub true (balance on utilization) and prove it with "
                  "`beamdiag experiment`.">>,
            when_not =>
                <<"At low load compaction is deliberate: it lets idle schedulers sleep.">>
        },
        #{
            id => cpu_saturated,
            area => ledger,
            title => <<"The node uses all the CPU it has">>,
            meaning =>
                <<"Schedulers are busy and on CPU nearly all the time and the OS confirms "
                  "it: the node is CPU bound, not blocked and not spinning.">>,
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
                <<"Create the table with {write_concurrency, true} (or auto) and "
                  "{decentralized_counters, true}; if it is still hot, shard the data over "
                  "one table per scheduler, as the peep metrics library does.">>,
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
                <<"+Mdai max gives each dirty scheduler its own allocator instance "
                  "(OTP 24.2 and later).">>,
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
                <<"The runtime's system monitor saw a process stay on its scheduler for "
                  "tens or hundreds of milliseconds at a time, in and out of the same NIF "
                  "or BIF. While it runs no other process gets that scheduler: the "
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

entry_markdown(#{id := Id, title := T, meaning := M, fix := F, when_not := W}) ->
    [
        "\n## `", atom_to_list(Id), "`: ", T, "\n\n",
        M, "\n\n",
        "**Fix.** ", F, "\n\n",
        "**When not.** ", W, "\n"
    ].
