"""The drift reference stored with a model: a sample of the traffic the model was trained for.

Drift checks compare a day of serving traffic with this table, so it has to look like that traffic, every
hour of the day in its own share. A time-split tail (the newest labelled rows) does not: it holds the last
hours of the last labelled day, and hour-of-day features, and whatever follows the daily cycle, then
"drift" by construction.

`sample_reference` draws from every day of the training set, stratified by hour of day: each hour gets
its share of the window's *traffic* (every request of the window, its label arrived by the cutoff or not),
drawn at random (seeded) from the training rows of that hour, whichever days hold them. Knowledge time
thins the last days' late hours (their labels come last); stratifying keeps the daily cycle whole anyway,
and the draw still mixes every day the model learnt from (after a drift, the drifted days too: a model
retrained on drifted traffic is not "drifted" against it). The caller scores the sample with the final
model (rows it also trained on: only a whole-window sample covers every hour). `reference_coverage` says
what a reference covers and what makes it unfit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
import pandas as pd

from quiver.catalog.errors import QuiverError

ROWS_PER_DAY = 2_000  # times the days of the window; 14 days make 28k rows, plenty for PSI/KS and small on disk
MIN_ROWS = 500  # the drift check's min_samples: a smaller reference is never judged
THIN_SHARE = 0.5  # an hour holding less than this share of its traffic share in the training set is thin


@dataclass(frozen=True)
class Coverage:
    """What a reference holds (UTC days and hours of day) and why it may not represent the traffic."""

    rows: int
    days: list[str]  # YYYY-MM-DD with at least one row
    hours: list[int]  # hours of day (0-23) with at least one row
    thinned: dict[str, str] = field(default_factory=dict)  # day → how knowledge time thinned it
    problems: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ReferenceSample:
    """The sampled rows (the frame's own columns, time-ordered) and their coverage."""

    frame: pd.DataFrame
    coverage: Coverage


def sample_reference(frame: pd.DataFrame, timestamp_column: str, window_start: datetime, window_end: datetime, *,
                     window_timestamps: Sequence[Any] | pd.Series | None = None, rows_per_day: int = ROWS_PER_DAY,
                     seed: int = 0) -> ReferenceSample:
    """About `rows_per_day` × (days of traffic) rows of `frame` in [window_start, window_end), each hour of
    day in the share the window's traffic has it.

    `window_timestamps` are the times of every request (label row) of the window, arrived by the cutoff or
    not; without them the frame's own times stand for the traffic.
    """
    if timestamp_column not in frame.columns:
        raise QuiverError(f"drift reference: the training set lacks its timestamp column {timestamp_column!r}")
    if rows_per_day < 1:
        raise QuiverError(f"drift reference: rows_per_day must be >= 1, got {rows_per_day}")
    start, end = (_utc(t) for t in (window_start, window_end))
    ts = pd.to_datetime(frame[timestamp_column], utc=True)
    traffic = ts if window_timestamps is None else pd.to_datetime(pd.Series(window_timestamps), utc=True)
    traffic = traffic[(traffic >= start) & (traffic < end)].dropna()
    inside = ((ts >= start) & (ts < end)).to_numpy()
    quota = rows_per_day * max(traffic.dt.floor("D").nunique(), 1)
    shares = traffic.dt.hour.value_counts(normalize=True)
    rng = np.random.default_rng(seed)
    order = np.argsort(ts.to_numpy(), kind="stable")  # the draw depends on the rows, not on their order
    order = order[inside[order]]
    hour_of = ts.dt.hour.to_numpy()[order]
    pools = {int(h): order[hour_of == h] for h, share in shares.items() if share > 0}
    # The largest sample with exactly the traffic's mix: every hour's rows over its share bounds it. An hour
    # under-filled by more than THIN_SHARE next to the training set as a whole is thin: taken whole,
    # reported, and kept from shrinking the sample.
    capacity = {h: len(rows) / float(shares[h]) for h, rows in pools.items()}
    thin = sorted(h for h, c in capacity.items() if 0 < c < THIN_SHARE * len(order))
    fillable = [c for h, c in capacity.items() if c > 0 and h not in thin]
    total = min(float(quota), min(fillable, default=0.0))
    picked = []
    for hour, rows in sorted(pools.items()):
        want = round(total * float(shares[hour]))
        if len(rows) > want and hour not in thin:
            rows = rows[rng.choice(len(rows), want, replace=False)]
        picked.append(rows)
    chosen = np.concatenate(picked) if picked else np.empty(0, dtype=np.int64)
    chosen = order[np.isin(order, chosen)]  # back in time order: the stored table reads as a timeline
    sample = frame.iloc[chosen].reset_index(drop=True)
    coverage = reference_coverage(sample[timestamp_column], traffic, thinned=_thinned(ts[inside], traffic),
                                  thin_hours=thin)
    return ReferenceSample(sample, coverage)


def _thinned(trained: pd.Series, traffic: pd.Series, *, below: float = 0.95) -> dict[str, str]:
    """Days of which fewer than `below` of the requests had their label by the cutoff."""
    known = trained.dt.floor("D").value_counts()
    out = {}
    for day, n in sorted(traffic.dt.floor("D").value_counts().items()):
        share = known.get(day, 0) / n
        if share < below:
            out[f"{day:%Y-%m-%d}"] = f"{share:.0%} of its labels had arrived by the cutoff"
    return out


def reference_coverage(reference_ts: Sequence[Any] | pd.Series, training_ts: Sequence[Any] | pd.Series, *,
                       thinned: dict[str, str] | None = None, thin_hours: Sequence[int] = (),
                       min_rows: int = MIN_ROWS) -> Coverage:
    """Days and hours of day a reference covers, and its problems: hours of day the traffic has but the
    reference lacks, hours it holds far below their share, too few rows for a drift check to judge."""
    ref = pd.to_datetime(pd.Series(reference_ts), utc=True).dropna()
    trained = pd.to_datetime(pd.Series(training_ts), utc=True).dropna()
    hours = sorted(int(h) for h in ref.dt.hour.unique())
    absent = sorted(set(int(h) for h in trained.dt.hour.unique()) - set(hours))
    problems = []
    if absent:
        problems.append(f"hours {hour_ranges(absent)} UTC of the training window are absent (hour-of-day "
                        f"features and the daily cycle would drift by construction)")
    thin = sorted(set(thin_hours) - set(absent))
    if thin:
        problems.append(f"hours {hour_ranges(thin)} UTC hold less than {THIN_SHARE:.0%} of their share of the "
                        f"traffic (too few of their labels had arrived by the cutoff): under-represented")
    if len(ref) < min_rows:
        problems.append(f"only {len(ref):,} rows; a drift check judges a feature from {min_rows:,}")
    return Coverage(len(ref), sorted({f"{d:%Y-%m-%d}" for d in ref.dt.floor("D")}), hours, dict(thinned or {}),
                    problems)


def _utc(moment: datetime) -> pd.Timestamp:
    stamp = pd.Timestamp(moment)
    return stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")


def hour_ranges(hours: Sequence[int]) -> str:
    """[0, 1, 2, 5, 13, 14] → "00-02, 05, 13-14"."""
    spans: list[list[int]] = []
    for hour in sorted(hours):
        if spans and hour == spans[-1][1] + 1:
            spans[-1][1] = hour
        else:
            spans.append([hour, hour])
    return ", ".join(f"{a:02d}" if a == b else f"{a:02d}-{b:02d}" for a, b in spans)
