%%% @doc The BEAM's own view: scheduler settings in effect and per-tick VM
%%% counters. Runs on the target node.
%%%
%%% Busy-wait and compaction flags have no `system_info' key; they are read
%%% from the emulator's argument vector (`system_info(emu_args)', where `+'
%%% is written as `-'). Only the flags beamdiag knows are extracted: the
%%% argument vector can hold secrets (`-setcookie') and never leaves this
%%% module.
%%%
%%% ```
%%% 1> maps:get(sbwt, beamdiag_agent_vm:settings()).
%%% <<"medium">>
%%% '''
-module(beamdiag_agent_vm).

-export([settings/0, counters/1, all_schedulers/1, parse_flags/1, msacc_extra/1, alloc_letters/0, alloc_flag_key/2,
         flags/0]).

-export_type([settings/0, counters/0, flag/0, msacc_thread/0]).

%% The settings in effect on a node, as settings/0 reads them. Every key is
%% optional: a report seen from the host alone (beamdiag_host_view) knows
%% only the scheduler counts, and a saved capture has what its agent read.
%% Beside the keys below: the flags of flags/0 marked `read' (`sbwt' =>
%% <<"none">>, binaries), and what the session adds (the placement of
%% beamdiag_agent_host:placement/1, the host's view of the node's flags).
-type settings() :: #{
    otp_release => binary(),
    otp_version => binary(),
    erts_version => binary(),
    emu_flavor => binary(),
    build_type => binary(),
    lock_counting => boolean(),
    lcnt_emulator_installed => boolean(),
    os_pid => binary(),
    os => binary(),
    schedulers => pos_integer(),
    schedulers_online => pos_integer(),
    dirty_cpu_schedulers => non_neg_integer(),
    dirty_cpu_schedulers_online => non_neg_integer(),
    dirty_io_schedulers => non_neg_integer(),
    logical_processors => pos_integer() | null,
    logical_processors_available => pos_integer() | null,
    logical_processors_online => pos_integer() | null,
    bind_type => binary(),
    thread_pool_size => non_neg_integer(),
    process_limit => pos_integer(),
    atom_count => non_neg_integer(),
    atom_limit => pos_integer(),
    eheap_alloc_instances => non_neg_integer(),
    elixir => boolean(),
    atom() => term()
}.
%% One thread's microstate accounting counters
%% (erlang:statistics(microstate_accounting)).
-type msacc_thread() :: #{type := atom(), id := non_neg_integer(),
                          counters := #{atom() => integer()}}.
-type flag() :: #{key := atom(), option := binary(), default := binary() | undefined,
                  meaning := binary(), since := pos_integer(), doc := erl | erts_alloc,
                  read := boolean(), advise := [binary()], note => binary()}.
-type counters() :: #{
    swt := [{pos_integer(), non_neg_integer(), non_neg_integer()}] | undefined,
    run_queues := [non_neg_integer()],
    reductions := non_neg_integer(),
    gcs := non_neg_integer() | undefined,
    gc_words := non_neg_integer() | undefined,
    context_switches := non_neg_integer(),
    process_count := non_neg_integer(),
    msacc => [msacc_thread()]
}.

%% Only the flags in the table marked `read' are taken from the argument
%% vector (the longest names first, so that -sbwtdcpu is not read as -sbwt).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The settings in effect on this node.
-spec settings() -> settings().
settings() ->
    S = erlang:system_info(schedulers),
    Flags = parse_flags(emu_args()),
    Base = #{
        otp_release => list_to_binary(erlang:system_info(otp_release)),
        otp_version => otp_version(),
        erts_version => list_to_binary(erlang:system_info(version)),
        emu_flavor => atom_to_binary(erlang:system_info(emu_flavor)),
        build_type => atom_to_binary(erlang:system_info(build_type)),
        lock_counting => erlang:system_info(lock_counting),
        lcnt_emulator_installed => lcnt_emulator_installed(),
        os_pid => list_to_binary(os:getpid()),
        os => os_name(),
        schedulers => S,
        schedulers_online => erlang:system_info(schedulers_online),
        dirty_cpu_schedulers => erlang:system_info(dirty_cpu_schedulers),
        dirty_cpu_schedulers_online => erlang:system_info(dirty_cpu_schedulers_online),
        dirty_io_schedulers => erlang:system_info(dirty_io_schedulers),
        logical_processors => unknown_as_null(erlang:system_info(logical_processors)),
        logical_processors_available =>
            unknown_as_null(erlang:system_info(logical_processors_available)),
        logical_processors_online => unknown_as_null(erlang:system_info(logical_processors_online)),
        bind_type => atom_to_binary(erlang:system_info(scheduler_bind_type)),
        thread_pool_size => erlang:system_info(thread_pool_size),
        process_limit => erlang:system_info(process_limit),
        atom_count => erlang:system_info(atom_count),
        atom_limit => erlang:system_info(atom_limit),
        %% Elixir's application runs here (it registers elixir_config):
        %% the report then says fixes in Elixir's terms.
        elixir => erlang:whereis(elixir_config) =/= undefined
    },
    maps:merge(maps:merge(Base, alloc_instances(eheap_alloc)), Flags).

%% Whether `erl -emu_type lcnt' would find a lock-counting emulator beside
%% the running one (erlexec sets BINDIR to the emulator's folder): one
%% file check, with prim_file (the file module asks the node's file
%% server, a process that may be busy or queued behind a held scheduler).
lcnt_emulator_installed() ->
    case os:getenv("BINDIR") of
        Dir when is_list(Dir), Dir =/= "" ->
            case prim_file:read_file_info(filename:join(Dir, "beam.lcnt.smp")) of
                {ok, Info} -> element(3, Info) =:= regular;  % #file_info.type
                {error, _} -> false
            end;
        _ ->
            false
    end.

%% @doc VM counters for one tick. `swt' is `undefined' unless
%% scheduler_wall_time is on; `msacc' is present when microstate accounting
%% is on. With `swt => false' neither is read (the caller reads them with
%% `all_schedulers/1', under a deadline).
-spec counters(#{msacc := boolean(), swt => boolean()}) -> counters().
counters(Opts = #{msacc := WantMsacc}) ->
    {Reds, _} = erlang:statistics(reductions),
    {CS, _} = erlang:statistics(context_switches),
    C = #{
        run_queues => erlang:statistics(run_queue_lengths_all),
        reductions => Reds,
        context_switches => CS,
        process_count => erlang:system_info(process_count)
    },
    case maps:get(swt, Opts, true) of
        true -> maps:merge(C, all_schedulers(#{msacc => WantMsacc}));
        false -> C#{swt => undefined, gcs => undefined, gc_words => undefined}
    end.

%% @doc The counters every scheduler must answer for: scheduler wall time,
%% garbage collection (OTP sums it from a request to every scheduler) and,
%% when wanted, microstate accounting. A scheduler held by a NIF
%% answers only when the NIF returns, so callers that must not stall run
%% this with a deadline (see beamdiag_agent_bounded_call).
-spec all_schedulers(#{msacc := boolean()}) ->
    #{swt := list() | undefined, gcs := non_neg_integer(), gc_words := non_neg_integer(),
      msacc => [msacc_thread()]}.
all_schedulers(#{msacc := WantMsacc}) ->
    {GCs, Words, _} = erlang:statistics(garbage_collection),
    C = #{swt => swt(), gcs => GCs, gc_words => Words},
    case WantMsacc of
        true -> C#{msacc => msacc()};
        false -> C
    end.

%% @doc Microstate accounting counters per thread, or [] when off.
-spec msacc() -> [msacc_thread()].
msacc() ->
    case erlang:statistics(microstate_accounting) of
        L when is_list(L) -> L;
        _ -> []
    end.

%% @doc True when the counters carry the extra states of an emulator built
%% with --with-microstate-accounting=extra.
-spec msacc_extra([msacc_thread()]) -> boolean().
msacc_extra([#{counters := C} | _]) -> maps:is_key(busy_wait, C);
msacc_extra(_) -> false.

%% @doc Extracts known flags from an argument vector ("-sbwt" "none" or
%% "-sbwtnone"; the last one wins; nothing from the "-- -root" that starts
%% the init and user arguments), with defaults for those not given.
-spec parse_flags([string() | binary()]) -> #{atom() => binary()}.
parse_flags(Args) ->
    Bins = [iolist_to_binary(A) || A <- Args],
    Read = read_flags(),
    %% A flag whose default depends on the machine (undefined) is in the
    %% map only when the node sets it.
    Defaults = maps:from_list([{K, D} || {_, K, D} <- Read, is_binary(D)]),
    maps:merge(Defaults, scan(Bins, Read, #{})).

%% @doc Every emulator flag beamdiag reads or advises, with the emulator's
%% documented default: the one table that the agent (`parse_flags/1'), the
%% rules, the fixes and the reports read (on the host through
%% `beamdiag_flags'). It lives here because the agent, which runs on the
%% target, may call nothing outside the agent's modules.
%%
%% `option' is the flag as written after `+'; `default' the value erl(1)
%% (or erts_alloc(3)) documents, `undefined' where it depends on the
%% machine or the flag is not read; `since' the first OTP release that
%% has it; `read' whether the agent reads it from the argument vector
%% (the others come from `system_info' or are only advised); `advise' the
%% values a fix may advise. The defaults were checked against erl(1) of
%% OTP 25, 27 and 29: they are the same in the three (and so in 26 and
%% 28); `note' says where a release differs.
-spec flags() -> [flag()].
flags() ->
    [
        #{key => sbwt, option => <<"sbwt">>, default => <<"medium">>, since => 17, doc => erl,
          read => true, advise => [<<"none">>, <<"very_short">>],
          meaning => <<"scheduler busy-wait threshold">>},
        #{key => sbwtdcpu, option => <<"sbwtdcpu">>, default => <<"short">>, since => 21,
          doc => erl, read => true, advise => [<<"none">>],
          meaning => <<"dirty CPU scheduler busy-wait threshold">>},
        #{key => sbwtdio, option => <<"sbwtdio">>, default => <<"short">>, since => 21,
          doc => erl, read => true, advise => [<<"none">>],
          meaning => <<"dirty IO scheduler busy-wait threshold">>},
        #{key => swt, option => <<"swt">>, default => <<"medium">>, since => 17, doc => erl,
          read => true, advise => [<<"high">>],
          meaning => <<"wake-up threshold: high wakes sleeping schedulers later">>},
        #{key => swtdcpu, option => <<"swtdcpu">>, default => <<"medium">>, since => 21,
          doc => erl, read => true, advise => [],
          meaning => <<"dirty CPU scheduler wake-up threshold">>},
        #{key => swtdio, option => <<"swtdio">>, default => <<"medium">>, since => 21,
          doc => erl, read => true, advise => [],
          meaning => <<"dirty IO scheduler wake-up threshold">>},
        #{key => scl, option => <<"scl">>, default => <<"true">>, since => 17, doc => erl,
          read => true, advise => [<<"false">>],
          meaning => <<"scheduler load compaction">>},
        #{key => sub, option => <<"sub">>, default => <<"false">>, since => 17, doc => erl,
          read => true, advise => [<<"true">>],
          meaning => <<"scheduler utilization balancing">>},
        #{key => sfwi, option => <<"sfwi">>, default => <<"0">>, since => 17, doc => erl,
          read => true, advise => [],
          meaning => <<"scheduler forced wake-up interval in ms (0: off)">>},
        #{key => sbt, option => <<"sbt">>, default => <<"u">>, since => 17, doc => erl,
          read => false, advise => [<<"u">>, <<"db">>],
          meaning => <<"scheduler bind type: u is unbound, db the default binding">>,
          note => <<"read from system_info(scheduler_bind_type) as bind_type">>},
        #{key => 'S', option => <<"S">>, default => undefined, since => 17, doc => erl,
          read => false, advise => [<<"N:N">>],
          meaning => <<"schedulers and schedulers online">>,
          note => <<"default: the logical processors configured and available, limited by "
                    "a CPU quota; read from system_info">>},
        #{key => t, option => <<"t">>, default => <<"1048576">>, since => 17, doc => erl,
          read => false, advise => [<<"size">>],
          meaning => <<"the atom table's size: the most atoms the node can hold">>,
          note => <<"read from system_info(atom_limit)">>},
        #{key => 'P', option => <<"P">>, default => <<"1048576">>, since => 17, doc => erl,
          read => false, advise => [<<"Number">>],
          meaning => <<"the most processes the node can hold">>,
          note => <<"read from system_info(process_limit)">>},
        #{key => 'Q', option => <<"Q">>, default => <<"65536">>, since => 17, doc => erl,
          read => false, advise => [<<"Number">>],
          meaning => <<"the most ports the node can hold">>,
          note => <<"read from system_info(port_limit)">>},
        #{key => zdbbl, option => <<"zdbbl">>, default => <<"1024">>, since => 17, doc => erl,
          read => false, advise => [<<"size">>],
          meaning => <<"distribution buffer busy limit, in KB">>,
          note => <<"read from system_info(dist_buf_busy_limit)">>},
        #{key => jpperf, option => <<"JPperf">>, default => <<"false">>, since => 24, doc => erl,
          read => true, advise => [],
          meaning => <<"perf support of the JIT">>,
          note => <<"OTP 25 takes true|false; OTP 27 and 29 also dump|map|fp|no_fp">>},
        #{key => mdai, option => <<"Mdai">>, default => <<"0">>, since => 24,
          doc => erts_alloc, read => true, advise => [<<"max">>],
          meaning => <<"allocator instances for dirty schedulers">>,
          note => <<"came in OTP 24.2">>},
        #{key => mmscs, option => <<"MMscs">>, default => <<"0">>, since => 17,
          doc => erts_alloc, read => true, advise => [<<"size in MB">>],
          meaning => <<"pre-reserved super carrier">>},
        #{key => mmmcs, option => <<"MMmcs">>, default => undefined, since => 17,
          doc => erts_alloc, read => false, advise => [<<"count">>],
          meaning => <<"carriers kept in the segment cache">>},
        #{key => mblmbcs, option => <<"MBlmbcs">>, default => undefined, since => 17,
          doc => erts_alloc, read => true, advise => [<<"size in KB">>],
          meaning => <<"largest multiblock carrier of the binary allocator">>}
    ] ++ alloc_flags().

%% Per allocator type (its letter in +M<S>): the abandon carrier free
%% utilization limit (OTP 26 and later), which lets the OS reuse the free
%% pages of carriers below it, and the largest multiblock carrier; the
%% binary allocator's lmbcs is the row above.
alloc_flags() ->
    lists:append(
      [[#{key => alloc_flag_key(L, "acful"),
          option => <<"M", L, "acful">>, default => <<"0">>, since => 26,
          doc => erts_alloc, read => true, advise => [<<"de">>],
          meaning => iolist_to_binary(["free pages of ", T, "'s carriers given back to the OS"])}
        | [#{key => alloc_flag_key(L, "lmbcs"),
             option => <<"M", L, "lmbcs">>, default => undefined, since => 17,
             doc => erts_alloc, read => true, advise => [<<"size in KB">>],
             meaning => iolist_to_binary(["largest multiblock carrier of ", T])} || L =/= $B]]
       || {L, T} <- alloc_letters()]).

%% @doc The settings key of an allocator letter's flag (`mbacful' for
%% +MBacful): a few atoms, the same each time.
-spec alloc_flag_key(char(), string()) -> atom().
alloc_flag_key(L, Suffix) ->
    list_to_atom("m" ++ string:lowercase([L]) ++ Suffix).

%% @doc The letter of each allocator type a fix may tune, as +M<S> names it.
-spec alloc_letters() -> [{char(), binary()}].
alloc_letters() ->
    [{$B, <<"binary_alloc">>}, {$D, <<"std_alloc">>}, {$E, <<"ets_alloc">>},
     {$F, <<"fix_alloc">>}, {$H, <<"eheap_alloc">>}, {$R, <<"driver_alloc">>},
     {$S, <<"sl_alloc">>}].

%%%===================================================================
%%% Internal
%%%===================================================================

%% The flags read from the argument vector, longest name first.
read_flags() ->
    Read = [{O, K, D} || #{option := O, key := K, default := D, read := true} <- flags()],
    lists:sort(fun({A, _, _}, {B, _, _}) -> byte_size(A) >= byte_size(B) end, Read).

scan([], _Flags, Acc) ->
    Acc;
%% Emulator flags come first; erlexec then writes "-- -root DIR" and the
%% init and user arguments, which may look like flags (-scl, -sub) and may
%% hold anything.
scan([<<"--">>, <<"-root">> | _], _Flags, Acc) ->
    Acc;
scan([<<$-, Rest/binary>> | Tail], Flags, Acc) ->
    case match_flag(Rest, Flags) of
        {Key, <<>>} ->
            case Tail of
                [V | Tail2] when V =/= <<>> -> scan(Tail2, Flags, Acc#{Key => clean(V)});
                _ -> scan(Tail, Flags, Acc)
            end;
        {Key, Inline} ->
            scan(Tail, Flags, Acc#{Key => clean(Inline)});
        nomatch ->
            scan(Tail, Flags, Acc)
    end;
scan([_ | Tail], Flags, Acc) ->
    scan(Tail, Flags, Acc).

match_flag(_, []) ->
    nomatch;
match_flag(Arg, [{Name, Key, _} | More]) ->
    N = byte_size(Name),
    case Arg of
        <<Name:N/binary, Rest/binary>> -> {Key, Rest};
        _ -> match_flag(Arg, More)
    end.

%% Flag values are short words or numbers; keep them printable and short.
clean(V) ->
    binary:part(V, 0, min(byte_size(V), 32)).

emu_args() ->
    try erlang:system_info(emu_args) of
        L when is_list(L) -> L;
        _ -> []
    catch
        error:badarg -> []
    end.

swt() ->
    case erlang:statistics(scheduler_wall_time_all) of
        undefined -> undefined;
        L -> lists:keysort(1, L)
    end.

%% An allocator's instance count, as `eheap_alloc_instances'. The
%% `{allocator, A}' answer waits for every scheduler (799 ms behind one
%% held 800 ms at a time, OTP 25): asked in a process of its own for
%% beamdiag_agent_bounded_call:once/1's wait at most, and left out when it is late.
alloc_instances(A) ->
    Read = fun() ->
                   try erlang:system_info({allocator, A}) of
                       L when is_list(L) -> length([I || {instance, I, _} <- L]);
                       _ -> 0
                   catch
                       error:badarg -> 0
                   end
           end,
    case beamdiag_agent_bounded_call:once(Read) of
        {ok, N} -> #{eheap_alloc_instances => N};
        _ -> #{}
    end.

unknown_as_null(unknown) -> null;
unknown_as_null(N) -> N.

%% The full OTP version (27.3.4.1) from the release's OTP_VERSION file, or
%% the major release when the file is missing or unreadable.
otp_version() ->
    Rel = erlang:system_info(otp_release),
    File = filename:join([root_dir(), "releases", Rel, "OTP_VERSION"]),
    case prim_file:read_file(File) of
        {ok, <<B:64/binary, _/binary>>} -> version_text(B, Rel);
        {ok, B} -> version_text(B, Rel);
        {error, _} -> list_to_binary(Rel)
    end.

%% The OTP installation's root folder. ROOTDIR is set by erl and by
%% release start scripts; the code server (a process, like the file
%% server, that may be busy or queued behind a held scheduler) is asked
%% only when it is not.
root_dir() ->
    case os:getenv("ROOTDIR") of
        R when is_list(R), R =/= "" -> R;
        _ -> code:root_dir()
    end.

version_text(B, Rel) ->
    case re:run(B, "^[0-9]+(\\.[0-9]+)*", [{capture, first, binary}]) of
        {match, [V]} -> V;
        nomatch -> list_to_binary(Rel)
    end.

os_name() ->
    {Family, Name} = os:type(),
    iolist_to_binary([atom_to_binary(Family), "/", atom_to_binary(Name)]).
