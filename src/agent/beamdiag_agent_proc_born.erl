%%% @doc Who spawns the processes born over the window, on the target
%%% (erts, kernel and stdlib only): when the process count grew by
%%% `?GREW_MIN' or more between the walks, the end walk's processes that
%%% the start walk did not see, `?READ' of them at most, grouped by what
%%% they run (their initial call, proc_lib's where it recorded one, and the
%% current function most of them are in) and by
%%% the process that spawned them (`process_info(P, parent)', OTP 25 and
%%% later), the largest groups first, each spawner identified as the walks'
%%% entries are (name, initial call, current function).
%%%
%%% Only on a walk of every process (`mode => all', up to 50,000): a
%%% sampled walk cannot tell the newborn from the unsampled. All reads go
%%% through beamdiag_agent_pinfo: a process that does not answer is left
%%% out of the groups.
%%%
%%% ```
%%% 1> Base = maps:from_list([{P, x} || P <- erlang:processes()]).
%%% 2> [spawn(timer, sleep, [5000]) || _ <- lists:seq(1, 300)].
%%% 3> #{groups := [#{count := 300} | _]} = beamdiag_agent_proc_born:read(
%%%        all, erlang:processes(), Base, 300, beamdiag_agent_proc_identity:names()).
%%% '''
-module(beamdiag_agent_proc_born).

-export([read/5]).

-export_type([born/0]).

%% The newborn read, and their groups: how many, what they run, who
%% spawned them (an entry as the walks give, or null when that process is
%% gone or did not answer).
-type born() :: #{read := non_neg_integer(),
                  groups := [#{count := pos_integer(), initial_call := binary(),
                               current := binary() | null, parent := map() | null}]}.

%% The growth of the process count that makes the newborn worth a read
%% (half of the limit rules' growth_min for processes).
-define(GREW_MIN, 100).
%% Newborn processes read at most.
-define(READ, 200).
%% Groups reported at most.
-define(GROUPS, 3).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The newborn's groups: Mode is the walks' mode, Pids the end walk's
%% processes, Base the start walk's (keyed by pid), Grew the process
%% count's growth over the window, Names the registered names by pid.
%% `#{}' when the count grew less, or the walk was not of every process.
-spec read(atom(), [pid()], #{pid() => term()}, integer(), #{pid() => atom()}) -> born() | #{}.
read(all, Pids, Base, Grew, Names) when Grew >= ?GREW_MIN ->
    Born = newborn(Pids, Base, ?READ, []),
    Ids = beamdiag_agent_proc_identity:read(Born, #{}),
    {Parents, _} = beamdiag_agent_pinfo:read(Born, [parent], #{}),
    Entries = beamdiag_agent_proc_identity:entries(Born, fun(_) -> #{} end, #{}, Names, Ids),
    %% {what they run, who spawned them} => {how many, #{where they are => how many}}
    Groups = lists:foldl(
               fun(E = #{pid := Text, initial_call := Ic}, Acc) ->
                       Parent = case maps:get(list_to_pid(binary_to_list(Text)), Parents, none) of
                                    [{parent, P}] when is_pid(P) -> P;
                                    _ -> undefined
                                end,
                       Cur = maps:get(current, E, null),
                       maps:update_with({Ic, Parent},
                                        fun({N, Curs}) ->
                                                {N + 1, maps:update_with(Cur, fun(C) -> C + 1 end,
                                                                         1, Curs)}
                                        end, {1, #{Cur => 1}}, Acc)
               end, #{}, Entries),
    Top = lists:sublist(lists:sort(fun({_, {A, _}}, {_, {B, _}}) -> A >= B end,
                                   maps:to_list(Groups)), ?GROUPS),
    Spawners = [P || {{_, P}, _} <- Top, is_pid(P)],
    Most = fun(Curs) -> element(1, hd(lists:sort(fun({_, X}, {_, Y}) -> X >= Y end,
                                                  maps:to_list(Curs))))
           end,
    PIds = beamdiag_agent_proc_identity:read(Spawners, #{}),
    Spawner = fun(P) -> beamdiag_agent_proc_identity:entry(P, Names, PIds) end,
    #{read => length(Entries),
      groups => [#{count => N, initial_call => Ic, current => Most(Curs), parent => Spawner(P)}
                 || {{Ic, P}, {N, Curs}} <- Top]};
read(_, _, _, _, _) ->
    #{}.

%%%===================================================================
%%% Internal
%%%===================================================================

%% The first N of Pids that Base does not hold.
newborn(_, _, 0, Acc) ->
    lists:reverse(Acc);
newborn([], _, _, Acc) ->
    lists:reverse(Acc);
newborn([P | Ps], Base, N, Acc) ->
    case is_map_key(P, Base) orelse P =:= self() of
        true -> newborn(Ps, Base, N, Acc);
        false -> newborn(Ps, Base, N - 1, [P | Acc])
    end.
