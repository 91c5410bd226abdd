%%% @doc Findings from the long schedules seen over the window (pure): the
%%% report `beamdiag_agent_sysmon' returns, set beside the ledger.
%%%
%%% `long_schedule': a process held its scheduler in the same NIF or BIF
%%% at least `count_min' times at the watcher's `threshold_ms' (50 ms) or
%%% more. Long schedules in Erlang code are left out: Erlang code yields
%%% every few thousand reductions, so a long one means the OS took the
%%% scheduler's thread away (cpu_starvation and cpu_throttling say so).
%%% When such a finding explains uneven scheduler busy time, the
%%% `scheduler_imbalance' finding and its flag advice are dropped
%%% (`suppress/1'): no balance flag helps a process that does not yield.
%%%
%%% ```
%%% 1> [Id || #{id := Id} <- beamdiag_sched_rules:findings(Report, Ledger)].
%%% [long_schedule]
%%% '''
-module(beamdiag_sched_rules).

-export([findings/2, suppress/1, note/1]).
%% Called by the tests only.
-ifdef(TEST).
-export([thresholds/0]).
-endif.

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The long-schedule findings for a window's report, set against the
%% ledger (with the capture's `settings' added by the caller).
%% (Ledger: a beamdiag_ledger:ledger() with the capture's settings added.)
-spec findings(beamdiag_agent_sysmon:report(),
               #{settings := beamdiag_agent_vm:settings(), window_s := float(), atom() => term()}) ->
    [beamdiag_finding:finding()].
findings(#{state := State, processes := Ps} = R, Ledger)
  when State =:= watching; State =:= taken ->
    T = thresholds(),
    %% The watcher's own span: a capture cut short has a shorter ledger.
    Window = max(1.0e-3, max(maps:get(window_s, Ledger, 0.0), maps:get(span_ms, R, 0) / 1000)),
    Online = maps:get(schedulers_online, maps:get(settings, Ledger, #{}), undefined),
    %% Late answers (the sampler's evidence) also come from scheduler
    %% threads the OS does not run: not read as held when they waited for
    %% a CPU that long.
    Starved = runq_share(Ledger) >= map_get(runq_max, T),
    Sampled = maps:get(source, R, events) =:= sampler,
    [finding(P, Share, Window, R, Ledger, Online, T)
     || not (Sampled andalso Starved),
        P = #{native := N, count := C} <- Ps,
        %% A process answers late also while its heap is collected (on a
        %% dirty scheduler when large), and hibernating is a collection.
        not (Sampled andalso maps:get(in, P, undefined) =:= <<"erlang:hibernate/3">>),
        C >= map_get(count_min, T),
        Share = {Of, _} <- [share(P, R, Window, T)],
        (N =:= nif orelse N =:= bif orelse
         (N =:= erlang andalso Of >= map_get(erlang_share_min, T) andalso not Starved))];
findings(_, _) ->
    [].

%% @doc Drops `scheduler_imbalance' when a long schedule explains it.
-spec suppress([beamdiag_finding:finding()]) -> [beamdiag_finding:finding()].
suppress(Findings) ->
    case lists:any(fun(#{id := Id}) -> Id =:= long_schedule end, Findings) of
        true -> [F || F = #{id := Id} <- Findings, Id =/= scheduler_imbalance];
        false -> Findings
    end.

%% @doc The thresholds the rule uses.
-spec thresholds() -> #{atom() => number()}.
thresholds() ->
    #{
        %% Long schedules in the same native function, in the window.
        count_min => 3,
        %% In and out of the same Erlang function (the runtime records the
        %% Erlang caller of a NIF): only when one process held a scheduler
        %% this share of the window. The OS taking a thread away (a starved
        %% or throttled node) spreads short long schedules over many
        %% processes instead.
        erlang_share_min => 0.25,
        %% ...and only while the scheduler threads got their CPU: when they
        %% waited this share of the window runnable (a CPU quota, a starved
        %% host), the OS stretched every slice, and a long schedule in and
        %% out of an Erlang function says nothing of native code.
        runq_max => 0.25,
        %% Share of the window one scheduler was held: critical from here.
        held_share_crit => 0.5,
        %% A sampled process's share is that of the time it was watched
        %% once it has this many samples (see share/4).
        sampled_min => 10
    }.

%% @doc What a report says when the system monitor could not be used, for
%% the capture's notes; `none' otherwise.
-spec note(beamdiag_agent_sysmon:report()) -> binary() | none.
note(#{state := taken, source := sampler} = R) ->
    S = maps:get(sampler, R, #{}),
    iolist_to_binary(
      ["long schedules not watched by the runtime: the node's system monitor is taken by ",
       taken_by(R), " and was left alone (one slot per node); sampled instead: ",
       integer_to_list(maps:get(samples, S, 0)), " samples of ",
       integer_to_list(maps:get(candidates, S, 0)), " candidate processes after ",
       integer_to_list(maps:get(signs, S, 0)), " signs of a held scheduler and ",
       integer_to_list(length(maps:get(walks, S, []))), " walks; a hold is seen only when "
       "it lasts past a sample, and its length is estimated"]);
note(#{state := taken} = R) ->
    iolist_to_binary(
      ["long schedules not watched: the node's system monitor is taken by ", taken_by(R),
       " and was left alone (one slot per node); a NIF or BIF holding a scheduler shows "
       "only as uneven scheduler busy time and in the process table's current functions"]);
note(_) ->
    none.

%%%===================================================================
%%% Internal
%%%===================================================================

taken_by(R) ->
    case maps:get(taken_by, R, #{}) of
        By = #{name := N} when is_binary(N) -> [N, " ", maps:get(pid, By, <<>>)];
        #{pid := P} when is_binary(P) -> P;
        _ -> "another process"
    end.

%% The share of time the process held its scheduler, and of what: from
%% the runtime's events, of the window; from the sampler, of the time the
%% process was watched (its held samples among its samples, once it has
%% `sampled_min' of them), when that is more. A process the walks found
%% late in the window was watched only for the window's end, and its
%% estimated total over the whole window says how long it was watched,
%% not how much it held.
share(P = #{total_ms := Tot}, R, Window, T) ->
    OfWindow = min(1.0, Tot / 1000 / Window),
    case {R, P} of
        {#{source := sampler}, #{count := C, samples := S}} when S >= map_get(sampled_min, T) ->
            case C / S of
                OfWatched when OfWatched > OfWindow -> {OfWatched, watched};
                _ -> {OfWindow, window}
            end;
        _ ->
            {OfWindow, window}
    end.

finding(P = #{count := C, longest_ms := L, total_ms := Tot, native := N}, {Share, Basis}, Window,
        R, Ledger, Online, T) ->
    Sev = case Share >= map_get(held_share_crit, T) of
              true -> critical;
              false -> warning
          end,
    Fun = maps:get(in, P, null),
    Where = case N of
                nif -> ["the NIF ", text(Fun)];
                bif -> ["the BIF ", text(Fun)];
                erlang -> ["native code called from ", text(Fun)]
            end,
    Evidence = [seen(P, R, Where, Window, {Share, Basis})] ++ imbalance(Ledger, Online) ++ [
        case N of
            nif -> fmt("the NIF is a plain one (it runs on a normal scheduler and does not "
                       "yield): ~ts", [text(Fun)]);
            bif -> fmt("the BIF ~ts does not trap out for the work it is given", [text(Fun)]);
            erlang ->
                fmt("Erlang code yields every few thousand reductions, so one process held "
                    "in and out of ~ts for ~s of the ~s is in a NIF or BIF called from "
                    "there (the runtime records the calling Erlang function); NIF libraries "
                    "loaded from outside OTP: ~ts",
                    [text(Fun), beamdiag_units:pct(Share), basis_text(Basis),
                     case maps:get(nif_modules, R, []) of
                         [] -> "none";
                         Ms -> lists:join("; ", Ms)
                     end])
        end
    ],
    beamdiag_finding:new(long_schedule, Sev, Evidence, #{
        pid => maps:get(pid, P),
        name => name_or_pid(P),
        function => text(Fun),
        native => atom_to_binary(N, utf8),
        count => C,
        longest_ms => L,
        total_ms => Tot,
        held_share => round(Share * 10000) / 10000,
        held_share_of => atom_to_binary(Basis, utf8),
        source => case R of
                      #{source := sampler} -> <<"sampler">>;
                      _ -> <<"system_monitor">>
                  end
    }).

%% What was seen: the runtime's events, or the sampler's slow answers.
seen(P = #{count := C, longest_ms := L, total_ms := Tot}, R = #{source := sampler}, Where,
     Window, {Share, Basis}) ->
    S = maps:get(sampler, R, #{}),
    fmt("~ts was seen holding its scheduler in ~ts in ~b of ~b samples (~b in a row) over "
        "~.1f s of watching: asked for its current function from another scheduler, it "
        "answered only after ~b ms or more each time (up to ~b ms), where a process that "
        "yields answers within a millisecond; about ~b ms held in all over the ~.1f s "
        "window; held ~s of the ~s~ts. Sampled about ~b times a second because the system "
        "monitor was taken: the longest hold and the total are estimates from the samples' "
        "spacing, not the runtime's measure",
        [who(P), Where, C, maps:get(samples, P, C), maps:get(consecutive, P, C),
         maps:get(watched_ms, P, 0) / 1000, maps:get(held_ms, S, 10), L, Tot, Window,
         beamdiag_units:pct(Share), basis_text(Basis),
         case maps:get(collected, P, 0) of
             0 -> "";
             K -> fmt(" (~b more late answers followed a garbage collection and are not "
                      "counted)", [K])
         end,
         maps:get(rate_hz, S, 10)]);
seen(#{count := C, longest_ms := L, total_ms := Tot} = P, R, Where, Window, {Share, _}) ->
    fmt("~ts held its scheduler ~b times for ~b ms or more in ~ts: longest ~b ms, "
        "~b ms in all over ~.1f s (~s of one scheduler's wall time)",
        [who(P), C, maps:get(threshold_ms, R, 50), Where, L, Tot, Window, beamdiag_units:pct(Share)]).

basis_text(watched) -> "time it was watched";
basis_text(window) -> "window".

%% The scheduler threads' share of the window spent runnable without a CPU.
runq_share(#{by_type := #{scheduler := #{runq := Runq, wall := Wall}}}) when Wall > 0 ->
    Runq / Wall;
runq_share(_) ->
    0.0.

%% The schedulers' spread of busy time, which the held scheduler explains.
imbalance(#{threads := Rows}, Online) when is_integer(Online) ->
    Shares = [B / W || #{type := scheduler, index := I, busy := B, wall := W} <- Rows,
                       I =< Online, is_number(B), W > 0],
    case Shares of
        [_, _ | _] ->
            [fmt("normal schedulers busy from ~s to ~s: the held scheduler, not the "
                 "balancing, makes the spread; no scheduler flag (+scl, +sub, +sbt) helps",
                 [beamdiag_units:pct(lists:min(Shares)), beamdiag_units:pct(lists:max(Shares))])];
        _ ->
            []
    end;
imbalance(_, _) ->
    [].

%% Named as the process findings name a process (its spawner too, for one
%% spawned from a fun with nothing else to name it).
who(P = #{pid := Pid}) when is_binary(Pid) ->
    beamdiag_proc_rules:who(P);
who(P) ->
    beamdiag_proc_rules:who(P#{pid => <<"?">>}).

name_or_pid(#{name := N}) when is_binary(N) -> N;
name_or_pid(#{pid := P}) -> P.

text(B) when is_binary(B) -> B;
text(_) -> <<"?">>.

fmt(F, A) -> io_lib:format(F, A).
