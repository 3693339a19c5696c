"""A fresh Kafka job starts its progress from nothing: the consumer group an earlier job committed to is
forgotten, so a bounded run cannot count itself caught up before it read a record (real broker)."""

from __future__ import annotations

import uuid

from quiver import Aggregation, Entity, FeatureView, Source, StreamBinding
from quiver.catalog.validate import build_catalog
from quiver.config import KafkaSettings
from quiver.streaming.kafka_broker import KafkaBroker, committed_offsets, create_topic, produce
from quiver.streaming.topics import TopicProgress

COLUMNS = {"user_id": "int64", "amount": "float64", "ts": "timestamp"}


def commit_to_end(bootstrap: str, topic: str, group: str, partitions: int) -> None:
    """What an earlier job leaves: the group's offsets committed at the topic's end."""
    from confluent_kafka import Consumer, TopicPartition

    from quiver.streaming.kafka_broker import _retrying, admin_config, end_offsets

    ends = end_offsets(bootstrap, topic)
    consumer = Consumer({**admin_config(bootstrap), "group.id": group, "enable.auto.commit": False})
    try:
        # The first group a fresh broker sees waits for its offsets topic: "Not coordinator" until then (a
        # loaded machine showed it), which librdkafka does not retry on a synchronous commit.
        _retrying(lambda: consumer.commit(offsets=[TopicPartition(topic, p, ends[p]) for p in range(partitions)],
                                          asynchronous=False))
    finally:
        consumer.close()


def test_a_fresh_job_forgets_the_offsets_an_earlier_job_committed(kafka_broker: KafkaBroker) -> None:
    topic = f"fresh-{uuid.uuid4().hex[:8]}"
    user = Entity("user", ["user_id"])
    source = Source("tx", "unused", timestamp_field="ts", stream=StreamBinding(kafka_topic=topic))
    spend = FeatureView("spend", [user], source, aggregations=[Aggregation("amount", "sum", "1h")])
    catalog = build_catalog([user, source, spend], schema_reader=lambda s: dict(COLUMNS))
    bootstrap = kafka_broker.bootstrap
    kafka = KafkaSettings(bootstrap)
    group = kafka.group("fresh", "tx")
    assert group == "quiver.fresh.tx"  # scoped by project: another project's source "tx" has its own
    create_topic(bootstrap, topic, 3)
    produce(bootstrap, topic, [(str(i).encode(), b'{"ts_us": 1, "user_id": %d}' % i) for i in range(30)])
    commit_to_end(bootstrap, topic, group, 3)

    progress = TopicProgress(catalog, ["tx"], kafka, "fresh")
    try:
        progress.mark_ends()
        assert progress.caught_up()  # what a fresh job saw before: done before it started
        progress.forget_commits()
        assert sum(committed_offsets(bootstrap, group, topic).values()) < 0  # none committed (-1 each)
        assert not progress.caught_up()
        assert progress.snapshot()["tx"] == {"topic": topic, "end": 30, "committed": 0, "lag": 30}
        progress.forget_commits()  # a group that no longer exists is fine
    finally:
        progress.close()
