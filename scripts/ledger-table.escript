#!/usr/bin/env escript
%% Prints the time ledger of each recorded lab capture as a Markdown table
%% (scheduler threads; shares of wall time), with the findings beamdiag
%% makes of it. Run from the project root after `rebar3 compile`:
%%   scripts/ledger-table.escript [test/fixtures/captures/*.capture]
main(Args) ->
    true = code:add_patha("_build/default/lib/beamdiag/ebin"),
    Files = case Args of
                [] -> lists:sort(filelib:wildcard("test/fixtures/captures/*.capture"));
                _ -> Args
            end,
    io:format("| scenario | busy | on-CPU | user | sys | runq | spin | blocked | node sys/CPU | dirty-CPU GC | throttled | findings (warning and up) |~n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|~n"),
    [row(F) || F <- Files],
    ok.

row(File) ->
    {ok, [C]} = file:consult(File),
    #{ledger := L, findings := F} = beamdiag:analyse(C),
    #{by_type := #{scheduler := S}, window_s := W} = L,
    P = fun(K) -> beamdiag_format_text:pct(beamdiag_ledger:share(K, S, maps:get(wall, S))) end,
    Gc = case maps:get(msacc, L) of
             #{by_type := #{dirty_cpu := #{seconds := Secs}}} ->
                 io_lib:format("~.2f CPUs", [maps:get(gc, Secs, 0) / W]);
             _ -> "-"
         end,
    Thr = beamdiag_format_text:pct(maps:get(throttled_ratio, maps:get(cgroup, L), 0.0)),
    Ids = [atom_to_list(Id) || X = #{id := Id} <- F, beamdiag_finding:at_least(X, warning)],
    #{totals := #{sys := Sys, on_cpu := On}} = L,
    NodeSys = beamdiag_format_text:pct(Sys / max(On, 1.0e-9)),
    io:format("| ~s | ~s | ~s | ~s | ~s | ~s | ~s | ~s | ~s | ~s | ~s | ~s |~n",
              [filename:basename(File, ".capture"), P(busy), P(on_cpu), P(user), P(sys), P(runq),
               P(spin), P(blocked), NodeSys, Gc, Thr, lists:join(", ", Ids)]).
