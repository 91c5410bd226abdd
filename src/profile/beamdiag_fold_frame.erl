%%% @doc Frame names: a `perf script' call-chain line to the name the
%%% folded stack shows, and what kind of frame a name is.
%%%
%%% The name is the symbol without its `+0x..' offset; a symbol perf could
%%% not name but whose object it knows becomes `[object]' (for example
%%% `[beam.smp]' for a static function of a stripped emulator); JIT code
%%% perf could not name is `[unknown] (object)', unless a JIT perf map
%%% (`beamdiag_fold_perf_map') names its address; only an address perf
%%% could place nowhere is `[unknown]'. The end-of-unwind marker that DWARF
%%% unwinding leaves (address `ffffffffffffffff' or `0') is `drop'; a line
%%% that is no frame is `junk'. Names never hold `;' or line ends.
%%%
%%% The name depends on the address only when perf could not name the
%%% symbol, or named JIT code after a module since purged (a later line of
%%% the perf map covers it: `beamdiag_fold_perf_map:stale/2'; the map's
%%% latest line for the address names it): `symbol/2' names a line from
%%% its text after the address alone, or says that the address is needed,
%%% so that the folder can
%%% cache names by that text (`is_address/1' checks the address field of
%%% the usual layout).
%%%
%%% ```
%%% 1> beamdiag_fold_frame:parse(<<"\t 7f01 lists:foldl/3+0x1c (/tmp/perf-1.map)">>, undefined).
%%% <<"lists:foldl/3">>
%%% 2> beamdiag_fold_frame:kind(<<"lists:foldl/3">>).
%%% erlang
%%% '''
-module(beamdiag_fold_frame).

-export([parse/2, unknown/2, is_address/1, symbol/2, kind/1, sanitize/1, is_digits/1]).

-export_type([name/0]).

-type name() :: binary() | drop | junk.

-define(UNKNOWN, <<"[unknown]">>).
-define(IS_HEX(C), ((C >= $0 andalso C =< $9) orelse (C >= $a andalso C =< $f) orelse
                    (C >= $A andalso C =< $F))).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc "\t    7f96... sym+0x1f (dso)" -> frame name | drop | junk.
-spec parse(binary(), beamdiag_fold_perf_map:entries() | undefined) -> name().
parse(Line0, Map) ->
    Line = skip_ws(Line0),
    case binary:match(Line, <<" ">>) of
        nomatch ->
            junk;
        {Sp, 1} ->
            <<Addr:Sp/binary, " ", Rest/binary>> = Line,
            case is_hex(Addr) of
                false -> junk;
                true -> name(Addr, Rest, Map)
            end
    end.

%% @doc Whether a frame line's address field (the sixteen bytes after its
%% tab) is an address: spaces, then hex digits to its end. For a line
%% `<<$\t, Field:16/binary, $\s, Rest/binary>>' with such a field,
%% `parse/2' gives what `symbol/2' gives for `Rest', unless that is
%% `address'.
-spec is_address(binary()) -> boolean().
is_address(Field) ->
    is_hex(skip_spaces(Field)).

%% @doc The name that a frame line's text after its address
%% (`sym+0x1f (dso)') gives, whatever the address; `address' when the
%% name depends on the address (a symbol perf could not name: the perf
%% map names it, or it is the end-of-unwind marker). Frame lines repeat
%% their text after the address far more than their addresses, so the
%% folder caches names by it (`is_address/1').
-spec symbol(binary(), beamdiag_fold_perf_map:entries() | undefined) -> name() | address.
symbol(Rest, Map) ->
    {Sym0, Dso} = split_dso(Rest),
    Sym = strip_offset(Sym0),
    case Sym of
        ?UNKNOWN when Dso =:= ?UNKNOWN; Dso =:= <<>> ->
            address;
        ?UNKNOWN ->
            case jit_object(Dso) of
                true when Map =:= undefined -> <<"[unknown] (", (sanitize(Dso))/binary, ")">>;
                true -> address;
                false -> <<"[", (basename(Dso))/binary, "]">>
            end;
        <<>> ->
            junk;
        _ when Dso =:= <<"[kernel.kallsyms]">> ->
            <<(sanitize(Sym))/binary, "_[k]">>;
        _ when Map =/= undefined ->
            %% A name of code since purged, where code loaded later may be
            %% now: the map's latest line for the address says.
            Name = sanitize(Sym),
            case beamdiag_fold_perf_map:stale(Map, Name) andalso jit_object(Dso) of
                true -> address;
                false -> Name
            end;
        _ ->
            sanitize(Sym)
    end.

%% @doc A line ending in `[unknown] ([unknown])': an address perf could
%% place nowhere, named by the perf map if there is one.
-spec unknown(binary(), beamdiag_fold_perf_map:entries() | undefined) -> name().
unknown(Line, Map) ->
    unknown_frame(skip_ws(Line), Map).

%% @doc What a frame name is: an Erlang function (`$lists:foldl/3' or
%% `lists:foldl/3'), a kernel or native function, JIT code perf could not
%% name (`[unknown] (/memfd:vmem (deleted))'), a native function of a known
%% object without a name (`[beam.smp]'), or an address perf could place
%% nowhere (`[unknown]').
-spec kind(binary()) -> beamdiag_fold:frame_kind().
kind(?UNKNOWN) -> unknown;
kind(<<"[unknown] (", _/binary>>) -> unnamed_jit;
kind(<<"[no stack]">>) -> unknown;
kind(<<"[other stacks]">>) -> unknown;
kind(<<"[", _/binary>>) -> unnamed_native;
kind(F) when byte_size(F) > 4, binary_part(F, byte_size(F), -4) =:= <<"_[k]">> -> kernel;
kind(<<"$global::", _/binary>>) -> native;
kind(<<"$", Rest/binary>>) -> erlang_or_native(Rest);
kind(F) -> erlang_or_native(F).

%% @doc Frame names go into ';'-separated folded lines: no ';' or line ends.
-spec sanitize(binary()) -> binary().
sanitize(B) ->
    case binary:match(B, [<<";">>, <<"\r">>, <<"\n">>]) of
        nomatch -> B;
        _ -> binary:replace(B, [<<";">>, <<"\r">>, <<"\n">>], <<"_">>, [global])
    end.

%% @doc Whether a binary is one or more decimal digits.
-spec is_digits(binary()) -> boolean().
is_digits(<<>>) -> false;
is_digits(B) -> is_digits1(B).

%%%===================================================================
%%% Internal
%%%===================================================================

unknown_frame(<<"ffffffffffffffff ", _/binary>>, _Map) ->
    drop;
unknown_frame(<<"0 ", _/binary>>, _Map) ->
    drop;
unknown_frame(_Line, undefined) ->
    ?UNKNOWN;
unknown_frame(Line, Map) ->
    parse(Line, Map).

name(Addr, Rest, Map) ->
    case symbol(Rest, Map) of
        address -> by_address(Addr, Rest, Map);
        Name -> Name
    end.

%% A symbol perf could not name (`symbol/2' gave `address').
by_address(Addr, Rest, Map) ->
    case split_dso(Rest) of
        {_, Dso} when Dso =:= ?UNKNOWN; Dso =:= <<>> ->
            case Addr of
                <<"ffffffffffffffff">> -> drop;
                <<"0">> -> drop;
                _ -> resolve(Addr, Map)
            end;
        {Sym0, Dso} ->
            %% JIT code perf could not name (the perf map perf could not
            %% read: a container's /tmp, or no map), or named after code
            %% since purged.
            case {resolve(Addr, Map), strip_offset(Sym0)} of
                {?UNKNOWN, ?UNKNOWN} -> <<"[unknown] (", (sanitize(Dso))/binary, ")">>;
                {?UNKNOWN, Sym} -> sanitize(Sym);
                {Name, _} -> Name
            end
    end.

resolve(_Addr, undefined) ->
    ?UNKNOWN;
resolve(Addr, Map) ->
    case beamdiag_fold_perf_map:lookup(Map, binary_to_integer(Addr, 16)) of
        none -> ?UNKNOWN;
        Name -> Name
    end.

%% "sym+0x1f (dso)" -> {"sym+0x1f", "dso"}. The object is the last
%% parenthesised group, read from the end with the parentheses balanced:
%% "[unknown] (/memfd:vmem (deleted))" is {"[unknown]", "/memfd:vmem (deleted)"}.
split_dso(Rest) ->
    N = byte_size(Rest),
    case N > 0 andalso binary:last(Rest) =:= $) of
        false -> {Rest, <<>>};
        true ->
            case open_paren(Rest, N - 2, 0) of
                Pos when is_integer(Pos), Pos >= 1 ->
                    case binary:at(Rest, Pos - 1) of
                        $\s ->
                            {binary:part(Rest, 0, Pos - 1),
                             binary:part(Rest, Pos + 1, N - Pos - 2)};
                        _ ->
                            {Rest, <<>>}
                    end;
                _ ->
                    {Rest, <<>>}
            end
    end.

open_paren(_Bin, I, _Depth) when I < 0 -> none;
open_paren(Bin, I, Depth) ->
    case binary:at(Bin, I) of
        $) -> open_paren(Bin, I - 1, Depth + 1);
        $( when Depth =:= 0 -> I;
        $( -> open_paren(Bin, I - 1, Depth - 1);
        _ -> open_paren(Bin, I - 1, Depth)
    end.

%% Objects that hold JIT code: the JIT's memfd mapping (OTP 26+ with
%% +JMsingle), anonymous executable memory, a perf map perf named but could
%% not read, a perf inject --jit object.
jit_object(<<"/memfd:", _/binary>>) -> true;
jit_object(<<"//anon", _/binary>>) -> true;
jit_object(<<"[anon", _/binary>>) -> true;
jit_object(Dso) ->
    Base = basename(Dso),
    (binary:longest_common_prefix([Base, <<"perf-">>]) =:= 5 andalso
         binary:longest_common_suffix([Base, <<".map">>]) =:= 4)
        orelse binary:longest_common_prefix([Base, <<"jitted-">>]) =:= 7.

strip_offset(Sym) ->
    case binary:matches(Sym, <<"+0x">>) of
        [] ->
            Sym;
        Ms ->
            {P, _} = lists:last(Ms),
            binary:part(Sym, 0, P)
    end.

basename(Path) ->
    case binary:matches(Path, <<"/">>) of
        [] -> sanitize(Path);
        Ms ->
            {P, _} = lists:last(Ms),
            sanitize(binary:part(Path, P + 1, byte_size(Path) - P - 1))
    end.

%% Eight spaces at a time: a frame line's address is right-aligned in a
%% field of sixteen.
skip_ws(<<"        ", R/binary>>) -> skip_ws(R);
skip_ws(<<C, R/binary>>) when C =:= $\s; C =:= $\t -> skip_ws(R);
skip_ws(B) -> B.

is_hex(<<>>) -> false;
is_hex(B) -> is_hex1(B).

skip_spaces(<<"        ", R/binary>>) -> skip_spaces(R);
skip_spaces(<<"    ", R/binary>>) -> skip_spaces(R);
skip_spaces(<<$\s, R/binary>>) -> skip_spaces(R);
skip_spaces(B) -> B.

%% Four digits at a time: addresses are twelve or sixteen digits long.
is_hex1(<<A, B, C, D, R/binary>>) when ?IS_HEX(A), ?IS_HEX(B), ?IS_HEX(C), ?IS_HEX(D) -> is_hex1(R);
is_hex1(<<>>) -> true;
is_hex1(<<C, R/binary>>) when C >= $0, C =< $9; C >= $a, C =< $f; C >= $A, C =< $F -> is_hex1(R);
is_hex1(_) -> false.

elixir_name(F) ->
    case {binary:matches(F, <<"/">>), binary:match(F, <<".">>)} of
        {[_ | _] = Ms, {_, 1}} ->
            {S, 1} = lists:last(Ms),
            case is_digits(binary:part(F, S + 1, byte_size(F) - S - 1)) of
                true -> erlang;
                false -> native
            end;
        _ ->
            native
    end.

is_digits1(<<>>) -> true;
is_digits1(<<C, R/binary>>) when C >= $0, C =< $9 -> is_digits1(R);
is_digits1(_) -> false.

%% `mod:fun/arity': a ':' and, after the last '/', digits only. A name an
%% Elixir function is given for the report (beamdiag_elixir_names:
%% `Shop.Pricing.total/1', `anonymous fn/2 in Shop.Pricing.total/1') is
%% Erlang code too.
erlang_or_native(F) ->
    case binary:match(F, <<":">>) of
        nomatch ->
            elixir_name(F);
        {P, 1} ->
            case binary:matches(F, <<"/">>, [{scope, {P, byte_size(F) - P}}]) of
                [] ->
                    native;
                Ms ->
                    {S, 1} = lists:last(Ms),
                    case is_digits(binary:part(F, S + 1, byte_size(F) - S - 1)) of
                        true -> erlang;
                        false -> native
                    end
            end
    end.
