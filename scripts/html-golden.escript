#!/usr/bin/env escript
%%! -noshell
%% Renders the HTML report for every fixture and case the tests use, one
%% file per case, into DIR: to check a change to the HTML formatter that
%% should not change its output, render before and after and compare the
%% two folders byte for byte (`cmp' or `diff -r').
%%
%% The cases: a diagnosis of every recorded capture (test/fixtures/captures),
%% some with the lock fixtures and the folded perf stacks as extras; the
%% host-side-only diagnoses of the host fixtures; the cases of
%% beamdiag_format_html_tests, beamdiag_flags_tests, beamdiag_html_SUITE
%% (hostile strings on a recorded capture, the generic results, a cluster of
%% 200) and beamdiag_cluster_tests; the generic renderer on every shape of
%% value and past its bounds; and escaping.
%%
%% Pids and references are fixed ones so that runs agree. A compare or
%% experiment page says when it was made ("generated ..."): that timestamp
%% is replaced by a fixed string, the only change made to any output.
%%
%% Needs the test profile's build (`rebar3 as test compile'), for
%% beamdiag_format_html's test-only exports.
%% Usage: scripts/html-golden.escript DIR [EBIN_DIR]
%% Compiled, as the tests are: erl_eval evaluates a map's values in another
%% order, which changes the seeded random figures of the cluster cases.
-mode(compile).

main([Dir | Rest]) ->
    Root = filename:dirname(filename:dirname(filename:absname(escript:script_name()))),
    Ebin = case Rest of
               [E] -> E;
               [] -> filename:join(Root, "_build/test/lib/beamdiag/ebin")
           end,
    true = code:add_patha(Ebin),
    ok = application:load(beamdiag),
    logger:set_primary_config(level, none),
    ok = filelib:ensure_path(Dir),
    Cases = cases(filename:join(Root, "test/fixtures")),
    [write(Dir, Name, render(Fun)) || {Name, Fun} <- Cases],
    io:format("html-golden: ~b pages in ~ts~n", [length(Cases), Dir]);
main(_) ->
    io:format(standard_error, "usage: html-golden.escript DIR [EBIN_DIR]~n", []),
    halt(2).

render(Fun) ->
    Html = iolist_to_binary(Fun()),
    re:replace(Html, "generated [0-9T:Z+-]+</p>", "generated TIMESTAMP</p>",
               [{return, binary}]).

write(Dir, Name, Bin) ->
    ok = file:write_file(filename:join(Dir, Name ++ ".html"), Bin).

cases(Fx) ->
    H = beamdiag_format_html,
    Captures = [{filename:basename(F, ".capture"), consult(F)}
                || F <- lists:sort(filelib:wildcard(filename:join(Fx, "captures/*.capture")))],
    Busy = proplists:get_value("busy_wait", Captures),
    Locks = [{filename:basename(F, ".term"), consult(F)}
             || F <- lists:sort(filelib:wildcard(filename:join(Fx, "lcnt_*.term")))],
    Folded = [{filename:basename(F, ".txt"), P}
              || F <- lists:sort(filelib:wildcard(filename:join(Fx, "perf/*.txt"))),
                 {ok, P} <- [beamdiag_fold:fold_file(F, #{})]],
    Diag = fun(C) -> fun() -> H:diagnosis(beamdiag:analyse(C)) end end,
    [{"capture-" ++ N, Diag(C)} || {N, C} <- Captures] ++
    [{"locks-" ++ N, fun() -> H:diagnosis(with_extras(beamdiag:analyse(Busy), #{locks => L})) end}
     || {N, L} <- Locks] ++
    [{"profile-" ++ N,
      fun() -> H:diagnosis(with_extras(beamdiag:analyse(Busy),
                                       #{profile => #{profile => P, method => perf}})) end}
     || {N, P} <- Folded] ++
    [{"profile-summary-only",
      fun() -> H:diagnosis(with_extras(beamdiag:analyse(Busy),
                                       #{profile => #{method => perf, svg => <<"<svg/>">>,
                                                      by_process => [#{pid => <<"<0.1.0>">>,
                                                                       share => 0.5}]}})) end},
     {"flags-sbwtdcpu-none",
      fun() ->
          S = (maps:get(settings, Busy))#{sbwtdcpu => <<"none">>},
          H:diagnosis(beamdiag:analyse(Busy#{settings => S}))
      end},
     {"empty-capture",
      fun() ->
          C = #{schema => <<"beamdiag.capture/1">>, node => <<"n@h">>, settings => #{},
                interval_ms => 1000, duration_ms => 1000, wall_start_ms => 0, samples => [],
                extras => #{}, complete => false, notes => [<<"<partial>">>]},
          H:diagnosis(beamdiag:analyse(C))
      end},
     {"hostile-busy_wait", fun() -> H:diagnosis(hostile(beamdiag:analyse(Busy))) end},
     {"edges-busy_wait", fun() -> H:diagnosis(edges(beamdiag:analyse(Busy))) end},
     {"edges-no-series", fun() -> H:diagnosis(no_series(beamdiag:analyse(Busy))) end}] ++
    [{"host-only-" ++ filename:basename(F, "_samples.term"),
      fun() -> H:diagnosis(beamdiag_host_rules:analyse(host_capture(F), unresponsive())) end}
     || F <- lists:sort(filelib:wildcard(filename:join(Fx, "host/*_samples.term")))] ++
    [{"cluster-200-hostile", fun() -> H:cluster(cluster_200()) end},
     {"cluster-300-outliers", fun() -> H:cluster(cluster_300()) end},
     {"cluster-21-stalled", fun() -> H:cluster(cluster_21()) end},
     {"cluster-homogeneous", fun() -> H:cluster(cluster_homogeneous()) end},
     {"cluster-all-outliers", fun() -> H:cluster(cluster_all_outliers()) end},
     {"compare-generic", fun() -> H:compare(generic_result()) end},
     {"experiment-generic",
      fun() -> H:experiment((generic_result())#{extra => [a, <<"b">>, 3]}) end},
     {"compare-script-close", fun() -> H:compare(#{v => <<"</script><b>&">>}) end},
     {"compare-bounds", fun() -> H:compare(bounds()) end},
     {"compare-no-findings", fun() -> H:compare(#{findings => [], runs => 1}) end},
     {"compare-odd-findings", fun() -> H:compare(#{findings => [#{a => 1}, 2]}) end},
     {"experiment-diagnosis-inside",
      fun() ->
          B = #{findings := Fs} = beamdiag:analyse(Busy),
          Odd = #{id => <<"binary_id">>, severity => info, title => <<"t">>, evidence => []},
          H:experiment(#{baseline => B#{findings => Fs ++ [Odd]}, n => 1})
      end}] ++
    [{"compare-real-" ++ A ++ "-" ++ B,
      fun() ->
          R = beamdiag_compare:compare(beamdiag:analyse(proplists:get_value(A, Captures)),
                                       beamdiag:analyse(proplists:get_value(B, Captures))),
          H:compare(beamdiag_compare:document(R))
      end}
     || {A, B} <- [{"busy_wait", "busy_wait_off"}, {"rabbitmq_backlog", "rabbitmq_paced"},
                   {"yaws_paced", "yaws_flat_out"}]] ++
    [{"generic-" ++ integer_to_list(I), fun() -> H:generic(V, #{}) end}
     || {I, V} <- lists:enumerate(shapes())] ++
    [{"generic-depth-" ++ integer_to_list(D), fun() -> H:generic(generic_result(), #{depth => D}) end}
     || D <- [1, 2, 3, 7]] ++
    [{"escape", fun() -> [[H:escape(X), "\n"] || X <- escapes()] end}].

consult(F) ->
    {ok, [T]} = file:consult(F),
    T.

with_extras(D = #{capture := C}, Extras) ->
    D#{capture => C#{extras => maps:merge(maps:get(extras, C, #{}), Extras)}}.

host_capture(F) ->
    Samples = consult(F),
    #{samples => Samples, settings => beamdiag_host_view:settings(Samples), node => <<"n@h">>}.

unresponsive() ->
    #{unresponsive => true, reason => unresponsive, waited_ms => 3000, os_pid => 4896,
      node => <<"n@h">>, located => epmd_port, window_s => 3.0,
      distribution => <<"it is registered in epmd (port 46593), but the distribution "
                        "handshake did not finish in 3.0 s">>}.

pid() -> list_to_pid("<0.77.0>").

ref() -> list_to_ref("#Ref<0.1.2.3>").

shapes() ->
    [#{}, [], [1, 2, 3], [#{a => 1}, #{b => <<"<x>">>}], #{a => #{b => 1}, c => #{b => 2}},
     {1.0, 2.0}, {tuple, [nested]}, pid(), ref(), <<255, 0>>, "a string",
     [a, <<"b">>, 3], #{k => [#{x => [#{y => #{z => 1}}]}]}, 1.0e-9, 1.0e12, -0.5,
     [#{b => <<"<x>">>}], 0.0, 12345678901234567890, true, false, null, undefined, ok,
     [1.5, 2, -3.25e-5], [{1, 2}, {3.0, 4}], #{1 => a, "s" => b, <<"b">> => c, {t} => d},
     lists:seq(1, 80), [pid(), ref()], [[1, [2]], "x"], #{x => [1, a, <<"c">>, {p}]},
     #{significant => true, a => 1.0}, [#{significant => true, v => 1}, #{v => 2}],
     #{m => #{a => 1, n => #{deep => 1}}, l => #{a => 2, n => [1, 2]}},
     binary:copy(<<"long <text> ">>, 500), [binary:copy(<<"k">>, 300)],
     [#{range => {1, 2}, n => 1}, #{range => {3.5, 4}, n => 2}]].

bounds() ->
    #{rows => [#{i => I, name => integer_to_binary(I)} || I <- lists:seq(1, 520)],
      wide => [maps:from_list([{list_to_atom("c" ++ integer_to_list(C)), C} || C <- lists:seq(1, 45)])],
      many => maps:from_list([{I, I * 1.5} || I <- lists:seq(1, 520)]),
      table => maps:from_list([{I, #{a => I, b => [I], c => #{d => I}}} || I <- lists:seq(1, 30)]),
      nested => lists:foldl(fun(I, A) -> #{I => A, s => I} end, #{leaf => 1}, lists:seq(1, 9)),
      list => [[I] || I <- lists:seq(1, 520)],
      ids => [#{workload => w, metric => m, z => 1, label => l, variant => v, type => t,
                id => 1, name => n, key => k, a => 2}]}.

generic_result() ->
    #{runs => 3,
      metrics => #{busy_share => #{a => 0.12, b => 0.34, delta => 0.22, noise => 0.01},
                   spin_share => #{a => 0.5, b => 0.01, delta => -0.49, noise => 0.02}},
      variants => [#{name => <<"+sbwt none">>, cpu => 1.5, throughput => 1000},
                   #{name => <<"<b>default</b>">>, cpu => 2.5, extra => [1, 2, 3]}],
      verdict => <<"variant b uses less CPU & keeps throughput \"within noise\"">>,
      odd => {tuple, pid(), ref()},
      nested => #{a => #{b => #{c => #{d => #{e => #{f => #{g => #{h => 1}}}}}}}},
      empty => #{},
      findings => [beamdiag_finding:new(busy_wait, warning, [<<"<i>x</i>">>], #{s => 1.0})]}.

escapes() ->
    [<<"<a href=\"x\">&'</a>">>, <<"a", 255, "b", 0, "\nc">>, ok, 42, 1.5, "liste <>",
     <<"tab\there\r\n">>, [<<"io">>, "list", $&], 'quoted atom <'].

%% As beamdiag_html_SUITE's hostile/1, on a recorded capture's diagnosis.
hostile(#{capture := C0}) ->
    Script = <<"<script>document.documentElement.setAttribute('data-pwned','1')</script>">>,
    Img = <<"\"><img src=x onerror=\"document.documentElement.setAttribute('data-pwned','2')\">">>,
    Long = binary:copy(<<"A&<>\"'\n">>, 20000),
    Names = [Script, Img, <<"quote\"s 'and' \\back\\slash\nnew\rline\t\0nul">>, Long,
             <<"</script><script>x()</script>">>, <<255, 254, "bad utf8 <b>">>],
    Samples = [rename_threads(S, Names) || S <- maps:get(samples, C0)],
    Locks = #{window_ns => 1000000000, lock_count => 2,
              locks => [#{class => <<"db_hash_slot">>, id => Script, wait_pct => 50.0,
                          locations => [#{location => Img, tries => 3}]},
                        #{class => Img, id => Long, wait_pct => 1.5}],
              tables => [#{name => Script, owner => Img}]},
    Folded = #{[Script, Img, Long] => 10, [<<"main">>, Script] => 5},
    C = C0#{node => <<Script/binary, "@", Img/binary>>,
            samples => Samples,
            settings => (maps:get(settings, C0))#{sbwt => Img, os => Script, Long => Script},
            notes => [Script, Long]},
    D0 = beamdiag:analyse(C),
    D = D0#{capture => C#{extras => #{locks => Locks, profile => #{profile => Folded, Script => Img}}}},
    #{ledger := L, findings := F} = D,
    Threads = [T#{name => lists:nth(1 + I rem length(Names), Names)}
               || {I, T} <- lists:enumerate(maps:get(threads, L))],
    Hostile = beamdiag_finding:new(busy_wait, critical, [Script, Img, Long],
                                   #{Script => 1.0, note => Img}),
    D#{ledger => L#{threads => Threads, notes => [Img]}, findings => [Hostile | F]}.

rename_threads(S = #{threads := Th}, Names) when is_map(Th) ->
    S#{threads => maps:map(
        fun(Tid, T = #{name := N}) ->
            case beamdiag_threads:classify(N) of
                {Ty, _} when Ty =:= main; Ty =:= sys; Ty =:= async ->
                    T#{name => lists:nth(1 + Tid rem length(Names), Names)};
                _ -> T
            end
        end, Th)};
rename_threads(S, _) ->
    S.

%% The branches the recorded captures do not reach: a finding without
%% "when not" or metrics, evidence that is not a list, a node named by an
%% atom, settings of odd shapes, more scheduler threads than a table
%% shows, a host without CPU figures, the emulator's extra msacc states
%% without a span, and a thread type outside the usual order.
edges(D = #{capture := C, ledger := L, findings := F}) ->
    Plain = #{id => <<"plain_finding">>, severity => info, title => <<"Plain">>,
              evidence => <<"one line, not a list">>, fix => <<"none">>, metrics => #{}},
    Sched = [T || T = #{type := scheduler} <- maps:get(threads, L)],
    Many = lists:append(lists:duplicate(600 div max(1, length(Sched)) + 1, Sched)),
    M = maps:get(msacc, L),
    ByType = maps:get(by_type, M),
    Extra = ByType#{zz_custom => maps:get(scheduler, ByType), not_a_map => 1},
    D#{capture => C#{node => 'atom@node',
                     settings => (maps:get(settings, C))#{odd_list => [1, {x}],
                                                          {tuple, key} => 1.5}},
       ledger => L#{threads => maps:get(threads, L) ++ Many,
                    host => #{user => 0.1},
                    msacc => M#{extra => true, span_s => undefined, by_type => Extra}},
       findings => F ++ [Plain]}.

%% Threads but no series: the charts have no ticks to draw.
no_series(D = #{ledger := L}) ->
    D#{ledger => L#{series => []}}.

%% As beamdiag_html_SUITE's cluster_report/1.
cluster_200() ->
    rand:seed(exsss, {3, 2, 1}),
    Row = fun(Name, Busy) ->
              J = fun(S) -> S * rand:uniform() end,
              #{row => #{node => Name, window_start_ms => 0, window_s => 4.0, complete => true,
                         cpus_used => 0.01 + J(0.01) + Busy, busy => 0.02 + J(0.01) + Busy * 0.8,
                         on_cpu => 0.01 + J(0.01) + Busy * 0.7, spin => J(0.01), runq => J(0.02),
                         sys => J(0.01), blocked => 0.0, reductions_per_s => 2.0e4 + J(2.0e3),
                         findings => [], top_process => null},
                findings => []}
          end,
    Evil = <<"<img src=x onerror=\"document.body.dataset.pwned=1\">@h">>,
    Results = [Row(iolist_to_binary(["n", integer_to_list(I), "@h"]), 0.0) || I <- lists:seq(1, 198)]
        ++ [Row(Evil, 0.0), Row(<<"busy@h">>, 1.0)],
    A = beamdiag_cluster_analysis:analyse(Results),
    A#{schema => <<"beamdiag.cluster/2">>, seed => null, source => list,
       members => [N || #{node := N} <- maps:get(nodes, A)], window_s => 4.0,
       windows => #{first_start_ms => 0, start_spread_s => 0.3, overlap_s => 3.7},
       errors => [#{node => <<"gone@h">>, message => <<"cannot reach it">>}]}.

%% As beamdiag_cluster_tests.
result(I, Over, Findings) ->
    J = fun(Scale) -> Scale * (rand:uniform() - 0.5) end,
    Row = maps:merge(
        #{node => iolist_to_binary(["n", integer_to_list(I), "@h"]),
          window_start_ms => 1700000000000 + I, window_s => 10.0, complete => true,
          cpus_used => 0.02 + J(0.01), busy => 0.02 + J(0.01), on_cpu => 0.01 + J(0.01),
          spin => 0.005 + J(0.004), runq => 0.01 + J(0.01), sys => 0.003 + J(0.002),
          blocked => 0.0, reductions_per_s => 20000.0 + J(4000.0),
          findings => [#{id => Id, severity => S} || {Id, S} <- Findings],
          top_process => null},
        Over),
    #{row => Row,
      findings => [beamdiag_finding:new(Id, S, [<<"evidence">>], #{}) || {Id, S} <- Findings]}.

cluster(Results) ->
    A = beamdiag_cluster_analysis:analyse(Results),
    A#{schema => <<"beamdiag.cluster/2">>, seed => null, source => list,
       members => [N || #{node := N} <- maps:get(nodes, A)],
       window_s => 10.0,
       windows => #{first_start_ms => 0, start_spread_s => 0.2, overlap_s => 9.8},
       errors => []}.

stalled_error() ->
    #{node => <<"stopped@h">>, message => <<"did not answer within 5.0 s">>}.

cluster_300() ->
    rand:seed(exsss, {7, 8, 9}),
    Odd = [result(1000 + I, #{busy => 0.5 + I / 10, on_cpu => 0.4 + I / 10, cpus_used => 0.5,
                              runq => 0.3, reductions_per_s => 3.0e6}, [{cpu_starvation, critical}])
           || I <- lists:seq(1, 4)],
    Results = [result(I, #{}, [{busy_wait, warning} || I rem 2 =:= 0]) || I <- lists:seq(1, 300)]
        ++ Odd,
    (cluster(Results))#{errors => [stalled_error() |
                                   [#{node => iolist_to_binary(["gone", integer_to_list(I), "@h"]),
                                      message => <<"cannot reach it">>}
                                    || I <- lists:seq(1, 12)]]}.

cluster_21() ->
    rand:seed(exsss, {1, 1, 1}),
    Results = [result(I, #{}, []) || I <- lists:seq(1, 20)] ++ [result(99, #{busy => 0.9}, [])],
    (cluster(Results))#{errors => [stalled_error()]}.

cluster_homogeneous() ->
    rand:seed(exsss, {1, 2, 3}),
    cluster([result(I, #{}, [{busy_wait, warning} || I rem 3 =:= 0]) || I <- lists:seq(1, 30)]).

%% Two nodes far apart with few reductions: no "rest" left.
cluster_all_outliers() ->
    rand:seed(exsss, {5, 5, 5}),
    cluster([result(1, #{reductions_per_s => 12.0}, []),
             result(2, #{busy => 0.9, cpus_used => 3.0, reductions_per_s => 900.0}, [])]).
