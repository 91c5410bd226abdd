%%% @doc The node's limits and how full they are, on the target (erts,
%%% kernel and stdlib only): atoms, processes, ports and ETS tables, each
%%% `[Count, Limit]', read every tick. Eight `erlang:system_info/1' calls,
%%% each a counter the runtime keeps (measured on OTP 25: 1.1 to 1.7 us
%%% each), so a tick's cost does not depend on the node's size.
%%%
%%% The ETS limit (`ets_limit') is reported as the node says it, but the
%%% runtime does not enforce it since OTP 21 (measured: 10,000 tables
%%% created on OTP 25 with `ets_limit' 8192): tables are bounded by memory.
%%%
%%% And the sources of new atoms, sampled when the atom table grows: the
%%% processes running or runnable then (`status', which does not make an
%%% idle process answer), their current function and the top of their
%%% stack, a few times in a row; those in a function known to make atoms
%%% (`binary_to_term', `list_to_atom' and the like) are marked.
%%%
%%% ```
%%% 1> beamdiag_agent_limits:counts().
%%% #{atoms => [8751, 1048576], processes => [38, 262144], ports => [3, 65536], ets_tables => [20, 8192]}
%%% '''
-module(beamdiag_agent_limits).

-export([counts/0, sources/2]).

-export_type([counts/0, sources/0, source/0]).

-type counts() :: #{atoms | processes | ports | ets_tables => [non_neg_integer()]}.
%% sources/2: the atom count before and after, and the processes caught
%% running meanwhile.
-type sources() :: #{
    atoms := [non_neg_integer()],
    span_ms := integer(),
    rounds := pos_integer(),
    processes := [source()]
}.
%% A process caught running: the samples it was in, its functions (most
%% seen first) and those of them that make atoms.
-type source() :: #{
    pid := binary(),
    name := binary() | null,
    samples := pos_integer(),
    functions := [binary()],
    makes_atoms := [binary()]
}.

%% Samples of the running processes, and the time between them.
-define(ROUNDS, 5).
-define(GAP_MS, 20).
%% Running processes read a round, and entries kept.
-define(PER_ROUND, 32).
-define(TOP, 8).
%% Frames of a stack looked at.
-define(DEPTH, 8).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Each limit's count and bound.
-spec counts() -> counts().
counts() ->
    #{atoms => [erlang:system_info(atom_count), erlang:system_info(atom_limit)],
      processes => [erlang:system_info(process_count), erlang:system_info(process_limit)],
      ports => [erlang:system_info(port_count), erlang:system_info(port_limit)],
      ets_tables => [erlang:system_info(ets_count), erlang:system_info(ets_limit)]}.

%% @doc Which processes were making atoms: Pids (the walks' processes) are
%% asked for their status (guarded: none is waited for long), and those
%% running or runnable for their current function and stack, ?ROUNDS times
%% ?GAP_MS apart, with the atom count before and after. Entries: the pid,
%% its registered name, the samples it was caught running in, its
%% functions (most seen first) and whether one of them makes atoms.
-spec sources([pid()], #{deadline => integer()}) -> sources().
sources(Pids, Opts) ->
    A0 = erlang:system_info(atom_count),
    T0 = erlang:monotonic_time(millisecond),
    Seen = rounds(?ROUNDS, Pids, Opts, #{}),
    A1 = erlang:system_info(atom_count),
    Entries = beamdiag_agent_top:largest(?TOP, 2, [{P, N, Fs} || {P, {N, Fs}} <- maps:to_list(Seen)]),
    %% Names from the runtime's table: no process is asked.
    Names = maps:from_list([{P, N} || N <- erlang:registered(), P <- [erlang:whereis(N)],
                                      is_pid(P)]),
    #{atoms => [A0, A1], span_ms => erlang:monotonic_time(millisecond) - T0, rounds => ?ROUNDS,
      processes => [entry(P, N, Fs, Names) || {P, N, Fs} <- Entries]}.

%%%===================================================================
%%% Internal
%%%===================================================================

rounds(0, _Pids, _Opts, Seen) ->
    Seen;
rounds(K, Pids, Opts, Seen) ->
    {Status, _} = beamdiag_agent_pinfo:read(Pids, [status], Opts),
    Running = lists:sublist([P || {P, [{status, S}]} <- maps:to_list(Status),
                                  S =:= running orelse S =:= runnable orelse
                                      S =:= garbage_collecting], ?PER_ROUND),
    {Read, _} = beamdiag_agent_pinfo:read(Running, [current_function, current_stacktrace], Opts),
    Seen2 = maps:fold(fun(P, [{_, Cur}, {_, Stack}], Acc) ->
                              Fs = functions(Cur, Stack),
                              maps:update_with(P, fun({N, Old}) -> {N + 1, Fs ++ Old} end,
                                               {1, Fs}, Acc)
                      end, Seen, Read),
    case K > 1 of
        true -> receive after ?GAP_MS -> ok end;
        false -> ok
    end,
    rounds(K - 1, Pids, Opts, Seen2).

%% The current function and the stack's first frames, as {M, F, A}.
functions(Cur, Stack) ->
    Frames = [{M, F, arity(A)} || {M, F, A, _} <- lists:sublist(Stack, ?DEPTH)],
    lists:usort([MFA || MFA = {M, _, _} <- [Cur | Frames], is_atom(M)]).

arity(A) when is_list(A) -> length(A);
arity(A) -> A.

entry(P, N, Fs, Names) ->
    Counted = lists:reverse(lists:keysort(2, maps:to_list(
                  lists:foldl(fun(F, Acc) -> maps:update_with(F, fun(C) -> C + 1 end, 1, Acc) end,
                              #{}, Fs)))),
    Name = case maps:find(P, Names) of
               {ok, N1} -> atom_to_binary(N1, utf8);
               error -> null
           end,
    #{pid => list_to_binary(pid_to_list(P)), name => Name, samples => N,
      functions => [mfa(F) || {F, _} <- lists:sublist(Counted, 6)],
      makes_atoms => [mfa(F) || {F, _} <- Counted, makes_atoms(F)]}.

%% Functions that turn text or external terms into atoms (creating the
%% ones that do not exist).
makes_atoms({erlang, F, _}) ->
    lists:member(F, [list_to_atom, binary_to_atom, binary_to_term]);
makes_atoms({erts_internal, binary_to_term_trap, _}) -> true;
makes_atoms({erl_scan, _, _}) -> true;
makes_atoms({erl_parse, _, _}) -> true;
makes_atoms({file, consult, _}) -> true;
makes_atoms({string, to_atom, _}) -> true;
makes_atoms(_) -> false.

mfa({M, F, A}) ->
    iolist_to_binary([atom_to_binary(M, utf8), $:, atom_to_binary(F, utf8), $/,
                      integer_to_list(A)]).
