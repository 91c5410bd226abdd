%%% @doc The Erlang side of the sick-node lab's NIF (priv/beamdiag_lab_nif.c),
%%% shipped to a lab node, which loads the library that
%%% `beamdiag_lab_sick' built for it.
%%%
%%% ```
%%% 1> beamdiag_lab_nif:load("/tmp/beamdiag_lab_nif_1234/beamdiag_lab_nif").
%%% ok
%%% 2> beamdiag_lab_nif:spin(200).   % holds this scheduler for 200 ms
%%% ok
%%% '''
-module(beamdiag_lab_nif).

-export([load/1, spin/1, spin_yield/1, leak_malloc/1]).
%% NIFs, called as beamdiag_lab_nif:Fun/1 by beamdiag_lab_sick:nif_loop/5.
-ignore_xref([{spin, 1}, {spin_yield, 1}, {leak_malloc, 1}]).

%% @doc Loads the library (its path without the extension).
-spec load(file:filename()) -> ok | {error, {atom(), string()}}.
load(SoNoExt) ->
    erlang:load_nif(SoNoExt, 0).

%% @doc Keeps this scheduler busy in native code for Ms milliseconds,
%% without yielding.
-spec spin(non_neg_integer()) -> ok.
spin(_Ms) ->
    erlang:nif_error(not_loaded).

%% @doc The same work in slices that yield the scheduler.
-spec spin_yield(non_neg_integer()) -> ok.
spin_yield(_Ms) ->
    erlang:nif_error(not_loaded).

%% @doc Allocates Bytes with malloc, touches them and never frees them.
-spec leak_malloc(pos_integer()) -> ok | enomem.
leak_malloc(_Bytes) ->
    erlang:nif_error(not_loaded).
