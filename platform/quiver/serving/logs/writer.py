"""Serving logs: every feature vector and prediction, buffered in memory and written as hourly Parquet.

    <root>/serving_logs/date=YYYY-MM-DD/hour=HH/part-<time>-<replica>-<uuid>.parquet
    <root>/_quarantine/serving_logs/part-<time>-<replica>-<uuid>.parquet    rows that could not be placed, why

`<root>` is the project's store root (`offline_root`): a folder or an object store (`quiver.catalog.locations`).
Every replica of a prediction service writes its own files into the same folders (its name in the file name
and in the `replica` column; no shared disk assumed), and every reader reads them all.

Columns, types and the one schema of the dataset: `quiver.serving.logs.tables`. A file holds the rows of one
flush that fall into its hour.

Latency: `log()` appends one tuple to a list under a lock (~1 µs); `log_batch()` appends one record of whole
columns (numpy arrays or lists) for many rows at once, so a request's rows cost no per-row Python. A background
thread swaps the list out and writes it when `flush_rows` rows are waiting or every `flush_interval_s`; numeric
numpy columns go to Arrow as they are (no Python objects), and a file's columns and types are the same whichever
call logged its rows. Features given as one `quiver.online.base.ColumnBlock` (rows × features, what the
prediction server passes) stay one array until the flush, which joins every block of the flush with one
concatenation: with 50 features, the per-feature join over thousands of one-row requests had cost the flush
thread most of a core's GIL time. A file is built in memory and stored whole (a folder: a hidden temp name
renamed into place; an object store: one PUT), so readers never see half a file.

What can go wrong, and what happens (every row is either written, quarantined or dropped, and counted):
- A row whose time lies outside `quiver.online.base.TIME_RANGE` has no hour to go to: it is quarantined with
  its reason when logged; the other rows of its batch are written as usual. So is a batch whose values cannot
  become Arrow columns.
- A file the object store does not take (down, unreachable) goes to the local spool when the logger has one
  (`logger_for` gives one on an object store; `quiver.serving.logs.spool`): uploaded oldest first
  once the store answers, kept across restarts, bounded (the oldest dropped, counted `spool_full`); `health()`
  says "spooling" with its size meanwhile.
- A write that fails otherwise (disk full, folder not writable) fails only its hour's file: the other hours of the flush
  are written, never again. The failed file's rows wait (as the Arrow table already built) and are tried
  again with backoff (`flush_interval_s` doubling up to 60 s) up to `max_write_attempts` times; then they are
  quarantined, or dropped and counted when the quarantine cannot be written either.
- The buffer is bounded in bytes (`max_buffer_bytes`, default 64 MiB: an estimate of the rows' memory, waiting
  retries included). When a new batch does not fit, the **oldest** waiting rows are dropped (failed retries
  first, then the oldest buffered) until it does: recent traffic is what drift checks and canary judges read.
  A batch larger than the whole budget is refused. Drops are counted by reason (`buffer_full`, `closed`,
  `write_failed`, `unconvertible`), never raised into a request.
- `health()` says "failing" while the last write attempt failed or rows wait for a retry; the prediction
  server's /health is then "degraded". Metrics (prometheus_client's default registry): rows written, failed
  writes, rows dropped and quarantined by reason, and rows / bytes buffered.
Durability: `close()` (also registered with atexit; the prediction server calls it on SIGTERM and SIGINT)
writes everything still buffered. A crash (SIGKILL, power loss) loses what was logged since the last flush —
at most one `flush_interval_s` (or `flush_rows` rows); with a journal (`logger_for` gives one), the next
process of the replica counts them in the dead process's accounts as dropped, `killed`
(`quiver.serving.logs.journal`).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections import Counter, defaultdict, deque
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from quiver.catalog.locations import Location, as_location
from quiver.online.base import MAX_TIME_US, MIN_TIME_US, ColumnBlock
from quiver.serving.logs.accounts import Ledger, hours_and_arms
from quiver.serving.logs.files import (
    estimate_bytes,
    newest_types,
    replica_name,
)
from quiver.serving.logs.gauges import LIVE
from quiver.serving.logs.journal import Journal
from quiver.serving.logs.read import (
    LOG_DIR,
    QUARANTINE_DIR,
    feature_frame,
    read_quarantine,
    read_serving_logs,
)
from quiver.serving.logs.spool import Spool
from quiver.serving.logs.store_side import OUT_OF_RANGE, StoreSide
from quiver.serving.logs.tables import (
    BASE_SCHEMA,
    FEATURE_PREFIX,
    KEY_PREFIX,
    Batch,
    FailedPart,
    QuarantinedBatch,
    Record,
    RolloutTag,
    SchemaMismatch,
    as_batches,
    batches_to_table,
    conform,
    first_bad,
    log_schema,
    micros,
    records_to_table,
    split_by_hour,
    take_rows,
)

log = logging.getLogger("quiver.serving_log")


__all__ = ["FEATURE_PREFIX", "KEY_PREFIX", "LOG_DIR", "QUARANTINE_DIR", "Batch", "Record", "RolloutTag",
           "SchemaMismatch", "ServingLogger", "Spool", "batches_to_table", "feature_frame", "log_schema",
           "read_quarantine", "read_serving_logs", "records_to_table"]


Item = Record | Batch | QuarantinedBatch


class ServingLogger(StoreSide):
    """Buffered, asynchronous writer of serving logs (see the module docstring)."""

    def __init__(self, root: str | Path | Location, *, flush_rows: int = 10_000, flush_interval_s: float = 5.0,
                 max_buffer_bytes: int = 64 << 20, max_write_attempts: int = 8, compression: str = "zstd",
                 max_buffer_rows: int | None = None, schema: pa.Schema | None = None, replica: str | None = None,
                 spool: Spool | None = None, journal: str | Path | None = None):
        if flush_rows < 1 or flush_interval_s <= 0 or max_buffer_bytes < 1 or max_write_attempts < 1:
            raise ValueError("flush_rows, max_buffer_bytes and max_write_attempts must be >= 1 and "
                             "flush_interval_s > 0")
        self.location = as_location(root)
        # A folder as a Path (what callers print and pass on); an object store as its URI.
        self.root: str | Path = Path(self.location.base) if self.location.is_local else self.location.root
        self.schema = schema
        self.replica = replica_name(replica)
        self.spool = spool
        self.directory = self.location.path(LOG_DIR)
        self.quarantine_directory = self.location.path(QUARANTINE_DIR)
        self.flush_rows, self.flush_interval_s = flush_rows, flush_interval_s
        self.max_buffer_bytes, self.max_buffer_rows = max_buffer_bytes, max_buffer_rows
        self.max_write_attempts, self.compression = max_write_attempts, compression
        self.written = 0
        self.files_written = 0
        self.spooled = 0  # rows that went to the spool (uploaded later: then counted in `written` too)
        self.ledger = Ledger(self.replica, f"{self.replica}-{time.time_ns()}")
        # Rows given, per hour, on local disk every second: what a killed process lost is counted by the next.
        self.journal = None if journal is None else Journal(Path(journal), self.replica, self.ledger.process)
        self._settled = journal is None
        self._spool_attempts = 0
        self._spool_next_try = 0.0  # time.monotonic()
        self._accounts_due = 0.0  # time.monotonic(): when an object store's accounts of written rows are next stored
        self.failed_writes = 0
        self.dropped_by: Counter[str] = Counter()
        self.quarantined_by: Counter[str] = Counter()
        self._buffer: deque[tuple[Item, int, int]] = deque()  # (item, rows, estimated bytes)
        self._rows = self._bytes = 0  # in _buffer
        self._retry: deque[FailedPart] = deque()  # failed writes waiting, oldest first
        self._in_flight_rows = self._in_flight_bytes = 0  # taken by the writer, not written yet
        self._last_write_failed = False
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()  # one writer at a time: the thread, flush() or close()
        self._wake = threading.Event()
        self._closed = False
        # One schema for the whole dataset, so any Parquet reader takes the folder as it is: the declared
        # columns (`log_schema(catalog)`) in every file, typed even when a flush holds only nulls; any other
        # column keeps the type it was first written with (here or by an earlier process).
        self._order: list[str] = schema.names if schema is not None else BASE_SCHEMA.names
        self._declared = {f.name: f.type for f in schema} if schema is not None else {}
        self._types: dict[str, pa.DataType] = {**newest_types(self.location, self.directory), **self._declared}
        self._thread = threading.Thread(target=self._run, name="quiver-serving-log", daemon=True)
        self._thread.start()
        LIVE.add(self)
        atexit.register(self.close)

    # ----- logging (the request path) -----

    def log(self, request_id: str, entity_keys: Mapping[str, Any], features: Mapping[str, Any],
            model_version: str = "", arm: str = "champion", latency_ms: float = 0.0,
            prediction: float | None = None, ts: datetime | None = None, error: str = "") -> None:
        """Buffer one served request; returns immediately. The mappings must not be mutated afterwards."""
        ts_us = time.time_ns() // 1000 if ts is None else micros(ts)
        if self.journal is not None:
            self.journal.give(ts_us, 1)
        record = (ts_us, request_id, entity_keys, features, model_version, arm, latency_ms, prediction, error)
        if MIN_TIME_US <= ts_us < MAX_TIME_US:
            self._append(record, 1, 200 + 100 * (len(entity_keys) + len(features)))
        else:
            self._append(QuarantinedBatch(as_batches([record])[0], OUT_OF_RANGE), 1, 200)

    def log_batch(self, request_ids: Sequence[str], entity_keys: Mapping[str, Any], features: Mapping[str, Any] | ColumnBlock,
                  model_version: str | np.ndarray = "", arm: str | np.ndarray = "champion",
                  latency_ms: float | np.ndarray = 0.0, predictions: np.ndarray | None = None,
                  ts_us: np.ndarray | int | None = None, error: str | np.ndarray = "",
                  rollout: RolloutTag | None = None, call_id: str | np.ndarray = "",
                  request: Mapping[str, Any] | None = None,
                  missing: np.ndarray | None = None) -> None:
        """Buffer many served rows given as columns (numpy arrays or lists, one value per row); returns at once.

        `model_version`, `arm`, `latency_ms` and `error` are one value for all rows or one per row; `ts_us` is
        epoch microseconds UTC (default: now); `prediction` is null where `error` is non-empty (and everywhere
        when `predictions` is None); `rollout` tags every row with the rollout, step and canary fraction it was
        routed under; `call_id` names the request these rows came in (one model call per arm; one per row
        when they came in several); `request`
        holds its fields (columns `request.<name>`) and `missing` per row how many of the serving model's inputs
        were missing (`missing_inputs`). The files
        written are the same as from `log()` of the same rows. Rows whose time lies outside TIME_RANGE are
        quarantined. Nothing passed may be mutated afterwards (the arrays are written
        by the background thread)."""
        n = len(request_ids)
        block = isinstance(features, ColumnBlock)  # kept whole: the flush joins blocks in one call
        if isinstance(features, ColumnBlock) and features.rows() != n:
            raise ValueError(f"log_batch: features hold {features.rows()} rows for {n} request_ids")
        for what, columns in (("entity_keys", entity_keys), ("features", {} if block else features),
                              ("request", request or {})):
            for name, values in columns.items():
                if len(values) != n:
                    raise ValueError(f"log_batch: {what}[{name!r}] holds {len(values)} values for {n} request_ids")
        per_row = {"model_version": model_version, "arm": arm, "latency_ms": latency_ms, "error": error,
                   "predictions": predictions, "ts_us": ts_us, "call_id": call_id}
        for name, value in per_row.items():
            if isinstance(value, np.ndarray) and value.shape != (n,):
                raise ValueError(f"log_batch: {name} has shape {value.shape} for {n} request_ids")
        if n == 0:
            return
        stamp = time.time_ns() // 1000 if ts_us is None else \
            ts_us.astype(np.int64, copy=False) if isinstance(ts_us, np.ndarray) else int(ts_us)
        if self.journal is not None:
            self.journal.give(stamp, n)
        batch = Batch(n, stamp, request_ids, dict(entity_keys), features if block else dict(features), model_version, arm,
                      latency_ms, predictions, error, rollout, call_id, dict(request) if request else None, missing)
        if isinstance(stamp, int):
            bad = None if MIN_TIME_US <= stamp < MAX_TIME_US else np.ones(n, dtype=bool)
        else:
            outside = (stamp < MIN_TIME_US) | (stamp >= MAX_TIME_US)
            bad = outside if outside.any() else None
        if bad is None:
            self._append(batch, n, estimate_bytes(batch))
            return
        good = np.flatnonzero(~bad)
        if len(good):
            kept = take_rows(batch, good)
            self._append(kept, len(good), estimate_bytes(kept))
        poisoned = take_rows(batch, np.flatnonzero(bad))
        self._append(QuarantinedBatch(poisoned, OUT_OF_RANGE), poisoned.n, estimate_bytes(poisoned))

    def _append(self, item: Item, rows: int, size: int) -> None:
        dropped: list[tuple[str, int, Any]] = []
        with self._lock:
            if self._closed:
                dropped.append(("closed", rows, item))
            elif size > self.max_buffer_bytes or (self.max_buffer_rows is not None and rows > self.max_buffer_rows):
                dropped.append(("buffer_full", rows, item))  # larger than the whole budget: refused
            else:
                dropped += self._make_room(rows, size)
                self._buffer.append((item, rows, size))
                self._rows += rows
                self._bytes += size
                if self._rows >= self.flush_rows:
                    self._wake.set()
        for reason, count, what in dropped:  # outside the lock: counting by hour and arm reads the rows
            self._count_dropped(reason, count, what)

    def _make_room(self, rows: int, size: int) -> list[tuple[str, int, Any]]:
        """Drop the oldest waiting rows until `rows`/`size` more fit (holding _lock)."""
        dropped: list[tuple[str, int, Any]] = []
        if not self._retry and self._bytes + self._in_flight_bytes + size <= self.max_buffer_bytes and (
                self.max_buffer_rows is None or self._rows + self._in_flight_rows + rows <= self.max_buffer_rows):
            return dropped  # it fits (the usual case): no closure, no scan

        def over() -> bool:
            total = self._bytes + self._in_flight_bytes + sum(p.nbytes for p in self._retry)
            too_many = self.max_buffer_rows is not None and self._rows + self._in_flight_rows + rows > \
                self.max_buffer_rows
            return total + size > self.max_buffer_bytes or too_many

        while self._retry and over():
            part = self._retry.popleft()
            dropped.append(("buffer_full", part.rows, part))
        while self._buffer and over():
            old, old_rows, old_size = self._buffer.popleft()
            self._rows -= old_rows
            self._bytes -= old_size
            dropped.append(("buffer_full", old_rows, old))
        return dropped

    def _count_dropped(self, reason: str, rows: int, what: Any = None) -> None:
        """Count `rows` dropped for `reason`; `what` (the dropped item, part, table or spooled file) gives their
        hours and arms to the accounts."""
        from quiver import metrics

        for hour, by_arm in hours_and_arms(what, rows):
            self.ledger.add(hour, f"dropped:{reason}", by_arm)
        with self._lock:
            self.dropped_by[reason] += rows
        metrics.SERVING_LOG_DROPPED.labels(reason=reason).inc(rows)
        if reason != "closed":
            log.warning("serving log dropped %d rows (%s)", rows, reason)

    # ----- state -----

    @property
    def dropped(self) -> int:
        """Rows dropped since start, every reason."""
        return sum(self.dropped_by.values())

    @property
    def quarantined(self) -> int:
        """Rows quarantined since start, every reason."""
        return sum(self.quarantined_by.values())

    @property
    def buffered(self) -> int:
        """Rows waiting to be written (buffered, being written, or waiting for a retry)."""
        with self._lock:
            return self._rows + self._in_flight_rows + sum(p.rows for p in self._retry)

    @property
    def buffered_bytes(self) -> int:
        """Estimated memory of the rows waiting (see `max_buffer_bytes`)."""
        with self._lock:
            return self._bytes + self._in_flight_bytes + sum(p.nbytes for p in self._retry)

    @property
    def writable(self) -> bool:
        """False while the last write attempt failed or rows wait for a retry."""
        with self._lock:
            return not (self._last_write_failed or self._retry)

    def health(self) -> dict[str, Any]:
        """A summary for /health (no paths, no error texts: those go to the log). "spooling": the store did
        not take the last files, which wait in the local spool (`spooled_rows`, `spool_bytes`)."""
        spool = self.spool
        waiting = spool is not None and spool.files > 0
        status = "closed" if self._closed else "failing" if not self.writable else "spooling" if waiting else "ok"
        info = {"status": status, "replica": self.replica, "buffered_rows": self.buffered,
                "buffered_bytes": self.buffered_bytes, "written_rows": self.written,
                "failed_writes": self.failed_writes, "dropped_rows": self.dropped, "quarantined_rows": self.quarantined}
        if spool is not None:
            info.update(spooled_rows=spool.rows, spool_bytes=spool.nbytes, spool_files=spool.files)
        return info

    # ----- writing (the background thread, flush(), close()) -----

    def flush(self) -> int:
        """Write everything buffered now, and retry every failed write, in the caller's thread; returns the
        rows written. Never raises for a failed write: its rows wait for the next attempt (see the module
        docstring), and `writable` turns False."""
        return self._flush(retry_all=True)

    def _flush(self, retry_all: bool, final: bool = False) -> int:
        with self._write_lock:
            now = time.monotonic()
            with self._lock:
                items = [item for item, _, _ in self._buffer]
                due = [p for p in self._retry if retry_all or p.next_try <= now]
                self._retry = deque(p for p in self._retry if not (retry_all or p.next_try <= now))
                # A retried part stays counted as buffered while it is being written, as a new one does.
                self._in_flight_rows = self._rows + sum(p.rows for p in due)
                self._in_flight_bytes = self._bytes + sum(p.nbytes for p in due)
                self._buffer.clear()
                self._rows = self._bytes = 0
            try:
                parts, quarantine = self._parts(items)
                written, store_down = self._drain_spool(now, retry_all)
                for part in [*due, *(FailedPart(hour, table, rows, 0, now, "") for hour, table, rows in parts)]:
                    written += self._count_written(part, self._write_part(part, final, store_down))
                for batches, reason in quarantine:
                    self._quarantine(batches, reason)
                self._store_accounts(store_down, final or retry_all)
            finally:
                with self._lock:
                    self._in_flight_rows = self._in_flight_bytes = 0
            return written

    def _count_written(self, part: FailedPart, written: int) -> int:
        """Count a part's written rows and take the part out of the in-flight rows in one step under the lock,
        so that `written` and `buffered` never both count a row (a reader polling one then the other)."""
        with self._lock:
            self.written += written
            before = self._in_flight_rows
            self._in_flight_rows = max(0, before - part.rows)
            self._in_flight_bytes = self._in_flight_bytes * self._in_flight_rows // before if before else 0
        return written

    def _parts(self, items: list[Item]) -> tuple[list[tuple[int, pa.Table, int]], list[tuple[list[Batch], str]]]:
        """Per-hour tables of the buffered rows, and the batches to quarantine (with why)."""
        quarantine: list[tuple[list[Batch], str]] = []
        by_hour: dict[int, list[Batch]] = defaultdict(list)
        rows_now = [i for i in items if not isinstance(i, QuarantinedBatch)]
        for item in items:
            if isinstance(item, QuarantinedBatch):
                quarantine.append(([item.batch], item.reason))
        for batch in as_batches(rows_now):  # type: ignore[arg-type]
            for hour, piece in split_by_hour(batch):
                by_hour[hour].append(piece)
        parts = []
        for hour, pieces in sorted(by_hour.items()):
            try:
                parts.append((hour, self._table(pieces), sum(p.n for p in pieces)))
            except Exception:  # one unconvertible batch must not cost the others: build them one by one
                good = []
                for piece in pieces:
                    try:
                        self._table([piece])
                        good.append(piece)
                    except SchemaMismatch as exc:
                        log.error("serving log: %d rows for %s refused (quarantined): %s", piece.n,
                                  f"{datetime.fromtimestamp(hour * 3600, UTC):date=%Y-%m-%d/hour=%H}", exc)
                        quarantine.append(([piece], f"not the dataset's schema: {exc}"))
                    except Exception as exc:
                        quarantine.append(([piece], f"values cannot become Arrow columns: {type(exc).__name__}: "
                                                    f"{str(exc)[:200]}"))
                if good:
                    parts.append((hour, self._table(good), sum(p.n for p in good)))
        return parts, quarantine

    def _table(self, batches: list[Batch]) -> pa.Table:
        """The batches as one table in the dataset's schema (see `__init__`). Raises SchemaMismatch when a
        column holds values its type cannot take without loss (e.g. 1.5 or "abc" in an int64 column): such
        a file would split the dataset, so its rows are refused (quarantined) instead."""
        table = self._with_replica(batches_to_table(batches))
        # Every column the dataset already types (declared, or as first written) is cast to that type; the cast
        # is safe: NaN becomes null, 7.0 becomes 7, and a value that would change is refused.
        types = self._types
        table, failed = conform(table, types, self._order)
        if failed:
            name = failed[0]
            raise SchemaMismatch(f"column {name} holds {table[name].type} values that the dataset's type "
                                 f"{types[name]} cannot hold (e.g. {first_bad(table[name], types[name])})")
        for column in table.schema:
            if column.name not in self._types and column.type != pa.null():
                self._types[column.name] = column.type
        return table

    def close(self, timeout_s: float = 60.0) -> None:
        """Stop the background thread and write what is left (one attempt each; what fails is quarantined or
        dropped and counted). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._wake.set()
        self._thread.join(timeout_s)
        if self._thread.is_alive():  # a write hangs (a frozen file system): do not hang the process too
            log.error("serving log: the writer did not stop within %.0f s; %d rows not written", timeout_s,
                      self.buffered)
        else:
            self._flush(retry_all=True, final=True)
            if self.journal is not None:  # every row given is accounted for on the store, or will be next start
                self.journal.discard() if not self.ledger.pending else self.journal.write()
        atexit.unregister(self.close)

    def __enter__(self) -> ServingLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> None:
        tick = self.flush_interval_s if self.journal is None else min(self.flush_interval_s, 1.0)
        due = time.monotonic() + self.flush_interval_s
        while True:
            woken = self._wake.wait(tick)
            self._wake.clear()
            with self._lock:
                closing = self._closed
            if closing:
                return  # close() does the final flush in its own thread
            try:
                self._keep_journal()
                if woken or time.monotonic() >= due:
                    due = time.monotonic() + self.flush_interval_s
                    self._flush(retry_all=False)
            except Exception:  # never let the writer thread die: log and go on
                log.exception("serving-log flush failed")
