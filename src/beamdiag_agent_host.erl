%%% @doc The rest of the host, as the target's own /proc shows it: the CPU
%%% time of every other process (to name what competes with the node for
%%% CPUs) and the CPUs the node may run on. Runs on the target node; reads
%%% one stat file per process, at most `?MAX_PROCS' of them and for at most
%%% `?BUDGET_US' of wall time (a throttled or starved node reads fewer),
%%% through `prim_file', never the file server (a normal-priority process
%%% that waits behind every busy process of an overloaded node).
%%%
%%% ```
%%% 1> beamdiag_agent_host:cpu_by_process("/proc", [list_to_integer(os:getpid())]).
%%% #{1 => {<<"init">>, 1234}, ...}
%%% 2> beamdiag_agent_host:placement("/proc").
%%% #{cpus_allowed => <<"0-1">>}
%%% '''
-module(beamdiag_agent_host).

-export([cpu_by_process/2, placement/1]).

%% Processes read per call; a host with more is read in part (the first
%% ones /proc lists) and says so.
-define(MAX_PROCS, 1000).
-define(BUDGET_US, 25000).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Each process's comm and CPU time in clock ticks (utime + stime),
%% leaving out the given pids; processes that end between listing and
%% reading are skipped. `truncated' is set when the host has more
%% processes than are read.
-spec cpu_by_process(file:filename(), [integer()]) ->
    #{procs := #{integer() => {binary(), non_neg_integer()}}, truncated := boolean()}.
cpu_by_process(Root, Exclude) ->
    Until = erlang:monotonic_time(microsecond) + ?BUDGET_US,
    Pids = case prim_file:list_dir(Root) of
               {ok, Names} -> [P || N <- Names, P <- pid(N), not lists:member(P, Exclude)];
               {error, _} -> []
           end,
    {Procs, Left} = read_all(Root, lists:sublist(Pids, ?MAX_PROCS), Until, #{}),
    #{procs => Procs, truncated => length(Pids) > ?MAX_PROCS orelse Left}.

%% @doc The CPUs this node may run on (its affinity, set by a cpuset or
%% taskset), from /proc/self/status.
-spec placement(file:filename()) -> #{cpus_allowed => binary()}.
placement(Root) ->
    case prim_file:read_file(filename:join([Root, "self", "status"])) of
        {ok, Bin} ->
            case re:run(Bin, "^Cpus_allowed_list:\\s*(\\S+)", [multiline, {capture, [1], binary}]) of
                {match, [L]} -> #{cpus_allowed => L};
                nomatch -> #{}
            end;
        {error, _} ->
            #{}
    end.

%%%===================================================================
%%% Internal
%%%===================================================================

read_all(_Root, [], _Until, Acc) ->
    {Acc, false};
read_all(Root, [P | Rest], Until, Acc) ->
    case erlang:monotonic_time(microsecond) > Until of
        true ->
            {Acc, true};
        false ->
            Acc2 = case read_stat(filename:join([Root, integer_to_list(P), "stat"])) of
                       {ok, V} -> Acc#{P => V};
                       error -> Acc
                   end,
            read_all(Root, Rest, Until, Acc2)
    end.

pid(Name) ->
    try [list_to_integer(Name)]
    catch error:badarg -> []
    end.

%% /proc/PID/stat: "pid (comm) state ppid ..."; utime and stime are the
%% 11th and 12th fields after the state that follows the comm.
read_stat(File) ->
    case prim_file:read_file(File) of
        {ok, Bin} ->
            case {binary:match(Bin, <<"(">>), binary:matches(Bin, <<")">>)} of
                {{Open, 1}, [_ | _] = Closes} ->
                    {Close, 1} = lists:last(Closes),
                    Comm = binary:part(Bin, Open + 1, Close - Open - 1),
                    Rest = binary:part(Bin, Close + 1, byte_size(Bin) - Close - 1),
                    case binary:split(Rest, <<" ">>, [global, trim_all]) of
                        [_State | Fields] when length(Fields) >= 12 ->
                            try
                                U = binary_to_integer(lists:nth(11, Fields)),
                                S = binary_to_integer(lists:nth(12, Fields)),
                                {ok, {Comm, U + S}}
                            catch error:badarg -> error
                            end;
                        _ -> error
                    end;
                _ -> error
            end;
        {error, _} ->
            error
    end.
