"""The vectorised drift statistics equal Evidently 0.7.23's own functions (to 1e-9) on randomized data."""

from __future__ import annotations

# Plain imports, no importorskip: evidently is pinned in requirements/main.txt, so a broken install fails.
import evidently.legacy.calculations.stattests as ev
import numpy as np
import pandas as pd
import pytest
from evidently.legacy.calculations.stattests.registry import get_stattest
from evidently.legacy.core import ColumnType
from scipy.stats import distributions, ks_2samp

from quiver.monitoring.stats import (
    CategoricalPair,
    NumericPair,
    evidently_default_method,
    fill_empty,
    jensenshannon_from_shares,
    ks_asymptotic_pvalue,
    psi_from_shares,
)

NUM, CAT = ColumnType.Numerical, ColumnType.Categorical
TOL = 1e-9


def close(ours: float, theirs: float) -> bool:
    """Equal to 1e-9: absolute for values ≤ 1 (p-values, small scores), relative above."""
    return bool(abs(ours - theirs) <= TOL * max(1.0, abs(theirs)))


def sample(rng: np.random.Generator, kind: int, n: int, shift: float) -> np.ndarray:
    if kind == 0:
        return rng.normal(shift, 1.0, n)
    if kind == 1:  # integers with few distinct values: Evidently bins per value
        return rng.integers(0, 12, n).astype(float) + (shift > 0.3)
    if kind == 2:  # rounded: many ties
        return np.round(rng.normal(shift, 1.0, n), 1)
    if kind == 3:  # heavy tail: most Sturges bins empty on one side
        return rng.pareto(1.5 + shift, n) ** 2
    return np.round(rng.exponential(1.0 + shift, n), 3)  # ties + skew


@pytest.mark.parametrize("seed", range(8))
def test_numeric_scores_equal_evidently(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(12):
        kind = int(rng.integers(0, 5))
        n1, n2 = (int(rng.choice([3, 25, 400, 5_000, 30_000])) for _ in range(2))
        shift = float(rng.choice([0.0, 0.05, 0.5]))
        x, y = sample(rng, kind, n1, 0.0), sample(rng, kind, n2, shift)
        pair, xs, ys = NumericPair(x, y), pd.Series(x), pd.Series(y)
        ref_shares, cur_shares = pair.binned_shares()
        context = f"kind={kind} n={n1}/{n2} shift={shift}"
        assert close(psi_from_shares(ref_shares, cur_shares),
                     ev.psi_stat_test(xs, ys, NUM, None).drift_score), context
        assert close(jensenshannon_from_shares(ref_shares, cur_shares),
                     ev.jensenshannon_stat_test(xs, ys, NUM, None).drift_score), context
        d, p = pair.ks()
        assert close(p, ev.ks_stat_test(xs, ys, NUM, None).drift_score), context
        assert d == ks_2samp(x, y).statistic, context
        assert close(pair.wasserstein_norm(), ev.wasserstein_stat_test(xs, ys, NUM, None).drift_score), context


def test_integer_columns_use_numpys_integer_bin_width() -> None:
    # 21+ distinct ints over a range narrower than log2(n)+1: numpy widens integer bins to 1.
    rng = np.random.default_rng(11)
    x = rng.integers(0, 22, 600_000)
    y = rng.integers(1, 22, 500_000)
    pair = NumericPair(x.astype(float), y.astype(float), integer=True)
    ours = psi_from_shares(*pair.binned_shares())
    assert pair.sturges_edges().size - 1 == 21  # one bin per unit, not ceil(log2(n) + 1)
    assert close(ours, ev.psi_stat_test(pd.Series(x), pd.Series(y), NUM, None).drift_score)


def test_large_samples_and_mild_drift_equal_evidently() -> None:
    # Above 10,000 values KS switches to the asymptotic p-value; mild drift hits scipy's slow smirnov branch.
    rng = np.random.default_rng(3)
    for shift in (0.0, 0.01, 0.02, 0.3):
        x, y = rng.normal(0, 1, 200_000), rng.normal(shift, 1, 150_000)
        pair = NumericPair(x, y)
        d, p = pair.ks()
        reference = ks_2samp(x, y)
        assert d == reference.statistic
        assert close(p, reference.pvalue), shift
        assert close(psi_from_shares(*pair.binned_shares()),
                     ev.psi_stat_test(pd.Series(x), pd.Series(y), NUM, None).drift_score)


def test_ks_bucket_search_is_exact_with_heavy_ties() -> None:
    rng = np.random.default_rng(4)
    x = rng.integers(0, 40, 80_000).astype(float)  # every value repeats thousands of times
    y = np.concatenate([rng.integers(0, 40, 60_000), np.full(5_000, 17)]).astype(float)
    d, _ = NumericPair(x, y).ks()
    assert d == ks_2samp(x, y).statistic


def test_heavy_tails_and_signed_zeros_stay_exact() -> None:
    # Cauchy and lognormal crowd equal-width buckets; the bit-pattern bucketing must stay exact, with
    # -0.0 and +0.0 (equal values) and ties included.
    rng = np.random.default_rng(12)
    cases = [
        (rng.standard_cauchy(120_000), rng.standard_cauchy(90_000) * 1.05),
        (rng.lognormal(3, 1.5, 150_000), rng.lognormal(3.02, 1.5, 150_000)),
        (np.concatenate([np.round(rng.standard_cauchy(50_000), 2), np.full(500, -0.0)]),
         np.concatenate([np.round(rng.standard_cauchy(40_000), 2), np.zeros(700)])),
        (-rng.pareto(1.2, 60_000) - 5, -rng.pareto(1.3, 60_000) - 5),
    ]
    for x, y in cases:
        pair = NumericPair(x, y)
        d, p = pair.ks()
        reference = ks_2samp(x, y)
        assert d == reference.statistic
        assert close(p, reference.pvalue)
        assert close(psi_from_shares(*pair.binned_shares()),
                     ev.psi_stat_test(pd.Series(x), pd.Series(y), NUM, None).drift_score)


@pytest.mark.parametrize("n", [20_001, 50_000, 333_333])
def test_ks_asymptotic_pvalue_matches_kstwo(n: int) -> None:
    for nd2 in (0.5, 2.2, 5.0, 30.0, 200.0, 369.0):
        d = float(np.sqrt(nd2 / n))
        ours = ks_asymptotic_pvalue(d, 2 * n, 2 * n)  # en = n
        theirs = float(np.clip(distributions.kstwo.sf(d, float(n)), 0, 1))
        assert abs(ours - theirs) <= 1e-9 * max(theirs, 1e-300) or abs(ours - theirs) < 1e-300, (n, nd2)


@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")  # chi-square of a category new in current
def test_categorical_scores_equal_evidently() -> None:
    rng = np.random.default_rng(5)
    for trial in range(20):
        k = int(rng.integers(2, 30))
        cats = [f"c{i}" for i in range(k)]
        p_ref = rng.dirichlet(np.ones(k))
        p_cur = rng.dirichlet(np.ones(k)) if trial % 2 else p_ref
        x = pd.Series(rng.choice(cats, int(rng.integers(5, 3_000)), p=p_ref))
        y = pd.Series(rng.choice([*cats, "new"], int(rng.integers(5, 3_000)),
                                 p=np.append(p_cur * 0.97, 0.03)))
        pair = CategoricalPair(x, y)
        ref_shares, cur_shares = pair.binned_shares()
        assert close(psi_from_shares(ref_shares, cur_shares), ev.psi_stat_test(x, y, CAT, None).drift_score)
        assert close(jensenshannon_from_shares(ref_shares, cur_shares),
                     ev.jensenshannon_stat_test(x, y, CAT, None).drift_score)
        assert close(pair.chisquare(), ev.chi_stat_test(x, y, CAT, None).drift_score)


def test_z_test_equals_evidently() -> None:
    rng = np.random.default_rng(6)
    for _ in range(10):
        x = pd.Series(rng.choice(["a", "b"], 500, p=[0.3, 0.7]))
        share = rng.uniform(0.2, 0.5)
        y = pd.Series(rng.choice(["a", "b"], 400, p=[share, 1 - share]))
        assert close(CategoricalPair(x, y).z_test(), ev.z_stat_test(x, y, CAT, None).drift_score)
    same = pd.Series(["a"] * 20)
    assert CategoricalPair(same, same).z_test() == ev.z_stat_test(same, same, CAT, None).drift_score == 1


def test_constant_columns() -> None:
    x, y = np.full(500, 3.0), np.full(700, 3.0)
    pair = NumericPair(x, y)
    assert psi_from_shares(*pair.binned_shares()) == 0.0
    assert pair.ks() == (0.0, 1.0)
    assert close(pair.wasserstein_norm(), 0.0)
    moved = np.append(np.full(699, 3.0), 4.0)
    assert close(psi_from_shares(*NumericPair(x, moved).binned_shares()),
                 ev.psi_stat_test(pd.Series(x), pd.Series(moved), NUM, None).drift_score)


def test_empty_bin_fill_rule() -> None:
    # 1e-4 normally; min(non-zero)/1e6 when the smallest non-zero share is <= 1e-4.
    assert fill_empty(np.array([0.5, 0.5, 0.0]))[2] == 0.0001
    assert fill_empty(np.array([0.99995, 0.00005, 0.0]))[2] == 0.00005 / 10**6


def test_auto_method_matches_evidentlys_choice() -> None:
    rng = np.random.default_rng(7)
    cases = [(NUM, rng.normal(size=800)), (NUM, rng.normal(size=5_000)), (NUM, rng.integers(0, 3, 800) * 1.0),
             (NUM, rng.integers(0, 5, 5_000) * 1.0), (CAT, rng.choice(list("ab"), 900)),
             (CAT, rng.choice(list("abc"), 900)), (CAT, rng.choice(list("abcd"), 3_000))]
    for column_type, values in cases:
        x, y = pd.Series(values), pd.Series(values[::-1])
        ours = evidently_default_method("numerical" if column_type == NUM else "categorical", len(x),
                                        int(pd.concat([x, y]).nunique()))
        assert ours == get_stattest(x, y, column_type, None).name
