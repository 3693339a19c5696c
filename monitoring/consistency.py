"""Online/offline consistency, the arithmetic: served values against point-in-time values, row by row, and
why the rows that differ differ. Arrays in, numbers out; no I/O (the job is `consistency_job`).

Equality (`equal`): two missing values are equal; a missing and a present value are not; numbers are equal
when ``|a - b| <= max(ATOL, RTOL * max(|a|, |b|))`` — online merges the same partials offline merges, so only
the last bits of a float may differ (summation order), never a real amount; everything else (text, and
numbers of different kinds) must be identical. Missing means null, or NaN: the serving log records a missing
float input as NaN, so NaN is read as missing on both sides (and NaN against NaN is equal).

Causes of a row that differs, the first that holds (`classify`):
1. late_event: serving could not have known better — recomputed with only the events that had arrived by
   the request, offline equals what was served;
2. ttl_boundary: one side is missing and moving the TTL by a small margin makes offline agree with serving;
3. stream_lag: served equals the point-in-time value at an earlier moment (within the lag allowed, or the
   view's last materialization);
4. materialization_gap: the view served nothing for the entity (every feature missing, or a count / sum at
   its empty value) while offline had values;
5. unexplained.
Only a late event leaves serving blameless, so a feature's `wrong` rows are every differing row but those.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

RTOL = 1e-9  # relative tolerance of float equality
ATOL = 1e-12  # absolute floor, for values that cancel to about zero (a mean of +x and -x)
DEFAULT_THRESHOLD = 0.001  # share of compared rows that may be wrong before a feature alerts (0.1 %)

EQUAL, LATE_EVENT, TTL_BOUNDARY, STREAM_LAG, MATERIALIZATION_GAP, UNEXPLAINED = range(6)
CAUSES = ("late_event", "ttl_boundary", "stream_lag", "materialization_gap", "unexplained")


@dataclass(frozen=True)
class Values:
    """One side of a comparison: values (float64 for numbers, bools and times; objects otherwise) and which
    are missing."""

    values: np.ndarray
    missing: np.ndarray
    numeric: bool

    def __len__(self) -> int:
        return len(self.values)

    def take(self, index: np.ndarray) -> Values:
        return Values(self.values[index], self.missing[index], self.numeric)


def as_values(data: pa.Array | pa.ChunkedArray | np.ndarray | Sequence[Any]) -> Values:
    """Arrow, numpy or plain values as `Values` (nulls and NaN missing; bools 0/1; times as epoch µs)."""
    array = data if isinstance(data, pa.Array | pa.ChunkedArray) else pa.array(
        data.tolist() if isinstance(data, np.ndarray) and data.dtype == object else data, from_pandas=True)
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks() if array.num_chunks != 1 else array.chunk(0)
    kind = array.type
    if pa.types.is_dictionary(kind):
        array = array.dictionary_decode()
        kind = array.type
    null = array.is_null().to_numpy(zero_copy_only=False)
    if pa.types.is_timestamp(kind) or pa.types.is_date(kind) or pa.types.is_duration(kind):
        array = array.cast(pa.int64())
        kind = pa.int64()
    if pa.types.is_boolean(kind):
        array = array.cast(pa.int8())
        kind = pa.int8()
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_null(kind):
        values = pc.fill_null(array.cast(pa.float64()), 0.0).to_numpy(zero_copy_only=False).astype(np.float64)
        return Values(values, null | np.isnan(values), True)
    return Values(array.to_numpy(zero_copy_only=False).astype(object), null, False)


def equal(a: Values, b: Values, rtol: float = RTOL, atol: float = ATOL) -> np.ndarray:
    """Row by row, whether `a` and `b` hold the same value (see the module docstring)."""
    both = ~a.missing & ~b.missing
    if a.numeric and b.numeric:
        with np.errstate(invalid="ignore"):
            scale = np.maximum(np.abs(a.values), np.abs(b.values))
            close = (np.abs(a.values - b.values) <= np.maximum(atol, rtol * scale)) | (a.values == b.values)
    else:
        left = a.values if not a.numeric else _plain(a)
        right = b.values if not b.numeric else _plain(b)
        close = np.fromiter((x == y for x, y in zip(left, right, strict=True)), bool, len(a))
    same: np.ndarray = (a.missing & b.missing) | (both & close)
    return same


def _plain(side: Values) -> np.ndarray:
    # Numbers met by text (a key logged as "7" in a mixed flush): compare as Python numbers.
    return np.array([int(v) if float(v).is_integer() else float(v) for v in side.values], dtype=object)


def smape(served: Values, offline: Values, rows: np.ndarray) -> float | None:
    """Symmetric mean absolute percentage error over `rows` (a mask) where both sides hold numbers:
    mean of |a - b| / ((|a| + |b|) / 2), between 0 and 2; None without such rows."""
    if not (served.numeric and offline.numeric):
        return None
    use = rows & ~served.missing & ~offline.missing
    if not use.any():
        return None
    a, b = served.values[use], offline.values[use]
    scale = (np.abs(a) + np.abs(b)) / 2
    with np.errstate(invalid="ignore", divide="ignore"):
        terms = np.where(scale > 0, np.abs(a - b) / scale, 0.0)
    return float(np.mean(terms))


# ----- evidence for each cause: a mask of the rows the cause explains -----


def late_evidence(served: Values, known: Values, unseen: np.ndarray) -> np.ndarray:
    """Rows with events that arrived after the request (`unseen`) whose offline value recomputed without
    them (`known`) equals what was served."""
    found: np.ndarray = unseen & equal(served, known)
    return found


def ttl_evidence(served: Values, offline: Values, shorter: Values, longer: Values) -> np.ndarray:
    """Rows where one side is missing only because of where the TTL edge fell: serving had nothing while
    offline's value expires within the margin (gone with the TTL shortened by it), or serving kept a value
    offline had just expired (the one offline finds with the TTL lengthened by the margin)."""
    expired_online = served.missing & ~offline.missing & shorter.missing
    kept_online = ~served.missing & offline.missing & equal(served, longer)
    found: np.ndarray = expired_online | kept_online
    return found


def lag_evidence(served: Values, earlier: Sequence[Values]) -> np.ndarray:
    """Rows whose served value equals the point-in-time value at one of the `earlier` moments."""
    found = np.zeros(len(served), dtype=bool)
    for candidate in earlier:
        found |= equal(served, candidate)
    return found


def lag_seconds(served: Values, earlier: Sequence[Values], t_us: np.ndarray,
                moments: Sequence[np.ndarray]) -> np.ndarray:
    """Per row, how far behind the request (seconds) the nearest `earlier` moment whose value was served lies;
    NaN where none was. Tried moments are a ladder, so this bounds the true lag from above."""
    best = np.full(len(served), np.inf)
    for candidate, moment in zip(earlier, moments, strict=True):
        behind = (t_us - moment) / 1e6
        best = np.where(equal(served, candidate) & (behind < best), behind, best)
    return np.where(np.isfinite(best), best, np.nan)


def empty_rows(sides: Sequence[Values], zero_is_empty: Sequence[bool]) -> np.ndarray:
    """Rows where a view has nothing: every feature missing, a count or sum (`zero_is_empty`) at 0."""
    if not sides:
        raise ValueError("empty_rows needs at least one feature")
    empty = np.ones(len(sides[0]), dtype=bool)
    for side, zero in zip(sides, zero_is_empty, strict=True):
        nothing = side.missing | (side.values == 0) if zero and side.numeric else side.missing
        empty &= nothing
    return empty


def classify(same: np.ndarray, *, late: np.ndarray | None = None, ttl: np.ndarray | None = None,
             lag: np.ndarray | None = None, gap: np.ndarray | None = None) -> np.ndarray:
    """Cause code per row (EQUAL where `same`), the first cause whose evidence holds, else UNEXPLAINED."""
    codes = np.where(same, EQUAL, UNEXPLAINED).astype(np.int8)
    # Lowest precedence first: each later assignment overrides the ones before it.
    for code, evidence in ((MATERIALIZATION_GAP, gap), (STREAM_LAG, lag), (TTL_BOUNDARY, ttl),
                           (LATE_EVENT, late)):
        if evidence is not None:
            codes[~same & evidence] = code
    return codes


# ----- per feature -----


@dataclass(frozen=True)
class FeatureConsistency:
    """One feature over the compared rows: counts, causes, the size of the differences, the verdict."""

    feature: str  # view:feature
    compared: int
    equal: int
    mismatched: int  # both sides present, values differ
    missing_online: int  # served missing, offline present
    missing_offline: int  # served present, offline missing
    causes: Mapping[str, int]  # cause → rows, over every row that differs
    smape: float | None  # over the mismatched rows (0 … 2)
    threshold: float
    examples: tuple[Mapping[str, Any], ...] = ()  # a few differing rows, for whoever investigates
    # Freshness: how far behind its events serving read (seconds; 0 on equal rows, the lag found on stream-lag
    # rows) over the rows whose staleness is known, and the view's objective for its p99 (None: none stated).
    lag_p50_s: float | None = None
    lag_p99_s: float | None = None
    objective_s: float | None = None

    @property
    def late(self) -> int:
        return int(self.causes.get("late_event", 0))

    @property
    def lagging(self) -> int:
        return int(self.causes.get("stream_lag", 0))

    @property
    def wrong(self) -> int:
        """Rows that differ for any reason but a late event (and, where the view states a freshness objective,
        stream lag: counted against the objective instead): what serving got wrong."""
        return self.compared - self.equal - self.late - (self.lagging if self.objective_s is not None else 0)

    @property
    def wrong_rate(self) -> float:
        return self.wrong / self.compared if self.compared else 0.0

    @property
    def freshness_status(self) -> str | None:
        """"ok" or "over" the view's objective (p99 lag); None without an objective or a measured lag."""
        if self.objective_s is None or self.lag_p99_s is None:
            return None
        return "over" if self.lag_p99_s > self.objective_s else "ok"

    @property
    def status(self) -> str:
        if not self.compared:
            return "no_rows"
        return "alert" if self.wrong_rate > self.threshold or self.freshness_status == "over" else "ok"

    def to_dict(self) -> dict[str, Any]:
        return {"feature": self.feature, "status": self.status, "compared": self.compared, "equal": self.equal,
                "mismatched": self.mismatched, "missing_online": self.missing_online,
                "missing_offline": self.missing_offline, "late": self.late, "wrong": self.wrong,
                "wrong_rate": self.wrong_rate, "threshold": self.threshold, "smape": self.smape,
                "causes": {c: int(self.causes.get(c, 0)) for c in CAUSES}, "examples": list(self.examples),
                "freshness": {"lag_p50_s": self.lag_p50_s, "lag_p99_s": self.lag_p99_s,
                              "objective_s": self.objective_s, "status": self.freshness_status}}


def summarize(feature: str, served: Values, offline: Values, codes: np.ndarray, threshold: float,
              examples: Sequence[Mapping[str, Any]] = (), *, lag_s: np.ndarray | None = None,
              objective_s: float | None = None) -> FeatureConsistency:
    """Counts of one feature from its two sides and the cause codes of `classify`; `lag_s` per row (seconds
    behind, on stream-lag rows) gives the lag distribution, measured against `objective_s`."""
    differs = codes != EQUAL
    both = ~served.missing & ~offline.missing
    mismatched = differs & both
    counts = np.bincount(codes.astype(np.int64), minlength=len(CAUSES) + 1)
    return FeatureConsistency(
        feature=feature, compared=len(codes), equal=int(counts[EQUAL]), mismatched=int(mismatched.sum()),
        missing_online=int((differs & served.missing & ~offline.missing).sum()),
        missing_offline=int((differs & ~served.missing & offline.missing).sum()),
        causes={name: int(counts[code]) for code, name in enumerate(CAUSES, start=1)},
        smape=smape(served, offline, mismatched), threshold=threshold, examples=tuple(examples),
        **_lag_quantiles(codes, lag_s), objective_s=objective_s)


def _lag_quantiles(codes: np.ndarray, lag_s: np.ndarray | None) -> dict[str, float | None]:
    """p50 and p99 of the lag over the rows whose staleness is known: 0 where equal, the lag found where
    stream lag explains the row (rows of other causes say nothing about freshness)."""
    if lag_s is None:
        return {}
    known = np.where(codes == EQUAL, 0.0, np.where(codes == STREAM_LAG, lag_s, np.nan))
    known = known[np.isfinite(known)]
    if not len(known):
        return {"lag_p50_s": None, "lag_p99_s": None}
    return {"lag_p50_s": float(np.quantile(known, 0.5)), "lag_p99_s": float(np.quantile(known, 0.99))}


@dataclass(frozen=True)
class ConsistencyReport:
    """One run of the consistency job: what was compared, over which window, and per feature."""

    subject: str  # "model fraud_model" or "service fraud"
    window: tuple[str, str]  # ISO start, end
    rows_logged: int  # serving-log rows of the window in scope
    rows_compared: int  # after sampling
    features: tuple[FeatureConsistency, ...]
    notes: tuple[str, ...] = ()  # what the causes could and could not use, features left out
    rtol: float = RTOL
    elapsed_s: float = 0.0
    details: Mapping[str, Any] = field(default_factory=dict)

    @property
    def sampled(self) -> bool:
        return self.rows_compared < self.rows_logged

    @property
    def inconsistent(self) -> list[FeatureConsistency]:
        return [f for f in self.features if f.status == "alert"]

    def to_dict(self) -> dict[str, Any]:
        return {"subject": self.subject, "window": {"start": self.window[0], "end": self.window[1]},
                "rows_logged": self.rows_logged, "rows_compared": self.rows_compared, "sampled": self.sampled,
                "rtol": self.rtol, "atol": ATOL, "elapsed_s": self.elapsed_s, "notes": list(self.notes),
                "inconsistent": [f.feature for f in self.inconsistent],
                "features": [f.to_dict() for f in self.features], **dict(self.details)}
