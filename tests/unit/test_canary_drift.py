"""The canary judge on drifting traffic and on calls of different sizes (issue 30, items 2 and 4): a shift both
arms share must cancel, and a canary whose rows fail more often must not look better because its calls are
smaller. Pure statistics: arrays in, decisions out."""

from __future__ import annotations

import numpy as np

from quiver.monitoring.canary_stats import JudgeSettings, StepStats, judge, latency_threshold
from quiver.monitoring.concurrent import ConcurrentDifference, LatencyThreshold

SETTINGS = JudgeSettings(require_labels=False)


def guardrail(stats: StepStats, name: str, fraction: float) -> tuple[str, dict[str, float]]:
    result = next(g for g in judge(stats, fraction).guardrails if g.name == name)
    return result.status, result.statistics


def drifting_step(rng: np.random.Generator, *, requests: int, fraction: float, latency_rise: float,
                  reference: float) -> StepStats:
    """A/A step of one-user requests whose latency (both arms) rises ×e^latency_rise over the step."""
    stats = StepStats(SETTINGS, reference)
    for start in range(0, requests, 2_000):
        n = min(2_000, requests - start)
        request = start + np.arange(n)
        on_canary = rng.random(n) < fraction
        latency = rng.lognormal(np.log(3.0), 0.3, n) * np.exp(latency_rise * request / requests)
        stats.add_served(request, request, on_canary, np.full(n, 0.1), np.zeros(n, bool), latency)
    return stats


def test_latency_that_drifts_for_both_arms_does_not_keep_a_healthy_canary_waiting() -> None:
    # The threshold used to be fixed from the hour before the rollout: once latency rose, both arms exceeded
    # it a large share of the time and the difference could never narrow below the floor (a timeout). Each
    # call's threshold now follows the champion's recent p99, so both arms exceed it ~1 % of the time.
    rng = np.random.default_rng(41)
    reference = latency_threshold(rng.lognormal(np.log(3.0), 0.3, 5_000), SETTINGS)
    assert reference is not None
    stats = drifting_step(rng, requests=120_000, fraction=0.05, latency_rise=1.0, reference=reference)
    status, statistics = guardrail(stats, "latency_p99", 0.05)
    assert status == "pass", statistics
    assert statistics["lower"] <= 0 <= statistics["upper"]
    assert statistics["threshold_ms"] > 2 * reference - SETTINGS.latency_p99_floor_ms  # it followed the drift
    assert stats.champion.slow.mean < 0.03  # against the fixed reference, most late calls were "slow"


def test_a_slower_canary_is_still_caught_while_latency_drifts() -> None:
    rng = np.random.default_rng(42)
    stats = StepStats(SETTINGS, 10.0)
    requests = 60_000
    for start in range(0, requests, 2_000):
        request = start + np.arange(2_000)
        on_canary = rng.random(2_000) < 0.05
        latency = rng.lognormal(np.log(3.0), 0.3, 2_000) * np.exp(request / requests) * np.where(on_canary, 3, 1)
        stats.add_served(request, request, on_canary, np.full(2_000, 0.1), np.zeros(2_000, bool), latency)
    assert guardrail(stats, "latency_p99", 0.05)[0] == "fail"


def test_a_trend_both_arms_share_cancels_block_by_block() -> None:
    # Failure chance rising from 0 to 20 % over the step for both arms, canary at 5 %. Each arm's own betting
    # sequence weighs its early calls most, and the canary's early calls span 19× the time of the champion's:
    # the per-arm centres differ by the trend. On one clock of blocks (a champion run and the canary calls
    # right after it) both arms' k-th observations come from the same moment.
    rng = np.random.default_rng(43)
    n = 200_000
    time = np.arange(n) / n
    canary = rng.random(n) < 0.05
    failed = (rng.random(n) < 0.2 * time).astype(np.float64)
    difference = ConcurrentDifference(0.01).extend(failed[:70_000], canary[:70_000]).extend(failed[70_000:],
                                                                                             canary[70_000:])
    lower, upper = difference.interval()
    assert lower <= 0 <= upper and abs(difference.mean) < 0.01
    one_pass = ConcurrentDifference(0.01).extend(failed, canary)
    assert np.allclose(one_pass.interval(), (lower, upper), rtol=0, atol=1e-12)  # batches change nothing
    assert one_pass.blocks > 0.9 * canary.sum()  # about one block per canary call at 5 %


def test_a_block_holds_both_arms_and_the_open_one_waits() -> None:
    d = ConcurrentDifference(0.05)
    d.extend([1.0, 0.0], [True, True])  # canary calls before any champion call: one open block
    assert d.blocks == 0
    d.extend([0.0, 0.0], [False, False])  # the champion joins it
    d.extend([0.0], [True])
    assert d.blocks == 0  # still open: more canary calls may come
    d.extend([0.0], [False])  # a champion call after the canary run closes it
    assert d.blocks == 1 and abs(d.mean - ((1.0 + 0.0 + 0.0) / 3 - 0.0)) < 1e-12


def test_the_latency_threshold_is_the_reference_until_a_chunk_then_the_champions_recent_p99() -> None:
    threshold = LatencyThreshold(reference_ms=9.0, floor_ms=2.0, chunk=100, window_chunks=2)
    first = threshold.thresholds(np.full(150, 5.0), np.zeros(150, bool))
    assert (first[:100] == 9.0).all()  # the reference, until the champion's first 100 calls
    assert (first[100:] == 5.0 + 2.0).all()  # their p99 + the floor
    canary_calls = threshold.thresholds(np.full(10, 500.0), np.ones(10, bool))
    assert (canary_calls == 7.0).all()  # the canary's calls never move the threshold
    later = threshold.thresholds(np.full(100, 50.0), np.zeros(100, bool))
    assert (later[:50] == 7.0).all()  # still chunk 1: only calls before the chunk count
    assert (later[50:] == 52.0).all()  # chunk 2: the last two chunks (150 × 5 ms, 50 × 50 ms)
    assert threshold.current_ms() == 52.0


def test_the_latency_threshold_keeps_only_the_chunks_it_can_still_read() -> None:
    """A long step's threshold holds ~window_chunks × chunk latencies, and answers as if it kept every call."""
    rng = np.random.default_rng(4)
    threshold = LatencyThreshold(reference_ms=9.0, floor_ms=2.0, chunk=100, window_chunks=2)
    every: list[float] = []
    for _ in range(60):
        n = int(rng.integers(1, 400))
        latency, on_canary = rng.gamma(2.0, 5.0, n), rng.random(n) < 0.1
        got = threshold.thresholds(latency, on_canary)
        for value, canary, limit in zip(latency, on_canary, got, strict=True):
            chunk = len(every) // 100
            window = every[max(0, (chunk - 2) * 100): chunk * 100]
            assert limit == (9.0 if chunk == 0 else float(np.quantile(window, 0.99)) + 2.0)
            if not canary:
                every.append(float(value))
        assert len(threshold._history) <= 3 * 100
    assert len(every) > 5_000


def row_failure_step(rng: np.random.Generator, *, requests: int, canary_hazard: float,
                     champion_hazard: float) -> StepStats:
    """20-user requests at a 5 % step; a call fails with 1 − (1 − h)^rows: each row may break it."""
    stats = StepStats(SETTINGS, 20.0)
    users = 20
    for start in range(0, requests, 2_000):
        n = min(2_000, requests - start)
        request = start + np.repeat(np.arange(n), users)
        user = request * users + np.tile(np.arange(users), n)
        on_canary = (user * 2_654_435_761 % 2**32) / 2**32 < 0.05
        call = 2 * request + on_canary
        _, first, inverse, size = np.unique(call, return_index=True, return_inverse=True, return_counts=True)
        hazard = np.where(on_canary[first], canary_hazard, champion_hazard)
        failed = (rng.random(len(first)) < 1 - (1 - hazard) ** size)[inverse]
        stats.add_served(user, call, on_canary, np.where(failed, np.nan, 0.1), failed,
                         np.full(len(user), 3.0))
    return stats


def test_calls_that_fail_at_their_own_rate_are_compared_by_the_rows_they_lose() -> None:
    # A canary call failing 1.2 % of the time against the champion's 0.2 %, whatever their sizes: 1.2 % of the
    # canary's rows are lost against 0.2 % of the champion's. The canary's calls being the smaller, they are
    # compared as they are (tests/unit/test_canary_call_failures.py has the other failure curves).
    rng = np.random.default_rng(45)
    stats = StepStats(SETTINGS, 20.0)
    for start in range(0, 40_000, 2_000):
        request = start + np.repeat(np.arange(2_000), 20)
        user = request * 20 + np.tile(np.arange(20), 2_000)
        on_canary = (user * 2_654_435_761 % 2**32) / 2**32 < 0.05
        call = 2 * request + on_canary
        _, first, inverse = np.unique(call, return_index=True, return_inverse=True)
        failed = (rng.random(len(first)) < np.where(on_canary[first], 0.012, 0.002))[inverse]
        stats.add_served(user, call, on_canary, np.where(failed, np.nan, 0.1), failed, np.full(len(user), 3.0))
    status, statistics = guardrail(stats, "error_rate", 0.05)
    assert status == "fail", statistics


def test_the_latency_guardrail_says_how_many_rows_each_arms_calls_hold() -> None:
    # At a 5 % step of 20-user requests a canary call holds ~1 row and a champion call ~19: where latency grows
    # with rows the arms' latencies are not alike, and the decision shows why.
    stats = row_failure_step(np.random.default_rng(46), requests=4_000, canary_hazard=0.0, champion_hazard=0.0)
    _, statistics = guardrail(stats, "latency_p99", 0.05)
    assert 0.9 < statistics["rows_per_call_canary"] < 1.3 and 18.5 < statistics["rows_per_call_champion"] < 19.5
