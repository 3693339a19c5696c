"""Write small real Parquet sources and catalog directories for catalog, registry and CLI tests."""

from __future__ import annotations

import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

TS = pa.timestamp("us", tz="UTC")
T0 = datetime(2026, 11, 1, tzinfo=UTC)

# The columns of pipelines/demo_data.py's transactions, plus one column of a type Quiver cannot map.
TX_SCHEMA = pa.schema([
    ("transaction_id", pa.string()),
    ("user_id", pa.int64()),
    ("merchant_id", pa.int64()),
    ("amount", pa.float64()),
    ("category", pa.string()),
    ("is_online", pa.bool_()),
    ("tags", pa.list_(pa.int64())),
    ("event_ts", TS),
])

PREAMBLE = '''\
from datetime import timedelta

from quiver import (
    Aggregation, Bool, Entity, FeatureService, FeatureView, Field, Float64, Int64, Source, StreamBinding,
    String, Timestamp,
)

user = Entity("user", ["user_id"])
merchant = Entity("merchant", ["merchant_id"])
tx = Source("tx", "data/tx")
good = FeatureView("good", [user], tx, schema=[Field("amount", Float64)], ttl="1d")
'''


def transactions(rows: int = 4, schema: pa.Schema = TX_SCHEMA) -> pa.Table:
    """`rows` transactions a minute apart, in the given schema (columns it lacks are left out)."""
    columns = {
        "transaction_id": [f"t{i}" for i in range(rows)],
        "user_id": [i % 2 for i in range(rows)],
        "merchant_id": [10 + i % 3 for i in range(rows)],
        "amount": [1.5 * (i + 1) for i in range(rows)],
        "category": ["grocery", "fuel"] * (rows // 2) + ["grocery"] * (rows % 2),
        "is_online": [i % 2 == 0 for i in range(rows)],
        "tags": [[i] for i in range(rows)],
        "event_ts": [T0 + timedelta(minutes=i) for i in range(rows)],
    }
    return pa.table({f.name: pa.array(columns[f.name], f.type) for f in schema}, schema=schema)


def write_parquet(path: Path, table: pa.Table) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path


def write_catalog(directory: Path, files: dict[str, str]) -> dict[str, Path]:
    """Write catalog files (name → source text, dedented) into `directory`; returns name → path."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, text in files.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
        paths[name] = path
    return paths


def line_of(path: Path, marker: str = "# <-") -> int:
    """1-based line of the first line in `path` containing `marker`."""
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if marker in line:
            return number
    raise AssertionError(f"no {marker!r} in {path}")
