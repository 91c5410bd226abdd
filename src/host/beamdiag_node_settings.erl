%%% @doc A node's own distribution settings, read from this host: what
%%% its OS process was started with and the files its start-up reads, so
%%% that the node's name alone is enough to reach it.
%%%
%%% Read, for the OS process found by `beamdiag_host_locate': its argument
%%% vector (/proc/PID/cmdline: erlexec has expanded `-args_file' and the
%%% argument variables into it), its environment where readable
%%% (/proc/PID/environ: ERL_AFLAGS, ERL_FLAGS, ERL_ZFLAGS,
%%% ELIXIR_ERL_OPTIONS, RELEASE_COOKIE, RELEASE_DISTRIBUTION, RELEASE_NODE,
%%% RELEASE_ROOT, HOME...), its user id and NSpid (/proc/PID/status), and
%%% through its own file system (/proc/PID/root when it runs in another
%%% mount namespace, as a container does; relative paths from
%%% /proc/PID/cwd): its release's vm.args (with the args files it names,
%%% nested) and `releases/COOKIE', the password database, the cookie files
%%% in its user's home, its `-ssl_dist_optfile', and the sockets it listens
%%% on (/proc/PID/net/tcp and tcp6, its own network namespace). The
%%% parsing is `beamdiag_node_args''s; this module only reads.
%%%
%%% Reading another user's /proc/PID/environ, /proc/PID/root and
%%% /proc/PID/fd needs that user or root; what cannot be read is said in
%%% `notes' and the rest is used.
%%%
%%% ```
%%% 1> {ok, L} = beamdiag_host_locate:locate("app@myhost", #{}).
%%% 2> S = beamdiag_node_settings:read(L, #{}).
%%% 3> maps:get(name, maps:get(args, S)).
%%% #{value => <<"app">>, mode => shortnames, origin => command_line}
%%% '''
-module(beamdiag_node_settings).

-export([read/2]).

-export_type([settings/0, fs/0, cookie/0]).

%% How to reach a path of the node's file system from here.
-type fs() :: #{root := binary(), cwd := binary(), proc_root := file:filename()}.
%% A cookie the node may use, with where it was found (a secret: never
%% printed; see beamdiag_attach_plan:public/1).
-type cookie() :: {binary(), beamdiag_node_args:origin()}.
-type settings() :: #{
    os_pid := pos_integer(),
    ns_pid => pos_integer(),
    otp := pos_integer() | undefined,
    args := beamdiag_node_args:settings(),
    env := #{binary() => binary()},
    env_readable := boolean(),
    uid => non_neg_integer(),
    home := {binary(), term()} | none,
    release_roots := [binary()],
    cookies := [cookie()],
    listen := [{inet:ip_address(), inet:port_number()}],
    fs := fs(),
    tls => #{optfile := binary(), origin := term(), client => list(), error => term()},
    notes := [binary()]
}.

%% The environment variables kept (the rest of a node's environment is
%% not beamdiag's business).
-define(ENV_KEEP, [<<"ERL_AFLAGS">>, <<"ERL_FLAGS">>, <<"ERL_ZFLAGS">>, <<"ELIXIR_ERL_OPTIONS">>,
                   <<"RELEASE_COOKIE">>, <<"RELEASE_DISTRIBUTION">>, <<"RELEASE_NODE">>,
                   <<"RELEASE_ROOT">>, <<"RELEASE_VSN">>, <<"RELEASE_VM_ARGS">>, <<"HOME">>,
                   <<"XDG_CONFIG_HOME">>, <<"ERL_EPMD_PORT">>]).
-define(MAX_COOKIE, 1024).
%% The file options of ssl that name files, rewritten to this host's view.
-define(SSL_FILES, [certfile, keyfile, cacertfile, dhfile]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc What the node found at OsPid was started with. Options:
%% `proc_root' ("/proc").
-spec read(beamdiag_host_locate:located() | pos_integer(), #{proc_root => file:filename()}) ->
    settings().
read(Pid, Opts) when is_integer(Pid) ->
    read_pid(Pid, #{}, Opts);
read(Located = #{os_pid := Pid}, Opts) ->
    read_pid(Pid, Located, Opts).

%%%===================================================================
%%% Internal
%%%===================================================================

read_pid(Pid, Located, Opts) ->
    ProcRoot = maps:get(proc_root, Opts, "/proc"),
    Dir = filename:join(ProcRoot, integer_to_list(Pid)),
    {Exe, Argv} = case beamdiag_host_locate:read(filename:join(Dir, "cmdline")) of
                      {ok, B} -> {hd(binary:split(B, <<0>>)), beamdiag_node_args:argv(B)};
                      {error, _} -> {<<>>, []}
                  end,
    {Env, EnvReadable} = environ(Dir),
    Status = case beamdiag_host_locate:status(ProcRoot, Pid) of
                 {ok, St} -> St;
                 {error, _} -> #{}
             end,
    Fs = fs(ProcRoot, Pid),
    Reader = fun(P) -> read_file(Fs, P) end,
    Flags0 = beamdiag_node_args:flags(beamdiag_node_args:init_args(Argv), init),
    Otp = otp_release(Exe, Flags0, Fs),
    Args0 = beamdiag_node_args:settings(Flags0, Otp),
    VmArgs = beamdiag_node_args:vm_args_paths(Args0, Env),
    {Raw, RawProblems} = beamdiag_node_args:raw_sources(Env, {VmArgs, Reader}),
    Args = release_name(beamdiag_node_args:attribute(Args0, Raw), Env),
    Passwd = case Reader(<<"/etc/passwd">>) of
                 {ok, P} -> P;
                 {error, _} -> none
             end,
    Home = beamdiag_node_args:home(Args, Env, {Passwd, maps:get(uid, Status, undefined)}),
    Roots = beamdiag_node_args:release_roots(Args, Env),
    {Cookies, CookieNotes} = cookies(Args, Env, Home, Roots, Reader),
    Tls = tls(Args, Fs),
    Notes = maps:get(notes, Args) ++
        [<<"the node's environment is not readable (/proc/PID/environ: run as the node's user "
           "or root): the settings it carries are not known">> || not EnvReadable] ++
        [iolist_to_binary(["an args file of the node was not read: ", Path, " (", reason(Why), ")"])
         || {Path, Why} <- RawProblems] ++
        [iolist_to_binary(["the node's command line names -args_file ", F, ", which erlexec did "
                           "not expand: its settings do not apply"])
         || F <- maps:get(args_file, Args, [])] ++
        CookieNotes,
    S = #{os_pid => Pid,
          otp => Otp,
          args => Args,
          env => Env,
          env_readable => EnvReadable,
          home => Home,
          release_roots => Roots,
          cookies => Cookies,
          listen => beamdiag_host_locate:listen_sockets(ProcRoot, Pid),
          fs => Fs,
          notes => Notes},
    S1 = case maps:find(uid, Status) of
             {ok, U} -> S#{uid => U};
             error -> S
         end,
    S2 = case maps:find(ns_pid, Located) of
             {ok, Ns} -> S1#{ns_pid => Ns};
             error -> S1
         end,
    case Tls of
        none -> S2;
        T -> S2#{tls => T}
    end.

%% A path of the node's file system as this host reaches it: under
%% /proc/PID/root when the node is in another mount namespace, relative
%% paths from its working folder.
fs_path(#{root := Root, cwd := Cwd}, Path) ->
    case filename:pathtype(Path) of
        absolute when Root =:= <<"/">> -> Path;
        absolute -> iolist_to_binary([Root, Path]);
        _ -> filename:join(Cwd, Path)
    end.

%% A file of the node's file system, at most 4 MiB of it.
read_file(Fs, Path) ->
    beamdiag_host_locate:read(fs_path(Fs, Path)).

environ(Dir) ->
    case beamdiag_host_locate:read(filename:join(Dir, "environ")) of
        {ok, Bin} ->
            Pairs = [binary:split(E, <<"=">>) || E <- binary:split(Bin, <<0>>, [global, trim_all])],
            {maps:from_list([{K, V} || [K, V] <- Pairs, lists:member(K, ?ENV_KEEP)]), true};
        {error, _} ->
            {#{}, false}
    end.

%% A release that starts distribution itself (Mix's RELEASE_DISTRIBUTION
%% and RELEASE_NODE, when no -sname or -name is on the command line) is
%% named by them.
release_name(Args = #{name := _}, _Env) ->
    Args;
release_name(Args, #{<<"RELEASE_NODE">> := Node, <<"RELEASE_DISTRIBUTION">> := D})
  when Node =/= <<>>, (D =:= <<"sname">> orelse D =:= <<"name">>) ->
    Args#{name => #{value => Node, origin => {env, <<"RELEASE_NODE">>},
                    mode => case D of <<"sname">> -> shortnames; <<"name">> -> longnames end}};
release_name(Args, _Env) ->
    Args.

%% The node's file system: this host's when it shares our mount
%% namespace, else through /proc/PID/root.
fs(ProcRoot, Pid) ->
    Dir = filename:join(ProcRoot, integer_to_list(Pid)),
    Same = case {file:read_link_all(filename:join([Dir, "ns", "mnt"])),
                 file:read_link_all(filename:join([ProcRoot, "self", "ns", "mnt"]))} of
               {{ok, A}, {ok, A}} -> true;
               {{ok, _}, {ok, _}} -> false;
               %% Not readable (another user's process): its paths are taken as ours.
               _ -> true
           end,
    #{root => case Same of
                  true -> <<"/">>;
                  false -> iolist_to_binary(filename:join(Dir, "root"))
              end,
      cwd => iolist_to_binary(filename:join(Dir, "cwd")),
      proc_root => ProcRoot}.

%% The node's OTP release: its root's releases/*/OTP_VERSION, else the
%% erts version in the emulator's path (erts 13 is OTP 25, and so on).
otp_release(Exe, Flags, Fs) ->
    Root = case [V || {<<"root">>, [V | _], _} <- Flags] of
               [R | _] -> R;
               [] -> undefined
           end,
    FromRoot = case Root of
                   undefined -> [];
                   _ ->
                       Rel = fs_path(Fs, filename:join(Root, <<"releases">>)),
                       case file:list_dir(Rel) of
                           {ok, Ds} ->
                               [Major || D <- lists:sort(Ds),
                                         {ok, V} <- [beamdiag_host_locate:read(
                                                       filename:join([Rel, D, "OTP_VERSION"]))],
                                         {Major, _} <- [string:to_integer(binary_to_list(V))],
                                         is_integer(Major)];
                           {error, _} -> []
                       end
               end,
    case FromRoot of
        [M | _] -> M;
        [] -> erts_otp(Exe)
    end.

erts_otp(Exe) ->
    case re:run(Exe, "/erts-([0-9]+)\\.", [{capture, all_but_first, list}]) of
        {match, [V]} -> list_to_integer(V) + 12;
        nomatch -> undefined
    end.

%% The cookies the node may use, most likely first: its -setcookie (the
%% one it uses when given), RELEASE_COOKIE, its release's releases/COOKIE,
%% the cookie file in its home (what it read at start without
%% -setcookie), then the XDG one. The same cookie found twice is kept
%% once, with its first origin.
cookies(Args, Env, Home, Roots, Reader) ->
    Set = case maps:find(setcookie, Args) of
              {ok, #{value := C, origin := O}} -> [{C, {setcookie, O}}];
              error -> []
          end,
    FromEnv = case maps:find(<<"RELEASE_COOKIE">>, Env) of
                  {ok, C2} when C2 =/= <<>> -> [{C2, {env, <<"RELEASE_COOKIE">>}}];
                  _ -> []
              end,
    HomePath = case Home of
                   {H, _} -> H;
                   none -> none
               end,
    #{home := HomeFiles, release := RelFiles} =
        beamdiag_node_args:cookie_files(HomePath, Env, Roots),
    {Rel, RelNotes} = read_cookies(RelFiles, Reader, all, release_file),
    %% auth reads the XDG file only when the home one does not exist.
    {HomeCookies, HomeNotes} = read_cookies(HomeFiles, Reader, first, home_file),
    {dedup_cookies(Set ++ FromEnv ++ Rel ++ HomeCookies), RelNotes ++ HomeNotes}.

read_cookies(Files, Reader, Which, Kind) ->
    lists:foldl(
        fun(_F, {[_ | _], _} = Done) when Which =:= first ->
                Done;
           (F, {Acc, Notes}) ->
                case Reader(F) of
                    {ok, Bin} when byte_size(Bin) > 0, byte_size(Bin) =< ?MAX_COOKIE ->
                        case string:trim(Bin) of
                            <<>> -> {Acc, Notes};
                            C -> {Acc ++ [{C, {Kind, F}}], Notes}
                        end;
                    {ok, _} ->
                        {Acc, Notes};
                    {error, enoent} ->
                        {Acc, Notes};
                    {error, Why} ->
                        {Acc, Notes ++ [iolist_to_binary(["cannot read the cookie file ", F, ": ",
                                                          reason(Why), " (run as the node's user "
                                                          "or root)"])]}
                end
        end, {[], []}, Files).

dedup_cookies(L) ->
    lists:reverse(lists:foldl(fun({C, O}, Acc) ->
                                      case lists:keymember(C, 1, Acc) of
                                          true -> Acc;
                                          false -> [{C, O} | Acc]
                                      end
                              end, [], L)).

%% The node's TLS options for distribution, as a client reaching it would
%% use them: the `client' part of its -ssl_dist_optfile (else its server
%% certificate and key, with no check of its certificate), or its
%% -ssl_dist_opt client_* pairs; every file they name rewritten to this
%% host's view of the node's file system.
tls(Args, Fs) ->
    case {maps:find(ssl_dist_optfile, Args), maps:find(ssl_dist_opt, Args)} of
        {{ok, #{value := File, origin := O}}, _} ->
            case read_file(Fs, File) of
                {ok, Bin} ->
                    case beamdiag_node_args:ssl_options(Bin) of
                        {ok, L} ->
                            Client = case lists:keyfind(client, 1, L) of
                                         {client, C} -> C;
                                         false ->
                                             Server = proplists:get_value(server, L, []),
                                             [{verify, verify_none} |
                                              [KV || {K, _} = KV <- Server,
                                                     lists:member(K, [certfile, keyfile])]]
                                     end,
                            #{optfile => File, origin => O, client => host_files(Fs, Client)};
                        {error, Why} ->
                            #{optfile => File, origin => O, error => {bad_optfile, Why}}
                    end;
                {error, Why} ->
                    #{optfile => File, origin => O, error => {unreadable, fs_path(Fs, File), Why}}
            end;
        {error, {ok, #{value := Pairs, origin := O}}} ->
            Keys = [certfile, keyfile, cacertfile, verify, password, depth],
            Client = [{K, opt_value(K2, V)}
                      || {<<"client_", K2/binary>>, V} <- Pairs, K <- Keys,
                         atom_to_binary(K) =:= K2],
            #{optfile => <<>>, origin => O, client => host_files(Fs, Client)};
        {error, error} ->
            none
    end.

opt_value(<<"verify">>, <<"verify_peer">>) -> verify_peer;
opt_value(<<"verify">>, _) -> verify_none;
opt_value(<<"depth">>, V) ->
    case string:to_integer(binary_to_list(V)) of
        {N, ""} when N >= 0 -> N;
        _ -> 1
    end;
opt_value(_, V) -> binary_to_list(V).

host_files(Fs, Opts) ->
    [case lists:member(K, ?SSL_FILES) of
         true when is_list(V); is_binary(V) ->
             {K, binary_to_list(fs_path(Fs, iolist_to_binary(V)))};
         _ -> {K, V}
     end || {K, V} <- Opts].

reason(Why) when is_atom(Why) ->
    case file:format_error(Why) of
        "unknown POSIX error" ++ _ -> atom_to_list(Why);
        T -> T
    end;
reason(Why) ->
    io_lib:format("~0p", [Why]).
