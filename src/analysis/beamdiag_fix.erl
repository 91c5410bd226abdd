%%% @doc Fixes fitted to the node: the catalogue's fix for a finding,
%%% rewritten so that it never advises an emulator flag the node already
%%% has, says so when the usual fix is already in place, and advises only
%%% flags (and values) that the erl documentation of the node's OTP release
%%% lists. The lock knowledge base's advice per lock class is fitted here
%%% too (`lock_class/3'). The flags beamdiag may advise, with the release that brought
%%% them and the manual page that documents them, are data
%%% (`advised_flags/0'); a test checks them against erl(1) of every OTP
%%% release it can find.
%%%
%%% ```
%%% 1> beamdiag_fix:fix(busy_wait, #{sbwt => <<"none">>, sbwtdcpu => <<"short">>,
%%%                                  sbwtdio => <<"short">>, otp_release => <<"25">>}).
%%% <<"Start the node with +sbwtdcpu none +sbwtdio none (+sbwt none is already set) ...">>
%%% '''
-module(beamdiag_fix).

-export([fix/2, lock_class/3, busy_wait_off/1]).
%% Called by the tests only.
-ifdef(TEST).
-export([advised_flags/0, documented/2]).
-endif.

-type flag() :: #{flag := binary(), values := [binary()], since := pos_integer(),
                  doc := erl | erts_alloc, meaning := binary()}.
-export_type([flag/0]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Every emulator flag a fix may advise, with the values it may
%% advise, the first OTP release that has it and its manual page.
-spec advised_flags() -> [flag()].
advised_flags() ->
    [
        #{flag => <<"sbwt">>, values => [<<"none">>, <<"very_short">>], since => 17, doc => erl,
          meaning => <<"scheduler busy-wait threshold">>},
        #{flag => <<"sbwtdcpu">>, values => [<<"none">>], since => 21, doc => erl,
          meaning => <<"dirty CPU scheduler busy-wait threshold">>},
        #{flag => <<"sbwtdio">>, values => [<<"none">>], since => 21, doc => erl,
          meaning => <<"dirty IO scheduler busy-wait threshold">>},
        #{flag => <<"swt">>, values => [<<"high">>], since => 17, doc => erl,
          meaning => <<"wake-up threshold: high wakes sleeping schedulers later">>},
        #{flag => <<"scl">>, values => [<<"false">>], since => 17, doc => erl,
          meaning => <<"scheduler load compaction">>},
        #{flag => <<"sub">>, values => [<<"true">>], since => 17, doc => erl,
          meaning => <<"scheduler utilization balancing">>},
        #{flag => <<"sbt">>, values => [<<"u">>, <<"db">>], since => 17, doc => erl,
          meaning => <<"scheduler bind type: u is unbound, db the default binding">>},
        #{flag => <<"S">>, values => [<<"N:N">>], since => 17, doc => erl,
          meaning => <<"schedulers and schedulers online">>},
        #{flag => <<"Mdai">>, values => [<<"max">>], since => 24, doc => erts_alloc,
          meaning => <<"allocator instances for dirty schedulers">>},
        #{flag => <<"MMscs">>, values => [<<"size in MB">>], since => 17, doc => erts_alloc,
          meaning => <<"pre-reserved super carrier">>},
        #{flag => <<"MMmcs">>, values => [<<"count">>], since => 17, doc => erts_alloc,
          meaning => <<"carriers kept in the segment cache">>},
        #{flag => <<"MBlmbcs">>, values => [<<"size in KB">>], since => 17, doc => erts_alloc,
          meaning => <<"largest multiblock carrier of the binary allocator">>}
    ].

%% @doc True when the node's OTP release documents the flag (the table's
%% `since'); a node whose release is unknown is taken to have it.
-spec documented(binary(), map()) -> boolean().
documented(Flag, S) ->
    Release = try binary_to_integer(setting(otp_release, S, <<"0">>))
              catch error:badarg -> 0
              end,
    case [Since || #{flag := F, since := Since} <- advised_flags(), F =:= Flag] of
        [Since] -> Release =:= 0 orelse Release >= Since;
        [] -> false
    end.

%% @doc True when every busy-wait flag of the node is `none'.
-spec busy_wait_off(map()) -> boolean().
busy_wait_off(Settings) ->
    lists:all(fun(F) -> F =:= <<"none">> end, busy_wait_flags(Settings)).

%% @doc The fix for a finding on a node with these settings: the
%% catalogue's text, fitted to the flags the node has.
-spec fix(beamdiag_catalogue:id(), map()) -> binary().
fix(busy_wait, S) ->
    {Set, Have} = wanted(S, [{sbwt, <<"none">>}, {sbwtdcpu, <<"none">>}, {sbwtdio, <<"none">>}]),
    iolist_to_binary([
        case Set of
            [] -> "Busy waiting is already off on every scheduler type";
            _ -> ["Start the node with ", flags(Set), " (in vm.args, or ERL_FLAGS)"]
        end,
        already(Have),
        ". Prove it with `beamdiag experiment` under your own load: OS CPU per unit of work "
        "should drop while throughput and latency stay within noise."
    ]);
fix(cpu_throttling, S) ->
    {Set, Have} = wanted(S, [{sbwt, <<"none">>}, {sbwtdcpu, <<"none">>}, {sbwtdio, <<"none">>}]),
    iolist_to_binary([
        "Raise the CPU limit, or match the schedulers to the quota: +S Q:Q with Q the quota "
        "in whole CPUs (recent OTP releases do this by default unless +S is set)",
        case Set of
            [] -> "; busy waiting is already off, so spinning does not eat the quota";
            _ -> [", and turn busy waiting off (", flags(Set), ") so spinning does not eat "
                  "the quota", already(Have)]
        end,
        "."
    ]);
fix(high_system_cpu, S) ->
    Mmscs = setting(mmscs, S, <<"0">>),
    Swt = setting(swt, S, <<"medium">>),
    iolist_to_binary([
        "Profile the kernel side with `beamdiag flame` (perf shows the system calls). Usual "
        "causes: many small file or socket writes (batch them); auditd or other syscall "
        "auditing (exclude the node); page faults from memory churn (",
        case Mmscs of
            <<"0">> -> "+MMscs to pre-reserve a super carrier";
            _ -> ["a super carrier is already reserved (+MMscs ", Mmscs, ")"]
        end,
        "); futex wake-ups of schedulers that sleep and wake often",
        case {busy_wait_off(S), lists:member(Swt, [<<"high">>, <<"very_high">>])} of
            {true, true} ->
                [" (busy waiting is off and +swt is already ", Swt, "; a short busy wait, "
                 "+sbwt very_short, keeps a scheduler from sleeping between bursts)"];
            {true, false} ->
                [" (busy waiting is already off, +sbwt none, so an idle scheduler sleeps at "
                 "once: a short busy wait, +sbwt very_short, or a later wake-up, +swt high, "
                 "means fewer sleeps and wake-ups)"];
            {false, true} ->
                [" (+swt is already ", Swt, ")"];
            {false, false} ->
                [" (+swt high wakes sleeping schedulers later, so fewer of them)"]
        end,
        ". Prove a flag with `beamdiag experiment` before keeping it."
    ]);
fix(dirty_cpu_gc, S) ->
    iolist_to_binary([
        case setting(mdai, S, <<"0">>) of
            <<"0">> ->
                case documented(<<"Mdai">>, S) of
                    true -> "Give dirty schedulers their own allocator instances with +Mdai max "
                            "(OTP 24.2 and later).";
                    false -> "This release has no allocator instances for dirty schedulers "
                             "(+Mdai came in OTP 24.2)."
                end;
            M ->
                ["Dirty schedulers already have allocator instances of their own (+Mdai ", M,
                 ")."]
        end,
        " Keep big data out of process heaps: store it in ETS or binaries, or split the "
        "process; for a message queue that backs up, consume it or bound it."
    ]);
fix(scheduler_imbalance, S) ->
    {Set, Have} = wanted(S, [{scl, <<"false">>}, {sub, <<"true">>}]),
    iolist_to_binary([
        "Look for a single busy process (`beamdiag flame`, recon:proc_window/3).",
        case Set of
            [] -> [" Load compaction is already off and utilization balancing on", already(Have),
                   "."];
            _ -> [" If the load is many processes, try ", flags(Set), already(Have),
                  " and prove it with `beamdiag experiment`."]
        end
    ]);
fix(cpu_starvation, S) ->
    Bound = setting(bind_type, S, <<"unbound">>),
    iolist_to_binary([
        "Find the competitor (the processes named in the evidence, top -H, the host's steal "
        "time) and move it away, or give the BEAM cores of its own (cpuset, taskset).",
        case Bound of
            <<"unbound">> -> "";
            _ -> [" The schedulers are bound to cores (bind type ", Bound, "): a bound "
                  "scheduler cannot move off a core that a competitor holds; on a shared host "
                  "start the node with +sbt u (unbound) or give it cores of its own."]
        end,
        " If the host is simply oversubscribed, lower the node's schedulers to the CPUs it "
        "really gets (+S N:N) so that its threads do not queue behind each other."
    ]);
fix(Id, _S) ->
    maps:get(fix, beamdiag_catalogue:entry(Id)).

%% @doc The advice for a contended lock class (the lock knowledge base's,
%% `beamdiag_lock_rules'), fitted to the allocator flags the node already
%% has: a super carrier (+MMscs) or dirty allocator instances (+Mdai).
-spec lock_class(binary(), map(), binary()) -> binary().
lock_class(Class, Settings, Fix) when Class =:= <<"erts_mmap">>; Class =:= <<"mseg">> ->
    case safe_setting(mmscs, Settings) of
        Scs when Scs =:= undefined; Scs =:= <<"0">> ->
            Fix;
        Scs ->
            iolist_to_binary(
              ["a super carrier is already reserved (+MMscs ", Scs, " MB): if the node's "
               "memory outgrows it, carriers come from the OS again, so raise it to what the "
               "node holds at peak; and let carriers be cached longer (+MMmcs)"])
    end;
lock_class(<<"alcu_allocator">>, Settings, Fix) ->
    case safe_setting(mdai, Settings) of
        Dai when Dai =:= undefined; Dai =:= <<"0">> ->
            Fix;
        Dai ->
            iolist_to_binary(
              ["dirty schedulers already have their own allocator instances (+Mdai ", Dai,
               "): the contention is between threads freeing memory another allocated; look "
               "for large messages and binaries crossing processes"])
    end;
lock_class(_Class, _Settings, Fix) ->
    Fix.

%%%===================================================================
%%% Internal
%%%===================================================================

busy_wait_flags(S) ->
    [setting(sbwt, S, <<"medium">>), setting(sbwtdcpu, S, <<"short">>),
     setting(sbwtdio, S, <<"short">>)].

%% A flag's value as the agent reports it (a binary), or its default.
setting(K, S, Default) ->
    case maps:get(K, S, Default) of
        V when is_binary(V) -> V;
        _ -> Default
    end.

%% A setting that came from the target, for advice that quotes it: a short
%% printable binary, or `undefined'.
safe_setting(Key, Settings) ->
    case maps:get(Key, Settings, undefined) of
        V when is_binary(V), byte_size(V) =< 32 ->
            case re:run(V, "^[A-Za-z0-9_.]+$", [{capture, none}]) of
                match -> V;
                nomatch -> undefined
            end;
        _ ->
            undefined
    end.

%% The wanted flags its release documents, split into those to set and
%% those the node has.
wanted(S, Wanted) ->
    lists:partition(fun({K, V}) -> maps:get(K, S, undefined) =/= V end,
                    [W || W = {K, _} <- Wanted, documented(atom_to_binary(K), S)]).

flags(Fs) ->
    lists:join(" ", [["+", atom_to_list(K), " ", V] || {K, V} <- Fs]).

already([]) -> "";
already(Have) -> [" (", flags(Have), case Have of [_] -> " is"; _ -> " are" end,
                  " already set)"].
