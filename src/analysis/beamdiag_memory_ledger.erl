%%% @doc The memory ledger (pure): the OS's account of a node's memory
%%% beside the VM's, over the window, from the agent's readings in each
%%% sample (`memory', `beamdiag_agent_memory') and the room left at the
%%% window's end (`extras.memory_room', `beamdiag_agent_cgroup').
%%%
%%% Accounts, in bytes: the OS's `rss' and its `anon' part; the VM's
%%% `total' and its parts `processes', `binary', `ets', `atom', `code' and
%%% `other' (the rest of erlang:memory/0's `system', which holds the four
%%% before it); and the gap, `native': resident memory beyond the VM's total
%%% (NIFs, drivers, libc, and the allocators' unused carrier space). From
%%% the allocators' own account at the window's ends (`alloc'): `carriers'
%%% (what the VM's alloc_util allocators mapped) and `blocks' (what is in
%%% use in them), and the gap `outside': resident memory beyond the
%%% carriers, which the VM's allocators do not count as theirs (a NIF's or
%%% a driver's malloc, libc, the emulator's own code, and the segments its
%%% mmap layer keeps cached once a carrier is freed: a heap that grows
%%% leaves its old ones there); carriers beyond blocks are free space in them
%%% (fragmentation), listed per allocator type at the end (`allocators',
%%% most free first). Each
%%% has its first and last value, its change, its rate (bytes a second,
%%% over the span of the readings), `fall': its largest fall from one
%%% reading to the next (0 when it never fell), `low_rise': how far its
%%% lowest reading in the window's second half lies above its lowest in
%%% the first (the halves share the middle reading when they are odd; a
%%% heap copied at a collection peaks, old and new heap both counted, and
%%% falls back, but each low is higher than the last when it grows), and
%%% `steady': it rose in
%%% at least two thirds of the intervals and never fell by more than a
%%% tenth of its rise, as a leak does, unlike a burst or the saw of garbage
%%% collection. A heap that grows climbs in steps (it is resized at a
%%% collection), so its part may rise without being steady; the rules set
%%% it beside the resident memory's account (`beamdiag_memory_rules').
%%%
%%% `time_left_s': at the resident memory's rate, the seconds until the
%%% room at the end (the host's MemAvailable, or the cgroup's limit less
%%% its usage) is gone; `bound_by' says which limit.
%%%
%%% ```
%%% 1> M = beamdiag_memory_ledger:build(Capture).
%%% 2> maps:get(rate, maps:get(binary, maps:get(accounts, M))).
%%% 41943040.0
%%% '''
-module(beamdiag_memory_ledger).

-export([build/1, accounts/0]).

-export_type([memory/0, account/0]).

-type account() :: #{
    first := non_neg_integer(),
    last := non_neg_integer(),
    change := integer(),
    rate := float(),
    fall := non_neg_integer(),
    low_rise := integer(),
    rises := non_neg_integer(),
    steps := non_neg_integer(),
    steady := boolean()
}.
-type memory() :: #{
    readings := non_neg_integer(),
    span_s := float(),
    accounts := #{atom() => account()},
    room => non_neg_integer(),
    bound_by => host | cgroup,
    time_left_s => float() | infinity,
    allocators => [#{type := atom(), carriers := non_neg_integer(),
                     blocks := non_neg_integer()}],
    notes := [binary()]
}.

%% The VM's parts, as erlang:memory/0 names them.
-define(VM, [total, processes, binary, ets, atom, code, system]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The accounts the ledger keeps, the OS's first.
-spec accounts() -> [atom()].
accounts() ->
    [rss, anon, native, outside, total, processes, binary, ets, atom, code, other, carriers,
     blocks].

%% @doc The memory ledger of a capture; no accounts when fewer than two
%% samples carry the readings (a capture of an older agent, a host view),
%% with a note saying so.
-spec build(beamdiag_capture:capture()) -> memory().
build(Capture = #{samples := Samples}) ->
    Readings = [{T, M} || #{t := T, memory := M = #{vm := #{total := _}}} <- Samples],
    Room = room(Capture),
    case Readings of
        [{T0, _}, _ | _] ->
            {T1, _} = lists:last(Readings),
            Span = erlang:convert_time_unit(T1 - T0, native, nanosecond) / 1.0e9,
            Series = series(Readings),
            Accounts = maps:map(fun(_, TVs) -> account(TVs) end, Series),
            Notes = case maps:is_key(rss, Accounts) of
                        true -> [];
                        false -> [<<"the node's resident memory could not be read (statm)">>]
                    end ++ late_note(Samples),
            with_allocators(Readings,
                            with_time_left(Room#{readings => length(Readings), span_s => Span,
                                                 accounts => Accounts, notes => Notes}));
        _ ->
            case [{T, R} || #{t := T, memory := #{rss := R}} <- Samples, is_integer(R)] of
                [{T0, _}, _ | _] = Host ->
                    host_only(Host, T0, Room, Capture);
                _ ->
                    no_readings(Samples, Readings, Room)
            end
    end;
build(_) ->
    #{readings => 0, span_s => 0.0, accounts => #{}, notes => [<<"no samples">>]}.

%% The host's view of a node that did not answer: its resident memory
%% alone (/proc/PID/status), with the room the host's samples say is left
%% (MemAvailable, the memory cgroup's limit on cgroup v2).
host_only(Host, T0, Room0, Capture) ->
    {T1, _} = lists:last(Host),
    Room = case Room0 of
               #{room := _} -> Room0;
               _ -> host_room(Capture)
           end,
    with_time_left(Room#{readings => length(Host),
                         span_s => erlang:convert_time_unit(T1 - T0, native, nanosecond) / 1.0e9,
                         accounts => #{rss => account(Host)},
                         notes => [<<"the VM's own account was not read (the report is the host's): "
                                     "the resident memory alone">>]}).

%% The host's memory at the window's end, as the host's report keeps it
%% (extras `memory'), or in the last sample.
host_room(#{extras := #{memory := M}}) ->
    host_room(M);
host_room(#{samples := Samples}) ->
    case [M || #{memory := M = #{mem_available := _}} <- Samples] of
        [] -> #{};
        Ms -> host_room(lists:last(Ms))
    end;
host_room(M = #{mem_available := Avail}) ->
    case M of
        #{cgroup_max := Max, cgroup_current := Cur} when is_integer(Max), is_integer(Cur),
                                                          Max - Cur < Avail ->
            #{room => max(0, Max - Cur), bound_by => cgroup};
        _ ->
            #{room => Avail, bound_by => host}
    end;
host_room(_) ->
    #{}.

no_readings(Samples, Readings, Room) ->
    Notes = case {late_note(Samples),
                  [M || #{memory := M = #{vm := Vm}} <- Samples, map_size(Vm) =:= 0]} of
                {[_] = Late, _} -> Late;
                {[], []} -> [<<"no memory readings in this capture">>];
                {[], _} -> [<<"the VM's memory account is not available: erlang:memory/0 is not "
                              "supported on this node (+Mea min, or an allocator disabled)">>]
            end,
    Room#{readings => length(Readings), span_s => 0.0, accounts => #{}, notes => Notes}.

%% The ticks whose VM account came too late: erlang:memory/0 waits for
%% every scheduler, and the agent waits for it no longer than a tick
%% allows (beamdiag_agent_memory).
late_note(Samples) ->
    case [W || #{memory := #{vm_missing := W}} <- Samples] of
        [] -> [];
        Late -> [iolist_to_binary(
                   io_lib:format("the VM's memory account missing in ~b of ~b samples: "
                                 "erlang:memory/0 waits for every scheduler, and one did not "
                                 "answer within the tick's wait (a scheduler held by a NIF or a "
                                 "long BIF); the accounts come from the samples that have it",
                                 [length(Late), length(Samples)]))]
    end.

%%%===================================================================
%%% Internal
%%%===================================================================

%% Each account's readings in sample order, `{T, Bytes}', where it was
%% read (the anonymous part and the allocators' at the window's ends
%% only), when it was read twice or more.
series(Readings) ->
    Rows = [{T, row(M)} || {T, M} <- Readings],
    All = [{K, [{T, maps:get(K, R)} || {T, R} <- Rows, maps:is_key(K, R)]} || K <- accounts()],
    maps:from_list([KV || KV = {_, [_, _ | _]} <- All]).

row(M = #{vm := Vm, os := Os = #{rss := Rss}}) ->
    Row = (alloc_row(M, vm_row(Vm)))#{rss => Rss, native => max(0, Rss - maps:get(total, Vm))},
    Row1 = case Row of
               #{carriers := C} -> Row#{outside => max(0, Rss - C)};
               _ -> Row
           end,
    case Os of
        #{anon := A} -> Row1#{anon => A};
        _ -> Row1
    end;
row(M = #{vm := Vm}) ->
    alloc_row(M, vm_row(Vm)).

%% The allocators' carriers and blocks, summed over their types, where
%% they were read (the window's ends).
alloc_row(#{alloc := Alloc}, Row) when map_size(Alloc) > 0 ->
    Sizes = maps:values(Alloc),
    Row#{carriers => lists:sum([C || #{carriers := C} <- Sizes]),
         blocks => lists:sum([B || #{blocks := B} <- Sizes])};
alloc_row(_, Row) ->
    Row.

%% The allocator types at the last reading that has them, most free
%% carrier space first.
with_allocators(Readings, M) ->
    case [A || {_, #{alloc := A}} <- lists:reverse(Readings), map_size(A) > 0] of
        [Alloc | _] ->
            Rows = [#{type => T, carriers => C, blocks => B}
                    || {T, #{carriers := C, blocks := B}} <- maps:to_list(Alloc)],
            M#{allocators => lists:sort(fun(#{carriers := C1, blocks := B1},
                                            #{carriers := C2, blocks := B2}) ->
                                                C1 - B1 >= C2 - B2
                                        end, Rows)};
        [] ->
            M
    end.

%% The VM's parts, `system' less the parts inside it as `other'.
vm_row(Vm) ->
    Row = maps:with(?VM -- [system], Vm),
    case Vm of
        #{system := Sys} ->
            Inside = lists:sum([maps:get(K, Vm, 0) || K <- [binary, ets, atom, code]]),
            Row#{other => max(0, Sys - Inside)};
        _ ->
            Row
    end.

account(TVs = [{T0, First} | _]) ->
    {T1, Last} = lists:last(TVs),
    Vs = [V || {_, V} <- TVs],
    Span = erlang:convert_time_unit(T1 - T0, native, nanosecond) / 1.0e9,
    Change = Last - First,
    Steps = lists:zipwith(fun(A, B) -> B - A end, lists:droplast(Vs), tl(Vs)),
    Rises = length([S || S <- Steps, S > 0]),
    Fall = lists:max([0 | [-S || S <- Steps, S < 0]]),
    Half = (length(Vs) + 1) div 2,
    LowRise = lists:min(lists:nthtail(length(Vs) - Half, Vs)) - lists:min(lists:sublist(Vs, Half)),
    #{first => First, last => Last, change => Change, fall => Fall, low_rise => LowRise,
      rises => Rises, steps => length(Steps),
      rate => case Span > 0 of true -> Change / Span; false -> 0.0 end,
      steady => Change > 0 andalso 3 * Rises >= 2 * length(Steps) andalso 10 * Fall =< Change}.

room(#{extras := #{memory_room := R = #{room := Room}}}) when is_integer(Room) ->
    maps:with([room, bound_by], R);
room(_) ->
    #{}.

with_time_left(M = #{room := Room, accounts := #{rss := #{rate := Rate}}}) when Rate > 0 ->
    M#{time_left_s => Room / Rate};
with_time_left(M = #{room := _}) ->
    M#{time_left_s => infinity};
with_time_left(M) ->
    M.
