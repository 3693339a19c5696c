"""The fast path against Evidently's real Report API (NaNs, categoricals, constants, ints, bools, tiny samples),
and the HTML outputs: Evidently's report and our summary page."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from quiver.monitoring.drift import DriftConfig, compute_drift
from quiver.monitoring.plots import write_drift_reports

pytestmark = [pytest.mark.integration,
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]  # inside Evidently
ALL_NUMERICAL = ("psi", "ks", "wasserstein", "jensenshannon", "auto")
ALL_CATEGORICAL = ("psi", "jensenshannon", "chisquare", "auto")


def mixed(rng: np.random.Generator, n: int, shift: float) -> pd.DataFrame:
    amount = rng.lognormal(3 + shift, 1, n)
    amount[rng.random(n) < 0.07] = np.nan
    amount[:3] = [np.inf, -np.inf, np.nan]
    category = pd.Series(rng.choice(["grocery", "fuel", "travel", "gambling"], n, p=[0.5, 0.3, 0.15, 0.05]))
    return pd.DataFrame({
        "amount": amount,
        "count_24h": rng.poisson(4 + 3 * shift, n),
        "few_values": rng.integers(0, 4, n).astype(float),
        "constant": np.full(n, 1.5),
        "category": category.where(rng.random(n) > 0.02),
        "is_online": rng.random(n) < 0.3 + shift / 3,
    })


@pytest.mark.parametrize(("n_ref", "n_cur", "shift"), [(3_000, 2_500, 0.0), (2_000, 4_000, 0.4), (600, 40, 0.2)])
def test_fast_path_equals_evidently_report(n_ref: int, n_cur: int, shift: float) -> None:
    rng = np.random.default_rng(n_ref + n_cur)
    ref, cur = mixed(rng, n_ref, 0.0), mixed(rng, n_cur, shift)
    config = DriftConfig(numerical_methods=ALL_NUMERICAL, categorical_methods=ALL_CATEGORICAL)
    fast = compute_drift(ref, cur, config=config)
    reference = compute_drift(ref, cur, config=config, engine="evidently")
    for ours, theirs in zip(fast.features, reference.features, strict=True):
        assert ours.feature == theirs.feature
        assert set(ours.scores) == set(theirs.scores), ours.feature
        for key, value in theirs.scores.items():
            assert abs(ours.scores[key] - value) <= 1e-9 * max(1.0, abs(value)), (ours.feature, key)
        assert (ours.status, ours.n_ref, ours.nulls_ref, ours.n_cur, ours.nulls_cur) == (
            theirs.status, theirs.n_ref, theirs.nulls_ref, theirs.n_cur, theirs.nulls_cur)
    assert fast.feature("amount").nulls_ref >= 3  # NaN and both infinities dropped and counted


def test_html_reports_share_one_verdict_render_offline_and_stay_bounded(tmp_path: Path) -> None:
    rng = np.random.default_rng(9)
    n = 45_000
    ref, cur = mixed(rng, n, 0.0), mixed(rng, n, 0.5)
    # KS's p-value alone would call this drifted (p ≪ 0.05 at this size), Quiver's rule (also D ≥ 0.1) does not:
    # the case where Evidently's own defaults and Quiver's summary used to disagree.
    ref["wobble"], cur["wobble"] = rng.normal(0, 1, n), rng.normal(0.04, 1, n)
    cur["starved_feature"], ref["starved_feature"] = np.r_[rng.normal(0, 1, 40), np.full(n - 40, np.nan)], rng.normal(0, 1, n)
    config = DriftConfig(decision="thresholds")  # the thresholds rule's verdicts (the bounded one: test_drift_decision)
    report = compute_drift(ref, cur, config=config)
    assert report.feature("wobble").status == "ok" and report.feature("wobble").scores["ks_pvalue"] < 0.05
    assert report.feature("starved_feature").status == "insufficient_data" and report.drifted
    history = {"amount": [(pd.Timestamp("2026-11-01", tz="UTC").to_pydatetime(), 0.02),
                          (pd.Timestamp("2026-11-02", tz="UTC").to_pydatetime(), 0.31)]}
    evidently, page = write_drift_reports(report, ref, cur, tmp_path / "drift.html", name="fraud_model",
                                          config=config, compared=[("reference", "train.parquet")],
                                          alert_ids=[7], history=history, max_rows=5_000)
    # one verdict: Evidently's drifted columns are exactly Quiver's (its own count is checked inside too)
    assert evidently.drifted == tuple(f.feature for f in report.drifted)
    assert evidently.dataset_drift == report.dataset_drift
    # bounded: charts drawn from the stated sample; the summary says so
    assert (evidently.sample_ref, evidently.sample_cur, evidently.rows_ref) == (5_000, 5_000, n)
    text = evidently.path.read_text()
    assert "Quiver: PSI" in text and "wobble" in text and "starved_feature" not in text  # only judged columns
    body = page.read_text()
    assert "random sample of 5,000 of 45,000 reference" in body
    assert "What to do next" in body and "quiver alerts resolve 7" in body and "train.parquet" in body
    assert "too few values to judge (starved_feature)" in body
    for f in report.features:
        assert f">{f.feature}<" in body
    assert "data:image/png;base64," in body and "drift.html" in body
    # offline: the summary names no external URL at all; Evidently's page loads nothing from outside
    assert not re.search(r"https?://", body)
    assert not re.search(r"<(?:script|link|img|iframe)[^>]+(?:src|href)\s*=\s*[\"']?(?:https?:)?//", text, re.I)
    png = tmp_path / "drift.summary.distributions.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "drift.summary.psi_history.png").exists()


def test_psi_history_axis_spans_the_data() -> None:
    import matplotlib.dates as mdates

    from quiver.monitoring import plots

    drawn: dict[str, tuple[float, float]] = {}
    real_png = plots._png

    def keep_limits(fig: object) -> bytes:
        drawn["x"] = fig.axes[0].get_xlim()  # type: ignore[attr-defined]
        return real_png(fig)

    one_day = {"amount": [(pd.Timestamp("2026-11-03 10:00", tz="UTC").to_pydatetime(), 0.05)]}
    plots._png = keep_limits  # type: ignore[assignment]
    try:
        plots.psi_history_png(one_day)
    finally:
        plots._png = real_png  # type: ignore[assignment]
    low, high = (mdates.num2date(v) for v in drawn["x"])
    assert low.date().isoformat() == "2026-11-03" and high.date().isoformat() == "2026-11-03"
