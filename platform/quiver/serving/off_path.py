"""What the prediction service does after the response. It scores the shadow's copy of each request and
the champion's scores of the canary's rows (`log_arm` "paired"), batched by a worker thread
(`OffPathQueue`) and logged without feature columns (the same vectors are logged once, on the rows' own
arm). And it sends its alerts (`AlertOutbox`), rate-limited, from a thread of their own, so a slow alert
sink never holds a request."""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from quiver.serving.arms import Arm, ServiceStats, _concat, join_inputs

if TYPE_CHECKING:
    from quiver.monitoring.serving_log import ServingLogger

log = logging.getLogger(__name__)
SHADOW_BATCH_ROWS = 4096  # rows the worker scores in one call at most


@dataclass(frozen=True)
class OffPath:
    """Rows an arm scores after the response: the shadow's copy of a request, or the champion's of its
    canary rows (`log_arm` "paired")."""

    arm: Arm
    log_arm: str
    request_ids: list[str]
    entities: Mapping[str, Any]
    columns: Mapping[str, Any]
    feature_ms: float
    logged_at: np.ndarray | int
    rollout: tuple[int, int, float] | None
    call_id: str


def score_off_path(batch: list[OffPath], stats: ServiceStats, logger: ServingLogger | None) -> None:
    """Score a batch of queued items, one model call and one log call per (arm, log arm, rollout tag)."""
    groups: dict[tuple[int, str, tuple[int, int, float] | None], list[OffPath]] = {}
    for item in batch:
        groups.setdefault((id(item.arm), item.log_arm, item.rollout), []).append(item)
    for items in groups.values():
        _score(items, stats, logger)


def _score(items: list[OffPath], stats: ServiceStats, logger: ServingLogger | None) -> None:
    arm, log_arm = items[0].arm, items[0].log_arm
    assert arm.model is not None
    names = [f for f in arm.model.features if f in items[0].columns]
    columns = join_inputs([item.columns for item in items], names)
    n = sum(len(item.request_ids) for item in items)
    t = time.perf_counter()
    error = ""
    try:
        scores = np.asarray(arm.model.predict(columns), dtype=np.float64)
        if scores.shape != (n,):
            raise ValueError(f"{log_arm} returned {scores.shape} scores for {n} rows")
    except Exception as exc:  # a broken shadow is logged and counted, never seen by a client
        error = f"{type(exc).__name__}: {exc}"[:500]
        scores = np.full(n, np.nan)
        stats.add(**{f"{log_arm}_errors": n})
    scoring_ms = (time.perf_counter() - t) * 1e3
    stats.add(**{f"{log_arm}_rows": n})
    if logger is None:
        return
    # One log call for the group, each row with its own request's call_id, time and latency. No features: the
    # same vector is logged on the primary row of this request_id.
    counts = [len(item.request_ids) for item in items]
    sized = list(zip(items, counts, strict=True))
    keys = dict.fromkeys(key for item in items for key in item.entities)
    logger.log_batch([r for item in items for r in item.request_ids],
                     {key: _concat([item.entities.get(key, [None] * k) for item, k in sized]) for key in keys}, {},
                     arm.label, log_arm, np.repeat([item.feature_ms + scoring_ms for item in items], counts), scores,
                     ts_us=np.concatenate([np.broadcast_to(np.asarray(item.logged_at, dtype=np.int64), (k,))
                                           for item, k in sized]),
                     error=error, rollout=items[0].rollout,
                     call_id=np.repeat(np.array([item.call_id for item in items], dtype=object), counts))


class OffPathQueue:
    """Off-path items waiting for the worker. `offer` never blocks a request: a full queue drops the item
    and counts its rows under the caller's stat. `run` is the worker's loop until `stop`."""

    def __init__(self, stats: ServiceStats, logger: ServingLogger | None, *, size: int, linger_s: float,
                 stopping: threading.Event):
        self.stats, self.logger, self.linger_s, self._stopping = stats, logger, linger_s, stopping
        self._queue: queue.Queue[OffPath | None] = queue.Queue(maxsize=size)

    def offer(self, item: OffPath, dropped: str) -> None:
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self.stats.add(**{dropped: len(item.request_ids)})

    def run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            # Nobody waits for the shadow: linger a moment so the requests of the next few milliseconds join
            # this batch. One scoring call over all their rows costs little more than one over a single row,
            # so under load the shadow costs a fraction of the champion instead of as much again.
            if self.linger_s > 0 and len(first.request_ids) < SHADOW_BATCH_ROWS:
                self._stopping.wait(self.linger_s)
            batch, rows, stop = [first], len(first.request_ids), False
            while rows < SHADOW_BATCH_ROWS:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    self._queue.task_done()
                    break
                batch.append(item)
                rows += len(item.request_ids)
            try:
                score_off_path(batch, self.stats, self.logger)
            except Exception:  # never let one bad batch stop the worker
                log.exception("shadow scoring failed")
            finally:
                for _ in batch:
                    self._queue.task_done()
            if stop:
                return

    def drain(self, timeout_s: float = 10.0) -> bool:
        """Wait until queued work is done; True when the queue emptied in time."""
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def stop(self, worker_running: bool) -> None:
        """Ask the worker to stop after what is queued (a running worker makes room; a stopped one never will)."""
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=10 if worker_running else 0)

    def finish_here(self) -> None:
        """Score, in this thread, whatever is still queued (the worker never started, or stopped early)."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            try:
                if item is not None:
                    score_off_path([item], self.stats, self.logger)
            except Exception:
                log.exception("shadow scoring failed")
            finally:
                self._queue.task_done()


class AlertOutbox:
    """Alerts of the serving path: at most one per kind and subject every `interval_s`, logged at once and
    recorded through `alerts` (an AlertManager, or None) by the sender thread (`run`), or inline when no
    thread runs. A full outbox drops the alert; the log line is still written."""

    def __init__(self, alerts: Any, model_name: str, interval_s: float):
        self.alerts, self.model_name, self.interval_s = alerts, model_name, interval_s
        self._queue: queue.Queue[tuple[str, str, str] | None] = queue.Queue(maxsize=64)
        self._last: dict[str, float] = {}

    def alert(self, kind: str, subject: str, message: str, *, inline: bool) -> None:
        now = time.monotonic()
        if now - self._last.get(kind + subject, -1e18) < self.interval_s:
            return
        self._last[kind + subject] = now
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait((kind, subject, message))
        if inline:
            self._send_queued()

    def run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            self._deliver(*item)

    def stop(self, worker_running: bool) -> None:
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=10 if worker_running else 0)

    def _send_queued(self) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is None:
                return
            self._deliver(*item)

    def _deliver(self, kind: str, subject: str, message: str) -> None:
        log.error("%s %s: %s", kind, subject, message)
        if self.alerts is None:
            return
        try:
            self.alerts.raise_alert(kind, subject, "critical", f"{kind.replace('_', ' ')}: {subject}", message,
                                    {"model": self.model_name})
        except Exception:
            log.exception("could not record alert %s for %s", kind, subject)
