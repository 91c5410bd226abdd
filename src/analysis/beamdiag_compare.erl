%%% @doc Two diagnoses side by side: every ledger figure with its delta and
%%% whether the delta stands out from the run-to-run noise, and the
%%% findings that appeared, went or changed severity. Pure; the statistics
%%% come from `beamdiag_stats'.
%%%
%%% The noise comes from the captures themselves: the ledger's `series'
%%% holds every figure per tick, so each capture gives a sample of per-tick
%%% values. A delta is tested with Welch's t-test (unequal variances,
%%% Welch-Satterthwaite degrees of freedom) on those per-tick values and
%%% reported with its 99% confidence interval. It counts as significant
%%% when p < 0.01 and the delta is larger than the metric's resolution
%%% floor (one percentage point of wall time for shares, 0.02 CPUs, 5% for
%%% rates): the kernel counts thread time in 10 ms ticks, so smaller deltas
%%% are below what the ledger can resolve. Ticks of one window are not
%%% independent (a load that drifts within a window makes them correlated),
%%% which makes the test somewhat optimistic; the floor guards against that.
%%%
%%% ```
%%% 1> {ok, A} = beamdiag_capture_file:load("before.capture").
%%% 2> {ok, B} = beamdiag_capture_file:load("after.capture").
%%% 3> C = beamdiag_compare:compare(A, B).
%%% 4> [K || #{key := K, significant := true} <- maps:get(metrics, C)].
%%% [<<"scheduler.spin">>, <<"scheduler.on_cpu">>, <<"totals.cpus_used">>]
%%% 5> io:put_chars(beamdiag_format_compare:text(C)).
%%% '''
-module(beamdiag_compare).

-export([compare/2, compare/3, document/1]).

-ifdef(TEST).
-export([processes/2]).
-endif.

-export_type([comparison/0, options/0, about/0, metric/0, finding_change/0, process_change/0,
              document/0]).
-type comparison() :: #{
    schema := binary(),
    a := about(),
    b := about(),
    method := binary(),
    alpha := float(),
    metrics := [metric()],
    findings := [finding_change()],
    processes => [process_change()]
}.
%% compare/3's options.
-type options() :: #{alpha => float()}.
%% What a comparison says of each diagnosis.
-type about() :: #{node := binary(), wall_start_ms := integer(), window_s := float(),
                   ticks := non_neg_integer(), sbwt := binary() | null,
                   findings := non_neg_integer()}.
%% One metric in both: the whole window's values, Welch's test over the
%% ticks (the delta's confidence interval `ci', `undefined' with too few
%% ticks) and whether the change counts.
-type metric() :: #{
    key := binary(),
    unit := share | cpus | rate,
    a := number(),
    b := number(),
    delta := number(),
    tick_delta := number() | undefined,
    ci := {number(), number()} | undefined,
    p := number() | undefined,
    df := number() | undefined,
    ticks_a := non_neg_integer(),
    ticks_b := non_neg_integer(),
    floor := number(),
    significant := boolean()
}.
%% A finding's severity in each (`none' where it was not made).
-type finding_change() :: #{id := atom(),
                            a := beamdiag_finding:severity() | none,
                            b := beamdiag_finding:severity() | none,
                            change := same | new | gone | worse | better}.
%% A process in either window: its share of the reductions, its queue and
%% its memory at the end, in A and B (`null' where it was not reported).
-type process_change() :: #{process := binary(),
                            share := [number() | null],
                            queue := [non_neg_integer() | null],
                            memory := [non_neg_integer() | null]}.
%% The comparison as its JSON encodes it: each metric's `ci' a list.
-type document() :: #{
    schema := binary(),
    a := about(),
    b := about(),
    method := binary(),
    alpha := float(),
    metrics := [#{ci := [number()] | null, atom() => term()}],
    findings := [finding_change()],
    processes => [process_change()]
}.

-define(SCHEMA, <<"beamdiag.compare/1">>).
-define(DEFAULTS, #{alpha => 0.01}).
-define(TYPES, [scheduler, dirty_cpu, dirty_io]).
-define(FIELDS, [busy, on_cpu, sys, runq, spin, blocked]).
-define(SHARE_FLOOR, 0.01).
-define(CPU_FLOOR, 0.02).
-define(RATE_FLOOR, 0.05).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc Compares two diagnoses with the default options.
-spec compare(beamdiag_diagnosis:diagnosis(), beamdiag_diagnosis:diagnosis()) -> comparison().
compare(A, B) ->
    compare(A, B, #{}).

%% @doc Compares two diagnoses. Options: `alpha' (0.01), the significance
%% level of each test. Unknown options raise `badarg'.
-spec compare(beamdiag_diagnosis:diagnosis(), beamdiag_diagnosis:diagnosis(), options()) -> comparison().
compare(A, B, Opts) when is_map(Opts) ->
    #{alpha := Alpha} = beamdiag_opts:merge(Opts, ?DEFAULTS, []),
    MA = metrics(A),
    MB = metrics(B),
    Keys = [K || {K, _} <- MA, lists:keymember(K, 1, MB)],
    Metrics = [metric(K, proplists:get_value(K, MA), proplists:get_value(K, MB), Alpha)
               || K <- Keys],
    #{
        schema => ?SCHEMA,
        a => about(A),
        b => about(B),
        method => <<"Welch's t-test over per-tick values; 99% CI of the delta">>,
        alpha => Alpha,
        metrics => Metrics,
        findings => findings(maps:get(findings, A), maps:get(findings, B)),
        processes => processes(procs(A), procs(B))
    }.

%% @doc Which processes changed between two windows' process data: each
%% process reported in either (matched by registered name, else by pid),
%% with its share of the reductions, its queue at the end and its memory at
%% the end in each; the largest changes first, at most 10.
-spec processes(beamdiag_agent_processes:report() | undefined,
                beamdiag_agent_processes:report() | undefined) -> [process_change()].
processes(A, B) ->
    IA = index(A),
    IB = index(B),
    Keys = lists:usort(maps:keys(IA) ++ maps:keys(IB)),
    Rows = [change(K, maps:get(K, IA, undefined), maps:get(K, IB, undefined)) || K <- Keys],
    Sorted = lists:sort(fun(X, Y) -> weight(X) >= weight(Y) end, Rows),
    lists:sublist([R || R <- Sorted, weight(R) > 0], 10).

%% @doc The comparison as the map its JSON encodes.
-spec document(comparison()) -> document().
document(C = #{metrics := Ms}) ->
    C#{metrics => [M#{ci => ci_list(maps:get(ci, M))} || M <- Ms]}.

%%%===================================================================
%%% Internal
%%%===================================================================

%% The process walks' data of a diagnosis, when it has them.
procs(#{capture := #{extras := #{procs := P}}}) when is_map(P) -> P;
procs(_) -> undefined.

about(#{capture := C, ledger := L, findings := F}) ->
    S = maps:get(settings, C, #{}),
    #{
        node => maps:get(node, C, <<"?">>),
        wall_start_ms => maps:get(wall_start_ms, C, 0),
        window_s => maps:get(window_s, L, 0.0),
        ticks => length(maps:get(series, L, [])),
        sbwt => maps:get(sbwt, S, null),
        findings => length(F)
    }.

%% Every metric of a diagnosis: {Key, {Unit, Whole, PerTick}}.
metrics(#{capture := C, ledger := L}) ->
    ByType = maps:get(by_type, L, #{}),
    Series = maps:get(series, L, []),
    Shares = [
        {iolist_to_binary([atom_to_list(T), ".", atom_to_list(F)]),
         {share, share(F, Row), [share(F, maps:get(T, TickTypes))
                                 || #{by_type := TickTypes} <- Series,
                                    is_map_key(T, TickTypes),
                                    is_number(maps:get(F, maps:get(T, TickTypes), undefined))]}}
     || T <- ?TYPES, {ok, Row} <- [maps:find(T, ByType)], F <- ?FIELDS,
        is_number(maps:get(F, Row, undefined))
    ],
    Totals = maps:get(totals, L, #{}),
    Cpus = [{<<"totals.cpus_used">>,
             {cpus, maps:get(cpus_used, Totals, 0.0),
              [cpus(Types, Dt) || #{by_type := Types, t := Dt} <- Series]}}
            || maps:is_key(cpus_used, Totals)],
    Vm = maps:get(vm, L, #{}),
    Red = [{<<"vm.reductions_per_s">>,
            {rate, maps:get(reductions_per_s, Vm), reductions(maps:get(samples, C, []))}}
           || maps:is_key(reductions_per_s, Vm)],
    Shares ++ Cpus ++ Red.

share(F, Row) ->
    case {maps:get(F, Row, undefined), maps:get(wall, Row, 0)} of
        {V, W} when is_number(V), W > 0 -> V / W;
        _ -> 0.0
    end.

%% All thread types count towards the node's CPUs (the series holds each
%% type's on-CPU seconds per tick).
cpus(Types, Dt) when Dt > 0 ->
    lists:sum([V || #{on_cpu := V} <- maps:values(Types), is_number(V)]) / Dt;
cpus(_, _) ->
    0.0.

reductions([#{t := TA, vm := #{reductions := RA}} |
            Rest = [#{t := TB, vm := #{reductions := RB}} | _]]) when TB > TA ->
    [(RB - RA) / ((TB - TA) / 1.0e9) | reductions(Rest)];
reductions([_ | Rest]) ->
    reductions(Rest);
reductions([]) ->
    [].

metric(Key, {Unit, WholeA, TicksA}, {_, WholeB, TicksB}, Alpha) ->
    W = beamdiag_stats:welch(TicksA, TicksB),
    Delta = WholeB - WholeA,
    Floor = floor_of(Unit, WholeA, WholeB),
    Sig = case maps:get(p, W) of
              undefined -> false;
              P -> P < Alpha andalso abs(maps:get(delta, W)) >= Floor andalso abs(Delta) >= Floor
          end,
    #{
        key => Key,
        unit => Unit,
        a => WholeA,
        b => WholeB,
        delta => Delta,
        tick_delta => maps:get(delta, W),
        ci => maps:get(ci, W),
        p => maps:get(p, W),
        df => maps:get(df, W),
        ticks_a => maps:get(n_a, W),
        ticks_b => maps:get(n_b, W),
        floor => Floor,
        significant => Sig
    }.

floor_of(share, _, _) -> ?SHARE_FLOOR;
floor_of(cpus, _, _) -> ?CPU_FLOOR;
floor_of(rate, A, B) -> ?RATE_FLOOR * max(abs(A), abs(B)).

findings(FA, FB) ->
    Sev = fun(Fs) -> maps:from_list([{Id, S} || #{id := Id, severity := S} <- Fs]) end,
    SA = Sev(FA),
    SB = Sev(FB),
    Ids = lists:usort(maps:keys(SA) ++ maps:keys(SB)),
    [begin
         A = maps:get(Id, SA, none),
         B = maps:get(Id, SB, none),
         #{id => Id, a => A, b => B, change => change(A, B)}
     end || Id <- Ids].

change(S, S) -> same;
change(none, _) -> new;
change(_, none) -> gone;
change(A, B) ->
    case beamdiag_finding:severity_rank(B) < beamdiag_finding:severity_rank(A) of
        true -> worse;
        false -> better
    end.

ci_list(undefined) -> null;
ci_list({L, H}) -> [L, H].

index(#{top_reductions := T} = P) ->
    Total = maps:get(reductions, P, 0),
    Es = T ++ maps:get(queues, P, []) ++ maps:get(heaps, P, []),
    maps:from_list([{key(E), E#{share => reductions_share(E, Total)}} || E <- lists:reverse(Es)]);
index(_) ->
    #{}.

key(#{name := N}) when is_binary(N) -> N;
key(#{pid := P}) -> P.

reductions_share(#{reductions := R}, Total) when Total > 0 -> R / Total;
reductions_share(_, _) -> 0.0.

change(K, A, B) ->
    #{process => K, share => [field(share, A), field(share, B)],
      queue => [last(queue, A), last(queue, B)], memory => [last(memory, A), last(memory, B)]}.

field(_, undefined) -> null;
field(F, E) -> maps:get(F, E, null).

last(_, undefined) -> null;
last(F, E) ->
    case maps:get(F, E, null) of
        [_, V] -> V;
        _ -> null
    end.

%% How much a row changed: share in points, queue and memory relative.
weight(#{share := [SA, SB], queue := [QA, QB], memory := [MA, MB]}) ->
    abs(num(SB) - num(SA)) * 100 + rel(QA, QB) + rel(MA, MB).

rel(A, B) ->
    X = num(A),
    Y = num(B),
    case max(X, Y) of
        M when M < 1 -> 0.0;
        M -> abs(Y - X) / M
    end.

num(null) -> 0;
num(N) -> N.
