"""Serving-log files on disk: each written atomically with per-column Parquet settings, the types of the
newest file (which later files keep), and the memory a batch of rows holds while it waits to be written."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from quiver.monitoring.serving_log_tables import Batch, column_compression, dictionary_columns
from quiver.online.base import ColumnBlock


def newest_types(directory: Path) -> dict[str, pa.DataType]:
    """The column types of the newest file of a log dataset (none yet: empty), which later files keep."""
    with contextlib.suppress(OSError, ValueError, pa.ArrowException):
        for day in sorted(directory.glob("date=*"), reverse=True):
            for hour in sorted(day.glob("hour=*"), reverse=True):
                files = sorted(hour.glob("part-*.parquet"))
                if files:
                    return {f.name: f.type for f in pq.read_schema(files[-1]) if f.type != pa.null()}
    return {}


def write_atomically(table: pa.Table, folder: Path, compression: str) -> None:
    """`table` as a new Parquet file in `folder`: written under a hidden temp name, then renamed into place
    (readers never see half a file), with dictionaries and codecs chosen per column."""
    folder.mkdir(parents=True, exist_ok=True)
    name = f"part-{time.time_ns()}-{uuid.uuid4().hex[:8]}.parquet"
    tmp = folder / f".{name}.tmp"
    try:
        pq.write_table(table, tmp, compression=column_compression(table, compression) if len(table) else compression,
                       use_dictionary=dictionary_columns(table.schema))
        os.replace(tmp, folder / name)
    finally:
        tmp.unlink(missing_ok=True)


def _size(values: Any, n: int) -> int:
    """Rough memory of one column (or one value for all rows) of a batch."""
    if values is None or isinstance(values, bool | int | float):
        return 8
    if isinstance(values, str | bytes):
        return len(values)
    if isinstance(values, np.ndarray):
        if values.dtype != object:
            return int(values.nbytes)
        first = values[0] if n else None
        return n * (16 + (len(first) + 49 if isinstance(first, str) else 24))
    first = values[0] if n else None
    return n * (8 + (len(first) + 49 if isinstance(first, str) else 24))


def estimate_bytes(batch: Batch) -> int:
    """Rough memory of a batch's rows while buffered (what the logger's byte budget counts)."""
    features = batch.features
    block = isinstance(features, ColumnBlock)
    columns: Iterable[Any] = (batch.ts_us, batch.request_ids, batch.model_version, batch.arm, batch.latency_ms,
                              batch.predictions, batch.error, batch.call_id, *batch.entity_keys.values(),
                              *(() if block else features.values()), *(batch.request or {}).values())
    total, n = 256 + (features.array.nbytes if isinstance(features, ColumnBlock) else 0), batch.n
    for values in columns:  # per request: the numeric arrays (most columns) without a call each
        total += values.nbytes if type(values) is np.ndarray and values.dtype.kind != "O" else _size(values, n)
    return total
