"""The canary judge's statistics: one step's evidence in, one decision out — no I/O, no registry.

A rollout moves the canary's traffic share through `steps` (default 0.05 → 0.25 → 0.5 → 1, fractions); each look
judges the current step on the rows served under it. What is randomised is the **entity** (routing sends
whole entities to an arm) and one **model call** scores a request's rows together, so every test below is
built on units, never on rows as if they were independent:

| guardrail | observation (unit) | test | why it is valid |
|---|---|---|---|
| `error_rate` | a failed call (every routed call; the canary's × `size_factor`, below) | betting CSs on one clock of blocks with shared bets (same time) × √design effect | exact for independent blocks, under calls failing at a rate of their own, by their rows, or both; widened when units come back |
| `latency_p99` | a call slower than the champion's recent p99 + `latency_p99_floor_ms` | same | each call's threshold comes from champion calls before it |
| `score_shift` | W1 distance of the arms' score distributions | DKW bands at Kish sizes ∩ paired bounds abs(mean Δ) ≤ W1 ≤ mean abs(Δ) on canary rows the champion also scored (betting CS) | every bound valid at every look; pass only when the whole interval is below the floor |
| `log_loss` | paired difference canary − champion on the same canary rows | normal-mixture CS, two-way (entity × call) cluster-robust variance | asymptotic; log loss is unbounded |
| `brier`, paired | per-call mean paired difference, calls in order of label completion | betting CS on [−1, 1] × √design effect | as error rate |
| `brier`, unpaired | each arm's mean Brier over its labelled rows | as unpaired log loss | as log loss |

**Over the same time.** Error rate and latency compare the arms on one clock of blocks
(`quiver.monitoring.concurrent`): a run of champion calls and the canary calls right after it form a block;
each arm's sequence and their difference's take one observation per block, both arms with the same bets, so
a drift both share (latency rising through the day, a base rate moving) cancels instead of landing on the
arm whose bets weigh more of it. The latency threshold follows the traffic too: the champion's p99 over its
last 2,000 calls before each call, + the floor (the pre-rollout reference only for the step's first 500
champion calls).

**Calls of different sizes.** At a 5 % step a canary call holds ~1 row of a multi-user request and a champion
call ~19. A call may fail at a rate of its own (a timeout), because one of its rows breaks it (failures grow
with rows), or both: p(s) = 1 − (1 − a)(1 − b)^s. The error rate compares failed calls, a failed canary call
counting `quiver.monitoring.canary_step.size_factor` of a failure: 1 where the canary's calls are no larger
than the champion's (every step up to ½), less where they are larger, so that under every such curve an equal
canary's expected failures never exceed the champion's. An equal canary is then rolled back at most at α
whatever the curve, and a canary whose calls fail more is measured exactly while its calls are the smaller.
One whose rows break calls more shows only what its small calls carry at a small step, and in full once the
arms' calls match in size (the ½ step, which the default steps keep). Every routed call counts, run or not:
a canary call the champion's failure stopped did not fail (had it been left out, blocks would close on the
canary's calls that ran, and the champion's failures would weigh less than its successes).

Without paired rows (what the judge could not replay either: `quiver.monitoring.canary_replay`) log loss
and Brier compare the arms unpaired and score shift uses its DKW bands only. The design effect is the two-way
(entity × call) over the by-call variance (`quiver.monitoring.clustered.CallSequence`). Sample-ratio
mismatch counts distinct routing units the router **assigned** to each arm — rows whose arm never ran (the
request failed first) count — against the split with the anytime-valid Dirichlet-multinomial test; a
mismatch **halts** the rollout.

**What "fail" means.** A guardrail *fails* when its whole confidence sequence lies beyond `fail_fraction` ×
floor (default half the floor): a canary worse by at most half the floor is rolled back by it at most at the
test's α, a canary worse by the floor or more is caught as the sequence narrows. It *passes* only when the
whole sequence lies below the floor, never on a point estimate; otherwise it *waits*. No data is never a
pass. The rollout's α is split evenly over guardrails × judged steps (Bonferroni). Outcome: any failure →
rollback; all pass → advance (promote when the next step is 100 %); still waiting after `max_canary_calls`
canary calls (labelled calls when labels are required) → rollback; else hold. `score_shift` is
**rollback-only** (`ROLLBACK_ONLY`): its failure rolls back, but a promotion does not wait for its pass.

`StepStats` accumulates one step batch by batch (`add_served`, `add_labelled`), so a simulation can look
after every batch at O(batch) cost; `judge(stats, fraction, settings)` is the decision.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from quiver.monitoring.canary_settings import (
    GUARDRAILS,
    OUTCOMES,
    ROLLBACK_ONLY,
    JudgeSettings,
    latency_threshold,
)
from quiver.monitoring.canary_step import ArmStats, StepStats, size_factor
from quiver.monitoring.clustered import CallSequence
from quiver.monitoring.concurrent import ConcurrentDifference
from quiver.monitoring.sequential import (
    dkw_radius,
    mixture_interval,
    multinomial_sequential,
    wasserstein_bounds,
)

# The judge's public names, wherever they live (settings and evidence have modules of their own).
__all__ = ["GUARDRAILS", "OUTCOMES", "ROLLBACK_ONLY", "ArmStats", "GuardrailResult", "JudgeSettings", "StepStats",
           "StepVerdict", "guardrails", "judge", "latency_threshold", "sample_ratio", "watch_verdict"]

# The test behind error rate and latency, as the decision records it.
_BLOCKS = "empirical-Bernstein betting CSs on one clock of blocks, shared bets (same time) × √design effect"


@dataclass(frozen=True)
class GuardrailResult:
    name: str
    status: str  # pass | fail | wait
    reason: str
    statistics: dict[str, Any]


@dataclass(frozen=True)
class StepVerdict:
    """The judge's decision on one look at one step, with every number behind it."""

    outcome: str
    reason: str
    fraction: float
    next_fraction: float | None
    srm: dict[str, Any]
    guardrails: tuple[GuardrailResult, ...]
    champion: dict[str, Any]
    canary: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        from quiver.monitoring.evaluation import _finite_json

        return dict(_finite_json({
            "outcome": self.outcome, "reason": self.reason, "fraction": self.fraction,
            "next_fraction": self.next_fraction, "srm": self.srm, "champion": self.champion,
            "canary": self.canary, "guardrails": [asdict(g) for g in self.guardrails]}))


def _decide(name: str, estimate: float, lower: float, upper: float, floor: float, settings: JudgeSettings,
            test: str, **extra: Any) -> GuardrailResult:
    limit = settings.fail_fraction * floor
    stats = {"estimate": estimate, "lower": lower, "upper": upper, "floor": floor, "fail_above": limit,
             "test": test, "alpha": settings.test_alpha, **extra}
    if lower > limit:
        return GuardrailResult(name, "fail", f"canary worse by {estimate:.4g}: the whole interval "
                                             f"[{lower:.4g}, {upper:.4g}] lies above {limit:.4g} "
                                             f"({settings.fail_fraction:g} × floor {floor:g})", stats)
    if upper < floor:  # the whole interval below the floor, never a point estimate
        return GuardrailResult(name, "pass", f"at most {upper:.4g} worse (< floor {floor:g})", stats)
    return GuardrailResult(name, "wait", f"interval [{lower:.4g}, {upper:.4g}] not yet decisive against "
                                         f"floor {floor:g}", stats)


def _wait(name: str, reason: str, **stats: Any) -> GuardrailResult:
    return GuardrailResult(name, "wait", reason, stats)


def guardrails(stats: StepStats) -> list[GuardrailResult]:
    """Every guardrail on one step's evidence."""
    settings, champion, canary = stats.settings, stats.champion, stats.canary
    out: list[GuardrailResult] = []
    if min(canary.rows, champion.rows) < settings.min_rows:
        for name in GUARDRAILS[:3]:
            out.append(_wait(name, f"{canary.rows} canary / {champion.rows} champion rows, need "
                                   f"{settings.min_rows} per arm", n_canary=canary.rows, n_champion=champion.rows))
    else:
        out += [_rate("error_rate", stats.error_difference, champion.errors, canary.errors,
                      settings.error_rate_floor, settings,
                      f"failed calls of every routed call, a failed canary call counting the size factor; {_BLOCKS}",
                      size_factor=size_factor(stats.champion_call_sizes, stats.canary_call_sizes),
                      failed_row_share_canary=canary.failed_rows / max(canary.rows, 1),
                      failed_row_share_champion=champion.failed_rows / max(champion.rows, 1), **_rows_per_call(stats)),
                _latency(stats), _score_shift(stats)]
    out += _quality(stats)
    return out


def _rows_per_call(stats: StepStats) -> dict[str, float]:
    return {"rows_per_call_champion": stats.champion.rows / max(stats.champion.calls, 1),
            "rows_per_call_canary": stats.canary.rows / max(stats.canary.calls, 1)}


def _rate(name: str, difference: ConcurrentDifference, champion: CallSequence, canary: CallSequence,
          floor: float, settings: JudgeSettings, test: str, **extra: Any) -> GuardrailResult:
    """Canary − champion of a per-call rate over the same time (blocks), each arm widened by its design
    effect. Each arm's own per-call mean is reported beside."""
    stretches = math.sqrt(canary.design_effect()), math.sqrt(champion.design_effect())
    lower, upper = difference.interval(*stretches)
    return _decide(name, difference.mean, lower, upper, floor, settings, test,
                   canary=canary.mean, champion=champion.mean, n_canary=canary.n, n_champion=champion.n,
                   blocks=difference.blocks, design_effect_canary=canary.design_effect(),
                   design_effect_champion=champion.design_effect(), **extra)


def _latency(stats: StepStats) -> GuardrailResult:
    champion, canary, settings = stats.champion, stats.canary, stats.settings
    # Rows per call beside the p99s: at a small step a canary call holds fewer rows than a champion call, and
    # where latency grows with rows the arms are compared fairly only once their calls match (docs).
    latency = {"reference_ms": stats.latency_threshold_ms, "threshold_ms": stats.latency.current_ms(),
               "champion_p99_ms": champion.latency_p99_ms(), "canary_p99_ms": canary.latency_p99_ms(),
               **_rows_per_call(stats)}
    if stats.slow_difference.blocks == 0:
        return _wait("latency_p99", f"no latency threshold for a call yet: no reference p99 from before the rollout "
                                    f"and fewer than {stats.latency.chunk} champion calls in this step", **latency)
    return _rate("latency_p99", stats.slow_difference, champion.slow, canary.slow,
                 settings.latency_exceedance_floor, settings, _BLOCKS, **latency)


def _score_shift(stats: StepStats) -> GuardrailResult:
    """W1 of the arms' score distributions, bounded two ways at α/4 each: time-uniform DKW bands at Kish sizes
    (both sides), and on the canary rows the champion also scored, |mean Δ| ≤ W1 ≤ mean |Δ| (any coupling of
    two distributions bounds W1 from above; a mean shift bounds it from below), Δ = canary − champion.

    The estimate is W1 of the paired rows' two score histograms where there are paired rows (both arms on the
    same rows, so which entities the router sent where adds no noise), else of the arms' histograms. The
    arms' W1 carries that routing noise: with repeat users it can lie far above the paired bound, so the
    reported estimate is kept inside the interval and the arms' distance is reported beside it."""
    champion, canary, settings = stats.champion, stats.canary, stats.settings
    n_c, n_0 = int(canary.score_counts.sum()), int(champion.score_counts.sum())
    if min(n_c, n_0) == 0:
        return _wait("score_shift", "no successful scores in an arm yet", n_canary=n_c, n_champion=n_0)
    size_c, size_0 = canary.effective_size, champion.effective_size
    quarter = settings.test_alpha / 4
    distance, lower, upper = wasserstein_bounds(canary.score_counts, champion.score_counts,
                                                dkw_radius(size_c, quarter), dkw_radius(size_0, quarter))
    extra: dict[str, Any] = {"effective_canary": size_c, "effective_champion": size_0, "dkw_lower": lower,
                             "dkw_upper": upper, "paired_calls": canary.shift_abs.n, "arm_distance": distance}
    if canary.shift_abs.n:
        mean_low, mean_high = canary.shift_signed.interval()  # of (Δ + 1) / 2
        shift_low = max(0.0, 2 * mean_low - 1, 1 - 2 * mean_high)
        paired_upper = canary.shift_abs.interval()[1]
        lower, upper = max(lower, shift_low), min(upper, paired_upper)
        distance = wasserstein_bounds(canary.paired_counts, canary.paired_champion_counts, 0.0, 0.0)[0]
        extra.update(paired_abs_mean=canary.shift_abs.mean, paired_abs_upper=paired_upper,
                     paired_mean_shift=2 * canary.shift_signed.mean - 1, paired_shift_lower=shift_low,
                     paired_distance=distance)
    upper = max(lower, upper)
    return _decide("score_shift", min(max(distance, lower), upper), lower, upper, settings.score_shift_floor,
                   settings, "Wasserstein-1: time-uniform DKW at Kish sizes ∩ paired |mean Δ| ≤ W1 ≤ mean |Δ| "
                             "(betting)", **extra)


def _quality(stats: StepStats) -> list[GuardrailResult]:
    settings, champion, canary = stats.settings, stats.champion, stats.canary
    paired = canary.paired >= settings.min_labels
    enough = paired or min(canary.labeled, champion.labeled) >= settings.min_labels
    out = []
    for name in ("log_loss", "brier"):
        if not enough:
            counts = {"labeled_canary": canary.labeled, "labeled_champion": champion.labeled,
                      "paired": canary.paired}
            if settings.require_labels:
                out.append(_wait(name, f"{canary.labeled} canary / {champion.labeled} champion labelled rows "
                                       f"({canary.paired} paired), need {settings.min_labels}", **counts))
            else:
                out.append(GuardrailResult(name, "pass", "labels not required by this rollout", counts))
            continue
        out.append(_log_loss(stats, paired) if name == "log_loss" else _brier(stats, paired))
    return out


def _log_loss(stats: StepStats, paired: bool) -> GuardrailResult:
    settings, champion, canary = stats.settings, stats.champion, stats.canary
    floor = settings.log_loss_floor
    if paired:
        difference = canary.paired_log_loss
        estimate, variance = difference.mean, difference.variance()
        extra = {"paired_rows": difference.rows, "entities": difference.entities, "calls": difference.calls,
                 "row_variance": difference.row_variance()}
        test = "paired, normal-mixture CS, two-way cluster-robust variance (entity × call)"
    else:
        estimate = canary.log_loss.mean - champion.log_loss.mean
        variance = canary.log_loss.variance() + champion.log_loss.variance()
        extra = {"canary": canary.log_loss.mean, "champion": champion.log_loss.mean}
        test = "unpaired, normal-mixture CS, two-way cluster-robust variance (entity × call)"
    if not math.isfinite(variance):
        return _wait("log_loss", "too few entities or calls for a clustered variance", **extra)
    result = mixture_interval(estimate, variance, tau=floor, alpha=settings.test_alpha)
    between = (canary.paired_log_loss.between_variance() if paired
               else canary.log_loss.between_variance() + champion.log_loss.between_variance())
    return _unit_limited(_decide("log_loss", estimate, result.lower, result.upper, floor, settings, test,
                                 variance=variance, **extra), between, floor, settings)


def _brier(stats: StepStats, paired: bool) -> GuardrailResult:
    settings, champion, canary = stats.settings, stats.champion, stats.canary
    floor = settings.brier_floor
    if paired:
        sequence = canary.paired_brier
        lower, upper = sequence.interval()
        result = _decide("brier", 2 * sequence.mean - 1, 2 * lower - 1, 2 * upper - 1, floor, settings,
                         "paired, empirical-Bernstein betting CS on per-call mean differences",
                         paired_calls=sequence.n)
        return _unit_limited(result, 4 * sequence.clustered.between_variance(), floor, settings)  # (Δ + 1) / 2
    # Unpaired, as log loss: Brier is bounded, but a betting sequence on per-call values (what this was) kept
    # healthy canaries waiting until they timed out where no champion scores were paired (docs/prediction.md).
    estimate = canary.brier.mean - champion.brier.mean
    variance = canary.brier.variance() + champion.brier.variance()
    extra = {"canary": canary.brier.mean, "champion": champion.brier.mean}
    if not math.isfinite(variance):
        return _wait("brier", "too few entities or calls for a clustered variance", **extra)
    mixture = mixture_interval(estimate, variance, tau=floor, alpha=settings.test_alpha)
    result = _decide("brier", estimate, mixture.lower, mixture.upper, floor, settings,
                     "unpaired, normal-mixture CS, two-way cluster-robust variance (entity × call)",
                     variance=variance, **extra)
    between = canary.brier.between_variance() + champion.brier.between_variance()
    return _unit_limited(result, between, floor, settings)


def _unit_limited(result: GuardrailResult, between_variance: float, floor: float,
                  settings: JudgeSettings) -> GuardrailResult:
    """A waiting quality guardrail whose routing units alone keep its interval wider than the floor says so
    (`unit_limited_halfwidth`: the mixture's half-width at the between-unit variance): more rows from the
    same units cannot decide it. Users who come back without paired rows do this on a small canary step;
    pairing (the champion scoring canary rows) takes the spread between users out of the comparison."""
    if result.status != "wait" or not math.isfinite(between_variance) or between_variance <= 0:
        return result
    half = mixture_interval(0.0, between_variance, tau=floor, alpha=settings.test_alpha).upper
    statistics = {**result.statistics, "unit_limited_halfwidth": half}
    if half < floor:
        return replace(result, statistics=statistics)
    return replace(result, statistics=statistics, reason=(
        f"{result.reason}; its routing units alone keep it ±{half:.4g} wide, beyond the floor: more rows from "
        f"the same units cannot decide it (pair the champion's scores of canary rows, or wait for new units)"))


def sample_ratio(champion: ArmStats, canary: ArmStats, fraction: float, alpha: float) -> dict[str, Any]:
    """Sample-ratio mismatch test on distinct routing units per arm."""
    test = multinomial_sequential([champion.entities, canary.entities], [1 - fraction, fraction], alpha=alpha)
    return {"expected_fraction": fraction,
            "observed_fraction": canary.entities / max(champion.entities + canary.entities, 1), **test.to_dict()}


def judge(stats: StepStats, fraction: float) -> StepVerdict:
    """The decision on one step (see the module docstring)."""
    settings, champion, canary = stats.settings, stats.champion, stats.canary
    if fraction not in settings.steps[:-1]:
        raise ValueError(f"fraction {fraction} is not a judged step of {list(settings.steps)}")
    following = settings.steps[settings.steps.index(fraction) + 1]
    srm = sample_ratio(champion, canary, fraction, settings.srm_alpha)
    arms = {"champion": champion.summary(), "canary": canary.summary()}
    if champion.rows + canary.rows == 0:
        return StepVerdict("hold", "no traffic logged in this step yet", fraction, None, srm, (), **arms)
    if srm["significant"]:
        return StepVerdict("halt", f"sample-ratio mismatch: canary share {srm['observed_fraction']:.4f} vs "
                                   f"{fraction:g} expected (chi-square p={srm['chi2_pvalue']:.2g})",
                           fraction, 0.0, srm, (), **arms)
    results = tuple(guardrails(stats))
    failed = [g for g in results if g.status == "fail"]
    if failed:
        return StepVerdict("rollback", "; ".join(f"{g.name}: {g.reason}" for g in failed), fraction, 0.0, srm,
                           results, **arms)
    waiting = [g.name for g in results if g.status != "pass" and g.name not in ROLLBACK_ONLY]
    spent = canary.labeled_calls if settings.require_labels else canary.calls
    if waiting and spent >= settings.max_canary_calls:
        return StepVerdict("rollback", f"timeout: {', '.join(waiting)} still undecided after {spent} canary "
                                       f"calls (max_canary_calls {settings.max_canary_calls})", fraction, 0.0, srm,
                           results, **arms)
    if waiting:
        return StepVerdict("hold", f"waiting on {', '.join(waiting)}", fraction, None, srm, results, **arms)
    outcome = "promote" if following == 1.0 else "advance"
    open_ = [g.name for g in results if g.status != "pass"]
    note = f" ({', '.join(open_)} not shown within its floor, not failed: rollback-only)" if open_ else ""
    return StepVerdict(outcome, f"every guardrail passed at {fraction:g}{note}", fraction, following, srm,
                       results, **arms)


def watch_verdict(stats: StepStats, *, ended: bool) -> StepVerdict:
    """The post-promotion watch: `stats.canary` holds the new champion's labelled rows paired with the old
    champion's scores of the same rows. Roll back when a quality guardrail fails (the new champion proved
    worse than the floor allows); confirm when the watch has ended; else hold."""
    results = tuple(_quality(stats))
    arms = {"champion": stats.champion.summary(), "canary": stats.canary.summary()}
    failed = [g for g in results if g.status == "fail"]
    if failed:
        return StepVerdict("rollback", "; ".join(f"{g.name}: {g.reason}" for g in failed), 1.0, None, {},
                           results, **arms)
    if ended:
        return StepVerdict("confirm", "watch ended without the new champion proving worse", 1.0, None, {},
                           results, **arms)
    return StepVerdict("hold", "watching: " + ", ".join(f"{g.name} {g.status}" for g in results), 1.0, None,
                       {}, results, **arms)
