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
from quiver.serving.off_path_process import LogSettings, OffPathProcess, ScoreJob, score_and_log

if TYPE_CHECKING:
    from quiver.serving.logs import ServingLogger

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


def score_off_path(batch: list[OffPath], stats: ServiceStats, logger: ServingLogger | None,
                   process: OffPathProcess | None = None) -> None:
    """Score a batch of queued items, one model call and one log call per (arm, log arm, rollout tag): in
    `process` when given and the arm's model came from an artifact folder, else in this thread."""
    groups: dict[tuple[int, str, tuple[int, int, float] | None], list[OffPath]] = {}
    for item in batch:
        groups.setdefault((id(item.arm), item.log_arm, item.rollout), []).append(item)
    for items in groups.values():
        job = job_of(items)
        if process is not None and job.artifact:
            stats.add(**process.submit(job))
        else:
            stats.add(**score_and_log(items[0].arm.model, job, logger))


def job_of(items: list[OffPath]) -> ScoreJob:
    """One arm's queued items as one job: rows joined (blocks in one numpy call), one value per request kept
    per request. Each step is one call over the batch, not one per item: in process mode this runs on the
    server's GIL."""
    arm = items[0].arm
    assert arm.model is not None
    names = [f for f in arm.model.features if f in items[0].columns]
    counts = [len(item.request_ids) for item in items]
    keys = dict.fromkeys(key for item in items for key in item.entities)
    return ScoreJob(
        arm.label, str(getattr(arm.model, "path", "") or ""), str(getattr(arm.model, "sha256", "") or ""),
        items[0].log_arm, items[0].rollout, [r for item in items for r in item.request_ids], counts,
        {key: _concat([item.entities.get(key, [None] * k) for item, k in zip(items, counts, strict=True)])
         for key in keys},
        join_inputs([item.columns for item in items], names), [item.feature_ms for item in items],
        [item.logged_at for item in items], [item.call_id for item in items])


class OffPathQueue:
    """Off-path items waiting for the worker. `offer` never blocks a request: a full queue drops the item
    and counts its rows under the caller's stat. `run` is the worker's loop until `stop`. With `process` set
    (an `OffPathProcess`), the worker batches and sends, and the child scores and logs."""

    def __init__(self, stats: ServiceStats, logger: ServingLogger | None, *, size: int, linger_s: float,
                 stopping: threading.Event):
        self.stats, self.logger, self.linger_s, self._stopping = stats, logger, linger_s, stopping
        self.process: OffPathProcess | None = None
        self._stopped: OffPathProcess | None = None  # its last health stays readable (the server's stop message)
        self._queue: queue.Queue[OffPath | None] = queue.Queue(maxsize=size)

    def start_process(self, idle: bool) -> None:
        """Score and log in a process of its own from now on (idempotent)."""
        if self.process is None:
            self.process = OffPathProcess(LogSettings.of(self.logger) if self.logger is not None else None,
                                          idle=idle)

    def stop_process(self) -> None:
        """Stop the process after it has written every row it was sent; a hung one is killed, which frees a
        worker stuck sending to it (see OffPathProcess.close)."""
        process, self.process = self.process, None
        if process is not None:
            self.stats.add(**process.close())
            self._stopped = process

    def health(self, mode: str) -> dict[str, Any]:
        """Where off-path scoring runs, and for a process its restarts and serving log (/health)."""
        process = self.process or self._stopped
        if process is None:
            return {"mode": mode}
        return {"mode": "process", "restarts": process.restarts,
                **({"serving_log": process.log_health} if process.log_health is not None else {})}

    def offer(self, item: OffPath, dropped: str) -> None:
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self.stats.add(**{dropped: len(item.request_ids)})

    def run(self) -> None:
        while True:
            try:  # with a process, wake up now and then to count what it answered since
                first = self._queue.get(timeout=1.0 if self.process is not None else None)
            except queue.Empty:
                if self.process is not None:
                    self.stats.add(**self.process.collect())
                continue
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
                score_off_path(batch, self.stats, self.logger, self.process)
            except Exception:  # never let one bad batch stop the worker
                log.exception("shadow scoring failed")
            finally:
                for _ in batch:
                    self._queue.task_done()
            if stop:
                return

    def drain(self, timeout_s: float = 10.0) -> bool:
        """Wait until queued work is done; True when the queue emptied in time. A process then answers for
        everything it was sent and flushes its log, so its rows are on disk as the caller's will be after its
        own `logger.flush()`."""
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        if self.process is not None:
            self.stats.add(**self.process.flush(max(0.0, deadline - time.monotonic())))
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
                    score_off_path([item], self.stats, self.logger, self.process)
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
