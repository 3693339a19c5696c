"""Where a flush's rows go: the store (a file per hour and replica), the local spool while the store refuses,
the quarantine, and the accounts and journal that say so. The write side of `ServingLogger`
(`quiver.serving.logs.writer`), kept apart from its buffer and request path."""

from __future__ import annotations

import json
import logging
import time
from collections import Counter, deque
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from quiver.catalog.locations import Location
from quiver.online.base import TIME_RANGE
from quiver.serving.logs.accounts import Ledger, account_path, arm_counts, hour_folder, hours_and_arms
from quiver.serving.logs.files import parquet_bytes, part_name, write_atomically
from quiver.serving.logs.journal import Journal, reconcile
from quiver.serving.logs.read import LOG_DIR
from quiver.serving.logs.spool import Spool
from quiver.serving.logs.tables import Batch, FailedPart, batches_to_table

log = logging.getLogger("quiver.serving_log")

MAX_BACKOFF_S = 60.0
ACCOUNTS_EVERY_S = 60.0  # on an object store: how often accounts of rows merely written are stored
OUT_OF_RANGE = f"time outside the supported range {TIME_RANGE}"


class StoreSide:
    """The write side of `ServingLogger`: its attributes are set by the logger's `__init__`."""

    location: Location
    replica: str
    compression: str
    flush_interval_s: float
    max_write_attempts: int
    quarantine_directory: str
    spool: Spool | None
    ledger: Ledger
    journal: Journal | None
    written: int
    files_written: int
    spooled: int
    failed_writes: int
    quarantined_by: Counter[str]
    _lock: Any
    _retry: deque[FailedPart]
    _last_write_failed: bool
    _spool_attempts: int
    _spool_next_try: float
    _accounts_due: float
    _settled: bool

    def _count_dropped(self, reason: str, rows: int, what: Any = None) -> None:
        """Count dropped rows (the logger's own, which also knows its buffer)."""
        raise NotImplementedError

    def _store_accounts(self, store_down: bool, now_: bool = False) -> None:
        """Store the accounts of the hours that changed (see `quiver.serving.logs.accounts`); while the
        store refuses, they wait (each file holds the process's whole count, so the next one catches up).
        On an object store, rows merely written are stored at most every ACCOUNTS_EVERY_S: one more PUT per
        flush cost the 1-row p99 a tenth (benchmarks/serving_log_store.py); drops, quarantines, spooling, an
        explicit flush and the close store at once."""
        if not (now_ or self.location.is_local or self.ledger.urgent) and time.monotonic() < self._accounts_due:
            return
        self._accounts_due = time.monotonic() + ACCOUNTS_EVERY_S
        for hour, account in self.ledger.dirty():
            if store_down:
                self.ledger.keep_dirty(hour)
                continue
            try:
                self.location.put(account_path(self.location, LOG_DIR, hour, self.ledger.process),
                                  json.dumps(account).encode())
            except Exception as exc:
                self.ledger.keep_dirty(hour)
                store_down = True
                log.warning("serving log: the accounts of %s could not be stored (%s: %s); next flush tries again",
                            hour_folder(hour), type(exc).__name__, exc)

    def _with_replica(self, table: pa.Table) -> pa.Table:
        """Every row names the replica that served it (files of several replicas merge, the column stays)."""
        return table.append_column(pa.field("replica", pa.string()), pa.repeat(self.replica, table.num_rows)) \
            if "replica" not in table.column_names else table

    def _drain_spool(self, now: float, retry_all: bool) -> tuple[int, bool]:
        """Upload what the spool holds, oldest first, when its backoff allows; returns (rows uploaded, whether
        the store still refuses: then this flush's files go to the spool behind them without a try)."""
        from quiver import metrics

        spool = self.spool
        if spool is None or not spool.files:
            return 0, False
        if not retry_all and now < self._spool_next_try:
            return 0, True
        def upload(relative: str, data: bytes) -> None:
            self.location.put(self.location.path(relative), data)
            table = pq.read_table(pa.BufferReader(data), columns=["ts", "arm"])
            for hour, by_arm in hours_and_arms(table, table.num_rows):
                self.ledger.add(hour, "written", by_arm)

        uploaded, failure = spool.drain(upload)
        self.written += uploaded
        metrics.SERVING_LOG_ROWS.inc(uploaded)
        if failure is None:
            if self._spool_attempts:
                log.warning("serving log: the store answers again; %d spooled rows uploaded", uploaded)
            self._spool_attempts = 0
            return uploaded, False
        self._spool_attempts += 1
        delay = min(self.flush_interval_s * 2 ** (self._spool_attempts - 1), MAX_BACKOFF_S)
        self._spool_next_try = time.monotonic() + delay
        self.failed_writes += 1
        metrics.SERVING_LOG_FAILED_WRITES.inc()
        log.warning("serving log: the store still refuses uploads (%s: %s); %d rows spooled, next try in %.0f s",
                    type(failure).__name__, failure, spool.rows, delay)
        return uploaded, True

    def _write_part(self, part: FailedPart, final: bool, store_down: bool = False) -> int:
        from quiver import metrics

        started = time.perf_counter()
        moment = datetime.fromtimestamp(part.hour * 3600, UTC)
        relative = f"{LOG_DIR}/date={moment:%Y-%m-%d}/hour={moment:%H}/{part_name(self.replica)}"
        data = None
        try:
            data = parquet_bytes(part.table, self.compression)
            if store_down and self.spool is not None:
                raise OSError("the store refused the spool's oldest file; this one waits behind it")
            self.location.put(self.location.path(relative), data)
        except Exception as exc:
            if data is not None and self.spool is not None and self._spooled(relative, data, part.rows, exc):
                self.ledger.add(part.hour, "spooled", arm_counts(part.table))
                return 0
            part.attempts += 1
            part.error = f"{type(exc).__name__}: {exc}"
            self.failed_writes += 1
            metrics.SERVING_LOG_FAILED_WRITES.inc()
            with self._lock:
                self._last_write_failed = True
            if part.attempts >= self.max_write_attempts or final:
                log.error("serving log: %d rows of %s could not be written (%d attempts, last: %s); "
                          "quarantining them", part.rows, relative, part.attempts, part.error)
                self._quarantine_table(part.table, part.rows, f"write failed {part.attempts} times: "
                                                              f"{type(exc).__name__}", "write_failed")
            else:
                delay = min(self.flush_interval_s * 2 ** (part.attempts - 1), MAX_BACKOFF_S)
                part.next_try = time.monotonic() + delay
                log.warning("serving log: writing %d rows failed (attempt %d of %d, next in %.0f s): %s",
                            part.rows, part.attempts, self.max_write_attempts, delay, part.error)
                with self._lock:
                    self._retry.append(part)
                    self._retry = deque(sorted(self._retry, key=lambda p: p.hour))
            return 0
        with self._lock:
            self._last_write_failed = False
        self.ledger.add(part.hour, "written", arm_counts(part.table))
        self.files_written += 1  # `written` is counted by the caller (ServingLogger._count_written)
        metrics.SERVING_LOG_ROWS.inc(part.rows)
        metrics.SERVING_LOG_FLUSH_SECONDS.observe(time.perf_counter() - started)
        return part.rows

    def _spooled(self, relative: str, data: bytes, rows: int, why: Exception) -> bool:
        """Put a file the store refused into the spool; False when the spool cannot take it either (then the
        rows wait in memory for a retry, as without a spool)."""
        assert self.spool is not None
        try:
            dropped = self.spool.add(relative, data, rows)
        except OSError as exc:
            log.error("serving log: the spool cannot be written (%s: %s)", type(exc).__name__, exc)
            return False
        if self._spool_attempts == 0:
            self._spool_attempts = 1
            self._spool_next_try = time.monotonic() + self.flush_interval_s
            log.warning("serving log: the store refused a file (%s: %s); spooling locally until it answers",
                        type(why).__name__, why)
        self.spooled += rows
        for item in dropped:
            self._count_dropped("spool_full", item.rows, item)
        return True

    def _quarantine(self, batches: list[Batch], reason: str) -> None:
        rows = sum(b.n for b in batches)
        try:
            table = self._with_replica(batches_to_table(batches))
        except Exception as exc:
            log.error("serving log: %d rows cannot be converted even for the quarantine (%s): dropped", rows, exc)
            self._count_dropped("unconvertible", rows, batches)
            return
        self._quarantine_table(table, rows, reason, "time_out_of_range" if reason == OUT_OF_RANGE
                               else "unconvertible")

    def _quarantine_table(self, table: pa.Table, rows: int, reason: str, kind: str) -> None:
        from quiver import metrics

        ts = table.column("ts").cast(pa.int64())
        table = table.drop_columns(["ts"]).add_column(0, "ts_us", ts)
        table = table.append_column("quarantine_reason", pa.array([reason] * rows, pa.string()))
        try:
            write_atomically(table, self.location, self.quarantine_directory, self.compression, self.replica)
        except Exception as exc:
            log.error("serving log: the quarantine cannot be written either (%s: %s): %d rows dropped",
                      type(exc).__name__, exc, rows)
            self._count_dropped(kind if kind != "time_out_of_range" else "unconvertible", rows, table)
            return
        for hour, by_arm in hours_and_arms(table, rows):
            self.ledger.add(hour, "quarantined", by_arm)
        with self._lock:
            self.quarantined_by[kind] += rows
        metrics.SERVING_LOG_QUARANTINED.labels(reason=kind).inc(rows)
        log.warning("serving log: %d rows quarantined (%s)", rows, reason)

    def _keep_journal(self) -> None:
        """Write this process's journal, and settle the ones earlier processes of the replica left."""
        if self.journal is None:
            return
        self.journal.write()
        if not self._settled:
            killed = reconcile(self.journal.folder, self.location, LOG_DIR, self.ledger.process)
            self._settled = not any(p.stem != self.ledger.process for p in self.journal.folder.glob("*.json"))
            if killed:
                from quiver import metrics

                metrics.SERVING_LOG_DROPPED.labels(reason="killed").inc(killed)
