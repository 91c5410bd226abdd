%%% @doc A minimal HTTP/1.1 responder on `gen_tcp' that serves one text
%%% (the metrics exposition) at one path. It runs on the target, with
%%% erts, kernel and stdlib only: a release that leaves inets out still has
%%% it.
%%%
%%% Bounded on every side: one connection at a time (the listen backlog
%%% holds the next few), a request of at most 8 KB read within 2 s, GET and
%%% HEAD only, `Connection: close' on every answer, loopback unless told
%%% otherwise. The text is set by its owner (`set/2'); the responder ends
%%% with its owner (it monitors it, across nodes too) or on `stop/1', and
%%% when it was loaded for a session (`unload => true') it then removes its
%%% own module from the node.
%%%
%%% ```
%%% 1> {ok, Pid} = beamdiag_agent_http:start(#{owner => self(), port => 9568}).
%%% 2> beamdiag_agent_http:set(Pid, <<"beamdiag_up 1\n">>).
%%% 3> beamdiag_agent_http:stop(Pid).
%%% '''
-module(beamdiag_agent_http).

-export([start/1, start_link/1, set/2, stop/1, port/1, format_error/1]).

%% Internal: the responder's entry point.
-export([init/3]).
%% Spawned by start_link/1 through proc_lib:spawn_opt/4.
-ignore_xref([{init, 3}]).
%% Called on the target through erpc:call/5 by beamdiag_metrics_remote.
-ignore_xref([{start, 1}, {port, 1}]).

-export_type([opts/0]).

-type opts() :: #{
    owner := pid(),
    port := 0..65535,
    ip => loopback | any | inet:ip_address(),
    path => string(),
    unload => boolean()
}.

-define(MAX_REQUEST, 8192).
-define(RECV_MS, 2000).
-define(ACCEPT_MS, 200).
-define(BACKLOG, 8).
-define(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8").

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Starts a responder listening on `port' (0: any free port, see
%% `port/1') at `ip' (`loopback'), serving the text at `path'
%% ("/metrics"); the text is empty until `set/2'. Not linked.
-spec start(opts()) -> {ok, pid()} | {error, {beamdiag_agent_http, term()}}.
start(Opts) ->
    start(Opts, []).

%% @doc As `start/1', linked to the caller.
-spec start_link(opts()) -> {ok, pid()} | {error, {beamdiag_agent_http, term()}}.
start_link(Opts) ->
    start(Opts, [link]).

%% @doc Sets the text served from now on.
-spec set(pid(), iodata()) -> ok.
set(Pid, Text) ->
    Pid ! {beamdiag_http_text, iolist_to_binary(Text)},
    ok.

%% @doc Stops the responder and waits until its port is closed.
-spec stop(pid()) -> ok.
stop(Pid) ->
    MRef = erlang:monitor(process, Pid),
    Pid ! {beamdiag_http_stop, self()},
    receive
        {'DOWN', MRef, process, Pid, _} -> ok
    after 5000 ->
        exit(Pid, kill),
        receive {'DOWN', MRef, process, Pid, _} -> ok end
    end.

%% @doc The port the responder listens on.
-spec port(pid()) -> {ok, inet:port_number()} | {error, {beamdiag_agent_http, term()}}.
port(Pid) ->
    MRef = erlang:monitor(process, Pid),
    Pid ! {beamdiag_http_port, self(), MRef},
    receive
        {MRef, Port} ->
            erlang:demonitor(MRef, [flush]),
            {ok, Port};
        {'DOWN', MRef, process, Pid, Why} ->
            {error, {beamdiag_agent_http, {gone, Why}}}
    after 5000 ->
        erlang:demonitor(MRef, [flush]),
        {error, {beamdiag_agent_http, {gone, timeout}}}
    end.

%% @doc Turns an error reason of this module into a sentence.
-spec format_error(term()) -> iolist().
format_error({listen, Port, eaddrinuse}) ->
    io_lib:format("cannot serve metrics on port ~b: the port is in use", [Port]);
format_error({listen, Port, Why}) ->
    io_lib:format("cannot serve metrics on port ~b: ~0p", [Port, Why]);
format_error({gone, Why}) ->
    io_lib:format("the metrics responder is gone (~0p)", [Why]).

%%%===================================================================
%%% Internal
%%%===================================================================

start(Opts = #{owner := Owner, port := Port}, SpawnOpts) when
    is_pid(Owner), is_integer(Port), Port >= 0, Port < 65536
->
    Ref = make_ref(),
    Pid = proc_lib:spawn_opt(?MODULE, init, [self(), Ref, Opts], SpawnOpts),
    MRef = erlang:monitor(process, Pid),
    receive
        {Ref, ok} ->
            erlang:demonitor(MRef, [flush]),
            {ok, Pid};
        {Ref, {error, _} = E} ->
            erlang:demonitor(MRef, [flush]),
            E;
        {'DOWN', MRef, process, Pid, Why} ->
            {error, {beamdiag_agent_http, {gone, Why}}}
    end.

%% @private
-spec init(pid(), reference(), opts()) -> ok.
init(Starter, Ref, Opts = #{owner := Owner, port := Port}) ->
    %% Started over erpc, it would inherit the caller's group leader: it
    %% takes the target's own.
    case erlang:process_info(whereis(init), group_leader) of
        {group_leader, Gl} -> true = group_leader(Gl, self());
        undefined -> ok
    end,
    Ip = case maps:get(ip, Opts, loopback) of
             loopback -> {127, 0, 0, 1};
             any -> {0, 0, 0, 0};
             Addr -> Addr
         end,
    case gen_tcp:listen(Port, [binary, {ip, Ip}, {active, false}, {reuseaddr, true},
                               {backlog, ?BACKLOG}, {send_timeout, ?RECV_MS},
                               {send_timeout_close, true}]) of
        {ok, L} ->
            MRef = erlang:monitor(process, Owner),
            Starter ! {Ref, ok},
            State = #{listen => L, owner => Owner, mref => MRef, text => <<>>,
                      path => list_to_binary(maps:get(path, Opts, "/metrics")),
                      unload => maps:get(unload, Opts, false)},
            loop(State);
        {error, Why} ->
            Starter ! {Ref, {error, {beamdiag_agent_http, {listen, Port, Why}}}},
            ok
    end.

loop(State = #{listen := L, owner := Owner, mref := MRef}) ->
    receive
        {beamdiag_http_text, Text} ->
            loop(State#{text := Text});
        {beamdiag_http_port, From, Tag} ->
            {ok, P} = inet:port(L),
            From ! {Tag, P},
            loop(State);
        {beamdiag_http_stop, _} ->
            finish(State);
        {'DOWN', MRef, process, Owner, _} ->
            finish(State)
    after 0 ->
        case gen_tcp:accept(L, ?ACCEPT_MS) of
            {ok, S} ->
                serve(S, State),
                loop(State);
            {error, timeout} ->
                loop(State);
            {error, _} ->
                finish(State)
        end
    end.

finish(#{listen := L, unload := Unload}) ->
    _ = gen_tcp:close(L),
    case Unload of
        true ->
            %% The purge may end this process, which has nothing left to do.
            _ = code:delete(?MODULE),
            _ = spawn(code, purge, [?MODULE]),
            ok;
        false ->
            ok
    end.

%% One request, one answer, then the connection is closed.
serve(S, #{text := Text, path := Path}) ->
    Deadline = erlang:monotonic_time(millisecond) + ?RECV_MS,
    Answer = case read_head(S, <<>>, Deadline) of
                 {ok, Head} -> answer(request_line(Head), Path, Text);
                 too_large -> response(431, <<"request too large\n">>, true);
                 {error, _} -> none
             end,
    _ = case Answer of
            none -> ok;
            _ -> gen_tcp:send(S, Answer)
        end,
    _ = gen_tcp:close(S),
    ok.

read_head(S, Acc, Deadline) ->
    case binary:match(Acc, <<"\r\n\r\n">>) of
        {Pos, _} ->
            {ok, binary:part(Acc, 0, Pos)};
        nomatch when byte_size(Acc) >= ?MAX_REQUEST ->
            too_large;
        nomatch ->
            Left = Deadline - erlang:monotonic_time(millisecond),
            case Left > 0 andalso gen_tcp:recv(S, 0, Left) of
                {ok, D} when byte_size(Acc) + byte_size(D) =< ?MAX_REQUEST ->
                    read_head(S, <<Acc/binary, D/binary>>, Deadline);
                {ok, _} ->
                    too_large;
                false ->
                    {error, timeout};
                {error, _} = E ->
                    E
            end
    end.

request_line(Head) ->
    [Line | _] = binary:split(Head, <<"\r\n">>),
    case binary:split(Line, <<" ">>, [global]) of
        [Method, Target, <<"HTTP/1.", _>>] ->
            [P | _] = binary:split(Target, <<"?">>),
            {Method, P};
        _ ->
            bad
    end.

answer({<<"GET">>, Path}, Path, Text) -> response(200, Text, true);
answer({<<"HEAD">>, Path}, Path, Text) -> response(200, Text, false);
answer({M, _}, _Path, _Text) when M =/= <<"GET">>, M =/= <<"HEAD">> ->
    response(405, <<"method not allowed\n">>, true);
answer({_, _}, Path, _Text) -> response(404, <<"not found; try ", Path/binary, "\n">>, true);
answer(bad, _Path, _Text) -> response(400, <<"bad request\n">>, true).

response(Code, Body, WithBody) ->
    [<<"HTTP/1.1 ">>, integer_to_binary(Code), <<" ">>, reason(Code), <<"\r\n">>,
     <<"Content-Type: " ?CONTENT_TYPE "\r\n">>,
     <<"Content-Length: ">>, integer_to_binary(byte_size(Body)), <<"\r\n">>,
     <<"Connection: close\r\n\r\n">>,
     case WithBody of true -> Body; false -> <<>> end].

reason(200) -> <<"OK">>;
reason(400) -> <<"Bad Request">>;
reason(404) -> <<"Not Found">>;
reason(405) -> <<"Method Not Allowed">>;
reason(431) -> <<"Request Header Fields Too Large">>.
