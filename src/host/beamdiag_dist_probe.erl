%%% @doc Asks a port whether an Erlang node's distribution listens there,
%%% and how far a connection gets: the first step of the distribution
%%% handshake (the name message, over TLS when the node speaks it) and the
%%% node's status answer, then the connection is closed. No cookie is
%%% sent, nothing runs on the node; the node sees a connection that ended
%%% before the challenge.
%%%
%%% Used to confirm a port found on the host (a node that registers
%%% nowhere) and to say why a connection failed: the port is closed, the
%%% TLS handshake was refused (and how: an alert, a certificate, a key
%%% that cannot be read), the port is no Erlang distribution, or the name
%%% step passed, which leaves the cookie.
%%%
%%% ```
%%% 1> beamdiag_dist_probe:probe({127,0,0,1}, 40123, #{mode => shortnames}).
%%% {ok, <<"ok">>}
%%% 2> beamdiag_dist_probe:probe({127,0,0,1}, 22, #{mode => shortnames}).
%%% {error, not_distribution}
%%% '''
-module(beamdiag_dist_probe).

-export([probe/3, format_error/1]).
-ignore_xref([{format_error, 1}]).

-export_type([result/0, options/0]).

-type options() :: #{mode := shortnames | longnames, tls => none | [term()],
                     timeout => pos_integer(), server_name => string()}.
-type result() :: {ok, binary()} | {error, term()}.

%% The flags a hidden node of OTP 25 to 29 offers (dist.hrl): every
%% capability up to the OTP 25 digest, and spawn, V4 node containers and
%% aliases; not `published' (a probe is hidden).
-define(FLAGS, (16#07DFFFFC bor (16#01 bsl 32) bor (16#04 bsl 32) bor (16#08 bsl 32))).
-define(CREATION, 16#0BEADD1A).
-define(TIMEOUT, 2000).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Opens a connection to Ip:Port (over TLS with the client options
%% `tls'), sends a hidden node's name and reads the node's status:
%% `{ok, Status}' (`<<"ok">>', `<<"not_allowed">>'...), or
%% `{error, {tcp, Why}}', `{error, {tls, Why}}', `{error, not_distribution}'.
-spec probe(inet:ip_address(), inet:port_number(), options()) -> result().
probe(Ip, Port, Opts) ->
    Timeout = maps:get(timeout, Opts, ?TIMEOUT),
    Self = self(),
    Tag = make_ref(),
    %% In a process of its own, bounded: a node that accepts and never
    %% answers costs the timeout, no more.
    {Pid, MRef} = spawn_monitor(fun() -> Self ! {Tag, run(Ip, Port, Opts, Timeout)} end),
    receive
        {Tag, R} ->
            erlang:demonitor(MRef, [flush]),
            R;
        {'DOWN', MRef, process, Pid, Why} ->
            {error, {crashed, Why}}
    after Timeout + 500 ->
        exit(Pid, kill),
        erlang:demonitor(MRef, [flush]),
        {error, {tcp, timeout}}
    end.

%% @doc Turns an error reason of this module into words.
-spec format_error(term()) -> iolist().
format_error({tcp, econnrefused}) ->
    "the port is closed (connection refused)";
format_error({tcp, timeout}) ->
    "the port did not answer in time (filtered, or the node is too busy to accept)";
format_error({tcp, Why}) ->
    io_lib:format("the connection failed: ~ts", [inet:format_error(Why)]);
format_error({tls, Why}) ->
    tls_text(Why);
format_error(not_distribution) ->
    "the port does not speak Erlang distribution";
format_error({crashed, Why}) ->
    io_lib:format("the probe crashed: ~0P", [Why, 10]).

%%%===================================================================
%%% Internal
%%%===================================================================

run(Ip, Port, Opts, Timeout) ->
    Family = case tuple_size(Ip) of 4 -> inet; 8 -> inet6 end,
    case maps:get(tls, Opts, none) of
        none ->
            case gen_tcp:connect(Ip, Port, [binary, Family, {active, false}, {packet, 2}],
                                 Timeout) of
                {ok, S} ->
                    try exchange(gen_tcp, S, Opts, Timeout)
                    after gen_tcp:close(S)
                    end;
                {error, Why} ->
                    {error, {tcp, Why}}
            end;
        Client ->
            case application:ensure_all_started(ssl) of
                {ok, _} ->
                    Sni = case maps:find(server_name, Opts) of
                              {ok, Name} -> [{server_name_indication, Name}];
                              error -> [{server_name_indication, disable}]
                          end,
                    case ssl:connect(Ip, Port, [binary, Family, {active, false}, {packet, 4}]
                                     ++ Sni ++ Client, Timeout) of
                        {ok, S} ->
                            try exchange(ssl, S, Opts, Timeout)
                            after _ = ssl:close(S)
                            end;
                        {error, Why} ->
                            {error, tls_or_tcp(Why)}
                    end;
                {error, Why} ->
                    {error, {tls, {no_ssl, Why}}}
            end
    end.

exchange(Mod, S, #{mode := Mode}, Timeout) ->
    Name = list_to_binary(probe_name(Mode)),
    Msg = <<$N, ?FLAGS:64, ?CREATION:32, (byte_size(Name)):16, Name/binary>>,
    case Mod:send(S, Msg) of
        ok ->
            case Mod:recv(S, 0, Timeout) of
                {ok, <<$s, Status/binary>>} -> {ok, Status};
                {ok, _} -> {error, not_distribution};
                {error, closed} -> {error, not_distribution};
                {error, timeout} -> {error, {tcp, timeout}};
                {error, Why} when Mod =:= ssl -> {error, tls_or_tcp(Why)};
                {error, Why} -> {error, {tcp, Why}}
            end;
        {error, Why} when Mod =:= ssl ->
            {error, tls_or_tcp(Why)};
        {error, Why} ->
            {error, {tcp, Why}}
    end.

probe_name(Mode) ->
    Base = "beamdiag_probe_" ++ os:getpid(),
    case Mode of
        longnames -> Base ++ "@127.0.0.1";
        shortnames -> Base ++ "@" ++ beamdiag_node_name:short_host()
    end.

tls_or_tcp(econnrefused) -> {tcp, econnrefused};
tls_or_tcp(timeout) -> {tcp, timeout};
tls_or_tcp(closed) -> {tls, closed};
tls_or_tcp(Why) -> {tls, Why}.

tls_text({tls_alert, {Alert, Desc}}) ->
    [alert_text(Alert), " (TLS alert ", atom_to_list(Alert), ": ",
     beamdiag_safe_text:safe(string:trim(Desc), 200), ")"];
tls_text({options, {Opt, File, {error, Why}}}) when Opt =:= keyfile; Opt =:= certfile;
                                                    Opt =:= cacertfile ->
    io_lib:format("cannot read the TLS ~s ~ts: ~ts", [opt_name(Opt), File, file_text(Why)]);
tls_text({options, {Opt, File, Why}}) when Opt =:= keyfile; Opt =:= certfile; Opt =:= cacertfile ->
    io_lib:format("cannot use the TLS ~s ~ts: ~0P", [opt_name(Opt), File, Why, 6]);
tls_text({keyfile, Why}) ->
    io_lib:format("the TLS key cannot be used: ~0P", [Why, 6]);
tls_text(closed) ->
    "the node closed the connection during the TLS handshake (it may not speak TLS)";
tls_text({no_ssl, Why}) ->
    io_lib:format("the ssl application cannot start here: ~0P", [Why, 6]);
tls_text(Why) ->
    io_lib:format("the TLS handshake failed: ~0P", [Why, 8]).

alert_text(certificate_required) ->
    "the node demands a client certificate and none was sent";
alert_text(handshake_failure) ->
    "the node refused the TLS handshake (a client certificate it demands, or no common cipher)";
alert_text(unknown_ca) ->
    "a certificate was refused: signed by an authority the other side does not trust";
alert_text(bad_certificate) ->
    "a certificate was refused as bad";
alert_text(certificate_expired) ->
    "a certificate was refused: it has expired";
alert_text(certificate_unknown) ->
    "a certificate was refused";
alert_text(unsupported_certificate) ->
    "a certificate was refused as unsupported";
alert_text(access_denied) ->
    "the node denied access to the certificate presented";
alert_text(protocol_version) ->
    "the two sides share no TLS version";
alert_text(insufficient_security) ->
    "the two sides share no cipher strong enough";
alert_text(A) ->
    ["the TLS handshake ended with the alert ", atom_to_list(A)].

opt_name(keyfile) -> "key file";
opt_name(certfile) -> "certificate file";
opt_name(cacertfile) -> "CA certificate file".

file_text(Why) when is_atom(Why) -> file:format_error(Why);
file_text(Why) -> io_lib:format("~0P", [Why, 6]).
