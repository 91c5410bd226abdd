%%% @doc What names a process to a person, for the processes a walk
%%% reports, on the target (erts, kernel and stdlib only): registered name,
%%% `proc_lib' initial call, process label, current function, the number
%%% of monitors on it, its status, the process that spawned it (`parent',
%%% OTP 25 and later: its pid, and its name from the runtime's table), and
%%% for the largest heaps how many processes share its initial call.
%%%
%%% The `proc_lib' initial call comes from the process dictionary's
%%% `$initial_call' key, read alone where the emulator allows (OTP 26.2 and
%%% later), otherwise from the whole dictionary of the proc_lib processes
%%% only; the label (`proc_lib:set_label/1', OTP 27 and later) from
%%% `$process_label' the same way. A process spawned from a fun has
%%% `erlang:apply/2' as its initial call, which says nothing: when its
%%% stack is whole (fewer frames than the VM's backtrace depth keeps) and
%%% its outermost frame is a fun's, that fun names it (`a fun in
%%% mod:start/1'); a fun that tail-called a named function left no frame,
%%% and a stack cut at the depth may have lost it: no guess then. Callers
%%% of `gen:call' monitor the server while they wait, so `monitored_by'
%%% counts them. All reads go through
%%% beamdiag_agent_pinfo, in one guarded read: a process that does not
%%% answer gets what the runtime knows without it (`answered => false').
%%% beamdiag's own helpers on the target (running code of beamdiag_agent*
%%% modules) are left out.
%%%
%%% ```
%%% 1> Ids = beamdiag_agent_proc_identity:read([whereis(code_server)], #{}).
%%% 2> Info = fun(_) -> #{reductions => 0} end.
%%% 3> [#{name := N}] = beamdiag_agent_proc_identity:entries(
%%%        [whereis(code_server)], Info, #{}, beamdiag_agent_proc_identity:names(), Ids).
%%% 4> N.
%%% <<"code_server">>
%%% '''
-module(beamdiag_agent_proc_identity).

-export([read/2, entries/5, entry/3, names/0, stalled_entries/3, stalled_entries/4,
         like_counts/4]).

-ifdef(TEST).
-export([stack_agrees/1]).
-endif.

-export_type([identities/0]).

%% What read/2 found: the answers by pid, the proc_lib processes'
%% dictionaries (before OTP 26.2), the pids that did not answer (ms
%% waited), the system modules and the frames a stack read gives at most.
-type identities() :: {#{pid() => list()}, #{pid() => list()}, #{pid() => non_neg_integer()},
                       #{module() => true}, non_neg_integer()}.

%% `parent' is an item from OTP 25 (erts 13) on: every release the agent
%% runs on knows it.
-define(IDENTITY, [registered_name, initial_call, current_function, monitored_by, status,
                   current_stacktrace, parent]).
%% The applications of OTP and of Elixir: their modules are not the
%% user's own code (beside erts's, the preloaded ones).
-define(SYSTEM_APPS, [kernel, stdlib, sasl, compiler, crypto, ssl, public_key, inets, asn1,
                      mnesia, os_mon, runtime_tools, tools, syntax_tools, parsetools, xmerl,
                      eldap, et, eunit, common_test, debugger, dialyzer, diameter, edoc, ftp,
                      megaco, observer, odbc, reltool, snmp, ssh, tftp, wx, erl_interface,
                      otp_mibs, elixir, logger, eex, iex, mix, ex_unit]).
%% How many times the processes whose stack and current function came
%% apart are read again (consistent_stacks/2).
-define(STACK_TRIES, 5).
%% Dictionary reads when counting the processes like a large one.
-define(LIKE_READS, 2000).
%% Frames of this process's own stack below which backtrace_depth/0 reads
%% it: more than the VM keeps (system_flag(backtrace_depth, N) holds N at
%% 64 at most on OTP 25 to 29).
-define(DEPTH_PROBE, 100).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The identities of Pids, in one guarded read (and, for proc_lib
%% processes on releases without the `{dictionary, Key}' item, a second
%% one), leaving out those known not to answer (Known: pid => ms waited).
-spec read([pid()], #{pid() => non_neg_integer()}) -> identities().
read(Pids, Known) ->
    Dict = dict_items(),
    Items = ?IDENTITY ++ [{dictionary, K} || Dict, K <- ['$initial_call', '$process_label']],
    {Read0, Stalled} = beamdiag_agent_pinfo:read([P || P <- Pids, not is_map_key(P, Known)],
                                                 Items, #{}),
    Read = consistent_stacks(Read0, ?STACK_TRIES),
    %% Before OTP 26.2: the whole dictionary of proc_lib processes.
    PlDicts = case Dict of
                  true -> #{};
                  false ->
                      Pl = [P || {P, [_, {initial_call, {proc_lib, init_p, _}} | _]}
                                     <- maps:to_list(Read)],
                      element(1, beamdiag_agent_pinfo:read(Pl, [dictionary], #{}))
              end,
    %% The system modules and the depth only when some process answered
    %% (owners and spawners are often none).
    {System, Depth} = case map_size(Read) of
                          0 -> {#{}, 0};
                          _ -> {system_modules(), backtrace_depth()}
                      end,
    {Read, PlDicts, maps:merge(Known, maps:from_list(Stalled)), System, Depth}.

%% @doc The report's entries of Pids, in order: Info(P) gives an entry's
%% figures, Like the counts of processes by initial call (text), Names the
%% registered names by pid (`names/0'). A process that did not answer gets
%% what the runtime knows without it (`answered => false'); one gone since,
%% or one of beamdiag's own helpers, is left out. Names also names each
%% one's `parent' (no process is asked).
-spec entries([pid()], fun((pid()) -> map()), #{binary() => pos_integer()}, #{pid() => atom()},
              identities()) -> [map()].
entries(Pids, Info, Like, Names, {Read, PlDicts, Stalled, System, Depth}) ->
    lists:append([case maps:find(P, Read) of
                      {ok, Items1} -> identify(P, Info(P), Like, Items1, maps:get(P, PlDicts, none),
                                              {System, Depth, Names});
                      error ->
                          case maps:find(P, Stalled) of
                              {ok, W} -> [unanswered(P, Info(P), Names, W)];
                              error -> []   % gone
                          end
                  end || P <- Pids]).

%% @doc The entry of one process with no figures beside its identity (an
%% owner, a spawner), or `null' when it is not a pid, is gone, or is one of
%% beamdiag's own helpers.
-spec entry(pid() | term(), #{pid() => atom()}, identities()) -> map() | null.
entry(P, Names, Ids) when is_pid(P) ->
    case entries([P], fun(_) -> #{} end, #{}, Names, Ids) of
        [E] -> E;
        [] -> null
    end;
entry(_, _, _) ->
    null.

%% @doc Registered names by pid (no process is asked: the name table is
%% the runtime's).
-spec names() -> #{pid() => atom()}.
names() ->
    maps:from_list([{P, N} || N <- erlang:registered(), P <- [erlang:whereis(N)], is_pid(P)]).

%% @doc The processes that did not answer a read in time (pid, ms waited),
%% as at most N entries, the longest wait first: the pid, the registered
%% name (the runtime's table, not the process, says it) and the wait.
-spec stalled_entries([beamdiag_agent_pinfo:stalled()], #{pid() => atom()}, pos_integer()) ->
          [#{pid := binary(), name := binary() | null, waited_ms := non_neg_integer()}].
stalled_entries(Stalled, Names, N) ->
    [stalled_entry(P, W, Names) || {P, W} <- beamdiag_agent_top:largest(N, 2, Stalled)].

%% @doc As stalled_entries/3, each entry with `memory_start': StartMemory(P),
%% its memory at the window's start when a walk read it there (bytes), or
%% null.
-spec stalled_entries([beamdiag_agent_pinfo:stalled()], #{pid() => atom()}, pos_integer(),
                      fun((pid()) -> non_neg_integer() | null)) -> [map()].
stalled_entries(Stalled, Names, N, StartMemory) ->
    [(stalled_entry(P, W, Names))#{memory_start => StartMemory(P)}
     || {P, W} <- beamdiag_agent_top:largest(N, 2, Stalled)].

stalled_entry(P, W, Names) ->
    #{pid => list_to_binary(pid_to_list(P)), name => name(maps:get(P, Names, [])),
      waited_ms => W}.

%% @doc For the largest heaps (Pids): how many processes share each one's
%% initial call (text => count), from an end walk that read the initial
%% call (End: the candidates' figures; Walked: every process's), with
%% proc_lib's initial call for proc_lib processes (read for at most
%% ?LIKE_READS of them). A sampled or registered walk has no count.
-spec like_counts(beamdiag_agent_proc_walk:mode(), [pid()],
                  #{pid() => beamdiag_agent_proc_walk:figures()},
                  [{pid(), beamdiag_agent_proc_walk:figures()}]) -> #{binary() => pos_integer()}.
like_counts(all, Pids, End, Walked) ->
    Heaps = [{P, element(4, maps:get(P, End))} || P <- Pids, is_map_key(P, End),
                                                   tuple_size(maps:get(P, End)) =:= 4],
    Pl = lists:sublist([P || {P, {_, _, _, {proc_lib, init_p, _}}} <- Walked], ?LIKE_READS),
    PlCalls = proc_lib_calls(lists:usort(Pl ++ [P || {P, {proc_lib, init_p, _}} <- Heaps])),
    Wanted = lists:usort([Ic || {P, Init} <- Heaps,
                                Ic <- [maps:get(P, PlCalls, Init)], likeable(Ic)]),
    case Wanted of
        [] -> #{};
        _ -> count_like(Walked, Wanted, PlCalls, #{})
    end;
like_counts(_, _, _, _) ->
    #{}.

%%%===================================================================
%%% Internal
%%%===================================================================

unanswered(P, Nums, Names, Waited) ->
    Nums#{pid => list_to_binary(pid_to_list(P)), name => name(maps:get(P, Names, [])),
          initial_call => <<"?">>, spawn_call => <<"?">>, label => null, current => <<"?">>,
          monitored_by => 0, status => <<"?">>, like => null, parent => null, answered => false,
          waited_ms => Waited}.

%% A running process's current function and stack, asked in one read, do
%% not always come from one instant: read locally from the agent on OTP 25,
%% a gen_server of an Elixir release running Enum.reduce/3 gave its
%% current function with the stack of its loop between two messages
%% (gen_server:loop/7) in 4 of 5 windows, so the frame of the user's code
%% below Enum's was lost. Those whose stack does not begin with their
%% current function are read again, the two items alone, a bounded number
%% of times; one still apart keeps what it gave (a process in a BIF may
%% give a stack that begins below it).
consistent_stacks(Read, Tries) ->
    Apart = [P || {P, Items} <- maps:to_list(Read), not stack_agrees(Items)],
    case Apart of
        [] ->
            Read;
        _ when Tries =:= 0 ->
            Read;
        _ ->
            {Again, _} = beamdiag_agent_pinfo:read(Apart, [current_function, current_stacktrace], #{}),
            Read1 = maps:fold(
                      fun(P, [{current_function, Cur}, {current_stacktrace, St}], Acc) ->
                              Items = maps:get(P, Acc),
                              Acc#{P := lists:keyreplace(
                                          current_stacktrace, 1,
                                          lists:keyreplace(current_function, 1, Items,
                                                           {current_function, Cur}),
                                          {current_stacktrace, St})};
                         (_, _, Acc) ->
                              Acc
                      end, Read, Again),
            consistent_stacks(Read1, Tries - 1)
    end.

stack_agrees(Items) ->
    case {lists:keyfind(current_function, 1, Items), lists:keyfind(current_stacktrace, 1, Items)} of
        {{_, {M, F, A}}, {_, [{M, F, Args, _} | _]}} when is_integer(Args) -> Args =:= A;
        {{_, {M, F, A}}, {_, [{M, F, Args, _} | _]}} when is_list(Args) -> length(Args) =:= A;
        {{_, {_, _, _}}, {_, [_ | _]}} -> false;
        _ -> true
    end.

%% Running code of beamdiag_agent* modules: one of beamdiag's helpers,
%% left out as the agent itself is. Ctx: the system modules, the stack
%% depth, the registered names.
identify(P, Nums, Like, Items, PlDict, Ctx) ->
    case Items of
        [_, _, {_, {M, _, _}} | _] when is_atom(M) ->
            case lists:prefix("beamdiag_agent", atom_to_list(M)) of
                true -> [];
                false -> identified(P, Nums, Like, Items, PlDict, Ctx)
            end;
        _ ->
            identified(P, Nums, Like, Items, PlDict, Ctx)
    end.

identified(P, Nums, Like, Items, PlDict, {System, Depth, Names}) ->
    [{_, Name}, {_, Init}, {_, Cur}, {_, Mons}, {_, Status}, {_, Stack}, {_, Parent} | DictItems] =
        Items,
    {IcVal, LabelVal} = case DictItems of
                            [{_, I}, {_, L}] -> {I, L};
                            [] ->
                                case PlDict of
                                    [{dictionary, D}] -> {proplists:get_value('$initial_call', D),
                                                          undefined};
                                    _ -> {undefined, undefined}
                                end
                        end,
    Ic = case {Init, IcVal} of
             {{proc_lib, init_p, _}, {M, F, A}} when is_atom(M), is_atom(F), is_integer(A) ->
                 {M, F, A};
             _ -> Init
         end,
    [maps:merge(Nums#{
        pid => list_to_binary(pid_to_list(P)),
        name => name(Name),
        initial_call => case Ic of
                            {erlang, apply, 2} -> spawned_fun(Stack, Depth);
                            _ -> mfa(Ic)
                        end,
        spawn_call => mfa(Init),
        label => label(LabelVal),
        current => mfa(Cur),
        monitored_by => length(Mons),
        status => atom_to_binary(Status, utf8),
        like => maps:get(mfa(Ic), Like, null),
        parent => parent(Parent, Names)
    }, own(Cur, Stack, System))].

%% What a process spawned from a fun runs: the fun it was spawned with,
%% read from the outermost frame of its stack (`a fun in mod:start/1').
%% That frame is the fun's only while the fun has not returned nor
%% tail-called a named function (then the outermost frame is that
%% function's: no guess), and only on a whole stack: a read gives the
%% backtrace depth's frames at most, the innermost (the runtime folds a
%% run of one frame into one, so deep recursion does not fill it), and a
%% stack cut there may have lost the fun's frame. Else erlang:apply/2, as
%% the runtime says.
spawned_fun(Stack, Depth) when is_list(Stack), Stack =/= [], length(Stack) < Depth ->
    {M, F, _, _} = lists:last(Stack),
    %% A fun of Outer/Arity is the function '-Outer/Arity-fun-K-'.
    case re:run(atom_to_binary(F, utf8), "^-(.+)/([0-9]+)-fun-[0-9]+-$",
                [unicode, {capture, all_but_first, binary}]) of
        {match, [Outer, Arity]} ->
            iolist_to_binary(["a fun in ", atom_to_binary(M, utf8), $:, Outer, $/, Arity]);
        nomatch ->
            mfa({erlang, apply, 2})
    end;
spawned_fun(_Stack, _Depth) ->
    mfa({erlang, apply, 2}).

%% The spawner: its pid and registered name (the runtime's table, read
%% once for the report: no process is asked). The runtime says
%% `undefined' for init, the one process with no parent.
parent(P, Names) when is_pid(P) ->
    #{pid => list_to_binary(pid_to_list(P)), name => name(maps:get(P, Names, []))};
parent(_, _) ->
    null.

%% Frames a stack read gives at most: the VM's backtrace depth (8 unless
%% set with erlang:system_flag(backtrace_depth, N)). No call reads it
%% without setting it (system_info has no such item on OTP 25 to 29), so
%% it is measured: this process's own stack, read ?DEPTH_PROBE frames
%% down, two functions in turn (the runtime folds a run of one frame into
%% one), gives the depth's frames. Measured once a read/2.
backtrace_depth() ->
    depth_a(?DEPTH_PROBE) - ?DEPTH_PROBE.

%% Each level adds one to the result, so neither call is a tail call.
depth_a(0) -> stack_frames();
depth_a(N) -> 1 + depth_b(N - 1).

depth_b(0) -> stack_frames();
depth_b(N) -> 1 + depth_a(N - 1).

stack_frames() ->
    {current_stacktrace, S} = erlang:process_info(self(), current_stacktrace),
    length(S).

%% The innermost frame of the user's own code below the current function
%% (`own', with its file and line as `own_at'), when the current function
%% is not theirs: a process in Enum.reduce/3 or gen_server:loop/7 was
%% sent there by a function of the application's own modules.
own(Cur, Stack, System) when is_list(Stack) ->
    Mine = fun(M) -> is_atom(M) andalso not maps:is_key(M, System) andalso
                         not lists:prefix("beamdiag_agent", atom_to_list(M)) end,
    case Cur of
        {M0, _, _} when is_atom(M0) ->
            case Mine(M0) of
                true -> #{};
                false -> own_frame([F || F = {M, _, _, _} <- Stack, Mine(M)])
            end;
        _ ->
            #{}
    end;
own(_Cur, _Stack, _System) ->
    #{}.

own_frame([{M, F, A, Loc} | _]) ->
    Arity = case A of
                L when is_list(L) -> length(L);
                N -> N
            end,
    At = case {proplists:get_value(file, Loc), proplists:get_value(line, Loc)} of
             {File, Line} when is_list(File), is_integer(Line) ->
                 #{own_at => iolist_to_binary([File, $:, integer_to_list(Line)])};
             _ ->
                 #{}
         end,
    At#{own => mfa({M, F, Arity})};
own_frame([]) ->
    #{}.

%% The modules of erts (preloaded) and of the OTP and Elixir applications
%% loaded on the node, from the application controller's table (no process
%% is asked).
system_modules() ->
    Apps = try [A || {A, _, _} <- application:loaded_applications(), lists:member(A, ?SYSTEM_APPS)]
           catch error:_ -> []
           end,
    Mods = erlang:pre_loaded() ++
        lists:append([Ms || A <- Apps, {ok, Ms} <- [catch application:get_key(A, modules)]]),
    maps:from_list([{M, true} || M <- Mods, is_atom(M)]).

name([]) -> null;
name(N) when is_atom(N) -> atom_to_binary(N, utf8).

%% Whether process_info takes `{dictionary, Key}' (erts 14.2, OTP 26.2,
%% unknown to the OTP 25 contract: tried on the caller itself).
dict_items() ->
    try dynamic(erlang, process_info, [self(), [{dictionary, '$initial_call'}]]) of
        [_] -> true;
        _ -> false
    catch
        error:badarg -> false
    end.

%% A process label (proc_lib:set_label/1, OTP 27) as bounded text.
label(undefined) -> null;
label(L) -> iolist_to_binary(io_lib:format("~0tp", [L], [{chars_limit, 80}])).

count_like([], _Wanted, _PlCalls, Acc) ->
    Acc;
count_like([{P, {_, _, _, Init}} | Ps], Wanted, PlCalls, Acc) ->
    count_like(Ps, Wanted, PlCalls, bump(maps:get(P, PlCalls, Init), Wanted, Acc));
count_like([_ | Ps], Wanted, PlCalls, Acc) ->
    count_like(Ps, Wanted, PlCalls, Acc).

%% The initial calls proc_lib recorded, by pid, in one guarded read.
proc_lib_calls(Pids) ->
    Items = case dict_items() of
                true -> [{dictionary, '$initial_call'}];
                false -> [dictionary]
            end,
    {Read, _} = beamdiag_agent_pinfo:read(Pids, Items, #{}),
    maps:fold(fun(P, [{_, V}], Acc) ->
                      Ic = case V of
                               D when is_list(D) -> proplists:get_value('$initial_call', D);
                               _ -> V
                           end,
                      case Ic of
                          {M, F, A} when is_atom(M), is_atom(F), is_integer(A) -> Acc#{P => Ic};
                          _ -> Acc
                      end
              end, #{}, Read).

%% A process spawned from a fun shows erlang:apply/2 as its initial call,
%% which says nothing about what it is: no count for it.
likeable({erlang, apply, 2}) -> false;
likeable({_, _, _}) -> true;
likeable(_) -> false.

bump(Ic, Wanted, Acc) ->
    case lists:member(Ic, Wanted) of
        true -> maps:update_with(mfa(Ic), fun(N) -> N + 1 end, 1, Acc);
        false -> Acc
    end.

%% A call the OTP 25 contract does not allow (an item of a later release):
%% not resolved at compile time, so neither the compiler nor dialyzer
%% holds it to that contract.
dynamic(M, F, A) ->
    erlang:apply(M, F, A).

mfa({M, F, A}) when is_atom(M), is_atom(F), is_integer(A) ->
    iolist_to_binary([atom_to_binary(M, utf8), $:, atom_to_binary(F, utf8), $/,
                      integer_to_list(A)]);
mfa(_) ->
    <<"undefined">>.
