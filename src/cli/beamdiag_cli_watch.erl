%%% @doc `beamdiag watch NODE': a live view of where a node's CPU time goes,
%%% refreshed every interval until the duration ends, `q' is pressed or
%%% Ctrl-C.
%%%
%%% On a terminal the screen is redrawn in place, the cursor hidden, and the
%%% terminal put in a mode where single keys (and Ctrl-C) arrive as input;
%%% everything is put back on the way out. Elsewhere (a pipe, a file) each
%%% frame is printed after the last. Colour only on a terminal that wants
%%% it, never with NO_COLOR set.
-module(beamdiag_cli_watch).

-behaviour(beamdiag_cli).

-export([spec/0, run/2]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The command's arguments.
-spec spec() -> beamdiag_cli:spec().
spec() ->
    #{
        name => "watch",
        summary => "Live view of a node: the time ledger by thread type and the top findings.",
        exit_codes => [0, 2, 3, 4],
        example => "beamdiag watch app@db1 --cookie-file /etc/app/cookie --interval 1000",
        positional => [#{key => node, metavar => "NODE", required => true,
                         help => "the node, name@host"}],
        options => beamdiag_cli_options:pick([
            cookie, cookie_file,
            {interval, #{type => {integer, 100, 60000}, help => "time between refreshes"}},
            #{key => duration, long => "--duration", type => {float, 0.5, 86400.0},
              metavar => "SECONDS", help => "stop after this long (default: until q or Ctrl-C)"},
            #{key => samples, long => "--samples", type => {integer, 2, 600}, default => 2,
              metavar => "SAMPLES", help => "samples per ledger (2: the last interval)"},
            #{key => msacc, long => "--msacc", type => boolean, default => false,
              help => "turn on microstate accounting while watching (costs a little)"}
        ])
    }.

%% @doc Runs the command.
-spec run(beamdiag_cli:opts(), beamdiag_cli:io()) -> beamdiag_cli:result().
run(Opts = #{node := Node, interval := I, samples := W}, IO = #{err := Err}) ->
    LibOpts = maps:merge(maps:with([cookie, cookie_file, msacc], Opts),
                         #{interval => I, samples => W,
                           duration => maps:get(duration, Opts, infinity)}),
    Err(["beamdiag: connecting to ", Node, "\n"]),
    case beamdiag_watch:start(Node, LibOpts) of
        {ok, Session} ->
            Tty = terminal(IO),
            Saved = enter(Tty, IO),
            Reader = reader(Tty),
            try
                loop(Session, Opts, IO, Tty, 0)
            after
                stop_reader(Reader),
                leave(Tty, Saved, IO)
            end;
        {error, Error} ->
            beamdiag_cli:fail(Error, IO)
    end.

%%%===================================================================
%%% Internal
%%%===================================================================

loop(Session, Opts = #{interval := I}, IO = #{out := Out, err := Err}, Tty, Tick) ->
    case key() of
        quit ->
            beamdiag_watch:stop(Session),
            0;
        none ->
            case beamdiag_watch:next(Session, min(I, 250)) of
                {ok, S2, D} ->
                    Frame = beamdiag_format_watch:frame(D, #{colour => colour(IO, Tty),
                                                      tick => Tick + 1, clock => clock()}),
                    Out(screen(Frame, Tty)),
                    loop(S2, Opts, IO, Tty, Tick + 1);
                {wait, S2} ->
                    loop(S2, Opts, IO, Tty, Tick);
                {done, _} ->
                    0;
                {error, Error} ->
                    Err("\n"),
                    beamdiag_cli:fail(Error, IO)
            end
    end.

key() ->
    receive
        {beamdiag_key, C} when C =:= $q; C =:= $Q; C =:= 3; C =:= 4; C =:= 27 -> quit;
        {beamdiag_key, eof} -> none;
        {beamdiag_key, _} -> key()
    after 0 ->
        none
    end.

%% In place on a terminal: home, each line cleared to its end, the rest of
%% the screen cleared.
screen(Frame, true) ->
    Lines = string:split(iolist_to_binary(Frame), <<"\n">>, all),
    ["\e[H", lists:join("\e[K\r\n", Lines), "\e[J"];
screen(Frame, false) ->
    [Frame, "\n"].

colour(#{colour := C}, Tty) ->
    C andalso Tty andalso os:getenv("NO_COLOR") =:= false.

%% A terminal on both ends: output to draw on and input for keys.
terminal(IO) ->
    maps:get(terminal, IO,
             io:columns(user) =/= {error, enotsup} andalso stty(["-g"]) =/= error).

%% Saves the terminal's mode, then: keys without Enter, no echo, Ctrl-C as
%% input (so it ends the loop cleanly), cursor hidden, screen cleared.
enter(false, _IO) ->
    undefined;
enter(true, #{out := Out}) ->
    Saved = stty(["-g"]),
    _ = stty(["-icanon", "-echo", "-isig", "min", "1"]),
    Out("\e[?25l\e[H\e[2J"),
    Saved.

leave(false, _, _) ->
    ok;
leave(true, Saved, #{out := Out}) ->
    Out("\e[?25h\r\n"),
    _ = case Saved of
            error -> stty(["sane"]);
            _ -> stty([Saved])
        end,
    ok.

%% stty on the terminal this node reads from (its standard input; ports
%% run in a session of their own, without a controlling terminal); error
%% when standard input is no terminal.
stty(Args) ->
    case {os:find_executable("stty"), file:read_link("/proc/" ++ os:getpid() ++ "/fd/0")} of
        {Exe, {ok, "/dev/" ++ _ = Dev}} when is_list(Exe) ->
            Port = open_port({spawn_executable, "/bin/sh"},
                             [{args, ["-c", "exec \"$0\" \"$@\" <\"$BEAMDIAG_TTY\" 2>/dev/null",
                                      Exe | Args]},
                              {env, [{"BEAMDIAG_TTY", Dev}]},
                              exit_status, binary, use_stdio, hide]),
            stty_result(Port, <<>>);
        _ ->
            error
    end.

stty_result(Port, Acc) ->
    receive
        {Port, {data, D}} -> stty_result(Port, <<Acc/binary, D/binary>>);
        {Port, {exit_status, 0}} -> string:trim(binary_to_list(Acc));
        {Port, {exit_status, _}} -> error
    after 5000 ->
        catch port_close(Port),
        error
    end.

%% A process that reads single keys and sends them to the loop.
reader(false) ->
    undefined;
reader(true) ->
    Parent = self(),
    spawn_link(fun() -> read_keys(Parent) end).

read_keys(Parent) ->
    case io:get_chars(user, "", 1) of
        [C] -> Parent ! {beamdiag_key, C}, read_keys(Parent);
        <<C>> -> Parent ! {beamdiag_key, C}, read_keys(Parent);
        _ -> Parent ! {beamdiag_key, eof}
    end.

stop_reader(undefined) ->
    ok;
stop_reader(Pid) ->
    unlink(Pid),
    exit(Pid, kill),
    ok.

clock() ->
    {_, {H, M, S}} = calendar:local_time(),
    io_lib:format("~2..0b:~2..0b:~2..0b", [H, M, S]).
