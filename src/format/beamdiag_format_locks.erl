%%% @doc Lock data as a text report, readable at 80 columns (pure).
%%%
%%% ```
%%% 1> {ok, Data} = beamdiag_lock_session:data(Session, 2000).
%%% 2> io:put_chars(beamdiag_format_locks:text(Data)).
%%% Lock counting over 10.0 s: 2113 locks, 41 contended
%%%
%%% By class                   locks       tries   coll%    wait ms   wait%
%%% db_hash_slot                 128     2951042    9.84     8123.4    81.2
%%% ...
%%% '''
%%%
%%% wait% is the wait summed over all threads as a share of the window
%%% (lcnt's "duration %"): 100% is one thread blocked for the whole window.
-module(beamdiag_format_locks).

-export([text/1]).

-define(CLASS_ROWS, 12).
-define(LOCK_ROWS, 15).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The ranked lock tables: per class, top locks (class and id) with
%% their wait histogram summary and hottest source location, and the ETS
%% tables behind the hottest table locks.
-spec text(beamdiag_lock_data:lock_data()) -> iolist().
text(Data) ->
    WindowS = maps:get(window_ns, Data, 0) / 1.0e9,
    Classes = maps:get(classes, Data, []),
    Locks = maps:get(locks, Data, []),
    Tables = maps:get(tables, Data, []),
    [
        io_lib:format("Lock counting over ~.1f s: ~b locks, ~b contended~n",
                      [WindowS, maps:get(lock_count, Data, 0), maps:get(contended_count, Data, 0)]),
        "wait% = wait summed over threads / window (100% = one thread blocked throughout)\n",
        "\n",
        class_table(lists:sublist(Classes, ?CLASS_ROWS)),
        "\n",
        lock_table(lists:sublist(Locks, ?LOCK_ROWS)),
        table_lines(Tables)
    ].

%%%===================================================================
%%% Internal
%%%===================================================================

-spec class_table([beamdiag_lock_data:class_total()]) -> iolist().
class_table([]) ->
    "No lock was taken in the window.\n";
class_table(Classes) ->
    [
        io_lib:format("~-24s ~7s ~12s ~7s ~10s ~7s~n",
                      ["By class", "locks", "tries", "coll%", "wait ms", "wait%"]),
        [
            io_lib:format("~-24ts ~7b ~12b ~7.2f ~10.1f ~7.2f~n", [
                cut(C, 24), maps:get(locks, R, 0), T, float(CP), W / 1.0e6, float(WP)
            ])
         || R = #{class := C, tries := T, collision_pct := CP, wait_ns := W, wait_pct := WP} <-
                Classes
        ]
    ].

-spec lock_table([beamdiag_lock_data:lock_entry()]) -> iolist().
lock_table([]) ->
    "No lock was contended in the window.\n";
lock_table(Locks) ->
    [
        io_lib:format("~-16s ~-22s ~11s ~6s ~7s ~11s~n",
                      ["Top locks", "id", "tries", "coll%", "wait%", "p50/p90"]),
        [
            [
                io_lib:format("~-16ts ~-22ts ~11b ~6.2f ~7.2f ~11ts~n", [
                    cut(C, 16), cut(Id, 22), T, float(CP), float(WP),
                    [ns(maps:get(p50_wait_ns, L, 0)), "/", ns(maps:get(p90_wait_ns, L, 0))]
                ]),
                case maps:get(locations, L, []) of
                    [#{location := Loc} | _] -> ["    at ", cut(Loc, 60), instances(L), "\n"];
                    [] -> ""
                end
            ]
         || L = #{class := C, id := Id, tries := T, collision_pct := CP, wait_pct := WP} <- Locks
        ]
    ].

-spec instances(beamdiag_lock_data:lock_entry()) -> iolist().
instances(#{instances := N}) when N > 1 -> io_lib:format(" (~b locks)", [N]);
instances(_) -> "".

-spec table_lines([beamdiag_lock_data:table()]) -> iolist().
table_lines([]) ->
    "";
table_lines(Tables) ->
    [
        "\nETS tables behind the hottest table locks\n",
        [
            [
                "  ", cut(N, 30), "  owner ", cut(maps:get(owner, T, <<"?">>), 30), "\n",
                wrap([
                    [atom_to_binary(K), "=", V]
                 || K <- [type, protection, write_concurrency, read_concurrency,
                          decentralized_counters],
                    {ok, V} <- [maps:find(K, T)]
                ], "    ", 78)
            ]
         || T = #{name := N} <- Tables
        ]
    ].

%% Words on lines of at most Width columns, each line indented.
-spec wrap([iodata()], string(), pos_integer()) -> iolist().
wrap([], _Indent, _Width) ->
    "";
wrap(Words, Indent, Width) ->
    {Lines, Last} = lists:foldl(
        fun(W, {Done, Cur}) ->
            Wl = string:length(unicode:characters_to_list(W)),
            Cl = string:length(unicode:characters_to_list(Cur)),
            case Cur of
                [] -> {Done, [Indent, W]};
                _ when Cl + 1 + Wl > Width -> {[Cur | Done], [Indent, W]};
                _ -> {Done, [Cur, " ", W]}
            end
        end,
        {[], []},
        Words
    ),
    [[L, "\n"] || L <- lists:reverse([Last | Lines])].

%% A histogram bucket edge in ns as a short duration.
-spec ns(non_neg_integer()) -> iolist().
ns(0) -> "-";
ns(N) when N < 1000 -> [integer_to_list(N), "ns"];
ns(N) when N < 1000000 -> [integer_to_list(N div 1000), "us"];
ns(N) when N < 1000000000 -> [integer_to_list(N div 1000000), "ms"];
ns(N) -> [integer_to_list(N div 1000000000), "s"].

%% Names from the target (lock classes and ids, locations, tables) as one
%% printable line (invalid UTF-8 and control characters as '?'), cut.
-spec cut(term(), pos_integer()) -> unicode:chardata().
cut(T, Max) ->
    beamdiag_safe_text:cut(T, Max, "~").
