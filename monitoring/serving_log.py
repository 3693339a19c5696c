"""Serving logs: every feature vector and prediction, buffered in memory and written as hourly Parquet.

    <root>/serving_logs/date=YYYY-MM-DD/hour=HH/part-<time>-<uuid>.parquet

Columns: `ts` (timestamp µs UTC, when `log` was called), `request_id`, `model_version`, `arm`
(champion / shadow / canary …), `latency_ms`, `prediction` (float64, may be null), then one column per entity
key named `key.<name>` and one per feature named `feature.<name>` (names as the caller gives them, e.g.
"user_spend:amount_sum_1h"); the prefixes keep a key and a feature of the same name apart. A file holds the
rows of one flush that fall into its hour; its schema is the union of the keys and features in that flush.

Latency: `log()` appends one tuple to a list under a lock (~1 µs); a background thread swaps the list out and
writes it when `flush_rows` rows are waiting or every `flush_interval_s`. Each file is written to a hidden temp
name in its folder and renamed into place, so readers never see half a file.
Durability: `close()` (also registered with atexit) writes everything still buffered. A crash (SIGKILL, power
loss) loses what was logged since the last flush — at most one `flush_interval_s` (or `flush_rows` rows).
A failed write keeps its rows and retries at the next flush. When writes cannot keep up and
`max_buffer_rows` are waiting, or after `close()`, new rows are dropped and counted (`dropped`, and the
`quiver_serving_log_dropped_total` metric) rather than slowing or failing a request.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

log = logging.getLogger("quiver.serving_log")

LOG_DIR = "serving_logs"
KEY_PREFIX = "key."
FEATURE_PREFIX = "feature."
_US_PER_HOUR = 3_600_000_000
_BASE = pa.schema([("ts", pa.timestamp("us", tz="UTC")), ("request_id", pa.string()),
                   ("model_version", pa.string()), ("arm", pa.string()), ("latency_ms", pa.float64()),
                   ("prediction", pa.float64())])

Record = tuple[int, str, Mapping[str, Any], Mapping[str, Any], str, str, float, float | None]


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
        self._buffer: list[Record] = []
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()  # one writer at a time: the thread, flush() or close()
        self._wake = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="quiver-serving-log", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def log(self, request_id: str, entity_keys: Mapping[str, Any], features: Mapping[str, Any],
            model_version: str = "", arm: str = "champion", latency_ms: float = 0.0,
            prediction: float | None = None, ts: datetime | None = None) -> None:
        """Buffer one served request; returns immediately. The mappings must not be mutated afterwards."""
        ts_us = time.time_ns() // 1000 if ts is None else _micros(ts)
        record = (ts_us, request_id, entity_keys, features, model_version, arm, latency_ms, prediction)
        with self._lock:
            if self._closed or len(self._buffer) >= self.max_buffer_rows:
                self.dropped += 1
                full = True
            else:
                self._buffer.append(record)
                full = False
                if len(self._buffer) >= self.flush_rows:
                    self._wake.set()
        if full:
            from monitoring import metrics

            metrics.SERVING_LOG_DROPPED.inc()

    @property
    def buffered(self) -> int:
        with self._lock:
            return len(self._buffer)

    def flush(self) -> int:
        """Write everything buffered now (in the caller's thread); returns the rows written."""
        with self._write_lock:
            with self._lock:
                batch, self._buffer = self._buffer, []
            if not batch:
                return 0
            try:
                self._write(batch)
            except Exception:
                with self._lock:  # keep the rows: the next flush tries again
                    self._buffer[:0] = batch
                raise
            return len(batch)

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

    def _write(self, batch: list[Record]) -> None:
        from monitoring import metrics

        started = time.perf_counter()
        by_hour: dict[int, list[Record]] = defaultdict(list)
        for record in batch:
            by_hour[record[0] // _US_PER_HOUR].append(record)
        for hour, records in sorted(by_hour.items()):
            table = records_to_table(records)
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
        self.written += len(batch)
        metrics.SERVING_LOG_ROWS.inc(len(batch))
        metrics.SERVING_LOG_FLUSH_SECONDS.observe(time.perf_counter() - started)


def _micros(ts: datetime) -> int:
    if ts.tzinfo is None:
        raise ValueError("serving-log timestamps must be timezone-aware (UTC)")
    delta = ts - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def records_to_table(records: list[Record]) -> pa.Table:
    """Buffered records as one Arrow table (columns as in the module docstring)."""
    keys: dict[str, None] = {}
    features: dict[str, None] = {}
    for record in records:
        keys.update(dict.fromkeys(record[2]))
        features.update(dict.fromkeys(record[3]))
    columns: dict[str, pa.Array] = {
        "ts": pa.array([r[0] for r in records], pa.int64()).cast(_BASE.field("ts").type),
        "request_id": pa.array([r[1] for r in records], pa.string()),
        "model_version": pa.array([r[4] for r in records], pa.string()),
        "arm": pa.array([r[5] for r in records], pa.string()),
        "latency_ms": pa.array([r[6] for r in records], pa.float64()),
        "prediction": pa.array([r[7] for r in records], pa.float64()),
    }
    for name in keys:
        columns[KEY_PREFIX + name] = _values([r[2].get(name) for r in records])
    for name in features:
        columns[FEATURE_PREFIX + name] = _values([r[3].get(name) for r in records])
    return pa.table(columns)


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
