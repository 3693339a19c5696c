"""Anytime-valid tests: a judge may look after every batch and its false-alarm rate still stays at most α.

Two tests, both martingales under the null, so Ville's inequality bounds P(ever rejecting) by α however
often, and whenever, one looks:

* `mixture_difference` — the normal-mixture sequential probability ratio test (mSPRT; Robbins 1970,
  Johari et al. 2017 "Peeking at A/B tests") for a difference of two means. In information time
  I = 1 / (s₁²/n₁ + s₀²/n₀) the score S = d·I of the observed difference d behaves as a Brownian motion
  with drift θ, and mixing the likelihood ratio over θ ~ N(0, τ²) gives

      Λ = (1 + τ²I)^(-½) · exp(τ² S² / (2 (1 + τ²I))).

  H0: θ = 0 is rejected when Λ ≥ 1/α. Inverting the test for every θ gives a confidence sequence
  d ± h with h² = (1 + τ²I) / (τ² I²) · (2 ln(1/α) + ln(1 + τ²I)). The variances are plug-in estimates, so the
  guarantee is asymptotic (as in Johari et al. and Waudby-Smith et al. 2021); `benchmarks/canary_judge.py`
  checks the false-alarm rate by simulation. τ is the effect size one cares about (a guardrail's floor):
  the test is most powerful near it.
* `multinomial_sequential` — the Dirichlet-multinomial Bayes factor of Lindon & Malek (2022, "Anytime-valid
  inference for multinomial count data"), used for sample-ratio mismatch: counts against known expected
  shares p, prior Dirichlet(c·p). BF = B(c·p + x) / B(c·p) / Π p_i^x_i; reject when BF ≥ 1/α. The classic
  chi-square statistic and p-value are reported beside it (a fixed-sample test, not valid under peeking).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


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


def mixture_difference(mean_a: float, var_a: float, n_a: int, mean_b: float, var_b: float, n_b: int, *,
                       tau: float, alpha: float, min_variance: float = 1e-12) -> MixtureResult:
    """mSPRT for mean_a − mean_b from two independent samples (see the module docstring)."""
    if n_a < 2 or n_b < 2:
        raise ValueError("mixture_difference needs at least 2 observations per sample")
    if tau <= 0 or not 0 < alpha < 1:
        raise ValueError(f"tau must be > 0 and alpha in (0, 1), got tau={tau}, alpha={alpha}")
    # A sample with no spread (e.g. zero errors so far) would give infinite information: floor it.
    variance = max(var_a, min_variance) / n_a + max(var_b, min_variance) / n_b
    information = 1.0 / variance
    d = mean_a - mean_b
    t2i = tau * tau * information
    score = d * information
    log_lr = -0.5 * math.log1p(t2i) + tau * tau * score * score / (2 * (1 + t2i))
    half = math.sqrt((1 + t2i) / (tau * tau * information * information) * (2 * math.log(1 / alpha) + math.log1p(t2i)))
    return MixtureResult(d, d - half, d + half, log_lr, alpha, information)


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
