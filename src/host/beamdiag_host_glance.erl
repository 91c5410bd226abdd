%%% @doc What this host shows of a node that does not answer, in one line.
%%%
%%% For a cluster member on this host that could not be reached: its OS
%%% process is found from its name (`beamdiag_host_locate', epmd and /proc,
%%% without the node's help), its threads are sampled over a span
%%% (`beamdiag_host_view'), and `finish/1' sums that span up: the OS pid,
%%% the process's state (a process stopped by a signal or a debugger shows
%%% as such), the threads that used the most CPU (user and kernel time, as
%%% shares of wall time over the span), and the resident memory.
%%%
%%% ```
%%% 1> {ok, G} = beamdiag_host_glance:start('app@myhost', #{}).
%%% 2> timer:sleep(3000), V = beamdiag_host_glance:finish(G).
%%% 3> io:put_chars(beamdiag_host_glance:words(V)).
%%% on this host: pid 4242, running; 1_scheduler 100% user, 2_scheduler 3% user; 1.2 GB resident
%%% '''
-module(beamdiag_host_glance).

-export([start/2, finish/1, words/1, format_error/1]).
%% Called as Module:format_error/1 on an {error, {Module, Reason}} value.
-ignore_xref([{format_error, 1}]).
%% Called by the tests only.
-ifdef(TEST).
-export([parse_state/1]).
-endif.

-export_type([glance/0, view/0]).

-opaque glance() :: #{os_pid := pos_integer(), sampler := pid(), root := file:filename(),
                      t0 := integer()}.
-type view() :: #{
    os_pid := pos_integer(),
    state := binary() | unknown,
    span_s := float(),
    %% The busiest threads over the span: name, user and kernel time as
    %% shares of wall time (each at most 1: one thread runs on one CPU).
    threads := [#{name := binary(), user := float(), sys := float()}],
    rss => non_neg_integer()
}.

%% Threads named in the line.
-define(TOP, 2).
%% Below this share of wall time, a thread is not worth naming.
-define(FLOOR, 0.01).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Finds the node's OS process on this host and starts sampling its
%% threads each second (`proc_root' for recorded trees). A node on another
%% host, or one whose process cannot be found, is an error: nothing is
%% started.
-spec start(node(), #{proc_root => file:filename()}) ->
    {ok, glance()} | {error, {module(), term()}}.
start(Node, Opts) ->
    Root = maps:get(proc_root, Opts, "/proc"),
    Name = atom_to_list(Node),
    case beamdiag_node_name:split(Name) of
        {_, Host} when Host =/= "" ->
            case beamdiag_host_locate:is_local_host(Host) of
                true ->
                    case beamdiag_host_locate:locate(Name, #{timeout => 1000, proc_root => Root}) of
                        {ok, #{os_pid := P}} ->
                            S = beamdiag_host_view:start(P, #{interval_ms => 1000, proc_root => Root}),
                            {ok, #{os_pid => P, sampler => S, root => Root,
                                   t0 => erlang:monotonic_time(nanosecond)}};
                        {error, _} = E ->
                            E
                    end;
                false ->
                    {error, {?MODULE, {other_host, Host}}}
            end;
        _ ->
            {error, {?MODULE, {other_host, ""}}}
    end.

%% @doc Ends the sampling; what the span showed.
-spec finish(glance()) -> view().
finish(#{os_pid := P, sampler := S, root := Root}) ->
    Samples = beamdiag_host_view:stop(S),
    State = case beamdiag_host_locate:read(filename:join([Root, integer_to_list(P), "stat"])) of
                {ok, Stat} -> parse_state(Stat);
                {error, _} -> unknown
            end,
    Base = #{os_pid => P, state => State, span_s => 0.0, threads => []},
    V = case [X || X = #{threads := T} <- Samples, is_map(T)] of
            [First | More = [_ | _]] ->
                Last = lists:last(More),
                spread(First, Last, Base);
            _ ->
                Base
        end,
    case [R || #{memory := #{rss := R}} <- lists:reverse(Samples)] of
        [Rss | _] -> V#{rss => Rss};
        [] -> V
    end.

%% @doc The view in words, for a line of its own.
-spec words(view()) -> iolist().
words(V = #{os_pid := P, state := State, threads := Threads, span_s := Span}) ->
    Busy = [[Name, " ", beamdiag_units:whole_pct(U), " user", case S >= ?FLOOR of
                                             true -> [" + ", beamdiag_units:whole_pct(S), " kernel"];
                                             false -> ""
                                         end]
            || #{name := Name, user := U, sys := S} <- Threads],
    CpuText = case {Busy, Span > 0} of
                  {_, false} -> [];
                  {[], true} -> [io_lib:format("no thread above 1% of a CPU in ~.1f s", [Span])];
                  {_, true} -> [lists:join(", ", Busy), io_lib:format(" over ~.1f s", [Span])]
              end,
    Mem = case V of
              #{rss := R} -> [beamdiag_units:memory(R) ++ " resident"];
              _ -> []
          end,
    ["on this host: pid ", integer_to_list(P), ", ", state_words(State),
     [["; ", X] || X <- [CpuText | [Mem]], X =/= []]].

%% @doc The state letter of a /proc/PID/stat line (after the command's
%% name, which may hold spaces and parentheses).
-spec parse_state(binary()) -> binary() | unknown.
parse_state(Stat) ->
    case beamdiag_agent_procfs:stat_fields(Stat) of
        {ok, _, [S | _]} -> S;
        _ -> unknown
    end.

%% @doc Turns an error reason of this module into a sentence.
-spec format_error(term()) -> iolist().
format_error({other_host, ""}) ->
    "the node's name has no host part";
format_error({other_host, Host}) ->
    io_lib:format("~ts is not this host", [beamdiag_safe_text:safe(Host, 80)]).

%%%===================================================================
%%% Internal
%%%===================================================================

%% Each thread's user and kernel time between two samples, as shares of
%% the wall time between them; the busiest first.
spread(#{t := T0, threads := A}, #{t := T1, threads := B}, Base) ->
    Wall = (T1 - T0) / 1.0e9,
    Shares = [#{name => Name,
                user => share(U1 - maps:get(utime, maps:get(Tid, A, #{}), U1), Wall),
                sys => share(S1 - maps:get(stime, maps:get(Tid, A, #{}), S1), Wall)}
              || {Tid, #{name := Name, utime := U1, stime := S1}} <- maps:to_list(B)],
    Sorted = lists:sort(fun(#{user := U1, sys := S1}, #{user := U2, sys := S2}) ->
                                U1 + S1 >= U2 + S2
                        end, Shares),
    Top = [X || X = #{user := U, sys := S} <- lists:sublist(Sorted, ?TOP), U + S >= ?FLOOR],
    Base#{span_s => Wall, threads => Top}.

share(_Ticks, Wall) when Wall =< 0 -> 0.0;
share(Ticks, Wall) -> min(1.0, max(0.0, beamdiag_units:ticks_to_s(Ticks) / Wall)).

state_words(<<"T">>) -> "stopped by a signal (state T: SIGSTOP, or job control)";
state_words(<<"t">>) -> "stopped by a debugger (state t)";
state_words(<<"D">>) -> "waiting on I/O it cannot be interrupted from (state D)";
state_words(<<"Z">>) -> "exited, not yet reaped (state Z)";
state_words(<<"R">>) -> "running (state R)";
state_words(<<"S">>) -> "sleeping (state S)";
state_words(unknown) -> "state unknown (it may have exited)";
state_words(S) -> ["state ", S].


