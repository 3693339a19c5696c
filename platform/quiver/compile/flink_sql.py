"""Shared pieces of the Flink SQL target (`quiver.compile.flink`): reserved names and types, where the job
reads and writes (`FlinkTarget`), and the text helpers every statement is built with."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from quiver.catalog.errors import QuiverError
from quiver.config import KafkaSettings

TIME_FIELD: Final = "ts_us"  # the stream's event time: epoch microseconds
LEGACY_TIME_FIELD: Final = "ts_ms"  # older producers: epoch milliseconds
BATCH_FIELD: Final = "__batch"  # the feeder's end-of-batch marker rows
NEWEST: Final = "__newest_us"  # newest event time of a tile (freshness)
TYPES: Final[Mapping[str, str]] = {"int64": "BIGINT", "float64": "DOUBLE", "string": "STRING",
                                   "bool": "BOOLEAN", "timestamp": "BIGINT"}  # timestamps: epoch µs
SINK_KINDS: Final = ("tiles", "last", "late", "quarantine")
PROBLEM: Final = "__problem"
ROWTIME: Final = "__rowtime"
TS_US: Final = "__ts_us"
LINE: Final = "line"


@dataclass(frozen=True)
class FlinkTarget:
    """Where the compiled job reads and writes, and how it aggregates.

    `inbox`: source → directory of the feeder's JSON-lines batches (local mode). `sink_root`: directory
    of the sinks (`<kind>/<view or source>/`). `kafka`: read each source's Kafka topic instead
    (production; rendered and golden-tested, not run here). `mini_batch_ms`: mini-batch aggregation
    latency (0 = off; local mode only, Kafka mode needs it off for CURRENT_WATERMARK). `kafka_bootstrap`:
    the brokers (they belong to the deployment, so the config's wins over the catalog's binding);
    `kafka_idle_ms`: how long a partition may stay silent before the watermark moves on without it
    (otherwise one idle partition stalls the late split for good). `view_sinks`: view → the WITH options
    of its tiles or last-value sink, replacing the change files (the JVM Redis sink: online/jvm_sink.py). Idleness is wall-clock time: a
    partition whose records are merely not fetched yet (the job starting, a broker restarting) counts
    as silent too, and once it is skipped the others move the watermark past its records, which then
    arrive late. 10 s made half of a replayed backlog late on a loaded 2-core machine; a minute covers
    a start and a broker restart (docs/streaming.md, Kafka). `extra_settings`:
    further Flink table settings (benchmarks measure candidates with them). The file source never ends
    by itself: a bounded source whose subtasks finish at different times stops the file sink's
    checkpoints, so bounded runs tail too and stop once every batch is committed (runner.py).
    """

    inbox: Mapping[str, str]
    sink_root: str
    monitor_interval_ms: int = 200
    roll_interval_ms: int = 500
    max_future_ms: int | None = None  # None: each source's StreamBinding.max_future
    kafka: bool = False
    kafka_bootstrap: str = ""  # overrides every binding's kafka_bootstrap_servers (config `kafka_bootstrap`)
    kafka_idle_ms: int = 60_000  # a partition silent this long stops holding the watermark back
    kafka_properties: tuple[tuple[str, str], ...] = ()  # Kafka client properties (security, …) of every source
    kafka_groups: Mapping[str, str] = field(default_factory=dict)  # source → its consumer group
    kafka_startup: str = "earliest"  # earliest, latest, group-offsets or timestamp:<epoch ms>
    mini_batch_ms: int = 0
    mini_batch_size: int = 20_000
    extra_settings: tuple[tuple[str, str], ...] = ()
    view_sinks: Mapping[str, Mapping[str, str]] = field(default_factory=dict)


def quote(name: str) -> str:
    """`name` as a Flink identifier (the validator refuses unsafe names; quote anyway)."""
    return "`" + name.replace("`", "``") + "`"


def literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def sink_path(root: str, kind: str, name: str) -> str:
    """Directory of one sink: `<root>/<kind>/<view or source>`."""
    if kind not in SINK_KINDS:
        raise ValueError(f"unknown sink kind {kind!r}")
    return f"{root.rstrip('/')}/{kind}/{name}"


def sink_table(kind: str, name: str) -> str:
    return f"{kind}__{name}"


def kafka_group(target: FlinkTarget, source: str) -> str:
    """The consumer group whose committed offsets record how far the job has read `source`'s topic: the
    target's (config `KafkaSettings.group`: `quiver.<project>.<source>`), never shared by another project."""
    return target.kafka_groups.get(source) or KafkaSettings().group("default", source)


def view_sink(target: FlinkTarget, kind: str, view: str) -> list[tuple[str, str]]:
    """A view's tiles or last values: straight to Redis when the target says how, else change files."""
    if view in target.view_sinks:
        return list(target.view_sinks[view].items())
    return file_sink(target, kind, view, "debezium-json")


def file_sink(target: FlinkTarget, kind: str, name: str, fmt: str) -> list[tuple[str, str]]:
    roll = f"{target.roll_interval_ms} ms"
    # Row formats roll on time, not on checkpoints: a short roll interval + check interval keeps the
    # path to Redis at about one checkpoint interval. Part files become visible (renamed) on checkpoint.
    return [("connector", "filesystem"), ("path", sink_path(target.sink_root, kind, name)), ("format", fmt),
            ("sink.rolling-policy.rollover-interval", roll), ("sink.rolling-policy.inactivity-interval", roll),
            ("sink.rolling-policy.check-interval", f"{max(target.roll_interval_ms // 4, 10)} ms")]


def create_table(name: str, lines: list[str], options: list[tuple[str, str]]) -> str:
    body = ",\n".join(f"  {line}" for line in lines)
    opts = ",\n".join(f"  {literal(k)} = {literal(v)}" for k, v in options)
    return f"CREATE TABLE {quote(name)} (\n{body}\n) WITH (\n{opts}\n)"


def interval(us: int) -> str:
    """A day-to-second interval literal of `us` microseconds (millisecond precision)."""
    ms = us // 1000
    days, rest = divmod(ms, 86_400_000)
    if days > 99:
        raise QuiverError(f"interval of {days} days is too long for a Flink interval literal (≤ 99 days)")
    hours, rest = divmod(rest, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    seconds, millis = divmod(rest, 1000)
    return f"INTERVAL '{days} {hours:02d}:{minutes:02d}:{seconds:02d}.{millis:03d}' DAY TO SECOND(3)"


def select_list(cols: list[tuple[str, str]]) -> str:
    lines = [expr if expr == alias else f"{expr} AS {alias}" for expr, alias in cols]
    return "SELECT\n" + ",\n".join(f"  {line}" for line in lines)


def indent(text: str, levels: int = 1) -> str:
    pad = "  " * levels
    return "\n".join(f"{pad}{line}" if line else line for line in text.splitlines())
