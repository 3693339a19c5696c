"""The canary judge's statistics: anytime-valid tests keep their false-alarm rate under peeking (by
simulation), and the judge advances / promotes a good canary, holds with too little data, rolls back a worse
one, and halts on a sample-ratio mismatch."""

from __future__ import annotations

import math

import numpy as np
import pytest

from quiver.monitoring.canary_judge import ArmStats, JudgeSettings, judge, score_edges_from
from quiver.monitoring.sequential import mixture_difference, multinomial_sequential

SETTINGS = JudgeSettings()
rng_edges = np.random.default_rng(0)
EDGES = score_edges_from(1 / (1 + np.exp(-rng_edges.normal(-2.5, 1.2, 50_000))), 10)


def test_mixture_confidence_sequence_is_the_inverted_test() -> None:
    r = mixture_difference(0.3, 1.0, 400, 0.1, 1.0, 600, tau=0.1, alpha=0.05)
    information = 1 / (1 / 400 + 1 / 600)
    t2i = 0.01 * information
    half = math.sqrt((1 + t2i) / (0.01 * information**2) * (2 * math.log(20) + math.log1p(t2i)))
    assert (r.lower, r.upper) == pytest.approx((0.2 - half, 0.2 + half))
    assert r.significant == (abs(0.2) > half)
    # On the boundary the likelihood ratio is exactly 1/alpha.
    edge = mixture_difference(half, 1.0, 400, 0.0, 1.0, 600, tau=0.1, alpha=0.05)
    assert edge.log_likelihood_ratio == pytest.approx(math.log(20))


def test_peeking_after_every_batch_keeps_false_alarms_below_alpha() -> None:
    # 600 A/A experiments, 40 looks each. The mixture test stays under alpha; a fixed-sample z-test at every
    # look (what interval-based judges do) does not.
    rng = np.random.default_rng(11)
    sims, looks, batch, alpha = 600, 40, 50, 0.05
    a = rng.normal(0, 1, (sims, looks * batch))
    b = rng.normal(0, 1, (sims, looks * batch))
    mixture_alarms = naive_alarms = 0
    for s in range(sims):
        mixture = naive = False
        for k in range(1, looks + 1):
            n = k * batch
            xa, xb = a[s, :n], b[s, :n]
            va, vb = xa.var(ddof=1), xb.var(ddof=1)
            if mixture_difference(xa.mean(), va, n, xb.mean(), vb, n, tau=0.2, alpha=alpha).significant:
                mixture = True
            if abs(xa.mean() - xb.mean()) / math.sqrt(va / n + vb / n) > 1.96:
                naive = True
        mixture_alarms += mixture
        naive_alarms += naive
    assert mixture_alarms / sims <= alpha
    assert naive_alarms / sims > 2 * alpha


def test_multinomial_test_keeps_its_level_and_finds_a_skewed_split() -> None:
    rng = np.random.default_rng(5)
    alarms = 0
    for _ in range(300):
        counts = np.zeros(2, dtype=int)
        for _ in range(30):
            canary = rng.binomial(200, 0.05)
            counts += (200 - canary, canary)
            if multinomial_sequential(counts.tolist(), [0.95, 0.05], alpha=0.05).significant:
                alarms += 1
                break
    assert alarms / 300 <= 0.05
    skewed = multinomial_sequential([9000, 1000], [0.95, 0.05], alpha=0.001)
    assert skewed.significant and skewed.chi2_pvalue < 1e-10


def arms(n: int, fraction: float, *, seed: int, canary_noise: float = 0.0, canary_shift: float = 0.0,
         canary_errors: float = 0.002, canary_latency: float = 3.0, entities_fraction: float | None = None,
         labeled: float = 1.0) -> tuple[ArmStats, ArmStats]:
    """Champion/canary statistics of n simulated requests; labels from the true model."""
    rng = np.random.default_rng(seed)
    z = rng.normal(-2.5, 1.2, n)
    p = 1 / (1 + np.exp(-z))
    y = (rng.random(n) < p).astype(float)
    y[rng.random(n) >= labeled] = np.nan
    canary = rng.random(n) < (fraction if entities_fraction is None else entities_fraction)
    canary_scores = 1 / (1 + np.exp(-(z + canary_shift + canary_noise * rng.normal(0, 1, n))))
    out = []
    for mask, scores, errors, latency in ((~canary, p, 0.002, 3.0), (canary, canary_scores, canary_errors,
                                                                     canary_latency)):
        m = int(mask.sum())
        failed = rng.random(m) < errors
        out.append(ArmStats.from_arrays(np.where(failed, np.nan, scores[mask]), y[mask],
                                        rng.lognormal(np.log(latency), 0.3, m), failed, m, EDGES))
    return out[0], out[1]


def test_a_good_canary_advances_and_is_promoted_at_the_last_judged_step() -> None:
    champion, canary = arms(400_000, 0.05, seed=1)
    first = judge(champion, canary, 0.05, SETTINGS)
    assert first.outcome == "advance" and first.next_fraction == 0.25
    assert {g.status for g in first.guardrails} == {"pass"}
    champion, canary = arms(160_000, 0.5, seed=2)
    last = judge(champion, canary, 0.5, SETTINGS)
    assert last.outcome == "promote" and last.next_fraction == 1.0


def test_too_little_data_holds_never_passes() -> None:
    champion, canary = arms(3_000, 0.05, seed=3)
    verdict = judge(champion, canary, 0.05, SETTINGS)
    assert verdict.outcome == "hold"
    assert all(g.status == "wait" for g in verdict.guardrails)
    empty = judge(ArmStats(), ArmStats(), 0.05, SETTINGS)
    assert empty.outcome == "hold" and "no traffic" in empty.reason
    # Plenty of traffic but labels not in yet: quality guardrails wait, the step holds.
    champion, canary = arms(400_000, 0.05, seed=4, labeled=0.0)
    unlabeled = judge(champion, canary, 0.05, SETTINGS)
    assert unlabeled.outcome == "hold"
    assert {g.name for g in unlabeled.guardrails if g.status == "wait"} == {"log_loss", "brier"}


def test_a_worse_canary_is_rolled_back() -> None:
    champion, canary = arms(400_000, 0.25, seed=5, canary_noise=1.5)
    verdict = judge(champion, canary, 0.25, SETTINGS)
    assert verdict.outcome == "rollback"
    assert "log_loss" in {g.name for g in verdict.guardrails if g.status == "fail"}


def test_errors_and_latency_fail_only_beyond_their_floors() -> None:
    champion, canary = arms(200_000, 0.25, seed=6, canary_errors=0.05)
    failing = {g.name for g in judge(champion, canary, 0.25, SETTINGS).guardrails if g.status == "fail"}
    assert failing == {"error_rate"}
    # 0.4 percentage points more errors: significant with this much data, but under the 1-point floor.
    champion, canary = arms(400_000, 0.5, seed=7, canary_errors=0.006)
    error = next(g for g in judge(champion, canary, 0.5, SETTINGS).guardrails if g.name == "error_rate")
    assert error.statistics["lower"] > 0 and error.status != "fail"
    champion, canary = arms(200_000, 0.25, seed=8, canary_latency=9.0)
    latency = next(g for g in judge(champion, canary, 0.25, SETTINGS).guardrails if g.name == "latency_p99")
    assert latency.status == "fail" and latency.statistics["canary_p99_ms"] > latency.statistics["champion_p99_ms"]


def test_sample_ratio_mismatch_halts() -> None:
    champion, canary = arms(100_000, 0.05, seed=9, entities_fraction=0.08)
    verdict = judge(champion, canary, 0.05, SETTINGS)
    assert verdict.outcome == "halt" and verdict.srm["significant"]
    assert verdict.srm["chi2_pvalue"] < 1e-6


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="steps"):
        JudgeSettings(steps=(0.1, 0.05, 1.0))
    with pytest.raises(ValueError, match="steps"):
        JudgeSettings(steps=(0.1, 0.5))
    with pytest.raises(ValueError, match="unknown judge settings"):
        JudgeSettings.from_dict({"stepz": [0.5, 1.0]})
    assert JudgeSettings.from_dict(SETTINGS.to_dict()) == SETTINGS
    assert SETTINGS.test_alpha == pytest.approx(0.05 / 15)


def test_a_better_canary_is_promoted_and_a_shifted_score_distribution_fails_psi() -> None:
    rng = np.random.default_rng(12)
    n = 200_000
    z = rng.normal(-2.5, 1.2, n)
    y = (rng.random(n) < 1 / (1 + np.exp(-z))).astype(float)
    canary = rng.random(n) < 0.5
    noisy = 1 / (1 + np.exp(-(z + rng.normal(0, 0.8, n))))  # the champion: a noisier model
    exact = 1 / (1 + np.exp(-z))  # the canary: the true model
    stats = []
    for mask, scores in ((~canary, noisy), (canary, exact)):
        m = int(mask.sum())
        stats.append(ArmStats.from_arrays(scores[mask], y[mask], np.full(m, 3.0), np.zeros(m, bool), m, EDGES))
    verdict = judge(stats[0], stats[1], 0.5, SETTINGS)
    assert verdict.outcome == "promote"
    log_loss = next(g for g in verdict.guardrails if g.name == "log_loss")
    assert log_loss.statistics["upper"] < 0  # significantly better, not merely not worse
    champion, shifted = arms(200_000, 0.5, seed=13, canary_shift=2.5)
    psi = next(g for g in judge(champion, shifted, 0.5, SETTINGS).guardrails if g.name == "score_psi")
    assert psi.status == "fail" and psi.statistics["psi"] > SETTINGS.psi_floor


def test_latency_counts_once_per_request_not_once_per_row() -> None:
    import pandas as pd

    from quiver.monitoring.canary_judge import stats_from_rows

    ts = pd.Timestamp("2026-11-03T12:00:00Z")
    frame = pd.DataFrame({
        "ts": [ts] * 200 + [ts + pd.Timedelta(seconds=1)] * 100, "latency_ms": [50.0] * 200 + [3.0] * 100,
        "prediction": 0.1, "label": np.nan, "error": "", "request_id": [f"r{i}" for i in range(300)],
        "key.user_id": np.arange(300)})
    stats = stats_from_rows(frame, EDGES, ["key.user_id"])
    assert stats.rows == 300 and stats.entities == 300
    assert stats.latency_counts.sum() == 2  # two requests, however many rows each scored
