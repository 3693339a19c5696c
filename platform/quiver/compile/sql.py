"""The SQL compiler shared by every SQL target: IR view → tile, last-value, quarantine and stats queries.

This module is the ONLY place that maps the fn table of `catalog/aggregations.py` to SQL: `TILE_OPS`
(per-event partials), `MERGE_OPS` (partials across tiles) and `FINALIZE` (merged partials → value). A target
(`compile/duckdb.py`, `compile/spark.py`) is a `Dialect`: quoting, types, epoch-µs conversion, structs,
parameter markers, output ordering. Nothing here imports an engine.

Queries read the source as a table named after the source (the runner registers its Parquet files under
that name) and take two parameters, `start_us` and `end_us` (epoch µs): events with
`start_us <= event time < end_us`. Result columns follow `offline/layout.py`, plus `__date` (the UTC day of
the row: the partition it is written to). Rows with a null join key or a null event time never reach tiles
or last values; `compile_quarantine` returns them and `compile_stats` counts them.

Merging and finalizing (for point-in-time joins and the online reader):

    merge_exprs(d, partial, when=...)   aggregate expressions that merge one partial column over tile rows
    finalize_expr(d, agg, ref=...)      the feature value from merged partials, with the documented identity
                                        for empty windows: count 0, sum 0, every other fn NULL

`compile_values_at_boundary` shows them working together: feature values as of a tile-aligned time from
tiles alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from quiver.catalog.aggregations import (
    AGG_FUNCTIONS,
    EVENTS_COLUMN,
    PARTIALS,
    TILE_START,
    PartialColumn,
    last_ts_column,
    output_dtype,
    partial_column,
    view_partials,
)
from quiver.catalog.errors import QuiverError
from quiver.catalog.ir import AggSpec, CheckSpec, ViewSpec
from quiver.catalog.types import Int64
from quiver.compile.contracts import NOW_PARAM, reason_sql

START_PARAM: Final = "start_us"
END_PARAM: Final = "end_us"
AS_OF_PARAM: Final = "as_of_us"
DATE_COLUMN: Final = "__date"  # partition column of every written result; the writer turns it into date=…
EVENT_TS: Final = "event_ts"  # same name as offline.layout.EVENT_TS; compile must not import a store
REASON_COLUMN: Final = "quarantine_reason"
NULL_KEY: Final = "null_key"
NULL_EVENT_TS: Final = "null_event_ts"
_TS_US = "__ts_us"

# ---- the three tables: fn-table ops → SQL. {x}: input, {p}: partial, {t}: time, {s}: struct(t, v),
# {w}: an optional extra condition

# Per-event aggregate of each tile_op; {x} is the input already cast to the partial's dtype.
TILE_OPS: Final[Mapping[str, str]] = {
    "count": "count({x})",
    "sum": "sum({x})",
    "sumsq": "sum({x} * {x})",
    "min": "min({x})",
    "max": "max({x})",
    # Greatest (event time, value) among non-null values: newest wins, ties take the greatest value.
    "last": "max(CASE WHEN {x} IS NOT NULL THEN {s} END)",
}

# Aggregate of each merge_op over rows of partials; {p} is the partial (already filtered by the window).
MERGE_OPS: Final[Mapping[str, str]] = {
    "sum": "sum({p})",
    "min": "min({p})",
    "max": "max({p})",
    "last": "max(CASE WHEN {t} IS NOT NULL{w} THEN {s} END)",  # struct of (last_ts, last)
}

# Feature value from merged partials ({cnt}, {sum}, … name the partial kinds the fn reads).
FINALIZE: Final[Mapping[str, str]] = {
    "count": "coalesce({cnt}, 0)",
    "sum": "coalesce({sum}, 0)",
    "mean": "CASE WHEN {cnt} > 0 THEN {sum} / {cnt} END",
    "min": "{min}",
    "max": "{max}",
    "last": "{last}",
    # Sample variance from sum and sum of squares; rounding can make it a hair below 0, so clamp.
    "stddev": "CASE WHEN {cnt} >= 2 THEN sqrt(greatest(({sumsq} - {sum} * {sum} / {cnt}) / ({cnt} - 1), 0)) END",
}


@dataclass(frozen=True)
class Dialect:
    """How one SQL engine spells the few things that differ. Templates use `str.format` fields."""

    name: str
    quote_char: str
    types: Mapping[str, str]  # logical dtype → SQL type
    param: str  # {name} → a named parameter marker
    epoch_us: str  # {ts} timestamp → BIGINT epoch µs
    timestamp_from_us: str  # {us} epoch µs → UTC timestamp
    date_from_us: str  # {us} epoch µs → DATE (UTC)
    struct: str  # {t}, {v} → a struct ordered by t, then v
    field: str  # {s}, {f} → field f of struct s
    order_by: str  # {date}, {cols} → how a result is ordered for writing
    backslash_escapes: bool = False  # whether \ escapes inside '…' (Spark's default)
    is_nan: str = "isnan({x})"  # {x} → whether a DOUBLE is NaN

    def quote(self, name: str) -> str:
        """`name` as a quoted identifier (the validator refuses unsafe names; quote anyway)."""
        q = self.quote_char
        return q + name.replace(q, q + q) + q

    def string(self, value: str) -> str:
        """`value` as a string literal."""
        if self.backslash_escapes:
            return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
        return "'" + value.replace("'", "''") + "'"

    def cast(self, expr: str, dtype: str) -> str:
        return f"CAST({expr} AS {self.types[dtype]})"

    def p(self, name: str) -> str:
        """A named query parameter."""
        return self.param.format(name=name)


# ---- expression builders (pure; other compilers and the PIT join import these) ----


def tile_exprs(d: Dialect, view: ViewSpec, ts_us: str) -> list[tuple[str, str]]:
    """(column, aggregate SQL) computing `n_events` and every partial of `view` over raw event rows.

    Input columns are referenced by their source names (already cast to their logical dtypes); `ts_us`
    is the SQL of the event time in epoch µs. A `last` partial comes out as the winning struct (t, v)
    under `<col>__last`; `last_struct_fields` turns it into `<col>__last` and `<col>__last_ts`.
    """
    out = [(EVENTS_COLUMN, "count(*)")]
    for partial in _partials(view):
        op = partial.partial.tile_op
        x = d.quote(partial.column)
        if op != "count" and partial.dtype != partial.input_dtype:
            x = d.cast(x, partial.dtype)  # bool → DOUBLE for sums, → BIGINT for min/max/last
        struct = d.struct.format(t=ts_us, v=x)
        out.append((partial.name, TILE_OPS[op].format(x=x, s=struct)))
    return out


def merge_exprs(d: Dialect, partial: PartialColumn, when: str | None = None,
                ref: Callable[[str], str] | None = None) -> list[tuple[str, str]]:
    """(column, aggregate SQL) merging one partial column over rows that hold partials (tiles).

    `when`: an optional SQL condition selecting the rows to merge (e.g. a window on `tile_start`), so one
    GROUP BY can merge several windows. `ref(column)` gives the SQL that reads a partial column of a row
    (default: the quoted name). Most partials give one column; `last` gives two, `<col>__last` and
    `<col>__last_ts`, from the row with the greatest (last_ts, last). Merging no rows gives NULL; the
    finalize step turns that into the fn's identity.
    """
    ref = ref or d.quote
    op = partial.partial.merge_op
    if op != "last":
        value = ref(partial.name) if when is None else f"CASE WHEN {when} THEN {ref(partial.name)} END"
        merged = MERGE_OPS[op].format(p=value)
        if op == "sum" and partial.dtype == Int64:
            merged = d.cast(merged, Int64)  # DuckDB widens sum(BIGINT) to HUGEINT; keep the partial's type
        return [(partial.name, merged)]
    ts_col = last_ts_column(partial.column)
    struct = d.struct.format(t=ref(ts_col), v=ref(partial.name))
    agg = MERGE_OPS["last"].format(t=ref(ts_col), s=struct, w="" if when is None else f" AND ({when})")
    return [(partial.name, d.field.format(s=agg, f="v")), (ts_col, d.field.format(s=agg, f="t"))]


def finalize_expr(d: Dialect, agg: AggSpec, ref: Callable[[str], str] | None = None) -> str:
    """SQL of the value of `agg` from its merged partials.

    `ref(partial_column)` gives the SQL of a merged partial (e.g. `amount__cnt`; default: the quoted
    name). Results: count → BIGINT, 0 when empty; sum → DOUBLE, 0 when empty; mean → sum/cnt or NULL;
    min/max/last → the value or NULL (bool min/max as BIGINT, bool last as BOOLEAN); stddev → sample
    standard deviation, NULL below 2 values, tiny negative variance clamped to 0.
    """
    ref = ref or d.quote
    fn = AGG_FUNCTIONS[agg.fn]
    names = {kind: ref(partial_column(agg.column, kind)) for kind in fn.partials}
    expr = FINALIZE[fn.finalize].format(**names)
    out = output_dtype(agg.fn, agg.input_dtype)
    # A fn's value comes from its last-listed partial; only bool `last` (stored as BIGINT) needs a cast.
    stored = _partial_dtype(agg, fn.partials[-1])
    return d.cast(expr, out) if stored != out else expr


def last_struct_fields(d: Dialect, partial: PartialColumn, struct_ref: str) -> list[tuple[str, str]]:
    """(column, SQL) of a `last` partial's value and event time from its winning struct."""
    return [(partial.name, d.field.format(s=struct_ref, f="v")),
            (last_ts_column(partial.column), d.field.format(s=struct_ref, f="t"))]


# ---- whole queries ----


def compile_view(d: Dialect, view: ViewSpec) -> dict[str, str]:
    """Every query of a view: its main kind (tiles or last_values), quarantine and stats."""
    main = compile_tiles(d, view) if view.kind == "agg" else compile_last_values(d, view)
    return {main_kind(view): main, "quarantine": compile_quarantine(d, view),
            "stats": compile_stats(d, view)}


def main_kind(view: ViewSpec) -> str:
    """'tiles' for aggregation views, 'last_values' for last-value views (the offline layout's folders)."""
    return "tiles" if view.kind == "agg" else "last_values"


def compile_tiles(d: Dialect, view: ViewSpec) -> str:
    """Tiles of an aggregation view: one row per (keys, tile_start) with n_events and every partial."""
    if view.kind != "agg" or not view.tile_us:
        raise ValueError(f"view {view.name!r} has no aggregations to tile")
    _check_names(view)
    q = d.quote
    keys = [q(k) for k in view.key_names]
    ts_us = q(_TS_US)
    events = _events_cte(d, view, tile_us=view.tile_us)
    aggregates = tile_exprs(d, view, ts_us)
    tiles_cols = [(k, k) for k in keys] + [(q(TILE_START), q(TILE_START))]
    tiles_cols += [(expr, q(name)) for name, expr in aggregates]
    final = [(k, k) for k in keys] + [(q(TILE_START), q(TILE_START)), (q(EVENTS_COLUMN), q(EVENTS_COLUMN))]
    for partial in _partials(view):
        if partial.partial.kind == "last":
            final += [(expr, q(name)) for name, expr in last_struct_fields(d, partial, q(partial.name))]
        else:
            final.append((q(partial.name), q(partial.name)))
    final.append((d.date_from_us.format(us=q(TILE_START)), q(DATE_COLUMN)))
    group = ", ".join([*keys, q(TILE_START)])
    return "\n".join([
        _header(d, view, "tiles"),
        f"WITH {q('events')} AS (",
        _indent(events),
        f"), {q('tiles')} AS (",
        _indent(_select(tiles_cols) + f"\nFROM {q('events')}\nGROUP BY {group}"),
        ")",
        _select(final),
        f"FROM {q('tiles')}",
        d.order_by.format(date=q(DATE_COLUMN), cols=", ".join([q(DATE_COLUMN), *keys, q(TILE_START)])),
    ]) + "\n"


def compile_last_values(d: Dialect, view: ViewSpec) -> str:
    """The projected event log of a last-value view: one row per (keys, event_ts), ties broken by the
    greatest field values in field order (NULL lowest)."""
    if view.kind != "last":
        raise ValueError(f"view {view.name!r} has no last-value fields")
    _check_names(view)
    q = d.quote
    keys = [q(k) for k in view.key_names]
    ts_us = q(_TS_US)
    fields = [(d.cast(q(f.column), f.dtype), q(f.name)) for f in view.fields]
    events = _events_cte(d, view, fields=fields)
    order = ", ".join(f"{q(f.name)} DESC NULLS LAST" for f in view.fields)
    rank = f"row_number() OVER (PARTITION BY {', '.join([*keys, ts_us])} ORDER BY {order})"
    final = [(k, k) for k in keys] + [(d.timestamp_from_us.format(us=ts_us), q(EVENT_TS))]
    final += [(q(f.name), q(f.name)) for f in view.fields]
    final.append((d.date_from_us.format(us=ts_us), q(DATE_COLUMN)))
    return "\n".join([
        _header(d, view, "last_values"),
        f"WITH {q('events')} AS (",
        _indent(events),
        f"), {q('ranked')} AS (",
        _indent(f"SELECT *, {rank} AS {q('__rank')}\nFROM {q('events')}"),
        ")",
        _select(final),
        f"FROM {q('ranked')}",
        f"WHERE {q('__rank')} = 1",
        d.order_by.format(date=q(DATE_COLUMN), cols=", ".join([q(DATE_COLUMN), *keys, q(EVENT_TS)])),
    ]) + "\n"


def compile_quarantine(d: Dialect, view: ViewSpec) -> str:
    """Source rows the view skips, with their reason: a null event time anywhere in the source; with a
    contract, a row whose first failing check puts its event time beyond the clock, anywhere too; in
    range, any other failing check, or a null join key.

    Columns keep their source names and logical types (the view's columns, then the contract's others);
    `__date` is NULL for rows without a usable event time.
    """
    q = d.quote
    ts = q(view.timestamp_field)
    cols = [(d.cast(q(name), dtype), q(name)) for name, dtype in quarantine_columns(view)]
    day = d.date_from_us.format(us=d.epoch_us.format(ts=ts))
    if view.contract is None:
        reason = f"CASE WHEN {ts} IS NULL THEN '{NULL_EVENT_TS}' ELSE '{NULL_KEY}' END"
        cols += [(reason, q(REASON_COLUMN)), (day, q(DATE_COLUMN))]
        return "\n".join([
            _header(d, view, "quarantine"),
            _select(cols),
            f"FROM {q(view.source)}",
            f"WHERE {ts} IS NULL",
            f"   OR ({_in_range(d, ts)} AND ({_any_key_null(d, view)}))",
        ]) + "\n"
    failed = q("__reason")
    undated = " OR ".join(f"{failed} = {d.string(c.reason)}" for c in _undated_checks(view))
    if undated:
        day = f"CASE WHEN {failed} IS NULL OR NOT ({undated}) THEN {day} END"
    reason = f"CASE WHEN {ts} IS NULL THEN '{NULL_EVENT_TS}' ELSE coalesce({failed}, '{NULL_KEY}') END"
    cols += [(reason, q(REASON_COLUMN)), (day, q(DATE_COLUMN))]
    rows = f"SELECT *, {reason_sql(d, view.contract, d.p(NOW_PARAM))} AS {failed}\nFROM {q(view.source)}"
    return "\n".join([
        _header(d, view, "quarantine"),
        f"WITH {q('checked')} AS (",
        _indent(rows),
        ")",
        _select(cols),
        f"FROM {q('checked')}",
        f"WHERE {ts} IS NULL",
        *([f"   OR {undated}"] if undated else []),
        f"   OR ({_in_range(d, ts)} AND ({failed} IS NOT NULL OR {_any_key_null(d, view)}))",
    ]) + "\n"


def compile_stats(d: Dialect, view: ViewSpec) -> str:
    """One row: events_in_range (refused rows included), null_keys (in range, otherwise valid), null_event_ts
    (anywhere) and, with a contract, one column per check named by its reason: the rows it refused (in
    range; a check on the event time's future: anywhere), each row under its first failing check."""
    q = d.quote
    ts = q(view.timestamp_field)
    in_range = _in_range(d, ts)
    if view.contract is None:
        cols = [
            (f"count(*) FILTER (WHERE {in_range})", q("events_in_range")),
            (f"count(*) FILTER (WHERE {in_range} AND ({_any_key_null(d, view)}))", q("null_keys")),
            (f"count(*) FILTER (WHERE {ts} IS NULL)", q("null_event_ts")),
        ]
        return "\n".join([_header(d, view, "stats"), _select(cols), f"FROM {q(view.source)}"]) + "\n"
    clock = d.p(NOW_PARAM)
    inner = [(in_range, q("__in_range")), (f"{ts} IS NULL", q("__null_ts")),
             (f"({_any_key_null(d, view)})", q("__null_key")),
             (f"CASE WHEN {ts} IS NOT NULL THEN {reason_sql(d, view.contract, clock)} END", q("__reason"))]
    reason, inside = q("__reason"), q("__in_range")
    cols = [(f"count(*) FILTER (WHERE {inside})", q("events_in_range")),
            (f"count(*) FILTER (WHERE {inside} AND {reason} IS NULL AND {q('__null_key')})", q("null_keys")),
            (f"count(*) FILTER (WHERE {q('__null_ts')})", q("null_event_ts"))]
    undated = {c.reason for c in _undated_checks(view)}
    for check in view.contract.checks:
        where = f"{reason} = {d.string(check.reason)}"
        cols.append((f"count(*) FILTER (WHERE {where if check.reason in undated else f'{inside} AND {where}'})",
                     q(check.reason)))
    return "\n".join([_header(d, view, "stats"), f"WITH {q('rows')} AS (",
                      _indent(_select(inner) + f"\nFROM {q(view.source)}"), ")", _select(cols),
                      f"FROM {q('rows')}"]) + "\n"


def quarantine_columns(view: ViewSpec) -> list[tuple[str, str]]:
    """(column, dtype) of a view's quarantined rows: what it reads, then the other columns its contract checks."""
    columns = dict(view.source_columns)
    for check in view.contract.checks if view.contract else ():
        columns.setdefault(check.column, check.dtype)
    return list(columns.items())


def query_params(view: ViewSpec, start_us: int, end_us: int, now_us: int | None = None) -> dict[str, int]:
    """The parameters of a view's queries: the range, and the clock (default now) when its contract reads it."""
    params = {START_PARAM: start_us, END_PARAM: end_us}
    if view.contract is not None and view.contract.uses_clock:
        params[NOW_PARAM] = time.time_ns() // 1000 if now_us is None else now_us
    return params


def compile_values_at_boundary(d: Dialect, view: ViewSpec, tiles_table: str = "tiles") -> str:
    """Every aggregation's value per entity as of `as_of_us` from tiles alone.

    Exact only when `as_of_us` is a multiple of the view's tile size: then each window
    `[as_of - w, as_of)` is made of whole tiles. At other times the point-in-time join adds the raw head
    events `[floor_g(t), t)`; this query shows how `merge_exprs` and `finalize_expr` compose.
    """
    if view.kind != "agg":
        raise ValueError(f"view {view.name!r} has no aggregations")
    q = d.quote
    keys = [q(k) for k in view.key_names]
    as_of = d.p(AS_OF_PARAM)
    windows = sorted({a.window_us for a in view.aggregations})
    merged: list[tuple[str, str]] = []
    for window in windows:
        when = f"{q(TILE_START)} >= {as_of} - {window}"
        for partial in _partials(view, [a for a in view.aggregations if a.window_us == window]):
            merged += [(expr, q(f"{name}__w{window}")) for name, expr in merge_exprs(d, partial, when)]
    values = [(k, k) for k in keys]
    for agg in view.aggregations:
        suffix = f"__w{agg.window_us}"
        values.append((finalize_expr(d, agg, lambda column: q(column + suffix)), q(agg.name)))  # noqa: B023
    return "\n".join([
        f"-- Quiver feature values of view {q(view.name)} as of {as_of} (tile-aligned) from its tiles;"
        f" target {d.name}.",
        f"WITH {q('merged')} AS (",
        _indent(_select([(k, k) for k in keys] + merged) + f"\nFROM {q(tiles_table)}"
                f"\nWHERE {q(TILE_START)} >= {as_of} - {windows[-1]} AND {q(TILE_START)} < {as_of}"
                f"\nGROUP BY {', '.join(keys)}"),
        ")",
        _select(values),
        f"FROM {q('merged')}",
        f"ORDER BY {', '.join(keys)}",
    ]) + "\n"


# ---- helpers ----


def _check_names(view: ViewSpec) -> None:
    # Generated queries name their helper columns __…; a user column of that shape could collide.
    names = view.key_names + view.feature_names + [c for c, _ in view.source_columns]
    clashes = sorted({n for n in names if n.startswith("__")})
    if clashes:
        raise QuiverError(f"{view.location}: feature view {view.name!r}: names starting with '__' are "
                          f"reserved for generated columns: {', '.join(clashes)}")


def _partials(view: ViewSpec, aggs: list[AggSpec] | None = None) -> list[PartialColumn]:
    chosen = view.aggregations if aggs is None else aggs
    return view_partials([(a.column, a.fn, a.input_dtype) for a in chosen])


def _partial_dtype(agg: AggSpec, kind: str) -> str:
    partial = PartialColumn(partial_column(agg.column, kind), agg.column, PARTIALS[kind], agg.input_dtype)
    return partial.dtype


def _events_cte(d: Dialect, view: ViewSpec, tile_us: int | None = None,
                fields: list[tuple[str, str]] | None = None) -> str:
    """Events in range with non-null keys: keys, event time in µs, tile start (when tiling), inputs."""
    q = d.quote
    ts = q(view.timestamp_field)
    epoch = d.epoch_us.format(ts=ts)
    cols = [(d.cast(q(k), t), q(k)) for k, t in view.keys]
    cols.append((epoch, q(_TS_US)))
    if tile_us:
        cols.append((floor_to(epoch, tile_us), q(TILE_START)))
    if fields is None:
        inputs = dict.fromkeys(a.column for a in view.aggregations)
        dtypes = {a.column: a.input_dtype for a in view.aggregations}
        fields = [(d.cast(q(c), dtypes[c]), q(c)) for c in inputs if c not in view.key_names]
    cols += fields
    not_null = " AND ".join(f"{q(k)} IS NOT NULL" for k in view.key_names)
    where = f"\nFROM {q(view.source)}\nWHERE {_in_range(d, ts)}\n  AND {not_null}"
    if view.contract is not None:  # a row failing its source's contract never reaches a tile or last value
        where += f"\n  AND {reason_sql(d, view.contract, d.p(NOW_PARAM))} IS NULL"
    return _select(cols) + where


def floor_to(epoch: str, step: int) -> str:
    """SQL flooring an epoch-µs expression to a multiple of `step`, toward the past also before 1970.

    SQL's `%` (DuckDB, Spark, Flink) truncates toward zero, so `x - x % g` would put a pre-1970 event in
    the tile after its own; `((x % g) + g) % g` is the floor modulo (what numpy's `%` and Spark's pmod give).
    """
    return f"{epoch} - (({epoch} % {step}) + {step}) % {step}"


def _in_range(d: Dialect, ts: str) -> str:
    # Compare the raw timestamp (not its µs) so engines push the range into the Parquet scan.
    start = d.timestamp_from_us.format(us=d.p(START_PARAM))
    end = d.timestamp_from_us.format(us=d.p(END_PARAM))
    return f"{ts} >= {start} AND {ts} < {end}"


def _undated_checks(view: ViewSpec) -> list[CheckSpec]:
    """Checks that, failed first, make a row's event time unusable (beyond the clock): such a row is judged
    anywhere in the source, like one without an event time."""
    checks = view.contract.checks if view.contract else ()
    return [c for c in checks if c.rule == "future" and c.column == view.timestamp_field]


def _any_key_null(d: Dialect, view: ViewSpec) -> str:
    return " OR ".join(f"{d.quote(k)} IS NULL" for k in view.key_names)


def _select(cols: list[tuple[str, str]]) -> str:
    lines = [expr if expr == alias else f"{expr} AS {alias}" for expr, alias in cols]
    return "SELECT\n" + ",\n".join(f"  {line}" for line in lines)


def _indent(text: str) -> str:
    return "\n".join(f"  {line}" if line else line for line in text.splitlines())


def _header(d: Dialect, view: ViewSpec, kind: str) -> str:
    start, end = d.p(START_PARAM), d.p(END_PARAM)
    return (f"-- Quiver {kind} of feature view {d.quote(view.name)}, target {d.name}; generated, do not edit.\n"
            f"-- Parameters {start}, {end}: epoch microseconds; events with {start} <= event time < {end}.")


