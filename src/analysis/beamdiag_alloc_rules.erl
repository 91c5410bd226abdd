%%% @doc Findings from the allocators' own account (pure): the carriers
%%% each alloc_util allocator type mapped beside the blocks in use in them,
%%% at the window's end (`beamdiag_memory_ledger', `allocators').
%%%
%%% `allocator_fragmentation': one type's carriers hold `free_min' bytes or
%%% more that no block uses, and its blocks use at most `use_max' of its
%%% carriers. A burst that allocated many blocks and freed most of them
%%% leaves carriers that a few live blocks each keep mapped: the memory is
%%% not leaked, and `erlang:memory/0' (which counts blocks) does not show
%%% it, but the OS counts it in the resident memory. A state, not a rate:
%%% every window of the same node gives the same answer.
%%%
%%% The fix is fitted to the node: `+M<S>acful de' (OTP 26 and later) lets
%%% the OS reuse the free pages of carriers under the utilisation limit;
%%% smaller multiblock carriers (`+M<S>lmbcs') are emptied and given back
%%% sooner. A flag the node already has is named as set, not advised.
%%%
%%% ```
%%% 1> [Id || #{id := Id} <- beamdiag_alloc_rules:findings(Memory, Capture)].
%%% [allocator_fragmentation]
%%% '''
-module(beamdiag_alloc_rules).

-export([findings/2]).

-define(MIB, 1048576).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The thresholds: the free bytes in one type's carriers, at least,
%% and the share of its carriers its blocks use, at most.
-spec thresholds() -> #{free_min := pos_integer(), use_max := float()}.
thresholds() ->
    #{free_min => 128 * ?MIB, use_max => 0.5}.

%% @doc The allocator findings of a capture's memory ledger.
-spec findings(beamdiag_memory_ledger:memory(), beamdiag_capture:capture()) ->
    [beamdiag_finding:finding()].
findings(M = #{allocators := Types}, Capture) ->
    T = thresholds(),
    case [A || A <- Types, fragmented(A, T)] of
        [] -> [];
        Frag -> [finding(Frag, M, maps:get(settings, Capture, #{}))]
    end;
findings(_, _) ->
    [].

%%%===================================================================
%%% Internal
%%%===================================================================

fragmented(#{carriers := C, blocks := B}, #{free_min := Min, use_max := Max}) ->
    C - B >= Min andalso B =< Max * C.

finding(Frag = [#{type := Type, carriers := C, blocks := B} | _], M, S) ->
    Free = lists:sum([C1 - B1 || #{carriers := C1, blocks := B1} <- Frag]),
    Evidence =
        [fmt("~s's carriers hold ~s, its blocks in use ~s (~s of them): ~s mapped that no block "
             "uses, at the window's end (erlang:system_info({allocator_sizes, ~s}))",
             [Type, mem(C), mem(B), beamdiag_units:whole_pct(B / max(1, C)), mem(C - B), Type])]
        ++ [fmt("~s's carriers too: ~s, its blocks ~s (~s free)",
                [T2, mem(C2), mem(B2), mem(C2 - B2)])
            || #{type := T2, carriers := C2, blocks := B2} <- tl(Frag)]
        ++ os_lines(M, Free),
    Metrics = #{allocator => atom_to_binary(Type), carriers_bytes => C, blocks_bytes => B,
                free_bytes => Free},
    beamdiag_finding:new(allocator_fragmentation, warning, Evidence, Metrics,
                         #{title => fmt("~s holds ~s of free carrier space", [Type, mem(Free)]),
                           fix => fix(Type, S)}).

os_lines(#{accounts := #{rss := #{last := Rss}, total := #{last := Vm}}}, Free) ->
    [fmt("the OS's account: resident memory ~s, of which the VM's own (erlang:memory/0, its "
         "blocks) ~s; the free carrier space is ~s of the resident memory at most (pages "
         "never touched since the burst are not resident)",
         [mem(Rss), mem(Vm), beamdiag_units:whole_pct(min(1.0, Free / max(1, Rss)))])];
os_lines(_, _) ->
    [].

%% The fix for the allocator type: its letter's flags, each advised only
%% when the node's release has it and the node does not set it already.
fix(Type, S) ->
    Why = <<"The memory is not leaked: it is free space in the allocator's multiblock carriers, "
            "each kept mapped by the few blocks that still live in it after a burst (many "
            "allocated at once, most freed). ">>,
    Burst = <<" Find what allocates in bursts (a batch of large messages, a cache refilled at "
              "once, a big term built and dropped) and spread or bound it. Prove a change with "
              "beamdiag experiment: the resident memory after the same burst, and the CPU per "
              "unit of work, before and after.">>,
    case letter(Type) of
        none ->
            iolist_to_binary([Why, Burst]);
        L ->
            Acful = <<"M", L, "acful">>,
            Lmbcs = <<"M", L, "lmbcs">>,
            AcfulKey = beamdiag_agent_vm:alloc_flag_key(L, "acful"),
            LmbcsKey = beamdiag_agent_vm:alloc_flag_key(L, "lmbcs"),
            AcfulPart =
                case {beamdiag_flags:documented(Acful, S), beamdiag_flags:value(AcfulKey, S)} of
                    {false, _} ->
                        [<<"This node's OTP release has no +">>, Acful, <<" (it came in OTP 26, "
                          "and lets the OS reuse the free pages of carriers under the "
                          "utilisation limit); on OTP 26 or later it would. ">>];
                    {true, V} when V =:= <<"0">>; V =:= undefined ->
                        [<<"Start the node with +">>, Acful, <<" de (in vm.args): the allocator "
                          "tells the OS that the free pages of carriers below the utilisation "
                          "limit can be reused (madvise MADV_FREE), so the resident memory falls "
                          "when the host needs it; the pages are faulted in again on reuse. ">>];
                    {true, Set} ->
                        [<<"+">>, Acful, <<" ">>, Set, <<" is already set: the free pages are "
                          "offered back to the OS once a carrier's use falls under it. ">>]
                end,
            LmbcsPart =
                case beamdiag_flags:value(LmbcsKey, S) of
                    undefined ->
                        [<<"Smaller multiblock carriers are emptied and given back sooner: "
                           "+">>, Lmbcs, <<" with a smaller size in KB than the default, at the "
                           "cost of more carriers and more mmap calls.">>];
                    Size ->
                        [<<"+">>, Lmbcs, <<" ">>, Size, <<" is already set.">>]
                end,
            iolist_to_binary([Why, AcfulPart, LmbcsPart, Burst])
    end.

letter(Type) ->
    Name = atom_to_binary(Type),
    case [L || {L, T} <- beamdiag_agent_vm:alloc_letters(), T =:= Name] of
        [L] -> L;
        [] -> none
    end.

mem(B) -> beamdiag_units:bytes(B).

fmt(F, A) -> iolist_to_binary(io_lib:format(F, A)).
