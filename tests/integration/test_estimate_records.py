"""Label-free performance estimates in the registry (issue 54): stored per metric the day a window is served,
idempotent on rerun, the realized value recorded beside them when labels arrive, and the series read back with
each estimate's error and whether the realized value fell inside the band — on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
import sqlalchemy as sa

from quiver.catalog.errors import QuiverError
from quiver.monitoring import estimate_records as records
from quiver.monitoring import performance_estimation as pe
from quiver.registry import Registry
from quiver.registry.estimate_tables import performance_estimates

pytestmark = pytest.mark.integration

MODEL = "fraud_model"
DAY = datetime(2026, 11, 14, tzinfo=UTC)  # data time (simulated); the wall clock is today


def _traffic(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    scores = 1 / (1 + np.exp(-(1.5 * rng.normal(0, 1, rows) - 2.5)))
    return scores, (rng.random(rows) < scores).astype(np.float64)


@pytest.fixture
def registry(registry_url: str) -> Registry:
    return Registry(registry_url, project="p")  # migrates to head (0009 creates the table)


@pytest.fixture(scope="module")
def held_out() -> pe.CalibrationCheck:
    scores, labels = _traffic(6_000, seed=1)
    return pe.check_calibration(scores, labels, threshold=0.4, source="test window of fraud_model:2")


def test_estimates_then_realized_values_make_a_series_with_errors(registry: Registry,
                                                                 held_out: pe.CalibrationCheck) -> None:
    for day in range(3):
        scores, _ = _traffic(3_000, seed=10 + day)
        estimate = pe.estimate_performance(scores, held_out, seed=day)
        start = DAY + timedelta(days=day)
        assert records.record_estimate(registry, MODEL, f"{MODEL}:2", "champion", start, start + timedelta(days=1),
                                       estimate) == len(pe.METRICS)
    # labels of the first two days arrive (the same rows the estimates were made on)
    for day in range(2):
        scores, labels = _traffic(3_000, seed=10 + day)
        start = DAY + timedelta(days=day)
        realized = records.record_realized(registry, MODEL, f"{MODEL}:2", "champion", start,
                                           start + timedelta(days=1), scores, labels)
        assert realized == pe.realized_metrics(scores, labels, threshold=0.4)  # the estimate's threshold

    series = records.estimates_of(registry, MODEL, version=2, arm="champion")
    assert len(series) == 3 * len(pe.METRICS)
    assert [r["window_end"] for r in series[:: len(pe.METRICS)]] == [DAY + timedelta(days=d + 1) for d in range(3)]
    first = series[0]
    assert first["metric"] == "roc_auc" and first["as_of"] == DAY + timedelta(days=1)
    assert first["status"] == "realized" and first["realized_rows"] == 3_000 and first["rows"] == 3_000
    assert first["error"] == pytest.approx(first["estimate"] - first["realized"])
    assert first["reference"] == pytest.approx(held_out.reference["roc_auc"])
    assert first["detail"]["threshold"] == 0.4 and first["detail"]["calibration"]["calibrated"] is True
    last_day = [r for r in series if r["window_end"] == DAY + timedelta(days=3)]
    assert {r["status"] for r in last_day} == {"estimated"}
    assert all(r["realized"] is None and r["error"] is None and r["within_band"] is None for r in last_day)

    errors = records.estimate_errors(series)
    assert set(errors) == set(pe.METRICS) and errors["roc_auc"]["windows"] == 2
    assert errors["roc_auc"]["mean_abs_error"] < 0.05
    assert records.estimates_of(registry, MODEL, metric="brier", version=f"{MODEL}:2")[0]["metric"] == "brier"
    assert records.estimates_of(registry, MODEL, arm="shadow") == []


def test_rerunning_a_day_replaces_its_numbers_and_keeps_arrived_labels(registry: Registry,
                                                                      held_out: pe.CalibrationCheck) -> None:
    scores, labels = _traffic(2_000, seed=20)
    end = DAY + timedelta(days=1)
    records.record_estimate(registry, MODEL, f"{MODEL}:2", "shadow", DAY, end,
                            pe.estimate_performance(scores, held_out, seed=0))
    records.record_realized(registry, MODEL, f"{MODEL}:2", "shadow", DAY, end, scores, labels)
    rerun = pe.estimate_performance(scores, held_out, seed=1)  # another seed: other band edges
    records.record_estimate(registry, MODEL, f"{MODEL}:2", "shadow", DAY, end, rerun)
    with registry.engine.connect() as connection:
        count = connection.execute(sa.select(sa.func.count()).select_from(performance_estimates)).scalar_one()
    assert count == len(pe.METRICS)
    auc = records.estimates_of(registry, MODEL, arm="shadow", metric="roc_auc")
    assert len(auc) == 1 and auc[0]["status"] == "realized"
    assert auc[0]["lower"] == pytest.approx(rerun.metrics["roc_auc"].lower)
    assert auc[0]["realized"] == pytest.approx(pe.realized_metrics(scores, labels, 0.4)["roc_auc"])


def test_an_uncalibrated_model_is_recorded_with_its_reason_and_no_values(registry: Registry) -> None:
    scores, labels = _traffic(4_000, seed=30)
    overconfident = 1 / (1 + np.exp(-3 * np.log(scores / (1 - scores))))
    check = pe.check_calibration(overconfident, labels)
    refused = pe.estimate_performance(overconfident, check)
    records.record_estimate(registry, MODEL, f"{MODEL}:3", "canary", DAY, DAY + timedelta(days=1), refused)
    records.record_realized(registry, MODEL, f"{MODEL}:3", "canary", DAY, DAY + timedelta(days=1), overconfident,
                            labels)
    rows = records.estimates_of(registry, MODEL, version=3)
    assert len(rows) == len(pe.METRICS)
    assert {r["status"] for r in rows} == {"uncalibrated"}
    assert all(r["estimate"] is None and r["realized"] is not None and r["error"] is None for r in rows)
    assert rows[0]["detail"]["reason"].startswith("scores are not calibrated: ECE ")


def test_labels_without_an_estimate_and_bad_inputs(registry: Registry) -> None:
    scores, labels = _traffic(1_000, seed=40)
    realized = records.record_realized(registry, MODEL, f"{MODEL}:2", "champion", DAY, DAY + timedelta(hours=1),
                                       scores, labels)
    rows = records.estimates_of(registry, MODEL)
    assert [r["metric"] for r in rows] == list(pe.METRICS)
    assert rows[0]["status"] == "realized" and rows[0]["estimate"] is None
    assert rows[0]["realized"] == pytest.approx(realized["roc_auc"])  # at the default threshold 0.5
    assert rows[0]["detail"]["threshold"] == pe.DEFAULT_THRESHOLD
    with pytest.raises(QuiverError, match="ROC-AUC needs both classes"):
        records.record_realized(registry, MODEL, f"{MODEL}:2", "champion", DAY, DAY + timedelta(hours=2),
                                scores, np.zeros(len(scores)))
    with pytest.raises(QuiverError, match="arm 'blue' is not one of champion, shadow, canary"):
        records.record_realized(registry, MODEL, f"{MODEL}:2", "blue", DAY, DAY + timedelta(hours=2), scores,
                                labels)
    with pytest.raises(QuiverError, match="is empty"):
        records.record_realized(registry, MODEL, f"{MODEL}:2", "champion", DAY, DAY, scores, labels)
