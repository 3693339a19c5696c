"""Features of card holders: spending windows, the last transaction, and the profile."""

from entities import user
from sources import transactions, user_profiles

from quiver import Aggregation, FeatureView, Field, Float64, Int64, String

user_spend = FeatureView(
    name="user_spend",
    entities=[user],
    source=transactions,
    aggregations=[
        Aggregation("amount", "count", "1h"),
        Aggregation("amount", "sum", "1h"),
        Aggregation("amount", "count", "24h"),
        Aggregation("amount", "mean", "24h"),
        Aggregation("amount", "max", "24h"),
        Aggregation("amount", "stddev", "7d"),
        Aggregation("amount", "mean", "7d"),
        Aggregation("is_online", "mean", "24h", name="online_share_24h"),
    ],
    owner="fraud-team@example.com",
    tags={"domain": "fraud"},
    description="Spending velocity of a card holder over sliding windows.",
)

user_last_transaction = FeatureView(
    name="user_last_transaction",
    entities=[user],
    source=transactions,
    schema=[
        Field("last_amount", Float64, column="amount", description="Amount of the previous transaction."),
        Field("last_merchant_id", Int64, column="merchant_id", description="Merchant of the previous one."),
        Field("last_category", String, column="category"),
    ],
    ttl="7d",
    owner="fraud-team@example.com",
)

user_profile = FeatureView(
    name="user_profile",
    entities=[user],
    source=user_profiles,
    schema=[Field("account_age_days", Int64), Field("credit_limit", Float64), Field("country", String)],
    ttl="30d",
    owner="accounts-team@example.com",
)
