%%% @doc The emulator flags beamdiag reads and advises, as the host sees
%%% them: the one flag table (`beamdiag_agent_vm:flags/0', kept beside the
%%% code that reads the flags on the target) and the lookups the rules, the
%%% fixes and the reports share: a node's value of a flag, or the emulator's
%%% documented default when the node's settings do not say; whether the
%%% node's OTP release documents a flag.
%%%
%%% ```
%%% 1> beamdiag_flags:value(sbwtdcpu, #{}).
%%% <<"short">>
%%% 2> beamdiag_flags:value(sbwt, #{sbwt => <<"none">>}).
%%% <<"none">>
%%% '''
-module(beamdiag_flags).

-export([table/0, flag/1, default/1, value/2, documented/2, busy_wait_keys/0,
         busy_wait_off/1, group/1]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Every flag, as `beamdiag_agent_vm:flags/0' lists it.
-spec table() -> [beamdiag_agent_vm:flag()].
table() ->
    beamdiag_agent_vm:flags().

%% @doc One flag's row, by its settings key; crashes on a key the table
%% does not have.
-spec flag(atom()) -> beamdiag_agent_vm:flag().
flag(Key) ->
    case [F || F = #{key := K} <- table(), K =:= Key] of
        [F] -> F;
        [] -> error({unknown_flag, Key})
    end.

%% @doc The emulator's documented default of a flag (`undefined' where it
%% depends on the machine).
-spec default(atom()) -> binary() | undefined.
default(Key) ->
    maps:get(default, flag(Key)).

%% @doc The node's value of a flag as the agent reported it, or the
%% documented default when the settings lack it (or hold something other
%% than a binary).
-spec value(atom(), beamdiag_agent_vm:settings()) -> binary() | undefined.
value(Key, Settings) ->
    case maps:get(Key, Settings, undefined) of
        V when is_binary(V) -> V;
        _ -> default(Key)
    end.

%% @doc True when the node's OTP release documents the flag (the table's
%% `since'); a node whose release is unknown is taken to have it. The flag
%% is named as written after `+' (`<<"Mdai">>').
-spec documented(binary(), beamdiag_agent_vm:settings()) -> boolean().
documented(Option, Settings) ->
    Release = case maps:get(otp_release, Settings, <<"0">>) of
                  R when is_binary(R) ->
                      try binary_to_integer(R) catch error:badarg -> 0 end;
                  _ -> 0
              end,
    case [Since || #{option := O, since := Since} <- table(), O =:= Option] of
        [Since] -> Release =:= 0 orelse Release >= Since;
        [] -> false
    end.

%% @doc The busy-wait flags, one per scheduler type.
-spec busy_wait_keys() -> [atom()].
busy_wait_keys() ->
    [sbwt, sbwtdcpu, sbwtdio].

%% @doc True when busy waiting is off on every scheduler type.
-spec busy_wait_off(beamdiag_agent_vm:settings()) -> boolean().
busy_wait_off(Settings) ->
    lists:all(fun(K) -> value(K, Settings) =:= <<"none">> end, busy_wait_keys()).

%% @doc The flags the agent reads, by the part of the VM they tune, in the
%% table's order: `scheduling' (busy wait, wake-up, load balancing) and
%% `memory' (allocators); `emulator' for the rest.
-spec group(scheduling | memory | emulator) -> [atom()].
group(Group) ->
    [K || #{key := K, read := true, doc := Doc} <- table(), group_of(K, Doc) =:= Group].

%%%===================================================================
%%% Internal
%%%===================================================================

group_of(jpperf, _) -> emulator;
group_of(_, erts_alloc) -> memory;
group_of(_, erl) -> scheduling.
