"""Request-time features: facts of the transaction being scored, which no stored feature can know yet.

The request source declares what `/predict` receives in `fields`; offline, the label rows carry the same
columns. The on-demand view turns them, with the user's usual spend, into model inputs; its function runs
alike in training sets and at serving time.
"""

import math

from quiver import Bool, Check, Contract, Field, Float64, Int64, OnDemandFeatureView, RequestSource

transaction = RequestSource(
    name="transaction",
    schema=[Field("amount", Float64, description="Amount of the transaction being scored."),
            Field("is_online", Bool, description="Card-not-present transaction.")],
    contract=Contract({"amount": Check(finite=True, min=0.0)}),  # the rules the stored transactions follow
    description="The transaction a fraud score is asked for.",
)


def transaction_context_features(columns: dict[str, list]) -> dict[str, list]:
    """Amount against the user's usual spend, the channel and the UTC hour of the request.

    Python mode: one list per column (None where a value is missing), a list per output. A fraud score is
    asked for one transaction at a time, and a one-row DataFrame would cost more than the model does."""
    out: dict[str, list] = {"tx_amount": [], "log_amount_vs_usual": [], "tx_is_online": [], "hour_of_day": [],
                            "is_night": []}
    for amount, usual, online, at in zip(columns["amount"], columns["amount_mean_7d"], columns["is_online"],
                                         columns["request_ts"], strict=True):
        out["tx_amount"].append(amount)
        known = amount is not None and usual is not None and amount > 0 and usual > 0
        out["log_amount_vs_usual"].append(math.log(amount) - math.log(usual) if known else None)
        out["tx_is_online"].append(online)
        out["hour_of_day"].append(at.hour)
        out["is_night"].append(at.hour < 6)
    return out


transaction_context = OnDemandFeatureView(
    name="transaction_context",
    request_sources=[transaction],
    inputs=["user_spend:amount_mean_7d"],
    schema=[Field("tx_amount", Float64), Field("log_amount_vs_usual", Float64), Field("tx_is_online", Bool),
            Field("hour_of_day", Int64), Field("is_night", Bool)],
    udf=transaction_context_features,
    mode="python",
    owner="fraud-team@example.com",
    description="The transaction in the light of the user's history.",
)
