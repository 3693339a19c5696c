"""Features of merchants: risk score and traffic."""

from entities import merchant
from sources import merchant_risk, transactions

from quiver import Aggregation, FeatureView, Field, Float64, String

merchant_profile = FeatureView(
    name="merchant_profile",
    entities=[merchant],
    source=merchant_risk,
    schema=[Field("risk_score", Float64), Field("merchant_category", String)],
    ttl="3d",
    owner="risk-team@example.com",
)

merchant_traffic = FeatureView(
    name="merchant_traffic",
    entities=[merchant],
    source=transactions,
    aggregations=[
        Aggregation("amount", "count", "1h", name="merchant_tx_count_1h"),
        Aggregation("amount", "count", "24h", name="merchant_tx_count_24h"),
        Aggregation("amount", "mean", "24h", name="merchant_amount_mean_24h"),
    ],
    owner="risk-team@example.com",
)
