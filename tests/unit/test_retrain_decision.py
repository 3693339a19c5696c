"""The retrain decision of the drift step (`pipelines/loop_harm.py`): expected harm retrains at once, a lasting
drift retrains, drift alone warns; and the loop's moments stay aware whatever Airflow hands over."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pendulum

from quiver.pipelines.loop_common import run_window, utc
from quiver.pipelines.loop_harm import retrain_decision

DRIFT = {"dataset_drift": True}
CALM = {"dataset_drift": False}


def champion(estimate: float, lower: float, upper: float, reference: float = 0.88) -> dict:
    return {"status": "estimated", "rows": 5_000, "reason": "",
            "roc_auc": {"estimate": estimate, "lower": lower, "upper": upper, "reference": reference,
                        "drop": reference - estimate}}


def decide(summary: dict | None, drift: dict, days: float) -> dict:
    return retrain_decision(summary, drift, days, auc_tolerance=0.01, persist_days=2)


def test_an_expected_drop_beyond_tolerance_with_its_whole_band_retrains_on_the_first_day() -> None:
    harm = decide(champion(0.80, 0.78, 0.82), DRIFT, 1)
    assert harm["retrain"] and harm["trigger"] == "expected_harm"
    assert harm["reason"] == ("expected harm: ROC-AUC estimated 0.800 [0.780, 0.820] without labels vs 0.880 on "
                              "its test window, a drop of at least 0.060 > 0.01")
    # Without drift too: the estimate is evidence of its own.
    assert decide(champion(0.80, 0.78, 0.82), CALM, 0)["trigger"] == "expected_harm"


def test_a_band_reaching_back_within_tolerance_is_no_harm_and_drift_alone_warns() -> None:
    unsure = decide(champion(0.86, 0.84, 0.875), DRIFT, 1)  # the drop is 0.005..0.04: not shown beyond 0.01
    assert not unsure["retrain"] and unsure["trigger"] is None
    assert unsure["reason"].startswith("drift without expected harm (day 1 of 2): ROC-AUC estimated 0.860")
    assert decide(champion(0.88, 0.86, 0.90), CALM, 0) == {
        "retrain": False, "trigger": None,
        "reason": "no drift; ROC-AUC estimated 0.880 [0.860, 0.900] without labels vs 0.880 on its test window"}


def test_a_drift_that_lasts_retrains_whatever_the_estimate_and_a_missing_estimate_says_why() -> None:
    lasting = decide(champion(0.88, 0.86, 0.90), DRIFT, 2)
    assert lasting["retrain"] and lasting["trigger"] == "persistent_drift"
    assert lasting["reason"].startswith("drift held 2 day(s) ≥ 2; ROC-AUC estimated 0.880")
    refused = {"status": "uncalibrated", "rows": 5_000, "reason": "ECE 0.04 beyond 0.005"}
    warned = decide(refused, DRIFT, 1)
    assert not warned["retrain"] and "no estimate (ECE 0.04 beyond 0.005)" in warned["reason"]
    assert decide(None, DRIFT, 3)["trigger"] == "persistent_drift"


def test_airflow_moments_stay_aware_in_utc() -> None:
    # pendulum's astimezone(UTC) hands back a DateTime with no tzinfo: comparing it with a stored window broke
    # the drift step ("can't compare offset-naive and offset-aware datetimes").
    moment = utc(pendulum.datetime(2026, 11, 10, 3, tz="Europe/Berlin"))
    assert moment == datetime(2026, 11, 10, 2, tzinfo=UTC) and moment.tzinfo is not None
    assert moment - timedelta(days=30) <= datetime(2026, 11, 9, tzinfo=UTC)
    begin, end = run_window(pendulum.datetime(2026, 11, 9, tz="UTC"), pendulum.datetime(2026, 11, 10, tz="UTC"))
    assert begin.tzinfo is not None and end.tzinfo is not None and end - begin == timedelta(days=1)
