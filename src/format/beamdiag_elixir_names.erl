%%% @doc Names of Elixir code as Elixir prints them in stack traces, for a
%%% report on a node that runs Elixir: `'Elixir.Shop.Pricing':'-total/1-fun-0-'/2'
%%% reads `anonymous fn/2 in Shop.Pricing.total/1', `'Elixir.Enum':reduce/3'
%%% reads `Enum.reduce/3' (the rules of Elixir's `Exception.format_mfa/3'),
%%% and the agent's name for what a process spawned from a fun runs, `a fun
%%% in Elixir.Shop.Worker:start/1', reads `anonymous fn in
%%% Shop.Worker.start/1'.
%%% Names of Erlang modules stay as they are. And on a node that runs
%%% Elixir, the Erlang terms of a fix in Elixir's (`gen_server:call' is
%%% `GenServer.call', `{write_concurrency, true}' is
%%% `write_concurrency: true').
%%%
%%% Everything here is pure. `diagnosis/1' gives a diagnosis whose names
%%% (top processes, profile frames, findings' evidence and, on an Elixir
%%% node, fixes) read the Elixir way, for the text and HTML formats; the
%%% JSON keeps the names as the node gave them.
%%%
%%% ```
%%% 1> beamdiag_elixir_names:mfa(<<"Elixir.Shop.Pricing:-total/1-fun-0-/2">>).
%%% <<"anonymous fn/2 in Shop.Pricing.total/1">>
%%% 2> beamdiag_elixir_names:mfa(<<"$'Elixir.Enum':reduce/3">>).
%%% <<"$Enum.reduce/3">>
%%% 3> beamdiag_elixir_names:mfa(<<"lists:foldl/3">>).
%%% <<"lists:foldl/3">>
%%% '''
-module(beamdiag_elixir_names).

-export([diagnosis/1, flame/1]).
-ifdef(TEST).
-export([mfa/1, text/1, fix/1, profile/1]).
-endif.

%% Operators Elixir prints bare after a module and a dot (Kernel.+/2).
-define(OPERATORS,
        [<<"@">>, <<"+">>, <<"-">>, <<"!">>, <<"^">>, <<"not">>, <<"~~~">>, <<"*">>, <<"/">>,
         <<"**">>, <<"++">>, <<"--">>, <<"+++">>, <<"---">>, <<"<>">>, <<"in">>, <<"|>">>,
         <<"<<<">>, <<">>>">>, <<"<<~">>, <<"~>>">>, <<"<~">>, <<"~>">>, <<"<~>">>, <<"<|>">>,
         <<"<">>, <<">">>, <<"<=">>, <<">=">>, <<"==">>, <<"!=">>, <<"=~">>, <<"===">>,
         <<"!==">>, <<"&&">>, <<"&&&">>, <<"and">>, <<"||">>, <<"|||">>, <<"or">>, <<"=">>,
         <<"\\\\">>, <<"<-">>, <<"|">>, <<"::">>, <<"when">>, <<"&">>, <<"^^^">>]).

%% An Elixir name inside free text: a module (quoted, or Elixir.Alias), a
%% function (quoted, or up to a space or punctuation) and its arity; a
%% perf frame's `$' before it.
-define(IN_TEXT,
        "(\\$)?(?:'(Elixir\\.(?:[^'\\\\]|\\\\.)*)'|(Elixir\\.[A-Za-z0-9_.]+)):"
        "(?:'((?:[^'\\\\]|\\\\.)*)'|([^\\s,;()\\[\\]{}'\"]+))/([0-9]+)").

%% The agent's `a fun in' before an Elixir function's name
%% (beamdiag_agent_proc_identity: a process spawned from a fun).
-define(FUN_IN_TEXT, "(?<![A-Za-z0-9_])a fun in (?='?Elixir\\.)").

%% A module's name inside free text, not part of a longer word nor of a
%% call: Elixir. and its alias (each part capitalised; possessive, so
%% that a name followed by a colon is left whole, not in part).
-define(MODULE_IN_TEXT,
        "(?<![A-Za-z0-9_.'])Elixir\\.([A-Z][A-Za-z0-9_]*+(?:\\.[A-Z][A-Za-z0-9_]*+)*+)(?![A-Za-z0-9_:'])").

%% The Erlang phrases the catalogue's fixes use, and Elixir's for them.
-define(FIX_PHRASES,
        [{<<"gen_server:call">>, <<"GenServer.call">>},
         {<<"gen_server:cast">>, <<"GenServer.cast">>},
         {<<"erlang:process_info(self(), message_queue_len)">>,
          <<"Process.info(self(), :message_queue_len)">>},
         {<<"erlang:system_flag(schedulers_online, N)">>,
          <<":erlang.system_flag(:schedulers_online, n)">>},
         {<<"erlang:processes/0">>, <<"Process.list/0">>},
         {<<"{buffer, Bytes}">>, <<"buffer: bytes">>},
         {<<"{active, N}">>, <<"active: n">>}]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc One function's name, as the agent gives it (`Mod:Fun/Arity',
%% atoms as they are) or as a perf frame (`$Mod:Fun/Arity', atoms quoted
%% as Erlang quotes them, a suffix after the arity kept): the Elixir way
%% when the module is an Elixir module, else unchanged. A perf frame keeps
%% its `$', the mark of JIT code (the profile's figures count by it).
-spec mfa(binary()) -> binary().
mfa(Name) when is_binary(Name) ->
    case split_mfa(Name) of
        {ok, <<"Elixir.", _/binary>> = Mod, Fun, Arity, Suffix} ->
            Jit = case Name of
                      <<"$", _/binary>> -> "$";
                      _ -> ""
                  end,
            iolist_to_binary([Jit, format_mfa(Mod, Fun, Arity), Suffix]);
        _ ->
            Name
    end.

%% @doc Every Elixir function name inside a text, the Elixir way (`a fun
%% in' one, the agent's words for a process's fun, as `anonymous fn in'),
%% then every module name left (a process registered under its module's
%% name, `Elixir.Shop.Store', reads `Shop.Store').
-spec text(unicode:chardata()) -> binary().
text(Text) ->
    Bin = unicode:characters_to_binary(Text),
    case binary:match(Bin, <<"Elixir.">>) of
        nomatch ->
            Bin;
        _ ->
            Funs = re:replace(Bin, ?FUN_IN_TEXT, "anonymous fn in ",
                              [global, unicode, {return, binary}]),
            Calls = case re:run(Funs, ?IN_TEXT, [global, unicode, {capture, all, index}]) of
                        {match, Ms} -> replace(Funs, Ms, 0, []);
                        nomatch -> Funs
                    end,
            re:replace(Calls, ?MODULE_IN_TEXT, "\\1", [global, unicode, {return, binary}])
    end.

%% @doc A fix in Elixir's terms: the Erlang phrases of the catalogue's
%% fixes, `{option, value}' pairs as keyword options, and `mod:fun/N'
%% calls of Erlang modules as Elixir calls them (`:ets.new/2').
-spec fix(unicode:chardata()) -> binary().
fix(Text) ->
    T0 = lists:foldl(fun({E, X}, T) -> binary:replace(T, E, X, [global]) end,
                     unicode:characters_to_binary(Text), ?FIX_PHRASES),
    T1 = re:replace(T0, "\\{([a-z][a-z_]*), (true|false|[0-9]+)\\}", "\\1: \\2",
                    [global, {return, binary}]),
    T2 = re:replace(T1, "\\{([a-z][a-z_]*), ([a-z][a-z_]*)\\}", "\\1: :\\2",
                    [global, {return, binary}]),
    re:replace(T2, "(?<![A-Za-z0-9_.:$])([a-z][a-z0-9_]*):([a-z][A-Za-z0-9_]*)(/[0-9]+|\\()",
               ":\\1.\\2\\3", [global, {return, binary}]).

%% @doc A diagnosis for the text and HTML formats: its function names the
%% Elixir way (top processes, profile frames, findings' evidence), and on
%% a node that runs Elixir its fixes in Elixir's terms.
-spec diagnosis(beamdiag_diagnosis:diagnosis()) -> beamdiag_diagnosis:diagnosis().
diagnosis(D = #{capture := C}) ->
    Elixir = maps:get(elixir, maps:get(settings, C, #{}), false) =:= true,
    D#{capture := capture(C),
       findings := [finding(F, Elixir) || F <- maps:get(findings, D, [])]};
diagnosis(D) ->
    D.

%% @doc A folded profile (`beamdiag_fold') with its frames the Elixir way.
-spec profile(beamdiag_fold:profile()) -> beamdiag_fold:profile().
profile(P = #{stacks := Stacks}) ->
    P#{stacks := maps:fold(fun(K, V, Acc) ->
                                   K2 = frames(K),
                                   Acc#{K2 => V + maps:get(K2, Acc, 0)}
                           end, #{}, Stacks)};
profile(P) ->
    P.

%% @doc A profile as `beamdiag_profile:profile/3' returns it, for `flame':
%% its frames and its findings' evidence the Elixir way.
-spec flame(beamdiag_profile_rules:result()) -> beamdiag_profile_rules:result().
flame(R) ->
    R1 = profile_result(R),
    case R1 of
        #{findings := Fs} -> R1#{findings := [finding(F, false) || F <- Fs]};
        _ -> R1
    end.

%%%===================================================================
%%% Internal
%%%===================================================================

profile_result(R = #{profile := P}) ->
    R1 = R#{profile := profile(P)},
    R2 = case R1 of
             #{callers := Cs} -> R1#{callers := profile(Cs)};
             _ -> R1
         end,
    case R2 of
        #{by_process := B} when is_list(B) -> R2#{by_process := [by_process(X) || X <- B]};
        _ -> R2
    end;
profile_result(R) ->
    R.

capture(C = #{extras := Extras}) ->
    E1 = case Extras of
             #{procs := Procs} when is_map(Procs) -> Extras#{procs := procs(Procs)};
             _ -> Extras
         end,
    E2 = case E1 of
             #{profile := R} -> E1#{profile := profile_result(R)};
             _ -> E1
         end,
    C#{extras := E2};
capture(C) ->
    C.

procs(P) ->
    maps:map(fun(K, L) when is_list(L), (K =:= top_reductions orelse K =:= queues
                                        orelse K =:= heaps orelse K =:= processes
                                        orelse K =:= heap_growth orelse K =:= binaries
                                        orelse K =:= stalled) ->
                     [process(E) || E <- L];
                (born, B = #{groups := Gs}) when is_list(Gs) ->
                     B#{groups := [group(G) || G <- Gs]};
                (_, V) ->
                     V
             end, P).

%% A group of newborn processes: what they run, and who spawned them (an
%% entry, its `parent' as process/1 reads any).
group(G) ->
    process(G).

%% A process entry: its functions, a registered name that is an Elixir
%% module's (a GenServer named after its module), and its spawner's, the
%% Elixir way.
process(E) when is_map(E) ->
    maps:map(fun(initial_call, <<"a fun in ", _/binary>> = V) ->
                     text(V);
                (K, V) when is_binary(V), (K =:= initial_call orelse K =:= spawn_call
                                          orelse K =:= current orelse K =:= in
                                          orelse K =:= out orelse K =:= own) ->
                     mfa(V);
                (name, <<"Elixir.", _/binary>> = V) ->
                     iolist_to_binary(module(V));
                (parent, V) when is_map(V) ->
                     process(V);
                (_, V) ->
                     V
             end, E);
process(E) ->
    E.

%% The Erlang sampler's stacks of one process.
by_process(X = #{stacks := S}) when is_list(S) ->
    X#{stacks := [case St of
                      #{stack := K} -> St#{stack := frames(K)};
                      _ -> St
                  end || St <- S]};
by_process(X) ->
    X.

frames(Frames) when is_list(Frames) ->
    [case F of
         B when is_binary(B) -> mfa(B);
         _ -> F
     end || F <- Frames];
frames(Other) ->
    Other.

finding(F, Elixir) ->
    F1 = case F of
             #{evidence := Ev} when is_list(Ev) -> F#{evidence := [text(E) || E <- Ev]};
             _ -> F
         end,
    case {Elixir, F1} of
        {true, #{fix := Fix}} -> F1#{fix := fix(Fix)};
        _ -> F1
    end.

replace(Bin, [], At, Acc) ->
    iolist_to_binary(lists:reverse(Acc, [binary:part(Bin, At, byte_size(Bin) - At)]));
replace(Bin, [[{S, L} | Groups] | Ms], At, Acc) ->
    [Jit, QMod, Mod, QFun, Fun, Arity] = [group(Bin, G) || G <- pad(Groups, 6)],
    Module = case QMod of
                 <<>> -> Mod;
                 _ -> unquote(QMod)
             end,
    Function = case Fun of
                   <<>> -> unquote(QFun);
                   _ -> Fun
               end,
    New = [Jit, format_mfa(Module, Function, Arity)],
    replace(Bin, Ms, S + L, [New, binary:part(Bin, At, S - At) | Acc]).

pad(Groups, N) ->
    Groups ++ lists:duplicate(N - length(Groups), {-1, 0}).

group(_Bin, {-1, 0}) -> <<>>;
group(Bin, {S, L}) -> binary:part(Bin, S, L).

%% Mod:Fun/Arity, the atoms quoted or not, after an optional `$', and
%% whatever follows the arity (a perf map's `-CodeInfoPrologue').
split_mfa(<<"$", Rest/binary>>) ->
    split_mfa(Rest);
split_mfa(<<"'", Rest/binary>>) ->
    case quoted(Rest, <<>>) of
        {ok, Mod, <<":", FunArity/binary>>} -> split_fun(Mod, FunArity);
        _ -> error
    end;
split_mfa(Name) ->
    case binary:split(Name, <<":">>) of
        [Mod, FunArity] when Mod =/= <<>> -> split_fun(Mod, FunArity);
        _ -> error
    end.

split_fun(Mod, <<"'", Rest/binary>>) ->
    case quoted(Rest, <<>>) of
        {ok, Fun, <<"/", ArityAndMore/binary>>} -> arity(Mod, Fun, ArityAndMore);
        _ -> error
    end;
split_fun(Mod, FunArity) ->
    case binary:matches(FunArity, <<"/">>) of
        [] ->
            error;
        Slashes ->
            %% The last slash followed by digits to the end, or to a suffix.
            {At, 1} = lists:last(Slashes),
            Fun = binary:part(FunArity, 0, At),
            case Fun of
                <<>> -> error;
                _ -> arity(Mod, Fun, binary:part(FunArity, At + 1, byte_size(FunArity) - At - 1))
            end
    end.

arity(Mod, Fun, Bin) ->
    Digits = digits(Bin, 0),
    case Digits of
        0 -> error;
        _ ->
            <<Arity:Digits/binary, Suffix/binary>> = Bin,
            case Suffix of
                <<>> -> {ok, Mod, Fun, Arity, Suffix};
                <<"-", _/binary>> -> {ok, Mod, Fun, Arity, Suffix};
                _ -> error
            end
    end.

digits(<<C, Rest/binary>>, N) when C >= $0, C =< $9 -> digits(Rest, N + 1);
digits(_, N) -> N.

%% The text of a quoted Erlang atom (after its opening quote) and what
%% follows its closing one.
quoted(<<"\\", C, Rest/binary>>, Acc) -> quoted(Rest, <<Acc/binary, C>>);
quoted(<<"'", Rest/binary>>, Acc) -> {ok, Acc, Rest};
quoted(<<C, Rest/binary>>, Acc) -> quoted(Rest, <<Acc/binary, C>>);
quoted(<<>>, _Acc) -> error.

unquote(Bin) ->
    case quoted(<<Bin/binary, "'">>, <<>>) of
        {ok, Text, <<>>} -> Text;
        _ -> Bin
    end.

%% Elixir's Exception.format_mfa/3 for an Elixir module; anything else as
%% Erlang writes it.
format_mfa(<<"Elixir.", _/binary>> = Mod, Fun, Arity) ->
    M = module(Mod),
    case anonymous_parent(Fun) of
        {Outer, OuterArity} ->
            iolist_to_binary(["anonymous fn/", Arity, " in ", M, ".", remote_call(Outer), "/",
                              OuterArity]);
        error ->
            iolist_to_binary([M, ".", remote_call(Fun), "/", Arity])
    end;
format_mfa(Mod, Fun, Arity) ->
    iolist_to_binary([Mod, ":", Fun, "/", Arity]).

%% `-total/1-fun-0-' is an anonymous function in total/1.
anonymous_parent(<<"-", Rest/binary>>) ->
    Parts = binary:split(Rest, <<"/">>, [global]),
    {Before, [Trailing]} = lists:split(length(Parts) - 1, Parts),
    case {Before, binary:split(Trailing, <<"-">>, [global])} of
        {[_ | _], [Arity, _Inner, _Count, <<>>]} ->
            {iolist_to_binary(lists:join(<<"/">>, Before)), Arity};
        _ ->
            error
    end;
anonymous_parent(_) ->
    error.

%% `Elixir.Shop.Pricing' is Shop.Pricing; a module that is no alias is
%% quoted, as Elixir does.
module(<<"Elixir.", Alias/binary>> = Mod) ->
    case lists:all(fun is_alias_part/1, binary:split(Alias, <<".">>, [global])) of
        true -> Alias;
        false -> [":", quote(Mod)]
    end.

is_alias_part(<<C, Rest/binary>>) when C >= $A, C =< $Z ->
    lists:all(fun(X) -> (X >= $a andalso X =< $z) orelse (X >= $A andalso X =< $Z)
                            orelse (X >= $0 andalso X =< $9) orelse X =:= $_ end,
              binary_to_list(Rest));
is_alias_part(_) ->
    false.

%% A function name after the dot: bare when it is an identifier or an
%% operator Elixir calls that way, else quoted.
remote_call(Fun) ->
    case is_identifier(Fun) orelse lists:member(Fun, ?OPERATORS) of
        true -> Fun;
        false -> quote(Fun)
    end.

is_identifier(Fun) ->
    case unicode:characters_to_list(Fun) of
        [C | Rest] when (C >= $a andalso C =< $z) orelse C =:= $_ orelse C > 127 ->
            Body = case lists:reverse(Rest) of
                       [E | R] when E =:= $?; E =:= $! -> lists:reverse(R);
                       _ -> Rest
                   end,
            (C =< 127 orelse is_lower_letter(C)) andalso
                lists:all(fun(X) -> (X >= $a andalso X =< $z) orelse (X >= $A andalso X =< $Z)
                                        orelse (X >= $0 andalso X =< $9) orelse X =:= $_
                                        orelse X > 127
                          end, Body);
        _ ->
            false
    end.

%% A letter that is not upper case (Elixir's identifiers start with one).
is_lower_letter(C) ->
    string:uppercase([C]) =/= [C] orelse string:lowercase([C]) =:= [C].

quote(Bin) ->
    Chars = case unicode:characters_to_list(Bin) of
                L when is_list(L) -> L;
                _ -> binary_to_list(Bin)
            end,
    Escaped = lists:map(fun($") -> "\\\"";
                           ($\\) -> "\\\\";
                           ($\n) -> "\\n";
                           (C) -> C
                        end, Chars),
    unicode:characters_to_binary([$", re:replace(Escaped, "#\\{", "\\\\#{",
                                                 [global, unicode, {return, list}]), $"]).
