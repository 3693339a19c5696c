"""Drift judgement: false-alarm rate on undrifted data, injected shifts caught, thresholds and edge cases."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from quiver.monitoring.drift import DriftConfig, Thresholds, compute_drift, with_thresholds

CATEGORIES = np.array(["grocery", "fuel", "travel", "fashion", "digital"])
MIX = np.array([0.4, 0.25, 0.15, 0.12, 0.08])


def frame(rng: np.random.Generator, n: int, *, shift: float = 0.0, scale: float = 1.0,
          mix: np.ndarray = MIX) -> pd.DataFrame:
    return pd.DataFrame({
        "amount": rng.lognormal(3.0 + shift, scale, n),
        "score": rng.normal(shift, scale, n),
        "count_1h": rng.poisson(3 + 10 * shift, n),
        "category": rng.choice(CATEGORIES, n, p=mix),
        "is_online": rng.random(n) < 0.3 + shift / 4,
    })


def test_false_alarms_at_most_5_percent_over_100_trials() -> None:
    alarms = 0
    for seed in range(100):
        rng = np.random.default_rng(seed)
        n_ref, n_cur = int(rng.integers(800, 6_000)), int(rng.integers(800, 6_000))
        report = compute_drift(frame(rng, n_ref), frame(rng, n_cur), workers=1)
        alarms += bool(report.drifted)  # any feature alerting counts as a false alarm of the trial
    assert alarms <= 5


def test_injected_shift_is_caught() -> None:
    rng = np.random.default_rng(1)
    ref = frame(rng, 5_000)
    shifted = frame(rng, 5_000, shift=0.5, mix=np.array([0.15, 0.15, 0.2, 0.2, 0.3]))
    report = compute_drift(ref, shifted)
    drifted = {f.feature for f in report.drifted}
    assert {"amount", "score", "count_1h", "category"} <= drifted
    assert report.dataset_drift
    assert report.feature("score").scores["ks_statistic"] >= 0.1
    assert report.feature("category").scores["psi"] >= 0.2


def test_small_shift_on_huge_samples_does_not_alarm_on_ks() -> None:
    # 0.02 sd on 200k rows: KS p is tiny, but D < 0.1, so KS alone must not alarm.
    rng = np.random.default_rng(2)
    ref = pd.DataFrame({"x": rng.normal(0, 1, 200_000)})
    cur = pd.DataFrame({"x": rng.normal(0.02, 1, 200_000)})
    f = compute_drift(ref, cur).feature("x")
    assert f.scores["ks_pvalue"] < 1e-6
    assert f.scores["ks_statistic"] < 0.1
    assert f.status == "ok"


def test_psi_warn_and_alert_levels() -> None:
    rng = np.random.default_rng(3)
    ref = pd.DataFrame({"c": rng.choice(["a", "b"], 20_000, p=[0.5, 0.5])})
    warn = pd.DataFrame({"c": rng.choice(["a", "b"], 20_000, p=[0.68, 0.32])})  # PSI ≈ 0.14
    alert = pd.DataFrame({"c": rng.choice(["a", "b"], 20_000, p=[0.75, 0.25])})  # PSI ≈ 0.27
    rule = DriftConfig(decision="thresholds")  # the PSI levels are the thresholds rule's
    assert compute_drift(ref, warn, config=rule).feature("c").status == "warn"
    assert compute_drift(ref, alert, config=rule).feature("c").status == "alert"
    loose = with_thresholds(rule, psi_warn=0.5, psi_alert=0.9)
    assert compute_drift(ref, alert, config=loose).feature("c").status == "ok"


def test_per_feature_thresholds() -> None:
    rng = np.random.default_rng(4)
    ref = pd.DataFrame({"a": rng.normal(0, 1, 5_000), "b": rng.normal(0, 1, 5_000)})
    cur = pd.DataFrame({"a": rng.normal(0.5, 1, 5_000), "b": rng.normal(0.5, 1, 5_000)})
    config = DriftConfig(per_feature={"b": Thresholds(psi_warn=10, psi_alert=20, ks_min_statistic=0.9)},
                         decision="thresholds")  # per-feature thresholds belong to the thresholds rule
    report = compute_drift(ref, cur, config=config)
    assert report.feature("a").drifted
    assert report.feature("b").status == "ok"


def test_nans_are_dropped_and_counted() -> None:
    rng = np.random.default_rng(5)
    x = rng.normal(0, 1, 2_000)
    y = rng.normal(0, 1, 2_000)
    x[:100] = np.nan
    y[:50] = np.inf
    y[50:80] = -np.inf
    cats = pd.Series(rng.choice(["p", "q"], 2_000)).where(rng.random(2_000) > 0.1)
    report = compute_drift(pd.DataFrame({"x": x, "c": cats}), pd.DataFrame({"x": y, "c": cats}))
    fx, fc = report.feature("x"), report.feature("c")
    assert (fx.n_ref, fx.nulls_ref, fx.n_cur, fx.nulls_cur) == (1_900, 100, 1_920, 80)
    assert fc.nulls_ref == fc.nulls_cur == int(cats.isna().sum())
    assert fx.status == "ok"


def test_null_share_shift_warns() -> None:
    rng = np.random.default_rng(6)
    ref = pd.DataFrame({"x": rng.normal(0, 1, 4_000)})
    cur_values = rng.normal(0, 1, 4_000)
    cur_values[:1_000] = np.nan
    f = compute_drift(ref, pd.DataFrame({"x": cur_values})).feature("x")
    assert f.status == "warn"
    assert any("null share" in r for r in f.reasons)


def test_tiny_samples_are_scored_but_never_alarm() -> None:
    ref = pd.DataFrame({"x": [1.0, 2.0, 3.0, 4.0, 5.0]})
    cur = pd.DataFrame({"x": [50.0, 60.0, 70.0]})
    f = compute_drift(ref, cur).feature("x")
    assert f.status == "insufficient_data"
    assert f.scores["psi"] > 1 and f.scores["ks_pvalue"] < 0.05
    assert not f.drifted


def test_psi_with_many_bins_and_few_rows_is_not_judged() -> None:
    # 150 rows per side, 150 categories: the no-drift PSI is ~2, so PSI must not alarm at all.
    rng = np.random.default_rng(7)
    cats = [f"m{i}" for i in range(150)]
    config = with_thresholds(DriftConfig(), min_samples=10)
    f = compute_drift(pd.DataFrame({"m": rng.choice(cats, 150)}), pd.DataFrame({"m": rng.choice(cats, 150)}),
                      config=config).feature("m")
    assert f.scores["psi"] > 0.2
    assert f.status == "ok"
    assert any("not judged" in r for r in f.reasons)


def test_constant_and_empty_columns() -> None:
    ref = pd.DataFrame({"k": np.full(900, 7.0), "empty": np.full(900, np.nan)})
    cur = pd.DataFrame({"k": np.full(700, 7.0), "empty": np.full(700, np.nan)})
    report = compute_drift(ref, cur)
    assert report.feature("k").status == "ok"
    assert report.feature("k").scores["psi"] == 0.0
    assert report.feature("k").details["constant_ref"]
    assert report.feature("empty").status == "skipped"
    moved = compute_drift(ref, pd.DataFrame({"k": np.full(700, 8.0), "empty": np.zeros(700)}))
    assert moved.feature("k").status == "alert"


def test_arrow_tables_and_feature_selection() -> None:
    rng = np.random.default_rng(8)
    ref = pa.table({"a": rng.normal(size=1_000), "b": pa.array([1, None] * 500, pa.int64())})
    cur = pa.table({"a": rng.normal(size=1_000), "b": pa.array([1, 2] * 500, pa.int64())})
    report = compute_drift(ref, cur, ["b"])
    assert [f.feature for f in report.features] == ["b"]
    assert report.feature("b").nulls_ref == 500
    with pytest.raises(ValueError, match="missing"):
        compute_drift(ref, cur, ["nope"])


def test_optional_methods_and_auto() -> None:
    rng = np.random.default_rng(9)
    ref, cur = frame(rng, 3_000), frame(rng, 3_000, shift=0.4)
    config = DriftConfig(numerical_methods=("psi", "ks", "wasserstein", "jensenshannon", "auto"),
                         categorical_methods=("psi", "jensenshannon", "chisquare", "auto"))
    report = compute_drift(ref, cur, config=config)
    assert {"psi", "ks_pvalue", "wasserstein", "jensenshannon"} <= set(report.feature("score").scores)
    assert {"psi", "jensenshannon", "chisquare_pvalue"} <= set(report.feature("category").scores)
    assert report.feature("score").drifted
    with pytest.raises(ValueError, match="unknown drift method"):
        DriftConfig(numerical_methods=("psi", "bogus"))
    with pytest.raises(ValueError, match="only apply to numerical"):
        DriftConfig(categorical_methods=("ks",))


def test_threads_and_single_thread_agree() -> None:
    rng = np.random.default_rng(10)
    ref, cur = frame(rng, 20_000), frame(rng, 20_000, shift=0.05)
    one = compute_drift(ref, cur, workers=1).to_frame()
    two = compute_drift(ref, cur, workers=2).to_frame()
    pd.testing.assert_frame_equal(one, two)


@pytest.mark.parametrize("side", ["reference", "current"])
def test_a_drift_check_over_an_empty_side_is_an_error_not_a_pass(side: str, tmp_path: Path) -> None:
    from quiver.catalog.errors import NoRowsError
    from quiver.monitoring.checks import run_drift_check
    from quiver.registry import Registry

    full = frame(np.random.default_rng(1), 500)
    sides = {"reference": full, "current": full, side: full.iloc[:0]}
    registry = Registry(f"sqlite:///{tmp_path}/registry.db", project="p")
    with pytest.raises(NoRowsError, match=f"no rows compared: the {side} side \\(day 1\\) has no rows"):
        run_drift_check(sides["reference"], sides["current"], name="m", registry=registry,
                        reference_label="day 1", current_label="day 1")
    from quiver.monitoring.repository import list_drift_runs

    assert list_drift_runs(registry) == []  # nothing recorded
    registry.close()
