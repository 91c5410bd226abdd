%%% @doc Who waits on whom (pure): the looks the walker took at the window's
%%% start and end (`beamdiag_agent_chains', in the process data as
%%% `waits').
%%%
%%% `wait_chain': a process that at least `waiters_min' processes wait on
%%% (monitors on it: callers in `gen:call' or `erpc' hold one on the
%%% process they call), while it does not run Erlang code itself: it waits
%%% in a call to another process, in a receive, at a port, in a NIF (a
%%% file operation on a dirty I/O scheduler) or suspended. The evidence
%%% names the callers (how many, where), each process down the chain, what
%%% the chain ends in, and how long each had not worked: a process whose
%%% reductions grew by at most `idle_reds_max' between the two looks did
%%% nothing but answer the looks' own reads (each read of a waiting process
%%% costs it a reduction or so) for that long.
%%%
%%% `busy_port': processes the walks found suspended (a send to a busy
%%% port suspends the sender: to a node whose distribution buffer is full,
%%% `busy_dist_port', or to a port that says it is busy), with the
%%% distribution ports' pending bytes and the node's busy limit.
%%%
%%% ```
%%% 1> [Id || #{id := Id} <- beamdiag_chain_rules:findings(Procs)].
%%% [wait_chain]
%%% '''
-module(beamdiag_chain_rules).

-export([findings/1]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The wait findings of a window's process data.
-spec findings(beamdiag_agent_processes:report()) -> [beamdiag_finding:finding()].
findings(#{waits := Waits}) ->
    T = thresholds(),
    Last = maps:get('end', Waits, maps:get(start, Waits, #{})),
    First = case Waits of
                #{start := S, 'end' := _} -> S;
                _ -> none
            end,
    Span = case First of
               #{t_ns := T0} -> (maps:get(t_ns, Last) - T0) / 1.0e9;
               none -> 0.0
           end,
    Before = before(First),
    lists:append([chain(C, Before, Span, T) || C <- maps:get(chains, Last, [])]) ++
        suspended(maps:get(suspended, Last, #{}), {Before, suspended_before(First)}, Span, T,
                  maps:get(suspended_samples, Waits, []));
findings(_) ->
    [].

%% The thresholds the rules use.
-spec thresholds() -> #{atom() => number()}.
thresholds() ->
    #{
        %% Processes waiting on one (monitors on it).
        waiters_min => 4,
        waiters_crit => 16,
        %% Reductions between the looks of a process that did not work.
        idle_reds_max => 100,
        %% A span this long without work makes a chain critical.
        idle_crit_s => 2.0,
        %% Suspended processes that make a finding without a second look,
        %% and make it critical with one.
        suspended_min => 4
    }.

%%%===================================================================
%%% Internal
%%%===================================================================

%% Reductions by pid at the first look: servers, hops, callers, suspended.
before(none) ->
    #{};
before(#{chains := Chains, suspended := Susp}) ->
    maps:from_list(
      [{P, R} || #{server := S, waits_on := Hops, callers := #{read := Cs}} <- Chains,
                 #{pid := P, reductions := R} <- [S | Hops] ++ Cs] ++
      [{P, R} || #{pid := P, reductions := R} <- maps:get(read, Susp, [])]);
before(_) ->
    #{}.

%% Whether P did no work between the looks.
idle(#{pid := P, reductions := R}, Before, T) ->
    case maps:find(P, Before) of
        {ok, R0} -> R - R0 =< map_get(idle_reds_max, T);
        error -> false
    end.

chain(#{server := S = #{kind := Kind}, callers := Callers, waits_on := Hops}, Before, Span, T) ->
    Count = maps:get(count, Callers, 0),
    Read = maps:get(read, Callers, []),
    %% Those that monitor it from their own idle loop watch it (channels
    %% their queue, a server its clients): they are not waiting for it. The
    %% count is scaled by the share of the callers read that are not idle.
    IdleLoops = length([C || C <- Read, maps:get(idle, C, false)]),
    Waiters = case Read of
                  [] -> Count;
                  _ -> round(Count * (length(Read) - IdleLoops) / length(Read))
              end,
    case Waiters >= map_get(waiters_min, T) andalso Kind =/= <<"running">> of
        false ->
            [];
        true ->
            Waiting = [C || C = #{status := St} <- Read, St =:= <<"waiting">>,
                            not maps:get(idle, C, false)],
            IdleCallers = length([C || C <- Read, not maps:get(idle, C, false),
                                       idle(C, Before, T)]),
            ServerIdle = idle(S, Before, T) andalso Span > 0,
            End = case Hops of
                      [] -> S;
                      _ -> lists:last(Hops)
                  end,
            Sev = case Waiters >= map_get(waiters_crit, T) orelse
                       (ServerIdle andalso Span >= map_get(idle_crit_s, T)) of
                      true -> critical;
                      false -> warning
                  end,
            Evidence = [
                fmt("~b processes wait on ~ts (they hold monitors on it, as callers in gen:call "
                    "and erpc do; ~b messages in its queue): ~ts",
                    [Waiters, who(S), maps:get(queue, S, 0), callers_text(Read, Waiting)])
            ] ++ [fmt("of the ~b processes that monitor it, ~b of the ~b read wait in their "
                      "own receive loop (gen_server:loop and the like): they watch it, they do "
                      "not wait for it, and are counted out", [Count, IdleLoops, length(Read)])
                  || IdleLoops > 0] ++ [
                fmt("it does not run Erlang code: it waits in ~ts (~ts)~ts",
                    [maps:get(current, S), stack_text(S), idle_text(ServerIdle, Span)])
            ] ++ [hop_line(H, Before, Span, T) || H = #{pid := _} <- Hops]
              ++ [end_line(End)]
              ++ [fmt("~b of the ~b callers read did no work between the window's start and "
                      "end (~.1f s): they waited all that time",
                      [IdleCallers, length(Read) - IdleLoops, Span])
                  || IdleCallers > 0, Span > 0],
            [beamdiag_finding:new(wait_chain, Sev, Evidence, #{
                pid => maps:get(pid, S),
                name => name_or_pid(S),
                waiters => Waiters,
                chain => length(Hops) + 1,
                ends => atom_to_binary(maps:get(ends, End, undefined), utf8),
                ends_in => maps:get(current, End, <<"?">>),
                idle_s => case ServerIdle of
                              true -> round4(Span);
                              false -> 0
                          end
             }, maps:merge(#{title => ["Processes wait on ", name_or_pid(S), ", which waits on ",
                                       end_short(End)]}, chain_fix(End)))]
    end.

callers_text(Read, Waiting) ->
    Sites = count_by([case Site of
                          <<>> -> Cur;
                          _ -> <<Cur/binary, " < ", Site/binary>>
                      end || #{current := Cur, site := Site} <- Waiting]),
    io_lib:format("~b of the ~b read are waiting, in ~ts",
                  [length(Waiting), length(Read),
                   lists:join("; ", [io_lib:format("~ts (~b)", [S, N])
                                     || {S, N} <- lists:sublist(Sites, 3)])]).

hop_line(H = #{kind := Kind}, Before, Span, T) ->
    fmt("~ts (~ts, ~ts): ~ts~ts",
        [who(H), maps:get(status, H), maps:get(current, H),
         case Kind of
             <<"waiting">> -> ["it waits, with a monitor from the one before it on it; in ",
                               stack_text(H)];
             _ -> ["in ", stack_text(H)]
         end,
         idle_text(idle(H, Before, T) andalso Span > 0, Span)]).

%% How the chain ends, in words.
end_line(E = #{ends := nif}) ->
    Cur = maps:get(current, E),
    case binary:match(Cur, <<"prim_file:">>) of
        nomatch ->
            fmt("the chain ends in the NIF ~ts: native code that has not returned (on a dirty "
                "scheduler, or holding its scheduler)", [Cur]);
        _ ->
            fmt("the chain ends in the NIF ~ts: a file operation blocked in the kernel on a "
                "dirty I/O scheduler (a FIFO with no writer, a hung or slow mount); every call "
                "of the node's file server waits behind it", [Cur])
    end;
end_line(E = #{ends := suspended}) ->
    fmt("the chain ends in ~ts, suspended: a send to a busy port (a full distribution buffer "
        "to a slow node) or erlang:suspend_process/1", [who(E)]);
end_line(E = #{ends := port}) ->
    fmt("the chain ends at a port: ~ts is in ~ts", [who(E), maps:get(current, E)]);
end_line(E = #{ends := 'receive', idle := true}) ->
    fmt("the chain ends in ~ts, idle in its own loop (~ts): it takes its next message as it "
        "comes, so what holds the callers is the work it does for each", [who(E), maps:get(current, E)]);
end_line(E = #{ends := 'receive'}) ->
    fmt("the chain ends in a receive: ~ts waits in ~ts for a message that has not come "
        "(no monitor on another process)", [who(E), maps:get(current, E)]);
end_line(#{ends := remote, nodes := Nodes}) ->
    fmt("the chain ends in a call to another node: ~ts (diagnose that node)",
        [lists:join(", ", Nodes)]);
end_line(E = #{ends := cycle}) ->
    fmt("the chain comes back to ~ts: a cycle of calls, a deadlock broken only by a timeout",
        [who(E)]);
end_line(E = #{ends := running}) ->
    fmt("the chain ends in ~ts, which runs (~ts): it is the bottleneck", [who(E),
                                                                          maps:get(current, E)]);
end_line(E) ->
    fmt("the chain ends in ~ts (~ts, ~ts): what it waits on was not found within the looks' "
        "bounds", [who(E), maps:get(status, E, <<"?">>), maps:get(current, E, <<"?">>)]).

%% A chain that ends in a file operation gets the file fix alone.
chain_fix(#{ends := nif, current := <<"prim_file:", _/binary>>}) ->
    #{fix => "Find the file (the file operations of the node's other processes are stuck behind "
             "it: a FIFO that nobody writes, a file on a hung or slow mount) and free it. Open "
             "such files with the raw option, from a process of their own: a raw open runs in "
             "the calling process, not in the node's file server, so one blocked open stops its "
             "caller only; give whoever waits for it a timeout."};
chain_fix(_) ->
    #{}.

end_short(#{ends := nif, current := Cur}) -> ["the NIF ", Cur];
end_short(#{ends := remote, nodes := Nodes}) -> ["a call to ", lists:join(", ", Nodes)];
end_short(E = #{ends := suspended}) -> [name_or_pid(E), ", suspended"];
end_short(E = #{ends := 'receive'}) -> [name_or_pid(E), " in a receive"];
end_short(E = #{ends := cycle}) -> [name_or_pid(E), " (a cycle)"];
end_short(E) -> name_or_pid(E).

%% Processes suspended on a busy port.
suspended(#{count := N} = Susp, {Before, BeforeSusp}, Span, T, Samples) when N > 0 ->
    Read = maps:get(read, Susp, []),
    Through = [S || S <- Read, idle(S, Before, T)],
    Both = [S || S = #{pid := P} <- Read, maps:is_key(P, BeforeSusp)],
    Busy = [D || D = #{send_pend := P, high_watermark := H} <- maps:get(dist, Susp, []), P >= H],
    Pending = case Busy of
                  [] -> [D || D = #{send_pend := P} <- maps:get(dist, Susp, []), P > 0];
                  _ -> Busy
              end,
    Fires = (Both =/= [] andalso Span > 0) orelse N >= map_get(suspended_min, T),
    case Fires of
        false ->
            [];
        true ->
            Sev = case N >= map_get(suspended_min, T) andalso Both =/= [] of
                      true -> critical;
                      false -> warning
                  end,
            Limit = maps:get(dist_buf_busy_limit, Susp, 0),
            Sites = count_by([case Site of
                                  <<>> -> Cur;
                                  _ -> <<Cur/binary, " < ", Site/binary>>
                              end || #{current := Cur, site := Site} <- Read]),
            Evidence = [
                fmt("~b processes are suspended (status suspended, counted by the walk); of the ~b "
                    "read: ~ts", [N, length(Read),
                                  lists:join("; ", [io_lib:format("~ts (~b)", [S, K])
                                                    || {S, K} <- lists:sublist(Sites, 3)])])
            ] ++ [fmt("~b of them were suspended at the window's start too, ~.1f s before; ~b did "
                      "no work at all in between (suspended all that time)",
                      [length(Both), Span, length(Through)]) || Both =/= [], Span > 0]
              ++ samples_line(Samples)
              ++ [dist_line(D, Limit) || D <- Pending]
              ++ case Pending of
                     [] -> [fmt("no distribution port has bytes pending: the busy port is "
                                "another (a port driver that says it is busy); the node's "
                                "dist_buf_busy_limit is ~ts", [beamdiag_units:bytes(Limit)])
                            | port_lines(maps:get(ports, Susp, []))];
                     _ -> []
                 end,
            Peer = case Pending of
                       [#{node := Node} | _] -> Node;
                       [] -> <<>>
                   end,
            Metrics0 = #{suspended => N, suspended_both_looks => length(Both),
                         suspended_through => length(Through), dist_buf_busy_limit => Limit},
            Metrics = case Pending of
                          [D | _] -> Metrics0#{peer => Peer, port => maps:get(port, D, <<>>),
                                               send_pend_bytes => maps:get(send_pend, D, 0)};
                          [] -> Metrics0
                      end,
            Ports = maps:get(ports, Susp, []),
            Title = case {Pending, Ports} of
                        {[], [#{name := Busiest} | _]} ->
                            ["Processes are suspended on a busy port: ", Busiest];
                        {[], []} -> "Processes are suspended on a busy port";
                        _ -> ["Processes are suspended on a busy distribution port to ", Peer]
                    end,
            Metrics1 = case {Pending, Ports} of
                           {[], [#{port := PId, name := PN, queue_size := PQ} = P0 | _]} ->
                               Metrics#{port => PId, port_name => PN, queue_bytes => PQ,
                                        os_pid => maps:get(os_pid, P0, null)};
                           _ -> Metrics
                       end,
            [beamdiag_finding:new(busy_port, Sev, Evidence, Metrics1,
                                  #{title => Title, fix => busy_fix(Pending, Limit)})]
    end;
suspended(_, _, _, _, _) ->
    [].

%% The other ports with the most queued in their drivers at the end: what
%% each is, its program and what that program does by the kernel's account.
port_lines([]) ->
    [<<"no other port had anything queued in its driver at the end">>];
port_lines(Ports) ->
    [fmt("port ~ts (~ts)~ts has ~ts queued in its driver; its owner ~ts~ts",
         [Id, Name, case P of
                        #{os_pid := OsPid} -> io_lib:format(", OS pid ~b,", [OsPid]);
                        _ -> ""
                    end,
          beamdiag_units:bytes(Q), owner(P), program(P)])
     || P = #{port := Id, name := Name, queue_size := Q} <- Ports].

owner(#{owner := null}) -> "is gone";
owner(#{owner := O, owner_name := null}) -> ["is ", O];
owner(#{owner := O, owner_name := N}) -> ["is ", N, " ", O].

%% What the port's program does: the kernel function it sleeps in and its
%% system call (beamdiag_agent_waits).
program(#{program := #{call := running}}) ->
    "; its program is running, not waiting: it reads the pipe slower than the senders write";
program(#{program := #{wchan := W, call := Call} = Wait}) ->
    CallText = case Call of
                   #{name := CName} -> [", in the system call ", CName,
                                        case Wait of
                                            #{file := F} -> [" on ", F];
                                            _ -> ""
                                        end];
                   _ -> ""
               end,
    ["; its program is not reading it: it sleeps in the kernel in ",
     case W of <<>> -> "?"; <<"0">> -> "?"; _ -> W end, CallText];
program(#{os_pid := _}) ->
    "; what its program does could not be read from /proc";
program(_) ->
    "".

%% How much of the window the start's suspended processes spent suspended,
%% from the walker's status reads every half second.
samples_line(Samples) ->
    K = lists:sum([S || #{suspended := S} <- Samples]),
    N = lists:sum([X || #{samples := X} <- Samples]),
    case N of
        0 -> [];
        _ -> [fmt("sampled every 0.5 s through the window, the ~b processes suspended at its "
                  "start were still suspended in ~b of ~b samples (~b%)",
                  [length(Samples), K, N, round(100 * K / N)])]
    end.

%% The pids suspended at the first look.
suspended_before(#{suspended := #{read := Read}}) ->
    maps:from_list([{P, true} || #{pid := P, status := <<"suspended">>} <- Read]);
suspended_before(_) ->
    #{}.

dist_line(D = #{node := Node}, Limit) ->
    fmt("the distribution port ~ts to ~ts has ~ts pending in its driver (its high watermark "
        "~ts, the kernel's send buffer ~ts); sends to that node beyond the distribution buffer's "
        "busy limit (dist_buf_busy_limit, ~ts here) suspend the sender: ~ts reads more slowly "
        "than this node sends",
        [maps:get(port, D, <<"?">>), Node, beamdiag_units:bytes(maps:get(send_pend, D, 0)),
         beamdiag_units:bytes(maps:get(high_watermark, D, 0)),
         beamdiag_units:bytes(maps:get(sndbuf, D, 0)), beamdiag_units:bytes(Limit),
         Node]).

busy_fix([], _Limit) ->
    "Find the port the processes send to (the ports above, with the most queued in their "
    "drivers) and why it applies back-pressure: a port program that stopped reading or reads "
    "slowly (what it sleeps in says why: a pipe or a socket of its own, a lock, a disk), a "
    "socket whose peer reads slowly. Fix or restart that program, send less or in bigger "
    "batches, or move the work off the critical path (a process that buffers and drops when "
    "the port is busy).";
busy_fix([#{node := Node} | _], Limit) ->
    ["Find why ", Node, " reads slowly (diagnose it: it may be overloaded, starved or held), and "
     "send it less: fewer or smaller messages, bulk data out of band (a socket of its own, a "
     "file), replies batched. +zdbbl raises the distribution buffer's busy limit (this node's "
     "is ", beamdiag_units:bytes(Limit), ") and only delays the suspension while the "
     "buffer holds the memory."].

idle_text(true, Span) -> io_lib:format("; it did no work between the window's start and end "
                                       "(~.1f s)", [Span]);
idle_text(false, _) -> "".

stack_text(#{stack := Stack}) when Stack =/= [] ->
    lists:join(" < ", lists:sublist(Stack, 3));
stack_text(#{current := Cur}) ->
    Cur.

who(E = #{pid := Pid}) ->
    Name = case maps:get(name, E, null) of
               null -> [];
               N -> [N, " "]
           end,
    [Name, Pid].

name_or_pid(#{name := N}) when is_binary(N) -> N;
name_or_pid(#{pid := P}) -> P.

count_by(Keys) ->
    lists:reverse(lists:keysort(2, maps:to_list(
        lists:foldl(fun(K, Acc) -> maps:update_with(K, fun(N) -> N + 1 end, 1, Acc) end,
                    #{}, Keys)))).

round4(X) -> round(X * 10000) / 10000.
fmt(F, A) -> io_lib:format(F, A).
