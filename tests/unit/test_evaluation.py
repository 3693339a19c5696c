"""Shadow evaluation: the numbers equal an independent computation (scikit-learn, scipy) on a fixed dataset;
verdicts follow the margin; serving logs ⋈ labels per arm; delayed labels keep the newest arrival."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from scipy import stats as scipy_stats
from sklearn.metrics import brier_score_loss, log_loss, roc_auc_score

from quiver.monitoring.evaluation import (
    PairedDifference,
    ShadowSettings,
    arm_metrics,
    compare_shadow,
    join_labels,
    shadow_pairs,
    verdict_of,
)
from quiver.monitoring.labels import read_labels, write_labels
from quiver.monitoring.sequential import mixture_interval

T0 = datetime(2026, 11, 3, 12, tzinfo=UTC)


def fixed_dataset(n: int = 4000, seed: int = 3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    z = rng.normal(-1.5, 1.2, n)
    y = (rng.random(n) < 1 / (1 + np.exp(-z))).astype(float)
    champion = 1 / (1 + np.exp(-(z + rng.normal(0, 0.9, n))))  # a noisier model
    shadow = 1 / (1 + np.exp(-(z + rng.normal(0, 0.3, n))))  # closer to the truth
    return champion, shadow, y


def test_paired_numbers_equal_sklearn_and_scipy() -> None:
    champion, shadow, y = fixed_dataset()
    result = compare_shadow(champion, shadow, y, settings=ShadowSettings(bootstrap=200, seed=5))
    assert result.log_loss.champion == pytest.approx(log_loss(y, champion), rel=1e-12)
    assert result.log_loss.shadow == pytest.approx(log_loss(y, shadow), rel=1e-12)
    assert result.brier.champion == pytest.approx(brier_score_loss(y, champion), rel=1e-12)
    assert result.brier.shadow == pytest.approx(brier_score_loss(y, shadow), rel=1e-12)
    assert result.auc["champion"] == pytest.approx(roc_auc_score(y, champion), rel=1e-12)
    assert result.auc["shadow"] == pytest.approx(roc_auc_score(y, shadow), rel=1e-12)
    # With every row its own unit, the paired interval is the mixture confidence sequence of the per-request
    # differences with their squared standard error (scipy's sem²).
    per_row = -(y * np.log(shadow) + (1 - y) * np.log(1 - shadow)) + (y * np.log(champion)
                                                                      + (1 - y) * np.log(1 - champion))
    cs = mixture_interval(per_row.mean(), scipy_stats.sem(per_row) ** 2, tau=0.01, alpha=0.05, scales=3)
    assert (result.log_loss.lower, result.log_loss.upper) == pytest.approx((cs.lower, cs.upper), rel=1e-9)
    # Paired bootstrap by hand: the same resampled rows for both models.
    rng = np.random.default_rng(5)
    diffs = []
    for _ in range(200):
        idx = rng.integers(0, len(y), len(y))
        diffs.append(roc_auc_score(y[idx], shadow[idx]) - roc_auc_score(y[idx], champion[idx]))
    assert result.auc["lower"] == pytest.approx(np.quantile(diffs, 0.025), rel=1e-9)
    assert result.auc["upper"] == pytest.approx(np.quantile(diffs, 0.975), rel=1e-9)
    assert result.verdict == "better" and result.labeled_pairs == len(y)


def test_calibration_ece_matches_a_direct_computation() -> None:
    champion, shadow, y = fixed_dataset(n=1000)
    result = compare_shadow(champion, shadow, y, settings=ShadowSettings(bootstrap=0))
    bins = np.minimum((champion * 10).astype(int), 9)
    ece = sum(abs(y[bins == b].sum() - champion[bins == b].sum()) for b in range(10)) / len(y)
    assert result.calibration["champion"]["ece"] == pytest.approx(ece, rel=1e-12)
    assert sum(b["count"] for b in result.calibration["champion"]["bins"]) == len(y)


def test_verdicts_follow_the_margin() -> None:
    def diff(mean: float, lower: float, upper: float, n: int = 1000) -> PairedDifference:
        return PairedDifference(n, 0.3, 0.3 + mean, mean, lower, upper)

    assert verdict_of(diff(-0.02, -0.03, -0.01), 0.01, 200)[0] == "better"
    assert verdict_of(diff(0.001, -0.004, 0.006), 0.01, 200)[0] == "not worse"
    assert verdict_of(diff(0.05, 0.03, 0.07), 0.01, 200)[0] == "worse"
    assert verdict_of(diff(0.012, 0.004, 0.02), 0.01, 200)[0] == "inconclusive"  # bound inside half the margin
    assert verdict_of(diff(0.008, 0.001, 0.015), 0.01, 200)[0] == "inconclusive"  # significant, but within margin
    assert verdict_of(diff(-0.02, -0.03, -0.01, n=50), 0.01, 200)[0] == "inconclusive"  # too few pairs


def test_same_model_in_both_arms_is_not_worse_and_a_bad_shadow_is_worse() -> None:
    champion, _, y = fixed_dataset(n=3000)
    same = compare_shadow(champion, champion.copy(), y, settings=ShadowSettings(bootstrap=0))
    assert same.verdict == "not worse" and same.log_loss.difference == 0.0
    bad = compare_shadow(champion, np.clip(champion * 0.2 + 0.4, 0, 1), y, settings=ShadowSettings(bootstrap=0))
    assert bad.verdict == "worse"


def test_a_shadow_read_every_day_says_not_worse_of_a_worse_challenger_at_most_alpha() -> None:
    # A challenger worse by exactly the margin, judged again every "day" as labels accumulate (30 looks):
    # a fixed-sample interval re-read until it is not inconclusive says "not worse" ever more often; the
    # confidence sequence keeps that error at α however many days it is read.
    rng = np.random.default_rng(9)
    settings = ShadowSettings(bootstrap=0, min_pairs=50)
    margin = settings.margin
    wrong = naive_wrong = 0
    for _ in range(200):
        d = rng.normal(margin, 0.15, 30 * 300)  # per-request loss differences, mean = the margin
        said = naive_said = False
        for day in range(1, 31):
            x = d[: day * 300]
            diff = PairedDifference.of(x, np.zeros_like(x), settings.alpha, tau=margin)
            said |= verdict_of(diff, margin, settings.min_pairs)[0] in ("not worse", "better")
            high = x.mean() + scipy_stats.t.ppf(0.975, len(x) - 1) * scipy_stats.sem(x)
            naive_said |= high < margin
        wrong += said
        naive_wrong += naive_said
    assert wrong / 200 <= settings.alpha
    assert naive_wrong / 200 > 2 * settings.alpha  # what re-reading a fixed-sample interval daily did


def test_unlabelled_rows_are_left_out_and_counted() -> None:
    champion, shadow, y = fixed_dataset(n=500)
    y = y.copy()
    y[:100] = np.nan
    result = compare_shadow(champion, shadow, y, settings=ShadowSettings(bootstrap=0, min_pairs=2))
    assert result.pairs == 500 and result.labeled_pairs == 400
    assert result.log_loss.champion == pytest.approx(log_loss(y[100:], champion[100:]))


def logs_table(rows: list[dict]) -> pa.Table:
    return pa.table({
        "ts": pa.array([T0] * len(rows), pa.timestamp("us", tz="UTC")),
        "request_id": [r["request_id"] for r in rows], "model_version": [r["model_version"] for r in rows],
        "arm": [r["arm"] for r in rows], "latency_ms": [r.get("latency_ms", 1.0) for r in rows],
        "prediction": pa.array([r.get("prediction") for r in rows], pa.float64()),
        "error": [r.get("error", "") for r in rows], "key.user_id": [r.get("user", 1) for r in rows],
    })


def test_shadow_pairs_join_on_request_id_and_count_shadow_errors() -> None:
    rows = []
    for i in range(6):
        rows.append({"request_id": f"r{i}", "model_version": "m:1", "arm": "champion", "prediction": 0.1 * i})
    for i in range(5):  # r5 has no shadow row (dropped); r4's shadow failed
        failed = i == 4
        rows.append({"request_id": f"r{i}", "model_version": "m:2", "arm": "shadow",
                     "prediction": None if failed else 0.2, "error": "RuntimeError: boom" if failed else ""})
    labels = pa.table({"request_id": [f"r{i}" for i in range(6)], "label": [0.0, 1, 0, 1, 0, 1]})
    joined = join_labels(logs_table(rows), labels)
    pairs, errors = shadow_pairs(joined, "m:1", "m:2")
    assert pairs["request_id"].tolist() == ["r0", "r1", "r2", "r3"]
    assert pairs["prediction_champion"].tolist() == pytest.approx([0.0, 0.1, 0.2, 0.3])
    assert errors["shadow_errors"] == 1 and errors["champion_rows_without_shadow"] == 2
    metrics = {(m.arm, m.model_version): m for m in arm_metrics(joined)}
    assert metrics[("shadow", "m:2")].errors == 1 and metrics[("shadow", "m:2")].labeled == 4
    assert metrics[("champion", "m:1")].log_loss == pytest.approx(
        log_loss([0, 1, 0, 1, 0, 1], np.clip([0.0, 0.1, 0.2, 0.3, 0.4, 0.5], 1e-15, 1), labels=[0, 1]), rel=1e-6)


def test_labels_quarantine_bad_rows_and_the_newest_arrival_wins(tmp_path: Path) -> None:
    first = write_labels(tmp_path, ["a", "b", None, "c", ""], [1, 0, 1, 7, 1], arrived_at=T0)
    assert (first.written, first.quarantined) == (2, 3)
    assert first.reasons == {"missing request_id": 2, "label is not 0 or 1": 1}
    assert any("_quarantine" in str(p) for p in first.files)
    write_labels(tmp_path, ["a"], [0], arrived_at=T0 + timedelta(days=1))  # a correction, a day later
    now = read_labels(tmp_path).to_pydict()
    assert dict(zip(now["request_id"], now["label"], strict=True)) == {"a": 0.0, "b": 0.0}
    before = read_labels(tmp_path, as_of=T0 + timedelta(hours=1)).to_pydict()
    assert dict(zip(before["request_id"], before["label"], strict=True)) == {"a": 1.0, "b": 0.0}
    with pytest.raises(ValueError, match="timezone-aware"):
        write_labels(tmp_path, ["x"], [1], arrived_at=datetime(2026, 1, 1))
