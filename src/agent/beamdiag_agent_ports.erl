%%% @doc The ports with the most queued in their drivers, on the target
%%% (erts, kernel and stdlib only): what a process suspended on a busy port
%%% sends to, when that port is not a distribution port. For each of the
%%% three with the largest `queue_size' above zero: the port, its name (the
%%% command of a spawned program, the driver's name otherwise), the OS pid
%%% of its program, its owner (the connected process) and, for a program,
%%% what it does by the kernel's account (beamdiag_agent_waits: the kernel
%%% function it sleeps in, its system call and the file behind it).
%%%
%%% Bounded: read only when processes are suspended, and only on a node of
%%% at most `?MAX_PORTS' ports; the ports are asked by a helper of its
%%% own, stopped after `?PORT_MS' (a port call waits for the port). The
%%% distribution ports are left out (their own figures are read apart).
%%%
%%% Who holds the most ports (`owners/2'), when their count grew over the
%%% window by `?GREW_MIN' or more: every port's driver name and owner (the
%%% connected process), grouped, the largest groups first, each owner
%%% identified as the walks' entries are; the same bounds.
%%%
%%% ```
%%% 1> P = open_port({spawn, "sleep 60"}, []).
%%% 2> [port_command(P, binary:copy(<<0>>, 65536)) || _ <- lists:seq(1, 4)].
%%% 3> [#{name := <<"sleep 60">>}] = beamdiag_agent_ports:busiest(#{}).
%%% '''
-module(beamdiag_agent_ports).

-export([busiest/1, owners/2]).

-export_type([port_entry/0, owners/0]).

-type port_entry() :: #{
    port := binary(),
    name := binary(),
    queue_size := non_neg_integer(),
    owner := binary() | null,
    owner_name := binary() | null,
    os_pid => non_neg_integer(),
    program => beamdiag_agent_waits:wait()
}.

%% The ports' owners, largest groups first: how many ports, of which
%% driver (or spawned command), held by whom (an entry as the walks give,
%% or null when the owner is gone).
-type owners() :: [#{count := pos_integer(), name := binary(), owner := map() | null}].

%% The growth of the port count that makes their owners worth a read (the
%% limit rules' growth_min for ports).
-define(GREW_MIN, 50).
%% Ports on a node above which none are read.
-define(MAX_PORTS, 20000).
%% How long the helper may ask the ports.
-define(PORT_MS, 200).
%% Ports reported at most.
-define(TOP, 3).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The ports with the most queued in their drivers, at most three,
%% the most first; Names gives the registered names by pid. `[]' on a node
%% of more than 20,000 ports, or when the helper did not finish in time.
-spec busiest(#{pid() => atom()}) -> [port_entry()].
busiest(Names) ->
    case erlang:system_info(port_count) =< ?MAX_PORTS of
        true -> bounded(fun() -> read(Names) end);
        false -> []
    end.

%% @doc Who holds the most ports, three groups at most, when the port
%% count grew by Grew >= 50 over the window; `[]' otherwise, on a node of
%% more than 20,000 ports, or when the helper did not finish in time.
-spec owners(integer(), #{pid() => atom()}) -> owners().
owners(Grew, Names) when Grew >= ?GREW_MIN ->
    case erlang:system_info(port_count) =< ?MAX_PORTS of
        true ->
            Groups = bounded(fun() -> groups() end),
            Ids = beamdiag_agent_proc_identity:read([O || {{_, O}, _} <- Groups, is_pid(O)], #{}),
            [#{count => N, name => Name, owner => beamdiag_agent_proc_identity:entry(O, Names, Ids)}
             || {{Name, O}, N} <- Groups];
        false ->
            []
    end;
owners(_, _) ->
    [].

%%%===================================================================
%%% Internal
%%%===================================================================

%% Every port's {driver name, owner} counted, the three largest groups.
groups() ->
    Counts = lists:foldl(
               fun(P, Acc) ->
                       case {erlang:port_info(P, name), erlang:port_info(P, connected)} of
                           {{name, N}, {connected, O}} ->
                               maps:update_with({unicode:characters_to_binary(N), O},
                                                fun(C) -> C + 1 end, 1, Acc);
                           _ ->
                               Acc
                       end
               end, #{}, erlang:ports()),
    beamdiag_agent_top:largest(?TOP, 2, maps:to_list(Counts)).

%% F's value, or [] when it was late or failed.
bounded(F) ->
    case beamdiag_agent_deadline:within(F, ?PORT_MS) of
        {ok, R} -> R;
        _ -> []
    end.

read(Names) ->
    Dist = [C || {_, C} <- erlang:system_info(dist_ctrl), is_port(C)],
    Queued = [{Q, P} || P <- erlang:ports() -- Dist,
                        {queue_size, Q} <- [erlang:port_info(P, queue_size)], Q > 0],
    [entry(P, Q, Names) || {Q, P} <- lists:sublist(lists:reverse(lists:sort(Queued)), ?TOP)].

entry(P, Q, Names) ->
    Name = case erlang:port_info(P, name) of
               {name, N} -> unicode:characters_to_binary(N);
               _ -> <<"?">>
           end,
    Owner = case erlang:port_info(P, connected) of
                {connected, O} when is_pid(O) -> O;
                _ -> undefined
            end,
    E = #{port => list_to_binary(erlang:port_to_list(P)), name => Name, queue_size => Q,
          owner => case Owner of
                       undefined -> null;
                       _ -> list_to_binary(pid_to_list(Owner))
                   end,
          owner_name => case maps:get(Owner, Names, undefined) of
                            undefined -> null;
                            R -> atom_to_binary(R, utf8)
                        end},
    case erlang:port_info(P, os_pid) of
        {os_pid, OsPid} when is_integer(OsPid) ->
            Deadline = erlang:monotonic_time(millisecond) + ?PORT_MS div 2,
            case beamdiag_agent_waits:read("/proc", OsPid, [OsPid], #{deadline => Deadline}) of
                #{OsPid := W} -> E#{os_pid => OsPid, program => W};
                _ -> E#{os_pid => OsPid}
            end;
        _ ->
            E
    end.
