%%% @doc The one home of units on the command line's side: shares as
%%% percent, bytes, rates, clock ticks. Every finding, report and frame
%%% writes its figures with these, so a figure reads the same everywhere.
%%% (The agent, on the target, keeps its own tick conversion: it loads no
%%% module of this side.)
%%%
%%% Conventions: a share is a fraction (0.25) and prints as percent; bytes
%%% in SI units (kB = 1000 B) with `bytes/1', in binary units (MiB =
%%% 1048576 B, said so) with `memory/1'; a rate is a count a second.
%%%
%%% ```
%%% 1> beamdiag_units:pct(0.253).
%%% "25.3%"
%%% 2> beamdiag_units:bytes(520.0e6).
%%% "520.0 MB"
%%% 3> beamdiag_units:memory(3 bsl 29).
%%% "1.5 GiB"
%%% 4> beamdiag_units:rate(438005.9).
%%% "438.0k"
%%% '''
-module(beamdiag_units).

-export([signed_bytes/1, pct/1, pct/2, whole_pct/1, bytes/1, memory/1, rate/1, count/1, ticks_to_s/1]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc A share as percent with one decimal ("25.3%"); "-" for a share
%% not known.
-spec pct(number() | term()) -> string().
pct(X) ->
    pct(X, "-").

%% @doc As `pct/1', with the text for a share not known ("&ndash;" in HTML).
-spec pct(number() | term(), string()) -> string().
pct(X, _Unknown) when is_number(X) ->
    lists:flatten(io_lib:format("~.1f%", [100 * X]));
pct(_, Unknown) ->
    Unknown.

%% @doc A share as a whole percent ("25%"), for a glance.
-spec whole_pct(number()) -> string().
whole_pct(X) ->
    integer_to_list(round(100 * X)) ++ "%".

%% @doc Bytes in SI units: "820 B", "73.7 kB", "520.0 MB", "3.51 GB".
-spec bytes(number()) -> string().
bytes(B) when B >= 1.0e9 -> lists:flatten(io_lib:format("~.2f GB", [B / 1.0e9]));
bytes(B) when B >= 1.0e6 -> lists:flatten(io_lib:format("~.1f MB", [B / 1.0e6]));
bytes(B) when B >= 1.0e3 -> lists:flatten(io_lib:format("~.1f kB", [B / 1.0e3]));
bytes(B) -> lists:flatten(io_lib:format("~b B", [round(B)])).

%% @doc A change in bytes with its sign, as bytes/1 writes it: "+38.6 MB",
%% "-561.2 kB", "+0 B".
-spec signed_bytes(number()) -> string().
signed_bytes(B) when B < 0 -> "-" ++ bytes(-B);
signed_bytes(B) -> "+" ++ bytes(B).

%% @doc Memory sizes in binary units, as the kernel counts them: "45 MiB",
%% "1.5 GiB"; "no limit" for a cgroup's `max'.
-spec memory(number() | max) -> string().
memory(max) -> "no limit";
memory(B) when B >= 1 bsl 30 -> lists:flatten(io_lib:format("~.1f GiB", [B / (1 bsl 30)]));
memory(B) -> lists:flatten(io_lib:format("~b MiB", [trunc(B) div (1 bsl 20)])).

%% @doc A count a second, shortened: "912", "438.0k", "1.2M", "3.4G".
-spec rate(number()) -> string().
rate(V) when V >= 1.0e9 -> lists:flatten(io_lib:format("~.1fG", [V / 1.0e9]));
rate(V) when V >= 1.0e6 -> lists:flatten(io_lib:format("~.1fM", [V / 1.0e6]));
rate(V) when V >= 1.0e3 -> lists:flatten(io_lib:format("~.1fk", [V / 1.0e3]));
rate(V) -> integer_to_list(round(V)).

%% @doc A count, shortened from ten thousand: "9999", "12.3k", "4.5M".
-spec count(integer()) -> string().
count(N) when N >= 1000000 -> lists:flatten(io_lib:format("~.1fM", [N / 1.0e6]));
count(N) when N >= 10000 -> lists:flatten(io_lib:format("~.1fk", [N / 1.0e3]));
count(N) -> integer_to_list(N).

%% @doc Clock ticks (USER_HZ, /proc's unit, as the agent reads it) as
%% seconds.
-spec ticks_to_s(number()) -> float().
ticks_to_s(Ticks) ->
    Ticks / beamdiag_agent_procfs:clock_ticks().
