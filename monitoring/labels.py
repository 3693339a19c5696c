"""Delayed labels: what really happened to a served request, arriving hours or days after the prediction.

Layout under the offline root (one table for every model: request ids are unique per request row):

    <offline_root>/request_labels/date=YYYY-MM-DD/part-<ns>-<uuid>.parquet     (date = arrival date, UTC)
    <offline_root>/_quarantine/request_labels/date=YYYY-MM-DD/part-….parquet   (rejected rows + `reason`)

Columns: `request_id` (string, the id the prediction service logged), `label` (float64, 0 or 1),
`arrived_at` (timestamp µs UTC, when the label became known). Files are written to a hidden temp name and
renamed, so readers never see half a file. A label may be corrected later: `read_labels` keeps, per
request_id, the newest arrival at or before `as_of`, so an evaluation replayed with the same `as_of` sees
exactly the labels it saw the first time.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

LABEL_DIR = "request_labels"
QUARANTINE_DIR = Path("_quarantine") / LABEL_DIR
SCHEMA = pa.schema([("request_id", pa.string()), ("label", pa.float64()),
                    ("arrived_at", pa.timestamp("us", tz="UTC"))])


@dataclass(frozen=True)
class LabelWrite:
    """What `write_labels` stored: rows written, rows quarantined (with why), and the files."""

    written: int
    quarantined: int
    reasons: dict[str, int]
    files: tuple[Path, ...]


def write_labels(root: str | Path, request_ids: Sequence[Any], labels: Sequence[Any],
                 arrived_at: datetime | Sequence[datetime] | None = None) -> LabelWrite:
    """Append labels under `root` (the offline root). Rows with a missing id or a label other than 0/1 are
    quarantined with their reason, never silently dropped."""
    n = len(request_ids)
    if len(labels) != n:
        raise ValueError(f"{n} request ids but {len(labels)} labels")
    now = datetime.now(UTC)
    if arrived_at is None or isinstance(arrived_at, datetime):
        moment = arrived_at or now
        if moment.tzinfo is None:
            raise ValueError("arrived_at must be timezone-aware (UTC)")
        times = pa.array([moment] * n, SCHEMA.field("arrived_at").type)
    else:
        if len(arrived_at) != n:
            raise ValueError(f"{n} labels but {len(arrived_at)} arrival times")
        if any(t.tzinfo is None for t in arrived_at):
            raise ValueError("arrived_at must be timezone-aware (UTC)")
        times = pa.array(list(arrived_at), SCHEMA.field("arrived_at").type)
    ids = pa.array([None if r is None else str(r) for r in request_ids], pa.string())
    values = np.array([_number(v) for v in labels], dtype=np.float64)
    reasons = np.full(n, "", dtype=object)
    reasons[~np.isin(values, (0.0, 1.0))] = "label is not 0 or 1"
    missing = np.asarray(pc.fill_null(pc.equal(pc.utf8_length(ids), 0), True))
    reasons[missing] = "missing request_id"
    bad = reasons != ""
    table = pa.table({"request_id": ids, "label": values, "arrived_at": times}, schema=SCHEMA)
    files = []
    good_rows = table.filter(pa.array(~bad))
    if good_rows.num_rows:
        files += _write(Path(root) / LABEL_DIR, good_rows)
    if bad.any():
        rejected = table.filter(pa.array(bad)).append_column("reason", pa.array(reasons[bad].tolist(), pa.string()))
        files += _write(Path(root) / QUARANTINE_DIR, rejected)
    counts: dict[str, int] = {}
    for reason in reasons[bad]:
        counts[reason] = counts.get(reason, 0) + 1
    return LabelWrite(int(good_rows.num_rows), int(bad.sum()), counts, tuple(files))


def _number(value: Any) -> float:
    try:
        return float(value) if value is not None and not isinstance(value, str) else float("nan")
    except (TypeError, ValueError):
        return float("nan")


def _write(directory: Path, table: pa.Table) -> list[Path]:
    days = pc.strftime(table["arrived_at"], format="%Y-%m-%d").to_pylist()
    out = []
    for day in sorted(set(days)):
        part = table.filter(pc.equal(pa.array(days), day))
        folder = directory / f"date={day}"
        folder.mkdir(parents=True, exist_ok=True)
        name = f"part-{time.time_ns()}-{uuid.uuid4().hex[:8]}.parquet"
        tmp = folder / f".{name}.tmp"
        try:
            pq.write_table(part, tmp)
            os.replace(tmp, folder / name)
        finally:
            tmp.unlink(missing_ok=True)
        out.append(folder / name)
    return out


def read_labels(root: str | Path, as_of: datetime | None = None) -> pa.Table:
    """One label per request_id: the newest that arrived at or before `as_of` (default: all)."""
    directory = Path(root) / LABEL_DIR
    files = sorted(directory.glob("date=*/part-*.parquet"))
    if as_of is not None:
        files = [f for f in files if f.parent.name[5:] <= f"{as_of:%Y-%m-%d}"]
    if not files:
        return SCHEMA.empty_table()
    table = pa.concat_tables([pq.read_table(f).cast(SCHEMA) for f in files])
    if as_of is not None:
        table = table.filter(pc.less_equal(table["arrived_at"], pa.scalar(as_of, SCHEMA.field("arrived_at").type)))
    if table.num_rows == 0:
        return table
    # Newest arrival wins; ties (same instant) keep the later file, i.e. the later write.
    order = pa.array(np.arange(table.num_rows))
    table = table.append_column("_order", order).sort_by([("request_id", "ascending"), ("arrived_at", "ascending"),
                                                            ("_order", "ascending")])
    ids = table["request_id"].to_numpy(zero_copy_only=False)
    last = np.ones(len(ids), dtype=bool)
    last[:-1] = ids[:-1] != ids[1:]
    return table.filter(pa.array(last)).drop_columns(["_order"])
