%%% @doc Saved captures: a diagnosis (or an experiment's results) written to
%%% a file and read back, safely.
%%%
%%% The file is a header line, `beamdiag-capture 1\n', then a frame:
%%% the body's length (64 bits), its CRC-32 (32 bits) and the body,
%%% `term_to_binary(Payload, [compressed])'. The payload holds the raw
%%% capture (every sample), the ledger and findings as they were when saved,
%%% the settings, and the versions of beamdiag and OTP that wrote it.
%%%
%%% Loading is safe on any input: files over 256 MB are refused before they
%%% are read, the frame tells truncation from corruption, the compressed
%%% size is bounded before inflating, and the payload holds no atoms at all:
%%% every atom is written as `{'$a', Name}' and read back with
%%% `binary_to_existing_atom/2' (a name the running code does not know stays
%%% a binary), so `binary_to_term(Body, [safe])' creates nothing. A
%%% diagnosis is analysed again on load, so an old capture gets the current
%%% rules.
%%%
%%% ```
%%% 1> {ok, D} = beamdiag:diagnose(#{duration => 2}).
%%% 2> ok = beamdiag_capture_file:save("node.capture", D).
%%% 3> {ok, D2} = beamdiag_capture_file:load("node.capture").
%%% 4> maps:get(findings, D2) =:= maps:get(findings, D).
%%% true
%%% '''
-module(beamdiag_capture_file).

-include_lib("kernel/include/file.hrl").

-export([save/2, load/1, read/1, format_error/1]).
%% Called as Module:format_error/1 on an {error, {Module, Reason}} value.
-ignore_xref([{format_error, 1}]).
%% Called by the tests only.
-ifdef(TEST).
-export([encode/1, decode/1]).
-endif.

-export_type([content/0]).

-type content() :: {diagnosis, beamdiag_diagnosis:diagnosis()} | {experiment, map()}.
-define(MAGIC, "beamdiag-capture ").
-define(VERSION, 1).
-define(MAX_FILE, (256 * 1024 * 1024)).
%% Bound on the inflated size of a compressed body.
-define(MAX_INFLATED, (1024 * 1024 * 1024)).
-define(ATOM_TAG, '$a').

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Writes a diagnosis, or an experiment's results (a map with
%% `kind => experiment'), to File. The file is written whole to a temporary
%% name and renamed, so a reader never sees half a capture.
-spec save(file:filename(), beamdiag_diagnosis:diagnosis() | beamdiag_experiment_stats:result()) ->
    ok | {error, {beamdiag_capture_file, term()}}.
save(File, Content) when is_map(Content) ->
    Kind = kind(Content),
    Payload = #{
        format => ?VERSION,
        kind => Kind,
        beamdiag_vsn => vsn(),
        otp_release => list_to_binary(erlang:system_info(otp_release)),
        saved_at_ms => erlang:system_time(millisecond),
        body => body(Kind, Content)
    },
    Body = term_to_binary(encode(Payload), [compressed]),
    Data = [?MAGIC, integer_to_list(?VERSION), "\n",
            <<(byte_size(Body)):64, (erlang:crc32(Body)):32>>, Body],
    Tmp = lists:concat([File, ".tmp.", os:getpid()]),
    case file:write_file(Tmp, Data) of
        ok ->
            case file:rename(Tmp, File) of
                ok -> ok;
                {error, R} ->
                    _ = file:delete(Tmp),
                    {error, {beamdiag_capture_file, {write, File, R}}}
            end;
        {error, R} ->
            _ = file:delete(Tmp),
            {error, {beamdiag_capture_file, {write, File, R}}}
    end.

%% @doc Reads a saved diagnosis and analyses it again with the current
%% rules. A file holding an experiment is an error here; see `read/1'.
-spec load(file:filename()) -> {ok, beamdiag_diagnosis:diagnosis()} | {error, {beamdiag_capture_file, term()}}.
load(File) ->
    case read(File) of
        {ok, {diagnosis, D}} -> {ok, D};
        {ok, {Kind, _}} -> {error, {beamdiag_capture_file, {wrong_kind, File, Kind}}};
        {error, _} = E -> E
    end.

%% @doc Reads any saved file: a diagnosis (analysed again) or experiment
%% results (each run's diagnosis analysed again).
-spec read(file:filename()) -> {ok, content()} | {error, {beamdiag_capture_file, term()}}.
read(File) ->
    %% The size is checked before anything is read.
    case file:read_file_info(File) of
        {ok, #file_info{size = Size}} when Size > ?MAX_FILE ->
            {error, {beamdiag_capture_file, {too_large, File, Size, ?MAX_FILE}}};
        {ok, _} ->
            case file:read_file(File) of
                {ok, Bin} when byte_size(Bin) > ?MAX_FILE ->
                    {error, {beamdiag_capture_file, {too_large, File, byte_size(Bin), ?MAX_FILE}}};
                {ok, Bin} ->
                    case parse(Bin) of
                        {ok, Payload} -> content(File, Payload);
                        {error, R} -> {error, {beamdiag_capture_file, with_file(File, R)}}
                    end;
                {error, R} ->
                    {error, {beamdiag_capture_file, {read, File, R}}}
            end;
        {error, R} ->
            {error, {beamdiag_capture_file, {read, File, R}}}
    end.

%% @doc The atom-free form of a term: atoms become `{'$a', Name}', pids,
%% ports, references and funs their printed form.
-spec encode(term()) -> term().
encode(A) when is_atom(A) -> {?ATOM_TAG, atom_to_binary(A)};
encode(L) when is_list(L) -> encode_list(L);
encode(T) when is_tuple(T) -> list_to_tuple([encode(E) || E <- tuple_to_list(T)]);
encode(M) when is_map(M) -> maps:from_list([{encode(K), encode(V)} || {K, V} <- maps:to_list(M)]);
encode(X) when is_pid(X); is_port(X); is_reference(X); is_function(X) ->
    iolist_to_binary(io_lib:format("~p", [X]));
encode(X) -> X.

%% @doc The inverse of `encode/1' for atoms the running code knows; an
%% unknown name stays a binary.
-spec decode(term()) -> term().
decode({?ATOM_TAG, B}) when is_binary(B) ->
    try binary_to_existing_atom(B, utf8)
    catch error:badarg -> B
    end;
decode(L) when is_list(L) -> decode_list(L);
decode(T) when is_tuple(T) -> list_to_tuple([decode(E) || E <- tuple_to_list(T)]);
decode(M) when is_map(M) -> maps:from_list([{decode(K), decode(V)} || {K, V} <- maps:to_list(M)]);
decode(X) -> X.

%% @doc Turns an error reason of this module into a sentence.
-spec format_error(term()) -> iolist().
format_error({write, File, R}) ->
    io_lib:format("cannot write ~ts: ~ts", [File, file:format_error(R)]);
format_error({read, File, R}) ->
    io_lib:format("cannot read ~ts: ~ts", [File, file:format_error(R)]);
format_error({too_large, File, Size, Max}) ->
    io_lib:format("~ts is ~b bytes; captures over ~b MB are refused",
                  [File, Size, Max div (1024 * 1024)]);
format_error({not_a_capture, File}) ->
    io_lib:format("~ts is not a beamdiag capture (no 'beamdiag-capture' header)", [File]);
format_error({unsupported_version, File, V}) ->
    io_lib:format("~ts is a beamdiag capture of format version ~ts; this beamdiag reads "
                  "version ~b", [File, beamdiag_safe_text:safe(V, 40), ?VERSION]);
format_error({truncated, File, Want, Got}) ->
    io_lib:format("~ts is truncated: its body should be ~b bytes, the file holds ~b",
                  [File, Want, Got]);
format_error({trailing_bytes, File, N}) ->
    io_lib:format("~ts has ~b unexpected bytes after the capture", [File, N]);
format_error({corrupt, File, Why}) ->
    io_lib:format("~ts is corrupt: ~ts", [File, Why]);
format_error({bad_content, File, Why}) ->
    io_lib:format("~ts does not hold a capture this beamdiag understands: ~ts", [File, Why]);
format_error({wrong_kind, File, Kind}) ->
    io_lib:format("~ts holds ~s results, not a diagnosis", [File, Kind]).

%%%===================================================================
%%% Internal
%%%===================================================================

kind(#{kind := experiment}) -> experiment;
kind(#{capture := _, ledger := _, findings := _}) -> diagnosis;
kind(Other) -> erlang:error({badarg, {not_a_diagnosis, maps:keys(Other)}}).

body(diagnosis, D) -> maps:with([capture, ledger, findings], D);
body(experiment, E) -> E.

vsn() ->
    _ = application:load(beamdiag),
    case application:get_key(beamdiag, vsn) of
        {ok, V} -> list_to_binary(V);
        undefined -> <<"unknown">>
    end.

parse(<<?MAGIC, Rest/binary>>) ->
    case binary:split(Rest, <<"\n">>) of
        [V, Frame] when byte_size(V) =< 16 ->
            case V of
                <<"1">> -> frame(Frame);
                _ -> {error, {unsupported_version, V}}
            end;
        _ ->
            {error, not_a_capture}
    end;
parse(_) ->
    {error, not_a_capture}.

frame(<<Len:64, Crc:32, Body/binary>>) ->
    if
        byte_size(Body) < Len -> {error, {truncated, Len, byte_size(Body)}};
        byte_size(Body) > Len -> {error, {trailing_bytes, byte_size(Body) - Len}};
        true ->
            case erlang:crc32(Body) of
                Crc -> body_term(Body);
                _ -> {error, {corrupt, "checksum mismatch"}}
            end
    end;
frame(Short) ->
    {error, {truncated, 12, byte_size(Short)}}.

body_term(<<131, 80, Inflated:32, _/binary>>) when Inflated > ?MAX_INFLATED ->
    {error, {corrupt, io_lib:format("the body claims ~b bytes uncompressed", [Inflated])}};
body_term(Body) ->
    %% The writer's atoms are encoded away; [safe] refuses anything else
    %% that would create an atom or a fun.
    known_atoms(),
    try binary_to_term(Body, [safe]) of
        Term -> {ok, decode(Term)}
    catch
        error:badarg -> {error, {corrupt, "the body is not a valid term"}}
    end.

content(File, #{format := ?VERSION, kind := diagnosis, body := #{capture := C}}) when
    is_map(C)
->
    case valid_capture(C) of
        true ->
            try beamdiag_diagnosis:analyse(upgrade(C)) of
                D -> {ok, {diagnosis, D}}
            catch
                Class:Reason ->
                    {error, {beamdiag_capture_file, {bad_content, File,
                        io_lib:format("analysis failed (~p:~P)", [Class, Reason, 8])}}}
            end;
        false ->
            {error, {beamdiag_capture_file,
                     {bad_content, File, "the capture lacks samples or settings"}}}
    end;
content(File, #{format := ?VERSION, kind := experiment, body := E}) when is_map(E) ->
    Runs = maps:get(runs, E, []),
    try
        E2 = E#{runs => [reanalyse(R) || R <- Runs]},
        {ok, {experiment, E2#{summary => beamdiag_experiment_stats:summarise(E2)}}}
    catch
        Class:Reason ->
            {error, {beamdiag_capture_file, {bad_content, File,
                io_lib:format("a run's analysis failed (~p:~P)", [Class, Reason, 8])}}}
    end;
content(File, _) ->
    {error, {beamdiag_capture_file, {bad_content, File, "unknown payload"}}}.

reanalyse(Run = #{diagnosis := #{capture := C}}) when is_map(C) ->
    true = valid_capture(C),
    Run#{diagnosis => beamdiag_diagnosis:analyse(upgrade(C))};
reanalyse(Run) ->
    Run.

%% A capture saved before the formats drew the flamegraph when they print
%% holds the drawing (and the profile's summary) beside the folded stacks:
%% both are drawn again from those.
upgrade(C = #{extras := E = #{profile := P = #{profile := _}}}) ->
    C#{extras := E#{profile := maps:without([svg, summary], P)}};
upgrade(C) ->
    C.

valid_capture(#{samples := S, settings := Set}) when is_list(S), is_map(Set) -> true;
valid_capture(_) -> false.

with_file(File, not_a_capture) -> {not_a_capture, File};
with_file(File, {unsupported_version, V}) -> {unsupported_version, File, V};
with_file(File, {truncated, W, G}) -> {truncated, File, W, G};
with_file(File, {trailing_bytes, N}) -> {trailing_bytes, File, N};
with_file(File, {corrupt, Why}) -> {corrupt, File, Why}.

%% The atoms a capture holds are those of beamdiag's own modules (thread
%% types, ledger fields, finding ids): make sure they exist before decoding.
known_atoms() ->
    _ = application:load(beamdiag),
    Own = [beamdiag_agent, beamdiag_agent_vm, beamdiag_agent_procfs, beamdiag_agent_cgroup, beamdiag_ledger,
           beamdiag_rules, beamdiag_catalogue, beamdiag_threads, beamdiag_lock_data,
           beamdiag_experiment, beamdiag_compare, beamdiag_cluster,
           %% Former names, which captures written before they were
           %% renamed may hold.
           beamdiag_agent_proc, beamdiag_agent_procs, beamdiag_agent_driver],
    Mods = case application:get_key(beamdiag, modules) of
               {ok, Ms} -> lists:usort(Ms ++ Own);
               undefined -> Own
           end,
    _ = [code:ensure_loaded(M) || M <- Mods],
    ok.

encode_list([]) -> [];
encode_list([H | T]) when is_list(T) -> [encode(H) | encode_list(T)];
encode_list([H | T]) -> [encode(H) | encode(T)].

decode_list([]) -> [];
decode_list([H | T]) when is_list(T) -> [decode(H) | decode_list(T)];
decode_list([H | T]) -> [decode(H) | decode(T)].

