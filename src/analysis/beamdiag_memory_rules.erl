%%% @doc Findings from the memory ledger (pure): `beamdiag_memory_ledger'
%%% beside the process walks' heap growth.
%%%
%%% `memory_growth': one of the VM's parts (`binary', `processes', `ets',
%%% `atom', `code') rose steadily over the window, by at least
%%% `growth_min' bytes and `rate_min' bytes a second; or rose as much in
%%% steps, as a growing heap does (it is resized at its collections), while
%%% the OS's account (the resident memory) rose steadily. The part that grew
%%% most is named, with the OS's account beside it (the resident memory
%%% and its rate), the time until the tightest limit at that rate and which
%%% limit it is, and who: for a heap, the processes whose memory grew most;
%%% for binaries, the processes that reference the most (the walks'
%%% candidates, `procs.binaries'); for ETS, the tables that grew most, with
%%% their type and owner (`procs.tables').
%%%
%%% `native_memory': the resident memory beyond the VM's own total rose
%%% steadily by as much while the VM's account did not: memory that the
%%% VM's allocators do not know (a NIF's or a driver's malloc).
%%%
%%% A node whose memory saws (collections) or rose in one burst gets
%%% neither: `steady' and `fall' in the ledger.
%%%
%%% A node whose resident memory rose steadily by as much, while no part
%%% rose in a shape named above and the memory beyond the VM's account did
%%% not grow alone (a large heap copied at its collections peaks and falls
%%% back further than a climb does, and the memory its old heaps used
%%% stays mapped), still gets `memory_growth', of its resident memory: the
%%% VM's parts that rose are listed with their shapes, the largest one's
%%% growers named. A node whose memory grows never gets none.
%%%
%%% ```
%%% 1> [Id || #{id := Id} <- beamdiag_memory_rules:findings(Memory, Capture)].
%%% [memory_growth]
%%% '''
-module(beamdiag_memory_rules).

-export([findings/2]).

%% The VM's parts a leak grows, most telling first.
-define(PARTS, [binary, processes, ets, atom, code]).
-define(MIB, 1048576).
%% Messages a mailbox grew by, at the least, to be named as what grows the
%% processes' memory when its memory at the start is unknown.
-define(FLOODED_MIN, 10000).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The thresholds the rules use (bytes, bytes a second, seconds).
-spec thresholds() -> #{atom() => number()}.
thresholds() ->
    #{
        %% Growth over the window, at least, of the part named.
        growth_min => 16 * ?MIB,
        %% And its rate.
        rate_min => 4 * ?MIB,
        %% The VM's total, at most, beside a native growth (a fifth of it).
        native_vm_share_max => 0.2,
        %% The resident memory's rise, at most, for a part that climbed in
        %% steps: times the part's rise.
        rss_share_max => 5,
        %% Its largest fall, at most: a share of its rise; or, beside a
        %% larger fall, its lows' rise, at least: a share of its rise.
        climb_fall_max => 0.25,
        climb_low_rise_min => 0.5,
        %% Critical when the room left lasts less than this at the rate.
        time_left_crit_s => 600
    }.

%% @doc The memory findings of a capture's memory ledger.
-spec findings(beamdiag_memory_ledger:memory(), beamdiag_capture:capture()) ->
    [beamdiag_finding:finding()].
findings(M = #{accounts := Acc = #{rss := Rss}}, _Capture) when not is_map_key(total, Acc) ->
    %% The host's report: the resident memory alone.
    T = thresholds(),
    case grows(Rss, T) of
        true -> [resident(Rss, M, T)];
        false -> []
    end;
findings(M = #{accounts := Acc}, Capture) when map_size(Acc) > 0 ->
    T = thresholds(),
    Growing = [{P, A} || P <- ?PARTS, A <- [maps:get(P, Acc, undefined)], is_map(A),
                         grows(A, T) orelse climbs(A, Acc, T)],
    case lists:sort(fun({_, #{change := X}}, {_, #{change := Y}}) -> X >= Y end, Growing) of
        [{Part, A} | _] ->
            [growth(Part, A, M, Capture, T)];
        [] ->
            case native(M, T) of
                [] -> resident_growth(M, Capture, T);
                Native -> Native
            end
    end;
findings(_, _) ->
    [].

%%%===================================================================
%%% Internal
%%%===================================================================

grows(#{steady := true, change := C, rate := R}, T) ->
    C >= map_get(growth_min, T) andalso R >= map_get(rate_min, T);
grows(_, _) ->
    false.

%% A part that rose as much without being steady, in steps (a heap is
%% resized at a collection, so a growing heap's part is flat between
%% collections, jumps at them, and falls when one frees the heap it
%% copied from: 11.6 MB in a rise of 83 MB on OTP 29), never falling by
%% more than a quarter of its rise, while the OS's account rose steadily
%% and by no more than five times the part's rise: the steps are a leak's,
%% not a burst's or a saw's. A larger fall is a climb's too when the lows
%% rose by half the part's rise or more: a large heap copied at a major
%% collection counts twice until the old one is freed (seen on a store
%% of 170 MB: 170, 340, 282, 282, 287, 295, 295 MB, a fall of 58 MB in a
%% rise of 125, its lows 112 MB higher), where a saw's lows stay put.
climbs(A = #{steady := false, change := C, fall := Fall, low_rise := Low},
       #{rss := Rss = #{steady := RssSteady, change := RssC}}, T) ->
    (RssSteady orelse rises(Rss, T)) andalso grows(A#{steady := true}, T) andalso
        (Fall =< map_get(climb_fall_max, T) * C orelse
         Low >= map_get(climb_low_rise_min, T) * C) andalso
        RssC =< map_get(rss_share_max, T) * C;
climbs(_, _, _) ->
    false.

growth(Part, A = #{first := F, last := L, rate := R}, M, Capture, T) ->
    Span = maps:get(span_s, M),
    Evidence =
        [fmt("the node's ~s memory (erlang:memory/0) grew from ~s to ~s in ~.1f s: ~s/s, ~s",
             [Part, mem(F), mem(L), Span, beamdiag_units:bytes(R), shape(A, T)])] ++
        os_lines(M) ++ time_left_lines(M, R) ++ who(Part, A, Capture),
    Metrics = #{part => atom_to_binary(Part), growth_bytes => L - F, rate_bytes_per_s => round(R)},
    beamdiag_finding:new(memory_growth, severity(M, T), Evidence, with_time_left(Metrics, M),
                         #{title => fmt("The node's ~s memory grows by ~s/s", [Part, beamdiag_units:bytes(R)]),
                           fix => fix(Part)}).

%% The resident memory of a node that did not answer, rising steadily:
%% which of the VM's parts grows is not known, only that the node runs out.
resident(#{first := F, last := L, rate := R}, M, T) ->
    Evidence =
        [fmt("the node's resident memory (/proc) grew from ~s to ~s in ~.1f s: ~s/s, steadily "
             "(no fall of more than a tenth of the rise)",
             [mem(F), mem(L), maps:get(span_s, M), beamdiag_units:bytes(R)]),
         <<"the VM's own account was not read (the node did not answer): which part grows "
           "(binaries, heaps, ETS, or memory outside the VM) is not known">>]
        ++ time_left_lines(M, R),
    Metrics = #{part => <<"resident">>, growth_bytes => L - F, rate_bytes_per_s => round(R)},
    beamdiag_finding:new(memory_growth, severity(M, T), Evidence, with_time_left(Metrics, M),
                         #{title => fmt("The node's resident memory grows by ~s/s",
                                        [beamdiag_units:bytes(R)]),
                           fix => <<"Diagnose the node again once it answers (or with a "
                                    "longer answer time), to see which of its parts grows and "
                                    "who grows it; until then, the time left says how soon the "
                                    "node must be restarted or given memory.">>}).

%% The resident memory rose steadily and no part's rule named it: a
%% growth of the resident memory, the VM's parts that rose beside it (each
%% with its shape), the largest one's growers, and the memory beyond the
%% carriers.
resident_growth(M = #{accounts := Acc = #{rss := Rss = #{first := F, last := L, rate := R}}},
                Capture, T) ->
    case grows(Rss, T) orelse rises(Rss, T) of
        true ->
            Rose = lists:sort(fun({_, #{change := X}}, {_, #{change := Y}}) -> X >= Y end,
                              [{P, A} || P <- ?PARTS, A = #{change := C} <- [maps:get(P, Acc, none)],
                                         C >= ?MIB]),
            Parts = case Rose of
                        [] ->
                            [<<"none of the VM's parts (erlang:memory/0) rose by 1 MiB">>];
                        _ ->
                            [fmt("the VM's parts that rose beside it (erlang:memory/0): ~ts",
                                 [lists:join("; ", [part_rise(P, A) || {P, A} <- lists:sublist(Rose, 3)])])]
                    end,
            Top = case Rose of
                      [{P, A = #{change := C}} | _] when 10 * C >= L - F -> {P, A};
                      _ -> none
                  end,
            Untouched = untouched_lines(Acc),
            Evidence =
                [fmt("the node's resident memory (/proc) grew from ~s to ~s in ~.1f s: ~s/s, "
                     "~ts, while no part of the VM's own account rose steadily or climbed in "
                     "steps",
                     [mem(F), mem(L), maps:get(span_s, M), beamdiag_units:bytes(R),
                      case Rss of
                          #{steady := true} ->
                              "steadily (no fall of more than a tenth of the rise)";
                          #{rises := Rs, steps := Ss, fall := RssFall} ->
                              fmt("in ~b of ~b steps, its largest fall ~s", [Rs, Ss, mem(RssFall)])
                      end])] ++
                Parts ++ Untouched ++ os_lines(M) ++ outside_lines(Acc) ++
                time_left_lines(M, R) ++
                case {Top, Capture} of
                    {{GrewPart, GrewA}, _} ->
                        who(GrewPart, GrewA, Capture);
                    {none, #{extras := #{procs := Procs}}} when is_map(Procs) ->
                        largest(Procs, [], ?MIB, "the largest processes at the window's end "
                                                 "(over ~s each):");
                    _ ->
                        []
                end,
            Metrics = #{part => <<"resident">>, growth_bytes => L - F, rate_bytes_per_s => round(R)},
            [beamdiag_finding:new(
               memory_growth, severity(M, T), Evidence, with_time_left(Metrics, M),
               #{title => fmt("The node's resident memory grows by ~s/s", [beamdiag_units:bytes(R)]),
                 fix => case {Top, Untouched} of
                            {{FixPart, _}, _} ->
                                fix(FixPart);
                            {none, [_]} ->
                                %% What the VM mapped ahead and fills: its
                                %% largest part's.
                                [{_, Largest} | _] = lists:reverse(lists:sort(
                                                       [{maps:get(last, maps:get(P, Acc, #{}), 0), P}
                                                        || P <- ?PARTS])),
                                fix(Largest);
                            {none, []} ->
                                <<"Watch the node over a longer window (beamdiag watch) to see "
                                  "which part climbs; the time left says how soon it must be "
                                  "restarted or given memory.">>
                        end})];
        false ->
            []
    end;
resident_growth(_, _, _) ->
    [].

%% The resident memory rose, by as much as a part must, in half its steps
%% or more, its lows in the window's second half above the first half's by
%% half the rise or more, never falling back by more than a quarter of
%% it: not `steady' (two thirds of the steps rising, no fall of a tenth),
%% yet neither a burst (one step) nor a saw (its lows stay put). Seen with
%% a heap leak of 16 KiB events: on OTP 29 197.5 MiB in 3 of 6 steps, its
%% largest fall 3.8 MiB; on OTP 25 178.5 MiB in 5 of 6, a fall of 20.0
%% MiB (the VM unmapping a heap a collection left).
rises(#{change := C, rate := R, fall := Fall, low_rise := Low, rises := Rises, steps := Steps},
      T) ->
    C >= map_get(growth_min, T) andalso R >= map_get(rate_min, T) andalso 4 * Fall =< C
        andalso 2 * Low >= C andalso 2 * Rises >= Steps;
rises(_, _) ->
    false.

%% A part's rise over the window and its shape, in words.
part_rise(P, #{change := C, fall := Fall, steady := Steady}) ->
    Shape = case Steady of
                true -> "steadily";
                false when Fall > C -> fmt("in peaks: it fell by ~s at once, as a large heap "
                                           "copied at its collections counts twice until the "
                                           "old one is freed", [mem(Fall)]);
                false -> fmt("in steps, falling by ~s at most", [mem(Fall)])
            end,
    fmt("~s ~s (~ts)", [P, beamdiag_units:signed_bytes(C), Shape]).

%% When the VM's own account exceeded the resident memory at the start:
%% the VM had mapped memory it had not touched yet, which the resident
%% memory fills.
untouched_lines(#{native := #{first := 0}, rss := #{first := R0}, total := #{first := V0}})
  when V0 > R0 ->
    [fmt("at the window's start the VM's own account (~s) exceeded the resident memory (~s): "
         "the VM had mapped memory it had not touched yet (a heap resized ahead of its data), "
         "and the resident memory grows as it is filled", [mem(V0), mem(R0)])];
untouched_lines(_) ->
    [].

%% The resident memory beyond the VM's carriers, when it grew: memory the
%% allocators freed but the mapping layer keeps (or a NIF's).
outside_lines(#{outside := #{first := OF, last := OL}}) when OF > 0, OL - OF >= ?MIB ->
    [fmt("the resident memory beyond the VM's carriers grew from ~s to ~s: memory the "
         "allocators no longer count (the old heaps of collections, kept mapped), or a NIF's "
         "or a driver's", [mem(OF), mem(OL)])];
outside_lines(_) ->
    [].

%% Not when the VM's own account exceeded the resident memory at the start
%% (the gap read 0): the VM had mapped memory it had not touched yet (a
%% heap resized ahead of its data, 8 stores of 13.8 MB holding 4 MiB
%% each), and the resident memory grows as the VM fills it, with no part
%% of its account moving.
native(M = #{accounts := #{native := N = #{first := F, last := L, rate := R},
                           total := #{change := VmChange}}}, T) when F > 0 ->
    case grows(N, T) andalso VmChange =< map_get(native_vm_share_max, T) * (L - F) of
        true ->
            Evidence =
                [fmt("the node's resident memory beyond the VM's own account grew from ~s to "
                     "~s in ~.1f s: ~s/s, steadily, while the VM's total changed by ~s",
                     [mem(F), mem(L), maps:get(span_s, M), beamdiag_units:bytes(R),
                      beamdiag_units:signed_bytes(VmChange)])] ++
                os_lines(M) ++ time_left_lines(M, R) ++ carrier_lines(M, L - F),
            Metrics = #{growth_bytes => L - F, rate_bytes_per_s => round(R)},
            [beamdiag_finding:new(native_memory, severity(M, T), Evidence,
                                  with_time_left(Metrics, M))];
        false ->
            []
    end;
native(_, _) ->
    [].

shape(#{steady := true}, _T) ->
    "steadily (no fall of more than a tenth of the rise)";
shape(#{steady := false, fall := Fall, change := C}, T) when Fall =< map_get(climb_fall_max, T) * C ->
    "in steps, as a heap resized at its collections climbs (no fall of more than a quarter "
    "of the rise), while the resident memory rose";
shape(#{steady := false, low_rise := Low}, _T) ->
    fmt("in steps and peaks, as a large heap copied at its collections climbs (it falls back "
        "after each, but its low in the window's second half is ~s above the first half's), "
        "while the resident memory rose", [mem(Low)]).

%% Where the memory beyond the VM's account is, by the allocators' own
%% account (read at the window's ends): outside their carriers (a NIF's or
%% a driver's malloc), or in carriers they mapped but hold no blocks in.
carrier_lines(#{accounts := #{outside := #{first := OF, last := OL},
                             carriers := #{change := CC}, blocks := #{change := BC}}}, Growth)
  when 2 * (OL - OF) < Growth ->
    [fmt("the VM's allocators mapped it: their carriers grew by ~s while the blocks in use in "
         "them grew by ~s, and the resident memory beyond the carriers by ~s; free space in "
         "the carriers, not a NIF's allocation",
         [beamdiag_units:signed_bytes(CC), beamdiag_units:signed_bytes(BC),
          beamdiag_units:signed_bytes(OL - OF)])];
carrier_lines(#{accounts := #{outside := #{first := OF, last := OL}}}, _) ->
    [fmt("the resident memory beyond the VM's carriers (what its allocators do not count as "
         "theirs) grew from ~s to ~s: a NIF or a driver allocates with malloc (or mmap) and "
         "does not free, or a library the node loaded does", [mem(OF), mem(OL)])];
carrier_lines(_, _) ->
    [<<"the VM's allocators do not hold it: a NIF or a driver allocates with malloc (or mmap) "
       "and does not free, or a library the node loaded does">>].

os_lines(#{accounts := #{rss := #{first := F, last := L, rate := R}, total := #{last := VmL}}}) ->
    [fmt("the OS's account: resident memory from ~s to ~s (~s/s); the VM accounts for ~s of "
         "the ~s at the end", [mem(F), mem(L), beamdiag_units:signed_bytes(R), mem(VmL), mem(L)])];
os_lines(_) ->
    [<<"the OS's account (resident memory) could not be read">>].

time_left_lines(#{room := Room, bound_by := By, time_left_s := Left}, _Rate) when is_number(Left) ->
    [fmt("~s ~s left at the end: at the resident memory's rate it is gone in ~s",
         [mem(Room), limit_name(By), duration(Left)])];
time_left_lines(#{room := Room, bound_by := By}, Rate) when Rate > 0 ->
    [fmt("~s ~s left at the end; the resident memory itself did not grow over the window "
         "(the VM reuses what it had mapped), so the time left is not known", [mem(Room),
                                                                               limit_name(By)])];
time_left_lines(_, _) ->
    [<<"the room left (the host's available memory, the cgroup's limit) was not read">>].

%% Each pid once, its first (largest) growth kept.
unique_pids(Grew) ->
    lists:reverse(element(2, lists:foldl(fun({D, E = #{pid := P}}, {Seen, Acc}) ->
                                                 case lists:member(P, Seen) of
                                                     true -> {Seen, Acc};
                                                     false -> {[P | Seen], [{D, E} | Acc]}
                                                 end
                                         end, {[], []}, Grew))).

tilde(#{memory_estimated := true}) -> "~";
tilde(_) -> "".

qstart(null) -> "an unknown length";
qstart(N) -> beamdiag_units:count(N).

limit_name(host) -> "of the host's available memory (MemAvailable)";
limit_name(cgroup) -> "below the memory cgroup's limit".

%% Who grew it: the processes whose memory grew most (the walks' heap
%% growth), for a process heap; for the other parts, what the walks cannot
%% say.
who(processes, #{change := Change}, #{extras := #{procs := Procs = #{heap_growth := Growth}}}) ->
    %% Those that grew by a tenth of the part's growth or more: the heaps
    %% the walks read at both ends, and the mailboxes whose memory was
    %% estimated at both ends (a flooded process is not asked for it).
    Queues = maps:get(queues, Procs, []),
    %% Processes alike (eight stores spawned alike) are one line, their
    %% growth summed.
    Grew = [{M1 - M0, E} || E = #{memory := [M0, M1]} <- Growth ++ Queues,
                            is_integer(M0), is_integer(M1), M1 > M0],
    Groups = lists:sublist([G || G = {D, _} <- beamdiag_proc_rules:alike(
                                                   unique_pids(lists:reverse(lists:keysort(1, Grew)))),
                                 10 * D >= Change], 3),
    Top = lists:append([Pairs || {_, Pairs} <- Groups]),
    %% A mailbox that grew, whose memory at the start is unknown (it did
    %% not answer the start walk), and that holds a tenth of the growth.
    Named = [P || {_, #{pid := P}} <- Top],
    Flooded = [E || E = #{pid := P, queue := [Q0, Q1], memory := [null, M1]} <- Queues,
                    is_integer(Q1), is_integer(M1), 10 * M1 >= Change,
                    Q1 - case Q0 of null -> 0; _ -> Q0 end >= ?FLOODED_MIN,
                    not lists:member(P, Named)],
    Lines = [case Pairs of
                 [{_, E}] ->
                     fmt("~ts grew by ~s (~s of the growth); it was in ~ts",
                         [beamdiag_proc_rules:who(E), beamdiag_units:bytes(D),
                          beamdiag_units:whole_pct(min(1.0, D / Change)),
                          beamdiag_proc_rules:where(E)]);
                 [{_, E} | _] ->
                     fmt("~ts grew by ~s together (~s of the growth); they were in ~ts",
                         [beamdiag_proc_rules:alike_who(Pairs, fun(X) -> ["by ", mem(X)] end),
                          beamdiag_units:bytes(D), beamdiag_units:whole_pct(min(1.0, D / Change)),
                          beamdiag_proc_rules:where(E)])
             end
             || {D, Pairs} <- Groups] ++
            [fmt("~ts holds ~s~s now and its mailbox grew from ~ts to ~s messages over the "
                 "window (its memory at the start was not read: it did not answer); it was in ~ts",
                 [beamdiag_proc_rules:who(E), tilde(E), beamdiag_units:bytes(M1), qstart(Q0),
                  beamdiag_units:count(Q1), beamdiag_proc_rules:where(E)])
             || E = #{queue := [Q0, Q1], memory := [_, M1]} <- lists:sublist(Flooded, 3)],
    case Lines of
        [] ->
            %% A large heap whose collections copy it climbs in steps: at
            %% either walk it may be between two, and what holds the memory
            %% is then the largest processes at the end.
            [<<"no process that the walks read grew by a tenth of it: the growth is spread "
               "over many processes, in ones born during the window, or in a large heap "
               "that climbs in steps between the walks">>
             | largest(Procs, [], 1048576,
                       "the largest processes at the window's end (over ~s each):")];
        _ ->
            Lines
    end;
who(binary, _, #{extras := #{procs := Procs = #{binaries := [#{bytes := Most} | _] = Holders}}}) ->
    %% The holders of a tenth of the largest one's bytes or more, those
    %% alike (eight relays spawned alike) in one line, three lines at most.
    Groups = lists:sublist([G || G = {B, _} <- beamdiag_proc_rules:alike(
                                                   [{B, H} || H = #{bytes := B} <- Holders]),
                                 10 * B >= Most], 3),
    Listed = [H || {_, Pairs} <- Groups, {_, H} <- Pairs],
    Lines = [case Pairs of
                 [{_, H = #{count := N, sole_bytes := Sole}}] ->
                     fmt("~ts references ~s reference-counted binaries of ~s (~s of them held by "
                         "it alone); it was in ~ts",
                         [beamdiag_proc_rules:who(H), beamdiag_units:count(N),
                          beamdiag_units:bytes(B), beamdiag_units:bytes(Sole),
                          beamdiag_proc_rules:where(H)]);
                 [{_, H} | _] ->
                     Hs = [X || {_, X} <- Pairs],
                     fmt("~ts reference ~s reference-counted binaries of ~s together (~s of them "
                         "held by one of them alone); they were in ~ts",
                         [beamdiag_proc_rules:alike_who(Pairs, fun mem/1),
                          beamdiag_units:count(lists:sum([N || #{count := N} <- Hs])),
                          beamdiag_units:bytes(B),
                          beamdiag_units:bytes(lists:sum([S || #{sole_bytes := S} <- Hs])),
                          beamdiag_proc_rules:where(H)])
             end
             || {B, Pairs} <- Groups],
    Bytes = lists:sum([B || #{bytes := B} <- Listed]),
    Sole = lists:sum([S || #{sole_bytes := S} <- Listed]),
    %% Binaries they share with others (a message passed on and kept
    %% elsewhere too) are kept by those others as well: the largest
    %% processes, whose binaries are not listed, are where to look.
    case 10 * Sole < Bytes of
        true ->
            Lines ++ [fmt("~s of the ~s they reference is referenced by other processes too: "
                          "what keeps it is elsewhere", [mem(Bytes - Sole), mem(Bytes)])
                      | too_large(Procs, Listed)];
        false ->
            Lines
    end;
who(binary, _, #{extras := #{procs := Procs}}) when is_map(Procs) ->
    [held_by_none("processes whose binaries were listed") | too_large(Procs, [])];
who(binary, _, _) ->
    [held_by_none("processes the walks read")];
who(ets, #{change := Change}, #{extras := #{procs := #{tables := #{grew := [_ | _] = Grew}}}}) ->
    %% The tables that grew by a tenth of the part's growth or more.
    [fmt("table ~ts (~ts, ~ts~ts) grew from ~s to ~s (~s of the growth), ~s objects at the end; "
         "its owner is ~ts",
         [Name, Type, Prot, case Id of Name -> ""; _ -> [", ", Id] end, mem(M0), mem(M1),
          beamdiag_units:whole_pct(min(1.0, (M1 - M0) / max(1, Change))),
          beamdiag_units:count(N), owner(O)])
     || #{name := Name, id := Id, type := Type, protection := Prot, memory := [M0, M1],
          objects := N, owner := O} <- Grew,
        10 * (M1 - M0) >= Change];
who(ets, _, #{extras := #{procs := #{tables := #{grew := []}}}}) ->
    [<<"no table grew by 1 MiB between the walks: the growth is spread over many tables">>];
who(ets, _, _) ->
    [<<"the tables were not read: the node has more than 5,000, or the walks were cut short">>];
who(_, _, _) ->
    [].

held_by_none(Whom) ->
    fmt("reference-counted binaries are held outside the heaps, by processes that keep a "
        "reference (in their state, or because they have not collected since); none of the "
        "~s holds 1 MiB of them", [Whom]).

%% The largest processes at the window's end (the walks' heaps and
%% flooded mailboxes) too large for their binaries to be listed
%% (beamdiag_agent_proc_memory:binaries_memory_max/0), at most three: a
%% process that keeps messages (a queue, a buffer) keeps their binaries.
too_large(Procs, Listed) ->
    largest(Procs, Listed, beamdiag_agent_proc_memory:binaries_memory_max(),
            "the largest processes, whose binaries are not listed (over ~s each: the list "
            "would be too long), and which may keep them:").

%% The largest processes at the window's end above Max bytes, but those
%% Listed, at most three, under a heading (its ~s: Max).
largest(Procs, Listed, Max, Heading) ->
    Named = [P || #{pid := P} <- Listed],
    Big = [{M1, E} || E = #{pid := P, memory := [_, M1]} <- beamdiag_proc_rules:largest_at_end(Procs, Max),
                      M1 > Max, not lists:member(P, Named)],
    %% And those that did not answer at the end, by their size at the
    %% start: a process in a long collection of a large heap answers no
    %% read, and may be the largest of all.
    Stalled = [E || E = #{pid := P} <- beamdiag_proc_rules:stalled_large(Procs, Max + 1),
                    not lists:member(P, Named)],
    case {lists:sublist(beamdiag_proc_rules:alike(Big), 3), lists:sublist(Stalled, 3)} of
        {[], []} ->
            [];
        {Top, Late} ->
            [fmt(Heading, [mem(Max)])
             | [case Pairs of
                    [{_, E}] ->
                        fmt("  ~ts holds ~s~s, ~s messages queued; it was in ~ts",
                            [beamdiag_proc_rules:who(E), tilde(E), mem(M1), queued(E),
                             beamdiag_proc_rules:where(E)]);
                    [{_, E} | _] ->
                        fmt("  ~ts hold ~s together; they were in ~ts",
                            [beamdiag_proc_rules:alike_who(Pairs, fun mem/1), mem(M1),
                             beamdiag_proc_rules:where(E)])
                end || {M1, Pairs} <- Top]
               ++ [iolist_to_binary(["  ", beamdiag_proc_rules:stalled_large_line(E)])
                   || E <- Late]]
    end.

queued(#{queue := [_, Q]}) when is_integer(Q) -> beamdiag_units:count(Q);
queued(_) -> "an unknown number of".

owner(null) ->
    "a process that is gone (the table has an heir, or was given away)";
owner(O) ->
    beamdiag_proc_rules:who_where(O).

fix(binary) ->
    <<"Find the process that holds the binaries (the one that receives and passes on large "
      "payloads) and let it drop them: do not keep them in its state; call "
      "erlang:garbage_collect/0 after handing one on, or start it with "
      "{fullsweep_after, 0}, or hibernate it between messages, so that its references go. "
      "A binary of a few bytes cut from a large one keeps all of it: copy it with "
      "binary:copy/1. A process that keeps messages it has not passed on yet (a queue whose "
      "consumers do not keep up) keeps their binaries as long: bound it (backpressure on its "
      "producers, a maximum length).">>;
fix(processes) ->
    <<"Bound what the process keeps: evict old entries from its state, cap its size, or keep "
      "the data in an ETS table with a size limit; a process that buffers events for a "
      "consumer needs backpressure (a call, or a bounded queue).">>;
fix(ets) ->
    <<"Bound the table: evict entries (a size cap checked on insert, or a periodic sweep of "
      "expired keys), or let a cache library with eviction own it.">>;
fix(atom) ->
    <<"Stop creating atoms from input: binary_to_existing_atom/2, or keep the names as "
      "binaries; atoms are never freed.">>;
fix(code) ->
    <<"Code is being loaded without the old versions being purged: check what loads modules "
      "at run time (a template compiler, a hot reloader).">>.

severity(#{time_left_s := Left}, T) when is_number(Left) ->
    case Left < map_get(time_left_crit_s, T) of
        true -> critical;
        false -> warning
    end;
severity(_, _) ->
    warning.

with_time_left(Metrics, #{time_left_s := Left, bound_by := By}) when is_number(Left) ->
    Metrics#{time_left_s => round(Left), bound_by => atom_to_binary(By)};
with_time_left(Metrics, _) ->
    Metrics.

duration(S) when S < 120 -> io_lib:format("~b s", [round(S)]);
duration(S) when S < 7200 -> io_lib:format("~.1f min", [S / 60]);
duration(S) when S < 172800 -> io_lib:format("~.1f h", [S / 3600]);
duration(S) -> io_lib:format("~.1f days", [S / 86400]).

mem(B) -> beamdiag_units:bytes(B).


fmt(F, A) -> iolist_to_binary(io_lib:format(F, A)).
