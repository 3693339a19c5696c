"""Event tables the features are computed from (paths are relative to the project root).

A contract says what a valid row is. Every path that reads the source — the backfill, the stream, and
`/predict` for the request's own fields — refuses a row that fails it, quarantines and counts it, so a
malformed row never reaches a feature.
"""

from quiver import Check, Contract, Source, StreamBinding

CATEGORIES = ["grocery", "restaurants", "fuel", "fashion", "electronics", "travel", "digital_goods", "gambling"]

transaction_checks = Contract(
    {
        "user_id": Check(not_null=True),
        "merchant_id": Check(not_null=True),
        "amount": Check(not_null=True, finite=True, min=0.0),
        "category": Check(one_of=CATEGORIES),
        "event_ts": Check(max_future="5m"),
    },
    max_invalid_share=0.01,  # the daily quality gate fails a batch with more than 1 % of its rows refused
)

transactions = Source(
    name="transactions",
    path="data/events/transactions",
    timestamp_field="event_ts",
    # Stream files at `path`, or the topic when brokers are known (QUIVER_KAFKA_BOOTSTRAP; the demo's step 8).
    stream=StreamBinding(path="data/stream/transactions", kafka_topic="transactions", watermark_delay="5s",
                         allowed_lateness="10m"),
    contract=transaction_checks,
    description="Card transactions, one row per authorization.",
)
user_profiles = Source(name="user_profiles", path="data/events/user_profiles", timestamp_field="event_ts")
merchant_risk = Source(name="merchant_risk", path="data/events/merchant_risk", timestamp_field="event_ts")
