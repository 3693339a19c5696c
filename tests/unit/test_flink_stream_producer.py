"""The stream producer: exact JSON values, atomic time-ordered files, sequence continued across runs."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa

from quiver.pipelines.stream_producer import StreamWriter, produce, to_ndjson

TS = pa.timestamp("us", tz="UTC")


def test_ndjson_is_exact_and_json_clean() -> None:
    table = pa.table({"user_id": pa.array([1, None], pa.int64()), "amount": [0.1 + 0.2, float("nan")],
                      "flag": [True, None], "cat": ["ü", None],
                      "seen": pa.array([1_500, None], TS), "event_ts": pa.array([1_700_000_000_123_999, 5_000], TS)})
    lines = to_ndjson(table).splitlines()
    rows = [json.loads(line) for line in lines]
    # Microseconds end to end: the sub-millisecond part of the event time is kept.
    assert rows[0] == {"ts_us": 1_700_000_000_123_999, "user_id": 1, "amount": 0.30000000000000004, "flag": True,
                       "cat": "ü", "seen": 1_500}
    assert rows[1]["ts_us"] == 5_000 and rows[1]["user_id"] is None and rows[1]["seen"] is None
    # NaN is a value (as in the batch files), written as the NaN token, not as null.
    assert b'"amount":NaN' in lines[1] and rows[1]["amount"] != rows[1]["amount"]
    assert next(iter(rows[0])) == "ts_us"


def test_nanosecond_times_are_refused_not_cut() -> None:
    import pytest

    table = pa.table({"event_ts": pa.array([1_000_000_001], pa.timestamp("ns", tz="UTC"))})
    with pytest.raises(ValueError, match="microseconds"):
        to_ndjson(table)


def test_files_sort_in_write_order_and_the_sequence_continues(tmp_path: Path) -> None:
    events = pa.table({"v": list(range(6)), "event_ts": pa.array([5_000, 1_000, 9_000, 2_000, 3_000, 4_000], TS)})
    first = produce(events, tmp_path, rows_per_file=2, sort=False)
    assert [p.name for p in first] == sorted(p.name for p in first)  # late rows never reorder the files
    second = StreamWriter(tmp_path).write(events.slice(0, 1))
    assert second.name > first[-1].name and second.name.endswith("-00000003.jsonl")
    assert not list(tmp_path.glob(".*"))  # no temp files left behind
    ordered = produce(events, tmp_path / "sorted", rows_per_file=3)
    assert [json.loads(x)["ts_us"] for x in ordered[0].read_text().splitlines()] == [1_000, 2_000, 3_000]
