"""Feature sets served together to a model."""

from merchant_features import merchant_profile, merchant_traffic
from request_features import transaction_context
from user_features import user_last_transaction, user_profile, user_spend

from quiver import FeatureService

fraud_model = FeatureService(
    name="fraud_model",
    features=[user_spend, user_last_transaction, user_profile, merchant_profile, merchant_traffic,
              transaction_context],
    description="Inputs of the transaction fraud classifier: the user's and merchant's history and the "
                "transaction itself.",
)
