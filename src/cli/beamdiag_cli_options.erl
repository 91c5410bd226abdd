%%% @doc The options several commands share, defined once, as data.
%%%
%%% A command's `spec/0' names the shared options it takes, in the order
%%% its `--help' lists them, with `pick/1'; an entry may adjust the shared
%%% definition (its help text, or any field) for that command, and a map
%%% is an option of the command's own, taken as it is:
%%%
%%% ```
%%% 1> beamdiag_cli_options:pick([cookie, {out, "write the results to FILE instead of standard output"}]).
%%% [#{key => cookie, long => "--cookie", ...}, #{key => out, long => "--out", ...}]
%%% '''
%%%
%%% An option kept for one release under a former name carries
%%% `replaced_by' (the name to use): `beamdiag_cli' parses it as the new
%%% one, leaves it out of `--help' and prints a note on standard error.
-module(beamdiag_cli_options).

-export([pick/1, deprecated/2]).
%% Called by the tests only.
-ifdef(TEST).
-export([option/1]).
-endif.

-export_type([entry/0, name/0]).

-type name() ::
    cookie | cookie_file | duration | interval | slack | json | out | html | save | fail_on
    | erlang.
%% A shared option by name; the same with another help text or other
%% fields; or an option of the command's own.
-type entry() :: name() | {name(), string() | map()} | beamdiag_cli:option().

-define(SEVERITY, {enum, [critical, warning, info]}).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc The options of a command: each entry as `option/1' defines it,
%% with the entry's help text or fields in place of the shared ones.
-spec pick([entry()]) -> [beamdiag_cli:option()].
pick(Entries) ->
    [entry(E) || E <- Entries].

%% @doc The shared definition of an option.
-spec option(name()) -> beamdiag_cli:option().
option(cookie) ->
    #{key => cookie, long => "--cookie", type => string, metavar => "COOKIE",
      help => "the cookie (visible in the process list: prefer --cookie-file or "
              "BEAMDIAG_COOKIE)"};
option(cookie_file) ->
    #{key => cookie_file, long => "--cookie-file", type => string, metavar => "FILE",
      help => "file holding the cookie (default ~/.erlang.cookie)"};
option(duration) ->
    #{key => duration, long => "--duration", type => {float, 0.2, float(beamdiag_opts:max_seconds(window))}, default => 10.0,
      metavar => "SECONDS", help => "length of the window"};
option(interval) ->
    #{key => interval, long => "--interval", type => {integer, 10, 60000}, default => 1000,
      metavar => "MS", help => "time between samples"};
option(slack) ->
    #{key => slack, long => "--slack", type => {float, 0.0, float(beamdiag_opts:max_seconds(window))}, default => 1.5,
      metavar => "SECONDS",
      help => "the report is due SECONDS after the window, counted from the start; "
              "a node whose ticks come later (throttled, overloaded) is reported on "
              "from the ticks that came, marked partial"};
option(json) ->
    #{key => json, long => "--json", type => boolean, default => false,
      help => "print JSON instead of text"};
option(out) ->
    #{key => out, long => "--out", type => string, metavar => "FILE",
      help => "write the report to FILE instead of standard output"};
option(html) ->
    #{key => html, long => "--html", type => string, metavar => "FILE",
      help => "also write a self-contained HTML report to FILE"};
option(save) ->
    #{key => save, long => "--save", type => string, metavar => "FILE",
      help => "also save the whole capture to FILE (beamdiag report FILE re-renders it)"};
option(fail_on) ->
    #{key => fail_on, long => "--fail-on", type => ?SEVERITY,
      help => "exit 1 when a finding is at least this severe"};
option(erlang) ->
    #{key => erlang, long => "--erlang", type => boolean, default => false,
      help => "also sample Erlang stacks over the window (no perf needed); the top "
              "process's hot stacks join TOP PROCESSES"}.

%% @doc An option's former name, kept for one release: parsed as the option
%% `New' names (a shared name or an option of the command's own), left out
%% of `--help'.
-spec deprecated(string(), name() | beamdiag_cli:option()) -> beamdiag_cli:option().
deprecated(Long, New) ->
    O = #{long := NewLong} = entry(New),
    O#{long => Long, replaced_by => NewLong}.

%%%===================================================================
%%% Internal
%%%===================================================================

entry(Name) when is_atom(Name) -> option(Name);
entry({Name, Help = [C | _]}) when is_atom(Name), is_integer(C) -> (option(Name))#{help => Help};
entry({Name, Fields}) when is_atom(Name), is_map(Fields) -> maps:merge(option(Name), Fields);
entry(Own) when is_map(Own) -> Own.
