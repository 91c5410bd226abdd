%%% @doc JIT perf maps (`/tmp/perf-PID.map', lines `START SIZE NAME' in
%%% hex) read by the folder itself, to name the JIT addresses perf left
%%% `[unknown]', and the ones perf named after code that is gone: loading
%%% one into a sorted tuple and finding the entry that holds an address.
%%%
%%% The map only grows: a module purged keeps its lines, and the JIT may
%%% put a module loaded later where its code was (an Elixir script's
%%% `elixir_compiler_1', purged once it has defined the script's modules,
%%% under `Shop.Pricing'). Where entries overlap, the later line is the
%%% code there now: `lookup/2' gives it, and `stale/2' says which names
%%% a later line covers, so that a frame perf named by one is named again
%%% by its address.
%%%
%%% ```
%%% 1> {ok, M} = beamdiag_fold_perf_map:load("/tmp/perf-4711.map").
%%% 2> beamdiag_fold_perf_map:lookup(M, 16#7f0100).
%%% <<"$lists:foldl/3">>
%%% '''
-module(beamdiag_fold_perf_map).

-export([load/1, lookup/2, stale/2]).

-export_type([entries/0]).

%% {Entries, Reach, Stale}: the {Start, Size, Name, Line} entries sorted
%% by start; Reach, for each position, the furthest end of the entries up
%% to it (so that a search walks back only over entries that reach an
%% address); Stale, the names a later line covers, in part or whole.
-type entries() :: {tuple(), tuple(), #{binary() => true}}.

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Reads a perf map; `undefined' is no map.
-spec load(file:filename_all() | undefined) ->
    {ok, entries() | undefined} | {error, {beamdiag_fold, {perf_map, file:filename_all(), term()}}}.
load(undefined) ->
    {ok, undefined};
load(Path) ->
    case file:read_file(Path) of
        {ok, Bin} ->
            Lines = binary:split(Bin, <<"\n">>, [global]),
            Numbered = lists:zip(lists:seq(1, length(Lines)), Lines),
            Entries = list_to_tuple(lists:keysort(1, lists:filtermap(fun map_line/1, Numbered))),
            Reach = reach(Entries),
            {ok, {Entries, Reach, stale_names(Entries, Reach)}};
        {error, Why} ->
            {error, {beamdiag_fold, {perf_map, Path, Why}}}
    end.

%% @doc The name of the latest entry that holds an address, or `none'.
-spec lookup(entries(), non_neg_integer()) -> binary() | none.
lookup({Entries, Reach, _}, A) ->
    case last_at_or_before(Entries, A, 1, tuple_size(Entries), 0) of
        0 -> none;
        I -> case holders(Entries, Reach, A, I, none) of
                 none -> none;
                 {_, Name} -> Name
             end
    end.

%% @doc Whether a later line of the map covers an entry of this name: a
%% frame perf named so may hold code loaded since, named by its address.
-spec stale(entries(), binary()) -> boolean().
stale({_, _, Stale}, Name) ->
    is_map_key(Name, Stale).

%%%===================================================================
%%% Internal
%%%===================================================================

%% The position of the last entry that starts at or before A, 0 if none.
last_at_or_before(_Entries, _A, Lo, Hi, Best) when Lo > Hi ->
    Best;
last_at_or_before(Entries, A, Lo, Hi, Best) ->
    Mid = (Lo + Hi) div 2,
    case element(1, element(Mid, Entries)) =< A of
        true -> last_at_or_before(Entries, A, Mid + 1, Hi, Mid);
        false -> last_at_or_before(Entries, A, Lo, Mid - 1, Best)
    end.

%% The latest line among the entries at or before position I that hold A,
%% walking back while an entry that far back can still reach A.
holders(_Entries, _Reach, _A, 0, Best) ->
    Best;
holders(Entries, Reach, A, I, Best) ->
    case element(I, Reach) > A of
        false ->
            Best;
        true ->
            {Start, Size, Name, Line} = element(I, Entries),
            Best1 = case A >= Start andalso A < Start + Size of
                        true when Best =:= none -> {Line, Name};
                        true when Line > element(1, Best) -> {Line, Name};
                        _ -> Best
                    end,
            holders(Entries, Reach, A, I - 1, Best1)
    end.

reach(Entries) ->
    {Ends, _} = lists:mapfoldl(fun({Start, Size, _, _}, Max) ->
                                       M = max(Max, Start + Size),
                                       {M, M}
                               end, 0, tuple_to_list(Entries)),
    list_to_tuple(Ends).

%% The names of the entries that a later line overlaps: each entry is
%% compared with the earlier-starting ones that reach into it.
stale_names(Entries, Reach) ->
    lists:foldl(fun(I, Acc) ->
                        {Start, _, Name, Line} = element(I, Entries),
                        overlapped(Entries, Reach, Start, Name, Line, I - 1, Acc)
                end, #{}, lists:seq(2, tuple_size(Entries))).

overlapped(_Entries, _Reach, _Start, _Name, _Line, 0, Acc) ->
    Acc;
overlapped(Entries, Reach, Start, Name, Line, J, Acc) ->
    case element(J, Reach) > Start of
        false ->
            Acc;
        true ->
            {S, Size, N, L} = element(J, Entries),
            Acc1 = case S + Size > Start of
                       true when L < Line -> Acc#{N => true};
                       true -> Acc#{Name => true};
                       false -> Acc
                   end,
            overlapped(Entries, Reach, Start, Name, Line, J - 1, Acc1)
    end.

map_line({N, Line}) ->
    case binary:split(Line, <<" ">>, [global]) of
        [A, S | NameParts] when NameParts =/= [] ->
            try
                Name = iolist_to_binary(lists:join(<<" ">>, NameParts)),
                {true, {hex(A), hex(S), beamdiag_fold_frame:sanitize(Name), N}}
            catch
                error:badarg -> false
            end;
        _ ->
            false
    end.

hex(<<"0x", H/binary>>) -> binary_to_integer(H, 16);
hex(H) -> binary_to_integer(H, 16).
