%%% @doc `beamdiag diagnose NODE': sample a live node for a window and print
%%% what its CPU time went to.
-module(beamdiag_cli_diagnose).

-behaviour(beamdiag_cli).

-export([spec/0, run/2, output/3, progress/1, end_progress/1]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The command's arguments.
-spec spec() -> beamdiag_cli:spec().
spec() ->
    #{
        name => "diagnose",
        summary => "Sample a live node for a window; print findings and the time ledger.",
        exit_codes => [0, 1, 2, 3, 4],
        example => "beamdiag diagnose app@db1 --cookie-file /etc/app/cookie --duration 10",
        positional => [#{key => node, metavar => "NODE", required => false,
                         help => "the node, name@host (short or long names inferred), or the "
                                 "OS pid of a node on this host (host-side only); without it, "
                                 "the only Erlang VM on this host (several are listed)"}],
        options => beamdiag_cli_options:pick([
            cookie, cookie_file, duration, interval,
            {json, "print one JSON document (schema beamdiag.diagnosis/1)"}, out, save, html,
            #{key => perf, long => "--perf", type => boolean, default => false,
              help => "also record a perf profile over the window (run on the node's host; "
                      "see beamdiag flame)"},
            #{key => no_perf, long => "--no-perf", type => boolean, default => false,
              help => "never run perf: by default a scheduler thread the host sees held is "
                      "profiled for a second or two to name the native code holding it"},
            erlang,
            #{key => no_msacc, long => "--no-msacc", type => boolean, default => false,
              help => "do not turn on microstate accounting"},
            #{key => msacc_span, long => "--msacc-span",
              type => {float, 0.1, float(beamdiag_opts:max_seconds(window))},
              default => 2.0, metavar => "SECONDS",
              help => "keep microstate accounting on for the last SECONDS of the window only "
                      "(it slows every thread while on)"},
            slack,
            #{key => no_procs, long => "--no-procs", type => boolean, default => false,
              help => "do not walk the process table (no TOP PROCESSES, no process findings)"},
            #{key => no_locks, long => "--no-locks", type => boolean, default => false,
              help => "do not count locks even on the lock-counting emulator"},
            #{key => cluster, long => "--cluster", type => boolean, default => false,
              help => "diagnose NODE and every node connected to it at once (as beamdiag cluster)"},
            fail_on,
            #{key => host_only, long => "--host-only", type => boolean,
              help => "diagnose from this host alone (/proc, cgroups, perf), without asking "
                      "the node: a node without distribution, or whose cookie you lack"},
            #{key => os_pid, long => "--os-pid", type => {integer, 1, 1 bsl 31}, metavar => "PID",
              help => "the node's OS pid on this host (implies --host-only)"},
            #{key => proto_dist, long => "--proto-dist",
              type => {enum, [inet_tcp, inet6_tcp, inet_tls, inet6_tls]},
              help => "the node's distribution protocol (default: read from the node's command "
                      "line on this host, else inet_tcp)"},
            #{key => ssl_dist_optfile, long => "--ssl-dist-optfile", type => string,
              metavar => "FILE",
              help => "TLS options for the connection, as -ssl_dist_optfile (its client part; "
                       "default: the node's own, read on this host)"},
            #{key => dist_port, long => "--dist-port", type => {integer, 1, 65535},
              metavar => "PORT",
              help => "the node's distribution port, reached without epmd (default: epmd's, "
                      "else found on this host)"},
            #{key => answer_timeout, long => "--answer-timeout",
              type => {float, 0.1, float(beamdiag_opts:max_seconds(window))},
              metavar => "SECONDS",
              help => "a node on this host that has not let the agent load within SECONDS "
                      "is sampled with perf from the host, and diagnosed from the host alone "
                      "if it has not by the window's end (default: half the window, 2 to 5 s)"}
        ])
    }.

%% @doc Runs the command.
-spec run(beamdiag_cli:opts(), beamdiag_cli:io()) -> beamdiag_cli:result().
run(Opts = #{cluster := true}, IO) ->
    beamdiag_cli_cluster:run(Opts, IO);
run(Opts = #{os_pid := Pid}, IO) when not is_map_key(node, Opts) ->
    run(Opts#{node => integer_to_list(Pid)}, IO);
run(Opts, IO) when not is_map_key(node, Opts) ->
    only_node(Opts, IO);
run(#{perf := true, no_perf := true}, IO) ->
    beamdiag_cli:usage_error("diagnose: --perf and --no-perf together", IO);
run(Opts = #{node := Node}, IO) ->
    %% How to reach the node, decided first: a node this VM cannot reach
    %% as it is (TLS, IPv6, no epmd on OTP 25) is diagnosed by this escript
    %% started again with the flags it needs.
    case plan(Node, Opts) of
        {ok, Plan} ->
            case {beamdiag_attach_relaunch:missing(Plan), maps:find(relaunch, IO)} of
                {[_ | _], {ok, Relaunch}} -> relaunch(Plan, Relaunch, Opts, IO);
                _ -> diagnose(Opts#{plan => Plan}, IO)
            end;
        none ->
            diagnose(Opts, IO)
    end.

diagnose(Opts = #{node := Node, duration := D, interval := I}, IO = #{err := Err}) ->
    case maps:is_key(cookie, Opts) of
        true -> Err("beamdiag: warning: --cookie shows the cookie in the process list; "
                    "prefer --cookie-file or BEAMDIAG_COOKIE\n");
        false -> ok
    end,
    LibOpts = maps:merge(
        maps:with([cookie, cookie_file], Opts),
        #{duration => D, interval => I,
          msacc => not maps:get(no_msacc, Opts),
          msacc_span => maps:get(msacc_span, Opts),
          locks => not maps:get(no_locks, Opts),
          procs => not maps:get(no_procs, Opts),
          perf => maps:get(perf, Opts, false),
          erlang => maps:get(erlang, Opts, false),
          slack => maps:get(slack, Opts),
          host_only => maps:get(host_only, Opts, false),
          held_perf => not maps:get(no_perf, Opts, false),
          progress => progress(IO)}),
    LibOpts2 = maps:merge(maps:merge(LibOpts, started()),
                          maps:with([os_pid, answer_timeout, proto_dist, ssl_dist_optfile,
                                     dist_port, plan], Opts)),
    Result = beamdiag:diagnose(Node, LibOpts2),
    end_progress(IO),
    profile_error(Result, Err),
    case Result of
        {ok, Diagnosis} ->
            output(Diagnosis, Opts, IO);
        {error, {beamdiag, {partial, _, Diagnosis}} = Error} ->
            Code = beamdiag_cli:fail(Error, IO),
            _ = output(Diagnosis, Opts, IO),
            Code;
        {error, {beamdiag, {host_only, _, Diagnosis}} = Error} ->
            %% Not reached over distribution: why, then the host's report;
            %% the exit code says it was not reached.
            Code = beamdiag_cli:fail(Error, IO),
            _ = output(Diagnosis, Opts, IO),
            Code;
        {error, Error} ->
            beamdiag_cli:fail(Error, IO)
    end.

%% @doc Prints or writes a diagnosis as the options ask; returns the exit
%% code (1 when a finding reaches --fail-on).
-spec output(beamdiag_diagnosis:diagnosis(), beamdiag_cli:opts(), beamdiag_cli:io()) -> beamdiag_cli:result().
output(Diagnosis = #{findings := Findings}, Opts, IO = #{colour := Colour}) ->
    Text =
        case maps:get(json, Opts, false) of
            true -> beamdiag_format_json:diagnosis(Diagnosis);
            false -> beamdiag_format_text:diagnosis(Diagnosis, #{colour => Colour andalso
                                                                   not maps:is_key(out, Opts)})
        end,
    Written0 = case beamdiag_cli:emit(Text, Opts, IO) of
                   0 -> ok;
                   Code -> {error, Code}
               end,
    Written = lists:foldl(fun(Step, ok) -> Step(); (_, E) -> E end, Written0,
                          [fun() -> save(Diagnosis, Opts, IO) end,
                           fun() -> html(Diagnosis, Opts, IO) end]),
    case Written of
        ok -> beamdiag_cli:findings_code(Findings, Opts);
        {error, Failed} -> Failed
    end.

%% @doc A progress fun that draws a countdown on standard error, when it is
%% a terminal; otherwise it prints nothing.
-spec progress(beamdiag_cli:io()) -> fun((non_neg_integer(), pos_integer()) -> ok).
progress(#{err := Err, tty := true}) ->
    fun(Elapsed, Total) ->
        Left = max(0, (Total - Elapsed + 999) div 1000),
        Err(io_lib:format("\rbeamdiag: sampling, ~bs left ", [Left]))
    end;
progress(_IO) ->
    fun(_, _) -> ok end.

%% @doc Wipes the countdown progress/1 drew.
-spec end_progress(beamdiag_cli:io()) -> ok.
end_progress(#{err := Err, tty := true}) ->
    Err("\r                                  \r");
end_progress(_IO) ->
    ok.

%%%===================================================================
%%% Internal
%%%===================================================================

%% When the call started, in the escript that started this one again
%% with the flags the node needs (beamdiag_cli:main/1).
started() ->
    case {os:getenv("BEAMDIAG_RELAUNCHED"), os:getenv("BEAMDIAG_STARTED")} of
        {false, _} -> #{};
        {_, false} -> #{};
        {_, S} ->
            case string:to_integer(S) of
                {Ms, ""} -> #{started => Ms};
                _ -> #{}
            end
    end.

%% The plan of a node named (not an OS pid, not host-only).
plan(Node, Opts) ->
    case maps:get(host_only, Opts, false) orelse maps:is_key(os_pid, Opts) orelse
        element(1, beamdiag_host_locate:target(Node)) =:= os_pid of
        true -> none;
        false ->
            case beamdiag_attach_plan:plan(Node, maps:with([cookie, cookie_file, proto_dist,
                                                       ssl_dist_optfile, dist_port], Opts)) of
                {ok, Plan} -> {ok, Plan};
                {error, _} -> none
            end
    end.

%% This escript again, with the distribution flags the plan needs; its
%% exit code. The TLS options written for it are removed after.
relaunch(Plan, Relaunch, Opts, IO) ->
    case beamdiag_attach_relaunch:relaunch_flags(Plan) of
        {ok, Flags, Dir} ->
            try
                Relaunch(Flags)
            after
                _ = Dir =:= none orelse file:del_dir_r(Dir)
            end;
        {error, _} ->
            %% The flags cannot be made (TLS options unknown): the run says
            %% so, from the host.
            diagnose(Opts#{plan => Plan}, IO)
    end.

%% `beamdiag diagnose' without a node: the only Erlang VM of this host,
%% or the list of them to pick from.
only_node(Opts, IO = #{err := Err}) ->
    case beamdiag_host_vms:list(#{}) of
        [] ->
            beamdiag_cli:usage_error("diagnose: no Erlang VM runs on this host (give NODE, "
                                     "name@host, for a node elsewhere)", IO);
        [#{os_pid := Pid, name := none}] ->
            Err(io_lib:format("beamdiag: the only Erlang VM on this host is OS process ~b, "
                              "without distribution: diagnosing it from the host~n", [Pid])),
            run(Opts#{os_pid => Pid}, IO);
        [#{os_pid := Pid, name := Name}] ->
            Err(io_lib:format("beamdiag: diagnosing ~ts, the only Erlang VM on this host "
                              "(OS pid ~b)~n", [beamdiag_safe_text:safe(Name, 100), Pid])),
            run(Opts#{node => binary_to_list(Name)}, IO);
        Several ->
            beamdiag_cli:usage_error(candidates_text(Several), IO)
    end.

candidates_text(Cands) ->
    Names = [case N of none -> "(none)"; _ -> beamdiag_safe_text:safe(N, 100) end
             || #{name := N} <- Cands],
    W = integer_to_list(lists:max([4 | [length(N) || N <- Names]])),
    [io_lib:format("diagnose: ~b Erlang VMs run on this host; name one:~n",
                   [length(Cands)]),
     io_lib:format("  ~-" ++ W ++ "s ~8s ~4s  ~s~n", ["NAME", "OS PID", "OTP", "DISTRIBUTION"]),
     [io_lib:format("  ~-" ++ W ++ "ts ~8b ~4s  ~ts~n",
                    [Name, P,
                     case O of undefined -> "?"; _ -> integer_to_list(O) end,
                     beamdiag_safe_text:safe(D, 120)])
      || {Name, #{os_pid := P, otp := O, distribution := D}} <- lists:zip(Names, Cands)],
     "pick one: beamdiag diagnose NAME, or beamdiag diagnose --os-pid PID (from the host "
     "alone)"].

%% With --perf or --erlang, a profile that failed is said on standard error; the
%% diagnosis follows without it.
profile_error({ok, #{capture := #{extras := #{profile_error := Why}}}}, Err) ->
    Err(["beamdiag: no profile: ", Why, "\n"]);
profile_error({error, {beamdiag, {partial, _, #{capture := #{extras := #{profile_error := Why}}}}}},
              Err) ->
    Err(["beamdiag: no profile: ", Why, "\n"]);
profile_error(_, _) ->
    ok.

save(Diagnosis, #{save := File}, IO = #{err := Err}) ->
    case beamdiag_capture_file:save(File, Diagnosis) of
        ok -> Err(["beamdiag: capture saved to ", File, "\n"]), ok;
        {error, E} -> {error, beamdiag_cli:fail(E, IO)}
    end;
save(_, _, _) ->
    ok.

html(Diagnosis, Opts, IO) ->
    case beamdiag_cli:html(fun() -> beamdiag_format_html:diagnosis(Diagnosis) end, Opts, IO) of
        0 -> ok;
        Code -> {error, Code}
    end.
