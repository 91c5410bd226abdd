%%% The node that waits instead of burning, and the node that runs out of
%%% a limit, on OTP 25 and 29: a plain file:open of a FIFO nobody writes
%%% (wait_chain), senders suspended on a busy distribution port to a peer
%%% that reads slowly (busy_port), an atom leak (node_limit). Each case
%%% checks the raw signal on the node first, then the diagnosis (4 s
%%% window) and its latency from the call.
-module(beamdiag_waits_SUITE).
-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0, groups/0, suite/0, init_per_group/2, end_per_group/2, init_per_testcase/2,
         end_per_testcase/2]).
-export([fifo_open/1, busy_dist/1, atom_leak/1]).

-define(WINDOW, 4).

-spec suite() -> [tuple()].
suite() -> [{timetrap, {minutes, 3}}].

-spec all() -> [term()].
all() ->
    [{group, otp25}, {group, otp29}].

-spec groups() -> [term()].
groups() ->
    Cases = [fifo_open, busy_dist, atom_leak],
    [{otp25, [], Cases}, {otp29, [], Cases}].

-spec init_per_group(atom(), list()) -> list() | {skip, term()}.
init_per_group(otp25, Config) ->
    Config;
init_per_group(otp29, Config) ->
    beamdiag_test_lib:release_config(29, Config).

-spec end_per_group(atom(), list()) -> ok.
end_per_group(_, _) ->
    ok.

%% Each case its own lab node (stopped, or killed, whatever the case did).
-spec init_per_testcase(atom(), list()) -> list().
init_per_testcase(Case, Config) ->
    Opts = case proplists:get_value(exec, Config) of
               undefined -> #{duration => 60};
               Exec -> #{duration => 60, exec => Exec}
           end,
    beamdiag_test_lib:case_lab(Case, Opts, Config).

-spec end_per_testcase(atom(), list()) -> ok.
end_per_testcase(_, Config) ->
    beamdiag_test_lib:end_case_lab(Config).

%%% Cases

%% The raw signal: the file server sits in file_io_server:do_start/4 with
%% the callers' requests queued; then wait_chain names it, the NIF the
%% chain ends in and the callers, on time.
-spec fifo_open(list()) -> term().
fifo_open(Config) ->
    Lab = ?config(lab, Config),
    Peer = maps:get(peer, Lab),
    {Cur, Q} = beamdiag_test_lib:eval(Peer,
        "FS = whereis(file_server_2),"
        "[{current_function, C}, {message_queue_len, Q}] ="
        "    erlang:process_info(FS, [current_function, message_queue_len]), {C, Q}."),
    ct:pal("file_server_2 in ~p with ~b queued", [Cur, Q]),
    ?assertEqual({file_io_server, do_start, 4}, Cur),
    ?assert(Q >= 4),
    {D, Took} = timed_diagnose(Lab),
    F = findings(D, Took),
    [W] = [X || X = #{id := wait_chain} <- F],
    M = maps:get(metrics, W),
    ?assertEqual(<<"file_server_2">>, maps:get(name, M)),
    ?assert(maps:get(waiters, M) >= 8),
    ?assertEqual(<<"prim_file:open_nif/2">>, maps:get(ends_in, M)),
    ?assertEqual(critical, maps:get(severity, W)),
    Ev = iolist_to_binary(lists:join("\n", maps:get(evidence, W))),
    ?assertMatch({_, _}, binary:match(Ev, <<"beamdiag_lab_waits:caller/0">>)),
    ?assertMatch({_, _}, binary:match(Ev, <<"blocked in the kernel">>)),
    on_time(Took).

%% The raw signal: the senders are suspended and the distribution port to
%% the peer has bytes pending; then busy_port names the port and the peer,
%% and (when the capture is whole) how much of the window they spent
%% suspended, on time.
-spec busy_dist(list()) -> term().
busy_dist(Config) ->
    Lab = ?config(lab, Config),
    Peer = maps:get(peer, Lab),
    {Suspended, Pend} = beamdiag_test_lib:eval(Peer,
        "Ss = [P || P <- erlang:processes(),"
        "           {status, suspended} =:= erlang:process_info(P, status)],"
        "[{_, Port}] = erlang:system_info(dist_ctrl),"
        "{ok, [{send_pend, Pend}]} = prim_inet:getstat(Port, [send_pend]),"
        "{length(Ss), Pend}."),
    ct:pal("~b processes suspended, ~b bytes pending on the distribution port",
           [Suspended, Pend]),
    ?assert(Suspended >= 6),
    {D, Took} = timed_diagnose(Lab),
    F = findings(D, Took),
    [B] = [X || X = #{id := busy_port} <- F],
    M = maps:get(metrics, B),
    ?assert(maps:get(suspended, M) >= 6),
    ?assertMatch(<<"beamdiag_lab_slow_peer_", _/binary>>, maps:get(peer, M)),
    ?assertMatch(<<"#Port<", _/binary>>, maps:get(port, M)),
    Ev = iolist_to_binary(lists:join("\n", maps:get(evidence, B))),
    ?assertMatch({_, _}, binary:match(Ev, <<"dist_buf_busy_limit">>)),
    %% The walker's status samples come with the end walk: a capture cut
    %% short has the start's look alone.
    case maps:get(complete, maps:get(capture, D)) of
        true -> ?assertMatch({_, _}, binary:match(Ev, <<"samples">>));
        false -> ok
    end,
    on_time(Took).

%% The raw signal: the atom count grows by more than 1,000 a second; then
%% node_limit for atoms, with the time left and the decoder named.
-spec atom_leak(list()) -> term().
atom_leak(Config) ->
    Lab = ?config(lab, Config),
    Peer = maps:get(peer, Lab),
    A0 = peer:call(Peer, erlang, system_info, [atom_count]),
    timer:sleep(500),
    A1 = peer:call(Peer, erlang, system_info, [atom_count]),
    ct:pal("atoms ~b -> ~b in 0.5 s", [A0, A1]),
    ?assert(A1 - A0 > 500),
    {D, Took} = timed_diagnose(Lab),
    F = findings(D, Took),
    [L] = [X || X = #{id := node_limit} <- F],
    M = maps:get(metrics, L),
    ?assertEqual(<<"atoms">>, maps:get(resource, M)),
    ?assert(maps:get(rate_per_s, M) > 1000),
    ?assert(is_integer(maps:get(seconds_left, M))),
    ?assertEqual(critical, maps:get(severity, L)),
    Ev = iolist_to_binary(lists:join("\n", maps:get(evidence, L))),
    ct:log("~ts", [Ev]),
    ?assertMatch({_, _}, binary:match(Ev, <<"beamdiag_lab_leaker">>)),
    ?assertMatch({_, _}, binary:match(Ev, <<"makes atoms">>)),
    on_time(Took).

%%% Helpers

timed_diagnose(Lab) ->
    T0 = erlang:monotonic_time(millisecond),
    {ok, D} = beamdiag:diagnose(beamdiag_lab:node(Lab), #{cookie => beamdiag_lab:cookie(Lab),
                                                          duration => ?WINDOW}),
    {D, erlang:monotonic_time(millisecond) - T0}.

findings(#{findings := F, capture := C}, Took) ->
    ct:pal("findings ~p; took ~b ms; complete ~p; notes ~p",
           [[{Id, S} || #{id := Id, severity := S} <- F], Took, maps:get(complete, C),
            maps:get(notes, C)]),
    F.

on_time(Took) ->
    beamdiag_test_lib:on_time(Took, ?WINDOW).
