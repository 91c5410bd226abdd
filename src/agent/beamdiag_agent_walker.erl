%%% @doc The process walks' own process, on the target (erts, kernel and
%%% stdlib only). It takes the walk at the window's start, keeps the walk's
%%% state (every process's figures at the start, which would cost a copy
%%% of the whole table each time it were sent to another process) and
%%% takes the next walks when the agent asks: one in the middle of a watch
%%% every few ticks, and the one at the window's end. In a process of its
%%% own, so that a process that answers slowly (one held in a NIF) stalls
%%% the walk, not the agent's ticks; at high priority like the agent (on a
%%% node whose processes crowd the run queue a normal walker would wait
%%% behind them). It ends with the agent: it monitors it, and it exits
%%% after the end walk.
%%%
%%% After the start walk it starts the queue watch (beamdiag_agent_queues)
%%% on the processes `beamdiag_agent_processes:watch/1' names, hands it to
%%% the agent (whose ticks read it) and gives its readings to the end walk's
%%% report; it stops the watch when it ends.
%%%
%%% The start walk's report and the watch's readings also go straight to
%%% the session's caller, not through the agent: on a node starved of CPU
%%% a tick (its /proc reads, each a trip to a dirty I/O thread and back)
%%% takes a second or more, and the agent reads its messages only between
%%% ticks. The caller then has the queues' growth even when the ticks come
%%% too slowly for a window (measured on a flooded node on a loaded 2-core
%%% host: the agent's first tick came 2.3 to 6.2 s after its start).
%%%
%%% Messages to the agent: `{beamdiag_walk, Walker, Result}', Result one of
%%% `{started, Snapshot, Watch}' (the start walk's report alone and the
%%% queue watch the ticks read), `{next, Report}' and `{error, Text}'. The
%%% end walk's report goes to whoever asked, as `{Ref, {ok, Report}}' or
%%% `{Ref, {error, Text}}'. To the caller, `{beamdiag, Ref, Event}':
%%% `{procs_start, Snapshot}' once, then `{queue_reads, T, Reads}' (T the
%%% node's monotonic time in ns) every half second while they change, and
%%% `{atom_sources, Report}' when the atom table grows (see below).
%%%
%%% Every half second it also looks at the atom count (a counter of the
%%% runtime): when it has grown by ?ATOMS_MIN or more since the start walk
%%% and is still growing (modules loaded on demand bring their atoms in one
%%% burst),
%%% it samples which of the walked processes are running and where
%%% (beamdiag_agent_limits:sources/2; at most twice a window, a second
%%% apart): atoms are made by running code, and are never freed.
-module(beamdiag_agent_walker).

-export([start/3, next/1, finish/2]).

%% The start walk's figures take about this many words a process (the
%% tuple, its entry in the list and in the map), at most ?MAX_HEAP_WORDS
%% (8 MB) up front.
-define(WORDS_PER_PROCESS, 20).
-define(MAX_HEAP_WORDS, 1000000).
%% How often the watch's readings go to the caller.
-define(READS_MS, 500).
%% Atoms made since the start walk that make the walker look for their
%% source; at most this many looks a window, this far apart.
-define(ATOMS_MIN, 100).
-define(ATOM_LOOKS, 2).
-define(ATOM_GAP_MS, 1000).
%% A look's reads stop after this long (it takes a few milliseconds a
%% round on a node of 10,000 processes).
-define(ATOM_LOOK_US, 1000000).
%% The status reads of the suspended processes stop after this long.
-define(SUSP_MS, 50).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Starts the walker for Agent; Skip: pids left out of the walks
%% (the agent's helpers; the agent and the walker always are); To: the
%% session's caller and reference, or `none'.
-spec start(pid(), [pid()], {pid(), reference()} | none) -> pid().
start(Agent, Skip, To) ->
    %% The start walk keeps every process's figures for the end walk: a
    %% heap that holds them from the first avoids the collections that
    %% would grow it step by step (measured at 10,000 processes: the two
    %% walks 5 to 10% faster).
    Words = min(?MAX_HEAP_WORDS, ?WORDS_PER_PROCESS * erlang:system_info(process_count)),
    spawn_opt(fun() -> init(Agent, Skip, To) end, [{priority, high}, {min_heap_size, Words}]).

%% @doc Asks for the report since the last walk (answered with
%% `{beamdiag_walk, Walker, {next, Report}}').
-spec next(pid()) -> ok.
next(Walker) ->
    Walker ! {beamdiag_walk_next, self()},
    ok.

%% @doc Asks for the end walk's report, answered to the caller with Ref;
%% the walker then exits.
-spec finish(pid(), reference()) -> ok.
finish(Walker, Ref) ->
    Walker ! {beamdiag_walk_finish, self(), Ref},
    ok.

%%%===================================================================
%%% Internal
%%%===================================================================

init(Agent, Skip, To) ->
    MRef = erlang:monitor(process, Agent),
    case attempt(fun() -> beamdiag_agent_processes:start(#{skip => [Agent | Skip]}) end) of
        {ok, S} ->
            Watch = beamdiag_agent_queues:start(beamdiag_agent_processes:watch(S), #{}),
            Snapshot = beamdiag_agent_processes:snapshot(S),
            tell(To, {procs_start, Snapshot}),
            Agent ! {beamdiag_walk, self(), {started, Snapshot, Watch}},
            %% Who waits on whom at the start: the start report again,
            %% with it (a few guarded reads, after the report has gone).
            {S2, Susp} = case attempt(fun() -> beamdiag_agent_processes:wait_chains(S, Snapshot) end) of
                             {ok, {Snapshot2, S1}} ->
                                 tell(To, {procs_start, Snapshot2}),
                                 {S1, suspended_pids(Snapshot2)};
                             {error, _} ->
                                 {S, []}
                         end,
            %% The watch's readers are not walked.
            Readers = beamdiag_agent_queues:readers(Watch),
            loop(#{agent => Agent, mref => MRef, to => To, watch => Watch, sent => #{},
                   atoms => erlang:system_info(atom_count), looks => [],
                   susp => maps:from_list([{P, {0, 0}} || P <- Susp])},
                 S2#{skip := Readers ++ maps:get(skip, S2)});
        {error, _} = E ->
            Agent ! {beamdiag_walk, self(), E}
    end.

loop(L = #{agent := Agent, mref := MRef, watch := Watch}, S) ->
    receive
        {beamdiag_walk_next, Agent} ->
            case attempt(fun() -> beamdiag_agent_processes:next(S) end) of
                {ok, {Report, S2}} ->
                    Agent ! {beamdiag_walk, self(), {next, Report}},
                    loop(L, S2);
                {error, _} = E ->
                    beamdiag_agent_queues:stop(Watch),
                    Agent ! {beamdiag_walk, self(), E}
            end;
        {beamdiag_walk_finish, From, Ref} ->
            Reads = beamdiag_agent_queues:read(Watch),
            Report = case attempt(fun() -> beamdiag_agent_processes:finish(S, Reads) end) of
                         {ok, R = #{waits := W}} ->
                             {ok, R#{waits := W#{suspended_samples => susp_samples(L)}}};
                         Other ->
                             Other
                     end,
            beamdiag_agent_queues:stop(Watch),
            From ! {Ref, Report};
        {'DOWN', MRef, process, Agent, _} ->
            beamdiag_agent_queues:stop(Watch)
    after ?READS_MS ->
        loop(susp_sample(atom_look(send_reads(L), S)), S)
    end.

%% The processes the start's look found suspended: their status read again
%% every half second (guarded, at most ?SUSP_MS), to say how much of the
%% window they spent suspended.
susp_sample(L = #{susp := Susp}) when map_size(Susp) > 0 ->
    Deadline = erlang:monotonic_time(microsecond) + ?SUSP_MS * 1000,
    {Read, _} = beamdiag_agent_pinfo:read(maps:keys(Susp), [status], #{deadline => Deadline}),
    L#{susp := maps:map(fun(P, {K, N}) ->
                                case maps:find(P, Read) of
                                    {ok, [{status, suspended}]} -> {K + 1, N + 1};
                                    {ok, _} -> {K, N + 1};
                                    error -> {K, N}
                                end
                        end, Susp)};
susp_sample(L) ->
    L.

susp_samples(#{susp := Susp}) ->
    [#{pid => list_to_binary(pid_to_list(P)), suspended => K, samples => N}
     || {P, {K, N}} <- maps:to_list(Susp), N > 0].

suspended_pids(#{waits := #{start := #{suspended := #{read := Read}}}}) ->
    [list_to_pid(binary_to_list(P)) || #{pid := P, status := <<"suspended">>} <- Read];
suspended_pids(_) ->
    [].

%% When the atom table grew, which processes are making atoms.
atom_look(L = #{to := To, atoms := A0, looks := Looks}, S) ->
    Now = erlang:monotonic_time(millisecond),
    A = erlang:system_info(atom_count),
    %% Grown since the start walk, and still growing: not one burst (code
    %% loaded on demand brings its atoms at once).
    Grew = A - A0 >= ?ATOMS_MIN andalso A > maps:get(last_atoms, L, A0),
    Due = case Looks of
              [] -> true;
              [Last | _] -> length(Looks) < ?ATOM_LOOKS andalso Now - Last >= ?ATOM_GAP_MS
          end,
    case Grew andalso Due andalso To =/= none of
        true ->
            R = beamdiag_agent_limits:sources(beamdiag_agent_processes:pids(S),
                                              #{deadline => erlang:monotonic_time(microsecond)
                                                                + ?ATOM_LOOK_US}),
            tell(To, {atom_sources, R}),
            L#{looks := [Now | Looks], last_atoms => A};
        false ->
            L#{last_atoms => A}
    end.

%% The watch's readings to the caller, when they changed.
send_reads(L = #{to := none}) ->
    L;
send_reads(L = #{to := To, watch := Watch, sent := Sent}) ->
    case beamdiag_agent_queues:read(Watch) of
        Sent ->
            L;
        Reads ->
            tell(To, {queue_reads, erlang:monotonic_time(nanosecond), Reads}),
            L#{sent := Reads}
    end.

tell(none, _Event) ->
    ok;
tell({Caller, Ref}, Event) ->
    Caller ! {beamdiag, Ref, Event},
    ok.

attempt(F) ->
    try
        {ok, F()}
    catch
        Class:Reason -> {error, beamdiag_agent:error_text(Class, Reason)}
    end.
