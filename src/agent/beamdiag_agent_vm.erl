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

-export([settings/0, counters/1, all_schedulers/1, parse_flags/1, msacc_extra/1]).

-export_type([settings/0, counters/0]).

-type settings() :: #{atom() => term()}.
-type counters() :: #{
    swt := [{pos_integer(), non_neg_integer(), non_neg_integer()}] | undefined,
    run_queues := [non_neg_integer()],
    reductions := non_neg_integer(),
    gcs := non_neg_integer() | undefined,
    gc_words := non_neg_integer() | undefined,
    context_switches := non_neg_integer(),
    process_count := non_neg_integer(),
    msacc => [map()]
}.

%% The flags read from the argument vector, with the emulator's documented
%% defaults; the longest names come first so that -sbwtdcpu is not read as
%% -sbwt.
-define(FLAGS, [
    {<<"sbwtdcpu">>, sbwtdcpu, <<"short">>},
    {<<"sbwtdio">>, sbwtdio, <<"short">>},
    {<<"sbwt">>, sbwt, <<"medium">>},
    {<<"swtdcpu">>, swtdcpu, <<"medium">>},
    {<<"swtdio">>, swtdio, <<"medium">>},
    {<<"swt">>, swt, <<"medium">>},
    {<<"scl">>, scl, <<"true">>},
    {<<"sub">>, sub, <<"false">>},
    {<<"sfwi">>, sfwi, <<"0">>},
    {<<"Mdai">>, mdai, <<"0">>},
    {<<"MMscs">>, mmscs, <<"0">>},
    {<<"JPperf">>, jpperf, <<"false">>}
]).

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
        eheap_alloc_instances => alloc_instances(eheap_alloc)
    },
    maps:merge(Base, Flags).

%% Whether `erl -emu_type lcnt' would find a lock-counting emulator beside
%% the running one (erlexec sets BINDIR to the emulator's folder): one
%% file check.
lcnt_emulator_installed() ->
    case os:getenv("BINDIR") of
        Dir when is_list(Dir), Dir =/= "" ->
            filelib:is_regular(filename:join(Dir, "beam.lcnt.smp"));
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
%% this with a deadline (see beamdiag_agent_probe).
-spec all_schedulers(#{msacc := boolean()}) ->
    #{swt := list() | undefined, gcs := non_neg_integer(), gc_words := non_neg_integer(),
      msacc => [map()]}.
all_schedulers(#{msacc := WantMsacc}) ->
    {GCs, Words, _} = erlang:statistics(garbage_collection),
    C = #{swt => swt(), gcs => GCs, gc_words => Words},
    case WantMsacc of
        true -> C#{msacc => msacc()};
        false -> C
    end.

%% @doc Microstate accounting counters per thread, or [] when off.
-spec msacc() -> [#{type := atom(), id := non_neg_integer(), counters := #{atom() => integer()}}].
msacc() ->
    case erlang:statistics(microstate_accounting) of
        L when is_list(L) -> L;
        _ -> []
    end.

%% @doc True when the counters carry the extra states of an emulator built
%% with --with-microstate-accounting=extra.
-spec msacc_extra([map()]) -> boolean().
msacc_extra([#{counters := C} | _]) -> maps:is_key(busy_wait, C);
msacc_extra(_) -> false.

%% @doc Extracts known flags from an argument vector ("-sbwt" "none" or
%% "-sbwtnone"; the last one wins; nothing from the "-- -root" that starts
%% the init and user arguments), with defaults for those not given.
-spec parse_flags([string() | binary()]) -> #{atom() => binary()}.
parse_flags(Args) ->
    Bins = [iolist_to_binary(A) || A <- Args],
    Defaults = maps:from_list([{K, D} || {_, K, D} <- ?FLAGS]),
    maps:merge(Defaults, scan(Bins, #{})).

%%%===================================================================
%%% Internal
%%%===================================================================

scan([], Acc) ->
    Acc;
%% Emulator flags come first; erlexec then writes "-- -root DIR" and the
%% init and user arguments, which may look like flags (-scl, -sub) and may
%% hold anything.
scan([<<"--">>, <<"-root">> | _], Acc) ->
    Acc;
scan([<<$-, Rest/binary>> | Tail], Acc) ->
    case match_flag(Rest, ?FLAGS) of
        {Key, <<>>} ->
            case Tail of
                [V | Tail2] when V =/= <<>> -> scan(Tail2, Acc#{Key => clean(V)});
                _ -> scan(Tail, Acc)
            end;
        {Key, Inline} ->
            scan(Tail, Acc#{Key => clean(Inline)});
        nomatch ->
            scan(Tail, Acc)
    end;
scan([_ | Tail], Acc) ->
    scan(Tail, Acc).

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

alloc_instances(A) ->
    try erlang:system_info({allocator, A}) of
        L when is_list(L) -> length([I || {instance, I, _} <- L]);
        _ -> 0
    catch
        error:badarg -> 0
    end.

unknown_as_null(unknown) -> null;
unknown_as_null(N) -> N.

%% The full OTP version (27.3.4.1) from the release's OTP_VERSION file, or
%% the major release when the file is missing or unreadable.
otp_version() ->
    Rel = erlang:system_info(otp_release),
    File = filename:join([code:root_dir(), "releases", Rel, "OTP_VERSION"]),
    case file:read_file(File) of
        {ok, <<B:64/binary, _/binary>>} -> version_text(B, Rel);
        {ok, B} -> version_text(B, Rel);
        {error, _} -> list_to_binary(Rel)
    end.

version_text(B, Rel) ->
    case re:run(B, "^[0-9]+(\\.[0-9]+)*", [{capture, first, binary}]) of
        {match, [V]} -> V;
        nomatch -> list_to_binary(Rel)
    end.

os_name() ->
    {Family, Name} = os:type(),
    iolist_to_binary([atom_to_binary(Family), "/", atom_to_binary(Name)]).
