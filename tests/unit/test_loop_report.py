"""The evaluation report's curves agree with scikit-learn; the page and its PNGs are written; story helpers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from quiver.monitoring.evaluation_report import (
    _area,
    calibration_figure,
    calibration_table,
    canary_figure,
    pr_points,
    reliability,
    roc_points,
    write_evaluation_report,
)
from quiver.pipelines.demo.loop import decision_of


@pytest.fixture
def scored() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    labels = (rng.random(2_000) < 0.1).astype(np.float64)
    scores = np.clip(0.1 + 0.3 * labels + rng.normal(0, 0.15, 2_000), 0, 1).round(3)  # ties on purpose
    return labels, scores


def test_roc_area_equals_sklearn_auc(scored: tuple[np.ndarray, np.ndarray]) -> None:
    from sklearn.metrics import roc_auc_score

    labels, scores = scored
    fpr, tpr = roc_points(labels, scores)
    assert (fpr[0], tpr[0], fpr[-1], tpr[-1]) == (0.0, 0.0, 1.0, 1.0)
    assert _area(fpr, tpr) == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)


def test_pr_points_give_sklearn_average_precision(scored: tuple[np.ndarray, np.ndarray]) -> None:
    from sklearn.metrics import average_precision_score

    labels, scores = scored
    recall, precision = pr_points(labels, scores)
    ap = float(np.sum(np.diff(np.r_[0.0, recall]) * precision))
    assert ap == pytest.approx(average_precision_score(labels, scores), abs=1e-12)


def test_reliability_bins_hold_mean_score_and_observed_rate() -> None:
    labels = np.array([0, 1, 0, 0, 1, 1], np.float64)
    scores = np.array([0.05, 0.05, 0.55, 0.55, 0.95, 1.0])
    mean, rate, counts = reliability(labels, scores, bins=10)
    assert mean.tolist() == pytest.approx([0.05, 0.55, 0.975])
    assert rate.tolist() == [0.5, 0.0, 1.0] and counts.tolist() == [2, 2, 2]


def test_report_writes_the_page_and_every_png(tmp_path: Path, scored: tuple[np.ndarray, np.ndarray]) -> None:
    labels, scores = scored
    steps = [{"label": "11-13 06:00", "fraction": 0.25, "outcome": "hold", "rows": 40, "log_loss_diff": None},
             {"label": "11-14 12:00", "fraction": 0.25, "outcome": "advance", "rows": 400, "log_loss_diff": -0.01},
             {"label": "11-15 18:00", "fraction": 0.5, "outcome": "promote", "rows": 900, "log_loss_diff": -0.02}]
    page = write_evaluation_report(tmp_path / "eval.html", labels=labels, champion_scores=scores,
                                   challenger_scores=np.sqrt(scores), champion="m:1", challenger="m:2",
                                   canary_steps=steps, facts=[("rollout", "#1 promoted")])
    text = page.read_text()
    assert "m:2 vs m:1" in text and "#1 promoted" in text and "promote" in text
    for chart in ("roc", "pr", "calibration", "canary"):
        blob = (tmp_path / f"eval.{chart}.png").read_bytes()
        assert blob.startswith(b"\x89PNG") and f"alt='{chart}'" in text
    with pytest.raises(ValueError, match="as many scores as labels"):
        write_evaluation_report(tmp_path / "bad.html", labels=labels, champion_scores=scores[:-1],
                                challenger_scores=scores, champion="a", challenger="b")


def test_decision_of_names_what_each_dag_run_decided() -> None:
    drift = {"dag_id": "quiver_drift", "state": "success", "tasks": {"emit_drift": "success"},
             "results": {"check_drift": {"drift_share": 0.6, "champion": "m:1", "rows": 4000,
                                         "trigger": "persistent_drift", "reason": "drift held 2 day(s) ≥ 2"}}}
    assert decision_of(drift) == ("RETRAIN → Asset (persistent drift)",
                                  "share 60% of m:1, 4,000 rows; drift held 2 day(s) ≥ 2")
    warned = {"dag_id": "quiver_drift", "state": "success", "tasks": {"emit_drift": "skipped"},
              "results": {"check_drift": {"drift_share": 0.6, "champion": "m:1", "rows": 4000, "dataset_drift": True,
                                          "reason": "drift without expected harm (day 1 of 2): …"}}}
    assert decision_of(warned) == ("drift: warning only",
                                   "share 60% of m:1, 4,000 rows; drift without expected harm (day 1 of 2): …")
    skipped = {"dag_id": "quiver_retrain", "state": "success", "tasks": {"plan": "skipped"}, "results": {},
               "why": "one candidate at a time: m:2 is still the shadow"}
    assert decision_of(skipped) == ("skipped", "one candidate at a time: m:2 is still the shadow")
    waiting = {"dag_id": "quiver_shadow_eval", "state": "success", "tasks": {"wait_for_labels": "skipped"},
               "results": {}, "why": "120 labelled pairs by 11-12 00:00, 300 needed"}
    assert decision_of(waiting) == ("waiting for labels", "120 labelled pairs by 11-12 00:00, 300 needed")
    steps = [0.05, 0.25, 0.5, 1.0]
    canary = {"dag_id": "quiver_canary", "state": "success", "tasks": {},
              "results": {"judge": {"kind": "step", "outcome": "advance", "canary": "m:3", "fraction": 0.25,
                                    "fraction_after": 0.5, "step": 1, "steps": steps}}}
    assert decision_of(canary) == ("advance", "m:3 at canary share 0.25 (step 2 of 3) → share 0.5")
    # A promotion or rollback reads the share it judged, then where the decision moved it.
    promoted = {**canary, "results": {"judge": {"kind": "step", "outcome": "promote", "canary": "m:3",
                                                "fraction": 0.5, "fraction_after": 1.0, "step": 2, "steps": steps}}}
    assert decision_of(promoted) == ("promote", "m:3 at canary share 0.5 (step 3 of 3) → share 1")
    held = {**canary, "results": {"judge": {"kind": "step", "outcome": "hold", "canary": "m:3", "fraction": 0.5,
                                            "fraction_after": 0.5, "step": 2, "steps": steps}}}
    assert decision_of(held) == ("hold", "m:3 at canary share 0.5 (step 3 of 3)")
    watch = {**canary, "results": {"judge": {"kind": "watch", "outcome": "confirm", "champion": "m:3",
                                             "previous": "m:2"}}}
    assert decision_of(watch) == ("confirm", "watch of champion m:3 against m:2")
    ended = {**canary, "results": {"judge": {"kind": "watch", "outcome": "none", "reason": "no promotion under watch"}}}
    assert decision_of(ended) == ("none", "no promotion under watch")


def test_calibration_leaves_sparse_bins_out_and_tables_the_rows_of_each_point() -> None:
    # Before: one high bin of 2 rows was drawn as a point and pulled the line (and the axes) up to 1.0.
    rng = np.random.default_rng(0)
    scores = np.r_[rng.uniform(0.0, 0.3, 3_000), 0.97, 0.99]
    labels = np.r_[(rng.random(3_000) < scores[:3_000]).astype(np.float64), 1.0, 1.0]
    fig = calibration_figure(labels, {"champion m:1": scores}, bins=10, min_rows=30)
    ax = fig.axes[0]
    line = ax.lines[0]
    assert max(line.get_xdata()) < 0.3 and len(line.get_xdata()) == 3  # three dense bins, no 0.98 point
    assert ax.get_xlim()[1] < 0.5  # the axes follow the dense bins
    assert "not drawn (< 30 rows): champion m:1: 1 bin(s), 2 rows" in ax.get_xlabel()
    # Each point's rows are in the table beside the chart (labels on the points overlapped).
    assert calibration_table(labels, {"champion m:1": scores}, bins=10).count("<tr>") == 5  # header + 4 bins


def test_the_canary_chart_draws_each_looks_interval_the_floor_and_the_fail_line() -> None:
    def look(estimate: float, lower: float, upper: float, status: str) -> dict[str, object]:
        return {"log_loss": {"estimate": estimate, "lower": lower, "upper": upper, "floor": 0.02,
                             "fail_above": 0.01, "status": status}}

    steps = [{"label": "a", "fraction": 0.05, "outcome": "hold", "guardrails": look(0.004, -0.03, 0.04, "wait")},
             {"label": "b", "fraction": 0.05, "outcome": "advance", "guardrails": look(0.001, -0.01, 0.012, "pass")}]
    fig = canary_figure(steps)
    share, panel = fig.axes
    assert share.get_ylabel() == "canary share" and panel.get_ylabel() == "Δ log loss (nats/row)"
    bars = [c for c in panel.containers if c.__class__.__name__ == "ErrorbarContainer"]
    assert len(bars) == 2
    segments = bars[0].lines[2][0].get_segments()[0]
    assert segments[0][1] == pytest.approx(-0.03) and segments[1][1] == pytest.approx(0.04)
    levels = {round(line.get_ydata()[0], 6): line.get_linestyle() for line in panel.lines
              if len(set(line.get_ydata())) == 1}
    assert levels[0.02] == "--" and levels[0.01] == ":"  # the floor and the fail line
