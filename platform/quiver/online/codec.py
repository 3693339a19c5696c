"""Pack Arrow rows into the online layout and decode MGET replies into columns (layout.py says what the bytes are).

Encoding builds one numpy record array per batch and slices its bytes per entity; decoding joins the
replies and reads them with one `numpy.frombuffer`. Only string slots take a Python loop per value.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from itertools import pairwise
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from quiver.catalog.aggregations import EVENTS_COLUMN, TILE_START, last_ts_column
from quiver.catalog.ir import ViewSpec
from quiver.offline.layout import EVENT_TS
from quiver.offline.pit_plan import ascending_order
from quiver.online.base import Batch, Column, Key, timestamp_us
from quiver.online.layout import (
    INT64_MIN,
    last_record_dtype,
    null_bytes,
    tile_partials,
    tile_record_dtype,
    trim_horizon_us,
)
from quiver.online.merge import Segments, window_features

log = logging.getLogger(__name__)

ArrowColumn = Any  # pa.Array | pa.ChunkedArray (pyarrow ships no type stubs)


def int64_values(column: ArrowColumn) -> np.ndarray:
    """int64 numpy values of an integer or timestamp (→ epoch µs) Arrow column; nulls become 0."""
    if pa.types.is_timestamp(column.type):
        if column.type.unit != "us":
            column = pc.cast(column, pa.timestamp("us", tz=column.type.tz))
        column = column.cast(pa.int64())
    elif pa.types.is_date(column.type):
        column = pc.cast(pc.cast(column, pa.timestamp("us")), pa.int64())
    if column.null_count:
        column = pc.fill_null(column, 0)
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.int64)


def slot_values(column: ArrowColumn, dtype: str) -> np.ndarray:
    """Numpy values for a fixed-width slot of logical `dtype`; nulls become 0."""
    if dtype in ("int64", "timestamp"):
        return int64_values(column)
    if dtype == "bool":
        return np.asarray(pc.fill_null(column, False).to_numpy(zero_copy_only=False), dtype=np.uint8)
    if column.type != pa.float64():
        column = column.cast(pa.float64())
    if column.null_count:
        column = pc.fill_null(column, 0.0)
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.float64)


def string_values(column: ArrowColumn) -> list[bytes]:
    """UTF-8 bytes per row (null → b'')."""
    return [b or b"" for b in pc.cast(column, pa.binary()).to_pylist()]


def null_mask(column: ArrowColumn) -> np.ndarray | None:
    """True where null; None when the column has no nulls (the common case, and free to check)."""
    if not column.null_count:
        return None
    return np.asarray(column.is_null().to_numpy(zero_copy_only=False), dtype=bool)


def _split(blob: bytes, width: int, bounds: np.ndarray) -> list[bytes]:
    """Slices of `blob` between consecutive record `bounds` (record indices)."""
    cuts = (bounds * width).tolist()
    return [blob[a:b] for a, b in pairwise(cuts)]


class LastCodec:
    """Last-value records of one view."""

    def __init__(self, view: ViewSpec):
        self.view = view
        self.dtype = last_record_dtype(view)
        self.width = self.dtype.itemsize
        self.index = {f.name: i for i, f in enumerate(view.fields)}
        self.strings = [i for i, f in enumerate(view.fields) if f.dtype == "string"]
        empty = np.zeros(1, self.dtype)
        empty["ts"] = INT64_MIN
        empty["nulls"] = 0xFF
        self.empty = empty.tobytes()
        self.runs, self.where, self.read_dtype = _slot_runs(view, self.dtype)
        self.nulls_at = int(self.dtype.fields["nulls"][1]) if self.dtype.fields else 0
        self.null_width = null_bytes(len(view.fields))
        self.no_nulls = bytes(self.null_width)
        self.run_start: dict[str, int] = {}
        self.run_size: dict[str, int] = {}
        self.run_dtype: dict[str, str] = {}
        for i, f in enumerate(view.fields):
            run = self.where[i][0]
            self.run_start.setdefault(run, i)
            self.run_size[run] = self.run_size.get(run, 0) + 1
            self.run_dtype[run] = f.dtype
        self._plans: dict[tuple[str, ...], tuple[list[Any], list[tuple[Key, int]]]] = {}

    def encode(self, table: pa.Table) -> tuple[list[bytes], np.ndarray]:
        """(one packed value per row, event_ts µs per row)."""
        n, fields = table.num_rows, self.view.fields
        rec = np.zeros(n, self.dtype)
        ts = int64_values(table.column(EVENT_TS))
        rec["ts"] = ts
        nulls = np.zeros((n, null_bytes(len(fields)) * 8), dtype=bool)
        strings: list[list[bytes]] = []
        for i, f in enumerate(fields):
            column = table.column(f.name)
            mask = null_mask(column)
            if mask is not None:
                nulls[:, i] = mask
            if f.dtype == "string":
                strings.append(string_values(column))
                rec[f"f{i}"] = [len(s) for s in strings[-1]]
            else:
                rec[f"f{i}"] = slot_values(column, f.dtype)
        rec["nulls"] = np.packbits(nulls, axis=1, bitorder="little")
        blob, w = rec.tobytes(), self.width
        if not strings:
            return [blob[i:i + w] for i in range(0, n * w, w)], ts
        return [blob[i * w:(i + 1) * w] + b"".join(parts) for i, parts in enumerate(zip(*strings, strict=True))], ts

    def decode(self, values: Sequence[bytes | None], features: Sequence[str], at: np.ndarray,
               ttl_us: int | None, batch: Batch | None = None) -> Batch:
        """Columns of `features` as of `at` (µs, scalar or per entity), TTL applied, added to `batch`."""
        batch = Batch() if batch is None else batch
        w, empty, n = self.width, self.empty, len(values)
        if self.strings:
            fixed = b"".join([v[:w] if v is not None and len(v) >= w else empty for v in values])
            var = b"".join([v[w:] for v in values if v is not None and len(v) >= w])
        else:
            var = b""
            try:
                fixed = b"".join(values)  # type: ignore[arg-type]  # every entity found (usual): one C-level join
            except TypeError:
                fixed = b"".join([v if v is not None else empty for v in values])
            if len(fixed) != n * w:
                fixed = b"".join([v if v is not None and len(v) == w else empty for v in values])
                log.warning("online store: ignored %d values of view %s with a foreign layout",
                            sum(v is not None and len(v) != w for v in values), self.view.name)
        rec = np.frombuffer(fixed, self.read_dtype)
        valid, whole = self._validity(fixed, rec, at, ttl_us)
        runs, strings = self._plan(tuple(features))
        for run, first, count, dtype, items, indexes in runs:
            raw = rec[run]
            block = raw != 0 if dtype == "bool" else raw.astype(np.float64 if dtype == "float64" else np.int64)
            number = len(batch.blocks)
            index = indexes.get(number)
            if index is None:  # the same request puts this run at the same block number every time
                index = indexes[number] = {key: (number, position) for key, position in items}
            batch.add_indexed(index, block, valid[:, first:first + count], dtype, whole)
        if strings:
            lengths = np.stack([rec[self.where[j][0]][:, self.where[j][1]].astype(np.int64)
                                for j in self.strings], axis=1)
            ends = np.cumsum(lengths.ravel()).reshape(lengths.shape)
            starts = ends - lengths
            for key, i in strings:
                k = self.strings.index(i)
                lo, hi = starts[:, k].tolist(), ends[:, k].tolist()
                col = np.full(n, None, dtype=object)
                for r in np.flatnonzero(valid[:, i]).tolist():
                    col[r] = var[lo[r]:hi[r]].decode()
                batch.add(key, Column(col, valid[:, i], "string"))
        return batch

    def _validity(self, fixed: bytes, rec: np.ndarray, at: np.ndarray,
                  ttl_us: int | None) -> tuple[np.ndarray, bool | None]:
        """Per entity and field, whether the value counts as of `at`: the record is there, older than `at` and
        no older than the TTL, and the field is not null. Also True when every value counts, None when unknown."""
        fields = len(self.view.fields)
        if len(rec) == 1 and at.ndim == 0 and fixed[self.nulls_at:self.nulls_at + self.null_width] == self.no_nulls:
            # One entity without nulls (most online reads): a few integer comparisons instead of a dozen numpy
            # calls on one-row arrays, which cost more than the rest of the decode.
            event_us, now = int.from_bytes(fixed[:8], "little", signed=True), int(at)
            fresh = event_us != INT64_MIN and event_us < now and (ttl_us is None or event_us >= now - ttl_us)
            valid = np.empty((1, fields), dtype=bool)
            valid.fill(fresh)
            return valid, fresh
        ts = rec["ts"]
        if at.ndim == 0:  # one time for all: one range test
            t = int(at)
            fresh_rows = (ts >= (INT64_MIN + 1 if ttl_us is None else max(t - ttl_us, INT64_MIN + 1))) & (ts < t)
        else:
            fresh_rows = (ts != INT64_MIN) & (ts < at)
            if ttl_us is not None:
                fresh_rows &= ts >= at - ttl_us
        nulls = rec["nulls"]
        if not nulls.any():  # no null anywhere (missing entities have every bit set): a row's fields go together
            return np.repeat(fresh_rows[:, None], fields, axis=1), None
        return (np.unpackbits(nulls, axis=1, count=fields, bitorder="little") == 0) & fresh_rows[:, None], None

    def _plan(self, features: tuple[str, ...]) -> tuple[list[Any], list[tuple[Key, int]]]:
        """Per run of slots, the requested features in it; cached per feature tuple."""
        plan = self._plans.get(features)
        if plan is None:
            runs: list[Any]
            by_run: dict[str, list[tuple[Key, int]]] = {}
            strings: list[tuple[Key, int]] = []
            for name in features:
                i = self.index[name]
                key = (self.view.name, name)
                if self.view.fields[i].dtype == "string":
                    strings.append((key, i))
                else:
                    by_run.setdefault(self.where[i][0], []).append((key, self.where[i][1]))
            runs = [(run, self.run_start[run], self.run_size[run], self.run_dtype[run], items, {})
                    for run, items in by_run.items()]
            plan = self._plans[features] = (runs, strings)
        return plan


def _slot_runs(view: ViewSpec, dtype: np.dtype[Any]) -> tuple[list[str], dict[int, tuple[str, int]], np.dtype[Any]]:
    """A read dtype over the same bytes where runs of adjacent fields with one slot type are one 2-D
    subarray, so a batch decodes with one conversion per run instead of one per feature."""
    fields: Mapping[str, Any] = dtype.fields or {}
    names, formats, offsets = ["ts", "nulls"], [fields["ts"][0], fields["nulls"][0]], [0, fields["nulls"][1]]
    where: dict[int, tuple[str, int]] = {}
    runs: list[str] = []
    previous: tuple[str, str] | None = None
    for i, f in enumerate(view.fields):
        slot = fields[f"f{i}"][0].str
        kind = (slot, "string" if f.dtype == "string" else f.dtype)
        if kind != previous:
            runs.append(f"r{len(runs)}")
            names.append(runs[-1])
            formats.append([slot, 0])
            offsets.append(fields[f"f{i}"][1])
            previous = kind
        where[i] = (runs[-1], formats[-1][1])
        formats[-1][1] += 1
    read = np.dtype({"names": names, "formats": [f if not isinstance(f, list) else (f[0], (f[1],)) for f in formats],
                     "offsets": offsets, "itemsize": dtype.itemsize})
    return runs, where, read


class TileCodec:
    """Tile records of one aggregation view."""

    def __init__(self, view: ViewSpec):
        self.view = view
        self.dtype = tile_record_dtype(view)
        self.width = self.dtype.itemsize
        self.partials = tile_partials(view)
        self.horizon = trim_horizon_us(view)
        fields: Mapping[str, Any] = self.dtype.fields or {}
        self.slot_offsets = {name: int(spec[1]) for name, spec in fields.items()}
        self.var_offset = self.slot_offsets.get("var_len", 0)
        self.string_slots = [i for i, p in enumerate(self.partials) if p.dtype == "string"]

    def encode(self, table: pa.Table) -> tuple[pa.Table, list[bytes], np.ndarray]:
        """Group tiles per entity: (key columns of each entity, packed value, newest tile_start).

        Duplicate (entity, tile_start) rows keep the one with most events; tiles older than the
        entity's newest minus the trim horizon are dropped before they are sent.
        """
        keys = self.view.key_names
        if table.num_rows == 0:
            return table.select(keys), [], np.zeros(0, dtype=np.int64)
        order = pc.sort_indices(table, sort_keys=[(k, "ascending") for k in keys]
                                + [(TILE_START, "ascending"), (EVENTS_COLUMN, "ascending")])
        table = table.take(order)
        n = table.num_rows
        starts_ts = int64_values(table.column(TILE_START))
        new_entity = np.zeros(n, dtype=bool)
        new_entity[0] = True
        for k in keys:
            col = table.column(k).to_numpy(zero_copy_only=False)
            new_entity[1:] |= col[1:] != col[:-1]
        group = np.cumsum(new_entity) - 1
        last_of_run = np.ones(n, dtype=bool)  # last row of each (entity, tile_start) run
        last_of_run[:-1] = new_entity[1:] | (starts_ts[1:] != starts_ts[:-1])
        newest = starts_ts[np.append(np.flatnonzero(new_entity)[1:], n) - 1]
        keep = last_of_run & (starts_ts >= newest[group] - self.horizon)
        if not keep.all():
            idx = np.flatnonzero(keep)
            table, starts_ts, group = table.take(pa.array(idx)), starts_ts[idx], group[idx]
        rec = self._records(table, starts_ts)
        bounds = np.concatenate([[0], np.flatnonzero(np.diff(group)) + 1, [len(group)]]).astype(np.int64)
        firsts = table.select(keys).take(pa.array(bounds[:-1]))
        if not self.string_slots:
            return firsts, _split(rec.tobytes(), self.width, bounds), newest
        strings = [string_values(table.column(self.partials[i].name)) for i in self.string_slots]
        blob, w = rec.tobytes(), self.width
        records = [blob[i * w:(i + 1) * w] + b"".join(parts) for i, parts in enumerate(zip(*strings, strict=True))]
        cuts = bounds.tolist()
        return firsts, [b"".join(records[a:b]) for a, b in pairwise(cuts)], newest

    def _records(self, table: pa.Table, starts_ts: np.ndarray) -> np.ndarray:
        rec = np.zeros(table.num_rows, self.dtype)
        rec["tile_start"] = starts_ts
        rec["n_events"] = int64_values(table.column(EVENTS_COLUMN))
        var_len = np.zeros(table.num_rows, dtype=np.int64)
        for i, partial in enumerate(self.partials):
            column = table.column(partial.name)
            if partial.dtype == "string":
                lengths = np.array([len(s) for s in string_values(column)], dtype=np.int64)
                rec[f"p{i}"] = lengths
                var_len += lengths
            else:
                rec[f"p{i}"] = slot_values(column, partial.dtype)
            if partial.partial.kind == "last":
                rec[f"t{i}"] = int64_values(table.column(last_ts_column(partial.column)))
        if self.string_slots:
            rec["var_len"] = var_len
        return rec

    def decode(self, values: Sequence[bytes | None], features: Sequence[str], at: np.ndarray,
               batch: Batch | None = None) -> Batch:
        """Window values of `features` as of `at` (µs, scalar or per entity), added to `batch`."""
        batch = Batch() if batch is None else batch
        n, w = len(values), self.width
        strings: list[list[str]] = [[] for _ in self.string_slots]
        if self.string_slots:
            fixed, counts = self._walk(values, strings)
        else:
            lengths = np.fromiter((len(v) if v is not None else 0 for v in values), dtype=np.int64, count=n)
            bad = lengths % w != 0
            if bad.any():
                log.warning("online store: ignored %d values of view %s with a foreign layout",
                            int(bad.sum()), self.view.name)
                values = [None if b else v for v, b in zip(values, bad.tolist(), strict=True)]
                lengths[bad] = 0
            fixed = b"".join([v for v in values if v])
            counts = lengths // w
        rec = np.frombuffer(fixed, self.dtype)
        segs = Segments(np.repeat(np.arange(n), counts), n)
        partials: dict[str, np.ndarray] = {}
        for i, partial in enumerate(self.partials):
            if partial.dtype == "string":
                partials[partial.name] = np.array(strings[self.string_slots.index(i)], dtype=object)
            else:
                partials[partial.name] = np.ascontiguousarray(rec[f"p{i}"])
            if partial.partial.kind == "last":
                partials[last_ts_column(partial.column)] = np.ascontiguousarray(rec[f"t{i}"])
        tile_start = np.ascontiguousarray(rec["tile_start"])
        columns = window_features(self.view, features, tile_start, partials, segs, np.asarray(at, dtype=np.int64))
        for name, column in columns.items():
            batch.add((self.view.name, name), column)
        return batch

    def _walk(self, values: Sequence[bytes | None], strings: list[list[str]]) -> tuple[bytes, np.ndarray]:
        # Records with strings are self-delimiting (var_len at a fixed offset); walk them one by one.
        w, vo = self.width, self.var_offset
        slot_offsets = [self.slot_offsets[f"p{i}"] for i in self.string_slots]
        fixed: list[bytes] = []
        counts = np.zeros(len(values), dtype=np.int64)
        for e, value in enumerate(values):
            if not value:
                continue
            pos, end = 0, len(value)
            while pos + w <= end:
                head = value[pos:pos + w]
                var_len = int.from_bytes(head[vo:vo + 4], "little")
                cursor = pos + w
                for k, off in enumerate(slot_offsets):
                    size = int.from_bytes(head[off:off + 4], "little")
                    strings[k].append(value[cursor:cursor + size].decode())
                    cursor += size
                fixed.append(head)
                counts[e] += 1
                pos += w + var_len
        return b"".join(fixed), counts


def newest_per_entity(view: ViewSpec, table: pa.Table) -> pa.Table:
    """The newest row per entity; ties at one event_ts keep the greatest field values (NULL lowest), in
    field order — the offline store's rule, so online and offline pick the same row."""
    if table.num_rows <= 1:
        return table
    names = [*view.key_names, EVENT_TS, *(f.name for f in view.fields)]
    order = ascending_order(table, names)  # NULL lowest, NaN greatest: the SQL engines' DESC NULLS LAST
    last = np.zeros(table.num_rows, dtype=bool)
    last[-1] = True
    for k in view.key_names:
        col = table.column(k).take(order).to_numpy(zero_copy_only=False)
        last[:-1] |= col[1:] != col[:-1]
    if last.all():
        if np.array_equal(order.to_numpy(), np.arange(table.num_rows)):
            return table  # already one row per entity, in order (what materialize hands over)
        return table.take(order)
    # Take only the winners: moving every column of every row just to drop most of them costs more.
    return table.take(pc.array_filter(order, pa.array(last)))


def codec_for(view: ViewSpec) -> LastCodec | TileCodec:
    """The codec of a view's kind."""
    return LastCodec(view) if view.kind == "last" else TileCodec(view)


def empty_at(at: Any, n: int) -> np.ndarray:
    """`at` (epoch µs, or any timestamp) as int64: 0-d for one time, 1-d for one time per entity."""
    if not isinstance(at, int | np.ndarray | np.integer):
        at = timestamp_us(at)
    arr = np.asarray(at, dtype=np.int64)
    if arr.ndim and len(arr) != n:
        raise ValueError(f"`at` has {len(arr)} values for {n} entities")
    return arr
