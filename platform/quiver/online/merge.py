"""Merge tile partials into window values with numpy, following the one table in catalog/aggregations.py.

The table names the partials of each fn, their `merge_op` and the `finalize` rule; this module only says
how each named op runs on arrays. Records arrive grouped by entity (`seg`: the entity of each record,
non-decreasing), so every merge is a segmented reduction (bincount / ufunc.reduceat), no Python loop per
entity except for string `last` partials.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from quiver.catalog.aggregations import AGG_FUNCTIONS, PARTIALS, last_ts_column, output_dtype, partial_column
from quiver.catalog.ir import AggSpec, ViewSpec
from quiver.online.base import Column

_INT_MIN = np.iinfo(np.int64).min
_INT_MAX = np.iinfo(np.int64).max


class Segments:
    """Records grouped by entity: `seg[i]` is the entity (0…n-1) of record i, non-decreasing."""

    def __init__(self, seg: np.ndarray, n: int):
        self.seg = seg
        self.n = n
        starts = np.searchsorted(seg, np.arange(n))
        ends = np.append(starts[1:], len(seg))
        self.nonempty = ends > starts
        self.starts = starts[self.nonempty]

    def sum(self, values: np.ndarray, mask: np.ndarray) -> np.ndarray:
        weights = np.where(mask, values, 0).astype(np.float64)
        total = np.bincount(self.seg, weights=weights, minlength=self.n)
        if values.dtype.kind in "iu":
            return np.rint(total).astype(np.int64)
        return total

    def reduce(self, ufunc: Any, values: np.ndarray, mask: np.ndarray, identity: Any) -> np.ndarray:
        out = np.full(self.n, identity, dtype=values.dtype)
        if len(self.starts):
            filled = np.where(mask, values, np.asarray(identity, dtype=values.dtype))
            out[self.nonempty] = ufunc.reduceat(filled, self.starts)
        return out

    def latest(self, values: np.ndarray, ts: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Per entity, the value with the greatest ts; ties take the greatest value."""
        top = self.reduce(np.maximum, ts, mask, _INT_MIN)
        candidate = mask & (ts == top[self.seg])
        if values.dtype == object:
            out = np.full(self.n, None, dtype=object)
            for i in np.flatnonzero(candidate):
                s, v = self.seg[i], values[i]
                if out[s] is None or v > out[s]:
                    out[s] = v
            return out
        low = -np.inf if values.dtype.kind == "f" else _INT_MIN
        return self.reduce(np.maximum, values, candidate, low)


def merge_partial(op: str, segs: Segments, values: np.ndarray, mask: np.ndarray,
                  ts: np.ndarray | None = None) -> np.ndarray:
    """Merge one partial column over the masked records of each entity with the table's `merge_op`.

    NaN is the greatest value (catalog.aggregations): `max` propagates it (np.maximum), `min` skips it
    unless every value is NaN — np.fmin with NaN, not +inf, for the masked-out records, so a NaN-only
    window stays NaN.
    """
    floating = values.dtype.kind == "f"
    if op == "sum":
        return segs.sum(values, mask)
    if op == "min":
        if floating:
            return segs.reduce(np.fmin, values, mask, np.nan)
        return segs.reduce(np.minimum, values, mask, _INT_MAX)
    if op == "max":
        return segs.reduce(np.maximum, values, mask, -np.inf if floating else _INT_MIN)
    if op == "last":
        assert ts is not None, "a last partial merges with its event times"
        return segs.latest(values, ts, mask)
    raise NotImplementedError(f"merge op {op!r} has no numpy implementation in quiver.online.merge")


def _stddev(merged: Mapping[str, np.ndarray], cnt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    valid = cnt >= 2
    n = np.where(valid, cnt, 2).astype(np.float64)
    total, sumsq = merged["sum"], merged["sumsq"]
    var = np.maximum((sumsq - total * total / n) / (n - 1), 0.0)
    return np.where(valid, np.sqrt(var), np.nan), valid


def _mean(merged: Mapping[str, np.ndarray], cnt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    valid = cnt > 0
    return merged["sum"] / np.where(valid, cnt, 1), valid


# finalize rule → (merged partials by kind, merged cnt) → (values, valid). Keyed by the table's names.
FINALIZE: dict[str, Callable[[Mapping[str, np.ndarray], np.ndarray], tuple[np.ndarray, np.ndarray]]] = {
    "count": lambda m, cnt: (cnt, np.ones(len(cnt), dtype=bool)),
    "sum": lambda m, cnt: (m["sum"], np.ones(len(cnt), dtype=bool)),
    "mean": _mean,
    "min": lambda m, cnt: (m["min"], cnt > 0),
    "max": lambda m, cnt: (m["max"], cnt > 0),
    "last": lambda m, cnt: (m["last"], cnt > 0),
    "stddev": _stddev,
}

_NUMPY_OUT = {"int64": np.int64, "float64": np.float64, "bool": np.bool_, "timestamp": np.int64}


def window_features(view: ViewSpec, features: Sequence[str], tile_start: np.ndarray,
                    partials: Mapping[str, np.ndarray], segs: Segments,
                    at: np.ndarray) -> dict[str, Column]:
    """Finalized values of `features` (aggregations of `view`) for each entity, as of `at` (µs, per entity).

    `partials` maps partial column names (and `<col>__last_ts`) to one array per record.
    The window `w` as of `t` merges tiles with floor_g(t) - w <= tile_start <= floor_g(t).
    """
    tile = int(view.tile_us or 1)
    at_rec = at[segs.seg] if at.ndim else np.full(len(tile_start), int(at), dtype=np.int64)
    floor = at_rec - np.mod(at_rec, tile)
    aggs: dict[str, AggSpec] = {a.name: a for a in view.aggregations}
    windows: dict[int, np.ndarray] = {}
    merged: dict[tuple[str, int], np.ndarray] = {}
    out: dict[str, Column] = {}
    for name in features:
        agg = aggs[name]
        if agg.window_us not in windows:
            windows[agg.window_us] = (tile_start >= floor - agg.window_us) & (tile_start <= floor)
        in_window = windows[agg.window_us]
        fn = AGG_FUNCTIONS[agg.fn]
        cnt_col = partial_column(agg.column, "cnt")
        by_kind: dict[str, np.ndarray] = {}
        for kind in fn.partials:
            key = (partial_column(agg.column, kind), agg.window_us)
            if key not in merged:
                column = partials[key[0]]
                # min / max / last of a tile without values is a placeholder: only tiles with cnt > 0 count.
                mask = in_window if kind in ("cnt", "sum", "sumsq") else in_window & (partials[cnt_col] > 0)
                ts = partials[last_ts_column(agg.column)] if kind == "last" else None
                merged[key] = merge_partial(PARTIALS[kind].merge_op, segs, column, mask, ts)
            by_kind[kind] = merged[key]
        values, valid = FINALIZE[fn.finalize](by_kind, by_kind["cnt"])
        dtype = output_dtype(agg.fn, agg.input_dtype)
        if dtype in _NUMPY_OUT and values.dtype != object:
            values = np.where(valid, values, 0).astype(_NUMPY_OUT[dtype]) if dtype != "float64" \
                else np.where(valid, values, np.nan).astype(np.float64)
        out[name] = Column(values, np.asarray(valid, dtype=bool), dtype)
    return out
