%%% @doc The profile knowledge base: from hot functions to findings.
%%%
%%% Pure functions over a folded profile (`beamdiag_fold:profile()'). Each
%%% entry of `families/0' names the frames that betray one known cost
%%% (atom-heavy `binary_to_term', zlib in `term_to_binary', big ETS copies,
%%% GC, memcpy, regex compilation in a loop, native lock waits, scheduler
%%% busy-waiting) and what to do about it. A family's share is the share of
%%% samples with at least one of its frames in the stack, so nested frames
%%% are not counted twice. Every finding has the id `hot_function'; the
%%% evidence names the functions and their shares.
%%%
%%% ```
%%% 1> {ok, P} = beamdiag_fold:fold_file("perf.script", #{}).
%%% 2> [#{evidence := [E | _]}] = beamdiag_profile_rules:findings(P, #{}).
%%% 3> E.
%%% <<"binary_to_term decoding atoms: 91.2% of samples (erts_atom_put 83.4%, ...)">>
%%% '''
-module(beamdiag_profile_rules).

-export([findings/2]).

-export_type([family/0, result/0, kept/0, perf/0]).

%% The shape of a CPU profile as `beamdiag_profile:profile/3' gives it,
%% and of what a diagnosis keeps of it: the types the session, these
%% rules and the formats share.
%% profile/3's result: the folded profile and how it was taken; with
%% perf, perf's record, and the Erlang sampler's stacks beside it
%% (`callers'); with the Erlang sampler, its result without its stacks
%% (beamdiag_agent_sampler:result()); the profile rules' findings unless
%% the caller runs them.
-type result() :: #{
    profile := beamdiag_fold:profile(),
    method := erlang | perf,
    node := node(),
    perf => perf(),
    callers => beamdiag_fold:profile(),
    %% Why the Erlang-level sampler beside perf gave no callers.
    callers_error => binary(),
    sampler => #{processes := [beamdiag_agent_sampler:process_stacks()], atom() => term()},
    findings => [beamdiag_finding:finding()]
}.
%% What a diagnosis keeps of a result in its capture's extras (`profile'):
%% the sampler's stacks per process as `by_process'.
-type kept() :: #{
    profile := beamdiag_fold:profile(),
    method := erlang | perf,
    perf => perf(),
    callers => beamdiag_fold:profile(),
    callers_error => binary(),
    by_process := [beamdiag_agent_sampler:process_stacks()]
}.
%% perf's record (beamdiag_perf:result() without the script and perf's
%% output), with the fold's wall time.
-type perf() :: #{
    call_graph := dwarf | fp | none,
    call_graph_reason := binary(),
    perf_map := file:filename() | missing,
    duration := pos_integer(),
    frequency := pos_integer(),
    script_bytes := non_neg_integer(),
    script_truncated := boolean(),
    target := beamdiag_perf:target(),
    ospid := pos_integer(),
    wall_ms := #{record := non_neg_integer(), script := non_neg_integer(), fold := integer()}
}.


-type family() :: #{
    key := atom(),
    title := binary(),
    %% critical only for costs no node has as its job; garbage collection,
    %% copies, ETS reads, lock waits and spinning are part of much work
    %% (a message broker collects garbage all day): at most warning.
    max_severity := beamdiag_finding:severity(),
    label := binary(),
    frames := [binary()],
    prefixes := [binary()],
    unless := [binary()],
    advice := binary(),
    %% What can be claimed when only `prefixes' matched, that is the BIF's
    %% Erlang name (the Erlang sampler's stacks, or an emulator whose C
    %% functions have no names): the frames that betray the cost itself
    %% were not seen.
    by_name_only => #{title := binary(), label := binary(), advice := binary()}
}.


%%%===================================================================
%%% API
%%%===================================================================

%% The thresholds the profile rules use: a family of costs is said
%% from `info' of the profile's samples, a warning from `warning', critical
%% from `critical'; a hot frame is named when its own samples are
%% `hot_self' of all (fractions).
-spec thresholds() -> #{atom() => number()}.
thresholds() ->
    #{info => 0.05, warning => 0.15, critical => 0.35, hot_self => 0.15}.

%% @doc The known costs, most specific first.
-spec families() -> [family()].
families() ->
    [
        #{
            key => atom_decode,
            title => <<"Decoding atom-heavy terms with binary_to_term takes a large share of the CPU">>,
            max_severity => critical,
            label => <<"binary_to_term decoding atoms">>,
            frames => [<<"binary_to_term_1">>, <<"binary_to_term_2">>, <<"erts_atom_put">>,
                       <<"erts_atom_put_index">>, <<"atom_hash">>, <<"dec_atom">>,
                       <<"dec_term">>, <<"binary_to_term_int">>, <<"erts_atom_get">>],
            %% The BIF, and its trap continuation for large terms.
            prefixes => [<<"$erlang:binary_to_term/">>, <<"erlang:binary_to_term/">>,
                         <<"erts_internal:binary_to_term_trap/">>],
            unless => [],
            advice =>
                <<"Decoding atom-heavy terms (e.g. values from a remote cache such as Redis "
                  "stored with term_to_binary) looks up every atom in the atom table under "
                  "its lock. Keep decoded terms in an ETS tier in front of the remote cache "
                  "(versioned keys make invalidation simple): a field report measured ETS "
                  "6.43x faster than Redis plus binary_to_term for a large term, and 40% "
                  "less CPU at peak. Or store fewer atoms (binaries for keys).">>,
            by_name_only => #{
                title => <<"Decoding terms with binary_to_term takes a large share of the CPU">>,
                label => <<"binary_to_term">>,
                advice =>
                    <<"Decode less often: keep decoded terms in an ETS tier in front of the "
                      "remote cache they come from (versioned keys make invalidation simple); "
                      "a field report measured ETS 6.43x faster than Redis plus "
                      "binary_to_term for a large term. What inside the decoding costs most "
                      "(atom lookups in erts_atom_put, zlib) shows only on an emulator that "
                      "names its C functions (Debian: erlang-base-dbgsym) with `beamdiag "
                      "flame --call-graph dwarf`; if it is atoms, store binaries for keys.">>
            }
        },
        #{
            key => zlib_inflate,
            title => <<"zlib decompression of stored terms takes a large share of the CPU">>,
            max_severity => critical,
            label => <<"zlib decompression of compressed terms">>,
            frames => [<<"erl_zlib_inflate_chunk">>, <<"inflate">>, <<"inflate_fast">>,
                       <<"adler32_z">>, <<"adler32">>],
            prefixes => [],
            unless => [],
            advice =>
                <<"binary_to_term inflates terms that were stored with "
                  "term_to_binary(T, [compressed]). Cache the decoded term in ETS, or store "
                  "uncompressed terms when the network or memory allow.">>
        },
        #{
            key => zlib_deflate,
            title => <<"zlib compression in term_to_binary takes a large share of the CPU">>,
            max_severity => critical,
            label => <<"zlib compression in term_to_binary">>,
            frames => [<<"erl_zlib_deflate_chunk">>, <<"erl_zlib_deflate_start">>,
                       <<"deflate">>, <<"deflate_slow">>, <<"deflate_fast">>,
                       <<"longest_match">>, <<"compress_block">>, <<"fill_window">>],
            prefixes => [],
            unless => [],
            advice =>
                <<"term_to_binary(T, [compressed]) or {compressed, N} runs zlib on every "
                  "call. Use a lower level ({compressed, 1}), compress only large terms, or "
                  "encode once and reuse the binary.">>
        },
        #{
            key => ets_copy,
            title => <<"Copying big terms out of ETS takes a large share of the CPU">>,
            max_severity => warning,
            label => <<"copying big terms out of ETS">>,
            frames => [<<"db_get_element">>, <<"db_get_element_tree_common">>,
                       <<"copy_struct_x">>, <<"copy_shallow_x">>, <<"db_copy_from_comp">>,
                       <<"ets_lookup_2">>, <<"ets_lookup_element_3">>, <<"ets_select_2">>,
                       <<"db_get_hash">>],
            prefixes => [<<"copy_struct">>, <<"copy_shallow">>],
            unless => [],
            advice =>
                <<"Every ets:lookup copies the whole object into the caller's heap. Store "
                  "smaller objects, read single fields with ets:lookup_element/3, keep large "
                  "immutable data in binaries (shared, not copied) or persistent_term when "
                  "it is read-mostly.">>
        },
        #{
            key => gc,
            title => <<"Garbage collection takes a large share of the CPU">>,
            max_severity => warning,
            label => <<"garbage collection">>,
            frames => [<<"erts_garbage_collect">>, <<"erts_garbage_collect_nobump">>,
                       <<"erts_garbage_collect_hibernate">>, <<"garbage_collect">>,
                       <<"erts_gc_after_bif_call">>, <<"erts_gc_after_bif_call_lhf">>],
            prefixes => [<<"sweep_">>, <<"do_minor">>, <<"major_collection">>,
                         <<"minor_collection">>, <<"erts_garbage_collect">>],
            unless => [],
            advice =>
                <<"Processes allocate and drop much memory. Find them (recon:proc_count("
                  "reductions/memory)); build fewer temporary terms, give known large "
                  "processes a bigger min_heap_size via spawn_opt, and move big data to "
                  "ETS or binaries.">>
        },
        #{
            key => regex_compile,
            title => <<"Regular expressions compiled on every call take a large share of the CPU">>,
            max_severity => critical,
            label => <<"regular expressions compiled on every call">>,
            frames => [<<"erts_pcre_compile">>, <<"erts_pcre_compile2">>, <<"re_compile_2">>,
                       <<"re_compile_1">>],
            prefixes => [<<"compile_branch">>, <<"compile_regex">>],
            unless => [],
            advice =>
                <<"re:run/2,3 and re:replace with a string or binary pattern compile the "
                  "regular expression on every call. Compile once with re:compile/2 and "
                  "keep the result (persistent_term, state), or use binary:match/split "
                  "for plain strings.">>
        },
        #{
            key => memcpy,
            title => <<"Copying memory (memcpy) takes a large share of the CPU">>,
            max_severity => warning,
            label => <<"copying memory (memcpy)">>,
            frames => [<<"memcpy">>, <<"memmove">>],
            prefixes => [<<"__memcpy">>, <<"__memmove">>, <<"__memcpy_avx">>],
            unless => [<<"erts_atom_put">>],
            advice =>
                <<"Large copies: binaries built by appending to copies, iolist_to_binary "
                  "on big data, messages with large terms. Look at the Erlang callers in "
                  "the flame graph (or run with --erlang).">>
        },
        #{
            key => native_locks,
            title => <<"Waiting for native locks takes a large share of the CPU">>,
            max_severity => warning,
            label => <<"waiting for native locks">>,
            frames => [<<"ethr_mutex_lock">>, <<"ethr_mutex_lock_wait__">>,
                       <<"ethr_event_wait">>, <<"ethr_event_swait">>,
                       <<"ethr_rwmutex_rwlock">>, <<"ethr_rwmutex_rlock_wait">>,
                       <<"ethr_rwmutex_rwlock_wait">>, <<"erts_mtx_lock">>],
            prefixes => [<<"ethr_mutex_lock_wait">>, <<"ethr_rwmutex_rlock_wait">>,
                         <<"ethr_rwmutex_rwlock_wait">>],
            unless => [<<"erts_atom_put">>, <<"scheduler_wait">>, <<"erts_schedule">>],
            advice =>
                <<"Threads spin or sleep on a VM lock. perf cannot say which lock: run the "
                  "lock session (start the node on the lock-counting emulator with "
                  "`-emu_type lcnt` and diagnose again) to name it.">>
        },
        #{
            key => busy_wait,
            title => <<"Schedulers spinning while idle take a large share of the CPU">>,
            max_severity => warning,
            label => <<"schedulers spinning while idle">>,
            frames => [<<"scheduler_wait">>, <<"sched_spin_wait">>, <<"sched_busy_wait">>,
                       <<"erts_thr_progress_update">>, <<"erts_thr_progress_leader_update">>,
                       <<"erts_thr_progress_prepare_wait">>, <<"ethr_event_swait">>],
            prefixes => [<<"erts_thr_progress">>],
            unless => [],
            advice =>
                <<"Schedulers spin looking for work before they sleep; the CPU is burnt "
                  "but no work is done. Start the node with +sbwt none +sbwtdcpu none "
                  "+sbwtdio none and confirm with `beamdiag diagnose` (busy_wait).">>
        }
    ].

%% @doc The share of samples in which each family appears, with the
%% family's frames and their own shares.
-spec family_shares(beamdiag_fold:profile()) ->
    [{family(), float(), [{binary(), float()}]}].
family_shares(#{stacks := Stacks, samples := N}) ->
    [
        begin
            {Count, PerFrame} = family_count(F, Stacks),
            Frames = lists:reverse(lists:keysort(2, [{Fr, share(C, N)} || {Fr, C} <- maps:to_list(PerFrame)])),
            {F, share(Count, N), Frames}
        end
     || F <- families()
    ].

%% @doc Findings (id `hot_function') for every family at or above 5% of
%% the samples, and for a single function that is the leaf of at least
%% 15% of the samples without being explained by a family. Options:
%% `min_samples' (default 50): below that the profile is too thin to judge.
-spec findings(beamdiag_fold:profile(), #{min_samples => non_neg_integer(),
                                          callers => beamdiag_fold:profile()}) ->
    [beamdiag_finding:finding()].
findings(P, Opts = #{callers := C}) ->
    %% The Erlang-level sampler ran beside perf (an emulator whose native
    %% frames have no names, or a flame graph read for its Erlang callers):
    %% its findings for the families perf's stacks did not show join
    %% perf's, saying where they come from.
    Base = findings(P, maps:remove(callers, Opts)),
    Seen = [Fam || #{metrics := #{family := Fam}} <- Base],
    Extra = [F#{evidence := [<<"From the Erlang-level sampler (stacks of running processes) "
                               "beside perf, for what perf's stacks did not show:">> | Ev]}
             || F = #{metrics := #{family := Fam}, evidence := Ev}
                    <- findings(C, #{min_samples => 20}),
                not lists:member(Fam, Seen)],
    beamdiag_finding:sort(Base ++ Extra);
findings(P = #{samples := N}, Opts) ->
    case N < maps:get(min_samples, Opts, 50) of
        true ->
            [];
        false ->
            Fired = [{F, S, Frames} || {F, S, Frames} <- family_shares(P), S >= map_get(info, thresholds())],
            Fam = [family_finding(F, S, Frames, P) || {F, S, Frames} <- Fired],
            Hot = [hot_finding(R, P) || R = #{name := Name, self_share := S, kind := K}
                                        <- beamdiag_fold:top(P, #{limit => 5}),
                                        S >= map_get(hot_self, thresholds()),
                                        %% A frame without a name is no function
                                        %% to point at.
                                        K =:= erlang orelse K =:= native orelse K =:= kernel,
                                        not explained(Name, [F || {F, _, _} <- Fired], P)],
            beamdiag_finding:sort(Fam ++ Hot)
    end.

%%%===================================================================
%%% Internal
%%%===================================================================

%% A hot function is explained when most of its samples sit under a
%% family that already made a finding (hash_get under erts_atom_put).
explained(Name, Families, #{stacks := Stacks}) ->
    {In, All} = maps:fold(
        fun(Stack, C, {I, A}) ->
            case lists:member(Name, Stack) of
                false ->
                    {I, A};
                true ->
                    Hit = lists:any(
                        fun(#{frames := Fs, prefixes := Ps}) ->
                            lists:any(fun(F) -> matches(F, Fs, Ps) end, Stack)
                        end, Families),
                    {case Hit of true -> I + C; false -> I end, A + C}
            end
        end, {0, 0}, Stacks),
    All > 0 andalso In * 2 >= All.

family_count(#{frames := Frames, prefixes := Prefixes, unless := Unless}, Stacks) ->
    maps:fold(
        fun(Stack, C, {Count, PerFrame}) ->
            Hits = lists:usort([F || F <- Stack, matches(F, Frames, Prefixes)]),
            case Hits =/= [] andalso not lists:any(fun(U) -> lists:member(U, Stack) end, Unless) of
                true ->
                    {Count + C,
                     lists:foldl(fun(H, Acc) -> maps:update_with(H, fun(X) -> X + C end, C, Acc) end,
                                 PerFrame, Hits)};
                false ->
                    {Count, PerFrame}
            end
        end,
        {0, #{}},
        Stacks
    ).

matches(F, Frames, Prefixes) ->
    Base = strip_suffix(F),
    lists:member(Base, Frames) orelse
        lists:any(fun(P) -> binary:longest_common_prefix([Base, P]) =:= byte_size(P) end, Prefixes).

%% A `$' JIT prefix does not change the name.
strip_suffix(F) ->
    case F of
        <<"$", R/binary>> -> R;
        _ -> F
    end.

family_finding(Fam = #{frames := Own}, Share, Frames, P) ->
    case Fam of
        #{by_name_only := Named} ->
            case lists:any(fun({F, _}) -> lists:member(strip_suffix(F), Own) end, Frames) of
                true -> family_finding2(Fam, Share, Frames, P);
                false -> family_finding2(maps:merge(Fam, Named), Share, Frames, P)
            end;
        _ ->
            family_finding2(Fam, Share, Frames, P)
    end.

family_finding2(Fam = #{key := Key, label := Label, advice := Advice, title := Title,
                        max_severity := Max}, Share, Frames, P = #{samples := N}) ->
    Severity = capped(severity(Share), Max),
    Top = lists:sublist(Frames, 4),
    E1 = io_lib:format("~ts: ~s of samples (~ts)",
                       [Label, beamdiag_units:pct(Share),
                        lists:join(", ", [io_lib:format("~ts ~s", [Fr, beamdiag_units:pct(S)]) || {Fr, S} <- Top])]),
    {TopFrame, TopShare} = case Top of [T | _] -> T; [] -> {<<>>, 0.0} end,
    Capped = case Severity =/= severity(Share) of
        true -> [<<"Rated warning, not critical: this is work many nodes exist to do; it is "
                   "a fault only when it costs more than the node's job needs.">>];
        false -> []
    end,
    Callers = case callers(Fam, P) of
        [] -> [];
        Cs -> [io_lib:format("Called from ~ts",
                             [lists:join(", ", [io_lib:format("~ts (~s of samples; on the stack "
                                                              "in ~s in all)",
                                                              [C, beamdiag_units:pct(S), beamdiag_units:pct(T)])
                                                || {C, S, T} <- lists:sublist(Cs, 3)])])]
    end,
    F = beamdiag_finding:new(hot_function, Severity, [E1 | Callers ++ Capped],
                             #{family => atom_to_binary(Key), share => Share,
                               function => TopFrame, function_share => TopShare,
                               samples => N}),
    %% The title and the fix are the family's own.
    F#{title := Title, fix := Advice}.

%% The Erlang functions that call into a family: in each stack with the
%% family's frames, the nearest Erlang frame on the root side of the first
%% of them. Most frequent first, with the share of samples where it calls
%% into the family and the share where it is on the stack at all (a
%% sampler that sees a process only between time slices finds it often
%% in the caller of a BIF whose work it did).
callers(#{frames := Frames, prefixes := Prefixes, unless := Unless}, P = #{stacks := Stacks,
                                                                           samples := N}) ->
    Counts = maps:fold(
        fun(Stack, C, Acc) ->
            case lists:any(fun(U) -> lists:member(U, Stack) end, Unless) of
                true -> Acc;
                false -> add_caller(caller(Stack, Frames, Prefixes, none), C, Acc)
            end
        end, #{}, Stacks),
    Sorted = lists:reverse(lists:keysort(2, maps:to_list(Counts))),
    [{F, share(C, N), share(on_stack(F, P), N)} || {F, C} <- Sorted].

on_stack(F, #{stacks := Stacks}) ->
    maps:fold(fun(Stack, C, Acc) ->
                      case lists:any(fun(X) -> strip_suffix(X) =:= F end, Stack) of
                          true -> Acc + C;
                          false -> Acc
                      end
              end, 0, Stacks).

caller([], _Frames, _Prefixes, _Last) ->
    none;
caller([F | Rest], Frames, Prefixes, Last) ->
    case matches(F, Frames, Prefixes) of
        true -> Last;
        false ->
            case beamdiag_fold:frame_kind(F) of
                erlang -> caller(Rest, Frames, Prefixes, strip_suffix(F));
                _ -> caller(Rest, Frames, Prefixes, Last)
            end
    end.

add_caller(none, _C, Acc) -> Acc;
add_caller(F, C, Acc) -> maps:update_with(F, fun(X) -> X + C end, C, Acc).

hot_finding(#{name := Name, self_share := S, total_share := T, kind := K}, #{samples := N}) ->
    E = io_lib:format("~ts (~s) is the leaf of ~s of samples, on the stack in ~s",
                      [Name, K, beamdiag_units:pct(S), beamdiag_units:pct(T)]),
    %% Not in the knowledge base: it may well be the node's job, so at
    %% most a warning.
    F = beamdiag_finding:new(hot_function, capped(severity(S), warning), [E],
                             #{function => Name, share => S, total_share => T, samples => N}),
    F#{title := <<"One function takes a large share of the CPU">>,
       fix := <<"Not in the knowledge base: read its callers in flame.svg and decide whether "
                "it is the node's job or a cost to remove.">>}.

capped(critical, warning) -> warning;
capped(Severity, _Max) -> Severity.

severity(S) ->
    case thresholds() of
        #{critical := C} when S >= C -> critical;
        #{warning := W} when S >= W -> warning;
        _ -> info
    end.

share(_, 0) -> 0.0;
share(A, B) -> A / B.
