"""Test catalog behind the golden SQL snapshots and the cross-engine backfill tests.

It covers every aggregation fn on float, int and bool inputs, `count`/`last` on a string, a view keyed by
two entities, and last-value views (one renaming a column, one with two keys).
"""

from quiver import Aggregation, Bool, Entity, FeatureView, Field, Float64, Int64, Source, String

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
