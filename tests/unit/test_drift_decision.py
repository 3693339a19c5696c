"""The bounded drift decision (quiver.monitoring.drift_decision): its radii cover, steady traffic stays within
the stated false-alarm budget, stated shifts are caught within a stated number of days, and edge cases."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.stats import norm, poisson

from quiver.monitoring.drift import DriftConfig, compute_drift
from quiver.monitoring.drift_decision import (
    BoundedEffect,
    daily_alpha,
    dkw_radius,
    pooled_counts,
    total_variation,
    total_variation_radius,
)

CATEGORIES = np.array(["grocery", "fuel", "travel", "fashion", "digital"])
MIX = np.array([0.4, 0.25, 0.15, 0.12, 0.08])
# "a category share moving 0.2": grocery 0.4 → 0.2, digital 0.08 → 0.28 (total variation 0.2)
MOVED_MIX = np.array([0.2, 0.25, 0.15, 0.12, 0.28])


def traffic(rng: np.random.Generator, n: int, *, mean_shift: float = 0.0,
            mix: np.ndarray = MIX) -> pd.DataFrame:
    """One day of a model's traffic: three numerical features (one discrete), two categorical."""
    return pd.DataFrame({
        "score": rng.normal(mean_shift, 1.0, n),
        "amount": rng.lognormal(3.0, 0.8, n),
        "count_1h": rng.poisson(3, n),
        "category": rng.choice(CATEGORIES, n, p=mix),
        "is_online": rng.random(n) < 0.3,
    })


def false_alerts(days: int, rows: int, config: DriftConfig, seed: int) -> int:
    rng = np.random.default_rng(seed)
    reference = traffic(rng, 14 * rows)  # a reference of 14 whole days
    return sum(compute_drift(reference, traffic(rng, rows), config=config, workers=1).dataset_drift
               for _ in range(days))


# -- the radii themselves: the probability statements the promise rests on ---------------------------------


def test_dkw_radius_covers_continuous_and_discrete_samples() -> None:
    rng = np.random.default_rng(0)
    alpha, trials, n = 0.1, 400, 200
    radius = dkw_radius(n, alpha)
    misses_normal = misses_poisson = 0
    support = np.arange(0, 30)
    for _ in range(trials):
        x = np.sort(rng.normal(size=n))
        cdf = norm.cdf(x)
        i = np.arange(1, n + 1)
        misses_normal += max(np.max(i / n - cdf), np.max(cdf - (i - 1) / n)) > radius
        counts = np.bincount(rng.poisson(3, n), minlength=support.size)[: support.size]
        misses_poisson += np.max(np.abs(np.cumsum(counts) / n - poisson.cdf(support, 3))) > radius
    # ≤ α of the trials may miss: 40 expected at most; 60 is > 3 sd above that, unreachable if the bound holds.
    assert misses_normal <= 60 and misses_poisson <= 60


def test_total_variation_radius_covers_multinomial_samples() -> None:
    rng = np.random.default_rng(1)
    alpha, trials, n = 0.1, 400, 200
    radius = total_variation_radius(n, MIX.size, alpha)
    misses = sum(total_variation(rng.multinomial(n, MIX), MIX) > radius for _ in range(trials))
    assert misses <= 60
    assert total_variation_radius(n, 1, alpha) == 0.0
    assert total_variation_radius(0, 5, alpha) == math.inf


def test_radii_shrink_with_rows_and_grow_with_confidence() -> None:
    assert dkw_radius(1_000_000, 1e-4) < dkw_radius(1_000, 1e-4) < dkw_radius(1_000, 1e-6)
    assert dkw_radius(1_000, 0.05) == pytest.approx(math.sqrt(math.log(40) / 2_000))
    assert daily_alpha(0.5) == pytest.approx(0.5 / 90)
    with pytest.raises(ValueError):
        daily_alpha(0)


# -- steady traffic: false dataset alerts within the stated budget ------------------------------------------


def test_steady_traffic_with_the_default_budget_raises_no_false_alerts() -> None:
    # Default promise: 0.5 false alerts per 90 days, δ_day = 0.0056. 150 days at 1k and 20 at 20k rows carry
    # ≤ 0.95 expected false alerts; 4 or more would happen with < 2 % chance if the promise holds.
    config = DriftConfig()
    assert false_alerts(150, 1_000, config, seed=2) + false_alerts(20, 20_000, config, seed=3) < 4


def test_steady_traffic_with_a_loose_budget_stays_within_it() -> None:
    # A loose budget (9 per 90 days: δ_day = 0.1) makes the per-day rate measurable: ≤ 15 expected over
    # 150 days; ≥ 30 would be > 3.8 sd above it.
    config = DriftConfig(false_alarms_per_90_days=9)
    assert false_alerts(150, 1_000, config, seed=4) < 30


def test_a_move_smaller_than_the_minimum_effect_is_not_an_alert() -> None:
    # 0.1 sd is a Kolmogorov distance of 0.04 < 0.1: on 20k rows the thresholds' PSI/KS may see it, the
    # decision must not alert on it (the promise covers traffic that moved less than the minimum effect).
    rng = np.random.default_rng(5)
    reference = traffic(rng, 280_000)
    days = [compute_drift(reference, traffic(rng, 20_000, mean_shift=0.1), workers=1) for _ in range(5)]
    assert not any(day.dataset_drift for day in days)
    assert all(day.feature("score").effect_lower is not None and day.feature("score").effect_lower < 0.1
               for day in days)


# -- stated shifts are detected ----------------------------------------------------------------------------


def days_to_detect(feature: str, shifted: dict[str, object], seed: int, rows: int = 1_000,
                   max_days: int = 10) -> int:
    rng = np.random.default_rng(seed)
    reference = traffic(rng, 14 * rows)
    for day in range(1, max_days + 1):
        report = compute_drift(reference, traffic(rng, rows, **shifted), workers=1)  # type: ignore[arg-type]
        if report.dataset_drift:
            assert [f.feature for f in report.drifted] == [feature]  # nothing else is blamed
            return day
    return max_days + 1


def test_a_half_sd_mean_shift_is_detected_within_3_days_at_1k_rows() -> None:
    # D = 2Φ(0.25) − 1 ≈ 0.197; detectable at 1k/day vs 14k reference ≈ 0.18.
    assert max(days_to_detect("score", {"mean_shift": 0.5}, seed) for seed in range(6)) <= 3


def test_a_category_share_moving_by_02_is_detected_within_4_days_at_1k_rows() -> None:
    assert max(days_to_detect("category", {"mix": MOVED_MIX}, seed) for seed in range(6)) <= 4


# -- unit cases --------------------------------------------------------------------------------------------


def test_bounded_is_the_default_and_the_dataset_drifts_when_any_feature_does() -> None:
    rng = np.random.default_rng(6)
    reference, current = traffic(rng, 20_000), traffic(rng, 5_000, mean_shift=1.0)
    report = compute_drift(reference, current)
    assert report.decision == "bounded"
    assert [f.feature for f in report.drifted] == ["score"]
    assert report.drift_share == pytest.approx(0.2) and report.dataset_drift  # 1 of 5 is enough
    old = compute_drift(reference, current, config=DriftConfig(decision="thresholds"))
    assert not old.dataset_drift  # the thresholds rule needs half the features
    assert report.rule == ("share 20%; drifted = effect shown above its minimum effect, at most 0.5 false alerts "
                           "per 90 days on steady traffic")
    assert old.rule == "share 20%, threshold 50%"
    score = report.feature("score").to_dict()
    assert score["effect_metric"] == "kolmogorov" and score["effect"] > score["effect_lower"] > 0.1
    assert 0.1 < score["detectable_effect"] < score["effect"]
    evidence = score["details"]["bounded"]  # stored with the run (drift_results.detail_json)
    assert evidence["drifted"] and evidence["alpha"] == pytest.approx(0.5 / 90 / 5)
    assert evidence["radius_ref"] < evidence["radius_cur"]  # 20k reference rows vs 5k current
    assert report.to_dict()["false_alarms_per_90_days"] == 0.5
    assert report.feature("category").effect_metric == "total_variation"


def test_per_feature_min_effect_and_thresholds_evidence_as_a_warning() -> None:
    rng = np.random.default_rng(7)
    reference, current = traffic(rng, 20_000), traffic(rng, 20_000, mean_shift=0.5)
    lenient = compute_drift(reference, current, config=DriftConfig(min_effects={"score": 0.5}))
    score = lenient.feature("score")
    assert score.status == "warn" and not lenient.dataset_drift  # PSI/KS still say it moved: a warning
    assert any(r.startswith("PSI") for r in score.reasons)
    with pytest.raises(ValueError, match="min_effect"):
        DriftConfig(min_effect=1.5)
    with pytest.raises(ValueError, match="decision"):
        DriftConfig(decision="vibes")


def test_tiny_samples_never_alarm() -> None:
    reference = pd.DataFrame({"x": [1.0, 2.0, 3.0, 4.0, 5.0], "c": list("aabbc")})
    current = pd.DataFrame({"x": [50.0, 60.0, 70.0], "c": list("zzz")})
    report = compute_drift(reference, current)
    assert {f.status for f in report.features} == {"insufficient_data"}
    assert not report.dataset_drift
    assert report.feature("x").effect == 1.0  # the effect is there, the evidence is not


def test_constant_and_all_null_features() -> None:
    reference = pd.DataFrame({"k": np.full(900, 7.0), "empty": np.full(900, np.nan)})
    same = compute_drift(reference, pd.DataFrame({"k": np.full(700, 7.0), "empty": np.full(700, np.nan)}))
    assert same.feature("k").status == "ok" and same.feature("k").effect == 0.0
    assert same.feature("empty").status == "skipped" and same.feature("empty").effect is None
    assert not same.dataset_drift
    moved = compute_drift(reference, pd.DataFrame({"k": np.full(700, 8.0), "empty": np.zeros(700)}))
    assert moved.feature("k").drifted and moved.dataset_drift


def test_more_features_widen_each_features_radius() -> None:
    # Bonferroni: the same pair judged among 20 features needs a larger effect than alone.
    rng = np.random.default_rng(8)
    one = pd.DataFrame({f"f{i}": rng.normal(size=2_000) for i in range(20)})
    two = pd.DataFrame({f"f{i}": rng.normal(size=2_000) for i in range(20)})
    alone = compute_drift(one, two, ["f0"]).feature("f0")
    among = compute_drift(one, two).feature("f0")
    assert alone.effect == among.effect
    assert alone.detectable_effect is not None and among.detectable_effect is not None
    assert among.detectable_effect > alone.detectable_effect


def test_many_categories_are_pooled_beyond_the_cap() -> None:
    ref, cur = pooled_counts(np.arange(30, 0, -1), np.arange(1, 31), max_categories=5)
    assert ref.tolist() == [30, 29, 28, 27, sum(range(1, 27))]
    assert cur.tolist() == [1, 2, 3, 4, sum(range(5, 31))]
    effect = BoundedEffect("total_variation", 0.3, 0.05, 0.1, 0.1, 0.01)
    assert effect.lower == pytest.approx(0.15) and effect.drifted
    assert effect.detectable == pytest.approx(0.25)


def test_monitoring_yaml_drift_settings_are_read_checked_and_applied(tmp_path: Path) -> None:
    from quiver.catalog.errors import QuiverError
    from quiver.config import load_config
    from quiver.monitoring.settings import load_settings

    (tmp_path / "quiver.yaml").write_text("project: p\n")
    config = load_config(tmp_path / "quiver.yaml")
    default = load_settings(config).drift_config()
    assert (default.decision, default.min_effect, default.false_alarms_per_90_days) == ("bounded", 0.1, 0.5)
    (tmp_path / "monitoring.yaml").write_text(
        "drift_decision: thresholds\ndrift_min_effect: 0.2\ndrift_min_effects: {amount: 0.3}\n"
        "drift_false_alarms_per_90_days: 1\n")
    applied = load_settings(config).drift_config(DriftConfig(numerical_methods=("psi",)))
    assert (applied.decision, applied.min_effect, applied.min_effect_for("amount"),
            applied.false_alarms_per_90_days, applied.numerical_methods) == ("thresholds", 0.2, 0.3, 1.0, ("psi",))
    for bad in ("drift_decision: maybe\n", "drift_min_effect: 2\n", "drift_false_alarms_per_90_days: 0\n"):
        (tmp_path / "monitoring.yaml").write_text(bad)
        with pytest.raises(QuiverError, match="drift settings"):
            load_settings(config)
