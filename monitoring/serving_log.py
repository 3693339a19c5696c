"""Serving logs: every feature vector and prediction, buffered in memory and written as hourly Parquet.

    <root>/serving_logs/date=YYYY-MM-DD/hour=HH/part-<time>-<uuid>.parquet

Columns: `ts` (timestamp µs UTC, when `log` was called), `request_id`, `call_id` (one id per request to the
prediction service: its rows on one arm were scored by one model call), `model_version`, `arm`
(champion / shadow / canary / paired …), `latency_ms`, `prediction` (float64, may be null), `error` (empty, or
why the model failed on the row: then `prediction` is null), `rollout_id`, `rollout_step` (int64) and
`canary_fraction` (float64): the rollout, step and traffic share the row was routed under (null when no rollout
ran), so a judge counts only rows served under the step it judges; then one column per entity
key named `key.<name>` and one per feature named `feature.<name>` (names as the caller gives them, e.g.
"user_spend:amount_sum_1h"); the prefixes keep a key and a feature of the same name apart. A file holds the
rows of one flush that fall into its hour; its schema is the union of the keys and features in that flush.

Latency: `log()` appends one tuple to a list under a lock (~1 µs); `log_batch()` appends one record of whole
columns (numpy arrays or lists) for many rows at once, so a request's rows cost no per-row Python. A background
thread swaps the list out and writes it when `flush_rows` rows are waiting or every `flush_interval_s`; numeric
numpy columns go to Arrow as they are (no Python objects), and a file's columns and types are the same whichever
call logged its rows. Each file is written to a hidden temp name in its folder and renamed into place, so
readers never see half a file.
Durability: `close()` (also registered with atexit) writes everything still buffered. A crash (SIGKILL, power
loss) loses what was logged since the last flush — at most one `flush_interval_s` (or `flush_rows` rows).
A failed write keeps its rows and retries at the next flush. When writes cannot keep up and
`max_buffer_rows` rows are waiting (a batch that does not fit whole is dropped whole), or after `close()`, new
rows are dropped and counted (`dropped`, and the `quiver_serving_log_dropped_total` metric) rather than
slowing or failing a request.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

log = logging.getLogger("quiver.serving_log")

LOG_DIR = "serving_logs"
KEY_PREFIX = "key."
FEATURE_PREFIX = "feature."
_US_PER_HOUR = 3_600_000_000
_BASE = pa.schema([("ts", pa.timestamp("us", tz="UTC")), ("request_id", pa.string()), ("call_id", pa.string()),
                   ("model_version", pa.string()), ("arm", pa.string()), ("latency_ms", pa.float64()),
                   ("prediction", pa.float64()), ("error", pa.string()), ("rollout_id", pa.int64()),
                   ("rollout_step", pa.int64()), ("canary_fraction", pa.float64())])

Record = tuple[int, str, Mapping[str, Any], Mapping[str, Any], str, str, float, float | None, str]
RolloutTag = tuple[int, int, float]  # (rollout id, step, canary fraction) a row was routed under


@dataclass(frozen=True, slots=True)
class Batch:
    """Rows of one `log_batch` call as columns; a str/float field holds one value for every row."""

    n: int
    ts_us: int | np.ndarray
    request_ids: Sequence[str]
    entity_keys: Mapping[str, Any]
    features: Mapping[str, Any]
    model_version: str | np.ndarray
    arm: str | np.ndarray
    latency_ms: float | np.ndarray
    predictions: np.ndarray | None
    error: str | np.ndarray
    rollout: RolloutTag | None = None
    call_id: str = ""


class ServingLogger:
    """Buffered, asynchronous writer of serving logs (see the module docstring)."""

    def __init__(self, root: str | Path, *, flush_rows: int = 10_000, flush_interval_s: float = 5.0,
                 max_buffer_rows: int = 1_000_000, compression: str = "zstd"):
        if flush_rows < 1 or flush_interval_s <= 0:
            raise ValueError("flush_rows must be >= 1 and flush_interval_s > 0")
        self.directory = Path(root) / LOG_DIR
        self.flush_rows, self.flush_interval_s = flush_rows, flush_interval_s
        self.max_buffer_rows, self.compression = max_buffer_rows, compression
        self.written = 0
        self.dropped = 0
        self.files_written = 0
        self._buffer: list[Record | Batch] = []
        self._rows = 0  # rows in _buffer (a Batch holds many)
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()  # one writer at a time: the thread, flush() or close()
        self._wake = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="quiver-serving-log", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def log(self, request_id: str, entity_keys: Mapping[str, Any], features: Mapping[str, Any],
            model_version: str = "", arm: str = "champion", latency_ms: float = 0.0,
            prediction: float | None = None, ts: datetime | None = None, error: str = "") -> None:
        """Buffer one served request; returns immediately. The mappings must not be mutated afterwards."""
        ts_us = time.time_ns() // 1000 if ts is None else _micros(ts)
        record = (ts_us, request_id, entity_keys, features, model_version, arm, latency_ms, prediction, error)
        self._append(record, 1)

    def log_batch(self, request_ids: Sequence[str], entity_keys: Mapping[str, Any], features: Mapping[str, Any],
                  model_version: str | np.ndarray = "", arm: str | np.ndarray = "champion",
                  latency_ms: float | np.ndarray = 0.0, predictions: np.ndarray | None = None,
                  ts_us: np.ndarray | int | None = None, error: str | np.ndarray = "",
                  rollout: RolloutTag | None = None, call_id: str = "") -> None:
        """Buffer many served rows given as columns (numpy arrays or lists, one value per row); returns at once.

        `model_version`, `arm`, `latency_ms` and `error` are one value for all rows or one per row; `ts_us` is
        epoch microseconds UTC (default: now); `prediction` is null where `error` is non-empty (and everywhere
        when `predictions` is None); `rollout` tags every row with the rollout, step and canary fraction it was
        routed under; `call_id` names the request all these rows came in (one model call per arm). The files written are the same as from `log()` of the same rows. Nothing
        passed may be mutated afterwards (the arrays are written by the background thread)."""
        n = len(request_ids)
        for what, columns in (("entity_keys", entity_keys), ("features", features)):
            for name, values in columns.items():
                if len(values) != n:
                    raise ValueError(f"log_batch: {what}[{name!r}] holds {len(values)} values for {n} request_ids")
        per_row = {"model_version": model_version, "arm": arm, "latency_ms": latency_ms, "error": error,
                   "predictions": predictions, "ts_us": ts_us}
        for name, value in per_row.items():
            if isinstance(value, np.ndarray) and value.shape != (n,):
                raise ValueError(f"log_batch: {name} has shape {value.shape} for {n} request_ids")
        if n == 0:
            return
        stamp = time.time_ns() // 1000 if ts_us is None else \
            ts_us.astype(np.int64, copy=False) if isinstance(ts_us, np.ndarray) else int(ts_us)
        self._append(Batch(n, stamp, request_ids, dict(entity_keys), dict(features), model_version, arm,
                           latency_ms, predictions, error, rollout, call_id), n)

    def _append(self, item: Record | Batch, rows: int) -> None:
        with self._lock:
            if self._closed or self._rows + rows > self.max_buffer_rows:
                self.dropped += rows
                full = True
            else:
                self._buffer.append(item)
                self._rows += rows
                full = False
                if self._rows >= self.flush_rows:
                    self._wake.set()
        if full:
            from quiver.monitoring import metrics

            metrics.SERVING_LOG_DROPPED.inc(rows)

    @property
    def buffered(self) -> int:
        """Rows waiting to be written."""
        with self._lock:
            return self._rows

    def flush(self) -> int:
        """Write everything buffered now (in the caller's thread); returns the rows written."""
        with self._write_lock:
            with self._lock:
                items, self._buffer, rows, self._rows = self._buffer, [], self._rows, 0
            if not items:
                return 0
            try:
                self._write(items, rows)
            except Exception:
                with self._lock:  # keep the rows: the next flush tries again
                    self._buffer[:0] = items
                    self._rows += rows
                raise
            return rows

    def close(self) -> None:
        """Stop the background thread and write what is left. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._wake.set()
        self._thread.join()
        self.flush()
        atexit.unregister(self.close)

    def __enter__(self) -> ServingLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> None:
        while True:
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            with self._lock:
                closing = self._closed
            if closing:
                return  # close() does the final flush in its own thread
            try:
                self.flush()
            except Exception:
                log.exception("serving-log flush failed; rows kept for the next flush")

    def _write(self, items: list[Record | Batch], rows: int) -> None:
        from quiver.monitoring import metrics

        started = time.perf_counter()
        by_hour: dict[int, list[Batch]] = defaultdict(list)
        for batch in _batches(items):
            for hour, part in _split_by_hour(batch):
                by_hour[hour].append(part)
        for hour, parts in sorted(by_hour.items()):
            table = batches_to_table(parts)
            moment = datetime.fromtimestamp(hour * 3600, UTC)
            folder = self.directory / f"date={moment:%Y-%m-%d}" / f"hour={moment:%H}"
            folder.mkdir(parents=True, exist_ok=True)
            name = f"part-{time.time_ns()}-{uuid.uuid4().hex[:8]}.parquet"
            tmp = folder / f".{name}.tmp"
            try:
                pq.write_table(table, tmp, compression=self.compression)
                os.replace(tmp, folder / name)
            finally:
                tmp.unlink(missing_ok=True)
            self.files_written += 1
        self.written += rows
        metrics.SERVING_LOG_ROWS.inc(rows)
        metrics.SERVING_LOG_FLUSH_SECONDS.observe(time.perf_counter() - started)


def _micros(ts: datetime) -> int:
    if ts.tzinfo is None:
        raise ValueError("serving-log timestamps must be timezone-aware (UTC)")
    delta = ts - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def records_to_table(records: list[Record]) -> pa.Table:
    """Buffered `log()` records as one Arrow table (columns as in the module docstring)."""
    return batches_to_table([_records_batch(records)])


def batches_to_table(batches: Sequence[Batch]) -> pa.Table:
    """Batches as one Arrow table, rows in order: the same columns and types as `log()` of the same rows."""
    keys: dict[str, None] = {}
    features: dict[str, None] = {}
    for batch in batches:
        keys.update(dict.fromkeys(batch.entity_keys))
        features.update(dict.fromkeys(batch.features))
    # The fixed columns are small next to the features: plain Python lists, exactly as `log()` builds them.
    columns: dict[str, pa.Array] = {
        "ts": pa.array(_flat(batches, "ts_us"), pa.int64()).cast(_BASE.field("ts").type),
        "request_id": pa.array([r for b in batches for r in b.request_ids], pa.string()),
        "call_id": pa.array(_flat(batches, "call_id"), pa.string()),
        "model_version": pa.array(_flat(batches, "model_version"), pa.string()),
        "arm": pa.array(_flat(batches, "arm"), pa.string()),
        "latency_ms": pa.array(_flat(batches, "latency_ms"), pa.float64()),
        "prediction": pa.array([p for b in batches for p in _predictions(b)], pa.float64()),
        "error": pa.array(_flat(batches, "error"), pa.string()),
        **_rollout_columns(batches),
    }
    for name in keys:
        columns[KEY_PREFIX + name] = _merge([(b.entity_keys.get(name), b.n) for b in batches])
    for name in features:
        columns[FEATURE_PREFIX + name] = _merge([(b.features.get(name), b.n) for b in batches])
    return pa.table(columns)


def _rollout_columns(batches: Sequence[Batch]) -> dict[str, pa.Array]:
    names = ("rollout_id", "rollout_step", "canary_fraction")
    values: list[list[Any]] = [[], [], []]
    for batch in batches:
        tag = batch.rollout or (None, None, None)
        for column, value in zip(values, tag, strict=True):
            column.extend([value] * batch.n)
    return {name: pa.array(column, _BASE.field(name).type) for name, column in zip(names, values, strict=True)}


def _records_batch(records: list[Record]) -> Batch:
    keys: dict[str, None] = {}
    features: dict[str, None] = {}
    for record in records:
        keys.update(dict.fromkeys(record[2]))
        features.update(dict.fromkeys(record[3]))
    return Batch(len(records), np.array([r[0] for r in records], np.int64), [r[1] for r in records],
                 {k: [r[2].get(k) for r in records] for k in keys},
                 {f: [r[3].get(f) for r in records] for f in features},
                 np.array([r[4] for r in records], object), np.array([r[5] for r in records], object),
                 np.array([r[6] for r in records], object), np.array([r[7] for r in records], object),
                 np.array([r[8] for r in records], object))


def _batches(items: list[Record | Batch]) -> list[Batch]:
    """Buffered items in order as batches: each run of `log()` records becomes one."""
    out: list[Batch] = []
    run: list[Record] = []
    for item in items:
        if isinstance(item, Batch):
            if run:
                out.append(_records_batch(run))
                run = []
            out.append(item)
        else:
            run.append(item)
    if run:
        out.append(_records_batch(run))
    return out


def _split_by_hour(batch: Batch) -> list[tuple[int, Batch]]:
    if not isinstance(batch.ts_us, np.ndarray):
        return [(batch.ts_us // _US_PER_HOUR, batch)]
    hours = batch.ts_us // _US_PER_HOUR
    if (hours == hours[0]).all():
        return [(int(hours[0]), batch)]
    return [(int(hour), _take(batch, np.flatnonzero(hours == hour))) for hour in np.unique(hours)]


def _take(batch: Batch, index: np.ndarray) -> Batch:
    def take(values: Any) -> Any:
        if isinstance(values, np.ndarray):
            return values[index]
        if isinstance(values, str | int | float) or values is None:
            return values
        return [values[i] for i in index.tolist()]

    return Batch(len(index), take(batch.ts_us), take(batch.request_ids),
                 {k: take(v) for k, v in batch.entity_keys.items()}, {k: take(v) for k, v in batch.features.items()},
                 take(batch.model_version), take(batch.arm), take(batch.latency_ms), take(batch.predictions),
                 take(batch.error), batch.rollout, batch.call_id)


def _flat(batches: Sequence[Batch], name: str) -> list[Any]:
    """Field `name` with one value per row, whether a batch holds one value for all its rows or an array."""
    out: list[Any] = []
    for batch in batches:
        value = getattr(batch, name)
        out.extend(value.tolist() if isinstance(value, np.ndarray) else [value] * batch.n)
    return out


def _predictions(batch: Batch) -> list[float | None]:
    if batch.predictions is None:
        return [None] * batch.n
    values: list[float | None] = batch.predictions.tolist()
    if batch.predictions.dtype == object:  # from log(): the caller's values, nulls included
        return values
    if isinstance(batch.error, str):
        return [None] * batch.n if batch.error else values
    return [None if e else v for v, e in zip(values, batch.error.tolist(), strict=True)]


_NUMPY_KINDS = frozenset("fibU")  # dtypes Arrow takes straight from numpy with the types `log()` infers


def _array(values: Any) -> pa.Array:
    """One column piece as Arrow, typed as `log()` would type the same Python values."""
    if isinstance(values, np.ndarray):
        kind = values.dtype.kind
        if kind == "f":
            return pa.array(values.astype(np.float64, copy=False))
        if kind == "i" or (kind == "u" and values.dtype.itemsize <= 4):
            return pa.array(values.astype(np.int64, copy=False))
        if kind == "b":
            return pa.array(values, pa.bool_())
        if kind == "U":
            return pa.array(values, pa.string())
    return _values(_python(values))


def _python(values: Any) -> list[Any]:
    return values.tolist() if isinstance(values, np.ndarray) else list(values)


def _merge(pieces: list[tuple[Any, int]]) -> pa.Array:
    """One key/feature column from its piece in each batch (None: the batch lacks it, so nulls)."""
    present = [v for v, _ in pieces if v is not None]
    numpy = [v for v in present if isinstance(v, np.ndarray) and v.dtype.kind in _NUMPY_KINDS]
    if not numpy:  # Python values only: one inference over the whole column, as `log()` does
        return _values([x for v, n in pieces for x in (_python(v) if v is not None else [None] * n)])
    kinds = {v.dtype.kind for v in numpy}
    if len(numpy) == len(pieces) and len(kinds) == 1:
        return _array(np.concatenate(numpy) if len(numpy) > 1 else numpy[0])
    arrays = [None if v is None else _array(v) for v, _ in pieces]
    types = {a.type for a in arrays if a is not None and a.type != pa.null()}
    if len(types) > 1:  # e.g. ints in one batch, floats or text in another: let one inference decide
        return _values([x for v, n in pieces for x in (_python(v) if v is not None else [None] * n)])
    target = types.pop() if types else pa.null()
    return pa.concat_arrays([a if a is not None and a.type == target else pa.nulls(n, target)
                             for a, (_, n) in zip(arrays, pieces, strict=True)])


def _values(values: list[Any]) -> pa.Array:
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        # Mixed types in one flush (e.g. a number and a string): keep every value, as text.
        return pa.array([None if v is None else str(v) for v in values], pa.string())


def read_serving_logs(root: str | Path, start: datetime | None = None, end: datetime | None = None,
                      arm: str | None = None) -> pa.Table:
    """Serving-log rows with start <= ts < end (optionally one arm), oldest first, schemas unified."""
    directory = Path(root) / LOG_DIR
    files = sorted(p for p in directory.glob("date=*/hour=*/part-*.parquet") if _hour_overlaps(p, start, end))
    if not files:
        return _BASE.empty_table()
    tables = [pq.read_table(p) for p in files]
    table = pa.concat_tables(tables, promote_options="permissive")
    import pyarrow.compute as pc

    mask = None
    if start is not None:
        mask = pc.greater_equal(table["ts"], pa.scalar(start, _BASE.field("ts").type))
    if end is not None:
        upper = pc.less(table["ts"], pa.scalar(end, _BASE.field("ts").type))
        mask = upper if mask is None else pc.and_(mask, upper)
    if arm is not None:
        same = pc.equal(table["arm"], arm)
        mask = same if mask is None else pc.and_(mask, same)
    if mask is not None:
        table = table.filter(mask)
    for field in _BASE:  # files from older servers lack the newer columns: they read as nulls
        if field.name not in table.column_names:
            table = table.append_column(field, pa.nulls(table.num_rows, field.type))
    return table.sort_by([("ts", "ascending")])


def _hour_overlaps(path: Path, start: datetime | None, end: datetime | None) -> bool:
    try:
        hour_start = datetime.strptime(f"{path.parent.parent.name[5:]} {path.parent.name[5:]}",
                                       "%Y-%m-%d %H").replace(tzinfo=UTC)
    except ValueError:
        return False
    hour_end = hour_start.timestamp() + 3600
    if start is not None and hour_end <= start.timestamp():
        return False
    return not (end is not None and hour_start >= end)


def feature_frame(table: pa.Table) -> pa.Table:
    """Only the feature columns, with the `feature.` prefix removed (ready for drift checks)."""
    names = [n for n in table.column_names if n.startswith(FEATURE_PREFIX)]
    return table.select(names).rename_columns([n[len(FEATURE_PREFIX):] for n in names])
