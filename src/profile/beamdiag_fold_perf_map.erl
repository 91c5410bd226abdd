%%% @doc JIT perf maps (`/tmp/perf-PID.map', lines `START SIZE NAME' in
%%% hex) read by the folder itself, to name the JIT addresses perf left
%%% `[unknown]': loading one into a sorted tuple and finding the entry that
%%% holds an address.
%%%
%%% ```
%%% 1> {ok, M} = beamdiag_fold_perf_map:load("/tmp/perf-4711.map").
%%% 2> beamdiag_fold_perf_map:lookup(M, 16#7f0100).
%%% <<"$lists:foldl/3">>
%%% '''
-module(beamdiag_fold_perf_map).

-export([load/1, lookup/2]).

-export_type([entries/0]).

%% {Start, Size, Name} entries sorted by start.
-type entries() :: tuple().

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
            Entries = lists:filtermap(fun map_line/1, binary:split(Bin, <<"\n">>, [global])),
            {ok, list_to_tuple(lists:keysort(1, Entries))};
        {error, Why} ->
            {error, {beamdiag_fold, {perf_map, Path, Why}}}
    end.

%% @doc The name of the entry that holds an address, or `none'.
-spec lookup(entries(), non_neg_integer()) -> binary() | none.
lookup(Map, A) ->
    lookup(Map, A, 1, tuple_size(Map)).

%%%===================================================================
%%% Internal
%%%===================================================================

lookup(_Map, _A, Lo, Hi) when Lo > Hi ->
    none;
lookup(Map, A, Lo, Hi) ->
    Mid = (Lo + Hi) div 2,
    {Start, Size, Name} = element(Mid, Map),
    if
        A < Start -> lookup(Map, A, Lo, Mid - 1);
        A >= Start + Size -> lookup(Map, A, Mid + 1, Hi);
        true -> Name
    end.

map_line(Line) ->
    case binary:split(Line, <<" ">>, [global]) of
        [A, S | NameParts] when NameParts =/= [] ->
            try
                Name = iolist_to_binary(lists:join(<<" ">>, NameParts)),
                {true, {hex(A), hex(S), beamdiag_fold_frame:sanitize(Name)}}
            catch
                error:badarg -> false
            end;
        _ ->
            false
    end.

hex(<<"0x", H/binary>>) -> binary_to_integer(H, 16);
hex(H) -> binary_to_integer(H, 16).
