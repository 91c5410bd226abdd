%%% @doc Process ids across PID namespaces: a node in a container has one
%%% pid on this host and another, its own (what `os:getpid()' says there),
%%% in its namespace. Everything beamdiag does from the host (the host
%%% view, perf) takes the host's pid; the node names its perf map
%%% (`/tmp/perf-<pid>.map', in its own /tmp) with its own.
%%%
%%% `ns_pid/2' reads a host pid's own pid (the last `NSpid' of its
%%% status). `host_pid/3' goes the other way: of the `beam*' processes of
%%% this host, the one whose own pid is the node's and that started when
%%% the node did (`start_ticks/1' of the node's own /proc/self/stat, the
%%% same clock on both sides): pids repeat across containers, start times
%%% do not. Nothing here talks to the node.
%%%
%%% ```
%%% 1> beamdiag_host_pid:ns_pid("/proc", 48213).
%%% 1
%%% 2> beamdiag_host_pid:host_pid("/proc", 1, #{start => 5123456}).
%%% {ok, 48213}
%%% '''
-module(beamdiag_host_pid).

-export([ns_pid/2, host_pid/3, start_ticks/1, format_error/1]).
%% Called as Module:format_error/1 on an {error, {Module, Reason}} value.
-ignore_xref([{format_error, 1}]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The pid a host process has in its own PID namespace (the host's
%% pid itself when the kernel does not say, or the process is gone).
-spec ns_pid(file:filename(), pos_integer()) -> pos_integer().
ns_pid(Root, HostPid) ->
    case read(Root, HostPid, "status") of
        {ok, B} ->
            case [L || L <- binary:split(B, <<"\n">>, [global]),
                       binary:longest_common_prefix([L, <<"NSpid:">>]) =:= 6] of
                [L | _] ->
                    Ids = binary:split(binary:part(L, 6, byte_size(L) - 6), [<<"\t">>, <<" ">>],
                                       [global, trim_all]),
                    try binary_to_integer(lists:last(Ids)) catch _:_ -> HostPid end;
                [] ->
                    HostPid
            end;
        {error, _} ->
            HostPid
    end.

%% @doc The host's pid of a node that says its OS pid is `NsPid' (in its
%% own namespace) and, when known, that it started at `start' clock ticks
%% after boot. The same pid in this host's namespace comes first; else the
%% one `beam*' process whose own pid and start match; several that match
%% (the start unknown) or none is an error.
-spec host_pid(file:filename(), pos_integer(), #{start => non_neg_integer() | undefined}) ->
    {ok, pos_integer()} | {error, {?MODULE, term()}}.
host_pid(Root, NsPid, Opts) ->
    Start = maps:get(start, Opts, undefined),
    case is_it(Root, NsPid, NsPid, Start) of
        true ->
            {ok, NsPid};
        false ->
            case [P || {P, _} <- beamdiag_host_locate:beams(Root), P =/= NsPid,
                       is_it(Root, P, NsPid, Start)] of
                [P] -> {ok, P};
                [] -> {error, {?MODULE, {not_found, NsPid}}};
                Many -> {error, {?MODULE, {ambiguous, NsPid, lists:sublist(Many, 5)}}}
            end
    end.

%% @doc When a process started, in clock ticks after boot: field 22 of its
%% /proc/PID/stat (counted after the name, which may hold spaces and
%% parentheses).
-spec start_ticks(binary()) -> {ok, non_neg_integer()} | error.
start_ticks(Stat) ->
    case beamdiag_agent_procfs:stat_fields(Stat) of
        {ok, _, Fields} when length(Fields) >= 20 ->
            try {ok, binary_to_integer(lists:nth(20, Fields))}
            catch error:badarg -> error
            end;
        _ ->
            error
    end.

%% @doc Turns an error reason of this module into a sentence.
-spec format_error(term()) -> iolist().
format_error({not_found, NsPid}) ->
    io_lib:format("no Erlang VM of this host is OS process ~b in its own PID namespace "
                  "(a container's): the node runs on another host, or this host's /proc "
                  "cannot be read (run as root or as the node's user)", [NsPid]);
format_error({ambiguous, NsPid, Pids}) ->
    io_lib:format("several Erlang VMs of this host are OS process ~b in their own PID "
                  "namespaces (host pids ~ts), and the node's start time could not be "
                  "read to tell which: give its host pid with --os-pid",
                  [NsPid, lists:join(", ", [integer_to_list(P) || P <- Pids])]).

%%%===================================================================
%%% Internal
%%%===================================================================

%% Host pid P is the node: its own pid is NsPid and it started when the
%% node did.
is_it(Root, P, NsPid, Start) ->
    ns_pid(Root, P) =:= NsPid andalso
        is_beam(Root, P) andalso
        (Start =:= undefined orelse
         case read(Root, P, "stat") of
             {ok, B} -> start_ticks(B) =:= {ok, Start};
             {error, _} -> false
         end).

is_beam(Root, P) ->
    case read(Root, P, "comm") of
        {ok, C} -> binary:longest_common_prefix([C, <<"beam">>]) =:= 4;
        {error, _} -> false
    end.

read(Root, Pid, File) ->
    beamdiag_host_locate:read(filename:join([Root, integer_to_list(Pid), File])).
