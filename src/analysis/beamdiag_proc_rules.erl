%%% @doc Findings from process attribution (pure): the process data
%%% `beamdiag_agent_processes:finish/2' returns, set beside the ledger.
%%%
%%% `single_process_bottleneck': one process took at least
%%% `reds_share_min' of the node's reductions over the window, and that
%%% share of the schedulers' busy time (the BEAM's own account; a process
%%% runs on one scheduler at a time) keeps a scheduler busy for at least
%%% `process_cpus_min' of the window, while either the node has a
%%% scheduler's worth of idle capacity or processes wait on it (monitors on
%%% it, as `gen:call' callers hold, or a queue at the end). A node of many
%%% equal workers spreads its reductions thinly and gets nothing.
%%%
%%% `message_queue_growth': a mailbox that grew by at least `queue_growth_min'
%%% messages and `queue_rate_min' messages a second over the window.
%%%
%%% `wait_chain' and `busy_port' come from `beamdiag_chain_rules', on the
%%% walker's looks at who waits on whom.
%%%
%%% `dirty_cpu_gc' (from `beamdiag_rules') gets the largest heaps as
%%% evidence (`annotate/3'), and a lock-counting `single_process_bottleneck'
%%% on the same process becomes one finding with this evidence.
%%%
%%% ```
%%% 1> [Id || #{id := Id} <- beamdiag_proc_rules:findings(Procs, Ledger, Settings)].
%%% [single_process_bottleneck]
%%% '''
-module(beamdiag_proc_rules).

-export([findings/3, named/1, annotate/3, who/1, spawned_by/1, where/1, who_where/1,
         alike/1, alike_who/2, duration/1, largest_at_end/2, stalled_large/2,
         stalled_large_line/1]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The process findings for a window's process data.
-spec findings(beamdiag_agent_processes:report(), beamdiag_ledger:ledger(),
               beamdiag_agent_vm:settings()) -> [beamdiag_finding:finding()].
findings(Procs = #{top_reductions := _}, Ledger, Settings) ->
    T = thresholds(),
    bottleneck(Procs, Ledger, Settings, T) ++ queue_growth(Procs, T) ++
        beamdiag_chain_rules:findings(Procs);
findings(_, _, _) ->
    [].

%% @doc Whether the process data alone, without a ledger, makes a finding
%% (a mailbox's growth, a wait chain, a busy port): what a report from the
%% host's view can still say of a node whose ticks came too slowly.
-spec named(beamdiag_agent_processes:report()) -> boolean().
named(Procs = #{queues := _}) ->
    queue_growth(Procs, thresholds()) ++ beamdiag_chain_rules:findings(Procs) =/= [];
named(_) ->
    false.

%% @doc The thresholds the rules use.
-spec thresholds() -> #{atom() => number()}.
thresholds() ->
    #{
        %% Share of the node's reductions one process took.
        reds_share_min => 0.20,
        %% Its estimated CPU time, in schedulers kept busy.
        process_cpus_min => 0.60,
        process_cpus_crit => 0.90,
        %% Idle scheduler capacity, in schedulers.
        idle_schedulers_min => 0.50,
        %% Callers waiting on it (monitors) or messages in its queue.
        waiters_min => 4,
        waiters_crit => 16,
        %% Mailbox growth over the window.
        queue_growth_min => 1000,
        queue_rate_min => 50,
        queue_crit => 100000,
        %% Heaps named in dirty_cpu_gc's evidence: at least this many bytes.
        heap_bytes_min => 1048576
    }.

%% @doc Adds process evidence to other rules' findings: the largest heaps
%% to `dirty_cpu_gc', and a lock-counting `single_process_bottleneck'
%% merged into the process one when both name the same process.
-spec annotate([beamdiag_finding:finding()], beamdiag_agent_processes:report(),
               beamdiag_ledger:ledger()) ->
    [beamdiag_finding:finding()].
annotate(Findings, Procs = #{heaps := _}, _Ledger) ->
    merge_bottlenecks([gc_heaps(F, Procs) || F <- Findings]);
annotate(Findings, _, _) ->
    Findings.

%% @doc How a process is named to a person: registered name or label, then
%% its pid and initial call, and who spawned it when neither names it
%% (`spawned_by/1'): "NAME <PID> (INITIAL CALL, spawned by NAME <PID>)".
-spec who(#{pid := binary(), _ => _}) -> iolist().
%% @doc Where a process was: its current function and, when that is not
%% the user's code, the innermost frame of theirs that led there
%% (beamdiag_agent_proc_identity: `own', `own_at').
-spec where(map()) -> iolist().
where(E) ->
    Cur = case maps:get(current, E, null) of
              Known when is_binary(Known), Known =/= <<"?">> -> Known;
              _ -> <<"a function not read (it did not answer the walks' reads)">>
          end,
    case maps:get(own, E, null) of
        null -> [Cur];
        Own -> [Cur, ", called from ", Own, case maps:get(own_at, E, null) of
                                              null -> "";
                                              At -> [" (", At, ")"]
                                          end]
    end.

%% @doc Who a process is and, when its current function is known, where
%% it was: "NAME <PID> (INITIAL CALL), which was in WHERE".
-spec who_where(map()) -> iolist().
who_where(P) ->
    [who(P), case maps:get(current, P, null) of
                 null -> "";
                 _ -> [", which was in ", where(P)]
             end].

who(E = #{pid := Pid}) ->
    Name = case {maps:get(name, E, null), maps:get(label, E, null)} of
               {N, _} when is_binary(N) -> [N, " "];
               {null, L} when is_binary(L) -> ["label ", L, " "];
               _ -> []
           end,
    case maps:get(initial_call, E, <<"?">>) of
        %% Not read (it did not answer): nothing to say.
        Unknown when Unknown =:= <<"?">>; Unknown =:= null -> [Name, Pid];
        Ic -> [Name, Pid, " (", Ic, case spawned_by(E) of
                                        [] -> [];
                                        By -> [", ", By]
                                    end, ")"]
    end.

%% @doc Ranked `{Figure, Entry}' pairs grouped by the processes alike:
%% those with no registered name that share their label, initial call,
%% spawner, current function and own frame (eight relays a producer
%% spawned from one fun). A process whose identity was not read (it did
%% not answer) is alike to none. Each group is `{Sum, Pairs}', its figures summed
%% and its pairs in their order; the groups by their sums, largest first.
-spec alike([{number(), map()}]) -> [{number(), [{number(), map()}]}].
alike(Pairs) ->
    {Keys, Groups} = lists:foldl(
                       fun(Pair = {_, E}, {Ks, Gs}) ->
                               K = alike_key(E),
                               case Gs of
                                   #{K := G} -> {Ks, Gs#{K := [Pair | G]}};
                                   _ -> {[K | Ks], Gs#{K => [Pair]}}
                               end
                       end, {[], #{}}, Pairs),
    Ranked = [{lists:sum([F || {F, _} <- G]), lists:reverse(G)}
              || K <- lists:reverse(Keys), G <- [maps:get(K, Groups)]],
    %% Stable: groups of equal sums keep the order of their first member.
    lists:sort(fun({A, _}, {B, _}) -> A >= B end, Ranked).

%% @doc A group of processes alike (alike/1) in words: "8 processes alike
%% (INITIAL CALL, spawned by NAME <PID>)", each one's own figure after its
%% pid (Figure), three at most and how many more.
-spec alike_who([{number(), map()}], fun((number()) -> iodata())) -> iolist().
alike_who(Group = [{_, E} | _], Figure) ->
    N = length(Group),
    Shown = [[maps:get(pid, X), " ", Figure(F)] || {F, X} <- lists:sublist(Group, 3)],
    More = case N > 3 of
               true -> io_lib:format(" and ~b more", [N - 3]);
               false -> ""
           end,
    [io_lib:format("~b processes alike (", [N]),
     case maps:get(label, E, null) of
         L when is_binary(L) -> ["label ", L, ", "];
         _ -> []
     end,
     maps:get(initial_call, E, <<"?">>),
     case spawned_by(E) of
         [] -> [];
         By -> [", ", By]
     end, ": ", lists:join(", ", Shown), More, ")"].

alike_key(E = #{pid := Pid}) ->
    Known = not lists:member(maps:get(initial_call, E, null), [null, <<"?">>]),
    case maps:get(name, E, null) of
        null when Known ->
            Parent = case maps:get(parent, E, null) of
                         #{pid := P} -> P;
                         _ -> null
                     end,
            {maps:get(label, E, null), maps:get(initial_call, E, null), Parent,
             maps:get(current, E, null), maps:get(own, E, null)};
        _ ->
            {named, Pid}
    end.

%% @doc Who spawned a process that nothing else names: one with no name
%% nor label spawned from a fun (`spawn_call' erlang:apply/2, whose
%% initial call is the fun at best), "spawned by NAME <PID>"; else
%% nothing. A named process or a proc_lib one says what it is already.
-spec spawned_by(map()) -> iolist().
spawned_by(E = #{parent := #{pid := P} = Parent, spawn_call := <<"erlang:apply/2">>})
  when is_binary(P) ->
    case {maps:get(name, E, null), maps:get(label, E, null)} of
        {null, null} ->
            ["spawned by ", case maps:get(name, Parent, null) of
                                N when is_binary(N) -> [N, " "];
                                _ -> []
                            end, P];
        _ ->
            []
    end;
spawned_by(_) ->
    [].

%%%===================================================================
%%% Internal
%%%===================================================================

bottleneck(Procs = #{top_reductions := [Top | Rest]}, Ledger, Settings, T) ->
    Total = maps:get(reductions, Procs, 0),
    Reds = maps:get(reductions, Top),
    Share = ratio(Reds, Total),
    Span = span_s(Procs, Ledger),
    Online = maps:get(schedulers_online, Settings, 1),
    BusyCpus = busy_cpus(Ledger),
    Cpus = case BusyCpus of
               undefined -> undefined;
               B -> min(1.0, Share * B)
           end,
    Idle = case BusyCpus of
               undefined -> 0.0;
               _ -> Online - BusyCpus
           end,
    [_, QEnd] = maps:get(queue, Top),
    Monitors = lists:max([maps:get(monitored_by, Top, 0) | looked_waiters(Procs, Top)]),
    Waiters = max(Monitors, QEnd),
    Next = case Rest of
               [N | _] -> ratio(maps:get(reductions, N), Total);
               [] -> 0.0
           end,
    Fires = Share >= map_get(reds_share_min, T) andalso is_number(Cpus) andalso
        Cpus >= map_get(process_cpus_min, T) andalso
        (Idle >= map_get(idle_schedulers_min, T) orelse Waiters >= map_get(waiters_min, T)),
    case Fires of
        false ->
            [];
        true ->
            Sev = case Cpus >= map_get(process_cpus_crit, T) andalso
                       Waiters >= map_get(waiters_crit, T) of
                      true -> critical;
                      false -> warning
                  end,
            Evidence = [
                fmt("~ts took ~s of the node's reductions over ~.1f s (~s reductions; the next "
                    "process ~s)", [who(Top), beamdiag_units:pct(Share), Span,
                                    beamdiag_units:count(Reds), beamdiag_units:pct(Next)]),
                fmt("that share of the schedulers' busy time is ~.2f of a scheduler: one process "
                    "runs on one scheduler at a time; ~.2f of ~b schedulers were idle",
                    [Cpus, max(0.0, Idle), Online]),
                fmt("~b processes monitor it (the most the window's looks saw; callers waiting in gen:call "
                    "hold a monitor); "
                    "~b messages in its queue at the end; it was in ~ts",
                    [Monitors, QEnd, where(Top)])
            ],
            [beamdiag_finding:new(single_process_bottleneck, Sev, Evidence, #{
                pid => maps:get(pid, Top),
                name => name_or_pid(Top),
                reds_share => round4(Share),
                process_cpus => round4(Cpus),
                idle_schedulers => round4(max(0.0, Idle)),
                waiters => Waiters
            })]
    end;
bottleneck(_, _, _, _) ->
    [].

%% The monitors on the top process as each of the window's looks at who
%% waits on whom saw them (its start and end): each count is one instant's
%% (a caller between two calls holds no monitor), so the rule takes the
%% most any instant saw. Read at the end alone, 16 callers of one server
%% counted 15 in one window of two, and the finding's severity flipped at
%% `waiters_crit' on the same load.
looked_waiters(#{waits := Waits}, #{pid := Pid}) ->
    [M || Look <- maps:values(Waits), is_map(Look),
          #{server := #{pid := P, monitored_by := M}} <- maps:get(chains, Look, []),
          P =:= Pid, is_integer(M)];
looked_waiters(_, _) ->
    [].

queue_growth(Procs, T) ->
    Span = max(1.0e-3, maps:get(span_ms, Procs, 0) / 1000),
    Room = maps:get(memory_room, Procs, #{}),
    Partial = maps:is_key(partial, Procs),
    Stalled = maps:from_list([{P, W} || #{pid := P, waited_ms := W} <- maps:get(stalled, Procs, [])]),
    lists:append([queue_finding(E, entry_span(E, Span), T, Room, Partial, Stalled)
                  || E <- maps:get(queues, Procs, [])]).

%% The time between the two readings of an entry's queue: the walks' span,
%% or its own when one end came from the queue watch.
entry_span(#{queue_ms := Ms}, _) when is_integer(Ms), Ms > 0 -> Ms / 1000;
entry_span(_, Span) -> Span.

queue_finding(#{queue := [null, _], born := false}, _, _, _, _, _) ->
    %% Never read at the start (it did not answer): no growth to measure.
    [];
queue_finding(E = #{queue := [Q0, Q1]}, Span, T, Room, Partial, Stalled) when is_integer(Q1) ->
    Start = case Q0 of null -> 0; _ -> Q0 end,
    Growth = Q1 - Start,
    Rate = Growth / Span,
    case Growth >= map_get(queue_growth_min, T) andalso Rate >= map_get(queue_rate_min, T) of
        false ->
            [];
        true ->
            Sev = case Q1 >= map_get(queue_crit, T) of
                      true -> critical;
                      false -> warning
                  end,
            {MemLine, Metrics0} = queue_memory(E, Growth, Rate),
            {RoomLines, Metrics} = exhaustion(Metrics0, Room),
            Waited = maps:get(maps:get(pid, E), Stalled, maps:get(waited_ms, E, undefined)),
            Evidence = [
                fmt("the mailbox of ~ts grew from ~b to ~b messages in ~.1f s: ~b messages/s "
                    "more arrive than it takes", [who(E), Start, Q1, Span, round(Rate)]),
                MemLine] ++ RoomLines ++ stalled_line(Waited) ++ [
                case {Partial, maps:get(answered, E, true)} of
                    {_, false} ->
                        fmt("at this rate the queue holds ~s messages in ten minutes",
                            [beamdiag_units:count(round(Q1 + Rate * 600))]);
                    {false, _} ->
                        fmt("it took ~s reductions in the window and was in ~ts (~ts); at this "
                            "rate the queue holds ~s messages in ten minutes",
                            [beamdiag_units:count(maps:get(reductions, E)),
                             where(E), maps:get(status, E, <<"?">>),
                             beamdiag_units:count(round(Q1 + Rate * 600))]);
                    {true, _} ->
                        fmt("it was in ~ts (~ts) at the window's start; at this rate the queue "
                            "holds ~s messages in ten minutes (the capture was cut short: the "
                            "queue lengths are the start walk's and the last tick's)",
                            [where(E), maps:get(status, E, <<"?">>),
                             beamdiag_units:count(round(Q1 + Rate * 600))])
                end
            ],
            [beamdiag_finding:new(message_queue_growth, Sev, Evidence, Metrics#{
                pid => maps:get(pid, E),
                name => name_or_pid(E),
                queue_start => Start,
                queue_end => Q1,
                queue_rate => round4(Rate)
            })]
    end;
queue_finding(_, _, _, _, _, _) ->
    [].

%% A process that did not answer a read in time: what that means here.
stalled_line(Ms) when is_integer(Ms) ->
    [fmt("it did not answer a read of its state within ~b ms (a process answers only between "
         "its garbage collections, and each copies the messages queued since the last into its "
         "heap: with a queue this long they take seconds); its queue was read all through the "
         "window by a reader that waits", [Ms])];
stalled_line(_) ->
    [].

%% The process's memory now and the rate it grows with the queue, when both
%% ends were measured. A flooded process's memory is an estimate (the agent
%% does not ask a process with a long queue for it: that walks the queue),
%% and the text says so with "~".
queue_memory(E = #{memory := [M0, M1]}, Growth, Rate) when is_integer(M1), is_integer(M0) ->
    PerMsg = max(0, M1 - M0) / Growth,
    {Tilde, How} = estimated(E),
    {fmt("the process holds ~s~ts now (~s~ts at the start)~s: about ~ts a message, ~ts a second "
         "(~ts a minute) at this rate",
         [Tilde, beamdiag_units:bytes(M1), Tilde, beamdiag_units:bytes(M0), How, beamdiag_units:bytes(PerMsg), beamdiag_units:bytes(PerMsg * Rate),
          beamdiag_units:bytes(PerMsg * Rate * 60)]),
     #{memory_bytes => M1, memory_estimated => Tilde =/= "", bytes_per_s => round(PerMsg * Rate),
       bytes_per_minute => round(PerMsg * Rate * 60)}};
queue_memory(E = #{memory := [_, M1]}, _, _) when is_integer(M1) ->
    {Tilde, How} = estimated(E),
    {fmt("the process holds ~s~ts now~s", [Tilde, beamdiag_units:bytes(M1), How]),
     #{memory_bytes => M1, memory_estimated => Tilde =/= ""}};
queue_memory(_, _, _) ->
    {"its memory was not read", #{}}.

estimated(#{memory_estimated := true}) ->
    {"~", " (estimated: its heap plus about 112 B a queued message; a process with a queue this "
          "long is not asked for its memory, which would walk the whole queue; larger messages "
          "hold more)"};
estimated(_) ->
    {"", ""}.

%% When the node runs out of memory at this rate: the host's MemAvailable
%% or the cgroup's limit less its usage, whichever is smaller.
exhaustion(M = #{bytes_per_s := Bps}, #{room := Room, bound_by := By} = R)
  when is_integer(Room), Bps > 0 ->
    Secs = Room / Bps,
    Bound = case By of
                host -> fmt("the host's MemAvailable, ~ts", [beamdiag_units:bytes(Room)]);
                cgroup -> fmt("the cgroup's memory limit, ~ts, less the ~ts it uses",
                              [beamdiag_units:bytes(maps:get(limit, R, 0)), beamdiag_units:bytes(maps:get(usage, R, 0))])
            end,
    %% This process's growth only: memory_growth gives the node's whole.
    {[fmt("counting this process's growth alone, at this rate the node runs out of memory in "
          "~~~ts: ~ts of room left (~ts)", [duration(Secs), beamdiag_units:bytes(Room), Bound])],
     M#{seconds_to_exhaustion => round(Secs), memory_room_bytes => Room,
        memory_bound_by => By}};
exhaustion(M, _) ->
    {[], M}.

%% @doc A time in seconds as people read it.
-spec duration(number()) -> iolist().
duration(S) when S < 120 -> io_lib:format("~b s", [round(S)]);
duration(S) when S < 7200 -> io_lib:format("~.1f min", [S / 60]);
duration(S) -> io_lib:format("~.1f h", [S / 3600]).

%% @doc The processes holding Min bytes or more at the window's end,
%% largest first: the heaps the walks read, and the flooded mailboxes'
%% estimates (a process with a long queue is not asked for its memory, and
%% one that did not answer the end walk is in the queues only), each once.
-spec largest_at_end(map(), non_neg_integer()) -> [map()].
largest_at_end(Procs, Min) ->
    Heaps = maps:get(heaps, Procs, []),
    Read = [P || #{pid := P} <- Heaps],
    Flooded = [E || E = #{pid := P} <- maps:get(queues, Procs, []), not lists:member(P, Read)],
    lists:sort(fun(#{memory := [_, A]}, #{memory := [_, B]}) -> A >= B end,
               [E || E = #{memory := [_, M1]} <- Heaps ++ Flooded, is_integer(M1), M1 >= Min]).

%% @doc The processes that did not answer at the window's end (they were
%% set aside: a process in a long garbage collection, or held in a NIF,
%% answers no read) whose memory at the start was Min bytes or more,
%% largest first.
-spec stalled_large(map(), non_neg_integer()) -> [map()].
stalled_large(Procs, Min) ->
    Big = [E || E = #{memory_start := M} <- maps:get(stalled, Procs, []), is_integer(M), M >= Min],
    lists:sort(fun(#{memory_start := A}, #{memory_start := B}) -> A >= B end, Big).

%% @doc What is known of such a process: who, its memory at the start, and
%% why nothing more.
-spec stalled_large_line(beamdiag_agent_processes:stalled_entry()) -> iolist().
stalled_large_line(E = #{memory_start := M, waited_ms := W}) ->
    fmt("~ts holds ~s at the window's start and did not answer at its end (a read waited "
        "~b ms: a process answers only between its garbage collections, and one that large "
        "takes long to collect)", [who(E), beamdiag_units:bytes(M), W]).

gc_heaps(F = #{id := dirty_cpu_gc, evidence := Ev, metrics := M}, Procs) ->
    Big = largest_at_end(Procs, map_get(heap_bytes_min, thresholds())),
    case {lists:sublist(Big, 3), stalled_large(Procs, map_get(heap_bytes_min, thresholds()))} of
        {[], []} ->
            F#{evidence => Ev ++ [<<"no process heap over 1 MB at the end of the window: the "
                                    "collected heaps are short-lived">>]};
        {[], Stalled} ->
            %% The heaps being collected did not answer: a process answers
            %% only between its collections.
            F#{evidence => Ev ++ [<<"the heaps being collected: the largest processes did not "
                                    "answer at the window's end">>
                                  | [iolist_to_binary(stalled_large_line(E))
                                     || E <- lists:sublist(Stalled, 3)]]};
        {Top, _} ->
            Lines = [iolist_to_binary(heap_line(E)) || E <- Top],
            Sum = lists:sum([M1 || #{memory := [_, M1]} <- Big]),
            F#{evidence => Ev ++ [<<"the heaps being collected: the largest process heaps">>
                                  | Lines] ++
                   [iolist_to_binary(fmt("~b processes over 1 MB hold ~ts: shrink them (bound "
                                         "the queue, move data to ETS, split the process) "
                                         "before tuning the allocator", [length(Big), beamdiag_units:bytes(Sum)]))],
               metrics => M#{largest_heap_bytes => hd_tl(maps:get(memory, hd(Top))),
                             largest_heap_pid => maps:get(pid, hd(Top))}}
    end;
gc_heaps(F, _) ->
    F.

heap_line(E = #{memory := [M0, M1]}) ->
    Growth = case M0 of
                 null -> "";
                 _ -> [", ", sign(M1 - M0), beamdiag_units:bytes(abs(M1 - M0)), " over the window"]
             end,
    Like = case maps:get(like, E, null) of
               N when is_integer(N), N > 1 -> io_lib:format("; ~b processes with its initial call", [N]);
               _ -> ""
           end,
    ["  ", who(E), ": ", beamdiag_units:bytes(M1), Growth, ", ", integer_to_list(hd_tl(maps:get(queue, E))),
     " messages queued", Like].

hd_tl([_, Q1]) -> Q1.

sign(D) when D < 0 -> "-";
sign(_) -> "+".

%% A lock-counting bottleneck on the process this module names becomes one
%% finding: the process evidence first, the lock evidence after it.
merge_bottlenecks(Findings) ->
    Procs = [F || F = #{id := single_process_bottleneck, metrics := #{pid := _}} <- Findings],
    Locks = [F || F = #{id := single_process_bottleneck, metrics := M} <- Findings,
                  is_map_key(process, M)],
    %% Lock counting names a registered process by its name, others by pid.
    Same = fun(#{metrics := #{pid := Pid} = PM}, #{metrics := #{process := Id}}) ->
                   Id =:= Pid orelse Id =:= maps:get(name, PM, undefined)
           end,
    case {Procs, [L || L <- Locks, P <- Procs, Same(P, L)]} of
        {[P], [L | _]} ->
            Merged = P#{
                severity => worse(maps:get(severity, P), maps:get(severity, L)),
                evidence => maps:get(evidence, P) ++ maps:get(evidence, L),
                metrics => maps:merge(maps:get(metrics, L), maps:get(metrics, P))
            },
            [case F of
                 P -> Merged;
                 _ -> F
             end || F <- Findings, F =/= L];
        _ ->
            Findings
    end.

worse(A, B) ->
    case beamdiag_finding:severity_rank(A) =< beamdiag_finding:severity_rank(B) of
        true -> A;
        false -> B
    end.

name_or_pid(#{name := N}) when is_binary(N) -> N;
name_or_pid(#{pid := P}) -> P.

%% The normal schedulers' busy time, in schedulers (BEAM's account).
busy_cpus(#{by_type := #{scheduler := #{busy := B}}, window_s := W}) when is_number(B), W > 0 ->
    B / W;
busy_cpus(_) ->
    undefined.

span_s(#{span_ms := Ms}, _) when is_integer(Ms), Ms > 0 -> Ms / 1000;
span_s(_, #{window_s := W}) -> W.

ratio(_, D) when D == 0 -> 0.0;
ratio(N, D) -> N / D.

round4(X) -> round(X * 10000) / 10000.
fmt(F, A) -> io_lib:format(F, A).

%% @doc A count as people read it (1.2M, 34.5k).
