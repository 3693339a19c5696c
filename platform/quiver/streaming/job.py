"""Run the compiled Flink SQL job — in PyFlink's local mini-cluster, or on a session cluster given its
JobManager's REST address (`JobOptions.jobmanager`, see cluster.py) — with checkpoints, restore, wait, cancel.

Checkpoints go to `<checkpoints>/<job id>/chk-<n>` (file://, RocksDB incremental by default) and are
retained on cancellation and on crashes, so a restarted job resumes from the newest complete one: the
source knows which files and offsets it read, the aggregates hold their tiles, and the filesystem sinks
commit exactly the files of that checkpoint. A checkpoint is only reused when it was written by the very
same job (`job.json`: a hash of the SQL); otherwise the job starts fresh and replays the stream.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import logging
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quiver.compile.flink import FlinkJob
from quiver.streaming.paths import StreamPaths

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobOptions:
    """Runtime settings of the Flink job (the SQL comes from compile/flink.py)."""

    parallelism: int = 1
    checkpoint_interval_ms: int = 1000
    state_backend: str = "rocksdb"  # or "hashmap" (state on the heap)
    retained_checkpoints: int = 2
    restart_attempts: int = 3
    extra: tuple[tuple[str, str], ...] = ()  # further Flink settings, applied last
    jars: tuple[Path, ...] = ()  # connector jars (Kafka)
    jobmanager: str = ""  # "host:port" of a session cluster's REST endpoint; empty: the embedded mini-cluster


SAVEPOINTS = "savepoints"  # under the checkpoint folder: savepoints of runs stopped with one


# Source options that never change what the state means: client settings (a rotated password, a new truststore),
# the consumer group the offsets are also committed to, and where a job with no state starts. The brokers stay in.
_NOT_STATE = re.compile(r"^\s*'(properties\.(?!bootstrap\.servers')[^']*|scan\.startup\.[^']*)' = .*$\n?", re.M)


def job_hash(job: FlinkJob) -> str:
    """Identity of a job's state layout: checkpoints of another hash are never restored."""
    return hashlib.sha256(_NOT_STATE.sub("", job.script()).encode()).hexdigest()[:16]


def latest_checkpoint(checkpoints: Path) -> Path | None:
    """The newest complete checkpoint (a `chk-<n>` folder with `_metadata`) or savepoint (`savepoints/
    savepoint-*`, written when a run is stopped with one) under `checkpoints`."""
    if not checkpoints.is_dir():
        return None
    found: list[tuple[float, int, Path]] = []
    for metadata in [*checkpoints.glob("*/chk-*/_metadata"), *checkpoints.glob(f"{SAVEPOINTS}/savepoint-*/_metadata")]:
        try:
            found.append((metadata.stat().st_mtime, checkpoint_number(metadata.parent), metadata.parent))
        except FileNotFoundError:  # subsumed: Flink deleted it between the listing and now (it keeps only the newest)
            continue
    return max(found)[2] if found else None


def checkpoint_number(point: Path) -> int:
    """n of a `chk-<n>` folder; 0 for a savepoint (the checkpoints after it count on from its own id)."""
    return int(point.name.split("-")[1]) if point.name.startswith("chk-") else 0


def restore_point(paths: StreamPaths, job: FlinkJob) -> Path | None:
    """The checkpoint to resume from, or None when the job must start fresh (none, or another job's)."""
    try:
        meta = json.loads(paths.job_file.read_text())
    except (OSError, ValueError):
        return None
    if meta.get("hash") != job_hash(job):
        return None
    return latest_checkpoint(paths.checkpoints)


def clear_checkpoints(paths: StreamPaths) -> None:
    """Remove the checkpoints and savepoints of earlier jobs (only Flink's folders, never anything else)."""
    if not paths.checkpoints.is_dir():
        return
    shutil.rmtree(paths.checkpoints / SAVEPOINTS, ignore_errors=True)
    for child in paths.checkpoints.iterdir():
        if child.is_dir() and len(child.name) == 32 and all(c in "0123456789abcdef" for c in child.name):
            shutil.rmtree(child, ignore_errors=True)


def record_job(paths: StreamPaths, job: FlinkJob, bounded: bool) -> None:
    paths.root.mkdir(parents=True, exist_ok=True)
    tmp = paths.job_file.with_name(".job.json.tmp")
    tmp.write_text(json.dumps({"hash": job_hash(job), "bounded": bounded, "views": list(job.views)}))
    tmp.replace(paths.job_file)


def flink_config(job: FlinkJob, options: JobOptions, paths: StreamPaths, restore: Path | None) -> dict[str, str]:
    """Every Flink setting of the run: the job's table settings, then checkpointing, state and recovery."""
    settings = dict(job.settings)
    settings.update({
        "parallelism.default": str(options.parallelism),
        "pipeline.name": "quiver-stream",
        "execution.checkpointing.interval": f"{options.checkpoint_interval_ms} ms",
        "execution.checkpointing.min-pause": "0 ms",
        "execution.checkpointing.dir": paths.checkpoints.as_uri(),
        "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
        "execution.checkpointing.num-retained": str(options.retained_checkpoints),
        "execution.checkpointing.incremental": "true",
        "state.backend.type": options.state_backend,
        "restart-strategy.type": "fixed-delay",
        "restart-strategy.fixed-delay.attempts": str(options.restart_attempts),
        "restart-strategy.fixed-delay.delay": "1 s",
        # Chained operators hand records on without a defensive copy. Safe for SQL jobs (the planner's
        # operators copy where they keep a row; the job has no user functions); a small gain in
        # interleaved runs, inside the noise at 1M events (docs/streaming.md, Throughput).
        "pipeline.object-reuse": "true",
    })
    if options.state_backend == "rocksdb":
        # Checkpoints flush RocksDB every interval and compaction rewrites what was flushed: compressing
        # it all again and again cost ~18 % of the job's CPU at 1M events (docs/streaming.md). The state
        # is a few hundred bytes per entity and tile; disk is the cheaper resource here.
        settings["state.backend.rocksdb.compression.per.level"] = "NO_COMPRESSION"
    if options.jars:
        settings["pipeline.jars"] = ";".join(p.resolve().as_uri() for p in options.jars)
    settings.update(dict(options.extra))
    if restore is not None:
        settings["execution.state-recovery.path"] = restore.as_uri()
    settings.update(target_settings(options.jobmanager))
    return settings


def target_settings(jobmanager: str) -> dict[str, str]:
    """Where the job runs: {} for the mini-cluster, else a remote session cluster at "host:port"."""
    if not jobmanager:
        return {}
    host, sep, port = jobmanager.rpartition(":")
    if not sep or not host or not port.isdigit():
        from quiver.catalog.errors import QuiverError

        raise QuiverError(f"jobmanager {jobmanager!r}: expected HOST:PORT of the Flink REST endpoint, e.g. "
                          f"flink-jobmanager:8081")
    return {"execution.target": "remote", "rest.address": host, "rest.port": port}


def is_java_error(exc: BaseException) -> bool:
    """True for an error Flink's JVM raised (PyFlink wraps it in py4j's Py4JJavaError)."""
    return type(exc).__name__ == "Py4JJavaError" or hasattr(exc, "java_exception")


def java_error_summary(exc: BaseException, limit: int = 6) -> str:
    """The cause chain of a Java error on one line: each exception's first line, outermost first, without the
    stack frames (a terminal or a CI log shows the end of a long trace, and the reason is at its head)."""
    causes: list[str] = []
    for line in str(exc).splitlines():
        for head in (": ", "Caused by: "):  # py4j puts the outermost exception after ": "
            if line.startswith(head) and line[len(head):].strip() not in causes:
                causes.append(line[len(head):].strip()[:300])
    return " <- ".join(causes[:limit]) or f"{type(exc).__name__}: {str(exc)[:300]}"


class RunningJob:
    """A submitted job: its id, status, wait and cancel (wraps PyFlink's TableResult)."""

    def __init__(self, result: Any):
        self._result = result
        self._client = result.get_job_client()

    @property
    def job_id(self) -> str:
        return str(self._client.get_job_id()) if self._client is not None else ""

    def status(self) -> str:
        """RUNNING, FINISHED, FAILED, CANCELED, …"""
        if self._client is None:
            return "UNKNOWN"
        try:
            return str(self._client.get_job_status().result()).rsplit(".", 1)[-1]
        except Exception:
            # An attached local job shuts its mini-cluster down when it ends: ask the result instead.
            try:
                self._result.wait()
            except Exception as exc:
                log.error("Flink job failed: %s", str(exc).splitlines()[0] if str(exc) else exc)
                return "FAILED"
            return "FINISHED"

    def wait(self, timeout_ms: int | None = None) -> None:
        if timeout_ms is None:
            self._result.wait()
        else:
            self._result.wait(timeout_ms)

    def cancel(self) -> None:
        if self._client is not None:
            self._client.cancel().result()

    def stop_with_savepoint(self, directory: Path) -> str:
        """Stop the job after a savepoint in `directory` (sources stop, sinks flush); returns its path."""
        if self._client is None:
            raise RuntimeError("no job client: the job cannot be stopped with a savepoint")
        from pyflink.java_gateway import get_gateway

        # PyFlink 2.3's JobClient.stop_with_savepoint calls a two-argument Java method that Flink 2 no longer
        # has (it takes the savepoint format too): call the Java client directly.
        canonical = get_gateway().jvm.org.apache.flink.core.execution.SavepointFormatType.CANONICAL
        java_client = self._client._j_job_client
        return str(java_client.stopWithSavepoint(False, directory.resolve().as_uri(), canonical).get())


def submit(job: FlinkJob, options: JobOptions, paths: StreamPaths, restore: Path | None) -> RunningJob:
    """Create a streaming TableEnvironment, run the DDL and submit the job's statement set."""
    from pyflink.common import Configuration
    from pyflink.table import EnvironmentSettings, TableEnvironment

    settings = flink_config(job, options, paths, restore)
    # The target goes in at creation: the executor (local or remote) is chosen from this configuration.
    initial = Configuration()
    for key, value in target_settings(options.jobmanager).items():
        initial.set_string(key, value)
    with _one_java_thread():
        env = TableEnvironment.create(EnvironmentSettings.new_instance().in_streaming_mode()
                                      .with_configuration(initial).build())
        conf = env.get_config()
        for key, value in settings.items():
            conf.set(key, value)
        for statement in job.statements:
            env.execute_sql(statement)
        statements = env.create_statement_set()
        for insert in job.inserts:
            statements.add_insert_sql(insert)
        log.info("submitting Flink job (%d views, parallelism %d, restore from %s) to %s", len(job.views),
                 options.parallelism, restore or "nothing", options.jobmanager or "the embedded mini-cluster")
        return RunningJob(statements.execute())


@contextlib.contextmanager
def _one_java_thread() -> Iterator[None]:
    """No garbage collection while a job is planned. Flink's planner keeps its metadata provider in a Java
    ThreadLocal (FLINK-23020, unfixed), so every planning call must reach the JVM on the Java thread that
    created the planner: one py4j connection. py4j gives a call whichever connection is free and opens
    another when none is; a collection on any Python thread runs py4j finalizers, which send commands, and
    one sent while the main thread called made a second connection. Later calls then landed on either, and
    the planner failed with `NullPointerException: metadataHandlerProvider` (seen on CI and here, rarely)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
