"""How far the streaming job has read its Kafka topics: the offsets it committed against the topics' ends.

The job's Kafka source commits each partition's offset to its consumer group (`KafkaSettings.group`)
when a checkpoint completes, that is once every record before it is in the job's state and its sinks
have flushed. So committed offsets are a durable "read and written up to here": a bounded run is done
when they reach the ends it saw at start, and `end - committed` is the lag the status reports.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from quiver.catalog.errors import QuiverError
from quiver.catalog.ir import Catalog
from quiver.config import KafkaSettings
from quiver.streaming.kafka_broker import TopicOffsets, check_cluster, forget_group


def _ask(topic: Topic, query: Callable[[], dict[int, int]]) -> dict[int, int]:
    from confluent_kafka import KafkaException

    try:
        return query()
    except KafkaException as exc:
        raise QuiverError(f"source {topic.source!r}: Kafka at {topic.bootstrap} (topic {topic.topic!r}) did not "
                          f"answer: {exc.args[0] if exc.args else exc}; set kafka_bootstrap in quiver.yaml") from None


@dataclass(frozen=True)
class Topic:
    source: str
    topic: str
    bootstrap: str
    group: str


class TopicProgress:
    """The topics of `sources`, the ends a bounded run must reach, and the job's committed offsets; one
    consumer per topic, opened on first use and kept until `close`."""

    def __init__(self, catalog: Catalog, sources: Sequence[str], kafka: KafkaSettings, project: str) -> None:
        self.topics: list[Topic] = []
        for source in sources:
            stream = catalog.sources[source].stream
            assert stream is not None and stream.kafka_topic
            self.topics.append(Topic(source, stream.kafka_topic, stream.brokers(kafka.bootstrap),
                                     kafka.group(project, source)))
        self.kafka = kafka  # the client properties (security) every client below uses
        self.goal: dict[str, dict[int, int]] = {}
        self._offsets: dict[str, TopicOffsets] = {}

    def _of(self, topic: Topic) -> TopicOffsets:
        if topic.source not in self._offsets:
            self._offsets[topic.source] = TopicOffsets(topic.bootstrap, topic.topic, topic.group, self.kafka)
        return self._offsets[topic.source]

    def mark_ends(self) -> dict[str, int]:
        """Remember every partition's end now (what a bounded run reads); returns records per source."""
        self.goal = {t.source: _ask(t, self._of(t).ends) for t in self.topics}
        return {source: sum(ends.values()) for source, ends in self.goal.items()}

    def forget_commits(self) -> None:
        """A fresh job (empty state, reading from the earliest offsets) must not inherit an earlier job's
        committed offsets: a bounded run would count itself caught up before it read a record."""
        for t in self.topics:
            forget_group(t.bootstrap, t.group, self.kafka)

    def check(self, timeout_s: float = 10.0) -> None:
        """Each cluster answers with the project's settings: else a QuiverError with one line (authentication,
        TLS, nobody there), before any client retries for ever."""
        for bootstrap in sorted({t.bootstrap for t in self.topics}):
            check_cluster(bootstrap, self.kafka, timeout_s)

    def committed(self) -> dict[str, dict[int, int]]:
        # A partition the group never committed reads as a negative sentinel: nothing read yet.
        return {t.source: {p: max(o, 0) for p, o in self._of(t).committed().items()} for t in self.topics}

    def caught_up(self) -> bool:
        """True once the job has committed every partition up to the ends `mark_ends` saw."""
        done = self.committed()
        return all(done[s].get(p, 0) >= end for s, ends in self.goal.items() for p, end in ends.items())

    def snapshot(self) -> dict[str, dict[str, object]]:
        """Per source: topic, records at the ends now, records committed, and the lag between them."""
        done = self.committed()
        out: dict[str, dict[str, object]] = {}
        for t in self.topics:
            ends = self._of(t).ends()
            read = sum(min(done[t.source].get(p, 0), end) for p, end in ends.items())
            out[t.source] = {"topic": t.topic, "end": sum(ends.values()), "committed": read,
                             "lag": sum(ends.values()) - read}
        return out

    def close(self) -> None:
        for offsets in self._offsets.values():
            offsets.close()
        self._offsets.clear()
