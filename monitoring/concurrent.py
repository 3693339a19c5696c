"""Canary − champion over the same stretch of time, so that a shift both arms share cancels.

A betting confidence sequence is centred on a weighted mean of its observations, the weights being its bets,
and each arm's plug-in bets follow its own count and spread: at a 5 % step the canary's are capped for its
first few hundred calls (~10k requests) while the champion's already shrink like 1/√t, so the two centres
weigh the same moments differently. On traffic whose error rate rises from 0 to 5 % over a step, per-arm
sequences excluded zero in 6 of 20 A/A runs (0 → 20 %: 20 of 20). Here the arms are put on **one clock of
blocks**, with **the same bets**:

* calls enter in time order; a block is one run of champion calls and the run of canary calls right after it
  (at a 5 % step: ~19 champion calls, then one canary call), so every block holds both arms and spans a
  short, shared stretch of time;
* block k gives each arm one observation (the weighted mean of its calls there) and its difference
  d_k = canary − champion one more;
* the difference sequence (`BoundedMeanSequence` on (d + 1)/2) bets on its own plug-in rule; both arms'
  sequences take the same bet λ_k at block k (the difference's rule on d's own scale), so their centres weigh
  every block alike and a trend both share cancels exactly;
* the interval is the intersection, each at α/2, of the difference's sequence (sharpest when both arms vary)
  and the arms' bounds by union (sharpest near a rate of zero, where a sequence on [0, 1] is one-sided).

A block closes when the next champion call after its canary run arrives; the last block of a batch stays
open, so the sequences are the same whatever the batch sizes.

`LatencyThreshold` keeps the latency guardrail's threshold with the traffic: the champion's p99 over its last
calls (whole chunks, all before the call being judged, so the threshold is predictable) plus the floor, and
the pre-rollout reference only until the champion has made its first chunk of calls in the step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from quiver.monitoring.sequential import BoundedMeanSequence, stretched

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
# The cap on each bet. While nothing varies (no errors yet) a sequence narrows at (ln(2/α) + penalty) /
# (cap × observations), and blocks are fewer than calls (half as many per arm at a ½ step): with WSR's ½ an
# A/A canary would wait twice as long as on per-call sequences. Any predictable bet in [0, 1) keeps the
# sequence valid (WSR 2023, Theorem 2); 0.8 costs ψ(0.8) ≈ 0.81 × (x − μ̂)² per surprise.
TRUNCATION = 0.8


@dataclass
class ConcurrentDifference:
    """Canary − champion of per-call values in [0, 1], both arms on one clock of blocks with the same bets
    (see the module docstring); `alpha` is the interval's: α/2 for the difference's sequence, α/4 per arm."""

    alpha: float
    difference: BoundedMeanSequence = field(init=False)  # of (d + 1)/2
    canary: BoundedMeanSequence = field(init=False)
    champion: BoundedMeanSequence = field(init=False)
    # The open block: canary sum, canary weight, champion sum, champion weight; and whether its last call was
    # the canary's (a champion call after it starts the next block).
    _open: FloatArray = field(default_factory=lambda: np.zeros(4))
    _last_canary: bool = False

    def __post_init__(self) -> None:
        self.difference = BoundedMeanSequence(self.alpha / 2, truncation=TRUNCATION)
        self.canary = BoundedMeanSequence(self.alpha / 4, truncation=TRUNCATION)
        self.champion = BoundedMeanSequence(self.alpha / 4, truncation=TRUNCATION)

    def extend(self, values: npt.ArrayLike, on_canary: npt.ArrayLike,
               weights: npt.ArrayLike | None = None) -> ConcurrentDifference:
        """Per-call values in [0, 1] and arms, calls in time order; `weights` (default 1) weigh calls within
        an arm's part of a block (e.g. rows per call, for a share of rows)."""
        x = np.asarray(values, dtype=np.float64)
        canary = np.asarray(on_canary, dtype=bool)
        w = np.ones_like(x) if weights is None else np.asarray(weights, dtype=np.float64)
        if not x.shape == canary.shape == w.shape or x.ndim != 1:
            raise ValueError("values, on_canary and weights must be 1-d arrays of one length")
        if x.size == 0:
            return self
        if not np.isfinite(x).all() or x.min() < 0 or x.max() > 1 or not (w > 0).all():
            raise ValueError("ConcurrentDifference takes finite values in [0, 1] and positive weights")
        previous = np.concatenate(([self._last_canary], canary[:-1]))
        starts = ~canary & previous
        if self._open[3] == 0 and (~canary).any():
            starts[int(np.argmax(~canary))] = False  # the open block's first champion call joins it
        block = np.cumsum(starts)
        blocks = int(block[-1]) + 1
        sums = np.zeros((4, blocks))
        sums[0] = np.bincount(block, weights=np.where(canary, w * x, 0.0), minlength=blocks)
        sums[1] = np.bincount(block, weights=np.where(canary, w, 0.0), minlength=blocks)
        sums[2] = np.bincount(block, weights=np.where(canary, 0.0, w * x), minlength=blocks)
        sums[3] = np.bincount(block, weights=np.where(canary, 0.0, w), minlength=blocks)
        sums[:, 0] += self._open
        self._open = sums[:, -1].copy()
        self._last_canary = bool(canary[-1])
        closed = sums[:, :-1]  # each holds both arms: it ended on a canary run and began with a champion call
        if closed.shape[1]:
            canary_means = np.clip(closed[0] / closed[1], 0.0, 1.0)
            champion_means = np.clip(closed[2] / closed[3], 0.0, 1.0)
            self.difference.extend((canary_means - champion_means + 1) / 2)
            # The difference's plug-in bet on d's own scale (its variance is 4× that of (d + 1)/2): about what
            # the noisier arm would bet alone; the same for both arms.
            shared = np.minimum(self.difference.raw_bets / 2, TRUNCATION)
            self.canary.extend(canary_means, shared)
            self.champion.extend(champion_means, shared)
        return self

    @property
    def blocks(self) -> int:
        return self.canary.n

    @property
    def mean(self) -> float:
        """Canary − champion of the block means (NaN before the first closed block)."""
        return self.canary.mean - self.champion.mean if self.canary.n else math.nan

    def interval(self, stretch_canary: float = 1.0, stretch_champion: float = 1.0) -> tuple[float, float]:
        """(lower, upper) of the difference at level 1 − α: the difference's sequence ∩ [L_canary − U_champion,
        U_canary − L_champion], each stretched from its centre by √ of a routing unit's design effect (blocks
        of returning units are alike; the difference by the larger one); (−1, 1) before any closed block."""
        if self.canary.n == 0:
            return -1.0, 1.0
        canary = stretched(self.canary, stretch_canary)
        champion = stretched(self.champion, stretch_champion)
        low, high = stretched(self.difference, max(stretch_canary, stretch_champion))
        return max(2 * low - 1, canary[0] - champion[1]), min(2 * high - 1, canary[1] - champion[0])


@dataclass
class LatencyThreshold:
    """Each call's latency threshold: the champion's p99 over its last `window_chunks` × `chunk` calls before the
    call's chunk, plus `floor_ms`; `reference_ms` (the champion's p99 before the rollout, + the floor) while the
    champion has made fewer than `chunk` calls in this step (NaN there: those calls are not judged)."""

    reference_ms: float
    floor_ms: float
    chunk: int = 500
    window_chunks: int = 4
    # The champion's call latencies in order, from its call number `_kept_from` on: only the chunks a later
    # threshold can still read are kept, so a long step holds ~window_chunks × chunk values, not every call.
    _history: FloatArray = field(default_factory=lambda: np.zeros(0))
    _kept_from: int = 0
    _champion_calls: int = 0

    def thresholds(self, latency_ms: npt.ArrayLike, on_canary: npt.ArrayLike) -> FloatArray:
        """The threshold of each call (calls in time order); records the champion's calls."""
        latency = np.asarray(latency_ms, dtype=np.float64)
        canary = np.asarray(on_canary, dtype=bool)
        champion = ~canary
        before = self._champion_calls + np.cumsum(champion) - champion  # champion calls before each call
        self._history = np.concatenate([self._history, latency[champion]])
        self._champion_calls += int(champion.sum())
        chunk = before // self.chunk
        out = np.empty(len(latency))
        for index in np.unique(chunk):
            out[chunk == index] = self._of_chunk(int(index))
        needed = max(0, (self._champion_calls // self.chunk - self.window_chunks) * self.chunk)
        if needed > self._kept_from:
            self._history = self._history[needed - self._kept_from:]
            self._kept_from = needed
        return out

    def current_ms(self) -> float:
        """The threshold the next call would get."""
        return self._of_chunk(self._champion_calls // self.chunk)

    def _of_chunk(self, index: int) -> float:
        if index == 0:
            return self.reference_ms
        start = max(0, (index - self.window_chunks) * self.chunk) - self._kept_from
        window = self._history[start: index * self.chunk - self._kept_from]
        window = window[np.isfinite(window)]
        return float(np.quantile(window, 0.99)) + self.floor_ms if window.size else math.nan
