"""Merged window partials per label row, and their finalization — by the project's one rule set.

Both PIT engines end here: each produces `Merged` partials for the whole tiles of a window and for its
head events, `combine` merges the two by `PARTIALS[kind].merge_op` (catalog.aggregations), and `finalize`
evaluates compile.sql's FINALIZE expressions (the SQL the backfill and the online reader share) in DuckDB.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from quiver.catalog.aggregations import AGG_FUNCTIONS, PARTIALS, output_dtype, partial_column
from quiver.catalog.ir import AggSpec
from quiver.offline.layout import arrow_type


@dataclass
class Merged:
    """One column's partials merged over one window; one entry per label row.

    `cnt` counts non-null values; `values` holds the other partials by kind: sum/sumsq float64 arrays,
    min/max numpy arrays (meaningful where cnt > 0), last a pyarrow array (null where cnt == 0).
    """

    cnt: np.ndarray
    values: dict[str, np.ndarray | pa.Array] = field(default_factory=dict)

    def get(self, kind: str) -> np.ndarray:
        return np.asarray(self.values[kind])


def partial_kinds(fns: list[str]) -> list[str]:
    """The partial kinds (besides cnt) that `fns` read, in a stable order."""
    kinds: list[str] = []
    for fn in fns:
        kinds += [k for k in AGG_FUNCTIONS[fn].partials if k != "cnt" and k not in kinds]
    return kinds


def combine(older: Merged, newer: Merged) -> Merged:
    """Merge two windows' partials (older: whole tiles; newer: the head events after them)."""
    out = Merged(older.cnt + newer.cnt)
    has_old, has_new = older.cnt > 0, newer.cnt > 0
    for kind, old in older.values.items():
        new = newer.values[kind]
        op = PARTIALS[kind].merge_op
        if op == "sum":
            out.values[kind] = np.asarray(old) + np.asarray(new)
        elif op in ("min", "max"):
            a, b = np.asarray(old), np.asarray(new)
            if np.issubdtype(a.dtype, np.floating):
                both = np.fmin(a, b) if op == "min" else np.maximum(a, b)
            else:
                both = np.minimum(a, b) if op == "min" else np.maximum(a, b)
            out.values[kind] = np.where(has_old & has_new, both, np.where(has_new, b, a))
        elif op == "last":  # the head is newer than every whole tile
            out.values[kind] = pc.if_else(pa.array(has_new), new, old)
        else:
            raise ValueError(f"unknown merge op {op!r} of partial {kind!r}")
    return out


def finalize(aggs: list[AggSpec], merged: Merged) -> dict[str, pa.Array]:
    """Values of `aggs` (all of one column and window) from their merged partials.

    The rules are compile.sql's FINALIZE — the SQL every engine shares — run by DuckDB over the merged
    partials: count 0 and sum 0 for empty windows, null otherwise; stddev is the sample deviation (null
    below two values) from sum and sum of squares, clamped at 0 against rounding.
    """
    from quiver.compile import dialect_for
    from quiver.compile.sql import finalize_expr

    d = dialect_for("duckdb")
    column = aggs[0].column
    empty = merged.cnt == 0
    columns: dict[str, pa.Array] = {partial_column(column, "cnt"): pa.array(merged.cnt, pa.int64())}
    for kind, values in merged.values.items():
        if kind == "last":
            columns[partial_column(column, kind)] = values  # null already where the window is empty
        else:
            columns[partial_column(column, kind)] = pa.array(values, mask=empty if kind in ("min", "max") else None)
    select = ", ".join(f"{finalize_expr(d, agg)} AS {d.quote(agg.name)}" for agg in aggs)
    con = _database().cursor()  # a connection of its own (thread-safe), without a new database's setup
    try:
        con.register("merged", pa.table(columns))
        result = con.sql(f"SELECT {select} FROM merged").to_arrow_table()
    finally:
        con.close()
    return {agg.name: pc.cast(result[agg.name].combine_chunks(), arrow_type(output_dtype(agg.fn, agg.input_dtype)))
            for agg in aggs}


_DATABASE: tuple[int, Any] | None = None  # (the process that opened it, the connection)
_DATABASE_LOCK = threading.Lock()


def _database() -> Any:
    """One in-memory DuckDB database for every finalize of the process: opening a database costs 15-30 ms,
    a cursor on it (its own connection, safe in its own thread) about 20 µs. A forked child opens its own:
    DuckDB's threads and locks do not survive a fork."""
    global _DATABASE
    with _DATABASE_LOCK:
        if _DATABASE is None or _DATABASE[0] != os.getpid():
            import duckdb

            _DATABASE = (os.getpid(), duckdb.connect(":memory:"))
        return _DATABASE[1]
