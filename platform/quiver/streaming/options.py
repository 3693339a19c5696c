"""How a streaming run is configured: `StreamOptions`, the runner's command line (`parse_args`,
`options_from_args`), its default state folder, and the jars a Kafka job needs (`kafka_job_jars`). Light on
purpose: the Flink virtualenv imports it."""

from __future__ import annotations

import argparse
import importlib.util
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from quiver.catalog.errors import QuiverError
from quiver.config import Config
from quiver.jars import FLINK_KAFKA, REDIS_SINK, bundle_jars, has_bundle

RUNNER_DOC = "`python -m quiver.streaming.runner`: the streaming job end to end (what `quiver stream` runs)."
KAFKA_JAR = "flink-sql-connector-kafka"
KAFKA_JAR_HELP = ("run `make setup` (scripts/jars.sh fetches it from Maven Central into build/jars/flink-kafka/), "
                  "or set QUIVER_FLINK_JARS=/path/to/flink-sql-connector-kafka-<version>.jar")


@dataclass(frozen=True)
class StreamOptions:
    """How to run the streaming job."""

    bounded: bool = False
    parallelism: int = 1
    checkpoint_interval_ms: int = 1000
    monitor_interval_ms: int = 100
    roll_interval_ms: int = 100
    poll_interval_ms: int = 50
    state_backend: str = "rocksdb"
    fresh: bool = False
    views: tuple[str, ...] | None = None
    max_future_ms: int | None = None  # None: each source's StreamBinding.max_future
    startup: str = "earliest"  # Kafka, a job with no state: earliest, latest, group-offsets, timestamp:<epoch ms>
    mini_batch_ms: int = 0
    stream_retention_s: float | None = None  # delete fed stream files older than this (None: keep them)
    table_settings: tuple[tuple[str, str], ...] = ()  # extra Flink table settings (in the job's SQL)
    flink_settings: tuple[tuple[str, str], ...] = ()  # extra Flink runtime settings (e.g. memory)
    jobmanager: str = ""  # REST "host:port" of a Flink session cluster; empty: the embedded mini-cluster
    sink: str = "auto"  # "redis": the JVM sink writes to Redis; "files": change files + loader; auto: redis if it can
    sink_flush_ms: int = 200  # the JVM sink also writes this often, not only on checkpoints (0: only then)
    sink_in_flight: int = 2  # JVM sink: flushes written on its own thread at once (0: in the task thread)


def default_state_dir(config: Config) -> Path:
    return Path(config.root) / ".quiver" / "stream"


def settings_pairs(items: Sequence[str]) -> tuple[tuple[str, str], ...]:
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise QuiverError(f"expected KEY=VALUE, got {item!r}")
        out.append((key.strip(), value.strip()))
    return tuple(out)


_SECRET_WORDS = ("password", "jaas", "secret", "token", "key")


def kafka_target(config: Config, sources: Sequence[str], startup: str = "earliest",
                 redact: bool = False) -> dict[str, Any]:
    """The Kafka part of the job's `FlinkTarget`: brokers, client properties, each source's consumer group and
    the start. `redact`: secret-looking property values replaced (for SQL shown to people)."""
    settings = config.kafka
    properties = dict(settings.flink_properties())
    if redact:
        properties = {k: "<redacted>" if any(w in k.lower() for w in _SECRET_WORDS) else v
                      for k, v in properties.items()}
    return {"kafka_bootstrap": settings.bootstrap, "kafka_properties": tuple(properties.items()),
            "kafka_groups": {s: settings.group(config.project, s) for s in sources}, "kafka_startup": startup}


def startup_mode(text: str) -> str:
    """`--startup` as the compiler takes it: earliest, latest, group-offsets or timestamp:<epoch ms> (an ISO-8601
    time with a zone is converted). A QuiverError that names the accepted forms otherwise."""
    value = text.strip().lower()
    if value in ("earliest", "latest", "group-offsets"):
        return value
    kind, sep, when = text.strip().partition(":")
    if kind.lower() == "timestamp" and sep:
        if when.isdigit():
            return f"timestamp:{int(when)}"
        try:
            moment = datetime.fromisoformat(when)
        except ValueError:
            moment = None
        if moment is not None and moment.tzinfo is not None:
            return f"timestamp:{int(moment.timestamp() * 1000)}"
    raise QuiverError(f"--startup {text!r}: expected earliest, latest, group-offsets or timestamp:<epoch ms or "
                      f"ISO-8601 with a zone, e.g. timestamp:2026-12-07T09:00:00Z>")


def kafka_jars() -> list[Path]:
    """The Flink Kafka SQL connector jar(s): from $QUIVER_FLINK_JARS (paths separated by os.pathsep) or
    PyFlink's own lib folder. Raises one clear QuiverError when there is none."""
    listed = [Path(p) for p in os.environ.get("QUIVER_FLINK_JARS", "").split(os.pathsep) if p.strip()]
    missing = [p for p in listed if not p.is_file()]
    if missing:
        raise QuiverError(f"QUIVER_FLINK_JARS names {', '.join(map(str, missing))}, which does not exist")
    spec = importlib.util.find_spec("pyflink")
    lib = Path(spec.origin).parent / "lib" if spec and spec.origin else None
    found = [p for p in listed if KAFKA_JAR in p.name]
    if not found and has_bundle(FLINK_KAFKA):  # what `make setup` fetched
        found = bundle_jars(FLINK_KAFKA)
    if lib is not None and lib.is_dir():
        found += sorted(lib.glob(f"{KAFKA_JAR}*.jar"))
    if not found:
        raise QuiverError(f"the stream reads Kafka, but the Flink Kafka connector jar ({KAFKA_JAR}-*.jar) is "
                          f"missing: {KAFKA_JAR_HELP}")
    return found


def parser_jars() -> list[Path]:
    """Quiver's own jar (infra/jvm/redis-sink): besides the Redis sink it carries `quiver_parse`, the function a
    Kafka job parses each record with (compile/flink_sources.py). One clear QuiverError when it is not built."""
    try:
        return bundle_jars(REDIS_SINK)
    except QuiverError as exc:
        raise QuiverError(f"the stream reads Kafka, and the Kafka job parses its records with quiver_parse from "
                          f"Quiver's JVM jar, which is missing: {exc}") from None


def kafka_job_jars() -> list[Path]:
    """Every jar a Kafka job runs with: the Flink Kafka connector and Quiver's jar (the record parser)."""
    return kafka_jars() + parser_jars()


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m quiver.streaming.runner", description=RUNNER_DOC)
    p.add_argument("--config", type=Path, default=None, help="quiver.yaml (default: ./quiver.yaml)")
    p.add_argument("--catalog", type=Path, default=None, help="catalog directory (default: from config)")
    p.add_argument("--state-dir", type=Path, default=None, help="default: <project>/.quiver/stream")
    p.add_argument("--checkpoint-dir", type=Path, default=None, help="default: <state-dir>/checkpoints")
    p.add_argument("--bounded", action="store_true", help="read the files present, then finish")
    p.add_argument("--parallelism", type=int, default=1)
    p.add_argument("--views", default=None, help="comma-separated views (default: every streamed view)")
    p.add_argument("--fresh", action="store_true", help="ignore checkpoints and replay the stream directory")
    # Freshness ≈ feeder pass + inbox listing + roll + checkpoint + loader poll: all sub-second (the report
    # in benchmarks/streaming.py measured p50 0.9-1.3 s with these on a loaded 2-core machine).
    p.add_argument("--checkpoint-interval-ms", type=int, default=1000, help="checkpoints commit the sink files")
    p.add_argument("--mini-batch-ms", type=int, default=0, help="mini-batch aggregation latency (0: off)")
    p.add_argument("--max-future-ms", type=int, default=None,
                   help="events dated later than arrival + this go to the batch route, not online (default: each "
                        "source's StreamBinding.max_future, 5 minutes unless set)")
    p.add_argument("--startup", default="earliest",
                   help="Kafka: where a job with no checkpoint to restore starts reading: earliest, latest, "
                        "group-offsets (the consumer group's committed offsets) or timestamp:<epoch ms or "
                        "ISO-8601 with a zone>; a restored job resumes from its checkpoint's offsets")
    p.add_argument("--stream-retention-s", type=float, default=None,
                   help="delete fed and committed stream files older than this (default: keep)")
    p.add_argument("--table-set", action="append", default=[], metavar="KEY=VALUE",
                   help="extra Flink table setting (part of the job's SQL; repeatable)")
    p.add_argument("--flink-set", action="append", default=[], metavar="KEY=VALUE",
                   help="extra Flink runtime setting, e.g. taskmanager.memory.managed.size=256m (repeatable)")
    p.add_argument("--monitor-interval-ms", type=int, default=100, help="how often the job lists its inbox")
    p.add_argument("--roll-interval-ms", type=int, default=100, help="how often sink files are closed for commit")
    p.add_argument("--state-backend", choices=("rocksdb", "hashmap"), default="rocksdb")
    p.add_argument("--sink", choices=("auto", "redis", "files"), default="auto",
                   help="redis: the job writes tiles and last values to Redis itself (the JVM sink); files: change "
                        "files that the runner loads; auto (default): redis when redis_url is redis:// and setup "
                        "built the sink")
    p.add_argument("--sink-flush-ms", type=int, default=200,
                   help="the JVM sink also writes what it holds this often, not only on each checkpoint: how long "
                        "a value can wait before it is readable online (0: only on checkpoints)")
    p.add_argument("--sink-in-flight", type=int, default=2,
                   help="the JVM sink writes to Redis on a thread of its own, up to this many flushes at once, "
                        "while the job goes on (each checkpoint still waits for them); 0: in the job's task thread")
    p.add_argument("--jobmanager", default=None, metavar="HOST:PORT",
                   help="submit to this Flink session cluster (REST endpoint); default: flink_jobmanager in "
                        "quiver.yaml, else the embedded mini-cluster")
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


def options_from_args(args: argparse.Namespace, config: Config) -> StreamOptions:
    """The options of a parsed command line; the session cluster defaults to the project's `flink_jobmanager`."""
    views = tuple(v.strip() for v in args.views.split(",") if v.strip()) if args.views else None
    return StreamOptions(bounded=args.bounded, parallelism=args.parallelism,
                         checkpoint_interval_ms=args.checkpoint_interval_ms,
                         monitor_interval_ms=args.monitor_interval_ms, roll_interval_ms=args.roll_interval_ms,
                         state_backend=args.state_backend, fresh=args.fresh, views=views,
                         mini_batch_ms=args.mini_batch_ms, max_future_ms=args.max_future_ms,
                         startup=startup_mode(args.startup),
                         stream_retention_s=args.stream_retention_s,
                         table_settings=settings_pairs(args.table_set), flink_settings=settings_pairs(args.flink_set),
                         jobmanager=args.jobmanager if args.jobmanager is not None else config.flink_jobmanager,
                         sink=args.sink, sink_flush_ms=args.sink_flush_ms,
                         sink_in_flight=args.sink_in_flight)
