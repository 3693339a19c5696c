"""Feature sets served together to a model."""

from merchant_features import merchant_profile, merchant_traffic
from user_features import user_last_transaction, user_profile, user_spend

from quiver import FeatureService

fraud_model = FeatureService(
    name="fraud_model",
    features=[user_spend, user_last_transaction, user_profile, merchant_profile, merchant_traffic],
    description="Inputs of the transaction fraud classifier.",
)
