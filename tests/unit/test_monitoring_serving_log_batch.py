"""Serving logs, columnar API: `log_batch` writes the very files `log()` writes for the same rows; rows (not
batches) are counted against the buffer limit and the flush size."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from quiver.serving.logs import ServingLogger, read_serving_logs

T0 = datetime(2026, 11, 3, 9, 59, 59, 900000, tzinfo=UTC)  # 100 ms before 10:00: batches straddle two hours
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def request(n: int, offset: int, canary_error: str = "") -> dict[str, Any]:
    """One request's rows as columns, the way the prediction service holds them."""
    i = np.arange(offset, offset + n)
    ts = [T0 + timedelta(milliseconds=int(k)) for k in i]
    on_canary = i % 3 == 0
    return {
        "request_ids": [f"r{k}" for k in i],
        "entity_keys": {"user_id": [int(k) % 7 for k in i], "merchant_id": [100 + int(k) % 3 for k in i]},
        "features": {"amount_sum_1h": i * 0.5 - np.where(i % 11 == 0, np.nan, 0.0),  # NaN stays NaN
                     "txn_count_1h": (i % 5).astype(np.int32),
                     "country": np.where(i % 2 == 1, "DE", "US"),
                     "is_new": i % 4 == 0,
                     "last_merchant": np.array([None if k % 5 == 0 else int(k) for k in i], dtype=object)},
        "model_version": np.where(on_canary, "fraud:2", "fraud:1"),
        "arm": np.where(on_canary, "canary", "champion"),
        "latency_ms": np.where(on_canary, 2.5, 1.25),
        "predictions": i / 1000,
        "ts_us": np.array([(t - EPOCH) // timedelta(microseconds=1) for t in ts], dtype=np.int64),
        "error": np.where(on_canary, canary_error, "") if canary_error else "",
        "ts": ts,
    }


def log_rows(logger: ServingLogger, batch: dict[str, Any]) -> None:
    """The same rows through `log()`, one call each (what the service did before `log_batch`)."""
    columns = {**{f"k.{k}": v for k, v in batch["entity_keys"].items()},
               **{f"f.{k}": v for k, v in batch["features"].items()}}
    n = len(batch["request_ids"])
    per_row = {k: (v.tolist() if isinstance(v, np.ndarray) else [v] * n)
               for k, v in batch.items() if k in ("model_version", "arm", "latency_ms", "predictions", "error")}
    values = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in columns.items()}
    for i in range(n):
        keys = {k[2:]: v[i] for k, v in values.items() if k.startswith("k.")}
        features = {k[2:]: v[i] for k, v in values.items() if k.startswith("f.")}
        error = per_row["error"][i]
        logger.log(batch["request_ids"][i], keys, features, per_row["model_version"][i], per_row["arm"][i],
                   per_row["latency_ms"][i], None if error else per_row["predictions"][i], ts=batch["ts"][i],
                   error=error)


def log_columns(logger: ServingLogger, batch: dict[str, Any]) -> None:
    logger.log_batch(batch["request_ids"], batch["entity_keys"], batch["features"], batch["model_version"],
                     batch["arm"], batch["latency_ms"], batch["predictions"], batch["ts_us"], error=batch["error"])


def same(got: pa.Table, expected: pa.Table) -> bool:
    """Same schema and values (Arrow's `equals` never calls NaN equal to NaN; here NaN matches NaN)."""
    def values(table: pa.Table) -> list[list[Any]]:
        return [["NaN" if isinstance(v, float) and v != v else v for v in c.to_pylist()] for c in table.columns]

    return got.schema.equals(expected.schema) and values(got) == values(expected)


def tables(root: Path) -> dict[str, pa.Table]:
    """Each hour's table (one flush: one file per hour)."""
    files = sorted((root / "serving_logs").glob("date=*/hour=*/part-*.parquet"))
    assert len({f.parent for f in files}) == len(files)
    return {f.parent.name: pq.read_table(f) for f in files}


@pytest.mark.parametrize("canary_error", ["", "RuntimeError: canary not loaded"])
def test_log_batch_writes_the_same_files_as_log(tmp_path: Path, canary_error: str) -> None:
    requests = [request(n, offset, canary_error) for n, offset in ((1, 0), (100, 1), (37, 101), (250, 138))]
    with ServingLogger(tmp_path / "rows", flush_interval_s=3_600) as by_row, \
            ServingLogger(tmp_path / "columns", flush_interval_s=3_600) as by_column:
        for batch in requests:
            log_rows(by_row, batch)
            log_columns(by_column, batch)
        assert by_column.buffered == by_row.buffered == 388
    expected, got = tables(tmp_path / "rows"), tables(tmp_path / "columns")
    assert sorted(got) == ["hour=09", "hour=10"]
    assert expected["hour=09"].num_rows == 100
    for hour, table in expected.items():
        assert got[hour].schema.equals(table.schema), hour
        assert same(got[hour], table), hour
    logged = read_serving_logs(tmp_path / "columns")
    assert logged.num_rows == 388
    canary = logged.filter(pa.compute.equal(logged["arm"], "canary"))
    assert canary["prediction"].null_count == (canary.num_rows if canary_error else 0)
    assert np.isnan(logged["feature.amount_sum_1h"].to_numpy()).sum() == 36  # every 11th row of 0..387


def test_log_and_log_batch_share_one_flush_with_the_types_log_infers(tmp_path: Path) -> None:
    # Ints in a batch, floats from log(), a feature only one side has: one column typed as log() types it.
    with ServingLogger(tmp_path / "mixed", flush_interval_s=3_600) as mixed, \
            ServingLogger(tmp_path / "rows", flush_interval_s=3_600) as rows:
        mixed.log_batch(["a", "b"], {"user_id": np.array([1, 2])}, {"x": np.array([1, 2]), "y": ["p", None]},
                        "v1", ts_us=1_000)
        mixed.log("c", {"user_id": 3}, {"x": 2.5}, "v1", ts=EPOCH + timedelta(microseconds=1_000))
        mixed.log_batch(["d"], {"user_id": ["u-4"]}, {"x": np.array([np.nan])}, "v1", ts_us=1_000)
        rows.log("a", {"user_id": 1}, {"x": 1, "y": "p"}, "v1", ts=EPOCH + timedelta(microseconds=1_000))
        rows.log("b", {"user_id": 2}, {"x": 2, "y": None}, "v1", ts=EPOCH + timedelta(microseconds=1_000))
        rows.log("c", {"user_id": 3}, {"x": 2.5}, "v1", ts=EPOCH + timedelta(microseconds=1_000))
        rows.log("d", {"user_id": "u-4"}, {"x": float("nan")}, "v1", ts=EPOCH + timedelta(microseconds=1_000))
    got, expected = tables(tmp_path / "mixed")["hour=00"], tables(tmp_path / "rows")["hour=00"]
    assert got.schema.field("feature.x").type == pa.float64()
    assert got.schema.field("key.user_id").type == pa.string()  # 1, 2, 3 and "u-4": kept as text
    assert same(got, expected)


def test_buffer_limit_and_flush_size_count_rows_not_batches(tmp_path: Path) -> None:
    logger = ServingLogger(tmp_path, flush_rows=1_000_000, flush_interval_s=3_600, max_buffer_rows=100)
    try:
        for start in range(0, 180, 60):  # the first 60 fit; 60 more would make 120 > 100: dropped whole, twice
            logger.log_batch([f"r{i}" for i in range(start, start + 60)], {"user_id": np.arange(60)}, {},
                             predictions=np.zeros(60))
        assert logger.buffered == 60 and logger.dropped == 120
        logger.log("one", {"user_id": 1}, {})
        assert logger.buffered == 61
        assert logger.flush() == 61 and logger.written == 61 and logger.buffered == 0
    finally:
        logger.close()
    logger.log_batch(["late"], {}, {})  # after close: dropped and counted like log()
    assert logger.dropped == 121
    sized = ServingLogger(tmp_path / "sized", flush_rows=500, flush_interval_s=3_600)
    try:
        for start in range(0, 600, 100):  # 6 batches: the 5th brings 500 rows, the thread writes them
            sized.log_batch([f"r{i}" for i in range(start, start + 100)], {}, {"f": np.ones(100)})
        deadline = time.monotonic() + 20
        while sized.written < 500 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sized.written >= 500
    finally:
        sized.close()
    assert read_serving_logs(tmp_path / "sized").num_rows == 600


def test_log_batch_refuses_columns_of_the_wrong_length(tmp_path: Path) -> None:
    with ServingLogger(tmp_path) as logger:
        with pytest.raises(ValueError, match=r"features\['amount'\] holds 2 values for 3 request_ids"):
            logger.log_batch(["a", "b", "c"], {"user_id": [1, 2, 3]}, {"amount": np.ones(2)})
        with pytest.raises(ValueError, match=r"arm has shape \(2,\) for 3 request_ids"):
            logger.log_batch(["a", "b", "c"], {}, {}, arm=np.array(["champion", "canary"]))
        assert logger.buffered == 0
