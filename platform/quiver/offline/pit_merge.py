"""Merged window partials per label row, and their finalization, by the rules of compile.aggregations.

Both PIT engines end here: the embedded engine merges tiles and head events into `Merged`, the Spark engine
collects its merged partials into one, and `finalize` turns it into feature values. The rules are read from
`AGG_FUNCTIONS` (which partials, which finalize) and `PARTIALS` (how two partials merge); none is restated.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from quiver.compile.aggregations import AGG_FUNCTIONS, PARTIALS
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


def finalize(fn: str, merged: Merged, dtype: str) -> pa.Array:
    """The value of `fn` from merged partials, as an Arrow array of the feature's logical `dtype`.

    Empty windows (cnt 0) give count 0 and sum 0, and null otherwise; stddev is the sample deviation
    (null below two values), from sum and sum of squares, clamped at 0 against rounding.
    """
    rule = AGG_FUNCTIONS[fn].finalize
    cnt = merged.cnt
    empty = cnt == 0
    kind = arrow_type(dtype)
    with np.errstate(divide="ignore", invalid="ignore"):
        if rule == "count":
            return pa.array(cnt.astype(np.int64), kind)
        if rule == "sum":
            return pa.array(np.where(empty, 0.0, merged.get("sum")), kind)
        if rule == "mean":
            return pa.array(merged.get("sum") / np.where(empty, 1, cnt), kind, mask=empty)
        if rule in ("min", "max"):
            values = merged.get(rule)
            return pa.array(values.astype(kind.to_pandas_dtype()), kind, mask=empty)
        if rule == "last":
            return pc.cast(merged.values["last"], kind)
        if rule == "stddev":
            n = cnt.astype(np.float64)
            total, squares = merged.get("sum"), merged.get("sumsq")
            var = (squares - total * total / np.where(empty, 1, n)) / np.maximum(n - 1, 1)
            return pa.array(np.sqrt(np.maximum(var, 0.0)), kind, mask=cnt < 2)
    raise ValueError(f"no finalize rule {rule!r} for fn {fn!r}")
