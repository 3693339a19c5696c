"""Reports a person can read: no Python `None`/`nan` in cells, calibration labels that do not overlap, a
warning on a badly calibrated curve, p-values that say "< 1e-16", drift charts that say which features they
draw, category names in full, and PSI lines cut to the top ones."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from quiver.monitoring.drift import DriftReport, FeatureDrift
from quiver.monitoring.evaluation_report import calibration_figure, canary_figure, write_evaluation_report
from quiver.monitoring.plots import distributions_png, psi_history_png, summary_page


def steps() -> list[dict[str, object]]:
    return [{"label": "a", "fraction": 0.05, "outcome": "hold", "rows": 40, "log_loss_diff": None, "reason": "x"},
            {"label": "b", "fraction": 0.25, "outcome": "advance", "rows": 400, "log_loss_diff": -0.01234,
             "reason": "y"}]


def miscalibrated() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A calibrated champion; a challenger that scores 0.95 where 38 % are positive."""
    rng = np.random.default_rng(1)
    low = rng.uniform(0, 0.6, 2_000)
    labels = np.r_[rng.random(2_000) < low, rng.random(2_000) < 0.38].astype(np.float64)
    champion = np.r_[low, rng.uniform(0.33, 0.43, 2_000)]
    challenger = np.r_[low, np.full(2_000, 0.95)]
    return labels, champion, challenger


def test_the_evaluation_page_prints_a_dash_not_none_and_warns_on_poor_calibration(tmp_path: Path) -> None:
    labels, champion, challenger = miscalibrated()
    page = write_evaluation_report(tmp_path / "e.html", labels=labels, champion_scores=champion,
                                   challenger_scores=challenger, champion="m:1", challenger="m:2",
                                   canary_steps=steps()).read_text()
    text = re.sub(r"data:image/png;base64,[^']*", "", page)
    assert "None" not in text and "nan" not in text.lower()
    assert "<td>—</td>" in page and "−0.0123" in page
    assert "poorly calibrated" in page and "challenger m:2" in page
    assert "champion m:1 is poorly calibrated" not in page
    assert "ECE" in page


def test_calibration_warns_on_the_chart_and_its_labels_do_not_overlap() -> None:
    labels, champion, challenger = miscalibrated()
    fig = calibration_figure(labels, {"champion m:1": champion, "challenger m:2": champion + 0.002})
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    boxes = [t.get_window_extent(renderer) for t in fig.axes[0].texts if t.get_text().strip()]
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    warned = calibration_figure(labels, {"champion m:1": champion, "challenger m:2": challenger})
    assert any("poorly calibrated" in t.get_text() for t in warned.axes[0].texts)


def test_canary_panels_name_units_and_say_when_labels_are_missing() -> None:
    def look(label: str, log_loss: dict[str, object]) -> dict[str, object]:
        latency = {"estimate": 0.001, "lower": -0.002, "upper": 0.004, "floor": 0.01, "fail_above": 0.005,
                   "status": "wait"}
        return {"label": label, "fraction": 0.05, "outcome": "hold",
                "guardrails": {"log_loss": log_loss, "latency_p99": latency}}

    fig = canary_figure([look("a", {"status": "wait"}), look("b", {"status": "wait"})])
    by_name = {ax.get_ylabel(): ax for ax in fig.axes[1:]}
    assert any("ms" in name for name in by_name), list(by_name)
    [log_loss] = [ax for name, ax in by_name.items() if "log loss" in name]
    assert any("no labelled rows yet" in t.get_text() for t in log_loss.texts)


def drift_world() -> tuple[DriftReport, pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(0)
    features = [FeatureDrift(f"f{i:02d}", "numerical", "alert" if i < 3 else "ok",
                             {"psi": 0.3 if i < 3 else 0.01, "ks_pvalue": 2.6e-321 if i == 0 else 0.5}, 200, 200, 0, 0)
                for i in range(25)]
    features.append(FeatureDrift("merchant_category", "categorical", "alert", {"psi": 0.4}, 200, 200, 0, 0))
    report = DriftReport(tuple(features), 0.5, "numpy", 0.1)
    names = ["electronics_and_home_appliances", "groceries_and_household", "travel_and_hotels"]
    frame = {f"f{i:02d}": rng.normal(size=200) for i in range(25)}
    reference = pd.DataFrame({**frame, "merchant_category": rng.choice(names, 200)})
    current = pd.DataFrame({**frame, "merchant_category": rng.choice(names[:2], 200)})
    return report, reference, current


def test_the_drift_summary_formats_p_values_and_says_which_features_it_draws(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from quiver.monitoring import plots

    monkeypatch.setattr(plots, "distributions_png", lambda *args, **kwargs: b"png")  # the page, not the grid
    report, reference, current = drift_world()
    start = datetime(2026, 11, 1, tzinfo=UTC)
    history = {f"f{i:02d}": [(start + timedelta(days=d), 0.01 * i + 0.001 * d) for d in range(3)] for i in range(25)}
    page = summary_page(report, reference, current, tmp_path / "s.html", history=history).read_text()
    assert "2.6e-321" not in page and "&lt; 1e-16" in page
    assert "12 of 26 features" in page and "f00, f01, f02, merchant_category, f03" in page
    assert "PSI over time of the 8 of 25 features with the highest latest PSI" in page


def test_category_names_are_not_clipped_and_psi_lines_are_few(monkeypatch: pytest.MonkeyPatch) -> None:
    from quiver.monitoring import plots

    figures: list[Any] = []
    original = plots._png
    monkeypatch.setattr(plots, "_png", lambda fig: figures.append(fig) or original(fig))
    report, reference, current = drift_world()
    distributions_png(report, reference, current, features=["merchant_category"])
    labels = [t.get_text() for ax in figures[0].axes for t in ax.get_yticklabels() + ax.get_xticklabels()]
    assert "electronics_and_home_appliances" in labels  # before: cut to "electronic"
    start = datetime(2026, 11, 1, tzinfo=UTC)
    history = {f"f{i:02d}": [(start + timedelta(days=d), 0.01 * i) for d in range(3)] for i in range(25)}
    psi_history_png(history)
    ax = figures[1].axes[0]
    drawn = [line.get_label() for line in ax.lines if not line.get_label().startswith("_")
             and line.get_label() not in ("warn", "alert")]
    assert drawn == [f"f{i:02d}" for i in range(24, 16, -1)]  # the 8 highest, highest first
