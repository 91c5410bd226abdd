%%% @doc Lab scenarios for the node's limits: a node that leaks atoms,
%%% processes, ports or ETS tables at a steady rate, towards a limit it
%%% would reach in minutes.
%%%
%%% <ul>
%%% <li>`atom_leak': one process decodes outside data all the time, as a
%%% service decodes what clients send (`binary_to_term/1' of external-format
%%% lists of about 40,000 terms), and some of it names new atoms; or, with
%%% `how => list_to_atom', turns strings into atoms. The default atom limit
%%% (1,048,576).</li>
%%% <li>`process_leak': one process spawns processes that never end, under
%%% `+P 32768'.</li>
%%% <li>`port_leak': one process opens UDP sockets and keeps them, under
%%% `+Q 4096'.</li>
%%% <li>`ets_leak': one process creates ETS tables and keeps them (the
%%% runtime enforces no table limit since OTP 21).</li>
%%% </ul>
%%%
%%% Parameters: `rate' (units a second) and, for atoms, `how'. The leak
%%% stops at `stop_at' of the limit (default 0.8; ETS tables at 20,000), so
%%% that a lab node never dies of it; the workload's time bound ends it
%%% too.
%%%
%%% ```
%%% 1> {ok, Lab} = beamdiag_lab:start(atom_leak, #{duration => 60, params => #{rate => 2000}}).
%%% '''
-module(beamdiag_lab_limits).

-export([scenarios/0, params/1]).
%% Workloads, called on the lab node.
-export([leak/3]).
-ignore_xref([{leak, 3}]).
%% Called as Module:params/1 by beamdiag_lab.
-ignore_xref([{params, 1}]).

-export_type([params/0]).

%% The variation, merged over the scenario's defaults (which give `rate'
%% and `stop_at'; `how' is the atom leak's).
-type params() :: #{
    rate => 1..100000,
    how => binary_to_term | list_to_atom,
    stop_at => float()
}.

%% Batches a second.
-define(TICKS, 20).
-define(ETS_STOP, 20000).
-define(LEAKER, beamdiag_lab_leaker).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The leak scenarios.
-spec scenarios() -> [beamdiag_lab:scenario()].
scenarios() ->
    Base = #{modules => [beamdiag_lab_ledger], warmup_ms => 500, expect => [node_limit]},
    [Base#{name => atom_leak,
           summary => <<"one process decodes outside data into new atoms, 5,000 a second: the "
                        "atom table is full in minutes (params: rate, how)">>,
           emu_args => [], load => {?MODULE, leak, ['$duration_ms', atoms, '$params']},
           params => #{rate => 5000, how => binary_to_term, stop_at => 0.8}},
     Base#{name => process_leak,
           summary => <<"one process spawns processes that never end, 500 a second, under "
                        "+P 32768 (params: rate)">>,
           emu_args => ["+P", "32768"], load => {?MODULE, leak, ['$duration_ms', processes, '$params']},
           params => #{rate => 500, stop_at => 0.8}},
     Base#{name => port_leak,
           summary => <<"one process opens UDP sockets and keeps them, 100 a second, under "
                        "+Q 4096 (params: rate)">>,
           emu_args => ["+Q", "4096"], load => {?MODULE, leak, ['$duration_ms', ports, '$params']},
           params => #{rate => 100, stop_at => 0.8}},
     Base#{name => ets_leak,
           summary => <<"one process creates ETS tables and keeps them, 200 a second (params: "
                        "rate)">>,
           emu_args => [], load => {?MODULE, leak, ['$duration_ms', ets_tables, '$params']},
           params => #{rate => 200, stop_at => 0.8}}].

%% @doc The variation checked: a rate from 1 to 100,000 a second, `how'
%% one of binary_to_term and list_to_atom, `stop_at' a share of the limit.
-spec params(beamdiag_lab:params()) -> {ok, params()} | {error, {beamdiag_lab, term()}}.
params(P) ->
    Bad = maps:filter(fun(rate, R) -> not (is_integer(R) andalso R >= 1 andalso R =< 100000);
                         (how, H) -> not lists:member(H, [binary_to_term, list_to_atom]);
                         (stop_at, S) -> not (is_float(S) andalso S > 0 andalso S < 0.95);
                         (_, _) -> true
                      end, P),
    case map_size(Bad) of
        0 -> {ok, P};
        _ -> {error, {beamdiag_lab, {params, leak, Bad}}}
    end.

%% @doc One leaking process for Ms milliseconds.
-spec leak(pos_integer(), atoms | processes | ports | ets_tables, params()) -> ok.
leak(Ms, What, P) ->
    Rate = maps:get(rate, P),
    Stop = case What of
               ets_tables -> ?ETS_STOP;
               _ -> round(maps:get(stop_at, P, 0.8) * limit(What))
           end,
    How = maps:get(how, P, binary_to_term),
    beamdiag_lab_ledger:owner(Ms, fun() ->
        L = spawn_link(fun() ->
                           process_flag(trap_exit, true),
                           case What of
                               atoms ->
                                   decoder(How, Rate, Stop, erlang:monotonic_time(millisecond), 0);
                               _ ->
                                   loop(What, How, max(1, Rate div ?TICKS), Stop, 0, [])
                           end
                       end),
        true = register(?LEAKER, L),
        [L]
    end).

%%%===================================================================
%%% Internal
%%%===================================================================

limit(atoms) -> erlang:system_info(atom_limit);
limit(processes) -> erlang:system_info(process_limit);
limit(ports) -> erlang:system_info(port_limit).

count(processes) -> erlang:system_info(process_count);
count(ports) -> erlang:system_info(port_count);
count(ets_tables) -> erlang:system_info(ets_count).

%% Decodes requests without a pause; each takes the new atoms its share of
%% the rate allows (none past the stop count).
decoder(How, Rate, Stop, T0, Made) ->
    Due = (erlang:monotonic_time(millisecond) - T0) * Rate div 1000,
    New = case erlang:system_info(atom_count) < Stop of
              true -> max(0, min(50, Due - Made));
              false -> 0
          end,
    _ = request(How, Made, New),
    receive
        {'EXIT', _, _} -> ok
    after 0 -> ok
    end,
    decoder(How, Rate, Stop, T0, Made + New).

%% 40,000 terms of a known atom and a number, encoded once (a decode that
%% large yields and resumes, as binary_to_term does for large input).
known() ->
    case get(known) of
        undefined ->
            K = iolist_to_binary(lists:duplicate(20000, [[100, 0, 2, "ok"], [97, 7]])),
            put(known, K),
            K;
        K ->
            K
    end.

%% One request: about 40,000 terms of known atoms and numbers, and New
%% names not seen before, decoded as binary_to_term/1 or made by
%% list_to_atom/1.
request(binary_to_term, Made, New) ->
    Names = [iolist_to_binary(["beamdiag_leak_", integer_to_list(Made + I)])
             || I <- lists:seq(1, New)],
    Ext = iolist_to_binary([131, 108, <<(40000 + New):32>>, known(),
                            [[119, byte_size(Nm), Nm] || Nm <- Names], 106]),
    binary_to_term(Ext);
request(list_to_atom, Made, New) ->
    _ = [list_to_atom(integer_to_list(I)) || I <- lists:seq(1, 2000)],
    [list_to_atom("beamdiag_leak_" ++ integer_to_list(Made + I)) || I <- lists:seq(1, New)].

%% A batch every 1/?TICKS s while under the stop count; what it made is
%% kept (the processes are linked to the leaker, the ports and tables
%% owned by it: all die with it).
loop(What, How, Batch, Stop, N, Kept) ->
    Kept2 = case count(What) < Stop of
                true -> make(What, How, Batch, N) ++ Kept;
                false -> Kept
            end,
    receive
        {'EXIT', _, _} -> ok
    after 1000 div ?TICKS -> ok
    end,
    loop(What, How, Batch, Stop, N + Batch, Kept2).

make(processes, _, Batch, _N) ->
    [spawn_link(fun() -> receive stop -> ok end end) || _ <- lists:seq(1, Batch)];
make(ports, _, Batch, _N) ->
    [S || _ <- lists:seq(1, Batch), {ok, S} <- [gen_udp:open(0, [{ip, loopback}])]];
make(ets_tables, _, Batch, _N) ->
    [ets:new(beamdiag_leak, []) || _ <- lists:seq(1, Batch)].
