%%% @doc Repeated reads of small kernel files (/proc, cgroup), kept cheap.
%%%
%%% Every file operation of OTP's file layer runs on a dirty I/O scheduler:
%%% reading a file whole (open, read, close) is one trip there and back,
%%% about 100 us of CPU on a small host. A sampler reads the same few dozen
%%% files every tick. A `pread' at offset 0 on a descriptor kept open makes
%%% the kernel generate the file afresh, in one cheaper trip (measured: 40
%%% /proc thread files in 0.3 ms of CPU against 2.0 ms by whole-file reads).
%%%
%%% A `held()' keeps descriptors open up to a budget, which `budget/1' sets
%%% from the process's open-file limit so that a node short of descriptors
%%% loses none to beamdiag; beyond the budget, or when a held read fails,
%%% the file is read whole as before. Descriptors belong to the process
%%% that opened them and close when it exits.
%%%
%%% ```
%%% 1> H0 = beamdiag_agent_file:new(beamdiag_agent_file:budget("/proc")).
%%% 2> {{ok, Bin}, H1} = beamdiag_agent_file:read("/proc/stat", 65536, H0).
%%% '''
-module(beamdiag_agent_file).

-export([new/1, none/0, budget/1, read/3, keep/3]).
%% Called by the tests only.
-ifdef(TEST).
-export([close/1, held/1]).
-endif.

-export_type([held/0]).

-opaque held() :: #{budget := non_neg_integer(), fds := #{file:filename() => term()}}.

%% Never more than this many descriptors, whatever the limit allows.
-define(MAX_HELD, 512).
%% Of the descriptors the process may still open, at most this share.
-define(SHARE_DIVISOR, 4).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Holds up to Budget descriptors open.
-spec new(non_neg_integer()) -> held().
new(Budget) when is_integer(Budget), Budget >= 0 ->
    #{budget => min(Budget, ?MAX_HELD), fds => #{}}.

%% @doc Holds nothing: every read opens and closes its file.
-spec none() -> held().
none() ->
    new(0).

%% @doc A budget for this OS process: a quarter of the descriptors it may
%% still open (its soft limit less the size of its descriptor table, which
%% is at least the number open, from one line of /proc/self/status rather
%% than a listing of /proc/self/fd that grows with every socket), at most
%% 512; 0 when either cannot be read under the proc root.
-spec budget(file:filename()) -> non_neg_integer().
budget(Root) ->
    Self = filename:join(Root, "self"),
    case {prim_file:read_file(filename:join(Self, "limits")),
          prim_file:read_file(filename:join(Self, "status"))} of
        {{ok, Limits}, {ok, Status}} ->
            case {soft_nofile(Limits), fd_size(Status)} of
                {_, error} -> 0;
                {unlimited, _} -> ?MAX_HELD;
                {{ok, Soft}, {ok, Open}} -> min(?MAX_HELD, max(0, (Soft - Open) div ?SHARE_DIVISOR));
                {error, _} -> 0
            end;
        _ ->
            0
    end.

%% @doc Reads a file of at most Max bytes: through a held descriptor when
%% there is one or the budget allows opening one, otherwise whole.
-spec read(file:filename(), pos_integer(), held()) ->
    {{ok, binary()} | {error, too_large | term()}, held()}.
read(Path, Max, H = #{fds := Fds, budget := Budget}) ->
    case maps:find(Path, Fds) of
        {ok, Fd} ->
            case pread(Fd, Max) of
                {ok, _} = Ok ->
                    {Ok, H};
                {error, _} ->
                    %% The thread exited or the file went: drop it, read whole.
                    _ = prim_file:close(Fd),
                    {whole(Path, Max), H#{fds := maps:remove(Path, Fds)}}
            end;
        error when map_size(Fds) < Budget ->
            case prim_file:open(Path, [read, binary]) of
                {ok, Fd} ->
                    case pread(Fd, Max) of
                        {ok, _} = Ok ->
                            {Ok, H#{fds := Fds#{Path => Fd}}};
                        {error, _} = E ->
                            _ = prim_file:close(Fd),
                            {E, H}
                    end;
                {error, _} = E ->
                    {E, H}
            end;
        error ->
            {whole(Path, Max), H}
    end.

%% @doc Closes the held descriptors of files under Dir that are not in
%% Paths (the files of threads that have gone).
-spec keep(file:filename(), [file:filename()], held()) -> held().
keep(Dir, Paths, H = #{fds := Fds}) ->
    Prefix = iolist_to_binary([Dir, "/"]),
    Wanted = maps:from_list([{P, []} || P <- Paths]),
    Gone = [{P, Fd} || {P, Fd} <- maps:to_list(Fds), not maps:is_key(P, Wanted),
                       under(Prefix, P)],
    _ = [prim_file:close(Fd) || {_, Fd} <- Gone],
    H#{fds := maps:without([P || {P, _} <- Gone], Fds)}.

-ifdef(TEST).
%% @doc Closes every held descriptor.
-spec close(held()) -> ok.
close(#{fds := Fds}) ->
    _ = [prim_file:close(Fd) || Fd <- maps:values(Fds)],
    ok.
-endif.

-ifdef(TEST).
%% @doc How many descriptors are held.
-spec held(held()) -> non_neg_integer().
held(#{fds := Fds}) ->
    map_size(Fds).
-endif.

%%%===================================================================
%%% Internal
%%%===================================================================

under(Prefix, Path) ->
    case unicode:characters_to_binary(Path) of
        <<Prefix:(byte_size(Prefix))/binary, _/binary>> -> true;
        _ -> false
    end.

%% One byte more than allowed tells a file that is too large.
pread(Fd, Max) ->
    case prim_file:pread(Fd, 0, Max + 1) of
        {ok, Bin} when byte_size(Bin) =< Max -> {ok, Bin};
        {ok, _} -> {error, too_large};
        eof -> {ok, <<>>};
        {error, _} = E -> E
    end.

whole(Path, Max) ->
    case prim_file:read_file(Path) of
        {ok, Bin} when byte_size(Bin) =< Max -> {ok, Bin};
        {ok, _} -> {error, too_large};
        {error, _} = E -> E
    end.

%% "FDSize:\t64"
fd_size(Status) ->
    case [L || <<"FDSize:", L/binary>> <- binary:split(Status, <<"\n">>, [global])] of
        [V | _] ->
            try {ok, binary_to_integer(beamdiag_agent_procfs:trim(V))}
            catch error:badarg -> error
            end;
        [] ->
            error
    end.

%% "Max open files            1024                 1048576              files"
soft_nofile(Limits) ->
    Lines = binary:split(Limits, <<"\n">>, [global]),
    case [L || <<"Max open files", L/binary>> <- Lines] of
        [Rest | _] ->
            case binary:split(Rest, [<<" ">>, <<"\t">>], [global, trim_all]) of
                [<<"unlimited">> | _] -> unlimited;
                [Soft | _] ->
                    try {ok, binary_to_integer(Soft)}
                    catch error:badarg -> error
                    end;
                [] -> error
            end;
        [] ->
            error
    end.
