%%% @doc What a node was started with, from text alone: its argument
%%% vector (/proc/PID/cmdline), the environment variables that carry
%%% arguments, args files and vm.args, the password database. Pure
%%% functions over binaries; files are read through a reader fun the
%%% caller gives (`beamdiag_node_settings' reads the host), so the tests
%%% run on fixtures.
%%%
%%% The rules are those of the programs that read the same text:
%%% erlexec's (tokens, quotes, `#' comments in args files, `-args_file'
%%% expanded in place, nested, each source closed by `--'), init's (a
%%% token starting with `-' is a flag, the tokens after it its values,
%%% `-extra' ends them), and each setting's reader's: the first `-sname'
%%% (then `-name'), exactly one `-setcookie' of one value (auth), the first
%%% `-epmd_module', exactly one `-erl_epmd_port', the first `-kernel'
%%% value of a key, and `-proto_dist': exactly one on OTP 25, the first
%%% on later releases.
%%%
%%% A setting carries its origin: `command_line', `{env, Var}' or `{file,
%%% Path}' (erlexec expands args files and the environment into the
%%% emulator's arguments, so `attribute/2' finds which raw source holds
%%% the same flag with the same values), or `default'.
%%%
%%% ```
%%% 1> Args = beamdiag_node_args:init_args(beamdiag_node_args:argv(Cmdline)).
%%% 2> S = beamdiag_node_args:settings(beamdiag_node_args:flags(Args, init), 25).
%%% 3> maps:get(name, S).
%%% #{value => <<"app">>, mode => shortnames, origin => command_line}
%%% '''
-module(beamdiag_node_args).

-export([argv/1, init_args/1, flags/2, settings/2, attribute/2, raw_sources/2, release_roots/2,
         vm_args_paths/2, home/3, cookie_files/3, ssl_options/1, origin_text/1]).
%% The steps of the reading, for the tests.
-ifdef(TEST).
-export([tokens/2, tag/2, expand/2, passwd_home/2, kernel_term/1]).
-endif.

-export_type([origin/0, tagged/0, flag/0, settings/0, setting/0, reader/0]).

-type origin() :: command_line | default | {env, binary()} | {file, binary()}.
-type tagged() :: {binary(), origin()}.
-type flag() :: {binary(), [binary()], origin()}.
-type setting() :: #{value => term(), origin := origin(), mode => shortnames | longnames}.
-type settings() :: #{atom() => setting() | [binary()]}.
%% Reads a file by its path on the node's file system: the caller decides
%% how (through /proc/PID/root, a fixture map...).
-type reader() :: fun((binary()) -> {ok, binary()} | {error, term()}).

%% Bounds on hostile input: arguments in a vector, values of one flag,
%% args files followed (nesting and count), tokens read from files.
-define(MAX_ARGS, 65536).
-define(MAX_VALUES, 1024).
-define(MAX_DEPTH, 16).
-define(MAX_FILES, 64).
-define(MAX_TOKENS, 100000).
%% The longest text parsed as a term (a -kernel value, an ssl options file).
-define(MAX_TERM, 65536).

%% The kernel parameters read.
-define(KERNEL_KEYS, [<<"inet_dist_listen_min">>, <<"inet_dist_listen_max">>,
                      <<"inet_dist_use_interface">>, <<"erl_epmd_node_listen_port">>,
                      <<"epmd_module">>]).
%% The environment variables that carry arguments, in erlexec's order
%% around the command line (ERL_AFLAGS before it, ERL_FLAGS and ERL_ZFLAGS
%% after), and Elixir's.
-define(ARG_VARS, [<<"ERL_AFLAGS">>, <<"ERL_FLAGS">>, <<"ERL_ZFLAGS">>,
                   <<"ELIXIR_ERL_OPTIONS">>]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The argument vector of /proc/PID/cmdline (NUL-separated), without
%% the program itself; at most 65536 arguments.
-spec argv(binary()) -> [binary()].
argv(Bin) when is_binary(Bin) ->
    case binary:split(Bin, <<0>>, [global]) of
        [_Exe | Args] -> lists:sublist(drop_last_empty(Args), ?MAX_ARGS);
        [] -> []
    end.

%% @doc The part of an emulator's argument vector that init reads: what
%% follows the first `--' (the emulator's own flags come before it). A
%% vector without `--' is taken whole.
-spec init_args([binary()]) -> [tagged()].
init_args(Argv) ->
    Init = case lists:splitwith(fun(A) -> A =/= <<"--">> end, Argv) of
               {_Emu, [<<"--">> | Rest]} -> Rest;
               {All, []} -> All
           end,
    tag(Init, command_line).

%% @doc Text split into arguments as erlexec splits an environment
%% variable (`Comments' false) or an args file (true): white space
%% separates, `"..."' and `'...'' quote, `\' takes the next character as
%% it is, and in files `#' starts a comment to the end of the line.
-spec tokens(binary(), boolean()) -> [binary()].
tokens(Bin, Comments) when is_binary(Bin) ->
    lists:sublist(tok(Bin, Comments, start, [], []), ?MAX_TOKENS).

%% @doc Arguments with their origin.
-spec tag([binary()], origin()) -> [tagged()].
tag(Args, Origin) ->
    [{A, Origin} || A <- Args].

%% @doc Expands `-args_file FILE' in place, as erlexec does: the file's
%% arguments, tagged with it, then `--'; files inside files too, at most
%% 16 deep and 64 files. Returns the arguments and the files that could
%% not be followed, each with why (a reader error, `loop', `too_deep',
%% `too_many', `no_file_name').
-spec expand([tagged()], reader()) -> {[tagged()], [{binary(), term()}]}.
expand(Tagged, Reader) ->
    {Out, Problems, _Count} = expand(Tagged, Reader, [], 0),
    {Out, lists:reverse(Problems)}.

%% @doc Flags with their values, in order. `init': a token starting with
%% `-' is a flag (init's reading of the emulator's arguments); `raw': a
%% token starting with `+' is one too (an emulator flag in an environment
%% variable or args file, which erlexec moves ahead). `--' ends a flag's
%% values; `-extra' ends the flags.
-spec flags([tagged()], init | raw) -> [flag()].
flags(Tagged, Mode) ->
    flags(Tagged, Mode, []).

%% @doc The distribution settings the flags give, each with the flag's
%% origin, read as the node's release reads them (Otp: its major release,
%% or undefined). Keys: `name' (with `mode'), `setcookie' (a secret),
%% `nocookie', `proto_dist' (a list), `epmd_module', `erl_epmd_port',
%% `no_epmd', `dist_listen', `hidden', `ssl_dist_optfile', `ssl_dist_opt'
%% (pairs), `inet_dist_listen_min', `inet_dist_listen_max',
%% `inet_dist_use_interface', `erl_epmd_node_listen_port', `kernel_epmd_module',
%% `home', `root', `boot', `config' (a list), `args_file' (files named on
%% an emulator's command line, which erlexec did not expand and so do not
%% apply), and `notes' (binaries: what was ignored, and why).
-spec settings([flag()], pos_integer() | undefined) -> settings().
settings(Flags, Otp) ->
    By = fun(Name) -> [{V, O} || {N, V, O} <- Flags, N =:= Name] end,
    S0 = #{notes => []},
    S1 = name(By(<<"sname">>), By(<<"name">>), S0),
    S2 = setcookie(By(<<"setcookie">>), S1),
    S3 = first_present(nocookie, By(<<"nocookie">>), S2),
    S4 = proto_dist(By(<<"proto_dist">>), Otp, S3),
    S5 = first_value(epmd_module, By(<<"epmd_module">>), S4),
    S6 = erl_epmd_port(By(<<"erl_epmd_port">>), S5),
    S7 = first_present(no_epmd, By(<<"no_epmd">>), S6),
    S8 = case By(<<"dist_listen">>) of
             [{[<<"false">> | _], O} | _] -> S7#{dist_listen => #{value => false, origin => O}};
             _ -> S7
         end,
    S9 = case By(<<"hidden">>) of
             [{[], O2} | _] -> S8#{hidden => #{value => true, origin => O2}};
             [{[<<"true">> | _], O2} | _] -> S8#{hidden => #{value => true, origin => O2}};
             _ -> S8
         end,
    S10 = case By(<<"ssl_dist_optfile">>) of
              [{[F | _], O3}] -> S9#{ssl_dist_optfile => #{value => F, origin => O3}};
              [_, _ | _] -> note(S9, <<"-ssl_dist_optfile is given more than once: "
                                       "the node reads none of them">>);
              _ -> S9
          end,
    S11 = case By(<<"ssl_dist_opt">>) of
              [] -> S10;
              [{_, O4} | _] = Opts ->
                  S10#{ssl_dist_opt => #{value => pairs(lists:append([V || {V, _} <- Opts])),
                                         origin => O4}}
          end,
    S12 = kernel(By(<<"kernel">>), S11),
    S13 = first_value(home, By(<<"home">>), first_value(root, By(<<"root">>),
                                                        first_value(boot, By(<<"boot">>), S12))),
    S14 = case lists:append([V || {V, _} <- By(<<"config">>)]) of
              [] -> S13;
              Configs -> S13#{config => Configs}
          end,
    case lists:append([V || {V, _} <- By(<<"args_file">>)]) of
        [] -> S14;
        Files -> S14#{args_file => Files}
    end.

%% @doc Each setting read from the command line gets the origin of the
%% first raw source (in the order given: environment variables, args
%% files, vm.args) whose flags set it to the same value; the others stay
%% `command_line'. Sources: `[{Flags, Origin}]' as `flags(_, raw)' reads
%% them (each flag already tagged).
-spec attribute(settings(), [flag()]) -> settings().
attribute(Settings, RawFlags) ->
    maps:map(fun(Key, S = #{origin := command_line}) ->
                     case origin_of(Key, S, RawFlags) of
                         none -> S;
                         O -> S#{origin => O}
                     end;
                (_Key, S) ->
                     S
             end, Settings).

%% @doc The raw sources of arguments a node's environment names: each
%% argument variable (ERL_AFLAGS, ERL_FLAGS, ERL_ZFLAGS, ELIXIR_ERL_OPTIONS)
%% that is set, split as erlexec splits it, with `-args_file' followed,
%% and the vm.args files given that exist (each expanded the same way).
%% Returns the flags, tagged, and what could not be followed.
-spec raw_sources(#{binary() => binary()}, {[binary()], reader()}) ->
    {[flag()], [{binary(), term()}]}.
raw_sources(Env, {VmArgs, Reader}) ->
    EnvTagged = [tag(tokens(V, false) ++ [<<"--">>], {env, Var})
                 || Var <- ?ARG_VARS, {ok, V} <- [maps:find(Var, Env)]],
    {Files, FileProblems} =
        lists:foldl(fun(Path, {Acc, P}) ->
                            case Reader(Path) of
                                {ok, Bin} -> {[tag(tokens(Bin, true) ++ [<<"--">>], {file, Path})
                                               | Acc], P};
                                {error, enoent} -> {Acc, P};
                                {error, Why} -> {Acc, [{Path, Why} | P]}
                            end
                    end, {[], []}, VmArgs),
    %% erlexec's order: ERL_AFLAGS, the command line (where a vm.args
    %% comes in), ERL_FLAGS, ERL_ZFLAGS; Elixir adds its options to the
    %% command line.
    {Aflags, Others} = lists:partition(fun([{_, {env, <<"ERL_AFLAGS">>}} | _]) -> true;
                                          (_) -> false
                                       end, EnvTagged),
    {Expanded, Problems} = expand(lists:append(Aflags ++ lists:reverse(Files) ++ Others), Reader),
    {flags(Expanded, raw), lists:reverse(FileProblems) ++ Problems}.

%% @doc Where a node's release may live: RELEASE_ROOT, and the folder
%% above `releases/' in its `-boot' and `-config' paths and its `-root'.
-spec release_roots(settings(), #{binary() => binary()}) -> [binary()].
release_roots(Settings, Env) ->
    FromPath = fun(Key) ->
                   case maps:find(Key, Settings) of
                       {ok, #{value := P}} -> above_releases(P);
                       error -> []
                   end
               end,
    Configs = lists:append([above_releases(C) || C <- maps:get(config, Settings, [])]),
    Root = case maps:find(root, Settings) of
               {ok, #{value := R}} -> [R];
               error -> []
           end,
    dedup(env_list(<<"RELEASE_ROOT">>, Env) ++ FromPath(boot) ++ Configs ++ Root).

%% @doc The vm.args files a node may have been started with:
%% RELEASE_VM_ARGS, and `releases/VSN/vm.args' under each release root for
%% the version in its `-boot' path or RELEASE_VSN.
-spec vm_args_paths(settings(), #{binary() => binary()}) -> [binary()].
vm_args_paths(Settings, Env) ->
    Vsns = dedup(case maps:find(boot, Settings) of
                     {ok, #{value := B}} -> release_vsn(B);
                     error -> []
                 end ++ env_list(<<"RELEASE_VSN">>, Env)),
    dedup(env_list(<<"RELEASE_VM_ARGS">>, Env) ++
              [join([Root, <<"releases">>, V, <<"vm.args">>])
               || Root <- release_roots(Settings, Env), V <- Vsns]).

%% @doc The home folder of the user the node runs as, with where it came
%% from: `-home' (erlexec puts HOME there at the start), else HOME in its
%% environment, else the password database's entry for its user id
%% (`{passwd, Uid}'); `none' when none says.
-spec home(settings(), #{binary() => binary()}, {binary() | none, integer() | undefined}) ->
    {binary(), origin() | {passwd, integer()}} | none.
home(Settings, Env, {Passwd, Uid}) ->
    case {maps:find(home, Settings), maps:find(<<"HOME">>, Env)} of
        {{ok, #{value := H}}, {ok, H}} when H =/= <<>> -> {H, {env, <<"HOME">>}};
        {{ok, #{value := H, origin := O}}, _} when H =/= <<>> -> {H, O};
        {_, {ok, H}} when H =/= <<>> -> {H, {env, <<"HOME">>}};
        _ when is_binary(Passwd), is_integer(Uid) ->
            case passwd_home(Passwd, Uid) of
                {ok, H} -> {H, {passwd, Uid}};
                error -> none
            end;
        _ -> none
    end.

%% @doc The cookie files a node's own rules would read, in order: in its
%% home `.erlang.cookie', then the XDG one (`$XDG_CONFIG_HOME/erlang/',
%% else `~/.config/erlang/'), as auth reads them; and `releases/COOKIE'
%% under each release root (where Mix releases keep the cookie their
%% start script passes on).
-spec cookie_files(binary() | none, #{binary() => binary()}, [binary()]) ->
    #{home := [binary()], release := [binary()]}.
cookie_files(Home, Env, Roots) ->
    Xdg = case {maps:find(<<"XDG_CONFIG_HOME">>, Env), Home} of
              {{ok, X}, _} when X =/= <<>> -> [join([X, <<"erlang">>, <<".erlang.cookie">>])];
              {_, H} when is_binary(H) -> [join([H, <<".config">>, <<"erlang">>,
                                                  <<".erlang.cookie">>])];
              _ -> []
          end,
    HomeFile = case Home of
                   H2 when is_binary(H2) -> [join([H2, <<".erlang.cookie">>])];
                   none -> []
               end,
    #{home => dedup(HomeFile ++ Xdg),
      release => dedup([join([R, <<"releases">>, <<"COOKIE">>]) || R <- Roots])}.

%% @doc The home folder of a user id in a password database (passwd(5)).
-spec passwd_home(binary(), integer()) -> {ok, binary()} | error.
passwd_home(Bin, Uid) ->
    U = integer_to_binary(Uid),
    Homes = [Home || Line <- binary:split(Bin, <<"\n">>, [global]),
                     [_Name, _Pw, Id, _Gid, _Gecos, Home | _] <- [binary:split(Line, <<":">>,
                                                                               [global])],
                     Id =:= U, Home =/= <<>>],
    case Homes of
        [H | _] -> {ok, H};
        [] -> error
    end.

%% @doc An `-ssl_dist_optfile' file's text, as ssl reads it: one term, a
%% list of `{server, Opts}' and `{client, Opts}'. Nothing is evaluated.
-spec ssl_options(binary()) -> {ok, [{server | client, list()}]} | {error, term()}.
ssl_options(Bin) when byte_size(Bin) > ?MAX_TERM ->
    {error, too_large};
ssl_options(Bin) ->
    case parse_term(Bin) of
        {ok, L} when is_list(L) ->
            case lists:all(fun({K, V}) -> (K =:= server orelse K =:= client) andalso is_list(V);
                              (_) -> false
                           end, L) of
                true -> {ok, L};
                false -> {error, not_server_client_lists}
            end;
        {ok, _} ->
            {error, not_a_list};
        {error, _} = E ->
            E
    end.

%% @doc A `-kernel' value as the application controller reads it: one
%% term, never evaluated.
-spec kernel_term(binary()) -> {ok, term()} | {error, term()}.
kernel_term(Bin) when byte_size(Bin) > ?MAX_TERM ->
    {error, too_large};
kernel_term(Bin) ->
    parse_term(<<Bin/binary, ".">>).

%% @doc Where a setting came from, in words.
-spec origin_text(origin() | {passwd, integer()} | {cli, string()} | term()) -> binary().
origin_text(command_line) -> <<"the command line">>;
origin_text(default) -> <<"the default">>;
origin_text({env, Var}) -> <<"the environment variable ", Var/binary>>;
origin_text({file, Path}) -> <<"the file ", Path/binary>>;
origin_text({passwd, Uid}) ->
    <<"the password database (user id ", (integer_to_binary(Uid))/binary, ")">>;
origin_text({cli, Opt}) -> iolist_to_binary(["beamdiag's ", Opt]);
origin_text(Other) -> iolist_to_binary(io_lib:format("~0p", [Other])).

%%%===================================================================
%%% Internal
%%%===================================================================

drop_last_empty(Args) ->
    case lists:reverse(Args) of
        [<<>> | Rest] -> lists:reverse(Rest);
        _ -> Args
    end.

%% erlexec's splitter (build_args_from_string), one state per clause.
tok(<<>>, _C, start, [], Acc) ->
    lists:reverse(Acc);
tok(<<>>, _C, _State, Cur, Acc) ->
    lists:reverse([cur(Cur) | Acc]);
tok(<<Ch, R/binary>>, C, start, [], Acc) when Ch =:= $\s; Ch =:= $\t; Ch =:= $\n; Ch =:= $\r;
                                              Ch =:= $\f; Ch =:= $\v ->
    tok(R, C, start, [], Acc);
tok(<<$#, R/binary>>, true, start, [], Acc) ->
    tok(skip_line(R), true, start, [], Acc);
tok(Bin, C, start, [], Acc) ->
    tok(Bin, C, build, [], Acc);
tok(<<Ch, R/binary>>, C, build, Cur, Acc) when Ch =:= $\s; Ch =:= $\t; Ch =:= $\n; Ch =:= $\r;
                                               Ch =:= $\f; Ch =:= $\v ->
    tok(R, C, start, [], [cur(Cur) | Acc]);
tok(<<$#, _/binary>> = Bin, true, build, Cur, Acc) ->
    %% A comment ends the argument; the comment is skipped from `start'.
    tok(Bin, true, start, [], [cur(Cur) | Acc]);
tok(<<$", R/binary>>, C, build, Cur, Acc) ->
    {In, R2} = quoted(R, $", []),
    tok(R2, C, build, In ++ Cur, Acc);
tok(<<$', R/binary>>, C, build, Cur, Acc) ->
    {In, R2} = quoted(R, $', []),
    tok(R2, C, build, In ++ Cur, Acc);
tok(<<$\\, Ch, R/binary>>, C, build, Cur, Acc) ->
    tok(R, C, build, [Ch | Cur], Acc);
tok(<<$\\>>, C, build, Cur, Acc) ->
    tok(<<>>, C, build, Cur, Acc);
tok(<<Ch, R/binary>>, C, build, Cur, Acc) ->
    tok(R, C, build, [Ch | Cur], Acc).

%% The characters up to the closing quote (or the end), reversed.
quoted(<<Q, R/binary>>, Q, Acc) -> {Acc, R};
quoted(<<Ch, R/binary>>, Q, Acc) -> quoted(R, Q, [Ch | Acc]);
quoted(<<>>, _Q, Acc) -> {Acc, <<>>}.

skip_line(Bin) ->
    case binary:split(Bin, <<"\n">>) of
        [_, Rest] -> Rest;
        [_] -> <<>>
    end.

cur(Rev) -> list_to_binary(lists:reverse(Rev)).

expand([], _Reader, _Stack, Count) ->
    {[], [], Count};
expand([{<<"-args_file">>, _}], _Reader, _Stack, Count) ->
    {[], [{<<"-args_file">>, no_file_name}], Count};
expand([{<<"-args_file">>, _}, {Path, _} | Rest], Reader, Stack, Count) ->
    {Here, P1, C1} =
        case {lists:member(Path, Stack), length(Stack) >= ?MAX_DEPTH, Count >= ?MAX_FILES} of
            {true, _, _} -> {[], [{Path, loop}], Count};
            {_, true, _} -> {[], [{Path, too_deep}], Count};
            {_, _, true} -> {[], [{Path, too_many}], Count};
            _ ->
                case Reader(Path) of
                    {ok, Bin} ->
                        Inner = tag(tokens(Bin, true) ++ [<<"--">>], {file, Path}),
                        expand(Inner, Reader, [Path | Stack], Count + 1);
                    {error, Why} ->
                        {[], [{Path, Why}], Count + 1}
                end
        end,
    {More, P2, C2} = expand(Rest, Reader, Stack, C1),
    {Here ++ More, P2 ++ P1, C2};
expand([A | Rest], Reader, Stack, Count) ->
    {More, P, C} = expand(Rest, Reader, Stack, Count),
    {[A | More], P, C}.

flags([], _Mode, Acc) ->
    lists:reverse(Acc);
flags([{<<"-extra">>, _} | _], _Mode, Acc) ->
    lists:reverse(Acc);
flags([{<<"--">>, _} | Rest], Mode, Acc) ->
    flags(Rest, Mode, Acc);
flags([{Flag, O} | Rest], Mode, Acc) ->
    case flag_name(Flag, Mode) of
        {ok, Name} ->
            {Values, Rest2} = values(Rest, Mode, []),
            flags(Rest2, Mode, [{Name, Values, O} | Acc]);
        none ->
            flags(Rest, Mode, Acc)
    end.

flag_name(<<$-, Name/binary>>, _Mode) when Name =/= <<>> -> {ok, Name};
flag_name(<<$+, Name/binary>>, raw) when Name =/= <<>> -> {ok, <<$+, Name/binary>>};
flag_name(_, _) -> none.

values([{<<"--">>, _} | Rest], _Mode, Acc) ->
    {lists:reverse(Acc), Rest};
values([{A, _} | _] = All, Mode, Acc) ->
    case flag_name(A, Mode) of
        {ok, _} -> {lists:reverse(Acc), All};
        none when length(Acc) >= ?MAX_VALUES -> values(tl(All), Mode, Acc);
        none -> values(tl(All), Mode, [A | Acc])
    end;
values([], _Mode, Acc) ->
    {lists:reverse(Acc), []}.

%% erl_distribution reads -sname first, then -name; of several, the first.
name(Snames, Names, S) ->
    case {Snames, Names} of
        {[{[N], O} | _], _} -> S#{name => #{value => N, mode => shortnames, origin => O}};
        {[], [{[N], O} | _]} -> S#{name => #{value => N, mode => longnames, origin => O}};
        {[], []} -> S;
        _ -> note(S, <<"-sname or -name is given without exactly one value: the node "
                       "starts without distribution">>)
    end.

%% auth: exactly one -setcookie of one value is the node's cookie; with
%% several, or one without a value, the node uses its cookie file.
setcookie(Occurrences, S) ->
    Own = [{V, O} || {V, O} <- Occurrences, length(V) =< 1],
    case Own of
        [{[C], O}] -> S#{setcookie => #{value => C, origin => O}};
        [] -> S;
        _ -> note(S, <<"-setcookie is given more than once: the node ignores it and reads "
                       "its cookie file">>)
    end.

%% OTP 25 reads exactly one -proto_dist (with several, none: inet_tcp);
%% later releases read the first.
proto_dist([], _Otp, S) ->
    S;
proto_dist([{Protos, O}], _Otp, S) when Protos =/= [] ->
    S#{proto_dist => #{value => Protos, origin => O}};
proto_dist([{Protos, O} | _], Otp, S) when is_integer(Otp), Otp >= 26, Protos =/= [] ->
    note(S#{proto_dist => #{value => Protos, origin => O}},
         <<"-proto_dist is given more than once: the node uses the first">>);
proto_dist(_, _Otp, S) ->
    note(S, <<"-proto_dist is given more than once, or empty: the node uses inet_tcp">>).

erl_epmd_port([{[P], O}], S) ->
    case string:to_integer(binary_to_list(P)) of
        {N, ""} when N > 0, N < 65536 -> S#{erl_epmd_port => #{value => N, origin => O}};
        _ -> note(S, <<"-erl_epmd_port is not a port number: the node ignores it">>)
    end;
erl_epmd_port([], S) ->
    S;
erl_epmd_port(_, S) ->
    note(S, <<"-erl_epmd_port is given more than once, or not with one value: the node "
              "ignores it">>).

first_value(Key, [{[V | _], O} | _], S) -> S#{Key => #{value => V, origin => O}};
first_value(_Key, _, S) -> S.

first_present(Key, [{_, O} | _], S) -> S#{Key => #{origin => O}};
first_present(_Key, [], S) -> S.

pairs([K, V | T]) -> [{K, V} | pairs(T)];
pairs(_) -> [].

%% The first value of each kernel parameter read, as a term.
kernel(Occurrences, S) ->
    Pairs = [{K, V, O} || {Vs, O} <- Occurrences, {K, V} <- pairs(Vs), lists:member(K, ?KERNEL_KEYS)],
    lists:foldl(
        fun({K, V, O}, Acc) ->
            Key = case K of
                      <<"epmd_module">> -> kernel_epmd_module;
                      _ -> binary_to_atom(K)
                  end,
            case maps:is_key(Key, Acc) of
                true -> Acc;
                false ->
                    case kernel_term(V) of
                        {ok, T} -> Acc#{Key => #{value => T, origin => O}};
                        {error, _} -> note(Acc, <<"-kernel ", K/binary, " is not a term the "
                                                  "node can read">>)
                    end
            end
        end, S, Pairs).

note(S = #{notes := N}, Text) ->
    S#{notes := N ++ [Text]}.

%% The origin of a setting in the raw sources: the first flag there with
%% the same name and values.
origin_of(Key, S, Raw) ->
    Match = case Key of
                name -> flag_match(case maps:get(mode, S) of
                                       shortnames -> <<"sname">>;
                                       longnames -> <<"name">>
                                   end, [maps:get(value, S)]);
                setcookie -> flag_match(<<"setcookie">>, [maps:get(value, S)]);
                proto_dist -> flag_match(<<"proto_dist">>, maps:get(value, S));
                epmd_module -> first_arg(<<"epmd_module">>, maps:get(value, S));
                erl_epmd_port -> flag_match(<<"erl_epmd_port">>,
                                            [integer_to_binary(maps:get(value, S))]);
                ssl_dist_optfile -> first_arg(<<"ssl_dist_optfile">>, maps:get(value, S));
                home -> first_arg(<<"home">>, maps:get(value, S));
                boot -> first_arg(<<"boot">>, maps:get(value, S));
                root -> first_arg(<<"root">>, maps:get(value, S));
                no_epmd -> fun({N, _}) -> N =:= <<"no_epmd">> end;
                nocookie -> fun({N, _}) -> N =:= <<"nocookie">> end;
                hidden -> fun({N, _}) -> N =:= <<"hidden">> end;
                dist_listen -> first_arg(<<"dist_listen">>, <<"false">>);
                ssl_dist_opt -> fun({N, _}) -> N =:= <<"ssl_dist_opt">> end;
                kernel_epmd_module -> kernel_match(<<"epmd_module">>, S);
                K when is_atom(K) -> kernel_match(atom_to_binary(K), S)
            end,
    case [O || {N, V, O} <- Raw, Match({N, V})] of
        [O | _] -> O;
        [] -> none
    end.

flag_match(Name, Values) -> fun({N, V}) -> N =:= Name andalso V =:= Values end.

first_arg(Name, Value) -> fun({N, V}) -> N =:= Name andalso V =/= [] andalso hd(V) =:= Value end.

kernel_match(K, #{value := Value}) ->
    fun({<<"kernel">>, V}) ->
            lists:any(fun({K2, V2}) -> K2 =:= K andalso kernel_term(V2) =:= {ok, Value} end,
                      pairs(V));
       (_) -> false
    end;
kernel_match(_K, _S) ->
    fun(_) -> false end.

parse_term(Bin) ->
    try
        case erl_scan:string(unicode:characters_to_list(Bin)) of
            {ok, Tokens, _} ->
                case erl_parse:parse_term(Tokens) of
                    {ok, T} -> {ok, T};
                    {error, _} -> {error, not_a_term}
                end;
            {error, _, _} ->
                {error, not_a_term}
        end
    catch
        _:_ -> {error, not_a_term}
    end.

%% "/r/releases/1.0/start" -> ["/r"].
above_releases(Path) ->
    Parts = filename:split(Path),
    case lists:reverse(Parts) of
        [_File, _Vsn, <<"releases">> | Up] when Up =/= [] -> [filename:join(lists:reverse(Up))];
        _ -> []
    end.

release_vsn(Boot) ->
    case lists:reverse(filename:split(Boot)) of
        [_File, Vsn, <<"releases">> | _] -> [Vsn];
        _ -> []
    end.

env_list(Var, Env) ->
    case maps:find(Var, Env) of
        {ok, V} when V =/= <<>> -> [V];
        _ -> []
    end.

join(Parts) -> filename:join(Parts).

dedup(L) -> dedup(L, []).
dedup([], Acc) -> lists:reverse(Acc);
dedup([H | T], Acc) ->
    case lists:member(H, Acc) of
        true -> dedup(T, Acc);
        false -> dedup(T, [H | Acc])
    end.
