"""The local broker's KRaft cluster id: one in 64 random ids started with "-", and the storage tool then took
it for an option and refused to format (a broker fixture failed at random, six tests with it)."""

from __future__ import annotations

import base64

from quiver.streaming.kafka_broker import new_cluster_id


def test_cluster_ids_are_16_random_bytes_and_never_look_like_an_option() -> None:
    ids = [new_cluster_id() for _ in range(3000)]  # 3000 draws: ~47 would start with "-" before
    assert not [i for i in ids if i.startswith("-")]
    assert all(len(base64.urlsafe_b64decode(i + "==")) == 16 for i in ids)
    assert len(set(ids)) == len(ids)
    assert any("-" in i for i in ids)  # still the URL-safe alphabet Kafka uses, dashes inside allowed
