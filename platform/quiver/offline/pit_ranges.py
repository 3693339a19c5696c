"""Vectorised kernels of the embedded point-in-time join: sorted timelines and merges over row ranges.

A `Timeline` keeps rows sorted by (entity code, time) and answers (code, time) queries with row positions,
so "the events of entity c in [a, b)" is the row range [search(c, a), search(c, b)). Queries are expected
in (code, time) order: sorted queries make searches cache-friendly and bound the range scans below.

Range merges implement the merge ops of `quiver.catalog.aggregations.PARTIALS` over [s, e):
`sum`, `min`, `max` scan the ranges with `ufunc.reduceat` (a sequential sum, like an SQL engine's); when
the ranges together cover far more rows than the table holds, sums switch to long-double prefix sums and
min/max to a block sparse table, so the cost stays O(rows + queries). `last` uses a forward-filled index of
the rows that hold a value.
"""

from __future__ import annotations

from typing import Final

import numpy as np

_FITS: Final = 1 << 62
# Scanning is cheaper than building a prefix/sparse structure until ranges overlap this much.
_SCAN_FACTOR: Final = 8
_BLOCK: Final = 64


class Timeline:
    """Rows of one table sorted by (entity code, time).

    `stable=False` lets rows that tie on (code, time) come in any order (label rows: ties get equal answers).
    `codes` (≥ 0; callers drop rows of entities no label asks for) is consumed: its buffer becomes the sort
    key, because at 10M rows every fresh array costs more than the arithmetic on it. `rows` are the rows'
    positions in their table (default 0..n-1); `rows_at` maps sorted positions back to table rows.
    """

    def __init__(self, codes: np.ndarray, times: np.ndarray, n_codes: int,
                 rows: np.ndarray | None = None, stable: bool = True) -> None:
        self._rows_in = rows
        self._n = len(codes)
        self._t0 = int(times.min()) if self._n else 0
        self._span = (int(times.max()) - self._t0 + 2) if self._n else 2
        self._order: np.ndarray | None = None
        self._key: np.ndarray | None = None
        self._codes: np.ndarray | None = None
        self._times: np.ndarray | None = None
        if n_codes * self._span < _FITS:
            key = codes.astype(np.int64, copy=False)
            key *= self._span
            key += times
            key -= self._t0
            if not _is_sorted(key):
                # Stable finds sorted runs (e.g. one per day file); unstable is 2-3x faster on random order.
                self._order = np.argsort(key, kind="stable" if stable else None)
                key = key[self._order]
            self._key = key
        else:  # too many entities × too long a time span for one int64 key: sort on both columns
            self._order = np.lexsort((times, codes))
            self._codes, self._times = codes[self._order], times[self._order]

    def __len__(self) -> int:
        return self._n

    @property
    def codes(self) -> np.ndarray:
        """Entity code of every row, in sorted order."""
        if self._codes is None:
            assert self._key is not None
            self._codes = self._key // self._span
        return self._codes

    @property
    def times(self) -> np.ndarray:
        """Time of every row, in sorted order."""
        if self._times is None:
            assert self._key is not None
            self._times = self._key % self._span + self._t0
        return self._times

    @property
    def rows(self) -> np.ndarray:
        """Table row of every sorted position."""
        if self._order is None:
            return self._rows_in if self._rows_in is not None else np.arange(self._n, dtype=np.int64)
        return self._order if self._rows_in is None else self._rows_in[self._order]

    @property
    def identity(self) -> bool:
        """Whether sorted positions are the table's rows (nothing to gather)."""
        return self._order is None and self._rows_in is None

    def rows_at(self, pos: np.ndarray) -> np.ndarray:
        rows = pos if self._order is None else self._order[pos]
        return rows if self._rows_in is None else self._rows_in[rows]

    def codes_at(self, pos: np.ndarray) -> np.ndarray:
        return np.asarray(self._key[pos] // self._span if self._key is not None else self.codes[pos])

    def times_at(self, pos: np.ndarray) -> np.ndarray:
        return np.asarray(self._key[pos] % self._span + self._t0 if self._key is not None else self.times[pos])

    def ties(self) -> np.ndarray:
        """For each row after the first: same (code, time) as the row before it."""
        if self._key is not None:
            return np.asarray(self._key[1:] == self._key[:-1])
        return np.asarray((self.codes[1:] == self.codes[:-1]) & (self.times[1:] == self.times[:-1]))

    def search(self, codes: np.ndarray, times: np.ndarray) -> np.ndarray:
        """Position of the first row ≥ (code, time) for each query; 0 for queries with code < 0."""
        if self._key is not None:
            offsets = np.clip(times - self._t0, 0, self._span - 1)
            offsets += codes * self._span
            pos = np.searchsorted(self._key, offsets, side="left")
        else:
            pos = self._segmented_search(codes, times)
        pos[codes < 0] = 0
        return np.asarray(pos, dtype=np.int64)

    def _segmented_search(self, codes: np.ndarray, times: np.ndarray) -> np.ndarray:
        lo = np.searchsorted(self.codes, codes, side="left")
        hi = np.searchsorted(self.codes, codes, side="right")
        last = max(self._n - 1, 0)
        while True:  # a vectorised binary search inside each query's entity segment
            active = lo < hi
            if not active.any():
                return np.asarray(lo)
            mid = (lo + hi) // 2
            below = active & (self.times[np.minimum(mid, last)] < times)
            lo = np.where(below, mid + 1, lo)
            hi = np.where(active & ~below, mid, hi)

    def filtered(self, keep: np.ndarray) -> Timeline:
        """The same timeline without the rows where `keep` (in sorted order) is False."""
        clone = object.__new__(Timeline)
        clone._n, clone._t0, clone._span = int(keep.sum()), self._t0, self._span
        clone._order, clone._rows_in = None, self.rows[keep]
        clone._key = None if self._key is None else self._key[keep]
        clone._codes = None if self._codes is None else self._codes[keep]
        clone._times = None if self._times is None else self._times[keep]
        return clone


def _is_sorted(values: np.ndarray) -> bool:
    return bool(len(values) < 2 or (values[1:] >= values[:-1]).all())


def range_merge(op: str, values: np.ndarray, s: np.ndarray, e: np.ndarray) -> np.ndarray:
    """Merge `values` over each row range [s, e) with `op` in sum | min | max.

    Empty ranges give the identity (`identity(op, dtype)`); callers replace nulls by it beforehand.
    Floats follow SQL engines on NaN: it is the greatest value (max → NaN, min skips it unless every value
    is NaN) and sums propagate it.
    """
    identity = merge_identity(op, values.dtype)
    out = np.full(len(s), identity, dtype=values.dtype)
    nonempty = e > s
    if not nonempty.any():
        return out
    ss, ee = s[nonempty], e[nonempty]
    ufunc = _ufunc(op, values.dtype)
    if int((ee - ss).sum()) <= _SCAN_FACTOR * (len(values) + len(ss)):
        out[nonempty] = _scan(ufunc, values, ss, ee, identity)
    elif op == "sum":
        out[nonempty] = _prefix_sum(values, ss, ee)
    else:
        out[nonempty] = _sparse_table(ufunc, values, ss, ee, identity)
    return out


def merge_identity(op: str, dtype: np.dtype) -> int | float:
    """The value that leaves a merge unchanged: 0 for sum; for a float min NaN, which np.fmin skips (+inf
    would turn a NaN-only range into inf); -inf for a float max; the int64 extremes for integers."""
    if op == "sum":
        return 0
    if np.issubdtype(dtype, np.floating):
        return np.nan if op == "min" else -np.inf
    info = np.iinfo(dtype)
    return int(info.max) if op == "min" else int(info.min)


def _ufunc(op: str, dtype: np.dtype) -> np.ufunc:
    if op == "sum":
        return np.add
    if op == "min":  # fmin skips NaN (NaN sorts last in SQL, so it never is the minimum of a mix)
        return np.fmin if np.issubdtype(dtype, np.floating) else np.minimum
    return np.maximum  # propagates NaN: NaN is the maximum in SQL's ordering


def _scan(ufunc: np.ufunc, values: np.ndarray, s: np.ndarray, e: np.ndarray,
          identity: int | float) -> np.ndarray:
    # reduceat over interleaved [s0, e0, s1, e1, …]: even slots are the ranges; odd slots reduce the gaps
    # between ranges, which sorted queries keep to at most one pass over the rows.
    padded = np.append(values, np.array([identity], dtype=values.dtype))
    bounds = np.empty(2 * len(s), dtype=np.int64)
    bounds[0::2], bounds[1::2] = s, e
    return np.asarray(ufunc.reduceat(padded, bounds)[0::2])


def _prefix_sum(values: np.ndarray, s: np.ndarray, e: np.ndarray) -> np.ndarray:
    if np.issubdtype(values.dtype, np.integer):
        prefix = np.concatenate(([0], np.cumsum(values)))
        return np.asarray(prefix[e] - prefix[s])
    finite = np.isfinite(values)
    # Long double keeps ~3 more digits than the global running total costs; non-finite values are counted
    # apart so one NaN or inf does not poison every later range.
    prefix = np.concatenate(([0], np.cumsum(np.where(finite, values, 0.0), dtype=np.longdouble)))
    out = (prefix[e] - prefix[s]).astype(np.float64)
    if not finite.all():
        counts = [np.concatenate(([0], np.cumsum(mask))) for mask in
                  (np.isnan(values), values == np.inf, values == -np.inf)]
        nan, pos, neg = ((c[e] - c[s]) > 0 for c in counts)
        out = np.where(pos, np.inf, out)
        out = np.where(neg, -np.inf, out)
        out = np.where(nan | (pos & neg), np.nan, out)
    return np.asarray(out)


def _sparse_table(ufunc: np.ufunc, values: np.ndarray, s: np.ndarray, e: np.ndarray,
                  identity: int | float) -> np.ndarray:
    """Range min/max in O(1) per query: in-block prefix/suffix arrays plus a sparse table over blocks."""
    n = len(values)
    blocks = -(-n // _BLOCK)
    padded = np.full(blocks * _BLOCK, identity, dtype=values.dtype)
    padded[:n] = values
    grid = padded.reshape(blocks, _BLOCK)
    prefix = ufunc.accumulate(grid, axis=1).ravel()
    suffix = ufunc.accumulate(grid[:, ::-1], axis=1)[:, ::-1].ravel()
    levels = [prefix.reshape(blocks, _BLOCK)[:, -1].copy()]
    while (1 << len(levels)) <= blocks:
        half = 1 << (len(levels) - 1)
        levels.append(ufunc(levels[-1][:-half], levels[-1][half:]))
    last = e - 1
    first_block, last_block = s // _BLOCK, last // _BLOCK
    out = np.empty(len(s), dtype=values.dtype)
    same = first_block == last_block
    if same.any():  # a range inside one block spans < _BLOCK rows: scan it
        out[same] = _scan(ufunc, values, s[same], e[same], identity)
    split = ~same
    result = ufunc(suffix[s[split]], prefix[last[split]])
    lo, hi = first_block[split] + 1, last_block[split] - 1
    middle = hi >= lo
    if middle.any():
        lo_m, hi_m = lo[middle], hi[middle]
        level = np.floor(np.log2(hi_m - lo_m + 1)).astype(np.int64)
        mids = np.empty(len(lo_m), dtype=values.dtype)
        for k in np.unique(level):
            pick = level == k
            table = levels[k]
            mids[pick] = ufunc(table[lo_m[pick]], table[hi_m[pick] - (1 << int(k)) + 1])
        result[middle] = ufunc(result[middle], mids)
    out[split] = result
    return out


def last_positions(has_value: np.ndarray, s: np.ndarray, e: np.ndarray) -> np.ndarray:
    """Position of the last row in [s, e) that holds a value, or -1.

    Rows are in time order, so this is the row with the greatest time; ties at one time are resolved by
    the caller (`resolve_ties`).
    """
    filled = np.maximum.accumulate(np.where(has_value, np.arange(len(has_value)), -1))
    filled = np.append(filled, -1)  # index -1 below (e == 0) reads this
    pos = filled[e - 1]
    return np.where((e > s) & (pos >= s), pos, -1)


def resolve_ties(pos: np.ndarray, s: np.ndarray, has_value: np.ndarray, codes: np.ndarray,
                 times: np.ndarray, better: object) -> np.ndarray:
    """Among rows in [s, pos] with a value at pos's (code, time), pick the greatest value (docs/architecture.md: ties at one
    event time take the greatest value). `better(i, j)` says whether row i's value beats row j's."""
    rows = np.flatnonzero(has_value)
    if len(rows) < 2:
        return pos
    same = (codes[rows[1:]] == codes[rows[:-1]]) & (times[rows[1:]] == times[rows[:-1]])
    if not same.any():
        return pos
    tied = np.zeros(len(has_value), dtype=bool)
    tied[rows[1:][same]] = True
    out = pos.copy()
    for q in np.flatnonzero((pos >= 0) & tied[np.maximum(pos, 0)]):  # rare: a loop is fine
        j = best = int(pos[q])
        i = j - 1
        while i >= s[q] and codes[i] == codes[j] and times[i] == times[j]:
            if has_value[i] and better(i, best):  # type: ignore[operator]
                best = i
            i -= 1
        out[q] = best
    return out
