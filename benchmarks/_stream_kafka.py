"""The Kafka route of benchmarks/streaming.py: a local broker, the backlog as keyed records, the catalog bound
to the topic, and the worker's bounded scan.

The broker is the one the tests use (`quiver.streaming.kafka_broker`, KRaft, from `make setup`'s jars). The
records are the stream files' events (strict JSON, keyed by user), so both routes get the same events. The
Kafka project is the example catalog (its binding names the topic) with the broker configured and a project
name of its own, so its Redis values sit beside the file route's and can be compared key for key.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

TOPIC = "transactions"
PARTITIONS = 4
CONFIG = "quiver-kafka.yaml"
PROJECT = "kafka"


def available() -> str | None:
    """Why the Kafka route cannot run here (None: it can)."""
    from quiver.catalog.errors import QuiverError
    from quiver.jars import KAFKA_BROKER, has_bundle
    from quiver.streaming.options import kafka_job_jars

    if not has_bundle(KAFKA_BROKER):
        return "the Kafka broker jars are missing (make setup)"
    try:
        kafka_job_jars()
    except QuiverError as exc:
        return str(exc)
    return None


def start_broker(folder: Path) -> Any:
    from quiver.streaming.kafka_broker import KafkaBroker, create_topic

    broker = KafkaBroker(folder, partitions=PARTITIONS)
    broker.start()
    create_topic(broker.bootstrap, TOPIC, PARTITIONS)
    return broker


def _keyed(lines: list[bytes]) -> Iterator[tuple[bytes | None, bytes]]:
    import json

    for line in lines:
        user = json.loads(line).get("user_id")
        yield (None if user is None else str(user).encode()), line


def load_topic(bootstrap: str, tx: Any) -> int:
    """The backlog `tx` (the stream files' events) as records keyed by user; returns how many."""
    from quiver.pipelines.stream_producer import to_ndjson
    from quiver.streaming.kafka_broker import produce

    lines = to_ndjson(tx, "event_ts", strict=True).splitlines()
    return produce(bootstrap, TOPIC, _keyed(lines), settings={"linger.ms": 50, "batch.size": 1 << 20})


def send(bootstrap: str) -> Any:
    """A callable that writes one table of live events to the topic and returns once they are acknowledged
    (one idempotent producer for every call: a new one per call would cost more than the sending)."""
    from confluent_kafka import Producer

    from quiver.pipelines.stream_producer import to_ndjson
    from quiver.streaming.kafka_broker import admin_config

    producer = Producer({**admin_config(bootstrap), "enable.idempotence": True, "linger.ms": 0})

    def write(table: Any) -> None:
        for key, value in _keyed(to_ndjson(table, "event_ts", strict=True).splitlines()):
            producer.produce(TOPIC, value=value, key=key)
        if producer.flush(30):
            raise RuntimeError("live records to the topic were not acknowledged within 30 s")

    return write


def make_config(root: Path, bootstrap: str) -> str:
    """The project's quiver.yaml under its own project name, with the broker: the catalog's binding names
    the topic, and a topic with known brokers is what a stream job reads. Returns the config's name."""
    if f'kafka_topic="{TOPIC}"' not in (root / "feature_defs" / "sources.py").read_text():
        sys.exit(f"streaming: feature_defs/sources.py no longer binds transactions to the topic {TOPIC!r}")
    base = (root / "quiver.yaml").read_text()
    (root / CONFIG).write_text(base.replace("project: bench", f"project: {PROJECT}") + f"kafka_bootstrap: {bootstrap}\n")
    return CONFIG


def bounded_scan(statement: str) -> str:
    """The Kafka source read up to the offsets it finds at start, then finished (the blackhole worker's job
    must end by itself, as the file source's bounded scan does)."""
    if "'connector' = 'kafka'" not in statement:
        return statement
    return statement.replace("'connector' = 'kafka',", "'connector' = 'kafka',\n  'scan.bounded.mode' = 'latest-offset',")
