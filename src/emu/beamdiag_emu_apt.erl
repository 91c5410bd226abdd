%%% @doc Debian's apt sources for the emulator's source package: whether a
%%% deb-src entry exists (one-line lists and deb822 `.sources' files), and
%%% with `add_deb_src' adding one for the configured Debian mirrors.
%%%
%%% ```
%%% 1> beamdiag_emu_apt:has_deb_src(".list", <<"deb-src http://x y main\n">>).
%%% true
%%% '''
-module(beamdiag_emu_apt).

-export([ensure_deb_src/1, apt_update/1, deb_src_file/0]).

-ifdef(TEST).
-export([deb822/1, has_deb_src/2, one_line_debs/1]).
-endif.

%% A deb822 stanza: its fields, each on one line.
-type stanza() :: #{string() => string()}.

-define(DEB_SRC_FILE, "/etc/apt/sources.list.d/beamdiag-deb-src.sources").

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The apt sources file `add_deb_src' writes.
-spec deb_src_file() -> string().
deb_src_file() ->
    ?DEB_SRC_FILE.

%% @doc Makes sure apt knows a deb-src entry; adds one only when asked to.
-spec ensure_deb_src(beamdiag_emu_type:settled()) -> ok.
ensure_deb_src(#{add_deb_src := Add, progress := P}) ->
    case has_deb_src() of
        true ->
            ok;
        false when not Add ->
            throw({beamdiag_emu_type, no_deb_src});
        false ->
            Stanzas =
                case deb_mirrors() of
                    [] -> throw({beamdiag_emu_type, no_debian_mirrors});
                    Ss -> Ss
                end,
            Text = [
                ["Types: deb-src\n", [[K, ": ", V, "\n"] || {K, V} <- S], "\n"]
             || S <- Stanzas
            ],
            Header = "# Added by beamdiag emu-type build --add-deb-src (source of the emulator)\n",
            case file:write_file(?DEB_SRC_FILE, [Header | Text]) of
                ok -> ok;
                {error, eacces} -> throw({beamdiag_emu_type, need_root});
                {error, Why} -> throw({beamdiag_emu_type, {file, "write", ?DEB_SRC_FILE, Why}})
            end,
            P(["added deb-src entries to ", ?DEB_SRC_FILE, "\n"]),
            apt_update(P)
    end.

%% @doc Runs `apt-get update'.
-spec apt_update(fun((iodata()) -> ok)) -> ok.
apt_update(P) ->
    P("running apt-get update\n"),
    ok = beamdiag_emu_os:run(beamdiag_emu_os:exe("apt-get"), ["update", "-q"], "/",
                             [{"DEBIAN_FRONTEND", "noninteractive"}], P).

%% True when some apt source (one-line or deb822 format) has deb-src.
-spec has_deb_src() -> boolean().
has_deb_src() ->
    lists:any(
        fun(File) ->
            case file:read_file(File) of
                {ok, B} -> has_deb_src(filename:extension(File), B);
                _ -> false
            end
        end,
        apt_source_files()
    ).

-spec has_deb_src(string(), binary()) -> boolean().
has_deb_src(".sources", B) ->
    lists:any(
        fun(Stanza) ->
            Types = string:lexemes(maps:get("Types", Stanza, ""), " \t"),
            lists:member("deb-src", Types) andalso
                string:lowercase(maps:get("Enabled", Stanza, "yes")) =/= "no"
        end,
        deb822(B)
    );
has_deb_src(_, B) ->
    re:run(B, "^\\s*deb-src\\s", [multiline]) =/= nomatch.

-spec apt_source_files() -> [string()].
apt_source_files() ->
    ["/etc/apt/sources.list" | filelib:wildcard("/etc/apt/sources.list.d/*.{list,sources}")].

%% The URIs/Suites/Components/Signed-By of the Debian 'deb' entries, in
%% deb822 files and in one-line lists (as debootstrap writes them).
-spec deb_mirrors() -> [[{string(), string()}]].
deb_mirrors() ->
    Files = filelib:wildcard("/etc/apt/sources.list.d/*.sources"),
    Lists = ["/etc/apt/sources.list" | filelib:wildcard("/etc/apt/sources.list.d/*.list")],
    lists:usort(
        [S || F <- Lists, {ok, B} <- [file:read_file(F)], S <- one_line_debs(B)] ++
            deb822_mirrors(Files)
    ).

%% The 'deb' lines of a one-line sources list, as deb822 fields. Options in
%% brackets ([arch=amd64 signed-by=...]) are dropped.
-spec one_line_debs(binary()) -> [[{string(), string()}]].
one_line_debs(B) ->
    [
        [{"URIs", Uri}, {"Suites", Suite}, {"Components", lists:flatten(lists:join(" ", Comps))}]
     || Line <- string:split(binary_to_list(B), "\n", all),
        ["deb" | Rest] <- [string:lexemes(strip_options(Line), " \t")],
        [Uri, Suite | Comps] <- [Rest],
        Comps =/= []
    ].

-spec strip_options(string()) -> string().
strip_options(Line) ->
    case string:split(Line, "[") of
        [Before, After] ->
            case string:split(After, "]") of
                [_Opts, Rest] -> Before ++ " " ++ Rest;
                _ -> Line
            end;
        _ ->
            Line
    end.

-spec deb822_mirrors([string()]) -> [[{string(), string()}]].
deb822_mirrors(Files) ->
    lists:usort([
        [{K, maps:get(K, S)} || K <- ["URIs", "Suites", "Components", "Signed-By"],
                                maps:is_key(K, S)]
     || F <- Files,
        F =/= ?DEB_SRC_FILE,
        {ok, B} <- [file:read_file(F)],
        S <- deb822(B),
        lists:member("deb", string:lexemes(maps:get("Types", S, ""), " \t")),
        string:lowercase(maps:get("Enabled", S, "yes")) =/= "no",
        maps:is_key("URIs", S),
        maps:is_key("Suites", S)
    ]).

%% deb822 stanzas as maps of single-line fields (comments dropped,
%% continuation lines appended).
-spec deb822(binary()) -> [stanza()].
deb822(B) ->
    Lines = string:split(binary_to_list(B), "\n", all),
    {Stanzas, Last, _} = lists:foldl(fun deb822_line/2, {[], #{}, undefined}, Lines),
    lists:reverse([S || S <- [Last | Stanzas], map_size(S) > 0]).

-spec deb822_line(string(), {[stanza()], stanza(), string() | undefined}) ->
    {[stanza()], stanza(), string() | undefined}.
deb822_line(Line, {Acc, Cur, LastKey}) ->
    case Line of
        "#" ++ _ ->
            {Acc, Cur, LastKey};
        [C | _] when (C =:= $\s orelse C =:= $\t), LastKey =/= undefined ->
            case string:trim(Line) of
                "" -> {[Cur | Acc], #{}, undefined};
                "." -> {Acc, Cur, LastKey};
                More -> {Acc, Cur#{LastKey := maps:get(LastKey, Cur) ++ " " ++ More}, LastKey}
            end;
        _ ->
            case string:trim(Line) of
                "" ->
                    {[Cur | Acc], #{}, undefined};
                T ->
                    case string:split(T, ":") of
                        [K, V] -> {Acc, Cur#{string:trim(K) => string:trim(V)}, string:trim(K)};
                        _ -> {Acc, Cur, LastKey}
                    end
            end
    end.
