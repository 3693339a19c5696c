"""Off-path scoring in a process of its own: the shadow's copies and the champion's paired scores of canary
rows are scored and logged by a child process, so their Python work (the model call, building the log's
rows, writing its files) never holds the request loop's GIL.

The parent's off-path worker thread still lingers and batches (`quiver.serving.off_path.OffPathQueue`); per
batch and arm it joins the rows' inputs into one `ScoreJob` and sends it down a pipe without waiting; the
child's answers (counts) are taken with the next batch, or within a second when idle. The child runs in
Linux's idle scheduling class (else at `nice` 10): it takes only CPU the server leaves, so on a saturated
machine the shadow falls behind, never the champion; the parent's bounded queue then fills and the overflow
is dropped and counted, as with the thread. The child:
- loads each version from its verified artifact folder the first time a job names it (the parent loaded and
  verified it already; the child checks the same checksum) and keeps the last few: a hot swap in the parent
  is a new version name in the next job;
- logs to its own `ServingLogger` over the same root and schema (file names are unique per writer), closed
  (and so written) when the parent stops it, or when the parent dies and the pipe closes;
- answers every job with the rows scored and failed, and its logger's health; a change of that health between
  jobs (a write failing, or recovering) is sent within a second.
A child that dies is started again for the next batch; the batch it held is counted as dropped. On a stop,
the child first leaves the idle class (`lift_for_stop`: nothing is served any more, and an idle-class
process on a busy machine gets no CPU at all); one that does not answer (hung) is killed after
`stop_timeout_s`, what it held counted as dropped.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa

    from quiver.serving.logs import ServingLogger

log = logging.getLogger(__name__)
KEPT_MODELS = 4  # versions the child keeps loaded (champion, canary, shadow and one being swapped out)


@dataclass(frozen=True)
class ScoreJob:
    """One arm's queued requests, joined: scored in one model call and logged in one log call. What is one
    value per request (feature time, log time, call id) stays one value per request until the scoring side
    expands it, so the parent pickles a few flat lists and one block, not an object per row."""

    label: str  # version label, e.g. "fraud_model:3"
    artifact: str  # the verified artifact folder the parent loaded it from ("" for an in-process model)
    sha256: str
    log_arm: str  # "shadow" or "paired"
    rollout: tuple[int, int, float] | None
    request_ids: list[str]
    counts: list[int]  # rows per request
    entities: Mapping[str, Any]
    columns: Mapping[str, Any]  # the model's inputs, every row
    feature_ms: list[float]  # per request: its feature time (the scoring time is added)
    logged_at: list[Any]  # per request: its log time in µs (an int, or one per row)
    call_ids: list[str]  # per request

    @property
    def rows(self) -> int:
        return len(self.request_ids)


@dataclass(frozen=True)
class LogSettings:
    """How the child's serving logger writes (the parent's logger's settings)."""

    root: str  # a folder or an object-store URI
    schema: pa.Schema | None
    flush_rows: int
    flush_interval_s: float
    compression: str
    replica: str
    spool_dir: str | None  # the parent's spool; the child keeps its own beside it
    spool_max_bytes: int

    @classmethod
    def of(cls, logger: ServingLogger) -> LogSettings:
        spool = logger.spool
        return cls(str(logger.root), logger.schema, logger.flush_rows, logger.flush_interval_s, logger.compression,
                   logger.replica, None if spool is None else str(spool.folder),
                   0 if spool is None else spool.max_bytes)


def score_and_log(model: Any, job: ScoreJob, logger: ServingLogger | None, load_error: str = "") -> dict[str, int]:
    """Score `job`'s rows with `model` (None: it could not load, `load_error` says why) and log them without
    feature columns (the same vectors are logged once, on the rows' own arm), each row with its own request's
    call id, time and latency; counts by stat name."""
    n = job.rows
    t = time.perf_counter()
    error = load_error
    scores = np.full(n, np.nan)
    if model is not None:
        try:
            scores = np.asarray(model.predict(job.columns), dtype=np.float64)
            if scores.shape != (n,):
                raise ValueError(f"{job.log_arm} returned {scores.shape} scores for {n} rows")
        except Exception as exc:  # a broken shadow is logged and counted, never seen by a client
            error = f"{type(exc).__name__}: {exc}"[:500]
            scores = np.full(n, np.nan)
    scoring_ms = (time.perf_counter() - t) * 1e3
    if logger is not None:
        counts = job.counts
        if all(isinstance(at, int) for at in job.logged_at):
            ts_us = np.repeat(np.array(job.logged_at, dtype=np.int64), counts)
        else:
            ts_us = np.concatenate([np.broadcast_to(np.asarray(at, dtype=np.int64), (k,))
                                    for at, k in zip(job.logged_at, counts, strict=True)])
        logger.log_batch(job.request_ids, job.entities, {}, job.label, job.log_arm,
                         np.repeat(np.array(job.feature_ms) + scoring_ms, counts), scores, ts_us=ts_us,
                         error=error, rollout=job.rollout,
                         call_id=np.repeat(np.array(job.call_ids, dtype=object), counts))
    return {f"{job.log_arm}_rows": n, **({f"{job.log_arm}_errors": n} if error else {})}


class OffPathProcess:
    """The parent's handle on the child (see the module docstring). `submit(job)` sends without waiting for
    the child (each wait and wake-up is one more hand-over of the server's GIL) and returns the counts of
    the jobs answered since; `flush()` waits for every answer and the child's log to be written; `close()`
    stops the child after what it holds is written. Thread-safe."""

    def __init__(self, settings: LogSettings | None, *, nice: int = 10, idle: bool = True, torch_threads: int = 1,
                 answer_timeout_s: float = 120.0):
        self.settings, self.nice, self.idle, self.torch_threads = settings, nice, idle, torch_threads
        self.answer_timeout_s = answer_timeout_s
        self.stop_timeout_s = 60.0
        self.log_health: dict[str, Any] | None = None  # the child logger's, from its last answer
        self.restarts = 0
        self._closing = False  # set by close(): nothing more is sent, a dead child is not replaced
        self._lock = threading.Lock()
        self._context = multiprocessing.get_context("spawn")  # never fork a process holding threads
        self._sent: deque[tuple[str, int]] = deque()  # (log arm, rows) of each message not answered yet
        self._conn: Any = None
        self._child: Any = None
        self._start()

    def _start(self) -> None:
        parent, child = self._context.Pipe()
        self._child = self._context.Process(target=child_main, args=(child, self.settings, self.nice, self.idle,
                                                                      self.torch_threads),
                                            name="quiver-off-path", daemon=True)
        self._child.start()
        child.close()
        self._conn = parent

    def submit(self, job: ScoreJob) -> dict[str, int]:
        """Send `job`; counts by stat name of the jobs answered so far (rows of jobs a dead child held are
        counted as `<log arm>_dropped`, and it is started again). A child that falls behind fills the pipe:
        this call then blocks, and the service's queue drops new work, counted."""
        counts: Counter[str] = Counter()
        with self._lock:
            if self._closing:
                return {f"{job.log_arm}_dropped": job.rows}
            try:
                self._conn.send(("score", job))
            except OSError as exc:
                counts[f"{job.log_arm}_dropped"] += job.rows
                self._lost(counts, exc)
                return dict(counts)
            self._sent.append((job.log_arm, job.rows))
            try:
                self._collect(counts, wait_s=None)
            except (EOFError, OSError) as exc:
                self._lost(counts, exc)
        return dict(counts)

    def collect(self) -> dict[str, int]:
        """The counts of the jobs answered since the last call, without waiting."""
        counts: Counter[str] = Counter()
        with self._lock:
            if self._child is None:
                return {}
            try:
                self._collect(counts, wait_s=None)
            except (EOFError, OSError) as exc:
                self._lost(counts, exc)
        return dict(counts)

    def flush(self, timeout_s: float | None = None) -> dict[str, int]:
        """Wait for every job's answer, then for the child's log to be written; the counts answered since the
        last call (tests, and `drain` callers who read the logs next)."""
        return self._control("flush", timeout_s)

    def close(self, timeout_s: float | None = None) -> dict[str, int]:
        """Stop the child after it has written what it holds (idempotent); the counts answered last. A child
        that does not answer within `timeout_s` (default `stop_timeout_s`; hung, its pipe full so that a send
        would block) is killed, and what it held is counted as dropped."""
        if self._child is None:
            return {}
        timeout_s = self.stop_timeout_s if timeout_s is None else timeout_s
        self._closing = True
        counts: dict[str, int] = {}
        stopper = threading.Thread(target=lambda: counts.update(self._control("stop", timeout_s)), daemon=True)
        stopper.start()
        deadline = time.monotonic() + timeout_s + 1
        lifted = False
        while stopper.is_alive() and time.monotonic() < deadline:
            # Again until it stops: a child still starting sets its own class once it gets there.
            lifted = lift_for_stop(self._child.pid) or lifted
            stopper.join(min(0.5, max(0.0, deadline - time.monotonic())))
        if stopper.is_alive() and self.idle and not lifted:
            log.error("the off-path process could not leave the idle class for its stop (that needs CAP_SYS_NICE "
                      "or an RLIMIT_NICE of 20): on a busy machine it got no CPU")
        if stopper.is_alive():
            log.error("the off-path process did not stop within %.0f s; killing it", timeout_s)
            self._child.kill()  # the blocked send fails, and the rows it held are counted
            stopper.join(10)
        with self._lock:
            self._child.join(timeout_s)
            if self._child.is_alive():
                self._child.kill()
            self._conn.close()
            self._child = None
        return counts

    def _control(self, kind: str, timeout_s: float | None) -> dict[str, int]:
        counts: Counter[str] = Counter()
        with self._lock:
            if self._child is None:  # closed
                return {}
            try:
                self._conn.send((kind, None))
                self._sent.append(("", 0))
                self._collect(counts, wait_s=self.answer_timeout_s if timeout_s is None else timeout_s)
            except (EOFError, OSError) as exc:  # TimeoutError included
                self._lost(counts, exc)
        return dict(counts)

    def _collect(self, counts: Counter[str], wait_s: float | None) -> None:
        """Add the answers waiting to `counts` and take the child's log health; with `wait_s`, wait that long
        at most for every message sent to be answered (else TimeoutError)."""
        deadline = None if wait_s is None else time.monotonic() + wait_s
        while True:
            wait = 0.0 if deadline is None or not self._sent else max(0.0, deadline - time.monotonic())
            if not self._conn.poll(wait):
                if deadline is not None and self._sent:
                    raise TimeoutError(f"the off-path process did not answer within {wait_s:.0f} s")
                return
            kind, answer, health = self._conn.recv()
            if health is not None:
                self.log_health = health
            if kind == "answer":
                self._sent.popleft()
                counts.update(answer)

    def _lost(self, counts: Counter[str], exc: BaseException) -> None:
        """The child died or hangs: what it held is counted as dropped; a new one takes the next job (unless
        closing)."""
        restart = not self._closing
        for log_arm, rows in self._sent:
            if log_arm:
                counts[f"{log_arm}_dropped"] += rows
        log.error("the off-path process stopped (%s)%s: %d rows dropped", exc, "; starting it again" * restart,
                  sum(rows for _, rows in self._sent))
        self._sent.clear()
        if self._child is not None and self._child.is_alive():
            self._child.kill()
        self._conn.close()
        if restart:
            self.restarts += 1
            self._start()


def lift_for_stop(pid: int) -> bool:
    """Move every thread of process `pid` out of the idle class, to this process's niceness: a stop is work
    with a deadline and nothing is served any more, yet on a busy machine an idle-class process gets no CPU
    at all (a child still importing torch did not answer a stop in 60 s with four busy processes on 2 cores).
    Leaving the idle class needs CAP_SYS_NICE or an RLIMIT_NICE that allows the niceness; False without."""
    if not hasattr(os, "SCHED_IDLE"):
        return False
    try:
        threads = [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except OSError:  # gone already
        return False
    niceness, lifted = os.getpriority(os.PRIO_PROCESS, 0), True
    for tid in threads:
        try:  # per thread on Linux: both calls with a thread id change that thread only
            os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
            os.setpriority(os.PRIO_PROCESS, tid, niceness)
        except OSError:  # no permission, or the thread ended meanwhile
            lifted = False
    return lifted


def child_main(conn: Any, settings: LogSettings | None, nice: int, idle: bool, torch_threads: int) -> None:
    """The child's loop: score jobs, flush, stop; ends (after writing its log) when the pipe closes."""
    # A signal to the whole process group (Ctrl-C, a service manager's stop) is the parent's to handle: it
    # drains its queue into this process, then says stop. Dying here first would lose what it still sends.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.nice(nice)
    if idle and hasattr(os, "SCHED_IDLE"):
        # Linux's idle class: CPU only when no other task wants it (benchmarks/predict.py on 2 cores, the
        # champion's p99 with the shadow on: 1.23× at nice 10, 1.18× here, both before pipelining).
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    import torch

    from quiver.models.artifact import load_model
    from quiver.serving.logs import ServingLogger, Spool

    torch.set_num_threads(torch_threads)
    logger = None
    if settings is not None:  # its own files and spool: two processes never write the same names
        spool = None if settings.spool_dir is None else Spool(f"{settings.spool_dir}.off-path",
                                                               settings.spool_max_bytes)
        logger = ServingLogger(settings.root, schema=settings.schema, flush_rows=settings.flush_rows,
                               flush_interval_s=settings.flush_interval_s, compression=settings.compression,
                               replica=f"{settings.replica}.off-path", spool=spool)
    models: OrderedDict[tuple[str, str], Any] = OrderedDict()  # (label, sha256) → model, or the load error

    def model_of(job: ScoreJob) -> tuple[Any, str]:
        key = (job.label, job.sha256)
        if key not in models:
            try:
                models[key] = load_model(job.artifact, expected_sha256=job.sha256 or None, version_label=job.label)
            except Exception as exc:
                models[key] = f"cannot load {job.label} in the off-path process: {type(exc).__name__}: {exc}"[:500]
            while len(models) > KEPT_MODELS:
                models.popitem(last=False)
        models.move_to_end(key)
        found = models[key]
        return (None, found) if isinstance(found, str) else (found, "")

    send_lock = threading.Lock()  # answers and the watcher's health messages share the pipe
    stopped = threading.Event()
    told = ["ok"]  # the log status the parent heard last

    def send(kind: str, counts: dict[str, int]) -> None:
        health = logger.health() if logger is not None else None
        with send_lock:
            conn.send((kind, counts, health))
            told[0] = health["status"] if health is not None else "ok"

    def watch_log() -> None:
        """Tell the parent when the log's state changed since it last heard (a write failing, or recovering)
        with no job to answer."""
        while not stopped.wait(1.0) and logger is not None:
            if logger.health()["status"] != told[0]:
                with contextlib.suppress(OSError):
                    send("health", {})

    threading.Thread(target=watch_log, name="quiver-off-path-health", daemon=True).start()
    try:
        while True:
            try:
                kind, job = conn.recv()
            except (EOFError, OSError):  # the parent is gone: write what is held, then end
                return
            counts: dict[str, int] = {}
            if kind == "score":
                model, error = model_of(job)
                counts = score_and_log(model, job, logger, error)
            elif kind == "flush" and logger is not None:
                logger.flush()
            elif kind == "stop":
                stopped.set()
                if logger is not None:
                    logger.close()
            send("answer", counts)
            if kind == "stop":
                return
    finally:
        stopped.set()
        if logger is not None:
            logger.close()
