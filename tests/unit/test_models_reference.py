"""The drift reference stored with a model: its training window in the traffic's hourly mix, every hour."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
import pytest

from quiver.catalog.errors import QuiverError
from quiver.models.reference import hour_ranges, reference_coverage, sample_reference

START = datetime(2026, 11, 1, 12, tzinfo=UTC)  # mid-day: the window's first day is partial
END = datetime(2026, 11, 6, tzinfo=UTC)
# A daily cycle like the demo's: quiet nights, an evening peak.
HOUR_W = np.array([0.6, 0.4, 0.3, 0.25, 0.3, 0.5, 1.0, 1.8, 2.6, 3.2, 3.6, 4.0,
                   4.4, 4.3, 4.1, 4.0, 4.2, 4.6, 5.0, 5.2, 4.8, 3.8, 2.6, 1.4])


def traffic(days: int, per_day: int, seed: int = 0) -> pd.DataFrame:
    """Requests of `days` days from 2026-11-01 with the daily cycle, plus their hour as a feature."""
    rng = np.random.default_rng(seed)
    day = rng.integers(0, days, days * per_day)
    hour = rng.choice(24, days * per_day, p=HOUR_W / HOUR_W.sum())
    ts = pd.Series(pd.Timestamp("2026-11-01", tz="UTC") + pd.to_timedelta(day, "D") + pd.to_timedelta(hour, "h")
          + pd.to_timedelta(rng.integers(0, 3600, len(day)), "s"))
    return pd.DataFrame({"event_ts": ts, "hour_of_day": ts.dt.hour, "amount": rng.lognormal(3, 1, len(ts))})


def in_window(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[(frame.event_ts >= START) & (frame.event_ts < END)]


def test_the_reference_keeps_the_traffics_daily_cycle_when_knowledge_time_thins_the_last_day() -> None:
    every = in_window(traffic(5, 3_000))
    # Knowledge time: a day's labels arrive a day later, so at the cutoff the last day's late hours are thin.
    last = every.event_ts >= END - timedelta(days=1)
    known = every[~last | (every.hour_of_day < 12) | (every.index % 4 == 0)]
    sample = sample_reference(known, "event_ts", START, END, window_timestamps=every.event_ts, rows_per_day=1_000)
    drawn = sample.frame
    # Every day the model learnt from is drawn from (the half first day and the thinned last day too) ...
    assert sorted(drawn.event_ts.dt.strftime("%Y-%m-%d").unique()) == [f"2026-11-0{d}" for d in range(1, 6)]
    assert abs(len(drawn) - 5 * 1_000) <= 24 and drawn.event_ts.is_monotonic_increasing
    assert list(sample.coverage.thinned) == ["2026-11-05"] and "arrived by the cutoff" in sample.coverage.thinned[
        "2026-11-05"]
    assert sample.coverage.hours == list(range(24)) and sample.coverage.problems == []
    # ... and the hour mix is the traffic's (a plain draw from `known` would under-weight 12-23 h).
    shares = drawn.hour_of_day.value_counts(normalize=True).sort_index().to_numpy()
    traffic_shares = every.hour_of_day.value_counts(normalize=True).sort_index().to_numpy()
    assert np.abs(shares - traffic_shares).max() < 0.002
    plain = known.hour_of_day.value_counts(normalize=True).sort_index().to_numpy()
    assert np.abs(plain - traffic_shares).max() > 0.005  # the test can tell the two apart
    # Seeded: the same rows every time, whatever the rows' order; another seed draws others.
    again = sample_reference(known.sample(frac=1.0, random_state=1), "event_ts", START, END,
                             window_timestamps=every.event_ts, rows_per_day=1_000)
    assert again.frame.event_ts.tolist() == sample.frame.event_ts.tolist()
    other = sample_reference(known, "event_ts", START, END, window_timestamps=every.event_ts, rows_per_day=1_000,
                             seed=1)
    assert other.frame.event_ts.tolist() != sample.frame.event_ts.tolist()


def test_a_time_split_tail_is_reported_as_unfit() -> None:
    frame = in_window(traffic(5, 3_000))
    tail = frame[frame.event_ts >= frame.event_ts.quantile(0.9)]  # what the reference used to be
    coverage = reference_coverage(tail.event_ts, frame.event_ts)
    assert coverage.hours != list(range(24))
    assert len(coverage.problems) == 1 and "absent" in coverage.problems[0]
    assert hour_ranges(sorted(set(range(24)) - set(coverage.hours))) in coverage.problems[0]


def test_hours_the_labels_lack_or_thin_are_reported() -> None:
    every = in_window(traffic(5, 300))
    known = every[(every.hour_of_day < 20) & ((every.hour_of_day < 16) | (every.index % 10 == 0))]
    sample = sample_reference(known, "event_ts", START, END, window_timestamps=every.event_ts, rows_per_day=100)
    problems = " | ".join(sample.coverage.problems)
    assert "hours 20-23 UTC of the training window are absent" in problems
    assert "hours 16-19 UTC hold less than 50%" in problems
    assert "only" in problems and "rows" in problems  # 5 days × 100 rows minus what is missing: below 500


def test_bad_input_is_named() -> None:
    with pytest.raises(QuiverError, match="timestamp column 'ts'"):
        sample_reference(traffic(1, 10), "ts", START, END)
    with pytest.raises(QuiverError, match="rows_per_day"):
        sample_reference(traffic(1, 10), "event_ts", START, END, rows_per_day=0)


def test_hour_ranges() -> None:
    assert hour_ranges([0, 1, 2, 5, 13, 14]) == "00-02, 05, 13-14"
    assert hour_ranges([]) == ""
