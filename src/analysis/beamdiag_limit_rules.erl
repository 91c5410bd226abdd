%%% @doc The node's limits (pure): atoms, processes, ports and ETS tables,
%%% from the counts each sample carries (`beamdiag_agent_limits:counts/0'),
%%% and the processes the walker caught running when the atom table grew
%%% (`atom_sources' in the extras).
%%%
%%% `node_limit', one finding per resource, when the count is near its
%%% limit (`used_warn', `used_crit'), or grows steadily (it rose in at
%%% least half of the intervals and fell in at most a quarter, by at least
%%% the resource's `growth_min' over the window: one burst, such as a pool
%%% started or modules loaded, is not a leak) fast enough to reach it within the
%%% resource's time bounds: atoms are never freed, so a day at this rate
%%% is a warning; processes and ports come and go, so an hour. The ETS
%%% limit is not enforced since OTP 21: a steady growth of tables is
%%% reported as a leak, without a time to a limit.
%%%
%%% ```
%%% 1> [maps:get(resource, M) || #{metrics := M} <- beamdiag_limit_rules:findings(Capture)].
%%% [<<"atoms">>]
%%% '''
-module(beamdiag_limit_rules).

-export([findings/1]).

-define(RESOURCES, [atoms, processes, ports, ets_tables]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The limit findings of a capture.
-spec findings(beamdiag_capture:capture()) -> [beamdiag_finding:finding()].
findings(Capture) ->
    case [S || S = #{limits := _, t := _} <- maps:get(samples, Capture, [])] of
        [First | _] = Samples when length(Samples) >= 2 ->
            Last = lists:last(Samples),
            Span = (maps:get(t, Last) - maps:get(t, First)) / 1.0e9,
            Extras = maps:get(extras, Capture, #{}),
            Procs = maps:get(procs, Extras, #{}),
            Sources = #{atoms => maps:get(atom_sources, Extras, none),
                        processes => maps:get(born, Procs, none),
                        ports => maps:get(port_owners, Procs, none),
                        ets_tables => case maps:get(tables, Procs, none) of
                                          #{born := Born} -> Born;
                                          _ -> none
                                      end},
            lists:append([resource(R, Samples, Span, maps:get(R, Sources, none), thresholds())
                          || R <- ?RESOURCES, Span > 0]);
        _ ->
            []
    end.

%% The thresholds, by resource where they differ.
-type resource() :: atoms | processes | ports | ets_tables.
-type thresholds() :: #{
    used_warn := float(),
    used_crit := float(),
    rise_share := float(),
    fall_share := float(),
    growth_min := #{resource() => pos_integer()},
    left_warn_s := #{resource() => pos_integer()},
    left_crit_s := #{resource() => pos_integer()},
    ets_rate_min := float()
}.
-spec thresholds() -> thresholds().
thresholds() ->
    #{
        %% Share of the limit in use.
        used_warn => 0.80,
        used_crit => 0.95,
        %% Shares of the intervals in which the count rose, at least, and
        %% fell, at most, for a steady growth.
        rise_share => 0.5,
        fall_share => 0.25,
        %% Growth over the window that counts, by resource.
        growth_min => #{atoms => 100, processes => 200, ports => 50, ets_tables => 100},
        %% Time to the limit at this rate, in seconds: warning, critical.
        left_warn_s => #{atoms => 86400, processes => 3600, ports => 3600},
        left_crit_s => #{atoms => 3600, processes => 600, ports => 600},
        %% Tables a second that make a steady growth a leak.
        ets_rate_min => 1.0
    }.

%%%===================================================================
%%% Internal
%%%===================================================================

resource(R, Samples, Span, Sources, T) ->
    Counts = [C || #{limits := #{R := [C, _]}} <- Samples],
    case Counts of
        [C0 | _] when length(Counts) >= 2 ->
            C1 = lists:last(Counts),
            [_, Limit] = maps:get(R, maps:get(limits, lists:last(Samples))),
            Growth = C1 - C0,
            Rate = Growth / Span,
            Steady = steady(Counts, T) andalso Growth >= maps:get(R, map_get(growth_min, T)),
            Used = C1 / max(1, Limit),
            judge(#{resource => R, count => C1, start => C0, limit => Limit, growth => Growth,
                    rate => Rate, steady => Steady, used => Used, span => Span}, Sources, T);
        _ ->
            []
    end.

%% The count rose in at least half of the intervals and fell in at most a
%% quarter: a leak, not one burst (a pool started, modules loaded, whose
%% atoms come at once) nor load that comes and goes.
steady(Counts, T) ->
    Pairs = lists:zip(lists:droplast(Counts), tl(Counts)),
    N = length(Pairs),
    length([1 || {A, B} <- Pairs, B > A]) / N >= map_get(rise_share, T) andalso
        length([1 || {A, B} <- Pairs, B < A]) / N =< map_get(fall_share, T).

judge(F = #{resource := ets_tables, steady := Steady, rate := Rate}, Sources, T) ->
    case Steady andalso Rate >= map_get(ets_rate_min, T) of
        true -> [finding(F, warning, Sources)];
        false -> []
    end;
judge(F = #{resource := R, steady := Steady, rate := Rate, used := Used, count := C,
            limit := L}, Sources, T) ->
    Left = case Steady andalso Rate > 0 of
               true -> max(0, L - C) / Rate;
               false -> none
           end,
    Below = fun(Key) -> Left =/= none andalso Left =< maps:get(R, map_get(Key, T)) end,
    Sev = if
              Used >= map_get(used_crit, T) -> critical;
              Steady -> case Below(left_crit_s) of
                            true -> critical;
                            false -> case Below(left_warn_s) orelse Used >= map_get(used_warn, T) of
                                         true -> warning;
                                         false -> none
                                     end
                        end;
              Used >= map_get(used_warn, T) -> warning;
              true -> none
          end,
    case Sev of
        none -> [];
        _ -> [finding(F#{left => Left}, Sev, Sources)]
    end.

finding(F = #{resource := R, count := C, start := C0, limit := L, growth := G, rate := Rate,
              used := Used, span := Span, steady := Steady}, Sev, Sources) ->
    Left = maps:get(left, F, none),
    Head = case R of
               ets_tables ->
                   fmt("~s ETS tables at the end of the window; the node's ets_limit (~s) is "
                       "not enforced since OTP 21: tables are bounded by memory only",
                       [beamdiag_units:count(C), beamdiag_units:count(L)]);
               _ ->
                   fmt("~ts: ~s of ~s (~s) at the end of the window",
                       [what(R), beamdiag_units:count(C), beamdiag_units:count(L), beamdiag_units:pct(Used)])
           end,
    Growth = case G of
                 0 -> fmt("no change over ~.1f s", [Span]);
                 _ -> fmt("~s from ~s over ~.1f s (~s a second)~ts",
                          [signed(G), beamdiag_units:count(C0), Span, rate(Rate),
                           case Steady of
                               true -> ", rising steadily";
                               false -> ""
                           end])
             end,
    Time = case Left of
               none -> [];
               _ -> [fmt("at this rate the limit is reached in ~~~ts: then ~ts",
                         [beamdiag_proc_rules:duration(Left), consequence(R)])]
           end,
    Metrics0 = #{resource => atom_to_binary(R, utf8), count => C, limit => L, growth => G,
                 rate_per_s => round4(Rate), used_share => round4(Used)},
    Metrics = case Left of
                  none -> Metrics0;
                  _ -> Metrics0#{seconds_left => round(Left)}
              end,
    Evidence = [Head, Growth] ++ Time ++ sources(R, Sources),
    beamdiag_finding:new(node_limit, Sev, Evidence, Metrics,
                         #{title => title(R, Left), fix => fix(R, L)}).

what(atoms) -> "atoms in the atom table";
what(processes) -> "processes";
what(ports) -> "ports (sockets, files, drivers)".

consequence(atoms) ->
    "the node stops (atoms are never freed: only a restart empties the table)";
consequence(processes) ->
    "every spawn fails with system_limit";
consequence(ports) ->
    "every open_port and socket open fails with system_limit".

title(atoms, none) -> "The atom table is nearly full";
title(atoms, Left) -> ["The atom table fills up: full in ~", beamdiag_proc_rules:duration(Left),
                       " at this rate"];
title(processes, none) -> "The node is near its process limit";
title(processes, Left) -> ["Processes pile up: the limit is reached in ~",
                           beamdiag_proc_rules:duration(Left), " at this rate"];
title(ports, none) -> "The node is near its port limit";
title(ports, Left) -> ["Ports pile up: the limit is reached in ~",
                       beamdiag_proc_rules:duration(Left), " at this rate"];
title(ets_tables, _) -> "ETS tables pile up".

fix(atoms, L) ->
    ["Find the code that makes atoms from outside data (the processes named above) and make it "
     "use existing atoms only: binary_to_term(Bin, [safe]) refuses new atoms, "
     "list_to_existing_atom/1 and binary_to_existing_atom/2 fail on unknown names, or keep such "
     "keys as binaries. Atoms are never freed: restart the node before the table fills. +t "
     "raises the limit (this node's is ", beamdiag_units:count(L), ") and only postpones the crash."];
fix(processes, L) ->
    ["Bound who spawns them (named above when the walks could read the newborn): a "
     "pool, processes that end when their work is done, a supervisor that gives up. +P raises "
     "the limit (this node's is ", beamdiag_units:count(L), "), but each process holds memory."];
fix(ports, L) ->
    ["Close every port and socket when done (a socket closes when its owner process dies), and "
     "bound connection counts (a pool, a limit on accepted connections). +Q raises the limit "
     "(this node's is ", beamdiag_units:count(L), "); each socket or file also takes a file descriptor, "
     "bounded by the process's open-file limit (ulimit -n)."];
fix(ets_tables, _L) ->
    "Delete tables when done, or give each an owner that ends with its work (a table dies with "
    "its owner); a table per request or per session is the usual leak.".

%% Which processes were running when the atom table grew.
sources(atoms, #{processes := Ps, rounds := N, atoms := [A0, A1]}) ->
    Ranked = [P || P = #{makes_atoms := [_ | _]} <- Ps] ++ [P || P = #{makes_atoms := []} <- Ps],
    case Ranked of
        [] ->
            [fmt("no process was caught running in ~b looks while the atom table grew (from ~s "
                 "to ~s): the atoms come in bursts", [N, beamdiag_units:count(A0), beamdiag_units:count(A1)])];
        _ ->
            [fmt("caught running in ~b looks while the atom table grew from ~s to ~s:",
                 [N, beamdiag_units:count(A0), beamdiag_units:count(A1)])
             | [source_line(P, N) || P <- lists:sublist(Ranked, 3)]]
    end;
sources(atoms, none) ->
    ["the processes making them were not sampled (the walker looks when the table has grown by "
     "100 atoms or more during the window)"];
sources(processes, #{read := Read, groups := [#{count := Most} | _] = Groups0}) ->
    %% The groups of a tenth of the largest or more.
    Groups = [G || G = #{count := N} <- Groups0, 10 * N >= Most],
    [fmt("of ~b processes born during the window (read of the newest):", [Read])
     | [fmt("  ~b run ~ts~ts, spawned by ~ts",
            [N, spawned(Ic, Cur), case Cur of
                                      null -> "";
                                      Ic -> "";
                                      _ when Ic =:= <<"erlang:apply/2">> -> in_fun(Cur);
                                      _ -> [" (most in ", Cur, ")"]
                                  end, spawner(P)])
        || G = #{count := N, initial_call := Ic, parent := P} <- Groups,
           Cur <- [maps:get(current, G, null)]]];
sources(processes, #{read := Read, groups := []}) ->
    [fmt("none of the ~b newest processes read at the window's end answered: they ended, or "
         "were too busy to answer", [Read])];
sources(processes, #{}) ->
    [<<"who spawns them was not read: the walks cover a sample of the processes on a node "
       "this large, or the count grew by less than 100 over the window">>];
sources(processes, none) ->
    [];
sources(ports, [#{count := Most} | _] = Groups) ->
    [<<"who holds the most ports at the end:">>
     | [fmt("  ~b ~ts ports held by ~ts", [N, Name, spawner(O)])
        || #{count := N, name := Name, owner := O} <- Groups, 10 * N >= Most]];
sources(ports, []) ->
    [<<"who holds them was not read: the node has more than 20,000 ports, or their count "
       "grew by less than 50 over the window">>];
sources(ets_tables, [#{count := Most} | _] = Groups) ->
    [<<"who created the new tables:">>
     | [fmt("  ~b tables named ~ts, owned by ~ts", [N, Name, spawner(O)])
        || #{count := N, name := Name, owner := O} <- Groups, 10 * N >= Most]];
sources(ets_tables, []) ->
    [<<"who created them was not read: the node has more than 5,000 tables, or their count "
       "grew by less than 50 between the walks">>];
sources(_, _) ->
    [].

%% What processes spawned from a fun run: the fun they are in, when that
%% is where most of them are (`a fun in mod:make/4'), rather than
%% erlang:apply/2 and the fun's compiled name.
spawned(<<"erlang:apply/2">> = Ic, Cur) ->
    case fun_of(Cur) of
        {ok, Fun} -> Fun;
        none -> Ic
    end;
spawned(Ic, _Cur) ->
    Ic.

in_fun(Cur) ->
    case fun_of(Cur) of
        {ok, _} -> "";
        none -> [" (most in ", Cur, ")"]
    end.

%% `mod:-make/4-fun-1-/0' is a fun in mod:make/4.
fun_of(Cur) when is_binary(Cur) ->
    case re:run(Cur, "^(.+):-(.+)/([0-9]+)-fun-[0-9]+-/[0-9]+$",
                [unicode, {capture, all_but_first, binary}]) of
        {match, [M, F, A]} -> {ok, iolist_to_binary(["a fun in ", M, $:, F, $/, A])};
        nomatch -> none
    end;
fun_of(_) ->
    none.

spawner(null) ->
    "a process that is gone";
spawner(P) ->
    beamdiag_proc_rules:who_where(P).

source_line(P = #{samples := K, functions := Fs, makes_atoms := Makes}, N) ->
    Who = case maps:get(name, P, null) of
              null -> maps:get(pid, P);
              Name -> [Name, " ", maps:get(pid, P)]
          end,
    fmt("  ~ts in ~b of ~b looks, in ~ts~ts",
        [Who, K, N, lists:join(", ", Fs),
         case Makes of
             [] -> "";
             _ -> ["; ", lists:join(", ", Makes), " makes atoms"]
         end]).

rate(R) when abs(R) >= 10 -> io_lib:format("~b", [round(R)]);
rate(R) -> io_lib:format("~.1f", [R]).

signed(G) when G >= 0 -> ["+", beamdiag_units:count(G)];
signed(G) -> ["-", beamdiag_units:count(-G)].

round4(X) -> round(X * 10000) / 10000.
fmt(F, A) -> io_lib:format(F, A).
