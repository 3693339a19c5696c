"""Means of clustered rows and their variance: the unit of a comparison is the unit that was randomised.

A canary routes whole entities (users) to an arm and one model call scores many rows, so rows are not
independent: an entity's rows share its risk, a request's rows share one call (one error, often one label).
A row-level variance then understates the noise by the design effect and every test built on it fires too
often. `ClusteredMean` keeps, besides the row sums, the sums per cluster that a cluster-robust variance of
the ratio mean R = ΣY / ΣN needs, for two ways of clustering at once (entity and call):

    V_g = G/(G − 1) · Σ_g (Y_g − R·N_g)² / (ΣN)²          (one-way, clusters g; CR1)
    V   = max(V_entity + V_call − V_entity∩call, V_entity, V_call)

(the two-way estimator of Cameron, Gelbach & Miller 2011, kept at least as large as either one-way
variance). `CallSequence` uses the ratio of that variance to the by-call one (the design effect of units that
come back) to widen a betting confidence sequence over calls, which is exact only for independent calls. Sums of squares per cluster expand as ΣY² − 2R·ΣYN + R²·ΣN², so the state is a handful of
floats plus running per-entity totals; calls (and entity × call cells) never span two `extend` calls, since
a call's rows are logged together.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from quiver.monitoring.sequential import BoundedMeanSequence, stretched

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

# A variance of the mean this small (values of order one, sums of squares cancelling) is floating-point
# rounding, not spread (a standard error of 1e-7 decides nothing at any floor); two of them have no meaningful
# ratio: identical models score the same rows 1e-10 apart, and the "design effect" of that noise came out
# anywhere from 1 to hundreds, making the interval's width a coin toss.
_ROUNDING_NOISE = 1e-14


@dataclass
class _Moments:
    """Σ over clusters of Y², Y·N and N², and the number of clusters."""

    yy: float = 0.0
    yn: float = 0.0
    nn: float = 0.0
    clusters: int = 0

    def add(self, y: FloatArray, n: FloatArray, clusters: int = 0) -> None:
        self.yy += float(np.dot(y, y))
        self.yn += float(np.dot(y, n))
        self.nn += float(np.dot(n, n))
        self.clusters += clusters

    def variance(self, ratio: float, total: float) -> float:
        if self.clusters < 2 or total <= 0:
            return math.inf
        squares = max(0.0, self.yy - 2 * ratio * self.yn + ratio * ratio * self.nn)
        return self.clusters / (self.clusters - 1) * squares / (total * total)


@dataclass
class ClusteredMean:
    """Running ratio mean of row values with a two-way (entity × call) cluster-robust variance."""

    total: float = 0.0  # Σ weight · value
    rows: int = 0
    weight: float = 0.0  # Σ weights (= rows unless rows are weighted)
    _entity: _Moments = field(default_factory=_Moments)
    _call: _Moments = field(default_factory=_Moments)
    _cell: _Moments = field(default_factory=_Moments)
    _entity_sum: FloatArray = field(default_factory=lambda: np.zeros(0))
    _entity_rows: FloatArray = field(default_factory=lambda: np.zeros(0))

    def extend(self, values: npt.ArrayLike, entity: npt.ArrayLike, call: npt.ArrayLike,
               weights: npt.ArrayLike | None = None) -> ClusteredMean:
        """Add rows: their values, routing-unit codes (small non-negative ints) and call codes (calls must
        be complete: every row of a call in this one batch); `weights` (default 1) weigh rows in the mean,
        e.g. 1 / rows of its call for a mean over calls."""
        y = np.asarray(values, dtype=np.float64)
        e = np.asarray(entity, dtype=np.int64)
        c = np.asarray(call, dtype=np.int64)
        w = np.ones_like(y) if weights is None else np.asarray(weights, dtype=np.float64)
        if not (y.shape == e.shape == c.shape == w.shape) or y.ndim != 1:
            raise ValueError("values, entity, call and weights must be 1-d arrays of one length")
        if y.size == 0:
            return self
        if not (np.isfinite(y).all() and np.isfinite(w).all()) or w.min() <= 0:
            raise ValueError("ClusteredMean takes finite values and positive weights")
        if e.min() < 0:
            raise ValueError("entity codes must be non-negative")
        wy = w * y
        self.total += float(wy.sum())
        self.rows += int(y.size)
        self.weight += float(w.sum())
        for moments, codes in ((self._call, c), (self._cell, e * (int(c.max()) + 1) + (c - int(c.min())))):
            _, inverse = np.unique(codes, return_inverse=True)
            sums = np.bincount(inverse, weights=wy).astype(np.float64)
            counts = np.bincount(inverse, weights=w).astype(np.float64)
            moments.add(sums, counts, len(sums))
        self._add_entities(wy, e, w)
        return self

    def _add_entities(self, y: FloatArray, e: IntArray, w: FloatArray) -> None:
        top = int(e.max()) + 1
        if top > len(self._entity_sum):
            size = max(top, 2 * len(self._entity_sum))
            self._entity_sum = np.concatenate([self._entity_sum, np.zeros(size - len(self._entity_sum))])
            self._entity_rows = np.concatenate([self._entity_rows, np.zeros(size - len(self._entity_rows))])
        touched, inverse = np.unique(e, return_inverse=True)
        dy = np.bincount(inverse, weights=y)
        dn = np.bincount(inverse, weights=w)
        old_y, old_n = self._entity_sum[touched], self._entity_rows[touched]
        new_y, new_n = old_y + dy, old_n + dn
        # Replace each touched entity's old contribution to the moments with its new one.
        self._entity.yy += float(np.dot(new_y, new_y) - np.dot(old_y, old_y))
        self._entity.yn += float(np.dot(new_y, new_n) - np.dot(old_y, old_n))
        self._entity.nn += float(np.dot(new_n, new_n) - np.dot(old_n, old_n))
        self._entity.clusters += int(np.count_nonzero(old_n == 0))
        self._entity_sum[touched], self._entity_rows[touched] = new_y, new_n

    @property
    def mean(self) -> float:
        return self.total / self.weight if self.rows else math.nan

    @property
    def entities(self) -> int:
        return self._entity.clusters

    @property
    def calls(self) -> int:
        return self._call.clusters

    def variance(self) -> float:
        """Two-way cluster-robust variance of `mean` (inf with fewer than two clusters either way)."""
        if self.rows == 0:
            return math.inf
        ratio = self.mean
        by_entity = self._entity.variance(ratio, self.weight)
        by_call = self._call.variance(ratio, self.weight)
        both = by_entity + by_call - self._cell.variance(ratio, self.weight)
        return max(both, by_entity, by_call)

    def between_variance(self) -> float:
        """The part of `variance` that more rows from the same routing units cannot shrink: the entity term
        less the entity × call cells' (what is left is the covariance of a unit's rows with each other),
        at least 0. About 0 while every unit is seen once; when units come back, the floor the interval
        narrows to until new units arrive."""
        if self.rows == 0:
            return math.inf
        ratio = self.mean
        return max(0.0, self._entity.variance(ratio, self.weight) - self._cell.variance(ratio, self.weight))

    def call_variance(self) -> float:
        """The one-way variance by call: right when calls are independent (no unit comes back)."""
        return self._call.variance(self.mean, self.weight) if self.rows else math.inf

    def design_effect(self) -> float:
        """Two-way over by-call variance, at least 1: how much repeat units widen an independent-calls
        interval (1 while either is undefined)."""
        by_call, both = self.call_variance(), self.variance()
        if not (math.isfinite(by_call) and math.isfinite(both)) or min(by_call, both) <= _ROUNDING_NOISE:
            return 1.0
        return max(1.0, both / by_call)

    def row_variance(self) -> float:
        """The naive variance that treats every row as independent (reported beside, never used)."""
        return self._cell.variance(self.mean, self.weight) if self.rows else math.inf


def kish_effective_size(rows_per_unit: npt.ArrayLike) -> float:
    """(Σn)² / Σn²: how many independent rows clustered rows are worth when a unit's rows are fully
    correlated (the worst case, so a bound built on it stays valid whatever the correlation)."""
    n = np.asarray(rows_per_unit, dtype=np.float64)
    squares = float(np.dot(n, n))
    return float(n.sum()) ** 2 / squares if squares > 0 else 0.0


@dataclass
class CallSequence:
    """A mean over model calls of row values in [0, 1] (a call's value: the mean of its rows).

    The betting confidence sequence of the per-call values (`BoundedMeanSequence`) is exact when calls are
    independent; a routing unit that comes back makes its calls alike, and the true spread grows by the
    design effect (`ClusteredMean.design_effect`, entity × call). The interval is the betting one with each
    side stretched from the mean by √(design effect): never narrower than the exact independent-calls
    sequence, and right to first order when units repeat (asymptotic, like every clustered variance)."""

    alpha: float
    sequence: BoundedMeanSequence = field(init=False)
    clustered: ClusteredMean = field(default_factory=ClusteredMean)

    def __post_init__(self) -> None:
        self.sequence = BoundedMeanSequence(self.alpha)

    def extend(self, values: npt.ArrayLike, entity: npt.ArrayLike, call: npt.ArrayLike) -> CallSequence:
        """Rows of complete calls (values in [0, 1]); calls enter in the order they first appear."""
        y = np.asarray(values, dtype=np.float64)
        c = np.asarray(call, dtype=np.int64)
        if y.size == 0:
            return self
        _, first, inverse, counts = np.unique(c, return_index=True, return_inverse=True, return_counts=True)
        means = np.bincount(inverse, weights=y) / counts
        self.sequence.extend(np.clip(means[np.argsort(first, kind="stable")], 0.0, 1.0))
        self.clustered.extend(y, entity, c, weights=1.0 / counts[inverse])
        return self

    @property
    def n(self) -> int:
        return int(self.sequence.n)

    @property
    def total(self) -> float:
        return float(self.sequence.total)

    @property
    def mean(self) -> float:
        return float(self.sequence.mean)

    def design_effect(self) -> float:
        return self.clustered.design_effect()

    def interval(self) -> tuple[float, float]:
        """(lower, upper) at level 1 − α, widened by the design effect; (0, 1) before any call."""
        return stretched(self.sequence, math.sqrt(self.design_effect()) if self.n else 1.0)
