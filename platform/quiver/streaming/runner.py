"""`python -m quiver.streaming.runner`: the streaming job end to end (what `quiver stream` runs).

Threads: the feeder moves new stream files into the job's inbox (unbounded runs), the loader moves
committed change files into the online store and writes the status; the main thread submits the Flink
job and watches it. A run resumes from the latest checkpoint of the same job, else starts fresh: the
state directory is cleared and the whole stream directory is replayed (online writes are idempotent).
`--bounded` processes the stream files present at start (Kafka: the records in the topics at start) and
stops once every batch is committed and loaded (the checkpoint stays, so the next run resumes); unbounded
runs until SIGTERM/SIGINT, or SIGUSR1, which stops the job with a savepoint the next run restores.

Defaults (measured in benchmarks/streaming.py on a 2-core machine, docs/streaming.md): checkpoints every
1000 ms (the file sinks commit on checkpoints, so this sets freshness: p99 1.95 s at 10.6k events/s and
4.0 s at 12.2k on a 1M-event state here; 500 ms gives 1.5 s for a third less throughput), object reuse and uncompressed
RocksDB state (job.py), mini-batch off (`--mini-batch-ms N`
turns it on now that the late split is the feeder's; it turns the last-value top-1 into before/after
pairs, which cost more than the tile rows it saves), RocksDB state. Sources bound to Kafka need the Flink
Kafka SQL connector jar and Quiver's own jar, whose `quiver_parse` reads the records (see `kafka_job_jars`).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from quiver.catalog.errors import QuiverError
from quiver.catalog.ir import Catalog
from quiver.compile.flink import FlinkJob, FlinkTarget, compile_flink, streamed_views
from quiver.config import Config
from quiver.jars import REDIS_SINK, bundle_jars, has_bundle
from quiver.offline.store import store_for
from quiver.online.base import OnlineStore, OnlineStoreError
from quiver.online.cluster_wire import CLUSTER_SCHEMES
from quiver.online.jvm_sink import markers_key, sink_options
from quiver.online.redis_store import RedisOnlineStore, redact_url
from quiver.streaming.feeder import Feeder, source_feeds
from quiver.streaming.job import (
    SAVEPOINTS,
    JobOptions,
    RunningJob,
    checkpoint_number,
    clear_checkpoints,
    is_java_error,
    java_error_summary,
    latest_checkpoint,
    record_job,
    restore_point,
    submit,
)
from quiver.streaming.late_kafka import KafkaLateStore, forget_on_fresh, late_layouts, move_committed
from quiver.streaming.loader import Loader
from quiver.streaming.options import (
    StreamOptions,
    default_state_dir,
    kafka_job_jars,
    kafka_target,
    options_from_args,
    parse_args,
)
from quiver.streaming.paths import StreamPaths
from quiver.streaming.status import MetricsPublisher, tree_cpu_s, write_status
from quiver.streaming.topics import TopicProgress

log = logging.getLogger("quiver.streaming")
_TERMINAL = ("FINISHED", "FAILED", "CANCELED")
class StreamRunner:
    """One streaming run over a state directory."""

    def __init__(self, config: Config, catalog: Catalog, paths: StreamPaths, options: StreamOptions,
                 store: OnlineStore | None = None):
        self.config, self.catalog, self.paths, self.options = config, catalog, paths, options
        self.views = streamed_views(catalog, options.views)
        if not self.views:
            raise QuiverError("no feature view to stream: none is online with a source that has a stream binding")
        self.sources = sorted({v.source for v in self.views})
        self.kafka = self._kafka_bound()
        self.streams = {} if self.kafka else {s: self._stream_dir(s) for s in self.sources}
        self._store = store
        self.redis_url = self._direct_url(options.sink)
        self.job = self._compile()
        # A Kafka job needs the connector and our jar (its record parser); the Redis sink is in our jar too.
        jars = kafka_job_jars() if self.kafka else []
        self.jars = jars + [j for j in (bundle_jars(REDIS_SINK) if self.redis_url else []) if j not in jars]
        self.topics = TopicProgress(self.catalog, self.sources, config.kafka, config.project) if self.kafka else None
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the feeder thread updates the status the loader thread writes
        self._feed_lock = threading.Lock()  # feeding and retiring batches change the same inbox
        self._running: RunningJob | None = None
        self._loader_failed = False
        self._savepoint = False
        self._status: dict[str, Any] = {"state": "starting", "mode": "bounded" if options.bounded else "unbounded",
                                        "views": [v.name for v in self.views], "sources": self.sources,
                                        "parallelism": options.parallelism, "started_at": time.time(),
                                        "cluster": options.jobmanager or "mini-cluster",
                                        "sink": "redis (JVM sink)" if self.redis_url else "change files + loader",
                                        "state_dir": str(paths.root), "error": None}

    def marking_views(self) -> list[str]:
        """The view of each source whose sink carries the feeder's batch markers (compile/flink.py)."""
        if self.kafka:
            return []
        return [next(v.name for v in self.views if v.source == s) for s in self.sources]

    def _direct_url(self, sink: str) -> str:
        """The Redis URL the JVM sink writes to, or "" when the job writes change files for the loader.

        `auto` takes the sink when it can: a Redis the JVM reaches (TCP, or the embedded Redis's Unix socket
        from this machine) and the sink's jar built by `make setup`."""
        if sink not in ("auto", "redis", "files"):
            raise QuiverError(f"sink must be auto, redis or files, got {sink!r}")
        if sink == "files":
            return ""
        url = self.config.redis_url or (self._store.url if isinstance(self._store, RedisOnlineStore) else "")
        reachable = url.startswith(("redis://", "rediss://", "unix:///", *CLUSTER_SCHEMES))
        if sink == "redis":
            if not reachable:
                raise QuiverError(f"the JVM Redis sink needs a redis://, rediss://, redis+cluster:// or unix:/// "
                                  f"URL, not {redact_url(url) or 'none (no redis_url, no store)'}: use --sink files")
            bundle_jars(REDIS_SINK)  # a clear error when setup has not built it
            return url
        return url if reachable and has_bundle(REDIS_SINK) else ""

    def direct_markers(self) -> dict[str, str] | None:
        """source → the Redis SET of its batch markers, when the JVM sink writes the values."""
        if not self.redis_url:
            return None
        return {s: markers_key(self.config.project, s) for s in self.sources}

    def _kafka_bound(self) -> bool:
        """Whether the job reads Kafka topics (else stream files): each binding says (`StreamSpec.reads_kafka`),
        and one job reads one kind."""
        streams = {s: self.catalog.sources[s].stream for s in self.sources}
        kafka = [s for s, b in streams.items() if b is not None and b.reads_kafka(self.config.kafka_bootstrap)]
        if kafka and len(kafka) < len(self.sources):
            raise QuiverError(f"sources {', '.join(self.sources)}: stream them in separate jobs (--views): "
                              "one job reads either local stream files or Kafka topics")
        return bool(kafka)

    def _stream_dir(self, source: str) -> Path:
        stream = self.catalog.sources[source].stream
        assert stream is not None and stream.path
        path = Path(stream.path)
        return path if path.is_absolute() else Path(self.config.root) / path

    def _compile(self) -> FlinkJob:
        target = FlinkTarget(inbox={s: self.paths.inbox(s).as_uri() for s in self.sources},
                             sink_root=self.paths.sinks.as_uri(),
                             monitor_interval_ms=self.options.monitor_interval_ms,
                             roll_interval_ms=self.options.roll_interval_ms,
                             max_future_ms=self.options.max_future_ms, kafka=self.kafka,
                             **kafka_target(self.config, self.sources, self.options.startup),
                             mini_batch_ms=self.options.mini_batch_ms,
                             extra_settings=self.options.table_settings, view_sinks=self._view_sinks())
        return compile_flink(self.catalog, target, [v.name for v in self.views])

    def _view_sinks(self) -> dict[str, dict[str, str]]:
        if not self.redis_url:
            return {}
        marking = set(self.marking_views())
        project = self.config.project
        return {v.name: sink_options(v, "tiles" if v.kind == "agg" else "last", self.redis_url, project=project,
                                     markers_key=markers_key(project, v.source) if v.name in marking else None,
                                     flush_interval_ms=self.options.sink_flush_ms,
                                     in_flight=self.options.sink_in_flight)
                for v in self.views}

    def stop(self, savepoint: bool = False) -> None:
        """Ask a running job to stop (unbounded runs: cancel, keep the checkpoint, drain the loader); with
        `savepoint`, stop it with a savepoint instead, which the next run restores (an upgrade, a move)."""
        self._savepoint = self._savepoint or savepoint
        self._stop.set()

    # ----- the run -----

    def run(self) -> int:
        """Run until the job finishes (bounded) or stop() is called; returns a process exit code."""
        if self.topics is not None:  # a refused login or an absent cluster: one line now, not a job that retries
            self.topics.check()
        restore = None if self.options.fresh else restore_point(self.paths, self.job)
        if restore is None:
            self._start_fresh()
        elif self.kafka and self.options.startup != "earliest":
            log.warning("--startup %s applies to a job with no state: this one resumes from the offsets in %s "
                        "(--fresh starts it anew)", self.options.startup, restore)
        record_job(self.paths, self.job, self.options.bounded)
        self._status["restored_from"] = str(restore) if restore else None
        feeder = Feeder(self.streams, self.paths, source_feeds(self.catalog, self.views),
                        store_for(self.config), self.options.max_future_ms,
                        stream_retention_s=self.options.stream_retention_s)
        feed_began = time.perf_counter()
        fed = feeder.feed()
        self._status["feed_s"] = time.perf_counter() - feed_began  # the backlog's check and split
        self._status["feeder"] = {"files": sum(fed.files.values()), "lines": fed.total_lines,
                                  "unparseable": dict(fed.unparseable), "backlog": 0}
        self._feeder_totals(feeder)
        if self.topics is not None and self.options.bounded:  # a bounded run reads what the topics hold now
            self._status["kafka_goal"] = self.topics.mark_ends()
        store = self._store or self._open_store()
        if restore is None and isinstance(store, RedisOnlineStore):
            for key in (self.direct_markers() or {}).values():  # an earlier job's batch names may come again
                store.remove_members(key, sorted(store.set_members(key)))
        loader = Loader(self.views, self.sources, store, self.paths, self.marking_views(), self.direct_markers(),
                        late_store=self._late_store())
        publisher = MetricsPublisher()
        threads = [threading.Thread(target=self._load_loop, args=(loader, publisher, feeder), name="loader",
                                    daemon=True)]
        if not self.options.bounded:
            threads.append(threading.Thread(target=self._feed_loop, args=(feeder,), name="feeder", daemon=True))
        code = 0
        try:
            self._status["timings"] = {"submit": time.time()}
            options = JobOptions(self.options.parallelism, self.options.checkpoint_interval_ms,
                                 self.options.state_backend, extra=self.options.flink_settings, jars=tuple(self.jars),
                                 jobmanager=self.options.jobmanager)
            self._running = submit(self.job, options, self.paths, restore)
            # Only now: a thread of ours running while the job is planned can make py4j open a second
            # connection, and Flink's planner then fails on the other Java thread (see job.submit).
            for t in threads:
                t.start()
            self._status["timings"]["running"] = time.time()
            # The whole tree (this process + the Flink JVM) and this process alone (feeder, loader, py4j):
            # their difference is Flink's share (the benchmark's profile).
            self._status["cpu_s"] = {"running": tree_cpu_s(), "python_running": time.process_time()}
            self._status.update(state="running", job_id=self._running.job_id)
            log.info("job %s running: views %s", self._running.job_id, ", ".join(self._status["views"]))
            final = self._watch(self._running, feeder, loader)
            self._status["job_state"] = final
            if final == "FAILED":
                code = 1
                self._status["error"] = "the Flink job failed (see the Flink log)"
            if self._loader_failed:
                code = 1
        except Exception as exc:
            code = 1
            if not is_java_error(exc):
                self._status["error"] = f"{type(exc).__name__}: {exc}"
                raise
            # Flink's own error (planner, submission): its cause chain here, the whole Java trace in a file.
            self.paths.error_file.write_text(str(exc))
            self._status["error"] = java_error_summary(exc)
            log.error("the Flink job could not run: %s (full trace: %s)", self._status["error"], self.paths.error_file)
        finally:
            self._stop.set()
            for t in threads:
                if t.ident is not None:  # started
                    t.join(timeout=30)
            self._drain(loader, publisher)
            self._status.setdefault("timings", {})["finished"] = time.time()
            self._status["state"] = "failed" if code else ("finished" if self.options.bounded else "stopped")
            self._write(loader)
            if self._store is None:
                store.close()
            if self.topics is not None:
                self.topics.close()
        return code

    def _watch(self, running: RunningJob, feeder: Feeder, loader: Loader) -> str:
        done_at: int | None = None  # checkpoint number when every batch was seen committed
        while True:
            state = running.status()
            if state in _TERMINAL:
                if self.options.bounded and state == "FINISHED" and done_at is None:
                    log.error("the Flink job ended before every batch was committed")
                    return "FAILED"  # the file source never ends by itself: something stopped it
                return state
            if self.options.bounded:
                if done_at is None and self._all_batches_done(feeder, loader):
                    done_at = _checkpoint_number(self.paths)
                    self._status["timings"]["batches_done"] = time.time()
                    cpu = self._status.setdefault("cpu_s", {})
                    cpu.update(batches_done=tree_cpu_s(), python_batches_done=time.process_time())
                # Two more checkpoints: every sink has had its commit notification for the marker's one.
                if done_at is not None and _checkpoint_number(self.paths) >= done_at + 2:
                    running.cancel()  # checkpoints are retained: the next run resumes from here
                    return "FINISHED"
            if self._stop.wait(0.2):
                if self.options.bounded:
                    log.info("stopping a bounded run before it finished; the next run resumes it")
                if self._savepoint:
                    self._status["savepoint"] = running.stop_with_savepoint(self.paths.checkpoints / SAVEPOINTS)
                    log.info("stopped with savepoint %s", self._status["savepoint"])
                    return "FINISHED"
                running.cancel()
                return "CANCELED"

    def _all_batches_done(self, feeder: Feeder, loader: Loader) -> bool:
        if self.topics is not None:  # Kafka: offsets are committed once the checkpoint holding them completed
            return self.topics.caught_up()
        return all(set(names) <= loader.markers for names in feeder.batches().values())

    def _feeder_totals(self, feeder: Feeder) -> None:
        """Late and future-dated events per source, from the feeder's manifests (they survive restarts)."""
        info = self._status["feeder"]
        info["late"] = {s: t.get("late", 0) for s, t in feeder.totals.items()}
        info["future"] = {s: t.get("future", 0) for s, t in feeder.totals.items()}

    def _retire(self, feeder: Feeder, loader: Loader, seen: dict[str, int]) -> None:
        """Retention: inbox batches (and their marker files) go two checkpoints after their marker was
        committed, so any checkpoint a restart restores has read them completely."""
        now = _checkpoint_number(self.paths)
        for batch in loader.markers:
            seen.setdefault(batch, now)
        ready = {b for b, at in seen.items() if now >= at + 2}
        if ready:
            with self._feed_lock:
                removed = feeder.retire(ready)
            loader.forget_markers(ready)
            for batch in ready:
                seen.pop(batch, None)
            if removed:
                self._status["feeder"]["retired_batches"] = self._status["feeder"].get("retired_batches", 0) + removed

    def _start_fresh(self) -> None:
        """Forget every trace of an earlier job: its checkpoints, inbox, change files and logs, and the offsets
        its Kafka consumer group committed."""
        clear_checkpoints(self.paths)
        # Late records are replayed (written again) by the file route and by a Kafka job reading its topics from
        # the start; any other start keeps them, the committed late files of the last job included.
        replayed = not self.kafka or self.options.startup == "earliest"
        late_store = self._late_store()
        if late_store is not None and not replayed:
            move_committed(late_store, self.paths, self.sources)
        for folder in (self.paths.root / "inbox", self.paths.sinks):
            shutil.rmtree(folder, ignore_errors=True)
        for name in ("counts.json", "markers.json"):
            (self.paths.root / name).unlink(missing_ok=True)
        forget_on_fresh(store_for(self.config), self.sources, replayed, self.options.startup)
        if self.topics is not None and self.options.startup != "group-offsets":  # that start reads them
            self.topics.forget_commits()

    def _open_store(self) -> OnlineStore:
        from quiver.online.factory import open_online_store

        return open_online_store(self.config, writer=True)

    def _feed_loop(self, feeder: Feeder) -> None:
        pause = max(self.options.monitor_interval_ms / 2000, 0.02)
        while not self._stop.is_set():
            try:
                with self._feed_lock:
                    fed = feeder.feed()
                with self._lock:
                    info = self._status["feeder"]
                    info["files"] += sum(fed.files.values())
                    info["lines"] += fed.total_lines
                    info["backlog"] = feeder.backlog()
                    for source, n in fed.unparseable.items():
                        info["unparseable"][source] = info["unparseable"].get(source, 0) + n
                    self._feeder_totals(feeder)
            except OSError as exc:  # a file vanished or a disk hiccup: retry on the next pass
                log.warning("feeder: %s", exc)
            self._stop.wait(pause)

    def _load_loop(self, loader: Loader, publisher: MetricsPublisher, feeder: Feeder) -> None:
        pause = self.options.poll_interval_ms / 1000
        next_status = 0.0
        seen: dict[str, int] = {}
        while not self._stop.is_set():
            try:
                loader.poll()
                if not self.options.bounded:  # a bounded run keeps its batches: it finishes by them
                    self._retire(feeder, loader, seen)
                if time.monotonic() >= next_status:
                    self._topic_progress()
                    publisher.publish(self._late(loader), loader.stats.newest_event_us)
                    self._write(loader)
                    next_status = time.monotonic() + 1.0
            except OnlineStoreError as exc:  # Redis down: the files stay, the next poll retries them
                log.warning("loader: %s", exc)
                self._stop.wait(1.0)
            except OSError as exc:
                log.warning("retention or status: %s", exc)
            except Exception as exc:  # a dead loader must fail the run, never leave it waiting
                log.exception("loader failed")
                self._status["error"] = f"loader: {type(exc).__name__}: {exc}"
                self._loader_failed = True
                self._stop.set()
                return
            self._stop.wait(pause)

    def _topic_progress(self) -> None:
        """Kafka: records at the topics' ends, committed by the job, and the lag (in the status)."""
        if self.topics is None:
            return
        try:
            self._status["kafka"] = self.topics.snapshot()
        except Exception as exc:  # a broker restart must not stop the loader; the next pass retries
            log.warning("kafka offsets: %s", exc)

    def _drain(self, loader: Loader, publisher: MetricsPublisher) -> None:
        try:
            loader.poll()
        except OnlineStoreError as exc:
            log.error("loader: could not load the last change files (they stay for the next run): %s", exc)
        except Exception as exc:
            if not self._loader_failed:
                raise
            log.error("loader: %s (the change files stay for the next run)", exc)
        publisher.publish(self._late(loader), loader.stats.newest_event_us)

    def _late_store(self) -> KafkaLateStore | None:
        """Kafka: where the job's late records go (the offline store's `_late_events/`, like the feeder's)."""
        if not self.kafka:
            return None
        return KafkaLateStore(store_for(self.config), late_layouts(self.catalog, self.views))

    def _late(self, loader: Loader) -> dict[str, int]:
        """Late events per source: the feeder's split (local files) plus the job's late sink (Kafka)."""
        late = dict(loader.stats.late)
        for source, n in (self._status.get("feeder", {}).get("late") or {}).items():
            late[source] = late.get(source, 0) + int(n)
        return late

    def _write(self, loader: Loader) -> None:
        latest = latest_checkpoint(self.paths.checkpoints)
        self._status["checkpoint"] = ({"path": str(latest), "at": (latest / "_metadata").stat().st_mtime}
                                      if latest else None)
        self._status["loader"] = loader.stats.as_dict()
        self._status["late"] = self._late(loader)
        self._status["pid"] = _pid()
        try:
            with self._lock:
                write_status(self.paths, self._status)
        except OSError as exc:
            log.warning("status: %s", exc)


def _checkpoint_number(paths: StreamPaths) -> int:
    latest = latest_checkpoint(paths.checkpoints)
    return checkpoint_number(latest) if latest else -1


def _pid() -> int:
    return os.getpid()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code (2 for user errors, 1 when the job failed)."""
    from quiver.catalog.loader import load_catalog
    from quiver.config import load_config
    from quiver.online.factory import open_online_store

    args = parse_args(argv)
    level = logging.getLevelName(args.log_level.upper())
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Our own lines obey --log-level even after Beam's worker set the root logger to INFO (it does, in-process);
    # Beam's and PyFlink's start-up notes (type hints, BigQuery, Cython) are not the job's story: at most warnings.
    logging.getLogger("quiver").setLevel(level)
    for chatty in ("apache_beam", "pyflink"):
        logging.getLogger(chatty).setLevel(max(logging.WARNING, level))
    try:
        config = load_config(args.config)
        catalog = load_catalog(args.catalog or config.catalog_dir, root=config.root)
        options = options_from_args(args, config)
        paths = StreamPaths.at(args.state_dir or default_state_dir(config), args.checkpoint_dir)
        # The project's store, opened now (the run opens it anyway): the embedded Redis's socket is where the
        # JVM sink writes when no redis_url is set.
        store = None if options.sink == "files" else open_online_store(config, writer=True)
        runner = StreamRunner(config, catalog, paths, options, store=store)
    except QuiverError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    def on_signal(signum: int, frame: Any) -> None:
        log.info("signal %d: stopping", signum)
        runner.stop()

    def on_savepoint(signum: int, frame: Any) -> None:
        log.info("signal %d: stopping with a savepoint", signum)
        runner.stop(savepoint=True)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGUSR1, on_savepoint)
    try:
        return runner.run()
    except QuiverError as exc:  # e.g. the Kafka brokers do not answer: one line, no trace
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        if store is not None:
            store.close()


if __name__ == "__main__":
    raise SystemExit(main())
