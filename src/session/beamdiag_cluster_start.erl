%%% @doc The synchronised start of a cluster diagnosis's windows: every
%%% member's agent gets ready first, then all windows open on one word,
%%% with the same wall-clock end, and each member's result is gathered
%%% by a backstop.
%%%
%%% The starter (`starter/0') is the process the agents tell they are
%%% ready (the agent's option `go'). Each member's collector
%%% (`collector/4') runs the member's diagnosis in a process of its own
%%% and sends its result to the session. `run_all/3' waits until every
%%% collector's agent is ready (or has ended), or 2 s at most, then has
%%% the starter tell every agent ready, and each that gets ready later,
%%% the same wall-clock end; so none of the agents' own start (their
%%% flags, the start walk, hundreds of them at once on a few cores) falls
%%% inside any window. A collector that has not answered within 4 s of
%%% the report's due time (the window's end and the slack) is ended and
%%% listed (`no_answer'), one that crashed is listed (`crashed'), and the
%%% rest stand.
%%%
%%% The errors are `beamdiag_cluster''s (`{error, {beamdiag_cluster,
%%% Reason}}'), put in words by `beamdiag_cluster:format_error/1'.
%%%
%%% ```
%%% 1> S = beamdiag_cluster_start:starter().
%%% 2> Tag = make_ref().
%%% 3> Cs = [beamdiag_cluster_start:collector(N, N, Tag,
%%%              fun() -> beamdiag_collect:run(N, #{go => maps:get(pid, S)}) end)
%%%          || N <- ['a@host1', 'b@host2']].
%%% 4> {Results, #{ready := 2}} =
%%%        beamdiag_cluster_start:run_all(Cs, S, #{duration => 5, slack => 2.0}).
%%% 5> beamdiag_cluster_start:stop_starter(S).
%%% ok
%%% '''
-module(beamdiag_cluster_start).

-export([starter/0, stop_starter/1, collector/4, run_all/3]).

-export_type([starter/0, collector/0, marks/0]).

%% The starter's process and the tag of its words to the session.
-type starter() :: #{pid := pid(), tag := reference()}.
%% One member's collector: its process, the session's monitor of it, the
%% member, its node and the tag of its result.
-type collector() :: #{pid := pid(), mref := reference(), member := node(), node := node(),
                       tag := reference()}.
%% When the windows were armed, opened and due to end (monotonic ms), and
%% how many agents were ready when they opened.
-type marks() :: #{armed := integer(), go := integer(), window_end := integer(),
                   ready := non_neg_integer()}.

%% How long past the report's due time a member's agent may still take to
%% send what it has (the collector's own grace) before it is given up.
-define(GRACE_MS, 4000).
%% How long past the last member prepared the windows wait for agents
%% still getting ready; one ready later samples what is left of the
%% window.
-define(ARM_MS, 2000).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Starts the process the agents tell they are ready (the agent's
%% option `go', its `pid'): until the session opens the windows it passes
%% each word on to the session; told to open them, it tells every agent
%% ready, and then each that gets ready later, the same end. It is linked
%% to the session, and an agent still waiting for it ends when it ends.
%% Being a process of its own, a word that comes after the session never
%% reaches the session's caller.
-spec starter() -> starter().
starter() ->
    Session = self(),
    Tag = make_ref(),
    Pid = spawn_link(fun() -> starter(Session, Tag, #{}) end),
    #{pid => Pid, tag => Tag}.

%% @doc Ends the starter, and drops whatever words of it are left in the
%% session's mailbox.
-spec stop_starter(starter()) -> ok.
stop_starter(#{pid := Pid, tag := Tag}) ->
    unlink(Pid),
    exit(Pid, kill),
    flush_armed(Tag).

%% @doc Starts one member's collector: Run (the member's diagnosis, whose
%% agent gets ready and waits for the starter's word) runs in a process
%% of its own, monitored, and its value is sent to the caller tagged Tag
%% (the same Tag for every collector of a session).
-spec collector(node(), node(), reference(), fun(() -> term())) -> collector().
collector(M, Node, Tag, Run) ->
    Self = self(),
    {Pid, MRef} = spawn_monitor(fun() -> Self ! {Tag, self(), Run()} end),
    #{pid => Pid, mref => MRef, member => M, node => Node, tag => Tag}.

%% @doc Opens the windows together, once every collector's agent is
%% ready (or its collector has ended), or 2 s after the call: every agent
%% ready is told the same wall-clock end, `duration' seconds on, as is
%% each agent that gets ready later (it samples what is left of the
%% window). Then gathers each collector's result, until 4 s past the
%% report's due time (`slack' seconds after the window's end; 30 s when
%% it is `infinity'), when the collectors still running are ended.
%% Returns each member's result, in the collectors' order, and when the
%% windows opened and ended.
-spec run_all([collector()], starter(),
              #{duration := number(), slack := number() | infinity, atom() => term()}) ->
    {[{node(), term()}], marks()}.
run_all([], _Starter, _Opts) ->
    Now = erlang:monotonic_time(millisecond),
    {[], #{armed => Now, go => Now, window_end => Now, ready => 0}};
run_all(Collectors, Starter = #{tag := STag}, #{duration := D, slack := Slack}) ->
    Armed0 = erlang:monotonic_time(millisecond),
    Waiting = maps:from_list([{N, Pid} || #{node := N, pid := Pid} <- Collectors]),
    ByPid = maps:from_list([{Pid, C} || C = #{pid := Pid} <- Collectors]),
    {Ready, Early} = arm(STag, Waiting, ByPid, Armed0 + ?ARM_MS),
    Go = erlang:monotonic_time(millisecond),
    EndAt = Go + round(D * 1000),
    EndWall = erlang:system_time(millisecond) + round(D * 1000),
    #{pid := SPid} = Starter,
    SPid ! {STag, go, EndWall},
    receive {STag, gone} -> ok end,
    flush_armed(STag),
    %% The collectors' own due times end them; this one is the backstop.
    GiveUp = EndAt + case Slack of
                         infinity -> 30000;
                         _ -> round(Slack * 1000)
                     end + ?GRACE_MS,
    Results = gather(maps:without(maps:keys(Early), ByPid), Early, GiveUp, EndAt),
    {[{M, maps:get(Pid, Results)} || #{pid := Pid, member := M} <- Collectors],
     #{armed => Armed0, go => Go, window_end => EndAt, ready => Ready}}.

%%%===================================================================
%%% Internal
%%%===================================================================

starter(Session, Tag, Ready) ->
    receive
        {beamdiag_armed, Agent, Node} when is_pid(Agent) ->
            Session ! {Tag, armed, Node},
            starter(Session, Tag, Ready#{Agent => Node});
        {Tag, go, EndWall} ->
            _ = [Agent ! {beamdiag_go, EndWall} || Agent <- maps:keys(Ready)],
            Session ! {Tag, gone},
            started(EndWall)
    end.

started(EndWall) ->
    receive
        {beamdiag_armed, Agent, _} when is_pid(Agent) ->
            Agent ! {beamdiag_go, EndWall},
            started(EndWall)
    end.

flush_armed(Tag) ->
    receive
        {Tag, _, _} -> flush_armed(Tag);
        {Tag, gone} -> flush_armed(Tag)
    after 0 ->
        ok
    end.

%% Waits until every collector's agent is ready or its collector has
%% ended (its result kept), or until the time given; returns how many
%% were ready, and the results of those that ended.
arm(STag, Waiting, ByPid, Until) ->
    arm(STag, tag(ByPid), Waiting, ByPid, #{}, 0, Until).

arm(_STag, _Tag, Waiting, _ByPid, Early, Ready, _Until) when map_size(Waiting) =:= 0 ->
    {Ready, Early};
arm(STag, Tag, Waiting, ByPid, Early, Ready, Until) ->
    receive
        {STag, armed, Node} when is_map_key(Node, Waiting) ->
            arm(STag, Tag, maps:remove(Node, Waiting), ByPid, Early, Ready + 1, Until);
        {Tag, Pid, Result} when is_map_key(Pid, ByPid) ->
            #{node := N, mref := MRef} = maps:get(Pid, ByPid),
            erlang:demonitor(MRef, [flush]),
            arm(STag, Tag, maps:remove(N, Waiting), ByPid, Early#{Pid => Result}, Ready, Until);
        {'DOWN', MRef, process, Pid, Why} when is_map_key(Pid, ByPid) ->
            #{node := N, mref := MRef} = maps:get(Pid, ByPid),
            arm(STag, Tag, maps:remove(N, Waiting), ByPid,
                Early#{Pid => {error, {beamdiag_cluster, {crashed, Why}}}}, Ready, Until)
    after beamdiag_agent_deadline:left(Until) ->
        {Ready, Early}
    end.

tag(ByPid) ->
    [#{tag := Tag} | _] = maps:values(ByPid),
    Tag.

%% Each collector's result, by the backstop at most: one that has not
%% answered by then is ended (the connection closes with the session,
%% and the agent, which monitors the collector, ends and cleans up).
gather(Running, Done, _GiveUp, _WindowEnd) when map_size(Running) =:= 0 ->
    Done;
gather(Running, Done, GiveUp, WindowEnd) ->
    Tag = tag(Running),
    receive
        {Tag, Pid, Result} when is_map_key(Pid, Running) ->
            #{mref := MRef} = maps:get(Pid, Running),
            erlang:demonitor(MRef, [flush]),
            gather(maps:remove(Pid, Running), Done#{Pid => Result}, GiveUp, WindowEnd);
        {'DOWN', MRef, process, Pid, Why} when is_map_key(Pid, Running) ->
            #{mref := MRef} = maps:get(Pid, Running),
            gather(maps:remove(Pid, Running),
                   Done#{Pid => {error, {beamdiag_cluster, {crashed, Why}}}}, GiveUp, WindowEnd)
    after beamdiag_agent_deadline:left(GiveUp) ->
        Given = maps:from_list(
                  [begin
                       exit(Pid, kill),
                       erlang:demonitor(MRef, [flush]),
                       {Pid, {error, {beamdiag_cluster, {no_answer, GiveUp - WindowEnd}}}}
                   end || {Pid, #{mref := MRef}} <- maps:to_list(Running)]),
        maps:merge(Done, Given)
    end.
