%%% @doc The HTML report's table engine: any JSON-able term (maps, lists,
%%% numbers, binaries, atoms) as HTML tables, which is how the report shows
%%% results it has no layout of its own for (compare, experiment, the
%%% process and lock extras, a finding's metrics, the host and VM totals).
%%%
%%% A map of scalars is a key-value table; a map whose values are all maps,
%%% and a list of maps, are one table with a row per entry and a column per
%%% key (the scalar columns first, those that name a row, such as `name'
%%% or `id', leading); other maps nest in `<details>'; a list of scalars is
%%% one line. Every table shows at most `max_rows/0' rows and 40 columns,
%%% nesting stops at depth 6, and every string is escaped and bounded
%%% (beamdiag_html_text). A whole diagnosis inside a result shows as its
%%% gist: node, window, CPUs used and findings.
%%%
%%% ```
%%% 1> iolist_to_binary(beamdiag_html_table:kv_table([{runs, 3}])).
%%% <<"<table class=\"kv\"><tbody><tr><th>runs</th><td><span class=\"n\">3</span></td></tr>\n</tbody></table>\n">>
%%% 2> iolist_to_binary(beamdiag_html_table:render([], 0)).
%%% <<"<p class=\"none\">none</p>">>
%%% '''
-module(beamdiag_html_table).

-export([render/2, kv_table/1, max_rows/0]).

-define(MAX_ROWS, 500).
-define(MAX_COLS, 40).
-define(MAX_DEPTH, 6).
%% Columns that name a row go first in generic tables.
-define(ID_KEYS, ["key", "name", "id", "type", "metric", "label", "variant", "workload"]).

%%%===================================================================
%%% API
%%%===================================================================

%% @doc A term as HTML, at a nesting depth (0 at the top; each level
%% nested deeper, and tables inside cells, count against the bound of 6,
%% past which the term is printed on one line).
-spec render(term(), non_neg_integer()) -> iodata().
render(#{capture := C, ledger := L, findings := F}, _Depth) when is_map(C), is_map(L), is_list(F) ->
    %% A whole diagnosis inside a result: its gist, not its samples.
    kv_table([{node, maps:get(node, C, null)}, {window_s, maps:get(window_s, L, null)},
              {cpus_used, maps:get(cpus_used, maps:get(totals, L, #{}), null)},
              {findings, iolist_to_binary(lists:join(", ", [[atom_to_binary(S), " ", to_bin(Id)]
                                                          || #{id := Id, severity := S} <- F]))}]);
render(V, Depth) when Depth > ?MAX_DEPTH ->
    ["<code>", cell_text(beamdiag_html_text:compact(V), 200), "</code>"];
render(M, Depth) when is_map(M), map_size(M) =:= 0 ->
    _ = Depth,
    "<p class=\"none\">empty</p>";
render(M, Depth) when is_map(M) ->
    Pairs = sorted_pairs(M),
    case table_of_maps(Pairs) of
        true ->
            rows_table([{K, V} || {K, V} <- Pairs], Depth);
        false ->
            {Scalars, Nested} = lists:partition(fun({_, V}) -> scalar(V) end, Pairs),
            [
                case Scalars of
                    [] -> "";
                    _ -> kv_table(Scalars)
                end,
                [["<details open class=\"nested\"><summary>", cell_text(key_text(K), 120),
                  "</summary>", render(V, Depth + 1), "</details>\n"]
                 || {K, V} <- lists:sublist(Nested, ?MAX_ROWS)]
            ]
    end;
render([], _Depth) ->
    "<p class=\"none\">none</p>";
render(L, Depth) when is_list(L) ->
    case io_lib:printable_unicode_list(L) of
        true ->
            ["<p>", beamdiag_html_text:bounded(L), "</p>"];
        false ->
            case lists:all(fun is_map/1, L) of
                true ->
                    rows_table([{I, M} || {I, M} <- lists:enumerate(L)], Depth, false);
                false ->
                    case lists:all(fun scalar/1, L) of
                        true -> ["<p>", scalar_list(L), "</p>"];
                        false -> ["<ol>", [["<li>", render(E, Depth + 1), "</li>"]
                                           || E <- lists:sublist(L, ?MAX_ROWS)], "</ol>"]
                    end
            end
    end;
render(V, _Depth) ->
    ["<p>", cell(V), "</p>"].

%% @doc Pairs as a two-column table, a key and its value a row, at most
%% `max_rows/0' of them.
-spec kv_table([{term(), term()}]) -> iodata().
kv_table(Pairs) ->
    ["<table class=\"kv\"><tbody>",
     [["<tr><th>", cell_text(key_text(K), 80), "</th><td>", cell(V), "</td></tr>\n"]
      || {K, V} <- lists:sublist(Pairs, ?MAX_ROWS)],
     "</tbody></table>\n"].

%% @doc The most rows any table of the report shows (500).
-spec max_rows() -> pos_integer().
max_rows() ->
    ?MAX_ROWS.

%%%===================================================================
%%% Internal
%%%===================================================================

%% A map whose values are all maps (of mostly scalars): one row per key.
table_of_maps(Pairs) ->
    length(Pairs) > 1 andalso
        lists:all(fun({_, V}) -> is_map(V) andalso map_size(V) > 0 andalso
                                     map_size(V) =< ?MAX_COLS end, Pairs) andalso
        lists:all(fun({_, V}) -> lists:any(fun scalar/1, maps:values(V)) end, Pairs).

rows_table(Rows, Depth) ->
    rows_table(Rows, Depth, true).

rows_table(Rows0, Depth, ShowKey) ->
    Rows = lists:sublist(Rows0, ?MAX_ROWS),
    Cols = columns([M || {_, M} <- Rows]),
    [
        "<table class=\"num\"><thead><tr>",
        case ShowKey of true -> "<th></th>"; false -> "" end,
        [["<th>", cell_text(key_text(C), 60), "</th>"] || C <- Cols],
        "</tr></thead><tbody>\n",
        [["<tr", case maps:get(significant, M, false) of true -> " class=\"sig\""; _ -> "" end, ">",
          case ShowKey of true -> ["<th>", cell_text(key_text(K), 80), "</th>"]; false -> "" end,
          [[td(V), nested_cell(V, Depth), "</td>"] || C <- Cols, V <- [maps:get(C, M, undefined)]],
          "</tr>\n"] || {K, M} <- Rows],
        "</tbody></table>\n",
        case length(Rows0) > ?MAX_ROWS of
            true -> ["<p class=\"help\">", integer_to_list(length(Rows0) - ?MAX_ROWS),
                     " more rows not shown.</p>"];
            false -> ""
        end
    ].

%% The union of the rows' keys: those with scalar values first, in the
%% order of first appearance, bounded.
columns(Maps) ->
    Keys = lists:foldl(fun(M, Acc) ->
                           Acc ++ [K || {K, _} <- sorted_pairs(M), not lists:member(K, Acc)]
                       end, [], lists:sublist(Maps, 50)),
    IsScalar = fun(K) -> lists:all(fun(M) -> scalar(maps:get(K, M, null)) end, Maps) end,
    {S, N} = lists:partition(IsScalar, Keys),
    {Ids, Rest} = lists:partition(fun(K) -> lists:member(key_text(K), ?ID_KEYS) end, S),
    lists:sublist(Ids ++ Rest ++ N, ?MAX_COLS).

%% Numbers right-aligned, text left.
td(V) when is_number(V) -> "<td>";
td({A, B}) when is_number(A), is_number(B) -> "<td>";
td(_) -> "<td class=\"t\">".

nested_cell(undefined, _) -> "";
nested_cell(V, Depth) ->
    case scalar(V) of
        true -> cell(V);
        false when Depth < 2 -> ["<div class=\"inner\">", render(V, Depth + 2), "</div>"];
        false -> ["<code>", cell_text(beamdiag_html_text:compact(V), 300), "</code>"]
    end.

sorted_pairs(M) ->
    lists:sort(fun({A, _}, {B, _}) -> key_text(A) =< key_text(B) end, maps:to_list(M)).

scalar(V) ->
    is_number(V) orelse is_atom(V) orelse is_binary(V) orelse
        (is_list(V) andalso V =/= [] andalso io_lib:printable_unicode_list(V)) orelse
        (is_list(V) andalso length(V) =< 8 andalso lists:all(fun is_number/1, V)) orelse
        (is_tuple(V) andalso tuple_size(V) =:= 2 andalso is_number(element(1, V)) andalso
         is_number(element(2, V))).

scalar_list(L) ->
    Shown = lists:sublist(L, 50),
    [lists:join(", ", [cell(E) || E <- Shown]),
     case length(L) > 50 of true -> [" &hellip; (", integer_to_list(length(L)), ")"]; false -> "" end].

cell(V) when is_float(V) -> ["<span class=\"n\">", beamdiag_html_text:float_text(V), "</span>"];
cell(V) when is_integer(V) -> ["<span class=\"n\">", integer_to_list(V), "</span>"];
cell(true) -> "true";
cell(false) -> "false";
cell(null) -> "&ndash;";
cell(undefined) -> "&ndash;";
cell(V) when is_atom(V) -> cell_text(atom_to_binary(V), 200);
cell(V) when is_binary(V) -> beamdiag_html_text:bounded(V);
cell(V) when is_list(V) ->
    case io_lib:printable_unicode_list(V) of
        true -> beamdiag_html_text:bounded(V);
        false when V =/= [] -> case lists:all(fun is_number/1, V) of
                                   true -> lists:join(", ", [cell(E) || E <- V]);
                                   false -> ["<code>", cell_text(beamdiag_html_text:compact(V), 300),
                                             "</code>"]
                               end;
        false -> ""
    end;
cell({Lo, Hi}) when is_number(Lo), is_number(Hi) -> ["[", cell(Lo), ", ", cell(Hi), "]"];
cell(V) -> ["<code>", cell_text(beamdiag_html_text:compact(V), 300), "</code>"].

cell_text(T, Max) ->
    beamdiag_html_text:bounded(T, Max).

to_bin(X) when is_atom(X) -> atom_to_binary(X);
to_bin(X) -> unicode:characters_to_binary(beamdiag_html_text:chars(X)).

key_text(K) when is_atom(K) -> atom_to_list(K);
key_text(K) when is_binary(K) -> beamdiag_html_text:chars(K);
key_text(K) when is_integer(K) -> integer_to_list(K);
key_text(K) when is_list(K) -> beamdiag_html_text:chars(K);
key_text(K) -> beamdiag_html_text:compact(K).
