%%% @doc Lab scenarios for process attribution, and their workloads.
%%%
%%% The workload functions run on the lab node (this module is shipped
%%% there). `single_server': one registered gen_server that every worker
%%% calls; `mailbox_growth': eight producers casting to one registered
%%% consumer that takes a millisecond per message; `equal_workers': the
%%% negative control, the same number of workers each doing its own work.
%%%
%%% ```
%%% 1> [N || #{name := N} <- beamdiag_lab_procs:scenarios()].
%%% [single_server, mailbox_growth, equal_workers]
%%% '''
-module(beamdiag_lab_procs).

-behaviour(gen_server).

-export([scenarios/0]).
%% Workloads, called on the lab node.
-export([single_server/2, mailbox_growth/2, equal_workers/2]).
%% gen_server callbacks.
-export([init/1, handle_call/3, handle_cast/2, handle_info/2]).
%% Lab workloads: run on the lab node from the scenario's `load' MFA.
-ignore_xref([{single_server, 2}, {mailbox_growth, 2}, {equal_workers, 2}]).

-define(SERVER, beamdiag_lab_server).
-define(CONSUMER, beamdiag_lab_consumer).
%% The work one call or one message costs, in loop steps (about 0.1 ms).
-define(WORK, 2000).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The process scenarios.
-spec scenarios() -> [beamdiag_lab:scenario()].
scenarios() ->
    [
        #{name => single_server,
          summary => <<"64 workers calling one registered gen_server that does the work">>,
          emu_args => [], load => {?MODULE, single_server, ['$duration_ms', '$vary']},
          vary => server_vary(),
          modules => [beamdiag_lab_ledger],
          expect => [single_process_bottleneck]},
        #{name => mailbox_growth,
          summary => <<"eight producers casting to one consumer that takes 1 ms a message">>,
          emu_args => ["+S", "2:2"], load => {?MODULE, mailbox_growth, ['$duration_ms', 8]},
          modules => [beamdiag_lab_ledger],
          expect => [message_queue_growth]},
        #{name => equal_workers,
          summary => <<"64 workers each doing its own work: saturated and healthy "
                       "(negative control)">>,
          emu_args => ["+S", "2:2"], load => {?MODULE, equal_workers, ['$duration_ms', 64]},
          modules => [beamdiag_lab_ledger],
          expect => [cpu_saturated]}
    ].

%% @doc A registered gen_server that does `work' steps per call (?WORK:
%% about 0.1 ms), and `callers' workers calling it in a loop (the
%% variation's, `server_vary/0').
-spec single_server(pos_integer(), #{callers := pos_integer(), work := pos_integer(),
                                     atom() => term()}) -> ok.
single_server(Ms, #{callers := N, work := Work}) ->
    beamdiag_lab_ledger:owner(Ms, fun() ->
        {ok, S} = gen_server:start_link({local, ?SERVER}, ?MODULE, {server, Work}, []),
        [S | [spawn_link(fun() -> caller_loop() end) || _ <- lists:seq(1, N)]]
    end).

%% @doc A registered consumer that sleeps 1 ms per message, and N producers
%% that each cast a message every millisecond.
-spec mailbox_growth(pos_integer(), pos_integer()) -> ok.
mailbox_growth(Ms, N) ->
    beamdiag_lab_ledger:owner(Ms, fun() ->
        {ok, C} = gen_server:start_link({local, ?CONSUMER}, ?MODULE, consumer, []),
        [C | [spawn_link(fun() -> producer_loop(0) end) || _ <- lists:seq(1, N)]]
    end).

%% @doc N workers, each doing ?WORK steps at a time on its own.
-spec equal_workers(pos_integer(), pos_integer()) -> ok.
equal_workers(Ms, N) ->
    beamdiag_lab_ledger:owner(Ms, fun() -> [spawn_link(fun() -> worker_loop() end) || _ <- lists:seq(1, N)] end).

%% What single_server varies, with the lab's defaults: the bound of its
%% rule moves with each (callers waiting, the server's share of the work,
%% idle schedulers, busy waiting that fills their idle time).
server_vary() ->
    #{callers => #{values => [{integer, 1, 4096}], default => 64,
                   help => <<"calling processes">>},
      work => #{values => [{integer, 1, 10000000}], default => ?WORK,
                help => <<"loop steps per call (2000: about 0.1 ms)">>},
      schedulers => #{values => [host, {integer, 1, 1024}], default => 2,
                      help => <<"schedulers (host: one per core)">>},
      busy_wait => #{values => [default, none], default => default,
                     help => <<"busy waiting: the default, or +sbwt none for every type">>}}.

%%%===================================================================
%%% gen_server callbacks
%%%===================================================================

%% @private
-spec init({server, pos_integer()} | consumer) -> {ok, term()}.
init({server, Work}) ->
    {ok, {Work, 0}};
init(consumer) ->
    {ok, 0}.

%% @private
-spec handle_call(term(), gen_server:from(), {pos_integer(), non_neg_integer()}) ->
    {reply, non_neg_integer(), {pos_integer(), non_neg_integer()}}.
handle_call(work, _From, {Work, N}) ->
    _ = work(Work),
    {reply, N, {Work, N + 1}}.

%% @private
-spec handle_cast(term(), non_neg_integer()) -> {noreply, non_neg_integer()}.
handle_cast({item, _}, N) ->
    timer:sleep(1),
    {noreply, N + 1}.

%% @private
-spec handle_info(term(), non_neg_integer()) -> {noreply, non_neg_integer()}.
handle_info(_, N) ->
    {noreply, N}.

%%%===================================================================
%%% Internal
%%%===================================================================

caller_loop() ->
    _ = gen_server:call(?SERVER, work, infinity),
    caller_loop().

producer_loop(I) ->
    gen_server:cast(?CONSUMER, {item, I}),
    receive
    after 1 -> ok
    end,
    producer_loop(I + 1).

worker_loop() ->
    _ = work(?WORK),
    worker_loop().

work(0) -> ok;
work(N) -> _ = erlang:phash2(N), work(N - 1).
