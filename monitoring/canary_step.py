"""One canary step's evidence, accumulated batch by batch: `StepStats` holds both arms' `ArmStats` and the
same-time comparisons (`quiver.monitoring.concurrent`) the judge (`quiver.monitoring.canary_stats`) decides
on. No I/O: arrays in; `quiver.monitoring.canary_evidence` builds the arrays from serving logs."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from quiver.monitoring.canary_settings import JudgeSettings
from quiver.monitoring.clustered import CallSequence, ClusteredMean
from quiver.monitoring.concurrent import ConcurrentDifference, LatencyThreshold

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
# Log-spaced latency bins, 0.01 ms … 100 s, ~6 % wide: reported p99s from mergeable counts.
LATENCY_EDGES_MS = np.geomspace(0.01, 100_000.0, 281)
SCORE_BINS = 1000  # equal-width score bins on [0, 1]: W1 from counts, within 1/SCORE_BINS


def _grow(array: FloatArray, size: int) -> FloatArray:
    if size <= len(array):
        return array
    return np.concatenate([array, np.zeros(max(size, 2 * len(array)) - len(array))])


def _score_histogram(score: FloatArray) -> IntArray:
    bins = np.minimum((np.clip(score, 0.0, 1.0) * SCORE_BINS).astype(np.int64), SCORE_BINS - 1)
    return np.bincount(bins, minlength=SCORE_BINS)


@dataclass
class ArmStats:
    """One arm's evidence in one step, accumulated call by call (see `StepStats`)."""

    alpha: float  # α of each per-arm confidence sequence (half a guardrail's α)
    rows: int = 0
    calls: int = 0
    failed_rows: int = 0  # rows of failed calls
    errors: CallSequence = field(init=False)  # per call: failed (1) or not (0)
    slow: CallSequence = field(init=False)  # per call with a threshold: slower than it
    paired_brier: CallSequence = field(init=False)  # per-call mean (Δ + 1) / 2, canary rows only
    # Score shift on canary rows the champion also scored: per-call mean |Δ| and (Δ + 1) / 2,
    # Δ = canary − champion.
    shift_abs: CallSequence = field(init=False)
    shift_signed: CallSequence = field(init=False)
    log_loss: ClusteredMean = field(default_factory=ClusteredMean)
    brier: ClusteredMean = field(default_factory=ClusteredMean)  # unpaired comparison, like log loss
    paired_log_loss: ClusteredMean = field(default_factory=ClusteredMean)
    labeled: int = 0
    labeled_calls: int = 0
    paired: int = 0
    latency_counts: IntArray = field(default_factory=lambda: np.zeros(len(LATENCY_EDGES_MS) + 1, np.int64))
    score_counts: IntArray = field(default_factory=lambda: np.zeros(SCORE_BINS, np.int64))
    # The paired rows' scores, this arm's and the champion's of the same rows: the score shift's estimate.
    paired_counts: IntArray = field(default_factory=lambda: np.zeros(SCORE_BINS, np.int64))
    paired_champion_counts: IntArray = field(default_factory=lambda: np.zeros(SCORE_BINS, np.int64))
    entity_rows: FloatArray = field(default_factory=lambda: np.zeros(0))
    entities: int = 0  # distinct routing units the router sent here, served or not (the sample-ratio unit)
    _rows_squared: float = 0.0  # Σ over entities of (rows)², for the Kish size
    _routed: BoolArray = field(default_factory=lambda: np.zeros(0, bool))

    def __post_init__(self) -> None:
        for name in ("errors", "slow", "paired_brier"):
            setattr(self, name, CallSequence(self.alpha))
        for name in ("shift_abs", "shift_signed"):  # the score shift's α is split four ways, not two
            setattr(self, name, CallSequence(self.alpha / 2))

    @property
    def effective_size(self) -> float:
        """Kish effective size of the scored rows over entities (see `kish_effective_size`)."""
        return self.rows * self.rows / self._rows_squared if self._rows_squared else 0.0

    def add_served(self, entity: IntArray, call: IntArray, score: FloatArray, failed: BoolArray,
                   latency_ms: FloatArray, paired_score: FloatArray | None, threshold_ms: FloatArray) -> None:
        if entity.size == 0:
            return
        codes, first, inverse = np.unique(call, return_index=True, return_inverse=True)
        call_failed = np.bincount(inverse, weights=failed.astype(np.float64)) > 0
        self.rows += int(entity.size)
        self.calls += len(codes)
        self.failed_rows += int(call_failed[inverse].sum())
        self.errors.extend(call_failed[inverse].astype(np.float64), entity, call)
        judged = np.isfinite(threshold_ms)
        slow = (latency_ms[first] > threshold_ms[first])[inverse].astype(np.float64)
        self.slow.extend(slow[judged], entity[judged], call[judged])
        call_latency = latency_ms[first]
        which = np.searchsorted(LATENCY_EDGES_MS, call_latency, side="right")
        self.latency_counts += np.bincount(which, minlength=len(self.latency_counts))
        ok = ~failed & np.isfinite(score)
        self.score_counts += _score_histogram(score[ok])
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
            self.paired_counts += _score_histogram(score[both])
            self.paired_champion_counts += _score_histogram(paired_score[both])

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
    latency_threshold_ms: float  # the pre-rollout reference (NaN: none; the step's first chunk is not judged)
    champion: ArmStats = field(init=False)
    canary: ArmStats = field(init=False)
    # Canary − champion over the same time (see the module docstring), at the guardrail's whole α.
    error_difference: ConcurrentDifference = field(init=False)  # failed calls, the canary's × `size_factor`
    # Routed calls (run or not) by their rows: champion_call_sizes[s] calls of s rows.
    champion_call_sizes: IntArray = field(default_factory=lambda: np.zeros(1, np.int64))
    canary_call_sizes: IntArray = field(default_factory=lambda: np.zeros(1, np.int64))
    slow_difference: ConcurrentDifference = field(init=False)
    latency: LatencyThreshold = field(init=False)

    def __post_init__(self) -> None:
        half = self.settings.test_alpha / 2
        self.champion = ArmStats(half)
        self.canary = ArmStats(half)
        self.slow_difference = ConcurrentDifference(self.settings.test_alpha)
        self.error_difference = ConcurrentDifference(self.settings.test_alpha)
        self.latency = LatencyThreshold(self.latency_threshold_ms, self.settings.latency_p99_floor_ms)

    def add_served(self, entity: npt.ArrayLike, call: npt.ArrayLike, on_canary: npt.ArrayLike,
                   score: npt.ArrayLike, failed: npt.ArrayLike, latency_ms: npt.ArrayLike,
                   champion_score: npt.ArrayLike | None = None, ran: npt.ArrayLike | None = None) -> StepStats:
        """Rows routed in this step: routing unit and call codes, arm, score (NaN on failure), failure and the
        call's latency, one value per row; `champion_score`: the champion's score of a canary row (paired,
        NaN where not); `ran`: False for rows whose arm never ran (the request failed first) — they count
        as routed units for the sample-ratio check, and as calls neither failed nor slow for the error rate
        and latency (see below)."""
        e, c, arm = _codes(entity, call, on_canary)
        s, f, lat = (np.asarray(score, np.float64), np.asarray(failed, bool), np.asarray(latency_ms, np.float64))
        paired = np.full(len(s), np.nan) if champion_score is None else np.asarray(champion_score, np.float64)
        done = np.ones(len(s), bool) if ran is None else np.asarray(ran, bool)
        _same_length(e, s, f, lat, paired, done)
        # Error rate and latency take every routed call, run or not: when the champion's failure stops the
        # canary's call of a request, a block left without that call would close later, and the champion's
        # failures (often slow: timeouts) would weigh less than its successes (a champion failing 5 % of its
        # calls read 2.8 %). A call never made neither failed nor was slow: the canary's rates are then at
        # most its own, never above them.
        order, inverse, first, sizes = _calls_in_order(c)
        call_arm, rows = arm[first][order], sizes[order].astype(np.int64)
        call_failed = (np.bincount(inverse, weights=(f & done).astype(np.float64), minlength=len(sizes)) > 0)[order]
        self.champion_call_sizes = _count_sizes(self.champion_call_sizes, rows[~call_arm])
        self.canary_call_sizes = _count_sizes(self.canary_call_sizes, rows[call_arm])
        factor = size_factor(self.champion_call_sizes, self.canary_call_sizes)
        self.error_difference.extend(np.where(call_arm, factor * call_failed, call_failed.astype(np.float64)),
                                     call_arm)
        call_latency = np.where(done[first], lat[first], np.nan)[order]
        call_threshold = self.latency.thresholds(call_latency, call_arm)
        judged = np.isfinite(call_threshold)
        self.slow_difference.extend((call_latency > call_threshold)[judged].astype(np.float64), call_arm[judged])
        by_call = np.empty(len(sizes))
        by_call[order] = call_threshold
        threshold = by_call[inverse]
        for stats, mask in ((self.champion, ~arm), (self.canary, arm)):
            stats.add_routed(e[mask])
            mask = mask & done
            stats.add_served(e[mask], c[mask], s[mask], f[mask], lat[mask], paired[mask], threshold[mask])
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


def size_factor(champion_call_sizes: IntArray, canary_call_sizes: IntArray) -> float:
    """What one failed canary call counts for, so that calls of different sizes never count against an equal
    canary: min(1, min over t of E[min(S_champion, t)] / E[min(S_canary, t)]), S an arm's rows per call
    (`*_call_sizes[s]`: calls of s rows).

    A call of s rows may fail at a rate of its own (a timeout), because a row breaks it (failures grow with
    rows), or both: p(s) = 1 − (1 − a)(1 − b)^s. Each row adds no more to p than the row before, so p is a
    mix, with weights ≥ 0, of the curves min(s, t), t = 1, 2, …; for every such curve, an equal canary's
    failures × this factor are at most the champion's in expectation. Where the canary's calls are no larger
    (steps up to ½: E[min(S_canary, t)] ≤ E[min(S_champion, t)] for every t) it is 1 and the calls are
    compared as they are; where they are larger it scales the canary down by what its extra rows could
    explain (at most the ratio of mean sizes)."""
    top = max(len(champion_call_sizes), len(canary_call_sizes))
    expected = []
    for counts in (champion_call_sizes, canary_call_sizes):
        total = counts.sum()
        if total == 0:
            return 1.0
        survival = 1.0 - np.cumsum(np.pad(counts, (0, top - len(counts)))) / total  # P(S > k), k = 0 … top − 1
        expected.append(np.cumsum(survival)[:-1])  # E[min(S, t)], t = 1 … top − 1
    champion, canary = expected
    return float(min(1.0, np.min(champion / canary, initial=1.0)))


def _count_sizes(counts: IntArray, rows: IntArray) -> IntArray:
    grown = np.bincount(rows, minlength=len(counts))
    grown[:len(counts)] += counts
    return grown


def _codes(entity: npt.ArrayLike, call: npt.ArrayLike,
           on_canary: npt.ArrayLike) -> tuple[IntArray, IntArray, BoolArray]:
    e, c, arm = np.asarray(entity, np.int64), np.asarray(call, np.int64), np.asarray(on_canary, bool)
    _same_length(e, c, arm)
    return e, c, arm


def _calls_in_order(call: IntArray) -> tuple[IntArray, IntArray, IntArray, FloatArray]:
    """A batch's calls: their order by first row (time), each row's call index, each call's first row and
    its number of rows."""
    _, first, inverse, sizes = np.unique(call, return_index=True, return_inverse=True, return_counts=True)
    return (np.argsort(first, kind="stable").astype(np.int64), inverse.astype(np.int64), first.astype(np.int64),
            sizes.astype(np.float64))


def _same_length(first: npt.NDArray[Any], *others: npt.NDArray[Any]) -> None:
    if first.ndim != 1 or any(o.shape != first.shape for o in others):
        raise ValueError("every column of a batch must be 1-d with one value per row")
