%%% A gen_server that monitors the processes it is told to and otherwise
%%% waits in its own loop: a queue watching its channels, for the wait
%%% chains' tests.
-module(beamdiag_test_monitor_server).
-behaviour(gen_server).

-export([init/1, handle_call/3, handle_cast/2, handle_info/2]).

-spec init([]) -> {ok, []}.
init([]) ->
    {ok, []}.

-spec handle_call({monitor, pid()}, gen_server:from(), [reference()]) -> {reply, ok, [reference()]}.
handle_call({monitor, P}, _From, Refs) ->
    {reply, ok, [erlang:monitor(process, P) | Refs]}.

-spec handle_cast(term(), [reference()]) -> {noreply, [reference()]}.
handle_cast(_, Refs) ->
    {noreply, Refs}.

-spec handle_info(term(), [reference()]) -> {noreply, [reference()]}.
handle_info(_, Refs) ->
    {noreply, Refs}.
