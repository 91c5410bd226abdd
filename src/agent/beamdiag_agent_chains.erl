%%% @doc Who waits on whom, on the target (erts, kernel and stdlib only):
%%% from the few processes the walks found that others wait on (monitors
%%% on them, as `gen:call' callers hold, or a queue), the chain of waits
%%% down to where it ends, and the processes suspended on busy ports.
%%%
%%% A look reads, with guarded reads (beamdiag_agent_pinfo: a process that
%%% does not answer in 100 ms is left out), only:
%%% <ul>
%%% <li>each candidate (at most ?SERVERS): its status, current function,
%%% stack (at most ?DEPTH frames), monitors, monitors on it, queue length
%%% and reductions; then, while it waits and monitors processes (a caller
%%% in `gen:call' monitors the callee; `file_io_server:do_start' the file
%%% server's opener), the monitored process that is most blocked, down to
%%% ?HOPS hops: the chain ends in a NIF, a port, a suspension, a receive,
%%% a call to another node, a process that runs, or a cycle. A process
%%% waiting in its behaviour's own loop (`gen_server:loop', `gen_statem',
%%% `gen_event', `gen_server2', hibernation) is idle: what it monitors, it
%%% watches (a queue its channels, a server its clients), so the chain
%%% ends there;</li>
%%% <li>at most ?CALLERS of the processes that monitor each candidate:
%%% where they are (their function and the first frames of their stack
%%% past `gen') and whether they are idle in their own loop, all of them
%%% counted;</li>
%%% <li>at most ?SUSPENDED of the processes the walks found suspended, and
%%% the distribution ports (`system_info(dist_ctrl)'): the bytes pending
%%% in each one's driver, its high watermark, its kernel send buffer, and
%%% the node's `dist_buf_busy_limit'.</li>
%%% </ul>
%%% Never the whole process table, never a message queue's contents (no
%%% `messages', no `memory'), never a dictionary.
%%%
%%% Two looks, at the window's start and its end, say how long the waits
%%% lasted: a process whose reductions did not change between them did not
%%% run for the whole span.
%%%
%%% ```
%%% 1> beamdiag_agent_chains:look(#{servers => [whereis(file_server_2)], suspended => []}).
%%% #{t_ns => ..., chains => [...], suspended => #{count => 0, ...}}
%%% '''
-module(beamdiag_agent_chains).

-export([look/1, candidates/2]).

-export_type([look/0, chain/0, hop/0, caller/0]).

%% One look: the chains from the candidates, and the suspended processes
%% with the distribution ports.
-type look() :: #{
    t_ns := integer(),
    chains := [chain()],
    suspended := #{count := non_neg_integer(),
                   read := [caller()],
                   %% One per distribution channel: its node and its port's
                   %% figures, or its controller when that is a process
                   %% (the keys read from the driver vary).
                   dist := [#{node := binary(), atom() => term()}],
                   ports => [beamdiag_agent_ports:port_entry()],
                   dist_buf_busy_limit := non_neg_integer()}
}.
-type chain() :: #{
    server := hop(),
    callers := #{count := non_neg_integer(), read := [caller()]},
    waits_on := [hop()]
}.
%% A process on a chain, with `ends' when the chain ends there; a chain
%% that ends in calls to other nodes ends in a hop of `ends => remote' and
%% the nodes alone.
-type hop() :: #{
    pid => binary(),
    name => binary() | null,
    initial_call => binary() | null,
    status => binary(),
    current => binary() | null,
    stack => [binary()],
    queue => non_neg_integer(),
    reductions => non_neg_integer(),
    monitored_by => non_neg_integer(),
    kind => binary(),
    %% Waiting in its own behaviour loop (with `ends => receive').
    idle => true,
    ends => nif | suspended | port | running | 'receive' | cycle | remote,
    nodes => [binary()]
}.
%% A process waiting on a candidate, or a suspended one (which has `name').
-type caller() :: #{
    pid := binary(),
    name => binary() | null,
    status := binary(),
    current := binary() | null,
    site := binary(),
    reductions := non_neg_integer(),
    %% Waiting in its own receive loop: it watches the process it monitors,
    %% it does not wait for it (callers only).
    idle => boolean()
}.

-define(SERVERS, 4).
-define(HOPS, 5).
-define(CALLERS, 8).
-define(SUSPENDED, 8).
-define(DEPTH, 6).
%% A process with at least this many monitors on it, or messages queued,
%% is a candidate.
-define(WAITERS_MIN, 2).
-define(PORT_MS, 200).
%% A second look at the distribution ports, this long after the first.
-define(DIST_AGAIN_MS, 150).
%% A look's reads stop after this long.
-define(LOOK_MS, 400).
-define(HOP_ITEMS, [registered_name, initial_call, status, current_function, current_stacktrace,
                    monitors, monitored_by, message_queue_len, reductions]).
-define(CALLER_ITEMS, [status, current_function, current_stacktrace, reductions]).
%% The receives of the behaviours' own loops, where a process waits idle
%% between two messages (RabbitMQ's gen_server2 among them).
-define(IDLE_LOOPS, [{gen_server, loop}, {gen_statem, loop_receive}, {gen_event, fetch_msg},
                     {gen_server2, process_next_msg}, {erlang, hibernate}]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The candidates among a walk report's entries: those with monitors
%% on them or a queue, most first, at most ?SERVERS; `Also' (pids of an
%% earlier look) first, to be looked at again.
%% (Entries: beamdiag_agent_processes:entry(); only the keys read here.)
-spec candidates([#{pid := binary(), monitored_by := term(), queue := term(), atom() => term()}],
                 [pid()]) -> [pid()].
candidates(Entries, Also) ->
    Scored = lists:usort([{-(M + Q), P}
                          || #{pid := PT, monitored_by := M, queue := [_, Q]} <- Entries,
                             is_integer(M), is_integer(Q), M + Q >= ?WAITERS_MIN,
                             P <- [list_to_pid(binary_to_list(PT))]]),
    Ps = Also ++ [P || {_, P} <- Scored, not lists:member(P, Also)],
    lists:sublist(Ps, ?SERVERS).

%% @doc One look: the chains from the candidates (`servers'), the
%% suspended processes (`suspended', with `suspended_count' the walk's
%% count) and the distribution ports.
%% Its reads stop at ?LOOK_MS.
-spec look(#{servers := [pid()], suspended := [pid()], suspended_count => non_neg_integer()}) ->
    look().
look(Opts = #{servers := Servers, suspended := Susp}) ->
    T = erlang:monotonic_time(nanosecond),
    Names = names(),
    R = #{deadline => erlang:monotonic_time(microsecond) + ?LOOK_MS * 1000},
    Chains = [C || S <- lists:sublist(Servers, ?SERVERS), C <- [chain(S, Names, R)], C =/= none],
    #{t_ns => T,
      chains => Chains,
      suspended => suspended(lists:sublist(Susp, ?SUSPENDED),
                             maps:get(suspended_count, Opts, length(Susp)), Names, R)}.

%%%===================================================================
%%% Internal
%%%===================================================================

names() ->
    maps:from_list([{P, N} || N <- erlang:registered(), P <- [erlang:whereis(N)], is_pid(P)]).

%% A candidate's chain: the candidate, the processes waiting on it, and
%% what it waits on, hop by hop.
chain(S, Names, R) ->
    case read([S], ?HOP_ITEMS, R) of
        #{S := Info} ->
            Waiters = [P || P <- proplists:get_value(monitored_by, Info, []), is_pid(P)],
            Hops = hops(S, Info, Names, [S], ?HOPS, R),
            #{server => hop(S, Info, Names), callers => callers(Waiters, R),
              waits_on => Hops};
        _ ->
            none
    end.

%% What P (its Info read) waits on: the monitored process most blocked,
%% and so on; the last hop says how the chain ends.
hops(_P, _Info, _Names, _Seen, 0, _R) ->
    [];
hops(_P, Info, Names, Seen, Left, R) ->
    case {kind(Info), followed(Info)} of
        {waiting, {Local, Remote}} when Local =/= [] orelse Remote =/= [] ->
            case Remote of
                [_ | _] when Local =:= [] ->
                    [#{ends => remote, nodes => [atom_to_binary(N, utf8) || N <- Remote]}];
                _ ->
                    Next = read(lists:sublist(Local, ?CALLERS), ?HOP_ITEMS, R),
                    case most_blocked(maps:to_list(Next)) of
                        none ->
                            [];
                        {Q, QInfo} ->
                            case lists:member(Q, Seen) of
                                true -> [(hop(Q, QInfo, Names))#{ends => cycle}];
                                false -> [hop(Q, QInfo, Names)
                                          | hops(Q, QInfo, Names, [Q | Seen], Left - 1, R)]
                            end
                    end
            end;
        _ ->
            []
    end.

%% The monitored process most likely the one waited for: one in a NIF,
%% suspended, waiting in turn on another, running, or plainly waiting.
most_blocked([]) ->
    none;
most_blocked(Infos) ->
    Rank = fun({_, I}) ->
                   case kind(I) of
                       nif -> 0;
                       suspended -> 1;
                       port -> 1;
                       waiting -> case followed(I) of
                                      {[], []} -> 4;
                                      _ -> 2
                                  end;
                       running -> 3;
                       _ -> 5
                   end
           end,
    hd(lists:sort(fun(A, B) -> Rank(A) =< Rank(B) end, Infos)).

%% How a process stands: in a NIF (a function named *_nif, or running in
%% prim_file), at a port, suspended, running Erlang code, or waiting.
kind(Info) ->
    Status = proplists:get_value(status, Info),
    {M, F, _} = case proplists:get_value(current_function, Info) of
                    {_, _, _} = MFA -> MFA;
                    _ -> {undefined, undefined, 0}
                end,
    Nif = lists:suffix("_nif", atom_to_list(F)),
    Port = lists:member({M, F}, [{erlang, port_command}, {erlang, port_control},
                                 {erlang, port_call}, {prim_inet, send}, {prim_inet, recv}]),
    if
        Nif -> nif;
        Status =:= suspended -> suspended;
        Port -> port;
        Status =:= waiting -> waiting;
        Status =:= running; Status =:= runnable; Status =:= garbage_collecting -> running;
        true -> other
    end.

%% The processes a waiting process may wait on (those it monitors), none
%% when it waits in its own receive loop: an idle server monitors its
%% clients, it does not wait for them.
followed(Info) ->
    case idle_loop(Info) of
        true -> {[], []};
        false -> monitored(Info)
    end.

%% Waiting in the receive of a behaviour's own loop (or hibernating):
%% idle, between two messages, whatever it monitors.
idle_loop(Info) ->
    proplists:get_value(status, Info) =:= waiting andalso
        case proplists:get_value(current_function, Info) of
            {M, F, _} -> lists:member({M, F}, ?IDLE_LOOPS);
            _ -> false
        end.

%% The processes P monitors: local pids, and the nodes of remote ones.
monitored(Info) ->
    Ms = proplists:get_value(monitors, Info, []),
    Local = [P || {process, P} <- Ms, is_pid(P), node(P) =:= node()],
    Remote = lists:usort([node(P) || {process, P} <- Ms, is_pid(P), node(P) =/= node()] ++
                         [N || {process, {_, N}} <- Ms, N =/= node()]),
    {Local, Remote}.

hop(P, Info, Names) ->
    Kind = kind(Info),
    Base = #{pid => pid_text(P), name => name(maps:get(P, Names, [])),
             initial_call => mfa(proplists:get_value(initial_call, Info)),
             status => atom_to_binary(proplists:get_value(status, Info, undefined), utf8),
             current => mfa(proplists:get_value(current_function, Info)),
             stack => frames(proplists:get_value(current_stacktrace, Info, [])),
             queue => proplists:get_value(message_queue_len, Info, 0),
             reductions => proplists:get_value(reductions, Info, 0),
             monitored_by => length(proplists:get_value(monitored_by, Info, [])),
             kind => atom_to_binary(Kind, utf8)},
    case {Kind, idle_loop(Info), monitored(Info)} of
        {nif, _, _} -> Base#{ends => nif};
        {suspended, _, _} -> Base#{ends => suspended};
        {port, _, _} -> Base#{ends => port};
        {running, _, _} -> Base#{ends => running};
        {waiting, true, _} -> Base#{ends => 'receive', idle => true};
        {waiting, _, {[], []}} -> Base#{ends => 'receive'};
        _ -> Base
    end.

%% The callers: how many, and where the first ?CALLERS of them are.
callers(Waiters, R) ->
    Read = read(lists:sublist(Waiters, ?CALLERS), ?CALLER_ITEMS, R),
    #{count => length(Waiters),
      read => [#{pid => pid_text(P), status => atom_to_binary(proplists:get_value(status, I), utf8),
                 current => mfa(proplists:get_value(current_function, I)),
                 site => site(proplists:get_value(current_stacktrace, I, [])),
                 reductions => proplists:get_value(reductions, I, 0),
                 idle => idle_loop(I)}
               || {P, I} <- maps:to_list(Read)]}.

%% Where a caller is: its stack's first two frames past the calling
%% machinery (gen, gen_server, gen_statem, erpc, rpc).
site(Stack) ->
    Own = lists:dropwhile(fun({M, _, _, _}) ->
                                  lists:member(M, [gen, gen_server, gen_statem, gen_event, erpc,
                                                   rpc]);
                             (_) -> false
                          end, Stack),
    iolist_to_binary(lists:join(" < ", [frame(Fr) || Fr <- lists:sublist(Own, 2)])).

suspended(Pids, Count, Names, R) ->
    Read = read(Pids, [status, current_function, current_stacktrace, reductions], R),
    #{count => Count,
      read => [#{pid => pid_text(P), name => name(maps:get(P, Names, [])),
                 status => atom_to_binary(proplists:get_value(status, I), utf8),
                 current => mfa(proplists:get_value(current_function, I)),
                 site => site(proplists:get_value(current_stacktrace, I, [])),
                 reductions => proplists:get_value(reductions, I, 0),
                 idle => idle_loop(I)}
               || {P, I} <- maps:to_list(Read)],
      dist => dist_ports(Count, R),
      %% The other ports with the most queued (beamdiag_agent_ports), when
      %% processes are suspended.
      ports => case Count > 0 of
                   true -> beamdiag_agent_ports:busiest(Names);
                   false -> []
               end,
      dist_buf_busy_limit => erlang:system_info(dist_buf_busy_limit)}.

%% Each distribution connection: its node and, for a port, what is
%% pending in its driver; with processes suspended and no port holding
%% bytes, read once more ?DIST_AGAIN_MS later (a peer that reads its
%% socket in bursts empties it for a moment: one look in ten fell in such
%% a burst, 100 ms of each second, in the lab's busy_dist), while the
%% look has that long left.
dist_ports(Suspended, #{deadline := Until}) when Suspended > 0 ->
    First = dist_ports(),
    Left = beamdiag_agent_deadline:left(Until, microsecond) div 1000,
    case [D || D = #{send_pend := P} <- First, P > 0] of
        [] when Left >= ?DIST_AGAIN_MS ->
            timer:sleep(?DIST_AGAIN_MS),
            dist_ports();
        _ ->
            First
    end;
dist_ports(_, _) ->
    dist_ports().

%% Read in a helper of its own, bounded: a port call waits for the port.
dist_ports() ->
    Ctrl = erlang:system_info(dist_ctrl),
    case beamdiag_agent_deadline:within(fun() -> [dist_port(N, C) || {N, C} <- Ctrl] end,
                                        ?PORT_MS) of
        {ok, R} ->
            R;
        {error, _} ->
            [];
        timeout ->
            [#{node => atom_to_binary(N, utf8), error => <<"the port did not answer">>}
             || {N, _} <- Ctrl]
    end.

dist_port(Node, Port) when is_port(Port) ->
    Base = #{node => atom_to_binary(Node, utf8),
             port => list_to_binary(erlang:port_to_list(Port))},
    Stats = try prim_inet:getstat(Port, [send_pend]) of
                {ok, [{send_pend, Pend}]} -> #{send_pend => Pend};
                _ -> #{}
            catch _:_ -> #{}
            end,
    Opts = try prim_inet:getopts(Port, [high_watermark, sndbuf]) of
               {ok, L} -> maps:from_list([{K, V} || {K, V} <- L, is_integer(V)]);
               _ -> #{}
           catch _:_ -> #{}
           end,
    Queue = case erlang:port_info(Port, queue_size) of
                {queue_size, Q} -> #{queue_size => Q};
                _ -> #{}
            end,
    maps:merge(Base, maps:merge(Stats, maps:merge(Opts, Queue)));
dist_port(Node, Pid) ->
    #{node => atom_to_binary(Node, utf8), controller => pid_text(Pid)}.

read(Pids, Items, R) ->
    element(1, beamdiag_agent_pinfo:read(Pids, Items, R)).

frames(Stack) ->
    [frame(F) || F <- lists:sublist(Stack, ?DEPTH)].

frame({M, F, A, _}) when is_list(A) -> mfa({M, F, length(A)});
frame({M, F, A, _}) -> mfa({M, F, A});
frame(_) -> <<"?">>.

pid_text(P) -> list_to_binary(pid_to_list(P)).

name([]) -> null;
name(N) when is_atom(N) -> atom_to_binary(N, utf8).

mfa({M, F, A}) when is_atom(M), is_atom(F), is_integer(A) ->
    iolist_to_binary([atom_to_binary(M, utf8), $:, atom_to_binary(F, utf8), $/,
                      integer_to_list(A)]);
mfa(_) ->
    <<"undefined">>.
