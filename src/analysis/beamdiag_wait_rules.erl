%%% @doc Threads that wait in the kernel: what the samples' thread waits
%%% (`beamdiag_agent_waits', read from /proc by the host view every sample
%%% and by the agent at the window's ends) say about the node's scheduler
%%% threads, and the findings they make.
%%%
%%% A thread sat blocked in one call from one sample to a later one when it
%%% was seen in that call (the same system call with the same arguments,
%%% or the same kernel wait when the call cannot be read) at both, in no
%%% other between, and the kernel did not run it in between (its on-CPU
%%% time, or its CPU time and voluntary context switches, did not move): it
%%% never left the call. The calls a scheduler sleeps in when it has no
%%% work (futex, epoll, poll) are not blocking; a thread in uninterruptible
%%% sleep (state D) is, whatever its call.
%%%
%%% <ul>
%%% <li>`dirty_io_blocked': dirty IO scheduler threads blocked in one call
%%%     for most of the window, from their waits, or from the VM's account
%%%     (busy but neither on a CPU nor waiting for one) when the waits
%%%     cannot be read.</li>
%%% <li>`scheduler_blocking' from the host alone: a normal or dirty CPU
%%%     scheduler thread blocked in one call for most of the window.</li>
%%% <li>`annotate/3' gives the agent's `scheduler_blocking' the calls (and
%%%     files) its threads were seen in.</li>
%%% </ul>
%%%
%%% All pure.
%%%
%%% ```
%%% 1> [Id || #{id := Id} <- beamdiag_wait_rules:findings(Capture, Ledger, #{})].
%%% [dirty_io_blocked]
%%% '''
-module(beamdiag_wait_rules).

-export([findings/3, host_findings/3, annotate/3]).
%% Called by the tests only.
-ifdef(TEST).
-export([spans/1, thresholds/0]).
-endif.

-export_type([span/0]).

%% The longest stretch a thread sat in one blocking call: from the first
%% to the last sample that saw it there (monotonic ns), how many samples,
%% whether the first is the window's first, and the call.
-type span() :: #{
    tid := integer(),
    from := integer(),
    to := integer(),
    seen := pos_integer(),
    since_start := boolean(),
    wait := blocking()
}.
-type blocking() :: #{
    key := term(),
    call := binary() | none,
    wchan := binary(),
    state := binary(),
    file => binary(),
    mount => beamdiag_agent_waits:mount()
}.

%% The calls a thread of the VM sleeps in when it has nothing to do.
-define(IDLE_CALLS, [<<"futex">>, <<"epoll_wait">>, <<"epoll_pwait">>, <<"epoll_pwait2">>,
                     <<"poll">>, <<"ppoll">>]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The thresholds.
-spec thresholds() -> #{atom() => number()}.
thresholds() ->
    #{
        %% The share of the window a thread must sit in one call: most of it.
        blocked_share => 0.80
    }.

%% @doc The findings of an agent's capture: `dirty_io_blocked'. Context:
%% as `host_findings/3' (#{} for an agent's).
-spec findings(beamdiag_capture:capture(), beamdiag_ledger:ledger(),
               beamdiag_host_rules:context()) ->
    [beamdiag_finding:finding()].
findings(Capture, Ledger, Context) ->
    dirty_io(Capture, Ledger, spans(Capture), Context).

%% @doc The findings of a host capture: `dirty_io_blocked', and
%% `scheduler_blocking' for normal and dirty CPU scheduler threads blocked
%% in one call for most of the window (the host has no busy time to see
%% the agent's kind). Context: `unresponsive', `waited_ms' and
%% `distribution' (the node did not answer, and what distribution saw):
%% the host view's context (beamdiag_host_rules).
-spec host_findings(beamdiag_capture:capture(), beamdiag_ledger:ledger(),
                    beamdiag_host_rules:context()) ->
    [beamdiag_finding:finding()].
host_findings(Capture, Ledger, Context) ->
    Spans = spans(Capture),
    dirty_io(Capture, Ledger, Spans, Context) ++ host_blocking(Ledger, Spans, Context).

%% @doc The agent's `scheduler_blocking' (and every other finding as it
%% is), with the calls its normal and dirty CPU scheduler threads were
%% seen blocked in at the samples that read their waits.
-spec annotate([beamdiag_finding:finding()], beamdiag_capture:capture(),
               beamdiag_ledger:ledger()) -> [beamdiag_finding:finding()].
annotate(Findings, Capture, Ledger) ->
    case [F || F = #{id := scheduler_blocking} <- Findings] of
        [] ->
            Findings;
        _ ->
            Lines = seen_lines(Capture, Ledger, [scheduler, dirty_cpu]),
            [case F of
                 #{id := scheduler_blocking, evidence := Ev} when Lines =/= [] ->
                     F#{evidence := Ev ++ Lines};
                 _ ->
                     F
             end || F <- Findings]
    end.

%% @doc Each thread's longest stretch in one blocking call, by thread id
%% (threads never seen blocked are left out).
-spec spans(beamdiag_capture:capture()) -> #{integer() => span()}.
spans(#{samples := Samples = [_, _ | _]}) ->
    Seq = [{T, Th} || #{t := T, threads := Th} <- Samples, is_map(Th)],
    Tids = case Seq of
               [{_, First} | _] -> maps:keys(First);
               [] -> []
           end,
    maps:from_list([{Tid, S#{tid => Tid}} || Tid <- Tids, S <- [longest(Tid, Seq)], S =/= none]);
spans(_) ->
    #{}.

%%%===================================================================
%%% Internal
%%%===================================================================

%% The longest run of samples in which the thread sat in one blocking call
%% without running; samples that did not read its wait (the agent's middle
%% ticks) continue a run when its counters did not move.
longest(Tid, Seq) ->
    Obs = [{T, maps:get(Tid, Th, gone)} || {T, Th} <- Seq],
    {Best, Cur} = lists:foldl(fun(O, {B, C}) -> step(O, B, C) end, {none, none},
                              lists:enumerate(Obs)),
    pick(pick(Best, close(Cur)), none).

%% Cur: an open run {FromT, FromIndex, LastT, LastThread, Seen, Wait,
%% Unread}, with LastT the last sample that saw the wait and LastThread
%% the thread as the last sample read it.
step({_, {_, gone}}, Best, Cur) ->
    {pick(Best, close(Cur)), none};
step({I, {T, Th}}, Best, Cur) ->
    case {blocking(Th), Cur} of
        {none, none} ->
            {Best, none};
        {unread, none} ->
            {Best, none};
        {unread, {From, FromI, LastT, Last, Seen, W, _}} ->
            case still(Last, Th) of
                true -> {Best, {From, FromI, LastT, Th, Seen, W, true}};
                false -> {pick(Best, close(Cur)), none}
            end;
        {none, _} ->
            {pick(Best, close(Cur)), none};
        {W = #{key := K}, {From, FromI, _LastT, Last, Seen, #{key := K} = W0, _}} ->
            case still(Last, Th) of
                true -> {Best, {From, FromI, T, Th, Seen + 1, W0, false}};
                false -> {pick(Best, close(Cur)), {T, I, T, Th, 1, W, false}}
            end;
        {W, none} ->
            {Best, {T, I, T, Th, 1, W, false}};
        {W, _} ->
            {pick(Best, close(Cur)), {T, I, T, Th, 1, W, false}}
    end;
step(_, Best, Cur) ->
    {pick(Best, close(Cur)), none}.

close(none) -> none;
close({From, FromI, LastT, _Th, Seen, W, _}) ->
    #{from => From, to => LastT, seen => Seen, since_start => FromI =:= 1, wait => W}.

pick(none, B) -> B;
pick(A, none) -> A;
pick(A = #{from := FA, to := TA}, B = #{from := FB, to := TB}) ->
    case TB - FB > TA - FA of
        true -> B;
        false -> A
    end.

%% What the thread sits in, when it blocks: `none' when it runs or sleeps
%% the way an idle scheduler does, `unread' when the sample did not read
%% its wait (and its state does not say it runs).
blocking(#{state := <<"R">>}) ->
    none;
blocking(#{wait := W = #{wchan := Wchan, call := Call}} = Th) ->
    State = maps:get(state, Th, <<"?">>),
    Extra = maps:with([file, mount], W),
    case Call of
        #{name := Name, nr := Nr, args := Args} ->
            case lists:member(Name, ?IDLE_CALLS) andalso State =/= <<"D">> of
                true -> none;
                false -> Extra#{key => {Nr, Args}, call => Name, wchan => Wchan, state => State}
            end;
        running ->
            none;
        _ ->
            %% No call to read (no access, or outside a system call): the
            %% state and the kernel function say it.
            case State =:= <<"D">> orelse (State =:= <<"S">> andalso not idle_wchan(Wchan)) of
                true -> Extra#{key => {wchan, Wchan}, call => none, wchan => Wchan,
                               state => State};
                false -> none
            end
    end;
blocking(_) ->
    unread.

%% The kernel functions an idle VM thread sleeps in; "0" or nothing when
%% the wchan cannot be read.
idle_wchan(W) ->
    W =:= <<>> orelse W =:= <<"0">> orelse
        lists:any(fun(P) -> binary:match(W, P) =/= nomatch end,
                  [<<"futex">>, <<"epoll">>, <<"poll_schedule">>]).

%% The kernel did not run the thread between two samples.
still(A, B) ->
    case {A, B} of
        {#{run_ns := R}, #{run_ns := R}} -> same(nvcsw, A, B);
        {#{run_ns := _}, #{run_ns := _}} -> false;
        _ -> same(utime, A, B) andalso same(stime, A, B) andalso same(nvcsw, A, B)
    end.

same(K, A, B) ->
    case {maps:find(K, A), maps:find(K, B)} of
        {{ok, V}, {ok, W}} -> V =:= W;
        _ -> true
    end.

%% The dirty IO threads blocked for most of the window: by their waits, or
%% (threads whose waits were not read) by the VM's account.
dirty_io(Capture, Ledger = #{window_s := W}, Spans, Context) when W > 0 ->
    Rows = [R || R = #{type := dirty_io} <- maps:get(threads, Ledger)],
    Least = map_get(blocked_share, thresholds()) * W,
    Blocked = [{R, S} || R = #{tid := Tid} <- Rows, S <- [maps:get(Tid, Spans, none)],
                         S =/= none, span_s(S) >= Least],
    %% The VM's account, for threads whose waits were not read long enough
    %% (the agent reads them at the window's end): with the call they were
    %% last seen in, if any.
    ByVm = [{R, {vm, maps:get(Tid, Spans, none)}}
            || R = #{tid := Tid, blocked := B} <- Rows, is_number(B), B >= Least,
               not lists:keymember(R, 1, Blocked), not seen_running(Tid, Capture)],
    case Blocked ++ ByVm of
        [] -> [];
        All -> [dirty_io_finding(All, Rows, Capture, Ledger, Context)]
    end;
dirty_io(_, _, _, _) ->
    [].

%% A thread some sample saw running, or in an idle wait, is not blocked by
%% the VM's account alone.
seen_running(Tid, #{samples := Samples}) ->
    lists:any(fun(#{threads := #{Tid := Th}}) -> blocking(Th) =:= none;
                 (_) -> false
              end, Samples).

dirty_io_finding(All, Rows, Capture, #{window_s := W}, Context) ->
    N = max(length(Rows), length(All)),
    B = length(All),
    %% Seen blocked from /proc over the window; by the VM's account.
    Spans = [S || {_, S = #{}} <- All],
    ByVm = [R || {R, {vm, _}} <- All],
    %% The calls: of both, the VM's ones as last seen.
    Calls = Spans ++ [S || {_, {vm, S = #{}}} <- All],
    Shortest = lists:min([span_s(S) || S <- Spans] ++ [maps:get(blocked, R) || R <- ByVm]),
    Start = window_start(Capture),
    Queued = dirty_io_queue(Capture, maps:get(settings, Capture, #{})),
    Evidence =
        [fmt("~b of the node's ~b dirty IO scheduler threads sat blocked in the kernel for "
             "~ts: ~ts", [length(Spans), N, span_words(lists:min([span_s(S) || S <- Spans]), W),
                          since_words(Spans, Start)]) || Spans =/= []] ++
        [fmt("~b of the node's ~b dirty IO scheduler threads sat blocked for ~.1f s or more of "
             "the ~.1f s window by the VM's account: busy, but neither on a CPU nor waiting for "
             "one~ts", [length(ByVm), N, lists:min([maps:get(blocked, R) || R <- ByVm]), W,
                        case length(ByVm) =:= length(Calls) - length(Spans) of
                            true -> "; what they sat in at the window's end:";
                            false -> ""
                        end]) || ByVm =/= []] ++
        call_lines(Calls) ++
        behind_lines(B, N, Queued) ++
        answer_lines(Context),
    Metrics = maps:merge(#{blocked => B, dirty_io_threads => N, blocked_s => Shortest,
                           window_s => W},
                         main_call(Calls)),
    Figures = [fig(window_s, W, wall_s, #{scope => window}),
               fig(blocked_s, Shortest, wall_s, #{part_of => window_s}),
               fig(blocked_threads, B, count), fig(dirty_io_threads, N, count),
               fig(blocked_share, B / N, share)] ++
              [fig(dirty_io_queue, Queued, count) || is_integer(Queued)],
    Severity = case B >= N of
                   true -> critical;
                   false -> warning
               end,
    beamdiag_finding:new(dirty_io_blocked, Severity, Evidence, Metrics,
                         #{figures => Figures, title => title(B, N, Calls)}).

title(B, N, Spans) ->
    Which = case B >= N of
                true -> ["All ", integer_to_list(N), " dirty IO schedulers are"];
                false -> [integer_to_list(B), " of ", integer_to_list(N),
                          " dirty IO schedulers are"]
            end,
    case main_call(Spans) of
        #{call := Call, file := File} ->
            [Which, " blocked in ", Call, "(2) of ", File];
        #{call := Call} ->
            [Which, " blocked in ", Call, "(2)"];
        _ ->
            [Which, " blocked in the kernel"]
    end.

%% The call most of the blocked threads sit in, and its file.
main_call(Spans) ->
    case groups(Spans) of
        [{{Call, File, _}, _} | _] ->
            maps:from_list([{call, Call} || Call =/= none] ++ [{file, File} || File =/= none]);
        [] ->
            #{}
    end.

%% The spans grouped by call and file, the largest group first.
groups(Spans) ->
    G = maps:groups_from_list(
          fun(#{wait := Wt}) ->
                  {maps:get(call, Wt), maps:get(file, Wt, none), maps:get(mount, Wt, none)}
          end, Spans),
    lists:sort(fun({_, A}, {_, B}) -> length(A) >= length(B) end, maps:to_list(G)).

call_lines(Spans) ->
    [begin
         #{wait := Wt} = hd(Ss),
         fmt("~b in ~ts; kernel wait ~ts", [length(Ss), wait_words(Wt), kernel_words(Wt)])
     end || {_, Ss} <- groups(Spans)].

%% The call, its file and the file's mount, in words.
wait_words(Wt) ->
    [call_words(maps:get(call, Wt)), file_words(maps:get(file, Wt, none)),
     mount_words(maps:get(mount, Wt, none))].

%% The kernel function, and the state when it is uninterruptible.
kernel_words(#{wchan := Wchan, state := State}) ->
    [wchan_words(Wchan), state_words(State)].

call_words(none) -> "a kernel wait outside a system call, or one this host may not read";
call_words(Call) -> [Call, "(2)"].

file_words(none) -> "";
file_words(F) -> [" of ", F].

mount_words(none) -> "";
mount_words(#{point := P, type := T, source := S}) ->
    io_lib:format(", on the ~ts mount ~ts (~ts)", [T, P, S]).

%% What the kernel function a thread sleeps in means, for the ones a
%% blocked file operation is seen in.
wchan_words(W) ->
    Known = [{<<"wait_for_partner">>, "a FIFO waiting for its other end"},
             {<<"rpc_wait">>, "waiting on the NFS server"},
             {<<"nfs">>, "in the NFS client"},
             {<<"fuse">>, "waiting on a FUSE file system's daemon"},
             {<<"io_schedule">>, "waiting for the disk"},
             {<<"folio_wait">>, "waiting for the disk"},
             {<<"wait_on_page">>, "waiting for the disk"},
             {<<"jbd2">>, "waiting for the file system's journal"},
             {<<"pipe_read">>, "waiting on a pipe"},
             {<<"pipe_write">>, "waiting on a pipe"},
             {<<"sk_wait">>, "waiting on a socket"},
             {<<"inet_csk_accept">>, "waiting on a socket"},
             {<<"unix_stream">>, "waiting on a socket"},
             {<<"do_nanosleep">>, "asleep on a timer"},
             {<<"poll_schedule">>, "in poll or select"}],
    case [Words || {Part, Words} <- Known, binary:match(W, Part) =/= nomatch] of
        [Words | _] -> [W, " (", Words, ")"];
        [] -> W
    end.

state_words(<<"D">>) -> ", uninterruptible (state D)";
state_words(_) -> "".

since_words(Spans, Start) ->
    Seen = lists:min([S || #{seen := S} <- Spans]),
    case lists:all(fun(#{since_start := B}) -> B end, Spans) of
        true ->
            fmt("since before the window began (each seen in the same call at ~b samples of "
                "/proc, and not run by the kernel in between)", [Seen]);
        false ->
            Latest = lists:max([F || #{from := F} <- Spans]),
            fmt("the last of them since ~.1f s into the window (each seen in the same call at "
                "~b samples of /proc or more, and not run by the kernel in between)",
                [(Latest - Start) / 1.0e9, Seen])
    end.

span_words(S, W) when S >= W - 0.05 -> fmt("the whole ~.1f s window", [W]);
span_words(S, W) -> fmt("~.1f s of the ~.1f s window or more", [S, W]).

%% What waits behind the blocked threads.
behind_lines(B, N, Queued) ->
    Queue = case Queued of
                Q when is_integer(Q), Q > 0 ->
                    [fmt("~b more jobs wait in the dirty IO run queue at the window's end", [Q])];
                _ ->
                    []
            end,
    Queue ++
        case B >= N of
            true ->
                [<<"behind them waits every file operation of the node (the file module, "
                   "prim_file, the file server), code loading (the code server reads .beam "
                   "files), name resolution that reads files (/etc/hosts, resolv.conf), and so "
                   "new distribution connections, which load code and look names up">>];
            false ->
                [fmt("~b dirty IO scheduler~s left for the node's file operations, code "
                     "loading and name resolution; each further call that hangs the same way "
                     "takes one more", [N - B, case N - B of 1 -> " is"; _ -> "s are" end])]
        end.

answer_lines(#{unresponsive := true, waited_ms := Ms} = C) ->
    [fmt("the node did not answer in ~.1f s: ~ts", [Ms / 1000, maps:get(distribution, C, <<>>)])];
answer_lines(_) ->
    [].

%% The dirty IO run queue at the last sample: run_queue_lengths_all ends
%% with the dirty CPU queue and the dirty IO queue.
dirty_io_queue(#{samples := Samples}, Settings) ->
    S = maps:get(schedulers, Settings, 0),
    case [Q || #{vm := #{run_queues := Q}} <- lists:reverse(Samples), length(Q) =:= S + 2] of
        [Q | _] -> lists:last(Q);
        [] -> none
    end.

%% The host's scheduler_blocking: normal and dirty CPU scheduler threads
%% blocked in one call for most of the window.
host_blocking(Ledger = #{window_s := W}, Spans, Context) when W > 0 ->
    Least = map_get(blocked_share, thresholds()) * W,
    Rows = [{R, S} || R = #{type := Ty, tid := Tid} <- maps:get(threads, Ledger),
                      Ty =:= scheduler orelse Ty =:= dirty_cpu,
                      S <- [maps:get(Tid, Spans, none)], S =/= none, span_s(S) >= Least],
    case Rows of
        [] ->
            [];
        _ ->
            Shortest = lists:min([span_s(S) || {_, S} <- Rows]),
            Normal = length([x || {#{type := scheduler}, _} <- Rows]),
            Evidence =
                [fmt("~ts (thread ~b) sat blocked in ~ts for ~ts (kernel wait ~ts; seen there at "
                     "~b samples of /proc, not run in between)",
                     [Name, Tid, wait_words(Wt), span_words(span_s(S), W), kernel_words(Wt), Seen])
                 || {#{name := Name, tid := Tid}, S = #{wait := Wt, seen := Seen}} <- Rows] ++
                [<<"a normal scheduler blocked in the kernel runs no Erlang process: those "
                   "queued on it wait, and work that needs every scheduler stalls">>
                 || Normal > 0] ++
                answer_lines(Context),
            [beamdiag_finding:new(
               scheduler_blocking, case Normal > 0 of true -> critical; false -> warning end,
               Evidence,
               #{blocked_threads => length(Rows), blocked_s => Shortest, window_s => W},
               #{figures => [fig(window_s, W, wall_s, #{scope => window}),
                             fig(blocked_s, Shortest, wall_s, #{part_of => window_s}),
                             fig(blocked_threads, length(Rows), count)],
                 title => <<"A scheduler thread is blocked in the kernel">>})]
    end;
host_blocking(_, _, _) ->
    [].

%% Lines for the agent's scheduler_blocking: each thread of these types
%% that some sample saw in a blocking call, with the call and file.
seen_lines(#{samples := Samples}, #{threads := Rows}, Types) ->
    Tids = [{Tid, Name} || #{type := Ty, tid := Tid, name := Name} <- Rows,
                           lists:member(Ty, Types)],
    Read = [Th || #{threads := Th} <- Samples, is_map(Th)],
    lists:append(
      [begin
           Obs = [blocking(maps:get(Tid, Th)) || Th <- Read, is_map_key(Tid, Th)],
           Waits = [W || W = #{} <- Obs],
           Looked = length([x || O <- Obs, O =/= unread]),
           case Waits of
               [] ->
                   [];
               [Wt | _] ->
                   [fmt("~ts was in ~ts at ~b of the ~b samples that read what it waits on "
                        "(kernel wait ~ts)",
                        [Name, wait_words(Wt), length(Waits), Looked, kernel_words(Wt)])]
           end
       end || {Tid, Name} <- Tids]);
seen_lines(_, _, _) ->
    [].

window_start(#{samples := [#{t := T} | _]}) -> T;
window_start(_) -> 0.

span_s(#{from := F, to := T}) -> (T - F) / 1.0e9.

fig(Name, V, Unit) -> beamdiag_finding:figure(Name, V, Unit).
fig(Name, V, Unit, Opts) -> beamdiag_finding:figure(Name, V, Unit, Opts).

fmt(F, A) -> iolist_to_binary(io_lib:format(F, A)).
