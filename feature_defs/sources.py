"""Event tables the features are computed from (paths are relative to the project root)."""

from quiver import Source, StreamBinding

transactions = Source(
    name="transactions",
    path="data/events/transactions",
    timestamp_field="event_ts",
    stream=StreamBinding(path="data/stream/transactions", watermark_delay="5s", allowed_lateness="10m"),
    description="Card transactions, one row per authorization.",
)
user_profiles = Source(name="user_profiles", path="data/events/user_profiles", timestamp_field="event_ts")
merchant_risk = Source(name="merchant_risk", path="data/events/merchant_risk", timestamp_field="event_ts")
