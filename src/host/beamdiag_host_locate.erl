%%% @doc Finds the OS process of a BEAM node on this host without the
%%% node's help.
%%%
%%% From "name@host" when host is this host: epmd's names give the node's
%%% distribution port; /proc/net/tcp and tcp6 give the inode of the socket
%%% listening on it; the `socket:[INODE]' link under /proc/PID/fd of a
%%% `beam*' process gives the pid. When epmd does not answer, or no
%%% listening socket is found, a `beam*' process whose command line carries
%%% `-sname NAME' or `-name NAME' (or `NAME@HOST') is taken. An OS pid,
%%% given as an integer or as digits, is checked to be a running `beam*'
%%% process; a pid that is no beam on this host but is the pid a beam sees
%%% for itself in a PID namespace of its own (the last field of `NSpid' in
%%% /proc/PID/status: a node in a container, given by the pid it reports) is
%%% translated to the host's. Only `beam*' processes have their descriptors
%%% read, so the walk stays small on a busy host. Nothing here talks to the
%%% node.
%%%
%%% `listen_sockets/2' gives the addresses and ports a process listens on,
%%% from its own network namespace's tables (/proc/PID/net/tcp and tcp6)
%%% against its socket descriptors; `status/2' its user id and NSpid;
%%% `beams/1' every beam process on the host.
%%%
%%% The /proc root and epmd's answer can be given (`proc_root', `names'),
%%% so tests run on recorded trees.
%%%
%%% ```
%%% 1> beamdiag_host_locate:locate("app@myhost", #{}).
%%% {ok, #{os_pid => 4242, how => epmd_port, comm => <<"beam.smp">>, port => 37655}}
%%% 2> beamdiag_host_locate:locate("4242", #{}).
%%% {ok, #{os_pid => 4242, how => given, comm => <<"beam.smp">>}}
%%% '''
-module(beamdiag_host_locate).

-export([locate/2, target/1, is_local_host/1, format_error/1]).
-export([read/1, beams/1, status/2, listen_sockets/2, epmd_names/1]).
%% Called as Module:format_error/1 on an {error, {Module, Reason}} value.
-ignore_xref([{format_error, 1}]).
%% Called by the tests only.
-ifdef(TEST).
-export([parse_net_tcp/1, parse_cmdline/1, parse_listen/1]).
-endif.

-export_type([located/0, options/0]).

-type located() :: #{
    os_pid := pos_integer(),
    how := given | epmd_port | cmdline | ns_pid,
    comm := binary(),
    port => inet:port_number(),
    %% The pid the node sees for itself, when it runs in a PID namespace
    %% of its own (a container): the last of NSpid in /proc/PID/status.
    ns_pid => pos_integer(),
    %% What epmd said of the name (found by name only).
    %% no_epmd: none listens here; no_answer: it did not answer in time.
    epmd => registered | not_registered | no_epmd | no_answer
}.
-type options() :: #{
    proc_root => file:filename(),
    %% epmd's answer for the host (tests), instead of asking it.
    names => {ok, [{string(), inet:port_number()}]} | {error, term()},
    timeout => pos_integer()
}.

%% Bounds on the walk of /proc.
-define(MAX_PIDS, 100000).
-define(MAX_FDS, 65536).
-define(MAX_FILE, 4 * 1024 * 1024).
-define(EPMD_TIMEOUT, 2000).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc What a command-line target is: an OS pid (digits) or a node name.
-spec target(string() | binary() | integer()) -> {os_pid, pos_integer()} | {node, string()}.
target(N) when is_integer(N) -> {os_pid, N};
target(B) when is_binary(B) -> target(unicode:characters_to_list(B));
target(S) ->
    case string:to_integer(S) of
        {N, ""} when is_integer(N), N > 0 -> {os_pid, N};
        _ -> {node, S}
    end.

%% @doc The OS process of a node on this host, from its name or its pid.
%% Bad input (no such pid, not a BEAM, a node of another host) is an
%% error value.
-spec locate(string() | binary() | integer(), options()) ->
    {ok, located()} | {error, {?MODULE, term()}}.
locate(Target, Opts) ->
    Root = maps:get(proc_root, Opts, "/proc"),
    case target(Target) of
        {os_pid, Pid} ->
            case check_pid(Root, Pid, given) of
                {ok, _} = Ok -> Ok;
                {error, {?MODULE, {R, _, _}}} = E when R =:= not_beam -> by_ns_pid(Root, Pid, E);
                {error, {?MODULE, {no_such_pid, _}}} = E -> by_ns_pid(Root, Pid, E)
            end;
        {node, Str} ->
            by_name(Root, Str, Opts)
    end.

%% @doc Every beam process on this host: `[{Pid, Comm}]', in pid order.
-spec beams(file:filename()) -> [{pos_integer(), binary()}].
beams(Root) ->
    case file:list_dir(Root) of
        {ok, Entries} ->
            Pids = lists:sublist(lists:sort([N || E <- Entries, {N, ""} <- [string:to_integer(E)]]),
                                 ?MAX_PIDS),
            [{P, C} || P <- Pids, {ok, C} <- [comm(Root, P)], is_beam(C)];
        {error, _} ->
            []
    end.

%% @doc A process's real user id and NSpid (its pid in each PID namespace
%% it is in, the host's first), from /proc/PID/status.
-spec status(file:filename(), pos_integer()) ->
    {ok, #{uid => non_neg_integer(), ns_pid => [pos_integer()]}} | {error, term()}.
status(Root, Pid) ->
    case read(filename:join([Root, integer_to_list(Pid), "status"])) of
        {ok, Bin} ->
            Fields = [binary:split(L, <<":">>) || L <- binary:split(Bin, <<"\n">>, [global])],
            Ints = fun(V) -> [I || W <- string:lexemes(V, " \t"),
                                   {I, ""} <- [string:to_integer(binary_to_list(W))]] end,
            {ok, lists:foldl(fun([<<"Uid">>, V], Acc) ->
                                     case Ints(V) of
                                         [U | _] -> Acc#{uid => U};
                                         [] -> Acc
                                     end;
                                ([<<"NSpid">>, V], Acc) ->
                                     Acc#{ns_pid => Ints(V)};
                                (_, Acc) ->
                                     Acc
                             end, #{}, Fields)};
        {error, _} = E ->
            E
    end.

%% @doc The addresses and ports a process listens on (TCP, IPv4 and IPv6),
%% from its own network namespace (/proc/PID/net/tcp and tcp6) against the
%% socket descriptors it holds.
-spec listen_sockets(file:filename(), pos_integer()) -> [{inet:ip_address(), inet:port_number()}].
listen_sockets(Root, Pid) ->
    Dir = filename:join(Root, integer_to_list(Pid)),
    Listening = [L || F <- ["tcp", "tcp6"],
                      {ok, Bin} <- [read(filename:join([Dir, "net", F]))],
                      L <- parse_listen(Bin)],
    case Listening of
        [] -> [];
        _ ->
            Held = socket_inodes(Dir),
            lists:usort([{Ip, Port} || {Ip, Port, Inode} <- Listening, Inode > 0,
                                       lists:member(Inode, Held)])
    end.

%% @doc Parses /proc/net/tcp or tcp6: every listening socket's address,
%% port and inode.
-spec parse_listen(binary()) -> [{inet:ip_address(), inet:port_number(), non_neg_integer()}].
parse_listen(Bin) ->
    case binary:split(Bin, <<"\n">>, [global, trim_all]) of
        %% Only listening sockets (state 0A) are split into fields: a busy
        %% host's table holds tens of thousands of other lines.
        [_Header | Lines] -> lists:flatmap(fun listen_line/1,
                                           [L || L <- Lines, binary:match(L, <<" 0A ">>) =/= nomatch]);
        [] -> []
    end.

%% @doc True when Host names this machine (its host name, short or long,
%% `localhost' or a loopback address).
-spec is_local_host(string()) -> boolean().
is_local_host(Host) ->
    {ok, Here} = inet:gethostname(),
    Short = hd(string:split(Here, ".")),
    HostShort = hd(string:split(Host, ".")),
    lists:member(Host, ["localhost", "127.0.0.1", "::1", Here]) orelse
        lists:prefix("127.", Host) orelse
        (HostShort =:= Short andalso not is_ip(Host)) orelse
        Host =:= net_adm:localhost().

%% @doc epmd's names on Host, or an error, within ?EPMD_TIMEOUT.
-spec epmd_names(string()) -> {ok, [{string(), inet:port_number()}]} | {error, term()}.
epmd_names(Host) ->
    epmd_names(Host, ?EPMD_TIMEOUT).

%% @doc epmd's names on Host, or an error, within Timeout milliseconds.
-spec epmd_names(string(), pos_integer()) ->
    {ok, [{string(), inet:port_number()}]} | {error, term()}.
epmd_names(Host, Timeout) ->
    Self = self(),
    Tag = make_ref(),
    {Pid, MRef} = spawn_monitor(fun() -> Self ! {Tag, net_adm:names(Host)} end),
    receive
        {Tag, R} ->
            erlang:demonitor(MRef, [flush]),
            case R of
                {ok, _} -> R;
                {error, Why} -> {error, Why}
            end;
        {'DOWN', MRef, process, Pid, Why} ->
            {error, Why}
    after Timeout ->
        exit(Pid, kill),
        erlang:demonitor(MRef, [flush]),
        {error, timeout}
    end.

%% @doc Parses /proc/net/tcp or tcp6: the inodes of listening sockets by
%% local port.
-spec parse_net_tcp(binary()) -> [{inet:port_number(), non_neg_integer()}].
parse_net_tcp(Bin) ->
    [{P, I} || {_Ip, P, I} <- parse_listen(Bin)].

%% @doc The node names a command line gives with `-sname' or `-name'.
-spec parse_cmdline(binary()) -> [string()].
parse_cmdline(Bin) ->
    Args = binary:split(Bin, <<0>>, [global, trim_all]),
    names_in(Args).

%% @doc Turns an error reason of this module into a sentence.
-spec format_error(term()) -> iolist().
format_error({no_such_pid, Pid}) ->
    io_lib:format("there is no OS process ~b on this host", [Pid]);
format_error({not_beam, Pid, Comm}) ->
    io_lib:format("OS process ~b is ~ts, not an Erlang VM (beam)",
                  [Pid, beamdiag_safe_text:safe(Comm, 40)]);
format_error({unreadable, Path, Why}) ->
    io_lib:format("cannot read ~ts: ~ts (beamdiag needs to read the node's /proc entries: "
                  "run it as the node's user or as root)", [Path, file:format_error(Why)]);
format_error({other_host, Host}) ->
    io_lib:format("the node runs on host ~ts, not this one: its OS process can only be "
                  "read there", [beamdiag_safe_text:safe(Host, 100)]);
format_error({not_found, Name}) ->
    io_lib:format("no Erlang VM on this host is registered as ~ts (neither in epmd nor on a "
                  "command line)", [beamdiag_safe_text:safe(Name, 100)]);
format_error({ambiguous_ns_pid, Pid, Pids}) ->
    io_lib:format("~b is no Erlang VM's pid on this host, and several VMs in PID namespaces of "
                  "their own (containers) see themselves as ~b: host pids ~w; give one of those",
                  [Pid, Pid, Pids]);
format_error({bad_node, S}) ->
    ["'", beamdiag_safe_text:safe(S, 100), "' is neither an OS pid nor a node name (name@host)"].

%%%===================================================================
%%% Internal
%%%===================================================================

by_name(Root, Str, Opts) ->
    case beamdiag_node_name:split(Str) of
        {Name, Host} when Name =/= "", Host =/= "" ->
            case is_local_host(Host) of
                true -> by_local_name(Root, Name, Host, Opts);
                false -> {error, {?MODULE, {other_host, Host}}}
            end;
        _ ->
            {error, {?MODULE, {bad_node, Str}}}
    end.

by_local_name(Root, Name, Host, Opts) ->
    %% This host's epmd, asked over IPv4 loopback when the node is named
    %% on an address (epmd may not listen on ::1).
    EpmdHost = case is_ip(Host) of
                   true -> "localhost";
                   false -> Host
               end,
    Names = case maps:find(names, Opts) of
                {ok, Given} -> Given;
                error -> epmd_names(EpmdHost, maps:get(timeout, Opts, ?EPMD_TIMEOUT))
            end,
    Beams = beams(Root),
    ByPort = case Names of
                 {ok, L} ->
                     case lists:keyfind(Name, 1, L) of
                         {_, Port} -> by_port(Root, Port, Beams);
                         false -> none
                     end;
                 {error, _} ->
                     none
             end,
    Epmd = case Names of
               {ok, L2} ->
                   case lists:keymember(Name, 1, L2) of
                       true -> registered;
                       false -> not_registered
                   end;
               {error, timeout} ->
                   no_answer;
               {error, _} ->
                   no_epmd
           end,
    case ByPort of
        {ok, Found} ->
            {ok, Found#{epmd => Epmd}};
        none ->
            case [P || {P, _} <- Beams, lists:member(Name, cmd_names(Root, P, Host))] of
                [Pid | _] ->
                    case check_pid(Root, Pid, cmdline) of
                        {ok, Found} -> {ok, Found#{epmd => Epmd}};
                        E -> E
                    end;
                [] ->
                    {error, {?MODULE, {not_found, Name ++ "@" ++ Host}}}
            end
    end.

%% The beam process holding the socket that listens on Port.
by_port(Root, Port, Beams) ->
    Inodes = lists:usort(
        [I || F <- ["tcp", "tcp6"],
              {ok, Bin} <- [read(filename:join([Root, "net", F]))],
              {P, I} <- parse_net_tcp(Bin), P =:= Port, I > 0]),
    Links = [list_to_binary("socket:[" ++ integer_to_list(I) ++ "]") || I <- Inodes],
    case Links of
        [] -> none;
        _ ->
            case [P || {P, _} <- Beams, holds_any(Root, P, Links)] of
                [Pid | _] ->
                    {ok, with_ns_pid(Root, #{os_pid => Pid, how => epmd_port, port => Port,
                                             comm => proplists:get_value(Pid, Beams)})};
                [] ->
                    none
            end
    end.

holds_any(Root, Pid, Links) ->
    Dir = filename:join([Root, integer_to_list(Pid), "fd"]),
    case file:list_dir(Dir) of
        {ok, Fds} ->
            lists:any(
                fun(Fd) ->
                    case file:read_link_all(filename:join(Dir, Fd)) of
                        {ok, L} -> lists:member(iolist_to_binary(L), Links);
                        {error, _} -> false
                    end
                end,
                lists:sublist(Fds, ?MAX_FDS));
        {error, _} ->
            false
    end.

listen_line(Line) ->
    case string:lexemes(Line, " ") of
        [_Sl, Local, _Rem, <<"0A">>, _, _, _, _, _Uid, Inode | _] ->
            case {binary:split(Local, <<":">>), catch binary_to_integer(Inode)} of
                {[AddrHex, PortHex], I} when is_integer(I) ->
                    case {catch binary_to_integer(PortHex, 16), address(AddrHex)} of
                        {P, {ok, Ip}} when is_integer(P), P >= 0, P < 65536 -> [{Ip, P, I}];
                        _ -> []
                    end;
                _ ->
                    []
            end;
        _ ->
            []
    end.

%% The kernel writes each 32-bit word of an address in host order (little
%% endian here).
address(Hex) when byte_size(Hex) =:= 8 ->
    case catch binary_to_integer(Hex, 16) of
        N when is_integer(N) ->
            <<A, B, C, D>> = <<N:32/little>>,
            {ok, {A, B, C, D}};
        _ -> error
    end;
address(Hex) when byte_size(Hex) =:= 32 ->
    case catch binary_to_integer(Hex, 16) of
        N when is_integer(N) ->
            <<W0:32, W1:32, W2:32, W3:32>> = <<N:128>>,
            Bytes = <<W0:32/little, W1:32/little, W2:32/little, W3:32/little>>,
            {ok, list_to_tuple([X || <<X:16>> <= Bytes])};
        _ -> error
    end;
address(_) ->
    error.

socket_inodes(Dir) ->
    FdDir = filename:join(Dir, "fd"),
    case file:list_dir(FdDir) of
        {ok, Fds} ->
            [I || Fd <- lists:sublist(Fds, ?MAX_FDS),
                  {ok, L} <- [file:read_link_all(filename:join(FdDir, Fd))],
                  "socket:[" ++ Rest <- [L],
                  {I, "]"} <- [string:to_integer(Rest)]];
        {error, _} ->
            []
    end.

%% A pid that is no beam here, read as the pid a beam sees for itself in a
%% PID namespace of its own: the beam whose NSpid ends with it, when there
%% is exactly one.
by_ns_pid(Root, Pid, Error) ->
    Matches = [{P, C} || {P, C} <- beams(Root),
                         {ok, #{ns_pid := [_, _ | _] = Ns}} <- [status(Root, P)],
                         lists:last(Ns) =:= Pid],
    case Matches of
        [{P, Comm}] -> {ok, #{os_pid => P, how => ns_pid, comm => Comm, ns_pid => Pid}};
        [] -> Error;
        _ -> {error, {?MODULE, {ambiguous_ns_pid, Pid, [P || {P, _} <- Matches]}}}
    end.

cmd_names(Root, Pid, Host) ->
    case read(filename:join([Root, integer_to_list(Pid), "cmdline"])) of
        {ok, Bin} ->
            lists:usort([case beamdiag_node_name:split(N) of
                             {Nm, H} -> case H =:= Host orelse is_local_host(H) of
                                            true -> Nm;
                                            false -> ""
                                        end;
                             error -> N
                         end || N <- parse_cmdline(Bin)]);
        {error, _} ->
            []
    end.

names_in([Flag, Name | Rest]) when Flag =:= <<"-sname">>; Flag =:= <<"-name">> ->
    [binary_to_list(Name) | names_in(Rest)];
names_in([_ | Rest]) ->
    names_in(Rest);
names_in([]) ->
    [].

check_pid(Root, Pid, How) ->
    Dir = filename:join(Root, integer_to_list(Pid)),
    case comm(Root, Pid) of
        {ok, Comm} ->
            case is_beam(Comm) of
                true -> {ok, with_ns_pid(Root, #{os_pid => Pid, how => How, comm => Comm})};
                false -> {error, {?MODULE, {not_beam, Pid, Comm}}}
            end;
        {error, enoent} ->
            {error, {?MODULE, {no_such_pid, Pid}}};
        {error, Why} ->
            {error, {?MODULE, {unreadable, filename:join(Dir, "comm"), Why}}}
    end.

%% The pid the node sees for itself, when it is in a PID namespace of its
%% own.
with_ns_pid(Root, L = #{os_pid := Pid}) ->
    case status(Root, Pid) of
        {ok, #{ns_pid := [_, _ | _] = Ns}} -> L#{ns_pid => lists:last(Ns)};
        _ -> L
    end.

comm(Root, Pid) ->
    case read(filename:join([Root, integer_to_list(Pid), "comm"])) of
        {ok, B} -> {ok, beamdiag_agent_procfs:trim(B)};
        {error, _} = E -> E
    end.

is_beam(<<"beam", _/binary>>) -> true;
is_beam(_) -> false.

is_ip(Host) ->
    case inet:parse_address(Host) of
        {ok, _} -> true;
        {error, _} -> false
    end.

%% @doc A /proc or cgroup file, at most 4 MiB of it, opened and closed
%% here (the host view reads the same way).
-spec read(file:filename()) -> {ok, binary()} | {error, term()}.
read(Path) ->
    case file:open(Path, [read, raw, binary]) of
        {ok, Fd} ->
            try file:read(Fd, ?MAX_FILE) of
                {ok, B} -> {ok, B};
                eof -> {ok, <<>>};
                {error, _} = E -> E
            after
                ok = file:close(Fd)
            end;
        {error, _} = E ->
            E
    end.
