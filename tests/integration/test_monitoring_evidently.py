"""The fast path against Evidently's real Report API (NaNs, categoricals, constants, ints, bools, tiny samples),
and the HTML outputs: Evidently's report and our summary page."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from monitoring.drift import DriftConfig, compute_drift
from monitoring.evidently_ref import evidently_html
from monitoring.plots import summary_page

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


def test_html_reports(tmp_path: Path) -> None:
    rng = np.random.default_rng(9)
    ref, cur = mixed(rng, 2_000, 0.0), mixed(rng, 2_000, 0.5)
    report = compute_drift(ref, cur)
    html_path = evidently_html(ref, cur, list(ref.columns), tmp_path / "drift.html")
    text = html_path.read_text()
    assert html_path.stat().st_size > 50_000 and "amount" in text and "count_24h" in text
    history = {"amount": [(pd.Timestamp("2026-11-01", tz="UTC").to_pydatetime(), 0.02),
                          (pd.Timestamp("2026-11-02", tz="UTC").to_pydatetime(), 0.31)]}
    page = summary_page(report, ref, cur, tmp_path / "summary.html", evidently_report="drift.html",
                        history=history)
    body = page.read_text()
    assert "data:image/png;base64," in body and "drift.html" in body
    for f in report.features:
        assert f">{f.feature}<" in body
    png = tmp_path / "summary.distributions.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "summary.psi_history.png").exists()
