"""Test catalog behind the Flink golden snapshots and the streaming integration tests.

The golden catalog's views (every fn on float, int and bool inputs, `count`/`last` on a string, two keys,
last-value views) on a source with a local stream binding, plus a Kafka-bound source with a contract for the production DDL.
"""

from datetime import UTC, datetime

from quiver import (
                Aggregation,
                Bool,
                Check,
                Contract,
                Entity,
                FeatureView,
                Field,
                Float64,
                Int64,
                Source,
                StreamBinding,
                String,
)

FNS = ("count", "sum", "mean", "min", "max", "last", "stddev")

user = Entity(name="user", join_keys=["user_id"], description="A card holder.")
merchant = Entity(name="merchant", join_keys=["merchant_id"])
events = Source(name="events", path="events", timestamp_field="ts",
                stream=StreamBinding(path="stream/events", watermark_delay="2s", allowed_lateness="10m"))
clicks = Source(name="clicks", path="clicks", timestamp_field="ts",
                stream=StreamBinding(kafka_topic="clicks", kafka_bootstrap_servers="kafka:9092",
                                     watermark_delay="500ms", allowed_lateness="1h"),
                contract=Contract({"qty": Check(min=1, max=5), "amount": Check(finite=True, min=0.0),
                                   "cat": Check(one_of=["a", "b"]),
                                   "ts": Check(min=datetime(2026, 11, 1, tzinfo=UTC))}))

user_activity = FeatureView(
    name="user_activity",
    entities=[user],
    source=events,
    tile="5m",
    aggregations=[
        *[Aggregation("amount", fn, "1h") for fn in FNS],
        Aggregation("amount", "sum", "2h"),
        *[Aggregation("qty", fn, "2h") for fn in FNS],
        *[Aggregation("flag", fn, "1h") for fn in FNS],
        Aggregation("cat", "count", "1h"),
        Aggregation("cat", "last", "2h"),
    ],
)

user_merchant = FeatureView(
    name="user_merchant",
    entities=[user, merchant],
    source=events,
    tile="10m",
    aggregations=[
        Aggregation("amount", "count", "30m"),
        Aggregation("amount", "sum", "30m"),
        Aggregation("amount", "last", "1h"),
        Aggregation("qty", "max", "1h"),
    ],
)

user_last = FeatureView(
    name="user_last",
    entities=[user],
    source=events,
    schema=[
        Field("amount", Float64),
        Field("qty", Int64),
        Field("flag", Bool),
        Field("cat", String),
        Field("last_merchant", Int64, column="merchant_id"),
    ],
    ttl="1d",
)

pair_last = FeatureView(
    name="pair_last",
    entities=[user, merchant],
    source=events,
    schema=[Field("amount", Float64), Field("cat", String)],
    ttl="1d",
)

user_clicks = FeatureView(
    name="user_clicks",
    entities=[user],
    source=clicks,
    aggregations=[Aggregation("qty", "sum", "1h"), Aggregation("qty", "count", "1d")],
)

offline_only = FeatureView(
    name="offline_only",
    entities=[user],
    source=events,
    aggregations=[Aggregation("amount", "sum", "1d")],
    online=False,
)
