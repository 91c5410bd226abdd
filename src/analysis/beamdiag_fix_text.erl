%%% @doc Fixes fitted to the node. The catalogue writes a fix that depends
%%% on the node as parts (`beamdiag_catalogue:part()'); this module fills
%%% them in from the node's settings: flags the node already has are left
%%% out and named as set, flags its OTP release does not document are never
%%% advised, and the text around them is the catalogue's, word for word.
%%% The flags a fix may advise, with the release that brought them and the
%%% manual page that documents them, are the flag table's
%%% (`beamdiag_flags', `advised_flags/0'); a test checks them against
%%% erl(1) of every OTP release it can find.
%%%
%%% ```
%%% 1> beamdiag_fix_text:fix(busy_wait, #{sbwt => <<"none">>, otp_release => <<"25">>}).
%%% <<"Start the node with +sbwtdcpu none +sbwtdio none (in vm.args, or ERL_FLAGS) "
%%%   "(+sbwt none is already set). Prove it with ...">>
%%% '''
-module(beamdiag_fix_text).

-export([fix/2]).
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

-ifdef(TEST).
%% @doc Every emulator flag a fix may advise, with the values it may
%% advise, the first OTP release that has it and its manual page: the
%% rows of the flag table (`beamdiag_flags') that list values to advise.
-spec advised_flags() -> [flag()].
advised_flags() ->
    [#{flag => O, values => Vs, since => Since, doc => Doc, meaning => M}
     || #{option := O, advise := Vs = [_ | _], since := Since, doc := Doc, meaning := M}
            <- beamdiag_flags:table()].
-endif.

%% @doc True when the node's OTP release documents the flag (the table's
%% `since'); a node whose release is unknown is taken to have it.
-spec documented(binary(), beamdiag_agent_vm:settings()) -> boolean().
documented(Flag, S) ->
    beamdiag_flags:documented(Flag, S).

%% @doc The fix for a finding on a node with these settings: the
%% catalogue's text, with the parts it marks fitted to the node (flags the
%% node already has left out, and said to be set).
-spec fix(beamdiag_catalogue:id(), beamdiag_agent_vm:settings()) -> binary().
fix(Id, S) ->
    case beamdiag_catalogue:entry(Id) of
        #{fitted := Parts} -> iolist_to_binary(fit(Parts, S, <<>>));
        #{fix := Fix} -> Fix
    end.

%%%===================================================================
%%% Internal
%%%===================================================================

fit(Parts, S, Value) ->
    [fit_part(P, S, Value) || P <- Parts].

fit_part(B, _S, _Value) when is_binary(B) ->
    B;
fit_part(value, _S, Value) ->
    Value;
fit_part(P, _S, _Value) when P =:= flags; P =:= already ->
    <<>>;
fit_part({flags, Wanted, Todo, Done}, S, _Value) ->
    {Set, Have} = wanted(S, Wanted),
    Fill = fun(flags) -> flags(Set);
              (already) -> already(Have);
              (P) -> fit_part(P, S, <<>>)
           end,
    case Set of
        [] -> [Fill(P) || P <- Done];
        _ -> [Fill(P) || P <- Todo]
    end;
fit_part({has, Test, Then, Else}, S, _Value) ->
    case test(Test, S) of
        {true, V} -> fit(Then, S, V);
        false -> fit(Else, S, <<>>)
    end;
fit_part({documented, Flag, Then, Else}, S, Value) ->
    case documented(Flag, S) of
        true -> fit(Then, S, Value);
        false -> fit(Else, S, Value)
    end.

%% Whether the node's settings pass a catalogue test, with the value the
%% text may quote (printable, or `?').
test({in, Keys = [First | _], Values}, S) ->
    case lists:all(fun(K) -> lists:member(value(K, S, undefined), Values) end, Keys) of
        true -> {true, printable(value(First, S, undefined))};
        false -> false
    end;
test({changed, Key}, S) ->
    test({not_in, Key, [beamdiag_flags:default(Key)]}, S);
test({not_in, Key, Values = [Default | _]}, S) ->
    V = value(Key, S, Default),
    case lists:member(V, Values) of
        true -> false;
        false -> {true, printable(V)}
    end.

%% A setting: a flag's value or its documented default; another key's
%% value, or `Default'.
value(Key, S, Default) ->
    case [K || #{key := K} <- beamdiag_flags:table(), K =:= Key] of
        [_] -> setting(Key, S);
        [] -> case maps:get(Key, S, Default) of
                  V when is_binary(V) -> V;
                  _ -> Default
              end
    end.

printable(V) when is_binary(V), byte_size(V) =< 32 ->
    case re:run(V, "^[A-Za-z0-9_.:]+$", [{capture, none}]) of
        match -> V;
        nomatch -> <<"?">>
    end;
printable(_) ->
    <<"?">>.

%% A flag's value as the agent reports it (a binary), or its documented
%% default.
setting(K, S) ->
    beamdiag_flags:value(K, S).

%% The wanted flags its release documents, split into those to set and
%% those the node has.
wanted(S, Wanted) ->
    lists:partition(fun({K, V}) -> setting(K, S) =/= V end,
                    [W || W = {K, _} <- Wanted, documented(atom_to_binary(K), S)]).

flags(Fs) ->
    lists:join(" ", [["+", atom_to_list(K), " ", V] || {K, V} <- Fs]).

already([]) -> "";
already(Have) -> [" (", flags(Have), case Have of [_] -> " is"; _ -> " are" end,
                  " already set)"].
