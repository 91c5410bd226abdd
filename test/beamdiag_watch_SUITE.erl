%%% `beamdiag watch' on a real terminal: the escript runs in a tmux session
%%% of its own against a lab node; the screen is read back with
%%% capture-pane. Checks that the ledger shows and refreshes, that `q',
%%% Ctrl-C and the end of the duration all exit 0 with the terminal's mode
%%% put back, that colour follows NO_COLOR, and that the screen fits 80
%%% columns with 128 schedulers.
-module(beamdiag_watch_SUITE).

-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0, suite/0, init_per_suite/1, end_per_suite/1]).
-export([refreshes_and_q_quits/1, ctrl_c_quits_without_colour/1, duration_ends/1,
         fits_80_columns_with_128_schedulers/1]).

suite() ->
    [{timetrap, {minutes, 3}}].

all() ->
    [fits_80_columns_with_128_schedulers, refreshes_and_q_quits, ctrl_c_quits_without_colour,
     duration_ends].

init_per_suite(Config) ->
    case {os:find_executable("tmux"), beamdiag_test_lib:escript()} of
        {false, _} ->
            ct:fail("tmux is not installed (scripts/setup.sh test installs it)");
        {_, error} ->
            ct:fail("no escript: build it first (rebar3 escriptize)");
        {Tmux, {ok, Escript}} ->
            {ok, Lab} = beamdiag_lab:start(busy_wait, #{duration => 150}),
            Socket = "beamdiag_ct_" ++ os:getpid(),
            [{tmux, Tmux}, {socket, Socket}, {escript, Escript}, {lab, Lab} | Config]
    end.

end_per_suite(Config) ->
    _ = tmux(Config, ["kill-server"]),
    beamdiag_lab:stop(?config(lab, Config)),
    ok.

%%%===================================================================
%%% Cases
%%%===================================================================

refreshes_and_q_quits(Config) ->
    S = session(Config, "q", "--interval 500", "-u NO_COLOR"),
    Screen1 = wait_for(S, Config, <<"TIME LEDGER">>, 30000),
    ?assertNotEqual(nomatch, binary:match(Screen1, <<"scheduler">>)),
    Tick1 = tick(Screen1),
    Screen2 = wait_until(S, Config, fun(Sc) -> tick(Sc) > Tick1 end, 10000),
    ct:log("first:~n~ts~nlater:~n~ts", [Screen1, Screen2]),
    fits(Screen2),
    %% On a terminal, without NO_COLOR: coloured.
    Raw = capture(S, Config, ["-e"]),
    ?assertNotEqual(nomatch, binary:match(Raw, <<"\e[3">>)),
    _ = tmux(Config, ["send-keys", "-t", S, "q"]),
    After = wait_for(S, Config, <<"MODE ">>, 10000),
    restored(After).

ctrl_c_quits_without_colour(Config) ->
    S = session(Config, "c", "--interval 500", "NO_COLOR=1"),
    _ = wait_for(S, Config, <<"TIME LEDGER">>, 30000),
    Raw = capture(S, Config, ["-e"]),
    ct:log("~ts", [Raw]),
    ?assertEqual(nomatch, re:run(Raw, <<"\e\\[[0-9;]*m">>)),
    _ = tmux(Config, ["send-keys", "-t", S, "C-c"]),
    After = wait_for(S, Config, <<"MODE ">>, 10000),
    restored(After).

duration_ends(Config) ->
    S = session(Config, "d", "--interval 500 --duration 3", ""),
    _ = wait_for(S, Config, <<"TIME LEDGER">>, 30000),
    After = wait_for(S, Config, <<"MODE ">>, 20000),
    restored(After).

%% A frame for a node with 128 schedulers: aggregated by type, a few
%% outliers, at most 80 columns and one screen high.
fits_80_columns_with_128_schedulers(_Config) ->
    Sched = [thread(scheduler, I, 0.2 + 0.6 * (I rem 7) / 7) || I <- lists:seq(1, 128)],
    Dirty = [thread(dirty_cpu, I, 0.05) || I <- lists:seq(1, 128)],
    Threads = Sched ++ Dirty,
    Sum = fun(Rows) ->
              maps:put(n, length(Rows),
                       maps:from_list([{K, lists:sum([maps:get(K, R) || R <- Rows])}
                                       || K <- [wall, busy, on_cpu, user, sys, runq, off_cpu,
                                                spin, blocked]]))
          end,
    L = #{window_s => 1.0, threads => Threads,
          by_type => #{scheduler => Sum(Sched), dirty_cpu => Sum(Dirty)},
          totals => #{cpus_used => 90.5, cpus_available => 128.0},
          host => #{ncpu => 128, busy => 0.7, steal => 0.0}, cgroup => #{}},
    C = #{node => <<"big@host-with-a-rather-long-name.example.com">>,
          settings => #{otp_release => <<"27">>, schedulers_online => 128,
                        dirty_cpu_schedulers_online => 128, sbwt => <<"medium">>}},
    F = [beamdiag_finding:new(Id, warning, [binary:copy(<<"long evidence ">>, 20)], #{})
         || Id <- [busy_wait, cpu_starvation, scheduler_imbalance, cpu_saturated, dirty_cpu_gc]],
    Frame = iolist_to_binary(beamdiag_format_watch:frame(#{capture => C, ledger => L, findings => F},
                                                  #{colour => false, tick => 12345,
                                                    clock => "12:34:56"})),
    ct:log("~ts", [Frame]),
    fits(Frame),
    Lines = string:split(Frame, <<"\n">>, all),
    ?assert(length(Lines) =< 30),
    ok.

%%%===================================================================
%%% Internal
%%%===================================================================

thread(Type, I, Busy) ->
    #{tid => I, name => iolist_to_binary([integer_to_list(I), "_", atom_to_list(Type)]),
      type => Type, index => I, wall => 1.0, busy => Busy, on_cpu => Busy + 0.1,
      user => Busy, sys => 0.1, runq => 0.02, off_cpu => 0.88 - Busy, spin => 0.1,
      blocked => 0.0}.

%% Starts the watch in a tmux session of its own; the shell then prints the
%% exit code and the terminal's mode, and stays so the pane can be read.
session(Config, Suffix, Args, Env) ->
    Lab = ?config(lab, Config),
    Name = "w" ++ Suffix,
    Cmd = lists:flatten(io_lib:format(
        "env ~s BEAMDIAG_COOKIE=~s ~s watch ~s ~s; echo EXIT=$?; "
        "echo MODE $(stty -a | grep -o -- '-*icanon\\|-*isig\\|-*echo ' | tr '\\n' ' '); "
        "sleep 120",
        [Env, beamdiag_lab:cookie(Lab), ?config(escript, Config), beamdiag_lab:node(Lab), Args])),
    {0, _} = tmux(Config, ["new-session", "-d", "-s", Name, "-x", "80", "-y", "30", Cmd]),
    Name.

%% The mode line printed after the watch exited: canonical input, signals
%% and echo are back on.
restored(Screen) ->
    ?assertNotEqual(nomatch, binary:match(Screen, <<"EXIT=0">>)),
    {match, [Mode]} = re:run(Screen, <<"MODE ([^\n]*)">>, [{capture, all_but_first, binary}]),
    ct:log("terminal mode after exit: ~ts", [Mode]),
    Words = string:lexemes(Mode, " "),
    ?assert(lists:member(<<"icanon">>, Words)),
    ?assert(lists:member(<<"isig">>, Words)),
    ?assert(lists:member(<<"echo">>, Words)),
    ok.

fits(Screen) ->
    Long = [L || L <- string:split(Screen, <<"\n">>, all), string:length(L) > 80],
    ?assertEqual([], Long).

tick(Screen) ->
    case re:run(Screen, <<"tick ([0-9]+)">>, [{capture, all_but_first, binary}]) of
        {match, [N]} -> binary_to_integer(N);
        nomatch -> -1
    end.

wait_for(S, Config, Text, Ms) ->
    wait_until(S, Config, fun(Sc) -> binary:match(Sc, Text) =/= nomatch end, Ms).

wait_until(S, Config, Pred, Ms) ->
    Shows = fun() ->
        Screen = capture(S, Config, []),
        {Pred(Screen), Screen}
    end,
    case beamdiag_test_lib:poll(Shows, Ms) of
        {ok, Screen} -> Screen;
        {timeout, Screen} -> ct:fail({screen, S, Screen})
    end.

capture(S, Config, Extra) ->
    {0, Out} = tmux(Config, ["capture-pane", "-p", "-t", S] ++ Extra),
    Out.

tmux(Config, Args) ->
    Port = open_port({spawn_executable, ?config(tmux, Config)},
                     [{args, ["-L", ?config(socket, Config) | Args]}, exit_status, binary,
                      stderr_to_stdout, hide]),
    beamdiag_test_lib:read_port(Port, 10000).
