"""Test catalog behind the golden SQL snapshots and the cross-engine backfill tests.

It covers every aggregation fn on float, int and bool inputs, `count`/`last` on a string, a view keyed by
two entities, last-value views (one renaming a column, one with two keys), and views of a second source over
the same files with a contract using every rule.
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
    String,
)

FNS = ("count", "sum", "mean", "min", "max", "last", "stddev")

user = Entity(name="user", join_keys=["user_id"], description="A card holder.")
merchant = Entity(name="merchant", join_keys=["merchant_id"])
events = Source(name="events", path="events", timestamp_field="ts")

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

checked_events = Source(
    name="checked_events",
    path="events",
    timestamp_field="ts",
    contract=Contract({
        "user_id": Check(not_null=True),
        "amount": Check(finite=True, min=1.0, max=150.0),
        "qty": Check(min=-3, max=5),
        "cat": Check(one_of=["a", "b", "c"]),
        "ts": Check(min=datetime(2024, 2, 29, 6, tzinfo=UTC), max_future="1h"),
    }, max_invalid_share=0.5),
)

checked_activity = FeatureView(
    name="checked_activity",
    entities=[user],
    source=checked_events,
    tile="5m",
    aggregations=[Aggregation("amount", fn, "1h") for fn in FNS] + [Aggregation("qty", "sum", "2h")],
)

checked_last = FeatureView(
    name="checked_last",
    entities=[merchant],
    source=checked_events,
    schema=[Field("amount", Float64), Field("flag", Bool)],
    ttl="1d",
)
