"""Serving-log files on the store (a folder or an object store): each written atomically with per-column
Parquet settings under a name that says which replica wrote it, the types of the newest file (which later
files keep), and the memory a batch of rows holds while it waits to be written."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import time
import uuid
from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from quiver.catalog.locations import Location
from quiver.online.base import ColumnBlock
from quiver.serving.logs.tables import Batch, column_compression, dictionary_columns


def newest_types(location: Location, directory: str) -> dict[str, pa.DataType]:
    """The column types of the newest file of a log dataset (none yet: empty), which later files keep."""
    with contextlib.suppress(OSError, ValueError, pa.ArrowException):
        for day in reversed([d for d in location.children(directory) if d.startswith("date=")]):
            for hour in reversed([h for h in location.children(f"{directory}/{day}") if h.startswith("hour=")]):
                files = [f for f in location.children(f"{directory}/{day}/{hour}") if _is_part(f)]
                if files:
                    newest = f"{directory}/{day}/{hour}/{files[-1]}"
                    return {f.name: f.type for f in pq.read_schema(newest, filesystem=location.fs)
                            if f.type != pa.null()}
    return {}


def _is_part(name: str) -> bool:
    return name.startswith("part-") and name.endswith(".parquet")


def replica_name(given: str | None = None) -> str:
    """This process's name in the log: `given`, else $QUIVER_REPLICA_ID, else the host's name; letters,
    digits, `.`, `_` and `-` only (it is part of file names)."""
    name = given or os.environ.get("QUIVER_REPLICA_ID") or socket.gethostname() or "replica"
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:64]


def part_name(replica: str) -> str:
    """A new file's name: time first (names sort by write time), the replica that wrote it, and a random tail
    (two writers never pick the same name)."""
    return f"part-{time.time_ns()}-{replica}-{uuid.uuid4().hex[:8]}.parquet"


def parquet_bytes(table: pa.Table, compression: str, row_group_size: int | None = None) -> bytes:
    """`table` as one Parquet file in memory, with dictionaries and codecs chosen per column."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression=column_compression(table, compression) if len(table) else compression,
                   use_dictionary=dictionary_columns(table.schema), row_group_size=row_group_size)
    return bytes(sink.getvalue())


def write_atomically(table: pa.Table, location: Location, folder: str, compression: str, replica: str) -> str:
    """`table` as a new Parquet file in `folder` (a path inside `location`), all or nothing (a folder: a
    temp name renamed into place; an object store: one PUT); returns its path."""
    path = f"{folder}/{part_name(replica)}"
    location.put(path, parquet_bytes(table, compression))
    return path


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
