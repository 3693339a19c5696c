"""The canary judge's statistics: one step's evidence in, one decision out — no I/O, no registry.

A rollout moves the canary's traffic share through `steps` (default 0.05 → 0.25 → 0.5 → 1, fractions); each look
judges the current step on the rows served under it. What is randomised is the **entity** (routing sends
whole entities to an arm) and one **model call** scores a request's rows together, so every test below is
built on units, never on rows as if they were independent:

| guardrail | observation (unit) | test | why it is valid |
|---|---|---|---|
| `error_rate` | a model call failed (per call) | betting CS per arm × √design effect, difference by union | exact for independent calls; widened when units come back |
| `latency_p99` | a call slower than the champion's *reference* p99 + `latency_p99_floor_ms` | same | the threshold is fixed before the step |
| `score_shift` | W1 distance of the arms' score distributions | DKW bands at Kish sizes ∩ paired bounds abs(mean Δ) ≤ W1 ≤ mean abs(Δ) on canary rows the champion also scored (betting CS) | every bound valid at every look; pass only when the whole interval is below the floor |
| `log_loss` | paired difference canary − champion on the same canary rows | normal-mixture CS, two-way (entity × call) cluster-robust variance | asymptotic; log loss is unbounded |
| `brier` | per-call mean paired difference, calls in order of label completion | betting CS on [−1, 1] × √design effect | as error rate |

Without paired rows (older logs, a dropped pairing queue) log loss and Brier compare the arms unpaired and
score shift uses its DKW bands only. The design effect is the two-way (entity × call) over the by-call
variance (`quiver.monitoring.clustered.CallSequence`). Sample-ratio mismatch counts distinct routing units
the router **assigned** to each arm — rows whose arm never ran (the request failed first) count — against the
split with the anytime-valid Dirichlet-multinomial test; a mismatch **halts** the rollout.

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

import itertools
import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np
import numpy.typing as npt

from quiver.monitoring.clustered import CallSequence, ClusteredMean
from quiver.monitoring.sequential import (
    difference_interval,
    dkw_radius,
    mixture_interval,
    multinomial_sequential,
    wasserstein_bounds,
)

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
# Log-spaced latency bins, 0.01 ms … 100 s, ~6 % wide: reported p99s from mergeable counts.
LATENCY_EDGES_MS = np.geomspace(0.01, 100_000.0, 281)
SCORE_BINS = 1000  # equal-width score bins on [0, 1]: W1 from counts, within 1/SCORE_BINS
OUTCOMES = ("advance", "hold", "promote", "rollback", "halt")
GUARDRAILS = ("error_rate", "latency_p99", "score_shift", "log_loss", "brier")
# Roll back when they fail, but are not needed to pass: a score shift is bounded from above by the paired mean
# |Δ| or the DKW bands at Kish sizes, and an equivalent model that disagrees row by row may never get either
# below the floor; the quality guardrails carry the proof of a promotion.
ROLLBACK_ONLY = ("score_shift",)
# Stored by rollouts started before score_shift replaced PSI and the timeout counted calls: read, not used.
_LEGACY_SETTINGS = ("psi_floor", "score_bins", "max_canary_rows")


@dataclass(frozen=True)
class JudgeSettings:
    """Steps, error budget and floors of one rollout (stored with it, so every step judges alike)."""

    steps: tuple[float, ...] = (0.05, 0.25, 0.5, 1.0)
    alpha: float = 0.05  # false-rollback budget of a whole rollout
    srm_alpha: float = 0.001
    min_rows: int = 500  # per arm and step before any guardrail may pass
    min_labels: int = 200  # labelled rows per arm and step before log loss / Brier may pass
    # A step still undecided when its canary has made this many model calls (calls with their labels in,
    # when labels are required) rolls back: the canary could not be shown to be within its floors.
    max_canary_calls: int = 100_000
    require_labels: bool = True
    fail_fraction: float = 0.5  # fail = the whole confidence sequence beyond this share of the floor
    error_rate_floor: float = 0.01  # share of model calls
    latency_exceedance_floor: float = 0.01  # share of calls slower than the reference threshold, beyond the champion's
    latency_p99_floor_ms: float = 2.0  # the threshold: champion's reference p99 + this
    score_shift_floor: float = 0.05  # Wasserstein-1 distance of the arms' score distributions, in score units
    log_loss_floor: float = 0.02
    brier_floor: float = 0.01
    watch_hours: float = 24.0  # after a promotion, compare with `previous` this long (0: no watch)

    def __post_init__(self) -> None:
        steps = tuple(float(s) for s in self.steps)
        object.__setattr__(self, "steps", steps)
        rising = all(0 < a < b for a, b in itertools.pairwise(steps))
        if len(steps) < 2 or steps[-1] != 1.0 or steps[0] <= 0 or not rising:
            raise ValueError(f"steps must rise strictly from above 0 to 1.0, got {list(steps)}")
        if not 0 < self.alpha < 1 or not 0 < self.srm_alpha < 1 or not 0 < self.fail_fraction <= 1:
            raise ValueError("alpha and srm_alpha must lie in (0, 1), fail_fraction in (0, 1]")
        if self.watch_hours < 0:
            raise ValueError("watch_hours must be >= 0")
        if self.min_rows < 2 or self.min_labels < 2 or self.max_canary_calls < 2:
            raise ValueError("min_rows, min_labels and max_canary_calls must be at least 2")
        for name in ("error_rate_floor", "latency_exceedance_floor", "latency_p99_floor_ms",
                     "score_shift_floor", "log_loss_floor", "brier_floor"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")

    @property
    def test_alpha(self) -> float:
        """α of one guardrail test: the rollout's budget over guardrails × steps with a champion to compare."""
        return self.alpha / (len(GUARDRAILS) * (len(self.steps) - 1))

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["steps"] = list(self.steps)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JudgeSettings:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k not in _LEGACY_SETTINGS}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"unknown judge settings {sorted(unknown)}; known: {sorted(known)}")
        if "steps" in values:
            values["steps"] = tuple(values["steps"])
        return cls(**values)


def _grow(array: FloatArray, size: int) -> FloatArray:
    if size <= len(array):
        return array
    return np.concatenate([array, np.zeros(max(size, 2 * len(array)) - len(array))])


@dataclass
class ArmStats:
    """One arm's evidence in one step, accumulated call by call (see `StepStats`)."""

    alpha: float  # α of each per-arm confidence sequence (half a guardrail's α)
    latency_threshold_ms: float
    rows: int = 0
    calls: int = 0
    errors: CallSequence = field(init=False)
    slow: CallSequence = field(init=False)
    brier: CallSequence = field(init=False)  # per-call mean Brier (unpaired comparison)
    paired_brier: CallSequence = field(init=False)  # per-call mean (Δ + 1) / 2, canary rows only
    # Score shift on canary rows the champion also scored: per-call mean |Δ| and (Δ + 1) / 2,
    # Δ = canary − champion.
    shift_abs: CallSequence = field(init=False)
    shift_signed: CallSequence = field(init=False)
    log_loss: ClusteredMean = field(default_factory=ClusteredMean)
    paired_log_loss: ClusteredMean = field(default_factory=ClusteredMean)
    labeled: int = 0
    labeled_calls: int = 0
    paired: int = 0
    latency_counts: IntArray = field(default_factory=lambda: np.zeros(len(LATENCY_EDGES_MS) + 1, np.int64))
    score_counts: IntArray = field(default_factory=lambda: np.zeros(SCORE_BINS, np.int64))
    entity_rows: FloatArray = field(default_factory=lambda: np.zeros(0))
    entities: int = 0  # distinct routing units the router sent here, served or not (the sample-ratio unit)
    _rows_squared: float = 0.0  # Σ over entities of (rows)², for the Kish size
    _routed: BoolArray = field(default_factory=lambda: np.zeros(0, bool))

    def __post_init__(self) -> None:
        for name in ("errors", "slow", "brier", "paired_brier"):
            setattr(self, name, CallSequence(self.alpha))
        for name in ("shift_abs", "shift_signed"):  # the score shift's α is split four ways, not two
            setattr(self, name, CallSequence(self.alpha / 2))

    @property
    def effective_size(self) -> float:
        """Kish effective size of the scored rows over entities (see `kish_effective_size`)."""
        return self.rows * self.rows / self._rows_squared if self._rows_squared else 0.0

    def add_served(self, entity: IntArray, call: IntArray, score: FloatArray, failed: BoolArray,
                   latency_ms: FloatArray, paired_score: FloatArray | None = None) -> None:
        if entity.size == 0:
            return
        codes, first, inverse = np.unique(call, return_index=True, return_inverse=True)
        call_failed = np.bincount(inverse, weights=failed.astype(np.float64)) > 0
        self.rows += int(entity.size)
        self.calls += len(codes)
        self.errors.extend(call_failed[inverse].astype(np.float64), entity, call)  # a failure is the call's
        self.slow.extend((latency_ms[first] > self.latency_threshold_ms)[inverse].astype(np.float64), entity, call)
        call_latency = latency_ms[first]
        which = np.searchsorted(LATENCY_EDGES_MS, call_latency, side="right")
        self.latency_counts += np.bincount(which, minlength=len(self.latency_counts))
        ok = ~failed & np.isfinite(score)
        bins = np.minimum((np.clip(score[ok], 0.0, 1.0) * SCORE_BINS).astype(np.int64), SCORE_BINS - 1)
        self.score_counts += np.bincount(bins, minlength=SCORE_BINS)
        self.entity_rows = _grow(self.entity_rows, int(entity.max()) + 1)
        touched, counts = np.unique(entity, return_counts=True)
        before = self.entity_rows[touched]
        after = before + counts
        self.add_routed(touched)
        self._rows_squared += float(np.dot(after, after) - np.dot(before, before))
        self.entity_rows[touched] = after
        if paired_score is not None:
            both = ok & np.isfinite(paired_score)
            delta = np.clip(score[both], 0.0, 1.0) - np.clip(paired_score[both], 0.0, 1.0)
            self.shift_abs.extend(np.abs(delta), entity[both], call[both])
            self.shift_signed.extend((delta + 1) / 2, entity[both], call[both])

    def add_routed(self, entity: IntArray) -> None:
        """Routing units sent to this arm (whether or not its model ran for them)."""
        if entity.size == 0:
            return
        top = int(entity.max()) + 1
        if top > len(self._routed):
            self._routed = np.concatenate([self._routed, np.zeros(max(top, 2 * len(self._routed)) - len(self._routed),
                                                                   bool)])
        fresh = np.unique(entity[~self._routed[entity]])
        self.entities += len(fresh)
        self._routed[fresh] = True

    def add_labelled(self, entity: IntArray, call: IntArray, score: FloatArray, label: FloatArray,
                     paired_score: FloatArray | None) -> None:
        from quiver.monitoring.evaluation import brier_losses, log_losses

        if entity.size == 0:
            return
        self.labeled += int(entity.size)
        self.log_loss.extend(log_losses(score, label), entity, call)
        self.labeled_calls += len(np.unique(call))
        self.brier.extend(brier_losses(score, label), entity, call)
        if paired_score is None:
            return
        has = np.isfinite(paired_score)
        if not has.any():
            return
        e, c, s, y, p = entity[has], call[has], score[has], label[has], paired_score[has]
        self.paired += int(has.sum())
        self.paired_log_loss.extend(log_losses(s, y) - log_losses(p, y), e, c)
        difference = brier_losses(s, y) - brier_losses(p, y)  # in [−1, 1]
        self.paired_brier.extend(np.clip((difference + 1) / 2, 0.0, 1.0), e, c)

    def latency_p99_ms(self) -> float:
        total = int(self.latency_counts.sum())
        if total == 0:
            return math.nan
        index = int(np.searchsorted(np.cumsum(self.latency_counts), 0.99 * total, side="left"))
        return float(LATENCY_EDGES_MS[index]) if index < len(LATENCY_EDGES_MS) else math.inf

    def summary(self) -> dict[str, Any]:
        return {"rows": self.rows, "calls": self.calls, "entities": self.entities, "errors": int(self.errors.total),
                "labeled": self.labeled, "labeled_calls": self.labeled_calls, "paired": self.paired}


@dataclass
class StepStats:
    """Both arms' evidence in one step. Feed served rows in time order and labelled rows in the order their
    calls' labels completed; call codes must grow with time and a call's rows come in one batch."""

    settings: JudgeSettings
    latency_threshold_ms: float
    champion: ArmStats = field(init=False)
    canary: ArmStats = field(init=False)

    def __post_init__(self) -> None:
        half = self.settings.test_alpha / 2
        self.champion = ArmStats(half, self.latency_threshold_ms)
        self.canary = ArmStats(half, self.latency_threshold_ms)

    def add_served(self, entity: npt.ArrayLike, call: npt.ArrayLike, on_canary: npt.ArrayLike,
                   score: npt.ArrayLike, failed: npt.ArrayLike, latency_ms: npt.ArrayLike,
                   champion_score: npt.ArrayLike | None = None, ran: npt.ArrayLike | None = None) -> StepStats:
        """Rows routed in this step: routing unit and call codes, arm, score (NaN on failure), failure and the
        call's latency, one value per row; `champion_score`: the champion's score of a canary row (paired,
        NaN where not); `ran`: False for rows whose arm never ran (the request failed first) — they count
        as routed units for the sample-ratio check and nowhere else."""
        e, c, arm = _codes(entity, call, on_canary)
        s, f, lat = (np.asarray(score, np.float64), np.asarray(failed, bool), np.asarray(latency_ms, np.float64))
        paired = np.full(len(s), np.nan) if champion_score is None else np.asarray(champion_score, np.float64)
        done = np.ones(len(s), bool) if ran is None else np.asarray(ran, bool)
        _same_length(e, s, f, lat, paired, done)
        for stats, mask in ((self.champion, ~arm), (self.canary, arm)):
            stats.add_routed(e[mask])
            mask = mask & done
            stats.add_served(e[mask], c[mask], s[mask], f[mask], lat[mask], paired[mask])
        return self

    def add_labelled(self, entity: npt.ArrayLike, call: npt.ArrayLike, on_canary: npt.ArrayLike,
                     score: npt.ArrayLike, label: npt.ArrayLike,
                     champion_score: npt.ArrayLike | None = None) -> StepStats:
        """Successfully scored rows whose label arrived, with (canary rows) the champion's score of the same
        row when it was paired, NaN where not."""
        e, c, arm = _codes(entity, call, on_canary)
        s, y = np.asarray(score, np.float64), np.asarray(label, np.float64)
        paired = np.asarray(champion_score, dtype=np.float64) if champion_score is not None else None
        _same_length(e, s, y, *([paired] if paired is not None else []))
        self.champion.add_labelled(e[~arm], c[~arm], s[~arm], y[~arm], None)
        self.canary.add_labelled(e[arm], c[arm], s[arm], y[arm], paired[arm] if paired is not None else None)
        return self


def _codes(entity: npt.ArrayLike, call: npt.ArrayLike,
           on_canary: npt.ArrayLike) -> tuple[IntArray, IntArray, BoolArray]:
    e, c, arm = np.asarray(entity, np.int64), np.asarray(call, np.int64), np.asarray(on_canary, bool)
    _same_length(e, c, arm)
    return e, c, arm


def _same_length(first: npt.NDArray[Any], *others: npt.NDArray[Any]) -> None:
    if first.ndim != 1 or any(o.shape != first.shape for o in others):
        raise ValueError("every column of a batch must be 1-d with one value per row")


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
        out += [_rate("error_rate", champion.errors, canary.errors, settings.error_rate_floor, settings),
                _latency(stats), _score_shift(stats)]
    out += _quality(stats)
    return out


def _rate(name: str, champion: CallSequence, canary: CallSequence, floor: float,
          settings: JudgeSettings, **extra: Any) -> GuardrailResult:
    lower, upper = difference_interval(canary.interval(), champion.interval())
    return _decide(name, canary.mean - champion.mean, lower, upper, floor, settings,
                   "empirical-Bernstein betting CS per arm, per model call, × √design effect (entity)",
                   canary=canary.mean, champion=champion.mean, n_canary=canary.n, n_champion=champion.n,
                   design_effect_canary=canary.design_effect(), design_effect_champion=champion.design_effect(),
                   **extra)


def _latency(stats: StepStats) -> GuardrailResult:
    champion, canary, settings = stats.champion, stats.canary, stats.settings
    if not math.isfinite(stats.latency_threshold_ms):
        return _wait("latency_p99", "no latency reference for this rollout yet (the champion's p99 before it)",
                     champion_p99_ms=champion.latency_p99_ms(), canary_p99_ms=canary.latency_p99_ms())
    return _rate("latency_p99", champion.slow, canary.slow, settings.latency_exceedance_floor, settings,
                 threshold_ms=stats.latency_threshold_ms, champion_p99_ms=champion.latency_p99_ms(),
                 canary_p99_ms=canary.latency_p99_ms())


def _score_shift(stats: StepStats) -> GuardrailResult:
    """W1 of the arms' score distributions, bounded two ways at α/4 each: time-uniform DKW bands at Kish sizes
    (both sides), and on the canary rows the champion also scored, |mean Δ| ≤ W1 ≤ mean |Δ| (any coupling of
    two distributions bounds W1 from above; a mean shift bounds it from below), Δ = canary − champion."""
    champion, canary, settings = stats.champion, stats.canary, stats.settings
    n_c, n_0 = int(canary.score_counts.sum()), int(champion.score_counts.sum())
    if min(n_c, n_0) == 0:
        return _wait("score_shift", "no successful scores in an arm yet", n_canary=n_c, n_champion=n_0)
    size_c, size_0 = canary.effective_size, champion.effective_size
    quarter = settings.test_alpha / 4
    distance, lower, upper = wasserstein_bounds(canary.score_counts, champion.score_counts,
                                                dkw_radius(size_c, quarter), dkw_radius(size_0, quarter))
    extra: dict[str, Any] = {"effective_canary": size_c, "effective_champion": size_0, "dkw_lower": lower,
                             "dkw_upper": upper, "paired_calls": canary.shift_abs.n}
    if canary.shift_abs.n:
        mean_low, mean_high = canary.shift_signed.interval()  # of (Δ + 1) / 2
        shift_low = max(0.0, 2 * mean_low - 1, 1 - 2 * mean_high)
        paired_upper = canary.shift_abs.interval()[1]
        lower, upper = max(lower, shift_low), min(upper, paired_upper)
        extra.update(paired_abs_mean=canary.shift_abs.mean, paired_abs_upper=paired_upper,
                     paired_mean_shift=2 * canary.shift_signed.mean - 1, paired_shift_lower=shift_low)
    return _decide("score_shift", distance, lower, max(lower, upper), settings.score_shift_floor, settings,
                   "Wasserstein-1: time-uniform DKW at Kish sizes ∩ paired |mean Δ| ≤ W1 ≤ mean |Δ| (betting)",
                   **extra)


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
    return _decide("log_loss", estimate, result.lower, result.upper, floor, settings, test,
                   variance=variance, **extra)


def _brier(stats: StepStats, paired: bool) -> GuardrailResult:
    settings, champion, canary = stats.settings, stats.champion, stats.canary
    if paired:
        sequence = canary.paired_brier
        lower, upper = sequence.interval()
        return _decide("brier", 2 * sequence.mean - 1, 2 * lower - 1, 2 * upper - 1, settings.brier_floor,
                       settings, "paired, empirical-Bernstein betting CS on per-call mean differences",
                       paired_calls=sequence.n)
    return _rate("brier", champion.brier, canary.brier, settings.brier_floor, settings)


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


def latency_threshold(call_latencies_ms: npt.ArrayLike, settings: JudgeSettings) -> float | None:
    """The latency guardrail's threshold from the champion's reference calls (one latency per call): their
    p99 plus `latency_p99_floor_ms`; None with fewer than `min_rows` calls."""
    values = np.asarray(call_latencies_ms, dtype=np.float64)
    values = values[np.isfinite(values)]
    if len(values) < settings.min_rows:
        return None
    return float(np.quantile(values, 0.99)) + settings.latency_p99_floor_ms
