"""Request-time features: facts of the transaction being scored, which no stored feature can know yet.

The request source declares what `/predict` receives in `fields`; offline, the label rows carry the same
columns. The on-demand view turns them, with the user's usual spend, into model inputs; its function runs
alike in training sets and at serving time.
"""

import numpy as np
import pandas as pd
from user_features import user_spend

from quiver import Bool, Check, Contract, Field, Float64, Int64, OnDemandFeatureView, RequestSource

transaction = RequestSource(
    name="transaction",
    schema=[Field("amount", Float64, description="Amount of the transaction being scored."),
            Field("is_online", Bool, description="Card-not-present transaction.")],
    contract=Contract({"amount": Check(finite=True, min=0.0)}),  # the rules the stored transactions follow
    description="The transaction a fraud score is asked for.",
)


def transaction_context_features(frame: pd.DataFrame) -> pd.DataFrame:
    """Amount against the user's usual spend, the channel and the local hour of the request."""
    out = pd.DataFrame(index=frame.index)
    out["tx_amount"] = frame["amount"]
    usual = frame["amount_mean_7d"].where(frame["amount_mean_7d"] > 0)
    out["log_amount_vs_usual"] = np.log(frame["amount"].where(frame["amount"] > 0)) - np.log(usual)
    out["tx_is_online"] = frame["is_online"]
    hour = frame["request_ts"].dt.hour
    out["hour_of_day"] = hour
    out["is_night"] = hour < 6
    return out


transaction_context = OnDemandFeatureView(
    name="transaction_context",
    request_sources=[transaction],
    inputs=["user_spend:amount_mean_7d"],
    schema=[Field("tx_amount", Float64), Field("log_amount_vs_usual", Float64), Field("tx_is_online", Bool),
            Field("hour_of_day", Int64), Field("is_night", Bool)],
    udf=transaction_context_features,
    owner="fraud-team@example.com",
    description="The transaction in the light of the user's history.",
)
