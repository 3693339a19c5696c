"""Serving logs under faults: a row with an impossible time is quarantined (never poisons later flushes), a
failed write of one hour's file never rewrites the hours already written, retries are bounded, the buffer is
bounded in bytes (oldest dropped first), and every outcome is counted and exported."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from prometheus_client import REGISTRY

from quiver.catalog.locations import Location
from quiver.serving.logs import ServingLogger, read_quarantine, read_serving_logs

H = 3_600_000_000
T0 = 1_793_696_400_000_000  # 2026-11-03 09:00 UTC


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def batch(logger: ServingLogger, tag: str, ts: np.ndarray) -> None:
    n = len(ts)
    logger.log_batch([f"{tag}{i}" for i in range(n)], {"user_id": np.arange(n)}, {"amount": np.ones(n)},
                     "m:1", "champion", 1.0, np.full(n, 0.5), ts_us=ts.astype(np.int64))


@pytest.mark.parametrize("poison", [4 * 10**18, -4 * 10**18, -(2**62)])
def test_a_row_with_an_impossible_time_is_quarantined_and_poisons_nothing(tmp_path: Path, poison: int) -> None:
    quarantined_before = sample("quiver_serving_log_quarantined_total", reason="time_out_of_range")
    logger = ServingLogger(tmp_path, flush_interval_s=3_600)
    batch(logger, "a", np.array([T0 + 1, poison, T0 + 2]))  # one request: two good rows, one poisoned
    for k in range(5):  # later requests and flushes go on as if nothing happened
        batch(logger, f"b{k}-", np.array([T0 + 10 + k]))
        logger.flush()
    logger.close()
    written = read_serving_logs(tmp_path)["request_id"].to_pylist()
    assert sorted(written) == sorted(["a0", "a2"] + [f"b{k}-0" for k in range(5)])  # each exactly once
    assert logger.written == 7 and logger.quarantined == 1 and logger.dropped == 0
    quarantine = read_quarantine(tmp_path)
    assert quarantine["request_id"].to_pylist() == ["a1"] and quarantine["ts_us"].to_pylist() == [poison]
    assert "outside the supported range" in quarantine["quarantine_reason"][0].as_py()
    assert sample("quiver_serving_log_quarantined_total", reason="time_out_of_range") == quarantined_before + 1


def test_log_with_an_impossible_datetime_is_quarantined(tmp_path: Path) -> None:
    from datetime import UTC, datetime

    with ServingLogger(tmp_path) as logger:
        logger.log("old", {"user_id": 1}, {"x": 1.0}, ts=datetime(1, 1, 1, tzinfo=UTC))
        logger.log("ok", {"user_id": 2}, {"x": 2.0}, ts=datetime(2026, 11, 3, tzinfo=UTC))
    assert read_serving_logs(tmp_path)["request_id"].to_pylist() == ["ok"]
    assert read_quarantine(tmp_path)["request_id"].to_pylist() == ["old"]


def failing_for(monkeypatch: pytest.MonkeyPatch, fragment: str, times: int) -> Counter[str]:
    """Make writes into paths containing `fragment` fail `times` times (then work); count every attempt."""
    real_put = Location.put
    attempts: Counter[str] = Counter()

    def put(self: Location, where: str, data: bytes) -> None:
        path = str(where)
        attempts[path.split("/")[-2] if "hour=" in path else "other"] += 1
        if fragment in path and attempts["failures"] < times:
            attempts["failures"] += 1
            raise OSError(28, "No space left on device")
        real_put(self, where, data)

    monkeypatch.setattr(Location, "put", put)
    return attempts


def test_a_failed_hour_never_rewrites_the_hours_already_written(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    attempts = failing_for(monkeypatch, "hour=10", times=3)
    logger = ServingLogger(tmp_path, flush_interval_s=3_600)
    ts = T0 + np.arange(6) * (H // 2)  # 09:00 … 11:30: three hours, two rows each
    batch(logger, "r", ts)
    for _ in range(3):
        assert not logger.flush() or logger.written == 4  # hours 09 and 11 go out at the first flush
        assert logger.buffered == 2 and not logger.writable
    assert logger.flush() == 2 and logger.writable  # hour 10 on its fourth attempt
    logger.close()
    ids = read_serving_logs(tmp_path)["request_id"].to_pylist()
    assert sorted(ids) == [f"r{i}" for i in range(6)]  # every row exactly once
    assert attempts["hour=09"] == 1 and attempts["hour=11"] == 1 and attempts["hour=10"] == 4
    assert logger.failed_writes == 3 and logger.dropped == 0 and logger.quarantined == 0


def test_retries_are_bounded_then_the_rows_are_quarantined(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    failing_for(monkeypatch, "serving_logs/date=", times=10**9)  # the log folder never takes a file again
    failed_before = sample("quiver_serving_log_failed_writes_total")
    logger = ServingLogger(tmp_path, flush_interval_s=3_600, max_write_attempts=3)
    batch(logger, "r", np.array([T0 + 1, T0 + 2]))
    for _ in range(5):
        logger.flush()
    assert logger.failed_writes == 3 and logger.buffered == 0  # tried three times, then given up on
    assert logger.quarantined_by == {"write_failed": 2}
    assert read_quarantine(tmp_path)["quarantine_reason"][0].as_py().startswith("write failed 3 times")
    assert sample("quiver_serving_log_failed_writes_total") == failed_before + 3
    logger.close()


def test_the_buffer_is_bounded_in_bytes_and_drops_the_oldest(tmp_path: Path) -> None:
    dropped_before = sample("quiver_serving_log_dropped_total", reason="buffer_full")
    budget = 400_000
    logger = ServingLogger(tmp_path, flush_interval_s=3_600, max_buffer_bytes=budget)
    wide = {f"f{j}": np.ones(1_000) for j in range(10)}  # 80 kB of features per batch, plus ids
    for k in range(8):
        logger.log_batch([f"b{k}-{i}" for i in range(1_000)], {}, wide, ts_us=T0 + k)
        assert logger.buffered_bytes <= budget
    kept, dropped = logger.buffered, logger.dropped_by["buffer_full"]
    assert 1_000 <= kept < 8_000 and kept + dropped == 8_000 and logger.dropped == dropped
    assert sample("quiver_serving_log_dropped_total", reason="buffer_full") == dropped_before + dropped
    logger.close()
    batches = sorted({int(i.split("-")[0][1:]) for i in read_serving_logs(tmp_path)["request_id"].to_pylist()})
    assert batches == list(range(8 - kept // 1_000, 8))  # the newest batches survived, the oldest went


def test_a_batch_larger_than_the_budget_is_refused(tmp_path: Path) -> None:
    with ServingLogger(tmp_path, max_buffer_bytes=10_000) as logger:
        logger.log_batch([f"r{i}" for i in range(10)], {}, {"f": np.ones(10)}, ts_us=T0)
        logger.log_batch([f"x{i}" for i in range(5_000)], {}, {"f": np.ones(5_000)}, ts_us=T0)
        assert logger.dropped_by == {"buffer_full": 5_000} and logger.buffered == 10
    assert read_serving_logs(tmp_path).num_rows == 10


def test_buffer_gauges_and_health(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    failing_for(monkeypatch, "hour=", times=1)
    logger = ServingLogger(tmp_path, flush_interval_s=3_600)
    batch(logger, "r", np.array([T0, T0 + 1, T0 + 2]))
    assert sample("quiver_serving_log_buffered_rows") >= 3 and sample("quiver_serving_log_buffered_bytes") > 0
    logger.flush()
    health = logger.health()
    assert health["status"] == "failing" and health["failed_writes"] == 1 and health["buffered_rows"] == 3
    assert sample("quiver_serving_log_writable") == 0
    logger.flush()
    assert logger.health()["status"] == "ok" and logger.health()["written_rows"] == 3
    logger.close()
    assert logger.health()["status"] == "closed"


def test_a_key_logged_as_numbers_and_then_as_text_keeps_the_datasets_type(tmp_path: Path) -> None:
    """One schema per dataset: text that is a number of the dataset's type is written as that number; text
    that is not ("abc") is refused: its rows are quarantined, saying which column and value."""
    with ServingLogger(tmp_path, flush_interval_s=3_600) as logger:
        logger.log_batch(["a"], {"user_id": np.array([7])}, {}, ts_us=T0)
        logger.flush()
        logger.log_batch(["b"], {"user_id": ["9223372036854775807"]}, {}, ts_us=T0 + 1)
        logger.log_batch(["c"], {"user_id": ["abc"]}, {}, ts_us=T0 + 2)
    table = read_serving_logs(tmp_path)
    assert table["key.user_id"].type == pa.int64()
    assert table["key.user_id"].to_pylist() == [7, 9223372036854775807]
    quarantined = read_quarantine(tmp_path).to_pydict()
    assert quarantined["request_id"] == ["c"] and "key.user_id" in quarantined["quarantine_reason"][0]
    assert "'abc'" in quarantined["quarantine_reason"][0]
