"""The embedded point-in-time engine (engine="duckdb"): pyarrow reads of only the needed columns, then
vectorised numpy joins over rows sorted by (entity, time).

Why numpy rather than DuckDB SQL here: on this machine a DuckDB ASOF join for last values took ≈3 s for 1M
labels × 10M rows against 2.3 s for sort + searchsorted, and windows as a DuckDB range join took 16 s against
2.7–4 s for per-entity row ranges (docs/architecture.md, "Online read path"); `benchmarks/pit_join.py` re-times the DuckDB ASOF join
beside this engine on every run. Results are exact: ranges select exactly the rows the as-of rule admits,
and merges follow catalog.aggregations (see pit_ranges and pit_merge).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from quiver.catalog.aggregations import PARTIALS, TILE_START, last_ts_column, partial_column
from quiver.catalog.errors import QuiverError
from quiver.compile.contracts import violations
from quiver.offline.layout import EVENT_TS, LAST_VALUES, TILES, arrow_type
from quiver.offline.pit_merge import Merged, combine, finalize, partial_kinds
from quiver.offline.pit_plan import LabelSet, ViewRequest, ascending_order, timestamps_us
from quiver.offline.pit_ranges import Timeline, last_positions, merge_identity, range_merge, resolve_ties

_DENSE_KEYS = 1 << 40  # combined multi-key codes above this are renumbered densely
_HEAD_BITMAP_BITS = 1 << 31


def compute(labels: LabelSet, requests: Sequence[ViewRequest]) -> dict[tuple[str, str], pa.Array]:
    """Feature values per (view, feature), one entry per label row in label order."""
    indexes: dict[tuple[str, ...], EntityIndex] = {}
    out: dict[tuple[str, str], pa.Array] = {}
    # Views run one after another: two threads were measured slower here (page faults contend) and use
    # more memory.
    for req in requests:
        keys = tuple(req.view.key_names)
        if keys not in indexes:
            indexes[keys] = EntityIndex([labels.keys[k] for k in keys], labels.t_us)
        index = indexes[keys]
        values = _last_values(req, index, labels) if req.view.kind == "last" else _windows(req, index, labels)
        out.update({(req.view.name, name): array for name, array in values.items()})
    return out


class _KeyColumn:
    """Codes of one key column: the label rows' distinct values numbered in sorted order."""

    def __init__(self, labels: pa.Array) -> None:
        self._numeric = not (pa.types.is_string(labels.type) or pa.types.is_large_string(labels.type))
        self._lut: np.ndarray | None = None
        self._uniques = np.zeros(0, dtype=np.int64)
        self._lo = 0
        if not self._numeric:
            uniques = pc.unique(labels.drop_null())
            self._dictionary = uniques.take(pc.sort_indices(uniques))
            self.size = len(self._dictionary)
            return
        values, nulls = _int_values(labels)
        present = values[~nulls] if nulls is not None else values
        if not len(present):
            self.size = 0
            return
        self._lo = int(present.min())
        span = int(present.max()) - self._lo + 1
        if span <= max(4 * len(present), 1 << 20):  # a lookup table beats a search for compact ids
            seen = np.zeros(span, dtype=bool)
            seen[present - self._lo] = True
            self._lut = np.where(seen, np.cumsum(seen) - 1, -1)
            self.size = int(seen.sum())
        else:
            self._uniques = np.unique(present)
            self.size = len(self._uniques)

    def codes(self, column: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """Code of each value; -1 for nulls and values no label row has."""
        if not self._numeric:
            found = pc.index_in(pc.cast(column, pa.string()), value_set=self._dictionary)
            return _to_numpy(pc.fill_null(found, -1)).astype(np.int64)
        values, nulls = _int_values(column)
        if self._lut is not None and nulls is None and len(values) and values.min() >= self._lo \
                and values.max() < self._lo + len(self._lut):  # the common case, without temporaries
            return np.asarray(self._lut[values - self._lo if self._lo else values])
        if self._lut is not None:
            offset = values - self._lo
            inside = (offset >= 0) & (offset < len(self._lut))
            codes = np.where(inside, self._lut[np.where(inside, offset, 0)], -1)
        else:
            codes = _lookup(self._uniques, values)
        if nulls is not None:
            codes[nulls] = -1
        return codes.astype(np.int64, copy=False)


def _lookup(uniques: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Position of each value in the sorted `uniques`, -1 when absent."""
    if not len(uniques):
        return np.full(len(values), -1, dtype=np.int64)
    pos = np.minimum(np.searchsorted(uniques, values), len(uniques) - 1)
    return np.where(uniques[pos] == values, pos, -1).astype(np.int64)


class EntityIndex:
    """The label rows' entities (one or more key columns) as dense codes, -1 where a key is null, and the
    label order by (code, time) in which every lookup runs."""

    def __init__(self, keys: list[pa.Array], t_us: np.ndarray) -> None:
        self._columns = [_KeyColumn(k) for k in keys]
        # Multi-column keys combine as mixed-radix numbers; whenever that would grow past _DENSE_KEYS,
        # the partial combination is renumbered by the label rows' distinct values (kept to encode data).
        self._steps: list[tuple[int, np.ndarray | None]] = []
        parts = [c.codes(k) for c, k in zip(self._columns, keys, strict=True)]
        code, size = parts[0], max(self._columns[0].size, 1)
        for column, part in zip(self._columns[1:], parts[1:], strict=True):
            radix = max(column.size, 1)
            dense = None
            if size * radix >= _DENSE_KEYS:
                dense = np.unique(code[code >= 0])
                code, size = _lookup(dense, code), max(len(dense), 1)
            code = np.where((code < 0) | (part < 0), -1, code * radix + part)
            size *= radix
            self._steps.append((radix, dense))
        self._final: np.ndarray | None = None
        if len(parts) > 1 and size > 4 * len(code):  # keep codes dense: the sort key is code × time span
            self._final = np.unique(code[code >= 0])
            code, size = _lookup(self._final, code), len(self._final)
        self.codes = code
        self.n_codes = max(size, 1)
        # Label rows that tie on entity and time get equal answers: their order among them is free.
        self.order = Timeline(code + 1, t_us, self.n_codes + 1, stable=False).rows

    def encode(self, columns: list[pa.ChunkedArray]) -> np.ndarray:
        """Codes of data rows; -1 where a key is null or names an entity no label row asks for."""
        parts = [c.codes(col) for c, col in zip(self._columns, columns, strict=True)]
        code = parts[0]
        for (radix, dense), part in zip(self._steps, parts[1:], strict=True):
            if dense is not None:
                code = _lookup(dense, code)
            code = np.where((code < 0) | (part < 0), -1, code * radix + part)
        return code if self._final is None else _lookup(self._final, code)


def _int_values(column: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray | None]:
    ints = pc.cast(column, pa.int64())
    nulls = np.asarray(_to_numpy(pc.is_null(ints))) if ints.null_count else None
    return _to_numpy(pc.fill_null(ints, 0) if nulls is not None else ints).astype(np.int64, copy=False), nulls


def _to_numpy(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks() if array.num_chunks != 1 else array.chunk(0)
    return np.asarray(array.to_numpy(zero_copy_only=False))


def _read(req: ViewRequest, files: list[Path] | list[str], columns: list[str], what: str,
          expression: ds.Expression | None = None, filesystem: Any = None) -> pa.Table | None:
    """`files` of the offline store (on its filesystem, `req.filesystem`) or, with `filesystem`, of a source."""
    if not files:
        return None
    filesystem = filesystem or req.filesystem
    try:
        return ds.dataset([str(f) for f in files], format="parquet", filesystem=filesystem).to_table(
            columns=columns, filter=expression)
    except (pa.ArrowInvalid, pa.ArrowTypeError, KeyError) as exc:
        raise QuiverError(f"feature view {req.view.name!r}: cannot read {what} ({exc}); the files may predate "
                          f"the current definition — re-run the backfill") from None


def _unpermute(order: np.ndarray, sorted_values: pa.Array) -> pa.Array:
    inverse = np.empty(len(order), dtype=np.int64)
    inverse[order] = np.arange(len(order), dtype=np.int64)
    return sorted_values.take(pa.array(inverse))


# --- last values ---------------------------------------------------------------------------------------


def _last_values(req: ViewRequest, index: EntityIndex, labels: LabelSet) -> dict[str, pa.Array]:
    view, names = req.view, [f.name for f in req.fields]
    ttl = view.ttl_us
    known = index.codes >= 0
    table = None
    if known.any():
        hi = int(labels.t_us[known].max())
        lo = int(labels.t_us[known].min()) - ttl if ttl is not None else None
        files = req.partition_files(LAST_VALUES, lo, hi)
        table = _read(req, files, [*view.key_names, EVENT_TS, *names], f"{LAST_VALUES} of {view.name}")
    if table is None or not table.num_rows:
        return {f.name: pa.nulls(labels.n, arrow_type(f.dtype)) for f in req.fields}
    codes = index.encode([table[k] for k in view.key_names])
    ts, ts_nulls = timestamps_us(table[EVENT_TS])
    keep = codes >= 0
    if ts_nulls is not None:
        keep &= ~ts_nulls
    timeline = _drop_ties(_timeline(codes, ts, keep, index.n_codes), table, names)

    order = index.order
    q_codes, q_times = index.codes[order], labels.t_us[order]
    pos = timeline.search(q_codes, q_times) - 1  # the newest row strictly before t
    safe = np.maximum(pos, 0)
    found = (pos >= 0) & (q_codes >= 0) & (len(timeline) > 0)
    if len(timeline):
        found &= timeline.codes_at(safe) == q_codes
        if ttl is not None:
            found &= timeline.times_at(safe) >= q_times - ttl
    picked = np.full(labels.n, -1, dtype=np.int64)
    picked[order] = np.where(found, timeline.rows_at(safe) if len(timeline) else 0, -1)
    take = pa.array(picked, mask=picked < 0)
    return {name: _single(table[name].take(take)) for name in names}


def _drop_ties(timeline: Timeline, table: pa.Table, names: list[str]) -> Timeline:
    """Keep one row per (entity, event_ts): the greatest field values (null lowest, NaN greatest), in field order.

    The layout promises this already; enforcing it costs one comparison pass when it holds.
    """
    tie = timeline.ties()
    if not tie.any():
        return timeline
    involved = np.zeros(len(timeline), dtype=bool)
    involved[1:] |= tie
    involved[:-1] |= tie
    positions = np.flatnonzero(involved)
    group = np.cumsum(np.concatenate(([True], ~tie)))[positions]
    tied = table.select(names).take(pa.array(timeline.rows_at(positions)))
    tied = tied.append_column("__group", pa.array(group))
    order = np.asarray(ascending_order(tied, ["__group", *names]))  # null lowest, NaN greatest
    ranked = group[order]
    winners = positions[order[np.append(ranked[1:] != ranked[:-1], True)]]  # the greatest of each group
    keep = ~involved
    keep[winners] = True
    return timeline.filtered(keep)


def _single(array: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(array, pa.ChunkedArray):
        return array.combine_chunks() if array.num_chunks != 1 else array.chunk(0)
    return array


# --- windows ---------------------------------------------------------------------------------------------


@dataclass
class _LastColumn:
    """A `last` partial: values in table order, and per timeline position its row, value flag and time."""

    values: pa.Array
    rows: np.ndarray
    has: np.ndarray
    times: np.ndarray


@dataclass
class _RowPartials:
    """Per-row partials of one column in timeline order (a raw event is a tile of one event)."""

    cnt: np.ndarray
    arrays: dict[str, np.ndarray]
    last: _LastColumn | None = None

    def merge(self, s: np.ndarray, e: np.ndarray, line: Timeline) -> Merged:
        merged = Merged(range_merge("sum", self.cnt, s, e))
        for kind, values in self.arrays.items():
            merged.values[kind] = range_merge(PARTIALS[kind].merge_op, values, s, e)
        if self.last is not None:
            last = self.last
            pos = last_positions(last.has, s, e)
            pos = resolve_ties(pos, s, last.has, line.codes, last.times,
                               lambda i, j: _greater(last.values[int(last.rows[i])].as_py(),
                                                     last.values[int(last.rows[j])].as_py()))
            rows = np.where(pos >= 0, last.rows[np.maximum(pos, 0)] if len(last.rows) else 0, -1)
            merged.values["last"] = last.values.take(pa.array(rows, mask=pos < 0))
        return merged


def _greater(a: object, b: object) -> bool:
    """Whether `a` beats `b` in a `last` tie: the greater value, NaN greatest (the project's rule)."""
    if isinstance(a, float) and math.isnan(a):
        return not (isinstance(b, float) and math.isnan(b))
    if isinstance(b, float) and math.isnan(b):
        return False
    try:
        return bool(a > b)  # type: ignore[operator]
    except TypeError:
        return False


Parts = tuple[Timeline, dict[str, _RowPartials]]


def _windows(req: ViewRequest, index: EntityIndex, labels: LabelSet) -> dict[str, pa.Array]:
    view, aggs = req.view, req.aggregations
    tile = int(view.tile_us or 0)
    t = labels.t_us
    floor = t - t % tile
    order = index.order
    q_codes, q_times, q_floor = index.codes[order], t[order], floor[order]
    columns = list(dict.fromkeys(a.column for a in aggs))
    kinds = {c: partial_kinds([a.fn for a in aggs if a.column == c]) for c in columns}
    dtypes = {a.column: a.input_dtype for a in aggs}
    known = q_codes >= 0
    tiles = head = None
    if known.any():
        widest = max(a.window_us for a in aggs)
        lo, hi = int(q_floor[known].min()), int(q_floor[known].max())
        tiles = _tile_partials(req, index, columns, kinds, dtypes, lo - widest, hi)
        head = _head_partials(req, index, columns, kinds, dtypes, q_codes[known], q_floor[known],
                              lo, int(q_times[known].max()))
    tile_line, tile_parts = tiles or _empty_partials(columns, kinds, dtypes, index.n_codes)
    head_line, head_parts = head or _empty_partials(columns, kinds, dtypes, index.n_codes)

    head_s, head_e = head_line.search(q_codes, q_floor), head_line.search(q_codes, q_times)
    head_merged = {c: head_parts[c].merge(head_s, head_e, head_line) for c in columns}
    tile_end = tile_line.search(q_codes, q_floor)
    out: dict[str, pa.Array] = {}
    for window in sorted({a.window_us for a in aggs}):
        tile_start = tile_line.search(q_codes, q_floor - window)
        for column in columns:
            wanted = [a for a in aggs if a.column == column and a.window_us == window]
            if wanted:
                whole = tile_parts[column].merge(tile_start, tile_end, tile_line)
                values = finalize(wanted, combine(whole, head_merged[column]))
                out.update({name: _unpermute(order, array) for name, array in values.items()})
    return out


def _tile_partials(req: ViewRequest, index: EntityIndex, columns: list[str], kinds: dict[str, list[str]],
                   dtypes: dict[str, str], lo: int, hi: int) -> Parts | None:
    """Whole tiles of label entities with tile_start in [lo, hi)."""
    view = req.view
    wanted = [TILE_START]
    for column in columns:
        wanted.append(partial_column(column, "cnt"))
        wanted += [partial_column(column, k) for k in kinds[column]]
        if "last" in kinds[column]:
            wanted.append(last_ts_column(column))
    table = _read(req, req.partition_files(TILES, lo, hi), [*view.key_names, *wanted], f"{TILES} of {view.name}")
    if table is None or not table.num_rows:
        return None
    codes = index.encode([table[k] for k in view.key_names])
    start = _ints(table[TILE_START])
    # Tiles outside [lo, hi) are never inside a searched range: keeping them is cheaper than a gather.
    line = _timeline(codes, start, codes >= 0, index.n_codes)
    rows = None if line.identity else line.rows

    def ordered(values: np.ndarray) -> np.ndarray:
        return values if rows is None else values[rows]

    parts: dict[str, _RowPartials] = {}
    for column in columns:
        part = _RowPartials(ordered(_ints(table[partial_column(column, "cnt")])), {})
        for kind in kinds[column]:
            data = table[partial_column(column, kind)]
            if kind == "last":
                has = ordered(~_to_numpy(pc.is_null(data)).astype(bool))
                times = ordered(_ints(table[last_ts_column(column)]))
                # tile_schema stores a bool column's `last` as int64: back to the input type
                values = _single(data).cast(arrow_type(dtypes[column]))
                part.last = _LastColumn(values, line.rows, has, times)
            else:
                part.arrays[kind] = ordered(_fill(data, PARTIALS[kind].merge_op))
        parts[column] = part
    return line, parts


def _timeline(codes: np.ndarray, times: np.ndarray, keep: np.ndarray, n_codes: int) -> Timeline:
    """A timeline of the rows where `keep`; gathers nothing when every row is kept (the usual case)."""
    if keep.all():
        return Timeline(codes, times, n_codes)
    rows = np.flatnonzero(keep)
    return Timeline(codes[rows], times[rows], n_codes, rows)


def _ints(column: pa.ChunkedArray) -> np.ndarray:
    """An integer column as int64 numpy, nulls as 0."""
    if column.null_count:
        column = pc.fill_null(column, 0)
    return _to_numpy(pc.cast(column, pa.int64())).astype(np.int64, copy=False)


def _head_partials(req: ViewRequest, index: EntityIndex, columns: list[str], kinds: dict[str, list[str]],
                   dtypes: dict[str, str], q_codes: np.ndarray, q_floor: np.ndarray, lo: int,
                   hi: int) -> Parts | None:
    """Raw source events in the labels' current tiles: [floor_g(t), t) for some label of the same entity."""
    view, ts_name = req.view, req.view.timestamp_field
    files = req.source_files()
    if not files:
        return None
    fs = files.location.fs
    dataset = ds.dataset(list(files.paths), format="parquet", filesystem=fs)
    expression = _time_filter(dataset.schema.field(ts_name).type, ts_name, lo, hi)
    read = list(dict.fromkeys([*view.key_names, ts_name, *columns, *(view.contract.columns if view.contract else ())]))
    table = _read(req, list(files.paths), read, f"source {view.source!r}", expression, filesystem=fs)
    if table is None or not table.num_rows:
        return None
    codes = index.encode([table[k] for k in view.key_names])
    ts, ts_nulls = timestamps_us(table[ts_name])
    keep = (codes >= 0) & (ts >= lo) & (ts < hi)
    if view.contract is not None:  # the rows the backfill refused never count in a head either
        keep &= violations(table, view.contract, time.time_ns() // 1000) < 0
    if ts_nulls is not None:
        keep &= ~ts_nulls
    keep &= _in_label_tiles(codes, ts, int(view.tile_us or 1), q_codes, q_floor, index.n_codes)
    rows = np.flatnonzero(keep)
    line = Timeline(codes[rows], ts[rows], index.n_codes, rows)
    rows = line.rows
    table = table.take(pa.array(rows))  # few rows: only the labels' current tiles
    parts: dict[str, _RowPartials] = {}
    for column in columns:
        data = _single(table[column])
        has = ~_to_numpy(pc.is_null(data)).astype(bool) if data.null_count else np.ones(len(data), dtype=bool)
        part = _RowPartials(has.astype(np.int64), {})
        for kind in kinds[column]:
            if kind == "last":
                part.last = _LastColumn(data, np.arange(len(rows)), has, line.times)
            elif kind in ("sum", "sumsq"):
                values = np.where(has, _numbers(data), 0.0)
                part.arrays[kind] = values if kind == "sum" else values * values
            else:
                part.arrays[kind] = _fill(data, PARTIALS[kind].merge_op, dtypes[column])
        parts[column] = part
    return line, parts


def _time_filter(kind: pa.DataType, name: str, lo: int, hi: int) -> ds.Expression | None:
    if not pa.types.is_timestamp(kind):
        return None  # filtered after reading
    bound = pa.timestamp("us", tz=kind.tz)
    low = pa.scalar(lo, bound).cast(kind, safe=False)
    high = pa.scalar(hi, bound).cast(kind, safe=False)
    return (ds.field(name) >= low) & (ds.field(name) <= high)


def _in_label_tiles(codes: np.ndarray, ts: np.ndarray, tile: int, q_codes: np.ndarray, q_floor: np.ndarray,
                    n_codes: int) -> np.ndarray:
    """Events whose (entity, tile) is some label's current tile: the only raw events a head can use."""
    first = int(q_floor.min()) // tile
    n_tiles = int(q_floor.max()) // tile - first + 1
    if n_codes * n_tiles >= _HEAD_BITMAP_BITS:
        return np.ones(len(codes), dtype=bool)  # too large for a bitmap: the ranges still select exactly
    bits = np.zeros(n_codes * n_tiles // 8 + 1, dtype=np.uint8)
    label_keys = q_codes * n_tiles + (q_floor // tile - first)
    np.bitwise_or.at(bits, label_keys >> 3, np.left_shift(1, label_keys & 7).astype(np.uint8))
    keys = ts // tile  # in place from here: this runs over every source event
    keys -= first
    inside = (keys >= 0) & (keys < n_tiles) & (codes >= 0)
    keys += codes * n_tiles
    keys[~inside] = 0
    found = bits[keys >> 3]
    np.bitwise_and(keys, 7, out=keys)
    found >>= keys.astype(np.uint8)
    return np.asarray(inside & (found & 1).astype(bool))


def _empty_partials(columns: list[str], kinds: dict[str, list[str]], dtypes: dict[str, str],
                    n_codes: int) -> Parts:
    empty = np.zeros(0, dtype=np.int64)
    parts = {}
    for column in columns:
        part = _RowPartials(empty, {})
        for kind in kinds[column]:
            if kind == "last":
                part.last = _LastColumn(pa.nulls(0, arrow_type(dtypes[column])), empty, np.zeros(0, dtype=bool), empty)
            else:
                floating = dtypes[column] == "float64" or kind in ("sum", "sumsq")
                part.arrays[kind] = np.zeros(0, dtype=np.float64 if floating else np.int64)
        parts[column] = part
    return Timeline(empty, empty, n_codes), parts


def _numbers(data: pa.Array) -> np.ndarray:
    return _to_numpy(pc.fill_null(pc.cast(data, pa.float64()), 0)).astype(np.float64, copy=False)


def _fill(data: pa.Array | pa.ChunkedArray, op: str, dtype: str | None = None) -> np.ndarray:
    """A min/max/sum partial as numpy, nulls replaced by the op's identity (bool as int64)."""
    floating = pa.types.is_floating(data.type) or dtype == "float64"
    values = _to_numpy(pc.fill_null(pc.cast(data, pa.float64() if floating else pa.int64()), 0))
    values = values.astype(np.float64 if floating else np.int64, copy=False)
    if data.null_count and op != "sum":
        nulls = _to_numpy(pc.is_null(data)).astype(bool)
        values = np.where(nulls, merge_identity(op, values.dtype), values)
    return values
