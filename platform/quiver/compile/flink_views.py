"""Per-view statements of the Flink SQL target (`quiver.compile.flink`): tiles (GROUP BY keys and tile, the
partials of the fn table) and last values (top-1 per entity), each into its sink."""

from __future__ import annotations

from typing import Final

from quiver.catalog.aggregations import (
    EVENTS_COLUMN,
    TILE_START,
    PartialColumn,
    last_ts_column,
    view_partials,
)
from quiver.catalog.ir import ViewSpec
from quiver.compile.flink_sql import (
    BATCH_FIELD,
    NEWEST,
    TS_US,
    TYPES,
    FlinkTarget,
    create_table,
    indent,
    quote,
    select_list,
    sink_table,
    view_sink,
)
from quiver.compile.sql import TILE_OPS

_TS_DIGITS: Final = 19  # epoch µs as fixed-width digits, so string order is time order
_INT_OFFSET: Final = "CAST('9223372036854775808' AS DECIMAL(20, 0))"
_FLOAT_OFFSET: Final = "CAST('10000000000000000000' AS DECIMAL(20, 0))"
_FLOAT_KEY: Final = 39
_NAN: Final = "CAST('NaN' AS DOUBLE)"


def tiles_sink(view: ViewSpec, target: FlinkTarget, marks: bool) -> str:
    lines = [f"{quote(k)} {TYPES[t]}" for k, t in view.keys] + ([f"{quote(BATCH_FIELD)} STRING"] if marks else [])
    lines += [f"{quote(TILE_START)} BIGINT", f"{quote(EVENTS_COLUMN)} BIGINT", f"{quote(NEWEST)} BIGINT"]
    for partial in _partials(view):
        lines.append(f"{quote(partial.name)} {TYPES[partial.dtype]}")
        if partial.partial.kind == "last":
            lines.append(f"{quote(last_ts_column(partial.column))} BIGINT")
    return create_table(sink_table("tiles", view.name), lines, view_sink(target, "tiles", view.name))


def _is_number(x: str) -> str:
    # False for NaN (and only NaN), null for null; Calcite does not fold it. Only ever used as a CASE
    # condition with the NaN case in ELSE: `NOT (...)` would be rewritten as `ABS(x) < 0`.
    return f"ABS({x}) >= 0"


def tiles_insert(view: ViewSpec, marks: bool) -> str:
    q = quote
    assert view.tile_us
    tile = view.tile_us
    keys = [q(k) for k in view.key_names] + ([q(BATCH_FIELD)] if marks else [])
    ts = q(TS_US)
    inputs = list(dict.fromkeys(a.column for a in view.aggregations if a.column not in view.key_names))
    events = [(k, k) for k in keys]
    events += [(f"{ts} - MOD(MOD({ts}, {tile}) + {tile}, {tile})", q(TILE_START)), (ts, ts)]  # floor
    events += [(q(c), q(c)) for c in inputs]
    aggregates = [("COUNT(*)", q(EVENTS_COLUMN)), (f"MAX({ts})", q(NEWEST))]
    final = [(k, k) for k in keys] + [(q(c), q(c)) for c in (TILE_START, EVENTS_COLUMN, NEWEST)]
    nan_counted: set[str] = set()
    for partial in _partials(view):
        x = q(partial.column)
        op = partial.partial.tile_op
        name = q(partial.name)
        if op != "count" and partial.dtype != partial.input_dtype:
            x = f"CAST({x} AS {TYPES[partial.dtype]})"  # bool → DOUBLE for sums, → BIGINT for min/max/last
        if op in ("min", "max") and partial.dtype == "float64":
            nans = q(f"{partial.column}__nan")
            if partial.column not in nan_counted:
                nan_counted.add(partial.column)
                aggregates.append((f"COUNT(CASE WHEN {_is_number(x)} THEN CAST(NULL AS DOUBLE) ELSE {x} END)", nans))
            aggregates.append((f"{op.upper()}(CASE WHEN {_is_number(x)} THEN {x} END)", name))
            if op == "max":  # NaN is the greatest value
                final.append((f"CASE WHEN {nans} > 0 THEN {_NAN} ELSE {name} END", name))
            else:  # ... and the least only when there is nothing else
                final.append((f"CASE WHEN {name} IS NULL AND {nans} > 0 THEN {_NAN} ELSE {name} END", name))
        elif op == "last":
            key = q(partial.name + "__key")
            aggregates.append((f"MAX(CASE WHEN {x} IS NOT NULL THEN {_last_key(x, partial.dtype)} END)", key))
            final += _last_decode(key, partial)
        else:
            aggregates.append((TILE_OPS[op].format(x=x, s=""), name))
            final.append((name, name))
    group = ", ".join([*keys, q(TILE_START)])
    return "\n".join([
        f"INSERT INTO {q(sink_table('tiles', view.name))}",
        select_list(final),
        "FROM (",
        indent(select_list([(k, k) for k in keys] + [(q(TILE_START), q(TILE_START))] + aggregates)),
        "  FROM (",
        indent(select_list(events), 2),
        indent(f"FROM {q(view.source + '__events')}", 2),
        "  )",
        f"  GROUP BY {group}",
        ")",
    ])


def _last_key(x: str, dtype: str) -> str:
    """A string whose order is (event time, value) order: fixed-width time, an order key, the value."""
    ts = f"LPAD(CAST({quote(TS_US)} AS STRING), {_TS_DIGITS}, '0')"
    if dtype == "string":
        return f"{ts} || {x}"
    if dtype == "int64":
        return f"{ts} || LPAD(CAST(CAST({x} AS DECIMAL(20, 0)) + {_INT_OFFSET} AS STRING), 20, '0')"
    # float64: a class digit (NaN 3, ≥ 1e19 2, finite 1, ≤ -1e19 0), the value rounded to 18 decimals
    # (offset to be positive) for the finite class, then its exact text.
    # The CASE inside the CAST keeps NaN and huge values away from the DECIMAL cast (it throws on them,
    # even as TRY_CAST, and Flink may evaluate it before the outer CASE picks a branch).
    finite = f"CASE WHEN {x} > -1e19 AND {x} < 1e19 THEN {x} ELSE 0 END"
    shifted = f"LPAD(CAST(CAST({finite} AS DECIMAL(38, 18)) + {_FLOAT_OFFSET} AS STRING), {_FLOAT_KEY}, '0')"
    zeros = "0" * _FLOAT_KEY
    order = (f"CASE WHEN {_is_number(x)} THEN (CASE WHEN {x} >= 1e19 THEN '2{zeros}' "
             f"WHEN {x} <= -1e19 THEN '0{zeros}' ELSE '1' || {shifted} END) ELSE '3{zeros}' END")
    return f"{ts} || {order} || CAST({x} AS STRING)"


def _last_decode(key: str, partial: PartialColumn) -> list[tuple[str, str]]:
    value_at = _TS_DIGITS + 1
    if partial.dtype == "string":
        value = f"SUBSTR({key}, {value_at})"
    elif partial.dtype == "int64":
        value = f"CAST(CAST(SUBSTR({key}, {value_at}) AS DECIMAL(20, 0)) - {_INT_OFFSET} AS BIGINT)"
    else:
        value = f"CAST(SUBSTR({key}, {value_at + 1 + _FLOAT_KEY}) AS DOUBLE)"  # 'NaN' casts to NaN
    ts = f"CAST(SUBSTR({key}, 1, {_TS_DIGITS}) AS BIGINT)"
    return [(value, quote(partial.name)), (ts, quote(last_ts_column(partial.column)))]


def last_sink(view: ViewSpec, target: FlinkTarget, marks: bool) -> str:
    lines = [f"{quote(k)} {TYPES[t]}" for k, t in view.keys] + ([f"{quote(BATCH_FIELD)} STRING"] if marks else [])
    lines.append("`event_ts` BIGINT")
    lines += [f"{quote(f.name)} {TYPES[f.dtype]}" for f in view.fields]
    return create_table(sink_table("last", view.name), lines,
                         view_sink(target, "last", view.name))


def last_insert(view: ViewSpec, marks: bool) -> str:
    q = quote
    keys = [q(k) for k in view.key_names] + ([q(BATCH_FIELD)] if marks else [])
    fields = [(q(f.column), q(f.name)) for f in view.fields]
    order = ", ".join([f"{q(TS_US)} DESC", *(f"{q(f.column)} DESC NULLS LAST" for f in view.fields)])
    rank = f"ROW_NUMBER() OVER (PARTITION BY {', '.join(keys)} ORDER BY {order})"
    inner = [(k, k) for k in keys] + [(q(TS_US), "`event_ts`"), *fields, (rank, q("__rank"))]
    outer = [(k, k) for k in keys] + [("`event_ts`", "`event_ts`")] + [(q(f.name), q(f.name)) for f in view.fields]
    return "\n".join([
        f"INSERT INTO {q(sink_table('last', view.name))}",
        select_list(outer),
        "FROM (",
        indent(select_list(inner)),
        indent(f"FROM {q(view.source + '__events')}"),
        ")",
        f"WHERE {q('__rank')} = 1",
    ])


def _partials(view: ViewSpec) -> list[PartialColumn]:
    return view_partials([(a.column, a.fn, a.input_dtype) for a in view.aggregations])
