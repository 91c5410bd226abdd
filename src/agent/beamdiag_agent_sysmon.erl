%%% @doc Long schedules over the window, on the target: which processes held
%%% their scheduler for long stretches, and in which function. Runs on the
%%% target node (erts, kernel and stdlib only).
%%%
%%% A process of its own takes the node's system monitor for the window
%%% (`long_schedule', threshold `?LONG_MS' ms; on OTP 27 and later also
%%% `long_message_queue') and counts the events per process: how many,
%%% the longest and the total in ms, and the function the process was in
%%% (the event's `in' and `out' locations). A plain NIF or a long BIF that
%%% holds its scheduler shows as the same function in and out.
%%%
%%% The system monitor is one slot per node, and servers use it (RabbitMQ's
%%% sysmon handler does): it is read first, and when it is taken it is left
%%% alone and the report says so (`state => taken', with the monitoring
%%% process). A sampler then stands in (`beamdiag_agent_held_sampler'; option
%%% `sampler', default true): up to 4 processes bound one to a normal
%%% scheduler look for a held scheduler twice a second (one that wakes
%%% 10 ms late was on it); at such a sign an on-time one walks the table
%%% once (at most 3 walks a session, 1 s apart, none above 50,000
%%% processes) for the processes slow to answer `process_info/2' (at most
%%% 8), and each sampler then asks those 10 times a second, timing the
%%% answer: a process inside a plain NIF answers only when the NIF
%%% returns. The report gets `source => sampler', the sampler's counts
%%% (`sampler') and `processes' in the events' shape, with `count' the
%%% held samples, `consecutive' the longest run of them in one function,
%%% `longest_ms' the longest answer (a lower bound of the longest hold)
%%% and `total_ms' an estimate from the samples' spacing. Cost measured
%%% with 10,000 idle processes on 2 schedulers: 6 to 14 ms of CPU per
%%% 10 s with no sign, a walk 3.6 to 4.8 ms. The sampler never touches
%%% the system monitor and ends with this process. When the slot
%%% was free, it is freed again at the end, when the agent ends or dies,
%%% and by the runtime when this process dies; only if it still holds this
%%% process's setting (somebody may have taken it meanwhile).
%%%
%%% Setting the system monitor blocks thread progress: on a node where a
%%% NIF holds a scheduler it waits for that NIF to return (up to one NIF
%%% call), in this process, not in the agent. Freeing it does not block.
%%%
%%% With `notify => {Pid, Ref}', the watcher also sends its report as
%%% `{beamdiag, Ref, {long_schedules, Report}}' to Pid at most once a
%%% second while new events come (none on a healthy node), so that a
%%% capture cut short still has it.
%%%
%%% Bounds: at most `?MAX_PIDS' processes are counted (later ones only add
%%% to `others'); the report lists at most `?TOP', largest total first;
%%% each process is named once, when its first event comes.
%%%
%%% ```
%%% 1> W = beamdiag_agent_sysmon:start(self(), #{}).
%%% 2> beamdiag_agent_sysmon:report(W, 500).
%%% #{state => watching, threshold_ms => 50, processes => [...], ...}
%%% '''
-module(beamdiag_agent_sysmon).

-export([start/2, report/2, stop/1]).

%% Internal: the watcher's entry point.
-export([init/2]).
%% Spawned by start/2 through proc_lib:spawn_opt/4.
-ignore_xref([{init, 2}]).

-export_type([report/0, options/0, process/0, long_queue/0]).

%% What summary/1 builds: the events' counts, or with `source => sampler'
%% the held sampler's in the same shape (beamdiag_agent_held_sampler).
-type report() :: #{
    state := watching | taken,
    threshold_ms := pos_integer(),
    span_ms := integer(),
    set_ms := integer(),
    events := non_neg_integer(),
    process_count := non_neg_integer(),
    processes := [process()],
    long_queues := [long_queue()],
    nif_modules := [binary()],
    taken_by => #{pid := binary() | null, name := binary() | null},
    source => sampler,
    sampler => beamdiag_agent_held_sampler:info()
}.
%% A process (or port) that held its scheduler: from the events, or with
%% the sampler's extra keys (samples, consecutive, collected, watched_ms).
-type process() :: #{
    pid := binary() | null,
    name := binary() | null,
    initial_call := binary() | null,
    spawn_call => binary(),
    label => binary() | null,
    parent => map() | null,
    count := non_neg_integer(),
    longest_ms := non_neg_integer(),
    total_ms := non_neg_integer(),
    in := binary() | null,
    out := binary() | null,
    native := nif | bif | erlang | mixed,
    samples => non_neg_integer(),
    consecutive => non_neg_integer(),
    collected => non_neg_integer(),
    watched_ms => integer()
}.
%% A process the runtime reported with a long message queue (OTP 27+).
-type long_queue() :: #{
    pid := binary() | null,
    name := binary() | null,
    initial_call := binary() | null,
    spawn_call => binary(),
    label => binary() | null,
    parent => map() | null,
    long := term()
}.
%% start/2's options: the threshold (ms), where to send reports as they
%% come, and whether the held sampler stands in when the slot is taken.
-type options() :: #{
    threshold_ms => pos_integer(),
    notify => {pid(), reference()},
    sampler => boolean()
}.

%% A schedule at least this long (ms) is reported by the runtime.
-define(LONG_MS, 50).
%% long_message_queue (OTP 27+): on above this many messages, off below.
-define(LMQ_ON, 100000).
-define(LMQ_OFF, 10000).
-define(MAX_PIDS, 1000).
-define(TOP, 10).
%% The least time between two reports sent on the watcher's own.
-define(NOTIFY_MS, 1000).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Starts the watcher for Owner (the agent). Options: `threshold_ms'.
-spec start(pid(), options()) -> pid().
start(Owner, Opts) ->
    proc_lib:spawn_opt(?MODULE, init, [Owner, Opts], [{priority, high}]).

%% @doc What the watcher saw so far, waiting at most TimeoutMs; `undefined'
%% when it did not answer in time.
-spec report(pid(), non_neg_integer()) -> report() | undefined.
report(Pid, TimeoutMs) ->
    Alias = alias([reply]),
    Pid ! {report, Alias},
    beamdiag_agent_bounded_call:reply(Alias, TimeoutMs, undefined).

%% @doc Frees the system monitor (when it is this watcher's) and ends.
-spec stop(pid()) -> ok.
stop(Pid) ->
    Pid ! stop,
    ok.

%%%===================================================================
%%% Internal
%%%===================================================================

%% @private
-spec init(pid(), options()) -> ok.
init(Owner, Opts) ->
    MRef = erlang:monitor(process, Owner),
    Ms = maps:get(threshold_ms, Opts, ?LONG_MS),
    T0 = erlang:monotonic_time(millisecond),
    St0 = #{threshold_ms => Ms, pids => #{}, others => 0, queues => #{}, t0 => T0,
            notify => maps:get(notify, Opts, undefined), dirty => false},
    St = case erlang:system_monitor() of
             undefined ->
                 _ = erlang:system_monitor(self(), options(Ms)),
                 case erlang:system_monitor() of
                     {Me, _} when Me =:= self() -> St0#{state => watching};
                     Other -> taken(Other, Owner, Opts, St0)
                 end;
             Other ->
                 taken(Other, Owner, Opts, St0)
         end,
    loop(MRef, St#{set_ms => erlang:monotonic_time(millisecond) - T0}).

%% The slot is somebody else's: left alone, and the sampler stands in
%% (beamdiag_agent_held_sampler) unless turned off.
taken(Holder, Owner, Opts, St0) ->
    St = St0#{state => taken, by => holder(Holder)},
    case maps:get(sampler, Opts, true) of
        true -> St#{samplers => beamdiag_agent_held_sampler:start(self(), [Owner]),
                    held => beamdiag_agent_held_sampler:new()};
        false -> St
    end.

%% long_message_queue is an option from OTP 27 (erts 15).
options(Ms) ->
    Lmq = case list_to_integer(erlang:system_info(otp_release)) >= 27 of
              true -> [{long_message_queue, {?LMQ_OFF, ?LMQ_ON}}];
              false -> []
          end,
    [{long_schedule, Ms} | Lmq].

holder({Pid, _Opts}) when is_pid(Pid) ->
    Name = case erlang:process_info(Pid, registered_name) of
               {registered_name, N} when is_atom(N) -> atom_to_binary(N, utf8);
               _ -> null
           end,
    #{pid => list_to_binary(pid_to_list(Pid)), name => Name};
holder(_) ->
    #{pid => null, name => null}.

loop(MRef, St) ->
    receive
        {monitor, Who, long_schedule, Info} ->
            loop(MRef, notify(long_schedule(Who, Info, St)));
        {monitor, Who, long_message_queue, Long} ->
            loop(MRef, notify(long_queue(Who, Long, St)));
        {beamdiag_held, Msg} ->
            loop(MRef, held(Msg, St));
        notify ->
            loop(MRef, sent(St#{timer => undefined}));
        {monitor, _, _, _} ->
            loop(MRef, St);
        {report, ReplyTo} ->
            ReplyTo ! {ReplyTo, summary(St)},
            loop(MRef, St);
        stop ->
            free(St);
        {'DOWN', MRef, process, _, _} ->
            free(St)
    end.

%% A sampler's message: folded in; new candidates go to every sampler,
%% and samples that found a process held count as new events.
held(Msg, St = #{held := Agg, samplers := Samplers}) ->
    Agg2 = beamdiag_agent_held_sampler:add(Msg, Agg),
    St2 = St#{held := Agg2},
    case Msg of
        {walked, _, [_ | _]} ->
            beamdiag_agent_held_sampler:share(Samplers,
                                              beamdiag_agent_held_sampler:candidates(Agg2)),
            St2;
        _ ->
            case beamdiag_agent_held_sampler:found(Msg) of
                true -> notify(St2);
                false -> St2
            end
    end;
held(_, St) ->
    St.

%% New events: the report goes out now, or when a second has passed since
%% the last one.
notify(St = #{notify := undefined}) ->
    St;
notify(St = #{timer := T}) when T =/= undefined ->
    St#{dirty := true};
notify(St) ->
    Last = maps:get(last_sent, St, undefined),
    Now = erlang:monotonic_time(millisecond),
    case Last =:= undefined orelse Now - Last >= ?NOTIFY_MS of
        true -> sent(St#{dirty := true});
        false -> St#{dirty := true,
                     timer => erlang:send_after(?NOTIFY_MS - (Now - Last), self(), notify)}
    end.

sent(St = #{dirty := true, notify := {Pid, Ref}}) ->
    Pid ! {beamdiag, Ref, {long_schedules, summary(St)}},
    St#{dirty := false, last_sent => erlang:monotonic_time(millisecond)};
sent(St) ->
    St.

%% Frees the slot when it still holds this process's setting.
free(#{state := watching}) ->
    _ = case erlang:system_monitor() of
            {Me, _} when Me =:= self() -> erlang:system_monitor(undefined);
            _ -> ok
        end,
    ok;
free(#{samplers := Samplers}) ->
    %% Killed, not asked: a sampler waiting for the answer of a process
    %% held in a NIF reads no message until that NIF returns.
    _ = [exit(P, kill) || P <- Samplers, is_pid(P)],
    ok;
free(_) ->
    ok.

long_schedule(Who, Info, St = #{pids := Pids, others := Others}) ->
    Ms = case lists:keyfind(timeout, 1, Info) of
             {timeout, T} when is_integer(T) -> T;
             _ -> 0
         end,
    In = location(lists:keyfind(in, 1, Info)),
    Out = location(lists:keyfind(out, 1, Info)),
    case maps:find(Who, Pids) of
        {ok, E = #{count := C, longest_ms := L, total_ms := Tot, where := W}} ->
            St#{pids := Pids#{Who := E#{count := C + 1, longest_ms := max(L, Ms),
                                         total_ms := Tot + Ms,
                                         where := bump({In, Out}, W)}}};
        error when map_size(Pids) < ?MAX_PIDS ->
            St#{pids := Pids#{Who => (identify(Who))#{count => 1, longest_ms => Ms,
                                                       total_ms => Ms,
                                                       where => #{{In, Out} => 1}}}};
        error ->
            St#{others := Others + 1}
    end.

long_queue(Who, Long, St = #{queues := Qs}) when is_pid(Who) ->
    case maps:find(Who, Qs) of
        {ok, E = #{times := N}} ->
            St#{queues := Qs#{Who := E#{long := Long, times := N + 1}}};
        error when map_size(Qs) < ?MAX_PIDS ->
            St#{queues := Qs#{Who => (identify(Who))#{long => Long, times => 1}}};
        error ->
            St
    end;
long_queue(_, _, St) ->
    St.

bump(K, M) ->
    maps:update_with(K, fun(N) -> N + 1 end, 1, M).

location({_, {M, F, A}}) when is_atom(M), is_atom(F), is_integer(A) -> {M, F, A};
location(_) -> undefined.

%% A name for the process (or port), read once, after its long schedule
%% ended: what names a walk's processes (beamdiag_agent_proc_identity: the
%% registered name, proc_lib's initial call or the fun it was spawned
%% from, its label, its spawner); when that guarded read was not answered
%% in time (the process is in its NIF again), the registered name and
%% initial call read directly, waiting for it.
identify(Pid) when is_pid(Pid) ->
    Ids = beamdiag_agent_proc_identity:read([Pid], #{}),
    case beamdiag_agent_proc_identity:entry(Pid, beamdiag_agent_proc_identity:names(), Ids) of
        #{answered := false} -> identify_directly(Pid);
        E = #{pid := _} -> maps:with([pid, name, initial_call, spawn_call, label, parent], E);
        null -> identify_directly(Pid)
    end;
identify(Port) when is_port(Port) ->
    Name = case erlang:port_info(Port, name) of
               {name, N} -> iolist_to_binary(io_lib:format("~0tp", [N], [{chars_limit, 60}]));
               _ -> null
           end,
    #{pid => list_to_binary(erlang:port_to_list(Port)), name => Name, initial_call => null};
identify(_) ->
    #{pid => null, name => null, initial_call => null}.

%% The registered name and initial call (proc_lib's, from the dictionary
%% key alone where the emulator allows it).
identify_directly(Pid) ->
    Items = erlang:process_info(Pid, [registered_name, initial_call]),
    {Name, Init} = case Items of
                       [{_, N}, {_, I}] -> {N, I};
                       _ -> {[], undefined}
                   end,
    #{pid => list_to_binary(pid_to_list(Pid)),
      name => case Name of
                  N2 when is_atom(N2), N2 =/= [] -> atom_to_binary(N2, utf8);
                  _ -> null
              end,
      initial_call => mfa(proc_lib_initial_call(Pid, Init))}.

proc_lib_initial_call(P, Init = {proc_lib, init_p, _}) ->
    try erlang:apply(erlang, process_info, [P, {dictionary, '$initial_call'}]) of
        {_, {M, F, A}} when is_atom(M), is_atom(F), is_integer(A) -> {M, F, A};
        _ -> Init
    catch
        error:badarg -> Init
    end;
proc_lib_initial_call(_, Init) ->
    Init.

summary(St = #{state := State, threshold_ms := Ms, pids := Pids, others := Others,
               queues := Qs, t0 := T0}) ->
    Top = beamdiag_agent_top:largest(?TOP, 1, [{maps:get(total_ms, E), E}
                                                        || E <- maps:values(Pids)]),
    Base = #{
        state => State,
        threshold_ms => Ms,
        span_ms => erlang:monotonic_time(millisecond) - T0,
        set_ms => maps:get(set_ms, St, 0),
        events => lists:sum([C || #{count := C} <- maps:values(Pids)]) + Others,
        process_count => map_size(Pids),
        processes => [entry(E) || {_, E} <- Top],
        long_queues => [maps:remove(times, Q) || Q <- lists:sublist(maps:values(Qs), ?TOP)],
        nif_modules => case Top of
                           [] -> [];
                           _ -> nif_modules()
                       end
    },
    Taken = case maps:find(by, St) of
                {ok, By} -> Base#{taken_by => By};
                error -> Base
            end,
    case St of
        #{held := Agg, samplers := Samplers} -> sampled(Taken, Agg, length(Samplers));
        _ -> Taken
    end.

%% The sampler's findings in the events' shape (`source => sampler').
sampled(R, Agg, N) ->
    Ps = [held_entry(E) || E <- lists:sublist(beamdiag_agent_held_sampler:entries(Agg), ?TOP)],
    R#{source => sampler,
       sampler => (beamdiag_agent_held_sampler:info(Agg))#{samplers => N},
       events => lists:sum([C || #{count := C} <- Ps]),
       process_count => length(Ps),
       processes => Ps,
       nif_modules => case Ps of
                          [] -> [];
                          _ -> nif_modules()
                      end}.

held_entry(E = #{pid := Pid, name := Name, initial_call := Init, where := W}) ->
    [{_, Fun} | _] = lists:reverse(lists:keysort(1, [{N, F} || {F, N} <- maps:to_list(W)])),
    (maps:without([where], E))#{
        pid := list_to_binary(pid_to_list(Pid)),
        name := case Name of
                    N2 when is_atom(N2), N2 =/= [] -> atom_to_binary(N2, utf8);
                    _ -> null
                end,
        initial_call := mfa(Init),
        in => mfa(Fun), out => mfa(Fun), native => native(Fun, Fun, is_nif(Fun))}.

%% One process's figures and the function it was held in most often.
entry(E = #{where := W}) ->
    [{_, {In, Out}} | _] = lists:reverse(lists:keysort(1, [{N, K} || {K, N} <- maps:to_list(W)])),
    Nif = is_nif(In) andalso In =:= Out,
    (maps:remove(where, E))#{in => mfa(In), out => mfa(Out), native => native(In, Out, Nif)}.

%% What held the scheduler: a NIF (the function is one of its module's
%% NIFs), a BIF, or Erlang code.
native(In, In, true) -> nif;
native(In, In, false) when In =/= undefined ->
    case In of
        {M, F, A} ->
            case erlang:is_builtin(M, F, A) of
                true -> bif;
                false -> erlang
            end
    end;
native(_, _, _) -> mixed.

is_nif({M, F, A}) ->
    try erlang:get_module_info(M, nifs) of
        L when is_list(L) -> lists:member({F, A}, L);
        _ -> false
    catch
        _:_ -> false
    end;
is_nif(_) ->
    false.

%% The modules with NIFs that are not OTP's own (at most ?TOP), with their
%% NIFs: the candidates when the runtime records only the Erlang function
%% that called a NIF. Asked of the runtime alone: the code server, which
%% knows each module's file, answers after every runnable process on a
%% saturated node, and does not know modules loaded without it. OTP's
%% modules are the preloaded ones and those compiled in the tree `lists'
%% was compiled in (the source the compiler recorded; a build that records
%% none leaves every module without one counted as OTP's).
nif_modules() ->
    Pre = erlang:pre_loaded(),
    Tree = otp_tree(),
    Mods = [{M, Nifs} || M <- lists:sort(erlang:loaded()), not lists:member(M, Pre),
                         Nifs <- [try erlang:get_module_info(M, nifs) catch _:_ -> [] end],
                         Nifs =/= [], not from_tree(M, Tree)],
    [iolist_to_binary([atom_to_binary(M, utf8), ": ",
                       lists:join(", ", [io_lib:format("~s/~b", [F, A])
                                         || {F, A} <- lists:sublist(Nifs, 8)])])
     || {M, Nifs} <- lists:sublist(Mods, ?TOP)].

%% ".../lib/" of OTP's build, from where `lists' was compiled, or `none'.
otp_tree() ->
    case source(lists) of
        none -> none;
        Src -> filename:dirname(filename:dirname(filename:dirname(Src))) ++ "/"
    end.

from_tree(M, Tree) ->
    case {source(M), Tree} of
        {none, none} -> true;
        {none, _} -> false;
        {_, none} -> false;
        {Src, _} -> lists:prefix(Tree, Src)
    end.

source(M) ->
    case catch erlang:get_module_info(M, compile) of
        L when is_list(L) ->
            case lists:keyfind(source, 1, L) of
                {source, Src} when is_list(Src) -> Src;
                _ -> none
            end;
        _ ->
            none
    end.

mfa({M, F, A}) when is_atom(M), is_atom(F), is_integer(A) ->
    iolist_to_binary([atom_to_binary(M, utf8), $:, atom_to_binary(F, utf8), $/,
                      integer_to_list(A)]);
mfa(_) ->
    null.
