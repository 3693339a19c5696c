"""The training job's window arithmetic: cutoffs, and which labels fall in [cutoff − window, cutoff)."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pandas as pd
import pyarrow as pa
import pytest

from quiver.catalog.errors import QuiverError
from quiver.pipelines.training import parse_cutoff
from quiver.pipelines.training_sets import window_labels


def test_cutoffs_are_utc_and_a_date_means_its_midnight() -> None:
    assert parse_cutoff("2026-11-10") == datetime(2026, 11, 10, tzinfo=UTC)
    assert parse_cutoff(date(2026, 11, 10)) == datetime(2026, 11, 10, tzinfo=UTC)
    assert parse_cutoff("2026-11-10T06:00:00+02:00") == datetime(2026, 11, 10, 4, tzinfo=UTC)
    with pytest.raises(QuiverError, match="is not a date"):
        parse_cutoff("next tuesday")


def test_window_keeps_labels_from_start_inclusive_to_cutoff_exclusive_sorted() -> None:
    t0 = datetime(2026, 11, 1, tzinfo=UTC)
    times = [t0 + timedelta(days=d) for d in (3, 0, 1, 2, -1)]
    frame = pd.DataFrame({"event_ts": pd.to_datetime(times, utc=True), "is_fraud": [1, 0, 1, 0, 1]})
    kept = window_labels(frame, t0, t0 + timedelta(days=2))
    assert kept["event_ts"].to_pylist() == [t0, t0 + timedelta(days=1)]
    assert isinstance(kept, pa.Table) and kept.column_names == ["event_ts", "is_fraud"]
    with pytest.raises(QuiverError, match="lack the timestamp column 'ts'"):
        window_labels(frame, t0, t0 + timedelta(days=2), timestamp_column="ts")
    with pytest.raises(QuiverError, match="does not exist"):
        window_labels("/nonexistent/labels.parquet", t0, t0 + timedelta(days=2))
