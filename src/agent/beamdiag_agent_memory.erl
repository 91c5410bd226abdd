%%% @doc The memory ledger's readings on the target, one per tick (erts,
%%% kernel and stdlib only): the VM's account (`erlang:memory/0', by type)
%%% beside the OS's (the node's resident memory from /proc/PID/statm: its
%%% anonymous and shared parts, in bytes).
%%%
%%% Both are cheap: `erlang:memory/0' sums the allocators' own counters
%%% (66 us a call on an idle 2-core host with OTP 25, 93 us beside four
%%% burners). But it waits for every scheduler, as
%%% `{allocator_sizes, Type}' does: behind a scheduler held 800 ms at a
%%% time, 798 ms and 800 ms (OTP 25, 2 cores). So the VM's part of a
%%% tick's reading (`vm_account/1') runs in a helper of its own beside
%%% the one that asks the time ledger's every-scheduler counters, under
%%% the tick's wait (beamdiag_agent_tick), and a reading without it says why
%%% (`vm_missing'). statm, one short file but one more
%%% trip to a dirty I/O thread (3.2 ms of wall time on a saturated node),
%%% is read on the window's first and last ticks only (`read/4'); a middle
%%% tick takes the resident memory from the process's stat, which it reads
%%% for its CPU time anyway (`read_vm/2').
%%%
%%% On the first and last ticks, too, the allocators' own account: for
%%% each alloc_util allocator type, the size of its carriers (what it
%%% mapped) and of the blocks in them (what is in use), summed over its
%%% instances and its multi-block, pool and single-block carriers, from
%%% `erlang:system_info({allocator_sizes, Types})' (the sizes only, not the
%%% whole `{allocator, Type}' tree that recon_alloc reads: 0.4 ms for the
%%% ten types of an idle 2-core node with OTP 25, 0.56 ms for the tree).
%%%
%%% ```
%%% 1> {M, _} = beamdiag_agent_memory:read("/proc", os:getpid(), beamdiag_agent_file:none(),
%%%                                         beamdiag_agent_memory:vm_account(true)).
%%% 2> maps:get(total, maps:get(vm, M)) > 0.
%%% true
%%% '''
-module(beamdiag_agent_memory).

-export([read/4, read_vm/2, vm_account/1]).

-ifdef(TEST).
-export([parse_statm/2, allocator_sizes/1]).
-endif.

-export_type([reading/0, vm_account/0]).

%% The VM's account (bytes by type; empty when it was not read, and then
%% `vm_missing' says why: `timeout' or `busy', a scheduler did not answer
%% within the tick's wait, or `error') and the OS's (`rss', `anon' and
%% `shared' bytes, or the error that kept it from being read).
-type reading() :: #{
    vm := #{atom() => non_neg_integer()},
    vm_missing => timeout | busy | error,
    alloc => #{atom() => #{carriers := non_neg_integer(), blocks := non_neg_integer()}},
    os := #{rss := non_neg_integer(), anon => non_neg_integer(), shared => non_neg_integer()}
        | {error, term()}
}.
%% The VM's part of a reading (`vm_account/1'), or why it is missing.
-type vm_account() :: #{vm := #{atom() => non_neg_integer()},
                        alloc => #{atom() => #{carriers := non_neg_integer(),
                                               blocks := non_neg_integer()}}}
                    | {missing, timeout | busy | error}.

%% statm is seven numbers: a few dozen bytes.
-define(MAX_STATM, 512).
%% The page size of every Linux this runs on but a few (arm64 with 64 kB
%% pages reads its own from the auxiliary vector, which is not at hand
%% here: statm's resident pages against VmRSS would tell).
-define(PAGE, 4096).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc One reading: the VM's part as read (`vm_account/1', or why it is
%% missing) and the OS's, through held descriptors.
-spec read(file:filename(), string() | integer(), beamdiag_agent_file:held(), vm_account()) ->
    {reading(), beamdiag_agent_file:held()}.
read(Root, Pid, Held, Account) ->
    Path = filename:join([Root, pid_text(Pid), "statm"]),
    {Os, Held2} = case beamdiag_agent_file:read(Path, ?MAX_STATM, Held) of
                      {{ok, Bin}, H} -> {parse_statm(Bin, ?PAGE), H};
                      {{error, Why}, H} -> {{error, {beamdiag_agent_memory, {read, Why}}}, H}
                  end,
    {with_account(Account, #{os => Os}), Held2}.

%% @doc A middle tick's reading: the VM's part as read, and the resident
%% memory the tick read with the process's CPU time (/proc/PID/stat,
%% RssPages pages), without the anonymous part (statm, read at the
%% window's ends).
-spec read_vm(non_neg_integer(), vm_account()) -> reading().
read_vm(RssPages, Account) ->
    with_account(Account, #{os => #{rss => RssPages * ?PAGE}}).

%% @doc The VM's part of a reading: `erlang:memory/0' by type, and with
%% Allocators the allocators' carriers and blocks. Both wait for every
%% scheduler: the agent's ticks call this in the session's helper.
-spec vm_account(boolean()) -> vm_account().
vm_account(true) ->
    #{vm => vm(), alloc => allocators()};
vm_account(false) ->
    #{vm => vm()}.

with_account({missing, Why}, Reading) ->
    Reading#{vm => #{}, vm_missing => Why};
with_account(Account, Reading) ->
    maps:merge(Reading, Account).

%% erlang:memory/0 raises notsup on a node whose allocators do not all
%% count (+Mea min, a disabled allocator): no VM account then, the OS's
%% still.
vm() ->
    try maps:with([total, processes, system, atom, binary, code, ets], maps:from_list(erlang:memory()))
    catch
        error:notsup -> #{}
    end.

%% Each alloc_util allocator type's carriers and blocks, in bytes; a type
%% that is disabled (`false') is left out, and none when the VM does not
%% say. All types in one `{allocator_sizes, Types}' request (each request
%% waits for every scheduler: behind schedulers blocked 20 ms at a time,
%% 41 ms for the ten types against 403 ms asked one by one), one by one
%% on a VM that refuses the list.
allocators() ->
    try erlang:system_info(alloc_util_allocators) of
        Types ->
            Answers = try erlang:system_info({allocator_sizes, Types}) of
                          L when is_list(L), length(L) =:= length(Types) -> lists:zip(Types, L);
                          _ -> each_type(Types)
                      catch
                          error:badarg -> each_type(Types)
                      end,
            maps:from_list([{T, S} || {T, Answer} <- Answers,
                                      S <- [allocator_sizes(untagged(T, Answer))],
                                      is_map(S)])
    catch
        error:_ -> #{}
    end.

each_type(Types) ->
    [{T, catch erlang:system_info({allocator_sizes, T})} || T <- Types].

%% The list request tags each type's answer with the type.
untagged(T, {T, Answer}) -> Answer;
untagged(_T, Answer) -> Answer.

%% @doc The carriers' and the blocks' sizes of one allocator type's
%% `{allocator_sizes, Type}' answer, summed over its instances and their
%% carrier kinds (`mbcs', `mbcs_pool', `sbcs'); the current size is each
%% size tuple's first figure. `none' for an answer of another form.
-spec allocator_sizes(term()) ->
    #{carriers := non_neg_integer(), blocks := non_neg_integer()} | none.
allocator_sizes(Instances) when is_list(Instances) ->
    try
        lists:foldl(
          fun({instance, _, Kinds}, Acc) ->
                  lists:foldl(fun({K, Info}, #{carriers := C, blocks := B})
                                    when K =:= mbcs; K =:= mbcs_pool; K =:= sbcs ->
                                      #{carriers => C + carriers_size(Info),
                                        blocks => B + blocks_size(Info)};
                                 (_, A) -> A
                              end, Acc, Kinds)
          end, #{carriers => 0, blocks => 0}, Instances)
    catch
        error:_ -> none
    end;
allocator_sizes(_) ->
    none.

carriers_size(Info) ->
    case lists:keyfind(carriers_size, 1, Info) of
        false -> 0;
        T -> element(2, T)
    end.

%% The blocks of every type the carriers hold (a pool's carriers hold
%% other types' blocks too).
blocks_size(Info) ->
    case lists:keyfind(blocks, 1, Info) of
        {blocks, ByType} when is_list(ByType) ->
            lists:sum([element(2, Size) || {_, L} <- ByType, is_list(L),
                                           Size <- [lists:keyfind(size, 1, L)], is_tuple(Size)]);
        _ ->
            0
    end.

%% @doc /proc/PID/statm's resident and shared pages as bytes: `rss', its
%% `shared' part (file-backed and shared memory) and its `anon' part.
-spec parse_statm(binary(), pos_integer()) ->
    #{rss := non_neg_integer(), anon := non_neg_integer(), shared := non_neg_integer()}
    | {error, {beamdiag_agent_memory, {bad_statm, binary()}}}.
parse_statm(Bin, Page) ->
    try binary:split(string:trim(Bin), <<" ">>, [global, trim_all]) of
        [_Size, Resident, Shared | _] ->
            case {string:to_integer(Resident), string:to_integer(Shared)} of
                {{R0, <<>>}, {S0, <<>>}} when is_integer(R0), is_integer(S0) ->
                    R = R0 * Page,
                    S = min(R, S0 * Page),
                    #{rss => R, shared => S, anon => R - S};
                _ ->
                    bad_statm(Bin)
            end;
        _ ->
            bad_statm(Bin)
    catch
        error:_ -> bad_statm(Bin)
    end.

%%%===================================================================
%%% Internal
%%%===================================================================

bad_statm(Bin) ->
    {error, {beamdiag_agent_memory, {bad_statm, binary:part(Bin, 0, min(64, byte_size(Bin)))}}}.

pid_text(Pid) when is_integer(Pid) -> integer_to_list(Pid);
pid_text(Pid) -> Pid.
