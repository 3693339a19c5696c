"""Means of clustered rows and their variance: the unit of a comparison is the unit that was randomised.

A canary routes whole entities (users) to an arm and one model call scores many rows, so rows are not
independent: an entity's rows share its risk, a request's rows share one call (one error, often one label).
A row-level variance then understates the noise by the design effect and every test built on it fires too
often. `ClusteredMean` keeps, besides the row sums, the sums per cluster that a cluster-robust variance of
the ratio mean R = ΣY / ΣN needs, for two ways of clustering at once (entity and call):

    V_g = G/(G − 1) · Σ_g (Y_g − R·N_g)² / (ΣN)²          (one-way, clusters g; CR1)
    V   = max(V_entity + V_call − V_entity∩call, V_entity, V_call)

(the two-way estimator of Cameron, Gelbach & Miller 2011, kept at least as large as either one-way
variance). Sums of squares per cluster expand as ΣY² − 2R·ΣYN + R²·ΣN², so the state is a handful of
floats plus running per-entity totals; calls (and entity × call cells) never span two `extend` calls, since
a call's rows are logged together.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


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

    total: float = 0.0  # Σ values
    rows: int = 0
    _entity: _Moments = field(default_factory=_Moments)
    _call: _Moments = field(default_factory=_Moments)
    _cell: _Moments = field(default_factory=_Moments)
    _entity_sum: FloatArray = field(default_factory=lambda: np.zeros(0))
    _entity_rows: FloatArray = field(default_factory=lambda: np.zeros(0))

    def extend(self, values: npt.ArrayLike, entity: npt.ArrayLike, call: npt.ArrayLike) -> ClusteredMean:
        """Add rows: their values, routing-unit codes (small non-negative ints) and call codes (calls must
        be complete: every row of a call in this one batch)."""
        y = np.asarray(values, dtype=np.float64)
        e = np.asarray(entity, dtype=np.int64)
        c = np.asarray(call, dtype=np.int64)
        if not (y.shape == e.shape == c.shape) or y.ndim != 1:
            raise ValueError("values, entity and call must be 1-d arrays of one length")
        if y.size == 0:
            return self
        if not np.isfinite(y).all():
            raise ValueError("ClusteredMean takes finite values")
        if e.min() < 0:
            raise ValueError("entity codes must be non-negative")
        self.total += float(y.sum())
        self.rows += int(y.size)
        for moments, codes in ((self._call, c), (self._cell, e * (int(c.max()) + 1) + (c - int(c.min())))):
            _, inverse = np.unique(codes, return_inverse=True)
            sums = np.bincount(inverse, weights=y)
            counts = np.bincount(inverse).astype(np.float64)
            moments.add(sums, counts, len(sums))
        self._add_entities(y, e)
        return self

    def _add_entities(self, y: FloatArray, e: IntArray) -> None:
        top = int(e.max()) + 1
        if top > len(self._entity_sum):
            size = max(top, 2 * len(self._entity_sum))
            self._entity_sum = np.concatenate([self._entity_sum, np.zeros(size - len(self._entity_sum))])
            self._entity_rows = np.concatenate([self._entity_rows, np.zeros(size - len(self._entity_rows))])
        touched, inverse = np.unique(e, return_inverse=True)
        dy = np.bincount(inverse, weights=y)
        dn = np.bincount(inverse).astype(np.float64)
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
        return self.total / self.rows if self.rows else math.nan

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
        by_entity = self._entity.variance(ratio, self.rows)
        by_call = self._call.variance(ratio, self.rows)
        both = by_entity + by_call - self._cell.variance(ratio, self.rows)
        return max(both, by_entity, by_call)

    def row_variance(self) -> float:
        """The naive variance that treats every row as independent (reported beside, never used)."""
        return self._cell.variance(self.mean, self.rows) if self.rows else math.inf


def kish_effective_size(rows_per_unit: npt.ArrayLike) -> float:
    """(Σn)² / Σn²: how many independent rows clustered rows are worth when a unit's rows are fully
    correlated (the worst case, so a bound built on it stays valid whatever the correlation)."""
    n = np.asarray(rows_per_unit, dtype=np.float64)
    squares = float(np.dot(n, n))
    return float(n.sum()) ** 2 / squares if squares > 0 else 0.0
