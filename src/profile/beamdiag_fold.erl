%%% @doc Folds `perf script' text into folded stacks: the API, its options
%%% and its errors.
%%%
%%% A folded stack is one line `root;...;leaf COUNT', the format
%%% flamegraph.pl, inferno and speedscope read. The first frame of every
%%% stack is the thread type the sample came from, with thread numbers
%%% removed (`scheduler', `dirty_cpu', `dirty_io', `aux', `poll', ...), so
%%% all schedulers add up in one tower.
%%%
%%% The work is done by:
%%% <ul>
%%% <li>`beamdiag_fold_chunks': reading the text in large chunks, cutting
%%%   them at sample boundaries, folding them in parallel workers;</li>
%%% <li>`beamdiag_fold_worker': one worker, folding and counting samples;</li>
%%% <li>`beamdiag_fold_header': a sample's header line and its thread type;</li>
%%% <li>`beamdiag_fold_frame': frame names and kinds;</li>
%%% <li>`beamdiag_fold_stacks': numbering distinct stacks and counting
%%%   samples, within a worker;</li>
%%% <li>`beamdiag_fold_perf_map': naming `[unknown]' JIT addresses from a
%%%   JIT perf map (`perf_map' option);</li>
%%% <li>`beamdiag_fold_profile': the profile, its folded text, its summary
%%%   and top tables.</li>
%%% </ul>
%%% The folder never creates atoms from its input; lines that are not perf
%%% output are skipped and counted, over-long lines are skipped and
%%% counted, and the number of distinct stacks is bounded.
%%%
%%% ```
%%% 1> {ok, P} = beamdiag_fold:fold_file("perf.txt", #{}).
%%% 2> maps:get(unknown_share, beamdiag_fold:summary(P)).
%%% 0.004
%%% 3> file:write_file("profile.folded", beamdiag_fold:to_iolist(P)).
%%% '''
-module(beamdiag_fold).

-export([
    fold_file/2,
    fold_binary/2,
    to_iolist/1,
    summary/1,
    top/2,
    format_top/2,
    frame_kind/1,
    frame_stats/1,
    merge/2,
    from_counts/1,
    format_error/1
]).
%% Called as Module:format_error/1 on an {error, {Module, Reason}} value.
-ignore_xref([{format_error, 1}]).
%% Called by the tests only.
-ifdef(TEST).
-export([thread_type/1]).
-endif.

-export_type([profile/0, stack/0, options/0, settled/0, top_row/0, frame_kind/0]).

%% Root-first list of frames; the first element is the thread type.
-type stack() :: [binary()].
-type profile() :: #{
    stacks := #{stack() => pos_integer()},
    samples := non_neg_integer(),
    unknown_samples := non_neg_integer(),
    truncated_samples := non_neg_integer(),
    skipped_lines := non_neg_integer(),
    huge_lines := non_neg_integer(),
    overflow_samples := non_neg_integer(),
    bytes := non_neg_integer()
}.
-type options() :: #{
    workers => pos_integer(),
    chunk_size => pos_integer(),
    max_stacks => pos_integer(),
    max_line => pos_integer(),
    unknown => keep | cut,
    perf_map => file:filename_all() | undefined,
    thread_types => all | [binary()]
}.
%% The options as options/1 settles them (every key, the worker count
%% decided, the perf map read), for beamdiag_fold_chunks and its workers;
%% `heap' is the chunks' choice for input of one chunk or less.
-type settled() :: #{
    workers := pos_integer(),
    chunk_size := pos_integer(),
    max_stacks := pos_integer(),
    max_line := pos_integer(),
    unknown := keep | cut,
    perf_map := beamdiag_fold_perf_map:entries() | undefined,
    thread_types := all | [binary()],
    heap => small
}.
-type frame_kind() :: erlang | native | kernel | unnamed_jit | unnamed_native | unknown.
-type top_row() :: #{
    name := binary(),
    kind := frame_kind(),
    self := non_neg_integer(),
    total := non_neg_integer(),
    self_share := float(),
    total_share := float()
}.

-define(DEFAULTS, #{
    workers => undefined,
    chunk_size => 384 * 1024,
    max_stacks => 200000,
    max_line => 16384,
    unknown => keep,
    perf_map => undefined,
    thread_types => all
}).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Folds a `perf script' text file, streaming it in large chunks.
-spec fold_file(file:filename_all(), options()) -> {ok, profile()} | {error, {?MODULE, term()}}.
fold_file(Path, Opts0) ->
    case options(Opts0) of
        {ok, Opts} -> beamdiag_fold_chunks:file(Path, Opts);
        {error, _} = E -> E
    end.

%% @doc Folds `perf script' text held in memory.
-spec fold_binary(binary(), options()) -> {ok, profile()} | {error, {?MODULE, term()}}.
fold_binary(Bin, Opts0) when is_binary(Bin) ->
    case options(Opts0) of
        {ok, Opts} -> beamdiag_fold_chunks:binary(Bin, Opts);
        {error, _} = E -> E
    end.

%% @doc A profile from stacks counted elsewhere (the Erlang-level sampler).
-spec from_counts(#{stack() => pos_integer()}) -> profile().
from_counts(Stacks) ->
    beamdiag_fold_profile:from_counts(Stacks).

%% @doc Adds two profiles.
-spec merge(profile(), profile()) -> profile().
merge(A, B) ->
    beamdiag_fold_profile:merge(A, B).

%% @doc The folded text: one `frame;frame;frame count' line per stack,
%% most frequent first.
-spec to_iolist(profile()) -> iolist().
to_iolist(P) ->
    beamdiag_fold_profile:to_iolist(P).

%% @doc What the stacks show (`beamdiag_fold_profile:frame_stats/1').
-spec frame_stats(profile() | #{stacks := #{stack() => pos_integer()}}) ->
    #{samples | erlang | unnamed_jit | unnamed_native | unplaced | unknown | cut_short =>
          non_neg_integer()}.
frame_stats(P) ->
    beamdiag_fold_profile:frame_stats(P).

%% @doc Sample counts and shares of what the stacks show
%% (`beamdiag_fold_profile:summary/1').
-spec summary(profile()) -> #{atom() => number()}.
summary(P) ->
    beamdiag_fold_profile:summary(P).

%% @doc The functions with the largest total share
%% (`beamdiag_fold_profile:top/2').
-spec top(profile(), #{kind => erlang | native | all, limit => pos_integer()}) -> [top_row()].
top(P, Opts) ->
    beamdiag_fold_profile:top(P, Opts).

%% @doc A top table as text.
-spec format_top(string() | binary(), [top_row()]) -> unicode:chardata().
format_top(Title, Rows) ->
    beamdiag_fold_profile:format_top(Title, Rows).

-ifdef(TEST).
%% @doc The thread type of a perf `comm' (thread name), numbers removed:
%% `1_scheduler' and `erts_sched_1' are both `<<"scheduler">>'.
-spec thread_type(binary()) -> binary().
thread_type(Comm) ->
    beamdiag_fold_header:thread_type(Comm).
-endif.

%% @doc What a frame name is (`beamdiag_fold_frame:kind/1').
-spec frame_kind(binary()) -> frame_kind().
frame_kind(F) ->
    beamdiag_fold_frame:kind(F).

%% @doc Turns an error reason into a sentence.
-spec format_error(term()) -> iolist().
format_error({open, Path, Why}) ->
    io_lib:format("cannot open ~ts: ~ts", [Path, file:format_error(Why)]);
format_error({read, Why}) ->
    io_lib:format("reading the perf script text failed: ~p", [Why]);
format_error({bad_option, K, V}) ->
    io_lib:format("bad fold option ~p => ~p", [K, V]);
format_error({perf_map, Path, Why}) ->
    io_lib:format("cannot read the perf map ~ts: ~ts", [Path, file:format_error(Why)]);
format_error({worker, Reason}) ->
    io_lib:format("a fold worker failed: ~p", [Reason]);
format_error(not_perf_output) ->
    "the input holds no perf script samples".

%%%===================================================================
%%% Internal
%%%===================================================================

%% The options with their defaults, the worker count settled and the perf
%% map read.
-spec options(options()) -> {ok, settled()} | {error, {?MODULE, term()}}.
options(Opts) when is_map(Opts) ->
    case maps:keys(maps:without(maps:keys(?DEFAULTS), Opts)) of
        [K | _] ->
            {error, {?MODULE, {bad_option, K, maps:get(K, Opts)}}};
        [] ->
            O = maps:merge(?DEFAULTS, Opts),
            W = case maps:get(workers, O) of
                undefined -> min(8, erlang:system_info(schedulers_online));
                N -> N
            end,
            case beamdiag_fold_perf_map:load(maps:get(perf_map, O)) of
                {ok, Map} -> {ok, O#{workers := W, perf_map := Map}};
                {error, _} = E -> E
            end
    end.
