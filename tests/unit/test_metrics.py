"""Prometheus metrics: the objects other components import, and what drift checks publish."""

from __future__ import annotations

import numpy as np
import pandas as pd
from prometheus_client import REGISTRY

from quiver import metrics
from quiver.monitoring.drift import compute_drift


def value(metric: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(metric, labels)


def test_freshness_gauge() -> None:
    age = metrics.set_freshness("user_spend", 1_000.0, now=1_090.5)
    assert age == 90.5
    assert value("quiver_feature_freshness_seconds", view="user_spend") == 90.5
    assert value("quiver_feature_last_event_timestamp_seconds", view="user_spend") == 1_000.0


def test_counters_increment() -> None:
    before = value("quiver_late_events_total", source="transactions") or 0.0
    metrics.LATE_EVENTS.labels(source="transactions").inc(3)
    assert value("quiver_late_events_total", source="transactions") == before + 3


def test_drift_scores_published() -> None:
    rng = np.random.default_rng(0)
    ref = pd.DataFrame({"x": rng.normal(0, 1, 3_000)})
    cur = pd.DataFrame({"x": rng.normal(1, 1, 3_000)})
    report = compute_drift(ref, cur)
    metrics.observe_drift("metrics_test", report)
    psi = report.feature("x").scores["psi"]
    assert value("quiver_drift_score", name="metrics_test", feature="x", method="psi") == psi
    assert value("quiver_drift_detected", name="metrics_test", feature="x") == 1.0
    assert value("quiver_drift_share", name="metrics_test") == 1.0
    text = metrics.render().decode()
    assert 'quiver_drift_score{feature="x",method="ks_statistic",name="metrics_test"}' in text
