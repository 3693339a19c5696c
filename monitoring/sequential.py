"""Anytime-valid tests: a judge may look after every batch and its false-alarm rate still stays at most α.

Every test here is a (super)martingale under its null, so Ville's inequality bounds P(ever rejecting) by α
however often, and whenever, one looks. Four kinds, each used where its assumptions hold:

* `mixture_interval` / `mixture_difference` — the normal-mixture sequential probability ratio test (mSPRT;
  Robbins 1970, Johari et al. 2017 "Peeking at A/B tests") for a mean or a difference of means whose
  variance is estimated. In information time I = 1 / Var(estimate) the score S = d·I behaves as a Brownian
  motion with drift θ, and mixing the likelihood ratio over θ ~ N(0, τ²) gives

      Λ = (1 + τ²I)^(-½) · exp(τ² S² / (2 (1 + τ²I))).

  H0: θ = 0 is rejected when Λ ≥ 1/α; inverting the test for every θ gives a confidence sequence d ± h with
  h² = (1 + τ²I) / (τ² I²) · (2 ln(1/α) + ln(1 + τ²I)). The variance is a plug-in estimate, so the guarantee
  is asymptotic; it is only as good as that variance, which is why clustered rows get a cluster-robust one
  (`quiver.monitoring.clustered`). τ is the effect size one cares about (a guardrail's floor).
* `BoundedMeanSequence` — the predictable plug-in empirical-Bernstein confidence sequence for the mean of
  observations in [0, 1] (Waudby-Smith & Ramdas 2023, "Estimating means of bounded random variables by
  betting", Theorem 2). Exact (no asymptotics) whenever the observations share their conditional mean,
  e.g. independent units in arrival order; the bets λ_i depend only on the past, so the bound is the same
  whether it is computed in one pass or batch by batch.
* `dkw_radius` — a time-uniform Dvoretzky–Kiefer–Wolfowitz band (Howard & Ramdas 2022, "Sequential
  estimation of quantiles", Theorem 2): with probability ≥ 1 − α, for every t ≥ t_min at once,
  sup_x |F̂_t(x) − F(x)| ≤ A·√((ln(1 + ln(t / t_min)) + C(α, A)) / t).
* `multinomial_sequential` — the Dirichlet-multinomial Bayes factor of Lindon & Malek (2022, "Anytime-valid
  inference for multinomial count data"), used for sample-ratio mismatch: counts against known expected
  shares p, prior Dirichlet(c·p). BF = B(c·p + x) / B(c·p) / Π p_i^x_i; reject when BF ≥ 1/α. The classic
  chi-square statistic and p-value are reported beside it (a fixed-sample test, not valid under peeking).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class MixtureResult:
    """A difference of means with its anytime-valid confidence sequence at level 1 − α."""

    estimate: float  # mean_a − mean_b
    lower: float
    upper: float
    log_likelihood_ratio: float
    alpha: float
    information: float

    @property
    def significant(self) -> bool:
        """H0 (no difference) rejected: the confidence sequence excludes 0."""
        return self.log_likelihood_ratio >= math.log(1 / self.alpha)

    def to_dict(self) -> dict[str, float | bool]:
        return {"estimate": self.estimate, "lower": self.lower, "upper": self.upper,
                "log_lr": self.log_likelihood_ratio, "alpha": self.alpha, "significant": self.significant}


def mixture_interval(estimate: float, variance: float, *, tau: float, alpha: float,
                     min_variance: float = 1e-12, scales: int = 1) -> MixtureResult:
    """mSPRT confidence sequence for a mean (or difference) `estimate` with estimated `variance`.

    A mixture is sharpest for effects near τ and slow far from it. `scales` > 1 runs the test at τ, 10τ,
    100τ, … each at α / scales and intersects the sequences (a union bound, so still valid at α): an effect
    100× the floor is then shown about as fast as one at the floor, for ln(scales) more in the bound."""
    if tau <= 0 or not 0 < alpha < 1 or scales < 1:
        raise ValueError(f"tau must be > 0, alpha in (0, 1) and scales >= 1, got tau={tau}, alpha={alpha}")
    if scales > 1:
        results = [mixture_interval(estimate, variance, tau=tau * 10**k, alpha=alpha / scales,
                                    min_variance=min_variance) for k in range(scales)]
        best = max(results, key=lambda r: r.log_likelihood_ratio - math.log(1 / r.alpha))
        return MixtureResult(estimate, max(r.lower for r in results), min(r.upper for r in results),
                             best.log_likelihood_ratio - math.log(scales), alpha, best.information)
    # No spread yet (e.g. zero errors so far, or identical paired scores) would give infinite information.
    information = 1.0 / max(variance, min_variance)
    t2i = tau * tau * information
    score = estimate * information
    log_lr = -0.5 * math.log1p(t2i) + tau * tau * score * score / (2 * (1 + t2i))
    half = math.sqrt((1 + t2i) / (tau * tau * information * information) * (2 * math.log(1 / alpha) + math.log1p(t2i)))
    return MixtureResult(estimate, estimate - half, estimate + half, log_lr, alpha, information)


def mixture_difference(mean_a: float, var_a: float, n_a: int, mean_b: float, var_b: float, n_b: int, *,
                       tau: float, alpha: float, min_variance: float = 1e-12) -> MixtureResult:
    """mSPRT for mean_a − mean_b from two independent samples of independent rows (see the module docstring)."""
    if n_a < 2 or n_b < 2:
        raise ValueError("mixture_difference needs at least 2 observations per sample")
    variance = max(var_a, min_variance) / n_a + max(var_b, min_variance) / n_b
    return mixture_interval(mean_a - mean_b, variance, tau=tau, alpha=alpha, min_variance=min_variance)


def mean_var(total: float, total_sq: float, n: int) -> tuple[float, float]:
    """Mean and unbiased variance from running sums (clipped at 0 against rounding)."""
    mean = total / n
    var = max(0.0, (total_sq - n * mean * mean) / (n - 1)) if n > 1 else 0.0
    return mean, var


def proportion_var(successes: int, n: int) -> tuple[float, float]:
    """Share and a smoothed Bernoulli variance: (x + ½)/(n + 1) keeps 0/n from claiming zero spread."""
    share = successes / n
    smoothed = (successes + 0.5) / (n + 1)
    return share, smoothed * (1 - smoothed)


@dataclass(frozen=True)
class MultinomialResult:
    """Counts tested against expected shares: anytime-valid Bayes factor plus the classic chi-square."""

    counts: tuple[int, ...]
    expected_shares: tuple[float, ...]
    log_bayes_factor: float
    alpha: float
    chi2: float
    chi2_pvalue: float

    @property
    def significant(self) -> bool:
        return self.log_bayes_factor >= math.log(1 / self.alpha)

    def to_dict(self) -> dict[str, object]:
        return {"counts": list(self.counts), "expected_shares": list(self.expected_shares),
                "log_bayes_factor": self.log_bayes_factor, "alpha": self.alpha, "chi2": self.chi2,
                "chi2_pvalue": self.chi2_pvalue, "significant": self.significant}


def multinomial_sequential(counts: Sequence[int], expected_shares: Sequence[float], *, alpha: float,
                           concentration: float = 100.0) -> MultinomialResult:
    """Lindon–Malek sequential test of counts ~ Multinomial(expected_shares) (see the module docstring)."""
    from scipy.special import chdtrc, gammaln

    x = np.asarray(counts, dtype=np.float64)
    p = np.asarray(expected_shares, dtype=np.float64)
    if x.shape != p.shape or x.ndim != 1 or len(x) < 2:
        raise ValueError("counts and expected_shares must be 1-d of the same length ≥ 2")
    if np.any(p <= 0) or not math.isclose(float(p.sum()), 1.0, rel_tol=1e-9):
        raise ValueError(f"expected shares must be positive and sum to 1, got {p.tolist()}")
    prior = concentration * p
    log_bf = float(gammaln(prior.sum()) - gammaln(prior.sum() + x.sum())
                   + np.sum(gammaln(prior + x) - gammaln(prior)) - np.sum(x * np.log(p)))
    n = float(x.sum())
    if n > 0:
        expected = n * p
        statistic = float(np.sum((x - expected) ** 2 / expected))
        pvalue = float(chdtrc(len(x) - 1, statistic))  # chi2.sf without its per-call overhead
    else:
        statistic, pvalue = 0.0, 1.0
    return MultinomialResult(tuple(int(v) for v in x), tuple(float(v) for v in p), log_bf, alpha, statistic,
                             pvalue)


@dataclass
class BoundedMeanSequence:
    """Predictable plug-in empirical-Bernstein confidence sequence for a mean of values in [0, 1].

    Feed observations in arrival order with `extend` (any batch sizes: the result is the same as one pass);
    `interval()` is the two-sided (1 − α) confidence sequence at the current time. The regularised running
    mean and variance (one fake observation at ½ and ¼) set the bets λ_i ∝ 1/√(σ̂²_{i−1} i ln(1 + i)),
    capped at `truncation` (WSR 2023 use ½). A caller may bet instead (`extend(values, bets)`): any
    predictable bets in [0, truncation] keep the sequence valid (the theorem needs nothing else), e.g. the
    same bets for two arms so that their intervals weigh the same moments alike."""

    alpha: float
    truncation: float = 0.5
    n: int = 0
    total: float = 0.0  # Σ x
    spread: float = 0.0  # Σ (x_i − μ̂_i)², for σ̂²
    bets: float = 0.0  # Σ λ
    bet_upper: float = 0.0  # Σ λ x  (for the lower bound of the mean)
    bet_lower: float = 0.0  # Σ λ (1 − x) (for the upper bound)
    penalty: float = 0.0  # Σ v_i ψ(λ_i), v_i = (x_i − μ̂_{i−1})²; symmetric in x ↔ 1 − x
    # The plug-in bets of the last `extend` before the cap (what a caller pacing other sequences reads).
    raw_bets: npt.NDArray[np.float64] = field(init=False, repr=False, default_factory=lambda: np.zeros(0))
    _log_term: float = field(init=False, repr=False, default=0.0)

    def __post_init__(self) -> None:
        if not 0 < self.alpha < 1 or not 0 < self.truncation < 1:
            raise ValueError("alpha and truncation must lie in (0, 1)")
        self._log_term = math.log(2 / self.alpha)  # each side at α/2

    def extend(self, values: npt.ArrayLike, bets: npt.ArrayLike | None = None) -> BoundedMeanSequence:
        """Observations in arrival order; `bets`: the caller's predictable λ_i (one per value), else plug-in."""
        x = np.asarray(values, dtype=np.float64)
        if x.size == 0:
            return self
        if x.ndim != 1 or np.any(x < 0) or np.any(x > 1) or not np.isfinite(x).all():
            raise ValueError("BoundedMeanSequence takes finite values in [0, 1]")
        i = self.n + np.arange(1, x.size + 1, dtype=np.float64)  # 1-based times of these observations
        mean_after = (0.5 + self.total + np.cumsum(x)) / (i + 1)  # μ̂_i
        mean_before = np.concatenate(([(0.5 + self.total) / (self.n + 1)], mean_after[:-1]))  # μ̂_{i−1}
        spread_after = self.spread + np.cumsum((x - mean_after) ** 2)
        var_before = (0.25 + np.concatenate(([self.spread], spread_after[:-1]))) / i  # σ̂²_{i−1}
        self.raw_bets = np.sqrt(2 * self._log_term / (var_before * i * np.log1p(i)))
        lam = np.minimum(self.raw_bets, self.truncation)
        if bets is not None:
            lam = np.asarray(bets, dtype=np.float64)
            if lam.shape != x.shape or not ((lam >= 0) & (lam <= self.truncation)).all():
                raise ValueError(f"bets must be one per value, each in [0, {self.truncation}]")
        psi = -np.log1p(-lam) - lam
        self.n += int(x.size)
        self.total += float(x.sum())
        self.spread = float(spread_after[-1])
        self.bets += float(lam.sum())
        self.bet_upper += float((lam * x).sum())
        self.bet_lower += float((lam * (1 - x)).sum())
        self.penalty += float(((x - mean_before) ** 2 * psi).sum())
        return self

    @property
    def mean(self) -> float:
        return self.total / self.n if self.n else math.nan

    def interval(self) -> tuple[float, float]:
        """(lower, upper) at level 1 − α; (0, 1) before any observation."""
        if self.n == 0 or self.bets <= 0:
            return 0.0, 1.0
        margin = (self._log_term + self.penalty) / self.bets
        lower = self.bet_upper / self.bets - margin
        upper = 1 - (self.bet_lower / self.bets - margin)
        return max(0.0, lower), min(1.0, upper)


def stretched(sequence: BoundedMeanSequence, stretch: float) -> tuple[float, float]:
    """`sequence`'s interval with each side moved away from its mean by the factor `stretch` (≥ 1: e.g. √ of a
    design effect), clipped to [0, 1]; (0, 1) before any observation."""
    lower, upper = sequence.interval()
    if sequence.n == 0:
        return lower, upper
    mean = sequence.mean
    return (max(0.0, mean - max(0.0, mean - lower) * stretch), min(1.0, mean + max(0.0, upper - mean) * stretch))


def difference_interval(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    """Confidence bounds of mean_a − mean_b from a (1 − α/2) sequence for each: [L_a − U_b, U_a − L_b]."""
    return a[0] - b[1], a[1] - b[0]


@lru_cache(maxsize=64)
def _dkw_constant(alpha: float, a: float) -> float:
    """C(α, A) of Howard & Ramdas 2022, Theorem 2: the smallest C whose error bound, minimised over the epoch
    ratio η, is α."""
    from scipy.optimize import brentq, minimize_scalar

    def error(c: float, eta: float) -> float:
        gamma_sq = 2 / eta * (a - math.sqrt(2 * (eta - 1) / c)) ** 2
        if gamma_sq <= 1:
            return math.inf
        return 4 * math.exp(-gamma_sq * c) * (1 + 1 / ((gamma_sq - 1) * math.log(eta)))

    def best(c: float) -> float:
        eta_max = brentq(lambda eta: math.sqrt(eta / 2) + math.sqrt(2 * (eta - 1) / c) - a, 1.0, 2 * a * a)
        found = minimize_scalar(lambda eta: error(c, eta), bounds=(1.0 + 1e-9, eta_max), method="bounded",
                                options={"xatol": 1e-10})
        return float(found.fun)

    low, high = 1.0, 5.0
    while best(high) > alpha:
        low, high = high, high * 2
    return float(brentq(lambda c: best(c) - alpha, low, high, xtol=1e-12))


def dkw_radius(t: float, alpha: float, *, t_min: float = 100.0, a: float = 0.85) -> float:
    """Time-uniform bound on sup |F̂_t − F| after t observations (inf below t_min); see the module docstring."""
    if not 0 < alpha < 1 or a <= 1 / math.sqrt(2) or t_min < 1:
        raise ValueError("need 0 < alpha < 1, a > 1/√2 and t_min ≥ 1")
    if t < t_min:
        return math.inf
    return a * math.sqrt((math.log1p(math.log(t / t_min)) + _dkw_constant(alpha, a)) / t)


def wasserstein_bounds(counts_a: npt.ArrayLike, counts_b: npt.ArrayLike, radius_a: float,
                       radius_b: float) -> tuple[float, float, float]:
    """Estimate and bounds of the Wasserstein-1 distance of two distributions on [0, 1] from equal-width bin
    counts, given sup-norm bands on each CDF (`dkw_radius`): W1 = ∫|F_a − F_b|, and every pair of CDFs
    inside the bands (clipped to [0, 1]) gives at most the upper and at least the lower value. Binning moves
    each value by less than a bin, so both bounds widen by two bin widths."""
    a, b = np.asarray(counts_a, dtype=np.float64), np.asarray(counts_b, dtype=np.float64)
    width = 1.0 / len(a)
    f_a, f_b = np.cumsum(a) / a.sum(), np.cumsum(b) / b.sum()
    low_a, high_a = np.clip(f_a - radius_a, 0, 1), np.clip(f_a + radius_a, 0, 1)
    low_b, high_b = np.clip(f_b - radius_b, 0, 1), np.clip(f_b + radius_b, 0, 1)
    estimate = float(np.abs(f_a - f_b).sum() * width)
    upper = float(np.maximum(high_a - low_b, high_b - low_a).sum() * width) + 2 * width
    lower = float(np.maximum(0.0, np.maximum(low_a - high_b, low_b - high_a)).sum() * width) - 2 * width
    return estimate, max(0.0, lower), min(1.0, upper)
