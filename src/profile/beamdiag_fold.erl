%%% @doc Folds `perf script' text into folded stacks.
%%%
%%% A folded stack is one line `root;...;leaf COUNT', the format
%%% flamegraph.pl, inferno and speedscope read. The first frame of every
%%% stack is the thread type the sample came from, with thread numbers
%%% removed (`scheduler', `dirty_cpu', `dirty_io', `aux', `poll', ...), so
%%% all schedulers add up in one tower.
%%%
%%% The folder reads its input in large chunks, cuts them at sample
%%% boundaries and folds the chunks in parallel, one worker per online
%%% scheduler (at most 8 by default), each with a 16 MiB young heap so that
%%% the per-chunk garbage does not make it collect its caches over and
%%% over. It never creates atoms from its input; lines that are not perf
%%% output are skipped and counted, over-long lines are skipped and
%%% counted, and the number of distinct stacks is bounded.
%%%
%%% Frame names: the symbol without its `+0x..' offset; a symbol perf
%%% could not name but whose object it knows becomes `[object]' (for
%%% example `[beam.smp]' for a static function of a stripped emulator);
%%% only an address perf could place nowhere is `[unknown]', and a run of
%%% such frames (a frame-pointer walk through heap data) is one frame. The
%%% end-of-unwind marker that DWARF unwinding leaves (address
%%% `ffffffffffffffff' or `0') is dropped and counted as a truncated
%%% stack. With `perf_map' the folder resolves `[unknown]' addresses
%%% against a JIT perf map (`/tmp/perf-PID.map') itself.
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

-export_type([profile/0, stack/0, options/0, top_row/0, frame_kind/0]).

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
    chunk_size => 4 * 1024 * 1024,
    max_stacks => 200000,
    max_line => 16384,
    unknown => keep,
    perf_map => undefined,
    thread_types => all
}).
-define(CACHE_MAX, 100000).
-define(BLOCKS_MAX, 20000).
%% Words: 16 MiB on a 64-bit emulator, per worker (at most 8 by default).
-define(WORKER_HEAP, 2 * 1024 * 1024).
-define(TAIL, 262144).
-define(UNKNOWN, <<"[unknown]">>).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Folds a `perf script' text file, streaming it in large chunks.
-spec fold_file(file:filename_all(), options()) -> {ok, profile()} | {error, {?MODULE, term()}}.
fold_file(Path, Opts0) ->
    case options(Opts0) of
        {ok, Opts} ->
            case file:open(Path, [read, raw, binary]) of
                {ok, Fd} ->
                    try
                        run(file_reader(Fd), small(filelib:file_size(Path), Opts))
                    after
                        ok = file:close(Fd)
                    end;
                {error, Why} ->
                    {error, {?MODULE, {open, Path, Why}}}
            end;
        {error, _} = E ->
            E
    end.

%% @doc Folds `perf script' text held in memory.
-spec fold_binary(binary(), options()) -> {ok, profile()} | {error, {?MODULE, term()}}.
fold_binary(Bin, Opts0) when is_binary(Bin) ->
    case options(Opts0) of
        {ok, Opts} ->
            run(binary_reader(Bin, 0), small(byte_size(Bin), Opts));
        {error, _} = E ->
            E
    end.

%% @doc A profile from stacks counted elsewhere (the Erlang-level sampler).
-spec from_counts(#{stack() => pos_integer()}) -> profile().
from_counts(Stacks) ->
    Samples = lists:sum(maps:values(Stacks)),
    Unknown = lists:sum([C || {S, C} <- maps:to_list(Stacks), lists:member(?UNKNOWN, S)]),
    (empty())#{stacks := Stacks, samples := Samples, unknown_samples := Unknown}.

%% @doc Adds two profiles.
-spec merge(profile(), profile()) -> profile().
merge(A, B) ->
    maps:fold(
        fun
            (stacks, SB, Acc = #{stacks := SA}) ->
                Acc#{stacks := add_counts(SB, SA)};
            (K, V, Acc) when is_integer(V) ->
                Acc#{K := maps:get(K, Acc, 0) + V};
            (_, _, Acc) ->
                Acc
        end,
        A,
        B
    ).

%% @doc The folded text: one `frame;frame;frame count' line per stack,
%% most frequent first.
-spec to_iolist(profile()) -> iolist().
to_iolist(#{stacks := Stacks}) ->
    Sorted = lists:sort(fun({_, A}, {_, B}) -> A >= B end, maps:to_list(Stacks)),
    [[lists:join($;, S), $\s, integer_to_binary(C), $\n] || {S, C} <- Sorted].

%% @doc What the stacks show, counted from the folded stacks themselves
%% (so `profile.folded' gives the same figures): samples whose stack holds
%% an Erlang function, an unnamed JIT frame, an unnamed native frame, an
%% address perf could place nowhere, a frame perf called `[unknown]' (the
%% last two kinds together), and samples whose stack the unwinder cut short:
%% no Erlang function on it and its root-most frame not a thread's entry.
%% `[other stacks]' (the stack bound) counts in none of them.
-spec frame_stats(profile() | #{stacks := #{stack() => pos_integer()}}) ->
    #{samples | erlang | unnamed_jit | unnamed_native | unplaced | unknown | cut_short =>
          non_neg_integer()}.
frame_stats(#{stacks := Stacks}) ->
    Zero = #{samples => 0, erlang => 0, unnamed_jit => 0, unnamed_native => 0, unplaced => 0,
             unknown => 0, cut_short => 0},
    maps:fold(fun(Stack, C, Acc) -> stack_stats(Stack, C, Acc) end, Zero, Stacks).

stack_stats([_Type | Frames], C, Acc) ->
    Kinds = lists:usort([frame_kind(F) || F <- Frames, F =/= <<"[other stacks]">>]),
    Has = fun(K) -> lists:member(K, Kinds) end,
    Erlang = Has(erlang),
    Cut = Frames =/= [<<"[other stacks]">>] andalso not Erlang andalso not thread_root(Frames),
    Add = fun(K, true, A) -> A#{K := maps:get(K, A) + C};
             (_, false, A) -> A
          end,
    lists:foldl(fun({K, B}, A) -> Add(K, B, A) end, Acc,
                [{samples, true}, {erlang, Erlang}, {unnamed_jit, Has(unnamed_jit)},
                 {unnamed_native, Has(unnamed_native)}, {unplaced, Has(unknown)},
                 {unknown, Has(unknown) orelse Has(unnamed_jit)}, {cut_short, Cut}]);
stack_stats([], _C, Acc) ->
    Acc.

%% The root-most frame is where a thread starts: libc's thread entry, the
%% program's entry, or the scheduler's loop in JIT code (below it there is
%% only the emulator's thread start).
thread_root([]) -> false;
thread_root([Root | _]) ->
    lists:member(Root, [<<"clone">>, <<"clone3">>, <<"__clone">>, <<"__clone3">>,
                        <<"start_thread">>, <<"thread_start">>, <<"_start">>,
                        <<"__libc_start_main">>, <<"__libc_start_call_main">>,
                        <<"$global::process_main">>, <<"process_main">>]).

%% @doc Sample counts and shares of what the stacks show (`frame_stats/1'):
%% `erlang_share', `unnamed_jit_share', `unnamed_native_share',
%% `unplaced_share', `unknown_share' (a frame perf called `[unknown]'),
%% `cut_short_share' (also as `truncated_share').
-spec summary(profile()) -> #{atom() => number()}.
summary(P = #{samples := N}) ->
    FS = frame_stats(P),
    Types = maps:fold(
        fun([Type | _], C, Acc) -> maps:update_with(Type, fun(X) -> X + C end, C, Acc);
           ([], _, Acc) -> Acc
        end,
        #{},
        maps:get(stacks, P)
    ),
    #{erlang := E, unnamed_jit := J, unnamed_native := Nat, unplaced := Pl, unknown := U} = FS,
    #{
        erlang_samples => E, erlang_share => share(E, N),
        unnamed_jit_samples => J, unnamed_jit_share => share(J, N),
        unnamed_native_samples => Nat, unnamed_native_share => share(Nat, N),
        unplaced_samples => Pl, unplaced_share => share(Pl, N),
        unknown_samples => U, unknown_share => share(U, N),
        cut_short_samples => maps:get(cut_short, FS),
        cut_short_share => share(maps:get(cut_short, FS), N),
        samples => N,
        truncated_samples => maps:get(cut_short, FS),
        truncated_share => share(maps:get(cut_short, FS), N),
        skipped_lines => maps:get(skipped_lines, P),
        huge_lines => maps:get(huge_lines, P),
        overflow_samples => maps:get(overflow_samples, P),
        distinct_stacks => map_size(maps:get(stacks, P)),
        thread_types => map_size(Types)
    }.

%% @doc The functions with the largest total share: self counts samples
%% where the function is the leaf, total counts samples where it appears
%% anywhere in the stack (once per sample). `Kind' is `erlang', `native'
%% or `all'; thread-type roots are left out.
-spec top(profile(), #{kind => erlang | native | all, limit => pos_integer()}) -> [top_row()].
top(#{stacks := Stacks, samples := N}, Opts) ->
    Kind = maps:get(kind, Opts, all),
    Limit = maps:get(limit, Opts, 20),
    {Self, Total} = maps:fold(
        fun
            ([_Type | Frames = [_ | _]], C, {S, T}) ->
                Leaf = lists:last(Frames),
                Uniq = lists:usort(Frames),
                {
                    maps:update_with(Leaf, fun(X) -> X + C end, C, S),
                    lists:foldl(fun(F, Acc) -> maps:update_with(F, fun(X) -> X + C end, C, Acc) end,
                                T, Uniq)
                };
            (_, _, Acc) ->
                Acc
        end,
        {#{}, #{}},
        Stacks
    ),
    Rows = [
        #{
            name => F,
            kind => K,
            self => maps:get(F, Self, 0),
            total => Tot,
            self_share => share(maps:get(F, Self, 0), N),
            total_share => share(Tot, N)
        }
     || {F, Tot} <- maps:to_list(Total),
        K <- [frame_kind(F)],
        Kind =:= all orelse K =:= Kind
    ],
    Sorted = lists:sort(
        fun(#{total := A, self := SA}, #{total := B, self := SB}) -> {A, SA} >= {B, SB} end, Rows),
    lists:sublist(Sorted, Limit).

%% @doc A top table as text.
-spec format_top(string() | binary(), [top_row()]) -> unicode:chardata().
format_top(Title, Rows) ->
    [
        Title, "\n",
        io_lib:format("  ~7s ~7s  ~s~n", ["self", "total", "function"]),
        [io_lib:format("  ~6.2f% ~6.2f%  ~ts~n", [100 * S, 100 * T, beamdiag_safe_text:safe(Name)])
         || #{self_share := S, total_share := T, name := Name} <- Rows]
    ].

%% @doc The thread type of a perf `comm' (thread name), numbers removed:
%% `1_scheduler' and `erts_sched_1' are both `<<"scheduler">>'.
-spec thread_type(binary()) -> binary().
thread_type(Comm) ->
    case strip_number(Comm) of
        <<"scheduler">> -> <<"scheduler">>;
        <<"sched">> -> <<"scheduler">>;
        <<"dirty_cpu_sch">> -> <<"dirty_cpu">>;
        <<"dcpus">> -> <<"dirty_cpu">>;
        <<"dirty_io_sche">> -> <<"dirty_io">>;
        <<"dirty_io_sch">> -> <<"dirty_io">>;
        <<"dios">> -> <<"dirty_io">>;
        <<"aux">> -> <<"aux">>;
        <<"poller">> -> <<"poll">>;
        <<"poll">> -> <<"poll">>;
        <<"async">> -> <<"async">>;
        <<"sys_sig_dispatc">> -> <<"sys_sig_dispatch">>;
        <<"ssig_disp">> -> <<"sys_sig_dispatch">>;
        <<"sys_msg_dispatc">> -> <<"sys_msg_dispatch">>;
        <<"smsg_disp">> -> <<"sys_msg_dispatch">>;
        <<"runq_sup">> -> <<"runq_supervisor">>;
        <<"beam.smp">> -> <<"main">>;
        Other -> sanitize(Other)
    end.

%% @doc What a frame name is: an Erlang function (`$lists:foldl/3' or
%% `lists:foldl/3'), a kernel or native function, JIT code perf could not
%% name (`[unknown] (/memfd:vmem (deleted))'), a native function of a known
%% object without a name (`[beam.smp]'), or an address perf could place
%% nowhere (`[unknown]').
-spec frame_kind(binary()) -> frame_kind().
frame_kind(?UNKNOWN) -> unknown;
frame_kind(<<"[unknown] (", _/binary>>) -> unnamed_jit;
frame_kind(<<"[no stack]">>) -> unknown;
frame_kind(<<"[other stacks]">>) -> unknown;
frame_kind(<<"[", _/binary>>) -> unnamed_native;
frame_kind(F) when byte_size(F) > 4, binary_part(F, byte_size(F), -4) =:= <<"_[k]">> -> kernel;
frame_kind(<<"$global::", _/binary>>) -> native;
frame_kind(<<"$", Rest/binary>>) -> erlang_or_native(Rest);
frame_kind(F) -> erlang_or_native(F).

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
%%% Internal: options and driver
%%%===================================================================

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
            case load_map(maps:get(perf_map, O)) of
                {ok, Map} -> {ok, O#{workers := W, perf_map := Map}};
                {error, _} = E -> E
            end
    end.

file_reader(Fd) ->
    fun(N) ->
        case file:read(Fd, N) of
            {ok, Data} -> {ok, Data, file_reader(Fd)};
            Other -> Other
        end
    end.

binary_reader(Bin, Pos) ->
    fun(N) ->
        case byte_size(Bin) - Pos of
            0 ->
                eof;
            Left ->
                Take = min(N, Left),
                {ok, binary:part(Bin, Pos, Take), binary_reader(Bin, Pos + Take)}
        end
    end.

%% Input of one chunk or less goes to one worker with an ordinary heap:
%% starting workers with 16 MiB heaps costs more than folding it.
small(Size, Opts = #{chunk_size := CS}) when Size =< CS ->
    Opts#{workers := 1, heap => small};
small(_Size, Opts) ->
    Opts.

run(Read, Opts = #{workers := W, chunk_size := CS}) ->
    Ctx = ctx(Opts),
    Parent = self(),
    %% A large young heap: each chunk makes lots of short-lived garbage,
    %% and the caches would otherwise be copied by frequent collections.
    Heap = case maps:get(heap, Opts, large) of
        large -> [{min_heap_size, ?WORKER_HEAP}, {min_bin_vheap_size, ?WORKER_HEAP}];
        small -> []
    end,
    Workers = [spawn_opt(fun() -> worker(Parent, Ctx) end, [monitor | Heap])
               || _ <- lists:seq(1, W)],
    Result =
        try
            feed(Read, CS, <<>>, Workers, Workers, #{}, 0, 0)
        catch
            throw:{fold_error, R} -> {error, {?MODULE, R}}
        end,
    case Result of
        {ok, Bytes, Huge0} ->
            Profiles = [collect(P, M) || {P, M} <- Workers],
            case [E || {error, E} <- Profiles] of
                [Why | _] ->
                    {error, {?MODULE, {worker, Why}}};
                [] ->
                    Merged = lists:foldl(fun merge/2, empty(), [P || {ok, P} <- Profiles]),
                    P2 = Merged#{bytes := Bytes, huge_lines := maps:get(huge_lines, Merged) + Huge0},
                    case P2 of
                        #{samples := 0} when Bytes > 0 -> {error, {?MODULE, not_perf_output}};
                        _ -> {ok, P2}
                    end
            end;
        {error, _} = E ->
            [begin erlang:demonitor(M, [flush]), exit(P, kill) end || {P, M} <- Workers],
            E
    end.

%% Reads chunks, cuts them at a sample boundary and hands them to the
%% workers round-robin, at most two chunks in flight per worker.
feed(Read, CS, Buf, [], All, InFlight, Bytes, Huge) ->
    feed(Read, CS, Buf, All, All, InFlight, Bytes, Huge);
feed(Read, CS, Buf, [W | Ws], All, InFlight, Bytes, Huge) ->
    case Read(CS) of
        {ok, Data, Read2} ->
            Buf2 = <<Buf/binary, Data/binary>>,
            case cut(Buf2) of
                {Chunk, Rest} ->
                    InFlight2 = send(W, Chunk, InFlight),
                    feed(Read2, CS, Rest, Ws, All, InFlight2, Bytes + byte_size(Data), Huge);
                none when byte_size(Buf2) > 4 * CS ->
                    %% No line end in a long stretch: binary junk or one
                    %% huge line; drop it.
                    feed(Read2, CS, <<>>, [W | Ws], All, InFlight, Bytes + byte_size(Data), Huge + 1);
                none ->
                    feed(Read2, CS, Buf2, [W | Ws], All, InFlight, Bytes + byte_size(Data), Huge)
            end;
        eof ->
            InFlight2 = case Buf of
                <<>> -> InFlight;
                _ -> send(W, Buf, InFlight)
            end,
            wait_all(InFlight2),
            {ok, Bytes, Huge};
        {error, Why} ->
            throw({fold_error, {read, Why}})
    end.

send({Pid, _} = W, Chunk, InFlight) ->
    N = maps:get(Pid, InFlight, 0),
    InFlight2 = case N >= 2 of
        true -> wait_ack(Pid, InFlight);
        false -> InFlight
    end,
    Pid ! {chunk, Chunk},
    _ = W,
    maps:update_with(Pid, fun(X) -> X + 1 end, 1, InFlight2).

wait_ack(Pid, InFlight) ->
    receive
        {ack, Pid} -> maps:update_with(Pid, fun(X) -> X - 1 end, InFlight);
        %% Only the workers' own monitors: the caller may monitor others.
        {'DOWN', _, process, P, Reason} when is_map_key(P, InFlight) ->
            throw({fold_error, {worker, Reason}})
    end.

wait_all(InFlight) ->
    maps:fold(fun(Pid, N, ok) -> wait_n(Pid, N) end, ok, InFlight).

wait_n(_Pid, 0) -> ok;
wait_n(Pid, N) ->
    receive
        {ack, Pid} -> wait_n(Pid, N - 1);
        {'DOWN', _, process, Pid, Reason} -> throw({fold_error, {worker, Reason}})
    end.

collect(Pid, Mon) ->
    Pid ! {done, self()},
    receive
        {profile, Pid, P} ->
            erlang:demonitor(Mon, [flush]),
            {ok, P};
        {'DOWN', Mon, process, Pid, Reason} ->
            {error, Reason}
    end.

%% Splits a buffer after its last sample boundary (a blank line) near its
%% end, or after its last line end when the text has no blank lines
%% (perf script without call chains).
cut(Buf) ->
    Size = byte_size(Buf),
    Tail = min(Size, ?TAIL),
    Scope = {Size - Tail, Tail},
    case binary:matches(Buf, <<"\n\n">>, [{scope, Scope}]) of
        [_ | _] = Ms ->
            {Pos, _} = lists:last(Ms),
            split_at(Buf, Pos + 2);
        [] ->
            case binary:matches(Buf, <<"\n\n">>) of
                [_ | _] = Ms ->
                    {Pos, _} = lists:last(Ms),
                    split_at(Buf, Pos + 2);
                [] ->
                    case binary:matches(Buf, <<"\n">>, [{scope, Scope}]) of
                        [_ | _] = Ms ->
                            {Pos, _} = lists:last(Ms),
                            split_at(Buf, Pos + 1);
                        [] ->
                            none
                    end
            end
    end.

split_at(Buf, Pos) ->
    <<Chunk:Pos/binary, Rest/binary>> = Buf,
    {Chunk, binary:copy(Rest)}.

%%%===================================================================
%%% Internal: the worker
%%%===================================================================

-record(ctx, {
    max_stacks :: pos_integer(),
    max_line :: pos_integer(),
    cut_unknown :: boolean(),
    perf_map :: tuple() | undefined,
    types :: all | [binary()],
    nl :: binary:cp()
}).

-record(st, {
    %% {Type, StackId} => samples; StackId numbers a distinct frame list
    %% (`ids'), so that counting a sample hashes two small terms, not the
    %% whole stack.
    stacks = #{} :: map(),
    ids = #{} :: map(),
    cache = #{} :: map(),
    blocks = #{} :: map(),
    comms = #{} :: map(),
    samples = 0 :: non_neg_integer(),
    unknown = 0 :: non_neg_integer(),
    truncated = 0 :: non_neg_integer(),
    skipped = 0 :: non_neg_integer(),
    huge = 0 :: non_neg_integer(),
    overflow = 0 :: non_neg_integer()
}).

ctx(#{max_stacks := MS, max_line := ML, unknown := U, perf_map := PM, thread_types := TT}) ->
    #ctx{
        max_stacks = MS,
        max_line = ML,
        cut_unknown = U =:= cut,
        perf_map = PM,
        types = TT,
        nl = binary:compile_pattern(<<"\n">>)
    }.

worker(Parent, Ctx) ->
    worker_loop(Parent, Ctx, #st{}).

worker_loop(Parent, Ctx, St) ->
    receive
        {chunk, Chunk} ->
            St2 = fold_chunk(Chunk, Ctx, St),
            Parent ! {ack, self()},
            worker_loop(Parent, Ctx, St2);
        {done, From} ->
            From ! {profile, self(), to_profile(St)}
    end.

to_profile(#st{stacks = S0, ids = Ids, samples = N, unknown = U, truncated = T, skipped = Sk,
               huge = H, overflow = O}) ->
    Frames = maps:from_list([{Id, F} || {F, Id} <- maps:to_list(Ids)]),
    S = maps:fold(fun({Type, Id}, C, Acc) -> Acc#{[Type | maps:get(Id, Frames)] => C} end,
                  #{}, S0),
    (empty())#{
        stacks := S,
        samples := N,
        unknown_samples := U,
        truncated_samples := T,
        skipped_lines := Sk,
        huge_lines := H,
        overflow_samples := O
    }.

empty() ->
    #{
        stacks => #{},
        samples => 0,
        unknown_samples => 0,
        truncated_samples => 0,
        skipped_lines => 0,
        huge_lines => 0,
        overflow_samples => 0,
        bytes => 0
    }.

%% Samples of perf script with call chains end in a blank line. Each
%% sample is a header line and a block of frame lines; the same block
%% (same addresses) recurs often, so blocks are cached whole and only new
%% blocks are parsed line by line. The chunk's line ends are found in one
%% pass (a blank line is two in a row), which is cheaper than searching
%% for the two-byte separator. Text without blank lines (no call chains,
%% or not perf output) goes line by line.
fold_chunk(Chunk, Ctx = #ctx{nl = NL}, St) ->
    samples(Chunk, 0, binary:matches(Chunk, NL), Ctx, St).

%% Ms: the positions of the chunk's line ends from Start on.
samples(Chunk, Start, Ms, Ctx = #ctx{nl = NL}, St) ->
    case blank(Ms, none) of
        {HeaderEnd, Blank, Rest} ->
            St2 = sample(Chunk, Start, HeaderEnd, Blank, Ctx, St),
            samples(Chunk, Blank + 2, Rest, Ctx, St2);
        none ->
            Tail = binary:part(Chunk, Start, byte_size(Chunk) - Start),
            lines(binary:split(Tail, NL, [global]), Ctx, St, none, [], false, false)
    end.

%% The first line end (the header's, `none' for a one-line sample), the
%% blank line's start and the line ends after it.
blank([{P, 1}, {Q, 1} | Rest], First) when Q =:= P + 1 ->
    {First, P, Rest};
blank([{P, 1} | Rest], none) ->
    blank(Rest, P);
blank([_ | Rest], First) ->
    blank(Rest, First);
blank([], _) ->
    none.

sample(Chunk, Start, HeaderEnd, Blank, Ctx = #ctx{max_line = Max}, St)
  when is_integer(HeaderEnd), HeaderEnd - Start =< Max ->
    Header = binary:part(Chunk, Start, HeaderEnd - Start),
    case Header of
        <<C, _/binary>> when C =/= $\t ->
            case header(Header) of
                {ok, Comm, <<>>} ->
                    {Type, St2} = type(Comm, Ctx, St),
                    block(Type, binary:part(Chunk, HeaderEnd + 1, Blank - HeaderEnd - 1), Ctx, St2);
                _ ->
                    sample_lines(binary:part(Chunk, Start, Blank - Start), Ctx, St)
            end;
        _ ->
            sample_lines(binary:part(Chunk, Start, Blank - Start), Ctx, St)
    end;
sample(Chunk, Start, _HeaderEnd, Blank, Ctx, St) ->
    sample_lines(binary:part(Chunk, Start, Blank - Start), Ctx, St).

sample_lines(Sample, Ctx = #ctx{nl = NL}, St) ->
    lines(binary:split(Sample, NL, [global]) ++ [<<>>], Ctx, St, none, [], false, false).

block(skip, _Block, _Ctx, St) ->
    St;
block(Type, Block, Ctx, St = #st{blocks = Blocks}) ->
    %% The key is the block's size and first line or so (the leaf's
    %% address); the whole block is compared only against the few cached
    %% blocks with that key, which is cheaper than hashing it.
    Key = {byte_size(Block), binary:part(Block, 0, min(byte_size(Block), 64))},
    Same = maps:get(Key, Blocks, []),
    case lists:keyfind(Block, 1, Same) of
        {_, Stack, Bad} ->
            count(Ctx, Type, Stack, St#st{skipped = St#st.skipped + Bad});
        false ->
            {Frames, U, T, Bad, St2} = block_lines(binary:split(Block, Ctx#ctx.nl, [global]),
                                                   Ctx, St, [], false, false, 0),
            {Stack, St3} = intern(Ctx, St2, Frames, U, T),
            %% Blocks with unknown frames rarely repeat: not cached.
            Blocks2 = case map_size(Blocks) < ?BLOCKS_MAX andalso not U andalso length(Same) < 4 of
                true -> Blocks#{Key => [{binary:copy(Block), Stack, Bad} | Same]};
                false -> Blocks
            end,
            count(Ctx, Type, Stack, St3#st{blocks = Blocks2, skipped = St3#st.skipped + Bad})
    end.

block_lines([], _Ctx, St, Frames, U, T, Bad) ->
    {Frames, U, T, Bad, St};
block_lines([Line | Rest], Ctx, St, Frames, U, T, Bad) when byte_size(Line) > Ctx#ctx.max_line ->
    block_lines(Rest, Ctx, St#st{huge = St#st.huge + 1}, Frames, U, T, Bad);
block_lines([Line | Rest], Ctx, St, Frames, U, T, Bad) ->
    {Frame, St2} = frame(Line, Ctx, St),
    case Frame of
        drop -> block_lines(Rest, Ctx, St2, Frames, U, true, Bad);
        junk -> block_lines(Rest, Ctx, St2, Frames, U, T, Bad + 1);
        ?UNKNOWN when hd(Frames) =:= ?UNKNOWN -> block_lines(Rest, Ctx, St2, Frames, true, T, Bad);
        ?UNKNOWN -> block_lines(Rest, Ctx, St2, [?UNKNOWN | Frames], true, T, Bad);
        _ -> block_lines(Rest, Ctx, St2, [Frame | Frames], U, T, Bad)
    end.

%% Sample state: Type (binary | none | skip), Frames (root-first), Unknown
%% and Truncated flags.
lines([], Ctx, St, Type, Frames, U, T) ->
    emit(Ctx, St, Type, Frames, U, T);
lines([<<>> | Rest], Ctx, St, Type, Frames, U, T) ->
    lines(Rest, Ctx, emit(Ctx, St, Type, Frames, U, T), none, [], false, false);
lines([Line | Rest], Ctx, St, Type, Frames, U, T) when byte_size(Line) > Ctx#ctx.max_line ->
    lines(Rest, Ctx, St#st{huge = St#st.huge + 1}, Type, Frames, U, T);
lines([<<$\s, _/binary>> = Line | Rest], Ctx, St, Type, Frames, U, T) ->
    %% Header lines of perf script without call chains start with the
    %% right-aligned thread name; call-chain lines of some versions start
    %% with spaces.
    case header(Line) of
        {ok, _, _} -> header_line(Line, Rest, Ctx, St, Type, Frames, U, T);
        error -> frame_line(Line, Rest, Ctx, St, Type, Frames, U, T)
    end;
lines([<<$\t, _/binary>> = Line | Rest], Ctx, St, Type, Frames, U, T) ->
    frame_line(Line, Rest, Ctx, St, Type, Frames, U, T);
lines([Line | Rest], Ctx, St, Type, Frames, U, T) ->
    header_line(Line, Rest, Ctx, St, Type, Frames, U, T).

frame_line(Line, Rest, Ctx, St, Type, Frames, U, T) ->
    case Type of
        none ->
            %% A frame line outside a sample.
            lines(Rest, Ctx, St#st{skipped = St#st.skipped + 1}, Type, Frames, U, T);
        skip ->
            lines(Rest, Ctx, St, Type, Frames, U, T);
        _ ->
            {Frame, St2} = frame(Line, Ctx, St),
            case Frame of
                drop -> lines(Rest, Ctx, St2, Type, Frames, U, true);
                junk -> lines(Rest, Ctx, St2#st{skipped = St2#st.skipped + 1}, Type, Frames, U, T);
                ?UNKNOWN when Frames =/= [], hd(Frames) =:= ?UNKNOWN ->
                    lines(Rest, Ctx, St2, Type, Frames, true, T);
                ?UNKNOWN -> lines(Rest, Ctx, St2, Type, [?UNKNOWN | Frames], true, T);
                _ -> lines(Rest, Ctx, St2, Type, [Frame | Frames], U, T)
            end
    end.

%% A header line; a previous sample without a blank line ends here.
header_line(Line, Rest, Ctx, St, Type, Frames, U, T) ->
    St1 = emit(Ctx, St, Type, Frames, U, T),
    case header(Line) of
        {ok, Comm, <<>>} ->
            {Ty, St2} = type(Comm, Ctx, St1),
            lines(Rest, Ctx, St2, Ty, [], false, false);
        {ok, Comm, Inline} ->
            %% perf script without call chains: the leaf on the header line.
            {Ty, St2} = type(Comm, Ctx, St1),
            {Frame, St3} = frame(Inline, Ctx, St2),
            case Frame of
                F when F =:= drop; F =:= junk ->
                    lines(Rest, Ctx, St3, Ty, [], false, false);
                ?UNKNOWN ->
                    lines(Rest, Ctx, St3, Ty, [?UNKNOWN], true, false);
                _ ->
                    lines(Rest, Ctx, St3, Ty, [Frame], false, false)
            end;
        error ->
            lines(Rest, Ctx, St1#st{skipped = St1#st.skipped + 1}, none, [], false, false)
    end.

emit(_Ctx, St, none, _, _, _) ->
    St;
emit(_Ctx, St, skip, _, _, _) ->
    St;
emit(Ctx, St, Type, Frames, U, T) ->
    {Stack, St2} = intern(Ctx, St, Frames, U, T),
    count(Ctx, Type, Stack, St2).

%% A sample's frames as they will be counted, numbered: `{Id, Unknown,
%% Truncated}', Id `overflow' past the bound on distinct stacks.
intern(#ctx{max_stacks = Max, cut_unknown = Cut}, St = #st{ids = Ids}, Frames0, U, T) ->
    {Frames, U1, T1} =
        case Frames0 of
            [] -> {[<<"[no stack]">>], U, T};
            _ when U, Cut ->
                Kept = cut_unknown(Frames0),
                {Kept, lists:member(?UNKNOWN, Kept), true};
            _ -> {Frames0, U, T}
        end,
    case Ids of
        #{Frames := Id} ->
            {{Id, U1, T1}, St};
        _ when map_size(Ids) < Max ->
            Id = map_size(Ids),
            {{Id, U1, T1}, St#st{ids = Ids#{Frames => Id}}};
        _ ->
            {{overflow, U1, T1}, St}
    end.

count(#ctx{max_stacks = Max}, Type, {Id, U, T}, St = #st{stacks = S, samples = N}) ->
    Key = {Type, Id},
    St2 = case S of
        #{Key := C} ->
            St#st{stacks = S#{Key := C + 1}};
        _ when Id =/= overflow, map_size(S) < Max ->
            St#st{stacks = S#{Key => 1}};
        _ ->
            overflow(Type, St)
    end,
    St3 = case U of
        true -> St2#st{unknown = St2#st.unknown + 1};
        false -> St2
    end,
    St4 = case T of
        true -> St3#st{truncated = St3#st.truncated + 1};
        false -> St3
    end,
    St4#st{samples = N + 1}.

%% Past the bound on distinct stacks, samples count as `[other stacks]'.
overflow(Type, St = #st{stacks = S, ids = Ids}) ->
    Other = [<<"[other stacks]">>],
    {Id, Ids2} = case Ids of
        #{Other := I} -> {I, Ids};
        _ -> {map_size(Ids), Ids#{Other => map_size(Ids)}}
    end,
    St#st{stacks = maps:update_with({Type, Id}, fun(X) -> X + 1 end, 1, S), ids = Ids2,
          overflow = St#st.overflow + 1}.

%% Keeps the frames leafwards of the last [unknown] frame (frames are
%% root-first): with frame-pointer unwinding everything rootwards of an
%% unknown frame is garbage.
cut_unknown(Frames) ->
    case lists:splitwith(fun(F) -> F =/= ?UNKNOWN end, lists:reverse(Frames)) of
        {[], _} -> [?UNKNOWN];
        {Leafward, _} -> lists:reverse(Leafward)
    end.

type(Comm, #ctx{types = Types}, St = #st{comms = Cs}) ->
    case Cs of
        #{Comm := Ty} ->
            {Ty, St};
        _ ->
            Ty0 = thread_type(Comm),
            Ty = case Types =:= all orelse lists:member(Ty0, Types) of
                true -> Ty0;
                false -> skip
            end,
            Cs2 = case map_size(Cs) < 10000 of
                true -> Cs#{binary:copy(Comm) => Ty};
                false -> Cs
            end,
            {Ty, St#st{comms = Cs2}}
    end.

frame(Line, Ctx, St) when byte_size(Line) > 21,
                          binary_part(Line, byte_size(Line), -21) =:= <<"[unknown] ([unknown])">> ->
    %% Addresses perf could place nowhere rarely repeat (frame-pointer
    %% chains through heap data): a quick look, no cache entry.
    {unknown_frame(skip_ws(Line), Ctx), St};
frame(Line, Ctx, St = #st{cache = Cache}) ->
    case Cache of
        #{Line := F} ->
            {F, St};
        _ ->
            F = parse_frame(Line, Ctx),
            Cache2 = case map_size(Cache) < ?CACHE_MAX of
                true -> Cache#{binary:copy(Line) => F};
                false -> Cache
            end,
            {F, St#st{cache = Cache2}}
    end.

unknown_frame(<<"ffffffffffffffff ", _/binary>>, _Ctx) ->
    drop;
unknown_frame(<<"0 ", _/binary>>, _Ctx) ->
    drop;
unknown_frame(_Line, #ctx{perf_map = undefined}) ->
    ?UNKNOWN;
unknown_frame(Line, Ctx) ->
    parse_frame(Line, Ctx).

%% "\t    7f96... sym+0x1f (dso)" -> frame name | drop | junk.
parse_frame(Line0, Ctx) ->
    Line = skip_ws(Line0),
    case binary:match(Line, <<" ">>) of
        nomatch ->
            junk;
        {Sp, 1} ->
            <<Addr:Sp/binary, " ", Rest/binary>> = Line,
            case is_hex(Addr) of
                false -> junk;
                true -> name(Addr, Rest, Ctx)
            end
    end.

name(Addr, Rest, Ctx) ->
    {Sym0, Dso} = split_dso(Rest),
    Sym = strip_offset(Sym0),
    case Sym of
        ?UNKNOWN when Dso =:= ?UNKNOWN; Dso =:= <<>> ->
            case Addr of
                <<"ffffffffffffffff">> -> drop;
                <<"0">> -> drop;
                _ -> resolve(Addr, Ctx)
            end;
        ?UNKNOWN ->
            case jit_object(Dso) of
                true ->
                    %% JIT code perf could not name: the perf map perf
                    %% could not read (a container's /tmp), or no map.
                    case resolve(Addr, Ctx) of
                        ?UNKNOWN -> <<"[unknown] (", (sanitize(Dso))/binary, ")">>;
                        Name -> Name
                    end;
                false ->
                    <<"[", (basename(Dso))/binary, "]">>
            end;
        <<>> ->
            junk;
        _ when Dso =:= <<"[kernel.kallsyms]">> ->
            <<(sanitize(Sym))/binary, "_[k]">>;
        _ ->
            sanitize(Sym)
    end.

resolve(_Addr, #ctx{perf_map = undefined}) ->
    ?UNKNOWN;
resolve(Addr, #ctx{perf_map = Map}) ->
    A = binary_to_integer(Addr, 16),
    case lookup(Map, A, 1, tuple_size(Map)) of
        none -> ?UNKNOWN;
        Name -> Name
    end.

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

load_map(undefined) ->
    {ok, undefined};
load_map(Path) ->
    case file:read_file(Path) of
        {ok, Bin} ->
            Entries = lists:filtermap(fun map_line/1, binary:split(Bin, <<"\n">>, [global])),
            {ok, list_to_tuple(lists:keysort(1, Entries))};
        {error, Why} ->
            {error, {?MODULE, {perf_map, Path, Why}}}
    end.

map_line(Line) ->
    case binary:split(Line, <<" ">>, [global]) of
        [A, S | NameParts] when NameParts =/= [] ->
            try
                {true, {hex(A), hex(S), sanitize(iolist_to_binary(lists:join(<<" ">>, NameParts)))}}
            catch
                error:badarg -> false
            end;
        _ ->
            false
    end.

hex(<<"0x", H/binary>>) -> binary_to_integer(H, 16);
hex(H) -> binary_to_integer(H, 16).

%% "sym+0x1f (dso)" -> {"sym+0x1f", "dso"}. The object is the last
%% parenthesised group, read from the end with the parentheses balanced:
%% "[unknown] (/memfd:vmem (deleted))" is {"[unknown]", "/memfd:vmem (deleted)"}.
split_dso(Rest) ->
    N = byte_size(Rest),
    case N > 0 andalso binary:last(Rest) =:= $) of
        false -> {Rest, <<>>};
        true ->
            case open_paren(Rest, N - 2, 0) of
                Pos when is_integer(Pos), Pos >= 1 ->
                    case binary:at(Rest, Pos - 1) of
                        $\s ->
                            {binary:part(Rest, 0, Pos - 1), binary:part(Rest, Pos + 1, N - Pos - 2)};
                        _ ->
                            {Rest, <<>>}
                    end;
                _ ->
                    {Rest, <<>>}
            end
    end.

open_paren(_Bin, I, _Depth) when I < 0 -> none;
open_paren(Bin, I, Depth) ->
    case binary:at(Bin, I) of
        $) -> open_paren(Bin, I - 1, Depth + 1);
        $( when Depth =:= 0 -> I;
        $( -> open_paren(Bin, I - 1, Depth - 1);
        _ -> open_paren(Bin, I - 1, Depth)
    end.

%% Objects that hold JIT code: the JIT's memfd mapping (OTP 26+ with
%% +JMsingle), anonymous executable memory, a perf map perf named but could
%% not read, a perf inject --jit object.
jit_object(<<"/memfd:", _/binary>>) -> true;
jit_object(<<"//anon", _/binary>>) -> true;
jit_object(<<"[anon", _/binary>>) -> true;
jit_object(Dso) ->
    Base = basename(Dso),
    (binary:longest_common_prefix([Base, <<"perf-">>]) =:= 5 andalso
         binary:longest_common_suffix([Base, <<".map">>]) =:= 4)
        orelse binary:longest_common_prefix([Base, <<"jitted-">>]) =:= 7.

strip_offset(Sym) ->
    case binary:matches(Sym, <<"+0x">>) of
        [] ->
            Sym;
        Ms ->
            {P, _} = lists:last(Ms),
            binary:part(Sym, 0, P)
    end.

basename(Path) ->
    case binary:matches(Path, <<"/">>) of
        [] -> sanitize(Path);
        Ms ->
            {P, _} = lists:last(Ms),
            sanitize(binary:part(Path, P + 1, byte_size(Path) - P - 1))
    end.

skip_ws(<<C, R/binary>>) when C =:= $\s; C =:= $\t -> skip_ws(R);
skip_ws(B) -> B.

is_hex(<<>>) -> false;
is_hex(B) -> is_hex1(B).

is_hex1(<<>>) -> true;
is_hex1(<<C, R/binary>>) when C >= $0, C =< $9; C >= $a, C =< $f; C >= $A, C =< $F -> is_hex1(R);
is_hex1(_) -> false.

%% Header: "COMM  TID [CPU] TIME: PERIOD EVENT: [inline frame]". The comm
%% may hold spaces; the time token ("123.456:") anchors the parse.
header(Line) ->
    Tokens = binary:split(Line, <<" ">>, [global, trim_all]),
    header(Tokens, []).

header([], _) ->
    error;
header([Tok | Rest], Before) ->
    case is_time(Tok) of
        true when Before =/= [] -> header_after(Rest, Before);
        _ -> header(Rest, [Tok | Before])
    end.

header_after(Rest, Before) ->
    %% Before is reversed: tid (and maybe [cpu]) first, then the comm.
    CommTokens = case Before of
        [<<"[", _/binary>>, _Tid | C] -> C;
        [_Tid | C] -> C
    end,
    case CommTokens of
        [] ->
            error;
        _ ->
            Comm = iolist_to_binary(lists:join(<<" ">>, lists:reverse(CommTokens))),
            {ok, Comm, inline(Rest)}
    end.

%% After the time: optional period, the event name ending in ':', then an
%% inline frame when perf recorded no call chain.
inline([]) -> <<>>;
inline([P, E | Frame]) ->
    case is_digits(P) of
        true -> inline_event([E | Frame]);
        false -> inline_event([P, E | Frame])
    end;
inline(Other) -> inline_event(Other).

inline_event([E | Frame]) ->
    case binary:last(E) of
        $: when Frame =/= [] -> iolist_to_binary(lists:join(<<" ">>, Frame));
        _ -> <<>>
    end.

is_time(Tok) ->
    byte_size(Tok) > 2 andalso binary:last(Tok) =:= $: andalso
        is_time1(binary:part(Tok, 0, byte_size(Tok) - 1), false).

is_time1(<<>>, Dot) -> Dot;
is_time1(<<$., R/binary>>, false) -> is_time1(R, true);
is_time1(<<C, R/binary>>, Dot) when C >= $0, C =< $9 -> is_time1(R, Dot);
is_time1(_, _) -> false.

is_digits(<<>>) -> false;
is_digits(B) -> is_digits1(B).

is_digits1(<<>>) -> true;
is_digits1(<<C, R/binary>>) when C >= $0, C =< $9 -> is_digits1(R);
is_digits1(_) -> false.

strip_number(Comm) ->
    C1 = case Comm of
        <<"erts_", R/binary>> -> R;
        _ -> Comm
    end,
    strip_trailing_number(strip_leading_number(C1)).

strip_leading_number(<<C, R/binary>> = B) when C >= $0, C =< $9 ->
    case drop_digits(R) of
        <<"_", R2/binary>> when R2 =/= <<>> -> R2;
        _ -> B
    end;
strip_leading_number(B) ->
    B.

drop_digits(<<C, R/binary>>) when C >= $0, C =< $9 -> drop_digits(R);
drop_digits(B) -> B.

strip_trailing_number(B) ->
    case binary:matches(B, <<"_">>) of
        [] -> B;
        Ms ->
            {P, _} = lists:last(Ms),
            Tail = binary:part(B, P + 1, byte_size(B) - P - 1),
            case is_digits(Tail) andalso P > 0 of
                true -> binary:part(B, 0, P);
                false -> B
            end
    end.

%% Frame names go into ';'-separated folded lines: no ';' or line ends.
sanitize(B) ->
    case binary:match(B, [<<";">>, <<"\r">>, <<"\n">>]) of
        nomatch -> B;
        _ -> binary:replace(B, [<<";">>, <<"\r">>, <<"\n">>], <<"_">>, [global])
    end.

%% `mod:fun/arity': a ':' and, after the last '/', digits only.
erlang_or_native(F) ->
    case binary:match(F, <<":">>) of
        nomatch ->
            native;
        {P, 1} ->
            case binary:matches(F, <<"/">>, [{scope, {P, byte_size(F) - P}}]) of
                [] ->
                    native;
                Ms ->
                    {S, 1} = lists:last(Ms),
                    case is_digits(binary:part(F, S + 1, byte_size(F) - S - 1)) of
                        true -> erlang;
                        false -> native
                    end
            end
    end.

add_counts(Small, Big) when map_size(Small) > map_size(Big) ->
    add_counts(Big, Small);
add_counts(Small, Big) ->
    maps:fold(fun(K, V, Acc) -> maps:update_with(K, fun(X) -> X + V end, V, Acc) end, Big, Small).

share(_, 0) -> 0.0;
share(A, B) -> A / B.

