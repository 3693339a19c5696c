"""The bounded drift decision: a feature drifts only when its effect is shown to exceed a minimum effect.

The promise. With the defaults, *on traffic whose distribution moved by at most the minimum effect from the
reference's, a model gets at most X false dataset-drift alerts per 90 days in expectation* (X =
`false_alarms_per_90_days`, default 0.5), at any daily volume: 1k rows or 1M rows.

How it is kept:

* Per feature an effect size that means the same thing at every sample size, with bounds that hold at every n:
  - numerical → the Kolmogorov distance D = sup_x |F_ref(x) − F_cur(x)| (the KS statistic, already computed by
    the check). Each empirical CDF lies within r = √(ln(2/δ_side) / (2n)) of its true CDF with probability
    ≥ 1 − δ_side (Dvoretzky–Kiefer–Wolfowitz with Massart's constant: valid for every n and for discrete data,
    ties and constants included), so the true D ≥ D̂ − r_ref − r_cur. D is scale-free (a unit change or a log
    transform does not change it), reads as "the largest share of rows that changed side of some value", and
    has these exact finite-sample bounds; Wasserstein would need a bounded range or a tail assumption.
  - categorical → the total variation TV = ½ Σ |p_ref − p_cur| (the largest share of rows whose category
    would have to change). Its per-side radius is the smaller of Weissman et al. (2003),
    √((ln(2^k − 2) + ln(1/δ_side)) / (2n)), and McDiarmid's ½√((k − 1)/n) + √(ln(1/δ_side) / (2n)), both valid
    for every n; k is the number of cells. Values beyond the `max_categories − 1` most frequent in the
    reference are pooled into one "other" cell (pooling can only lower TV, so a lower bound stays one).
* The feature *drifts* when the lower bound D̂ − r_ref − r_cur exceeds its `min_effect` (default 0.1). Under
  "true effect ≤ min_effect" that needs one of the two samples outside its band: probability ≤ δ_feature.
* Across features: Bonferroni, δ_feature = δ_day / (features compared). The dataset drifts when at least one
  feature drifts, so P(false dataset alert on a day) ≤ δ_day whatever the features' dependence.
* Across days: δ_day = X / 90, so the expected number of false alerts over any 90 days is ≤ 90 · δ_day = X
  (linearity of expectation: it holds even though every day shares the same reference sample).

Assumptions: the rows of a day are independent draws from that day's distribution and the reference's rows
from its distribution (rows of one entity that repeat heavily within a day break this — compare per-entity
samples then); the reference is fixed and its own sampling error is in the bound (r_ref); a day is compared
whole against a reference of whole days, so the hour-of-day mix is the same on both sides (a partial day
against whole days is a real distribution change and may alert). Nulls are not part of the effect (the null
share is reported and warns on its own).

`detectable_effect` = min_effect + r_ref + r_cur is the smallest true effect the rule can flag on that day's
sizes: a quiet day proves that nothing moved by more than that (at the same confidence).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from quiver.monitoring.stats import CategoricalPair, NumericPair

DEFAULT_MIN_EFFECT = 0.1
DEFAULT_FALSE_ALARMS_PER_90_DAYS = 0.5
DEFAULT_MAX_CATEGORIES = 20
BUDGET_DAYS = 90
KOLMOGOROV = "kolmogorov"
TOTAL_VARIATION = "total_variation"


def daily_alpha(false_alarms_per_90_days: float) -> float:
    """δ_day: the chance of a false dataset alert allowed on one day."""
    if not 0 < false_alarms_per_90_days < BUDGET_DAYS:
        raise ValueError(f"false_alarms_per_90_days must lie in (0, {BUDGET_DAYS}), got {false_alarms_per_90_days}")
    return false_alarms_per_90_days / BUDGET_DAYS


def feature_alpha(day_alpha: float, n_features: int) -> float:
    """δ_feature = δ_day / n (Bonferroni over the features compared)."""
    return day_alpha / max(1, n_features)


def dkw_radius(n: int, alpha: float) -> float:
    """r with P(sup |F̂_n − F| > r) ≤ alpha (two-sided DKW, Massart's constant); inf for an empty sample."""
    if n <= 0:
        return math.inf
    return math.sqrt(math.log(2 / alpha) / (2 * n))


def total_variation_radius(n: int, cells: int, alpha: float) -> float:
    """r with P(TV(p̂_n, p) > r) ≤ alpha for a distribution on `cells` cells (the smaller of two valid bounds)."""
    if n <= 0:
        return math.inf
    if cells <= 1:
        return 0.0  # one cell: the empirical distribution is the true one
    log_alpha = math.log(1 / alpha)
    log_sets = cells * math.log(2) + math.log1p(-2.0 ** (1 - cells))  # ln(2^k − 2)
    weissman = math.sqrt((log_sets + log_alpha) / (2 * n))
    mcdiarmid = 0.5 * math.sqrt((cells - 1) / n) + math.sqrt(log_alpha / (2 * n))
    return min(weissman, mcdiarmid)


@dataclass(frozen=True)
class BoundedEffect:
    """One feature's effect, its lower confidence bound and the decision it supports."""

    metric: str  # kolmogorov | total_variation
    effect: float
    radius_ref: float
    radius_cur: float
    min_effect: float
    alpha: float  # δ_feature: both radii together fail with at most this probability

    @property
    def lower(self) -> float:
        """Lower confidence bound of the true effect (≥ 0)."""
        return max(0.0, self.effect - self.radius_ref - self.radius_cur)

    @property
    def upper(self) -> float:
        return min(1.0, self.effect + self.radius_ref + self.radius_cur)

    @property
    def detectable(self) -> float:
        """The smallest true effect this rule can flag at these sample sizes."""
        return self.min_effect + self.radius_ref + self.radius_cur

    @property
    def drifted(self) -> bool:
        return self.effect - self.radius_ref - self.radius_cur > self.min_effect

    @property
    def decidable(self) -> bool:
        """False when no possible effect (≤ 1) could be flagged: the samples are too small to judge."""
        return self.detectable < 1.0

    def reason(self) -> str:
        name = "Kolmogorov D" if self.metric == KOLMOGOROV else "total variation"
        verb = ">" if self.drifted else "≤"
        return (f"{name} {self.effect:.3f}, lower bound {self.lower:.3f} {verb} min effect {self.min_effect:g} "
                f"(detectable ≥ {self.detectable:.3f}, δ={self.alpha:.1e})")

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "effect": self.effect, "lower": self.lower, "upper": self.upper,
                "radius_ref": self.radius_ref, "radius_cur": self.radius_cur, "min_effect": self.min_effect,
                "detectable": self.detectable, "alpha": self.alpha, "drifted": self.drifted}


def bounded_numeric(pair: NumericPair, min_effect: float, alpha: float) -> BoundedEffect:
    """Kolmogorov distance (the KS statistic, computed once per pair and cached) with DKW radii at α/2 a side."""
    distance, _ = pair.ks()
    return BoundedEffect(KOLMOGOROV, float(distance), dkw_radius(int(pair.ref.size), alpha / 2),
                         dkw_radius(int(pair.cur.size), alpha / 2), min_effect, alpha)


def pooled_counts(ref_counts: npt.ArrayLike, cur_counts: npt.ArrayLike,
                  max_categories: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Counts over at most `max_categories` cells: the reference's most frequent values, the rest in one cell."""
    ref, cur = np.asarray(ref_counts, dtype=np.int64), np.asarray(cur_counts, dtype=np.int64)
    if ref.size <= max_categories:
        return ref, cur
    order = np.argsort(-ref, kind="stable")
    kept, pooled = order[: max_categories - 1], order[max_categories - 1:]
    return (np.append(ref[kept], ref[pooled].sum()), np.append(cur[kept], cur[pooled].sum()))


def total_variation(ref_counts: npt.ArrayLike, cur_counts: npt.ArrayLike) -> float:
    ref, cur = np.asarray(ref_counts, dtype=np.float64), np.asarray(cur_counts, dtype=np.float64)
    return float(0.5 * np.abs(ref / ref.sum() - cur / cur.sum()).sum())


def bounded_categorical(pair: CategoricalPair, min_effect: float, alpha: float,
                        max_categories: int = DEFAULT_MAX_CATEGORIES) -> BoundedEffect:
    """Total variation over the (pooled) categories with multinomial radii at α/2 a side."""
    _, ref_counts, cur_counts = pair.counts()
    ref, cur = pooled_counts(ref_counts, cur_counts, max_categories)
    cells = int(ref.size)
    return BoundedEffect(TOTAL_VARIATION, total_variation(ref, cur),
                         total_variation_radius(int(ref.sum()), cells, alpha / 2),
                         total_variation_radius(int(cur.sum()), cells, alpha / 2), min_effect, alpha)


def bounded_effect(pair: NumericPair | CategoricalPair, min_effect: float, alpha: float,
                   max_categories: int = DEFAULT_MAX_CATEGORIES) -> BoundedEffect:
    if isinstance(pair, NumericPair):
        return bounded_numeric(pair, min_effect, alpha)
    return bounded_categorical(pair, min_effect, alpha, max_categories)


def any_drifted(effects: Sequence[BoundedEffect]) -> bool:
    """The dataset decision: at least one feature shown to move by more than its minimum effect."""
    return any(e.drifted for e in effects)
