%%% @doc The folded profile (`beamdiag_fold:profile()'): its empty value,
%%% adding two, one built from counted stacks, the folded text, what the
%%% stacks show (`frame_stats/1', `summary/1') and the top tables.
%%%
%%% Everything here reads the folded stacks themselves, so a
%%% `profile.folded' file gives the same figures as the profile it came
%%% from. `beamdiag_fold' exports these functions as its API.
%%%
%%% ```
%%% 1> P = beamdiag_fold_profile:from_counts(#{[<<"scheduler">>, <<"lists:foldl/3">>] => 3}).
%%% 2> beamdiag_fold_profile:top(P, #{kind => erlang}).
%%% [#{name => <<"lists:foldl/3">>, kind => erlang, self => 3, total => 3, ...}]
%%% '''
-module(beamdiag_fold_profile).

-export([
    empty/0,
    from_counts/1,
    merge/2,
    to_iolist/1,
    frame_stats/1,
    summary/1,
    top/2,
    format_top/2
]).

-define(UNKNOWN, <<"[unknown]">>).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc A profile of no samples.
-spec empty() -> beamdiag_fold:profile().
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

%% @doc A profile from stacks counted elsewhere (the Erlang-level sampler).
-spec from_counts(#{beamdiag_fold:stack() => pos_integer()}) -> beamdiag_fold:profile().
from_counts(Stacks) ->
    Samples = lists:sum(maps:values(Stacks)),
    Unknown = lists:sum([C || {S, C} <- maps:to_list(Stacks), lists:member(?UNKNOWN, S)]),
    (empty())#{stacks := Stacks, samples := Samples, unknown_samples := Unknown}.

%% @doc Adds two profiles.
-spec merge(beamdiag_fold:profile(), beamdiag_fold:profile()) -> beamdiag_fold:profile().
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
-spec to_iolist(beamdiag_fold:profile()) -> iolist().
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
-spec frame_stats(beamdiag_fold:profile() |
                  #{stacks := #{beamdiag_fold:stack() => pos_integer()}}) ->
    #{samples | erlang | unnamed_jit | unnamed_native | unplaced | unknown | cut_short =>
          non_neg_integer()}.
frame_stats(#{stacks := Stacks}) ->
    Zero = #{samples => 0, erlang => 0, unnamed_jit => 0, unnamed_native => 0, unplaced => 0,
             unknown => 0, cut_short => 0},
    maps:fold(fun(Stack, C, Acc) -> stack_stats(Stack, C, Acc) end, Zero, Stacks).

%% @doc Sample counts and shares of what the stacks show (`frame_stats/1'):
%% `erlang_share', `unnamed_jit_share', `unnamed_native_share',
%% `unplaced_share', `unknown_share' (a frame perf called `[unknown]'),
%% `cut_short_share' (also as `truncated_share').
-spec summary(beamdiag_fold:profile()) -> #{atom() => number()}.
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
-spec top(beamdiag_fold:profile(), #{kind => erlang | native | all, limit => pos_integer()}) ->
    [beamdiag_fold:top_row()].
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
        K <- [beamdiag_fold_frame:kind(F)],
        Kind =:= all orelse K =:= Kind
    ],
    Sorted = lists:sort(
        fun(#{total := A, self := SA}, #{total := B, self := SB}) -> {A, SA} >= {B, SB} end, Rows),
    lists:sublist(Sorted, Limit).

%% @doc A top table as text.
-spec format_top(string() | binary(), [beamdiag_fold:top_row()]) -> unicode:chardata().
format_top(Title, Rows) ->
    [
        Title, "\n",
        io_lib:format("  ~7s ~7s  ~s~n", ["self", "total", "function"]),
        [io_lib:format("  ~6.2f% ~6.2f%  ~ts~n", [100 * S, 100 * T, beamdiag_safe_text:safe(Name)])
         || #{self_share := S, total_share := T, name := Name} <- Rows]
    ].

%%%===================================================================
%%% Internal
%%%===================================================================

stack_stats([_Type | Frames], C, Acc) ->
    Kinds = lists:usort([beamdiag_fold_frame:kind(F) || F <- Frames, F =/= <<"[other stacks]">>]),
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

add_counts(Small, Big) when map_size(Small) > map_size(Big) ->
    add_counts(Big, Small);
add_counts(Small, Big) ->
    maps:fold(fun(K, V, Acc) -> maps:update_with(K, fun(X) -> X + V end, V, Acc) end, Big, Small).

share(_, 0) -> 0.0;
share(A, B) -> A / B.
