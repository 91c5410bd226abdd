%%% @doc Reads `perf script' text in large chunks, cuts them at sample
%%% boundaries and hands them to fold workers (`beamdiag_fold_worker'),
%%% then collects and adds up the workers' profiles.
%%%
%%% One worker per online scheduler (at most 8 by default); at most two
%%% chunks in flight per worker, so memory stays bounded whatever the
%%% input's size. Input of one chunk or less goes to one worker with an
%%% ordinary heap. A stretch with no line end at all (binary junk, or one
%%% huge line) is dropped and counted. The options are `beamdiag_fold''s,
%%% already checked.
%%%
%%% What costs most is fresh memory, not parsing: every page the emulator
%%% maps anew is a page fault, and on a virtual machine a fault costs as
%%% much as folding a few kilobytes. So chunks are 384 KiB: a read of a
%%% chunk and the text left from the one before stays under the binary
%%% allocator's single-block carrier threshold (512 KiB), so its memory is
%%% reused, where a 512 KiB read got a carrier of its own, mapped anew and
%%% unmapped each time (384 KiB folded real text in 10-15% less CPU time
%%% than 512 KiB, docs/PERFORMANCE.md). A worker's young heap is 4 MiB
%%% (large enough that the
%%% per-chunk garbage does not make it collect its caches over and over,
%%% small enough to be reused rather than mapped anew), and a regular file
%%% is read with pread from the end of the last chunk handed out, so the
%%% text after a chunk's last sample is read again rather than copied in
%%% front of the next read. On 24 MB of real perf text this took the page
%%% faults of a fold from about 23,000 to about 4,000 (docs/PERFORMANCE.md).
%%%
%%% A chunk ends at the last blank line in its last 256 KiB, looked for
%%% in its last 2 KiB, then 16 KiB first: the search for a two-byte
%%% pattern runs at a few hundred MB/s, and the reader shares the cores
%%% with the workers (a sample is one or two KiB).
%%%
%%% ```
%%% 1> beamdiag_fold:fold_file("perf.txt", #{workers => 2}).
%%% {ok, #{samples => 8113, ...}}
%%% '''
-module(beamdiag_fold_chunks).

-export([file/2, binary/2]).

%% Words: 4 MiB on a 64-bit emulator, per worker (at most 8 by default).
-define(WORKER_HEAP, 512 * 1024).
-define(TAIL, 262144).
-define(NEAR_END, 16384).
-define(NEAREST_END, 2048).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Folds a `perf script' text file, streaming it in large chunks.
-spec file(file:filename_all(), beamdiag_fold:settled()) ->
    {ok, beamdiag_fold:profile()} | {error, {beamdiag_fold, term()}}.
file(Path, Opts) ->
    case file:open(Path, [read, raw, binary]) of
        {ok, Fd} ->
            try
                run(file_reader(Fd, filelib:is_regular(Path)), small(filelib:file_size(Path), Opts))
            after
                ok = file:close(Fd)
            end;
        {error, Why} ->
            {error, {beamdiag_fold, {open, Path, Why}}}
    end.

%% @doc Folds `perf script' text held in memory.
-spec binary(binary(), beamdiag_fold:settled()) ->
    {ok, beamdiag_fold:profile()} | {error, {beamdiag_fold, term()}}.
binary(Bin, Opts) ->
    run(binary_reader(Bin), small(byte_size(Bin), Opts)).

%%%===================================================================
%%% Internal
%%%===================================================================

%% A reader: `Read(Pos, N)' gives up to N bytes from Pos on and the reader
%% to use next, or `eof'. A regular file is read with pread, so that the
%% end of a chunk after its last sample is read again with the next chunk
%% instead of being copied in front of it; text in memory is not copied at
%% all; other files (a pipe) keep what they read from Pos on.
file_reader(Fd, true) ->
    fun(Pos, N) ->
        case file:pread(Fd, Pos, N) of
            {ok, Data} -> {ok, Data, file_reader(Fd, true)};
            Other -> Other
        end
    end;
file_reader(Fd, false) ->
    stream_reader(Fd, 0, <<>>).

stream_reader(Fd, Start, Buf) ->
    fun(Pos, N) ->
        Skip = Pos - Start,
        Keep = binary:part(Buf, Skip, byte_size(Buf) - Skip),
        case file:read(Fd, max(1, N - byte_size(Keep))) of
            {ok, Data} ->
                Both = <<Keep/binary, Data/binary>>,
                {ok, Both, stream_reader(Fd, Pos, Both)};
            eof when Keep =:= <<>> ->
                eof;
            eof ->
                {ok, Keep, stream_reader(Fd, Pos, Keep)};
            Other ->
                Other
        end
    end.

binary_reader(Bin) ->
    fun(Pos, N) ->
        case byte_size(Bin) - Pos of
            0 -> eof;
            Left -> {ok, binary:part(Bin, Pos, min(N, Left)), binary_reader(Bin)}
        end
    end.

%% Input of one chunk or less goes to one worker with an ordinary heap:
%% starting workers with 4 MiB heaps costs more than folding it.
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
            feed(Read, CS, 0, 0, Workers, Workers, #{}, 0)
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
                    Merged = lists:foldl(fun beamdiag_fold_profile:merge/2,
                                         beamdiag_fold_profile:empty(),
                                         [P || {ok, P} <- Profiles]),
                    P2 = Merged#{bytes := Bytes,
                                 huge_lines := maps:get(huge_lines, Merged) + Huge0},
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
%% workers round-robin, at most two chunks in flight per worker. The text
%% from Pos to End was read but not handed out yet; each read takes it and
%% the next CS bytes, so the chunks are the same whatever the reader.
feed(Read, CS, Pos, End, [], All, InFlight, Huge) ->
    feed(Read, CS, Pos, End, All, All, InFlight, Huge);
feed(Read, CS, Pos, End, [W | Ws], All, InFlight, Huge) ->
    case Read(Pos, End - Pos + CS) of
        {ok, Buf, Read2} when byte_size(Buf) > End - Pos ->
            End2 = Pos + byte_size(Buf),
            case cut(Buf, byte_size(Buf) >= End - Pos + CS) of
                Size when is_integer(Size) ->
                    InFlight2 = send(W, binary:part(Buf, 0, Size), InFlight),
                    feed(Read2, CS, Pos + Size, End2, Ws, All, InFlight2, Huge);
                none when byte_size(Buf) > 4 * CS ->
                    %% No line end in a long stretch: binary junk or one
                    %% huge line; drop it.
                    feed(Read2, CS, End2, End2, [W | Ws], All, InFlight, Huge + 1);
                none ->
                    feed(Read2, CS, Pos, End2, [W | Ws], All, InFlight, Huge)
            end;
        {ok, Buf, _} when Buf =/= <<>> ->
            %% Nothing new: the end of the input.
            wait_all(send(W, Buf, InFlight)),
            {ok, End, Huge};
        {ok, <<>>, _} ->
            wait_all(InFlight),
            {ok, End, Huge};
        eof ->
            wait_all(InFlight),
            {ok, End, Huge};
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

%% The size of a buffer's head up to its last sample boundary (a blank
%% line) in its last ?TAIL bytes, or anywhere when there is none there,
%% or, when the buffer is a full read (Full), up to its last line end when
%% the text has no blank lines (perf script without call chains); `none'
%% without a line end, or without a blank line in a read that came short
%% (the input's end, or a pipe that has no more yet): more is read, and at
%% the input's end the rest goes whole, so that the last sample is not cut
%% from its last line.
cut(Buf, Full) ->
    Size = byte_size(Buf),
    Tail = min(Size, ?TAIL),
    case last_blank(Buf, Size, min(Tail, ?NEAREST_END)) of
        none -> cut(Buf, Size, Tail, Full);
        Pos -> Pos + 2
    end.

cut(Buf, Size, Tail, Full) ->
    case last_blank(Buf, Size, min(Tail, ?NEAR_END)) of
        none ->
            case last_match(Buf, <<"\n\n">>, {Size - Tail, Tail}) of
                none ->
                    case last_match(Buf, <<"\n\n">>, {0, Size}) of
                        none when not Full ->
                            none;
                        none ->
                            case last_match(Buf, <<"\n">>, {Size - Tail, Tail}) of
                                none -> none;
                                Pos -> Pos + 1
                            end;
                        Pos ->
                            Pos + 2
                    end;
                Pos ->
                    Pos + 2
            end;
        Pos ->
            Pos + 2
    end.

%% The last blank line in the last Near bytes, found as a search of the
%% last ?TAIL bytes would find it (the search for a two-byte pattern runs
%% at a few hundred MB/s: a sample is a few KiB, so the blank line is
%% nearly always near the end). A run of line ends across the start of
%% the nearer scope could be paired differently: then `none', and the
%% caller searches the whole tail.
last_blank(Buf, Size, Near) ->
    Start = Size - Near,
    case Start > 0 andalso binary:at(Buf, Start) =:= $\n of
        true -> none;
        false -> last_match(Buf, <<"\n\n">>, {Start, Near})
    end.

last_match(Buf, Pattern, Scope) ->
    case binary:matches(Buf, Pattern, [{scope, Scope}]) of
        [] ->
            none;
        Ms ->
            {Pos, _} = lists:last(Ms),
            Pos
    end.
