%%% @doc Reads `perf script' text in large chunks, cuts them at sample
%%% boundaries and hands them to fold workers (`beamdiag_fold_worker'),
%%% then collects and adds up the workers' profiles.
%%%
%%% One worker per online scheduler (at most 8 by default), each with a
%%% 16 MiB young heap so that the per-chunk garbage does not make it
%%% collect its caches over and over; at most two chunks in flight per
%%% worker, so memory stays bounded whatever the input's size. Input of one
%%% chunk or less goes to one worker with an ordinary heap. A stretch with
%%% no line end at all (binary junk, or one huge line) is dropped and
%%% counted. The options are `beamdiag_fold''s, already checked.
%%%
%%% ```
%%% 1> beamdiag_fold:fold_file("perf.txt", #{workers => 2}).
%%% {ok, #{samples => 8113, ...}}
%%% '''
-module(beamdiag_fold_chunks).

-export([file/2, binary/2]).

%% Words: 16 MiB on a 64-bit emulator, per worker (at most 8 by default).
-define(WORKER_HEAP, 2 * 1024 * 1024).
-define(TAIL, 262144).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Folds a `perf script' text file, streaming it in large chunks.
-spec file(file:filename_all(), map()) ->
    {ok, beamdiag_fold:profile()} | {error, {beamdiag_fold, term()}}.
file(Path, Opts) ->
    case file:open(Path, [read, raw, binary]) of
        {ok, Fd} ->
            try
                run(file_reader(Fd), small(filelib:file_size(Path), Opts))
            after
                ok = file:close(Fd)
            end;
        {error, Why} ->
            {error, {beamdiag_fold, {open, Path, Why}}}
    end.

%% @doc Folds `perf script' text held in memory.
-spec binary(binary(), map()) -> {ok, beamdiag_fold:profile()} | {error, {beamdiag_fold, term()}}.
binary(Bin, Opts) ->
    run(binary_reader(Bin, 0), small(byte_size(Bin), Opts)).

%%%===================================================================
%%% Internal
%%%===================================================================

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
    Parent = self(),
    %% A large young heap: each chunk makes lots of short-lived garbage,
    %% and the caches would otherwise be copied by frequent collections.
    Heap = case maps:get(heap, Opts, large) of
        large -> [{min_heap_size, ?WORKER_HEAP}, {min_bin_vheap_size, ?WORKER_HEAP}];
        small -> []
    end,
    Workers = [beamdiag_fold_worker:start(Parent, Opts, Heap)
               || _ <- lists:seq(1, W)],
    Result =
        try
            feed(Read, CS, <<>>, Workers, Workers, #{}, 0, 0)
        catch
            throw:{fold_error, R} -> {error, {beamdiag_fold, R}}
        end,
    case Result of
        {ok, Bytes, Huge0} ->
            Profiles = [collect(P, M) || {P, M} <- Workers],
            case [E || {error, E} <- Profiles] of
                [Why | _] ->
                    {error, {beamdiag_fold, {worker, Why}}};
                [] ->
                    Merged = lists:foldl(fun beamdiag_fold_profile:merge/2, beamdiag_fold_profile:empty(), [P || {ok, P} <- Profiles]),
                    P2 = Merged#{bytes := Bytes, huge_lines := maps:get(huge_lines, Merged) + Huge0},
                    case P2 of
                        #{samples := 0} when Bytes > 0 -> {error, {beamdiag_fold, not_perf_output}};
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
