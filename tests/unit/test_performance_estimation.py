"""Label-free performance estimation (CBPE, issue 54): estimates and bands on calibrated synthetic traffic,
the calibration check that refuses, and the errors on inputs nothing can be estimated from."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.metrics import accuracy_score, f1_score, log_loss, precision_score, recall_score, roc_auc_score

from quiver.catalog.errors import QuiverError
from quiver.monitoring import performance_estimation as pe


def _traffic(rows: int, seed: int, shift: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Calibrated scores (the true probability of each row) and labels drawn from them; `shift` moves the
    feature, which changes the score mix and so the metrics, but not the calibration."""
    rng = np.random.default_rng(seed)
    x = rng.normal(shift, 1.0, rows)
    scores = 1 / (1 + np.exp(-(1.5 * x - 2.5)))
    return scores, (rng.random(rows) < scores).astype(np.float64)


@pytest.fixture(scope="module")
def held_out() -> pe.CalibrationCheck:
    scores, labels = _traffic(8_000, seed=1)
    return pe.check_calibration(scores, labels, source="test window of m:1")


def test_calibrated_scores_pass_the_check_and_carry_the_reference_metrics(held_out: pe.CalibrationCheck) -> None:
    assert held_out.calibrated, held_out.reason
    assert held_out.reason.startswith("calibrated: ECE") and "(test window of m:1)" in held_out.reason
    assert held_out.ece <= held_out.ece_bound and abs(held_out.spiegelhalter_z) < 3
    assert set(held_out.reference) == set(pe.METRICS)


def test_estimates_hold_the_realized_metric_in_their_band_in_most_seeded_windows(
        held_out: pe.CalibrationCheck) -> None:
    inside: dict[str, list[bool]] = {m: [] for m in pe.METRICS}
    errors: dict[str, list[float]] = {m: [] for m in pe.METRICS}
    for window in range(40):
        scores, labels = _traffic(2_000, seed=100 + window, shift=0.5 * (window % 3))
        estimate = pe.estimate_performance(scores, held_out, seed=window)
        assert estimate.status == "estimated" and estimate.rows == 2_000
        realized = pe.realized_metrics(scores, labels)
        for name, metric in estimate.metrics.items():
            assert metric.lower <= metric.estimate <= metric.upper, (name, window)
            inside[name].append(metric.lower <= realized[name] <= metric.upper)
            errors[name].append(metric.estimate - realized[name])
    # 95 % bands: at least 90 % of all window × metric, and no metric far below (40 windows are few)
    assert np.mean([hit for hits in inside.values() for hit in hits]) >= 0.9
    for name in pe.METRICS:
        assert np.mean(inside[name]) >= 0.85, (name, np.mean(inside[name]))
        # unbiased: the mean error is well inside one window's spread
        assert abs(np.mean(errors[name])) < 2 * np.std(errors[name]) / math.sqrt(len(errors[name])) + 1e-3, name


def test_busy_days_draw_the_sums_normal_limit_with_the_exact_spread_and_the_same_coverage(
        held_out: pe.CalibrationCheck) -> None:
    # 60k rows, ~6k expected positives: above GAUSSIAN_MIN_CLASS, so no label set is simulated row by row.
    scores, _ = _traffic(60_000, seed=7)
    assert min(scores.sum(), (1 - scores).sum()) >= pe.GAUSSIAN_MIN_CLASS
    design = pe._design(scores, pe.DEFAULT_THRESHOLD)
    drawn = pe._metrics_from_sums(pe._gaussian_sums(design, scores, 4_000, np.random.default_rng(0)), scores,
                                  pe.DEFAULT_THRESHOLD)
    # Brier is linear in the labels: its spread is known exactly, √Σ p(1 − p)(1 − 2q)² / n.
    exact = math.sqrt((scores * (1 - scores) * (1 - 2 * scores) ** 2).sum()) / scores.size
    assert drawn["brier"].std() == pytest.approx(exact, rel=0.05)
    inside = []
    for window in range(30):
        scores, labels = _traffic(60_000, seed=300 + window, shift=0.3 * (window % 2))
        estimate = pe.estimate_performance(scores, held_out, seed=window)
        realized = pe.realized_metrics(scores, labels)
        inside += [m.lower <= realized[name] <= m.upper for name, m in estimate.metrics.items()]
    assert np.mean(inside) >= 0.9, np.mean(inside)


def test_a_shift_that_hurts_shows_as_an_estimated_drop_against_the_reference(held_out: pe.CalibrationCheck) -> None:
    # the feature's spread shrinks: fewer confident rows, a lower AUC (the scores stay calibrated)
    rng = np.random.default_rng(7)
    scores = 1 / (1 + np.exp(-(1.5 * rng.normal(0.0, 0.4, 5_000) - 2.5)))
    auc = pe.estimate_performance(scores, held_out, draws=200).metrics["roc_auc"]
    assert auc.reference is not None and auc.drop is not None and auc.drop_band is not None
    assert auc.drop == pytest.approx(auc.reference - auc.estimate)
    assert auc.drop_band[0] > 0.05  # worse with confidence: even the band's best is far below the reference
    loss = pe.estimate_performance(scores, held_out, draws=200).metrics["log_loss"]
    assert loss.drop == pytest.approx(loss.estimate - loss.reference)  # a loss's drop is its rise
    assert loss.to_dict()["drop"] == pytest.approx(loss.drop)


def test_an_overconfident_model_is_refused_with_the_reason_in_words() -> None:
    scores, labels = _traffic(5_000, seed=3)
    overconfident = 1 / (1 + np.exp(-3 * np.log(scores / (1 - scores))))
    check = pe.check_calibration(overconfident, labels)
    assert not check.calibrated
    assert check.reason.startswith("scores are not calibrated: ECE ")
    assert "exceeds both what calibrated scores show by chance" in check.reason and "Spiegelhalter z" in check.reason
    estimate = pe.estimate_performance(overconfident, check)
    assert estimate.status == "uncalibrated" and estimate.metrics == {} and estimate.reason == check.reason
    assert estimate.to_dict()["status"] == "uncalibrated" and estimate.to_dict()["metrics"] == {}


def test_recalibration_is_an_option_checked_on_cross_fitted_rows(held_out: pe.CalibrationCheck) -> None:
    scores, labels = _traffic(5_000, seed=3)
    overconfident = 1 / (1 + np.exp(-3 * np.log(scores / (1 - scores))))
    check = pe.check_calibration(overconfident, labels, recalibrate=True)
    assert check.calibrated and check.calibrator is not None and check.reason.startswith("recalibrated: raw ECE")
    inside = []
    for window in range(10):
        truth_scores, truth = _traffic(3_000, seed=200 + window)
        served = 1 / (1 + np.exp(-3 * np.log(truth_scores / (1 - truth_scores))))
        estimate = pe.estimate_performance(served, check, draws=200, seed=window)
        # as good as knowing the true probabilities (the calibrated model's own estimate)
        oracle = pe.estimate_performance(truth_scores, held_out, draws=50)
        assert estimate.metrics["roc_auc"].estimate == pytest.approx(oracle.metrics["roc_auc"].estimate, abs=0.01)
        realized = pe.realized_metrics(served, truth)
        # log loss and Brier of the served (overconfident) scores, not of the recalibrated ones
        inside += [estimate.metrics[m].lower <= realized[m] <= estimate.metrics[m].upper for m in pe.METRICS]
    assert np.mean(inside) >= 0.85, np.mean(inside)


def test_too_few_held_out_rows_cannot_show_calibration() -> None:
    scores, labels = _traffic(150, seed=5)
    check = pe.check_calibration(scores, labels, source="test window of m:3")
    assert not check.calibrated
    assert check.reason.startswith("calibration cannot be shown on 150 held-out rows (test window of m:3)")


def test_realized_metrics_equal_scikit_learn() -> None:
    scores, labels = _traffic(3_000, seed=6)
    realized = pe.realized_metrics(scores, labels, threshold=0.3)
    predicted = scores >= 0.3
    assert realized["roc_auc"] == pytest.approx(roc_auc_score(labels, scores))
    assert realized["log_loss"] == pytest.approx(log_loss(labels, scores))
    assert realized["brier"] == pytest.approx(np.mean((scores - labels) ** 2))
    assert realized["precision"] == pytest.approx(precision_score(labels, predicted))
    assert realized["recall"] == pytest.approx(recall_score(labels, predicted))
    assert realized["f1"] == pytest.approx(f1_score(labels, predicted))
    assert realized["accuracy"] == pytest.approx(accuracy_score(labels, predicted))


def test_expected_roc_auc_is_the_realized_auc_when_the_probabilities_are_the_labels() -> None:
    rng = np.random.default_rng(8)
    scores = np.round(rng.random(500), 1)  # many ties: one threshold each
    labels = (rng.random(500) < scores).astype(np.float64)
    assert pe.expected_roc_auc(scores, labels) == pytest.approx(roc_auc_score(labels, scores))


@pytest.mark.parametrize(("scores", "message"), [
    ([], "no scored rows in the window"),
    ([0.2, float("nan")], "1 score(s) are not finite"),
    ([0.2, 1.3], "scores must be probabilities in [0, 1]"),
    ([0.0, 0.0, 0.0], "they imply one class only"),
])
def test_degenerate_windows_are_clear_errors(held_out: pe.CalibrationCheck, scores: list[float],
                                             message: str) -> None:
    with pytest.raises(QuiverError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        pe.estimate_performance(np.asarray(scores), held_out)


def test_labels_of_one_class_are_a_clear_error() -> None:
    scores, _ = _traffic(500, seed=9)
    with pytest.raises(QuiverError, match="all 500 labels are negative; ROC-AUC needs both classes"):
        pe.realized_metrics(scores, np.zeros(500))
    with pytest.raises(QuiverError, match="all 500 labels are positive"):
        pe.check_calibration(scores, np.ones(500))
    with pytest.raises(QuiverError, match="3 labels but 500 scores"):
        pe.realized_metrics(scores, np.zeros(3))
