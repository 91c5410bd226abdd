%%% @doc beamdiag's code for each window of OTP releases, and the escript's
%%% start on whichever release runs it.
%%%
%%% Code compiled by OTP release B loads on B and the two releases after
%%% it, and no further for sure: OTP 29 refuses code compiled by OTP 25,
%%% and OTP 25 refuses code compiled by OTP 26 and later. So a build keeps
%%% its modules compiled more than once, in sets:
%%%
%%% <ul>
%%% <li>the code path's beams (`ebin'), as rebar3 compiled them;</li>
%%% <li>beside `ebin', a folder `otpNN' for each other compiler release NN,
%%%     made by scripts/beam-sets.sh (a rebar3 hook after each compile)
%%%     from the same beams' abstract code with OTP NN's compiler, with a
%%%     manifest (`beamdiag.set') that names each module and the md5 of
%%%     the `ebin' beam it was compiled from. The escript carries them.</li>
%%% </ul>
%%%
%%% `start/0', the escript's first step (`beamdiag_boot'), takes the
%%% newest set that loads on the running release and loads every one of
%%% its modules at once, so that no module can fail to load halfway through
%%% a command; `objects/2' gives the loader the set for a target's release.
%%%
%%% This module and `beamdiag_boot' load from the code path before any set
%%% is chosen: they keep to code that every release from 25 to 29 loads
%%% (no binary matching, whose OTP 25 instructions OTP 29 refuses;
%%% beamdiag_beams_tests checks their instructions).
%%%
%%% ```
%%% 1> beamdiag_beams:releases().
%%% [25, 27]
%%% 2> beamdiag_beams:choose(29, [25, 27]).
%%% {loads, 27}
%%% '''
-module(beamdiag_beams).

-export([start/0, releases/0, objects/2, code_path/1, compiled_by/1, release_of_compiler/1,
         format_error/1]).
%% Called as Module:format_error/1 on an {error, {Module, Reason}} value.
-ignore_xref([{format_error, 1}]).
-ifdef(TEST).
-export([choose/2]).
-endif.

-export_type([release/0]).

%% An OTP major release, or `unknown' for code whose compiler no release
%% is known to ship.
-type release() :: pos_integer() | unknown.

%% The name of a set's manifest in its folder.
-define(MANIFEST, "beamdiag.set").
%% Releases after the compiling one that are known to load its code.
-define(WINDOW, 2).
%% The compiler's major.minor version each OTP release ships ('_' any
%% minor): 25 has 8.2, 26 has 8.3 and 8.4, 27 has 8.5 and 8.6, 28 has 9,
%% 29 has 10 (checked here: 8.2.3 on 25.2.3, 8.6.1 on 27.3.4.1, 10.0.7 on
%% 29.1.2; the others from OTP's release notes).
-define(COMPILERS, [{{8, 2}, 25}, {{8, 3}, 26}, {{8, 4}, 26}, {{8, 5}, 27}, {{8, 6}, 27},
                    {{9, '_'}, 28}, {{10, '_'}, 29}]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Loads the set of modules that fits the running release, all of
%% them, before anything runs. On a release past every set's window the
%% newest older set is tried (with the emulator's load errors kept quiet):
%% it may load. Nothing is loaded when this fails.
-spec start() -> ok | {error, {?MODULE, term()}}.
start() ->
    Release = running(),
    Sets = sets(),
    Releases = [R || #{release := R} <- Sets],
    case choose(Release, Releases) of
        {loads, R} ->
            load_set(set(R, Sets), Release, Releases);
        {beyond, R} ->
            quietly(fun() -> load_set(set(R, Sets), Release, Releases) end);
        none ->
            {error, {?MODULE, {no_set, Release, Releases}}}
    end.

%% @doc The releases whose compiler compiled a set of this build, the code
%% path's first.
-spec releases() -> [release()].
releases() ->
    [R || #{release := R} <- sets()].

%% @doc The set for a release (pure): the newest whose compiler's window
%% holds it (`loads'); else the newest older one (`beyond': it may load);
%% else none.
-spec choose(pos_integer(), [release()]) -> {loads | beyond, release()} | none.
choose(Release, Releases) ->
    Known = lists:reverse(lists:sort([R || R <- Releases, is_integer(R)])),
    case [R || R <- Known, R =< Release, Release =< R + ?WINDOW] of
        [R | _] ->
            {loads, R};
        [] ->
            case [R || R <- Known, R =< Release] of
                [R | _] -> {beyond, R};
                [] -> none
            end
    end.

%% @doc The object code of modules as compiled by one set, for a target
%% that runs a release that set loads on: `[{Module, Beam, File}]', read
%% from the set's folder (the escript's archive or `_build'). A set whose
%% manifest does not name every module, or names a module compiled from
%% other code than the code path's, is stale: an error, not a guess.
-spec objects(release(), [module()]) ->
    {ok, [{module(), binary(), file:filename()}]} | {error, {?MODULE, term()}}.
objects(Release, Mods) ->
    case [S || S = #{release := R} <- sets(), R =:= Release] of
        [#{kind := code_path} | _] ->
            code_path(Mods);
        [#{kind := built, dir := Dir, modules := Listed} | _] ->
            built_objects(Dir, Listed, Mods, []);
        [] ->
            {error, {?MODULE, {no_such_set, Release}}}
    end.

%% @doc The object code of modules as the code path holds them (the set
%% rebar3 compiled, whatever the running release loaded).
-spec code_path([module()]) ->
    {ok, [{module(), binary(), file:filename()}]} | {error, {?MODULE, term()}}.
code_path(Mods) ->
    code_path(Mods, []).

%% @doc The OTP release whose compiler compiled a loaded module (the set
%% this node runs, for one of beamdiag's own).
-spec compiled_by(module()) -> release().
compiled_by(Mod) ->
    case lists:keyfind(version, 1, Mod:module_info(compile)) of
        {version, V} -> release_of_compiler(V);
        false -> unknown
    end.

%% @doc The OTP release whose compiler has version `Vsn' ("8.2.3"): this
%% node's own release when its compiler is that version, else the release
%% known to ship it, else `unknown'.
-spec release_of_compiler(string()) -> release().
release_of_compiler(Vsn) ->
    case own_compiler() of
        Vsn ->
            running();
        _ ->
            Parts = [string:to_integer(P) || P <- lists:sublist(string:split(Vsn, ".", all), 2)],
            case Parts of
                [{Ma, []}, {Mi, []}] when is_integer(Ma), is_integer(Mi) -> compiler_release(Ma, Mi);
                _ -> unknown
            end
    end.

%% @doc Turns an error reason of this module into a sentence.
-spec format_error(term()) -> iolist().
format_error({no_set, Release, Releases}) ->
    io_lib:format("this beamdiag holds code compiled by ~ts, which OTP ~b cannot load; ~ts",
                  [releases_text(Releases), Release, build_hint(Release)]);
format_error({load, Release, Set, Failed}) ->
    io_lib:format("this beamdiag holds code compiled by OTP ~p, which OTP ~b cannot load (~ts "
                  "refused); ~ts", [Set, Release, modules_text(Failed), build_hint(Release)]);
format_error({stale_set, Dir, Mod}) ->
    io_lib:format("the code in ~ts was compiled from other code than this build's ~s "
                  "(rebuild: rebar3 compile)", [Dir, Mod]);
format_error({not_in_set, Dir, Mod}) ->
    io_lib:format("~s is not one of this build's modules, so ~ts does not hold it", [Mod, Dir]);
format_error({no_such_set, Release}) ->
    io_lib:format("this build holds no code compiled by OTP ~p", [Release]);
format_error({no_object_code, Mod}) ->
    io_lib:format("cannot find the object code of ~s", [Mod]).

%%%===================================================================
%%% Internal
%%%===================================================================

running() ->
    list_to_integer(erlang:system_info(otp_release)).

%% The code path's set (the folder this module came from) and the built
%% sets beside it.
sets() ->
    Ebin = filename:dirname(code:which(?MODULE)),
    Top = filename:dirname(Ebin),
    Own = #{release => code_path_release(), kind => code_path, dir => Ebin},
    Built = case erl_prim_loader:list_dir(Top) of
                {ok, Names} -> [S || "otp" ++ _ = N <- lists:sort(Names),
                                     S <- built_set(filename:join(Top, N))];
                error -> []
            end,
    [Own | [S || S = #{release := R} <- Built, R =/= maps:get(release, Own)]].

built_set(Dir) ->
    case erl_prim_loader:get_file(filename:join(Dir, ?MANIFEST)) of
        {ok, Bin, _} ->
            try binary_to_term(Bin) of
                #{release := R, modules := Listed} when is_integer(R), is_list(Listed) ->
                    [#{release => R, kind => built, dir => Dir, modules => Listed}];
                _ ->
                    []
            catch
                error:badarg -> []
            end;
        error ->
            []
    end.

code_path_release() ->
    compiled_by(?MODULE).

own_compiler() ->
    _ = application:load(compiler),
    case application:get_key(compiler, vsn) of
        {ok, V} -> V;
        undefined -> undefined
    end.

compiler_release(Ma, Mi) ->
    case [R || {{A, B}, R} <- ?COMPILERS, A =:= Ma, B =:= Mi orelse B =:= '_'] of
        [R | _] -> R;
        [] -> unknown
    end.

set(R, Sets) ->
    hd([S || S = #{release := R1} <- Sets, R1 =:= R]).

%% Every module of the set, read and loaded together, all or none, but
%% for those already loaded (this module and the boot module, from the
%% code path). A built set must hold every module of the code path: one
%% left out would load from there, mid-command.
load_set(#{kind := code_path, dir := Ebin}, Release, _Releases) ->
    load_modules(Ebin, beam_names(Ebin), Release, code_path_release());
load_set(#{kind := built, dir := Dir, modules := Listed, release := R}, Release, _Releases) ->
    Ebin = filename:dirname(code:which(?MODULE)),
    case [M || M <- beam_names(Ebin), not lists:keymember(M, 1, Listed)] of
        [M | _] -> {error, {?MODULE, {stale_set, Dir, M}}};
        [] -> load_modules(Dir, [M || {M, _} <- Listed], Release, R)
    end.

%% The modules of Dir not loaded yet, read and loaded at once; Set is the
%% release that compiled them, for the error.
load_modules(Dir, Mods, Release, Set) ->
    Items = [{M, filename:join(Dir, atom_to_list(M) ++ ".beam")}
             || M <- Mods, code:is_loaded(M) =:= false],
    case read_all(Items) of
        {ok, Loads} ->
            case code:atomic_load(Loads) of
                ok -> ok;
                {error, Failed} -> {error, {?MODULE, {load, Release, Set, Failed}}}
            end;
        {error, _} = E ->
            E
    end.

%% The beams of Items, each {Module, File}: from an escript's archive in
%% one pass over it when they are all there (read one by one through
%% erl_prim_loader, 154 beams took 225 ms there), else one by one.
read_all(Items) ->
    case archived([F || {_, F} <- Items]) of
        {ok, Bins} -> {ok, [{M, F, maps:get(F, Bins)} || {M, F} <- Items]};
        error -> read_all(Items, [])
    end.

archived([]) ->
    error;
archived(Files) ->
    try
        Script = filename:absname(escript:script_name()),
        Prefix = Script ++ "/",
        true = lists:all(fun(F) -> lists:prefix(Prefix, F) end, Files),
        {ok, Sections} = escript:extract(Script, []),
        {archive, Zip} = lists:keyfind(archive, 1, Sections),
        Wanted = maps:from_list([{lists:nthtail(length(Prefix), F), F} || F <- Files]),
        {ok, Entries} = zip:unzip(Zip, [memory, {file_filter, fun(E) -> is_map_key(element(2, E), Wanted) end}]),
        Bins = maps:from_list([{maps:get(Name, Wanted), Bin} || {Name, Bin} <- Entries]),
        true = map_size(Bins) =:= map_size(Wanted),
        {ok, Bins}
    catch
        _:_ -> error
    end.

read_all([], Acc) ->
    {ok, lists:reverse(Acc)};
read_all([{M, File} | Rest], Acc) ->
    case erl_prim_loader:get_file(File) of
        {ok, Bin, _} -> read_all(Rest, [{M, File, Bin} | Acc]);
        error -> {error, {?MODULE, {no_object_code, M}}}
    end.

%% The modules whose beams a folder holds.
beam_names(Dir) ->
    case erl_prim_loader:list_dir(Dir) of
        {ok, Names} ->
            lists:sort([list_to_atom(filename:basename(N, ".beam"))
                        || N <- Names, filename:extension(N) =:= ".beam"]);
        error ->
            []
    end.

%% Runs a load whose failure is expected and said in words: the emulator's
%% own error report for each refused function stays out of the output.
quietly(Fun) ->
    #{level := Level} = logger:get_primary_config(),
    ok = logger:set_primary_config(level, none),
    try
        Fun()
    after
        logger:set_primary_config(level, Level)
    end.

code_path([], Acc) ->
    {ok, lists:reverse(Acc)};
code_path([M | Ms], Acc) ->
    case code:get_object_code(M) of
        {M, Bin, File} -> code_path(Ms, [{M, Bin, File} | Acc]);
        error -> {error, {?MODULE, {no_object_code, M}}}
    end.

%% A built set's beams, each checked against the code path's beam it was
%% compiled from.
built_objects(_Dir, _Listed, [], Acc) ->
    {ok, lists:reverse(Acc)};
built_objects(Dir, Listed, [M | Ms], Acc) ->
    File = filename:join(Dir, atom_to_list(M) ++ ".beam"),
    case {lists:keyfind(M, 1, Listed), code:get_object_code(M)} of
        {{M, Source}, {M, Own, _}} ->
            case erlang:md5(Own) =:= Source of
                true ->
                    case erl_prim_loader:get_file(File) of
                        {ok, Bin, _} -> built_objects(Dir, Listed, Ms, [{M, Bin, File} | Acc]);
                        error -> {error, {?MODULE, {no_object_code, M}}}
                    end;
                false ->
                    {error, {?MODULE, {stale_set, Dir, M}}}
            end;
        {false, _} ->
            %% One of this build's modules left out is a stale set; a module
            %% from elsewhere (a test's) is in no set but the code path's.
            Ebin = filename:dirname(code:which(?MODULE)),
            case lists:member(M, beam_names(Ebin)) of
                true -> {error, {?MODULE, {stale_set, Dir, M}}};
                false -> {error, {?MODULE, {not_in_set, Dir, M}}}
            end;
        {_, error} ->
            {error, {?MODULE, {no_object_code, M}}}
    end.

releases_text(Releases) ->
    Known = [R || R <- Releases, is_integer(R)],
    case Known of
        [] -> "an OTP release not known here";
        _ -> ["OTP ", lists:join(" and ", [integer_to_list(R) || R <- lists:sort(Known)])]
    end.

build_hint(Release) ->
    io_lib:format("build beamdiag where the compiler of OTP ~b, or of a release at most two "
                  "older, is at hand: make build with the OTP 27 root of scripts/otp-root.sh "
                  "trixie covers OTP 25 to 29", [Release]).

modules_text(Failed) ->
    Mods = [M || {M, _} <- Failed],
    More = case length(Mods) > 3 of
               true -> io_lib:format(" and ~b more", [length(Mods) - 3]);
               false -> ""
           end,
    [lists:join(", ", [atom_to_list(M) || M <- lists:sublist(Mods, 3)]), More].
