"""Delayed labels: what really happened to a served request, arriving hours or days after the prediction.

Layout under the store root (`offline_root`: a folder or an object store; one table for every model:
request ids are unique per request row):

    <offline_root>/request_labels/date=YYYY-MM-DD/part-<ns>-<uuid>.parquet     (date = arrival date, UTC)
    <offline_root>/_quarantine/request_labels/date=YYYY-MM-DD/part-….parquet   (rejected rows + `reason`)

Columns: `request_id` (string, the id the prediction service logged), `label` (float64, 0 or 1),
`arrived_at` (timestamp µs UTC, when the label became known). A file is stored whole (a folder: a hidden
temp name renamed into place; an object store: one PUT), so readers never see half a file, and any host
that writes labels adds files beside the others'. A label may be corrected later: `read_labels` keeps, per
request_id, the newest arrival at or before `as_of`, so an evaluation replayed with the same `as_of` sees
exactly the labels it saw the first time.
"""

from __future__ import annotations

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

from quiver.catalog.locations import Location, as_location

LABEL_DIR = "request_labels"
QUARANTINE_DIR = f"_quarantine/{LABEL_DIR}"
SCHEMA = pa.schema([("request_id", pa.string()), ("label", pa.float64()),
                    ("arrived_at", pa.timestamp("us", tz="UTC"))])


@dataclass(frozen=True)
class LabelWrite:
    """What `write_labels` stored: rows written, rows quarantined (with why), and the files."""

    written: int
    quarantined: int
    reasons: dict[str, int]
    files: tuple[str, ...]  # paths inside the store's filesystem


def write_labels(root: str | Path | Location, request_ids: Sequence[Any], labels: Sequence[Any],
                 arrived_at: datetime | Sequence[datetime] | None = None) -> LabelWrite:
    """Append labels under `root` (the store root: a folder, a URI or a Location). Rows with a missing id or a label other than 0/1 are
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
    location = as_location(root)
    good_rows = table.filter(pa.array(~bad))
    if good_rows.num_rows:
        files += _write(location, location.path(LABEL_DIR), good_rows)
    if bad.any():
        rejected = table.filter(pa.array(bad)).append_column("reason", pa.array(reasons[bad].tolist(), pa.string()))
        files += _write(location, location.path(QUARANTINE_DIR), rejected)
    counts: dict[str, int] = {}
    for reason in reasons[bad]:
        counts[reason] = counts.get(reason, 0) + 1
    return LabelWrite(int(good_rows.num_rows), int(bad.sum()), counts, tuple(files))


def _number(value: Any) -> float:
    try:
        return float(value) if value is not None and not isinstance(value, str) else float("nan")
    except (TypeError, ValueError):
        return float("nan")


def _write(location: Location, directory: str, table: pa.Table) -> list[str]:
    days = pc.strftime(table["arrived_at"], format="%Y-%m-%d").to_pylist()
    out = []
    for day in sorted(set(days)):
        part = table.filter(pc.equal(pa.array(days), day))
        sink = pa.BufferOutputStream()
        pq.write_table(part, sink)
        path = f"{directory}/date={day}/part-{time.time_ns()}-{uuid.uuid4().hex[:8]}.parquet"
        location.put(path, bytes(sink.getvalue()))
        out.append(path)
    return out


def label_files(root: str | Path | Location, quarantined: bool = False) -> list[str]:
    """Paths (inside the store's filesystem) of the label files (or the quarantined ones), oldest day first."""
    location = as_location(root)
    directory = location.path(QUARANTINE_DIR if quarantined else LABEL_DIR)
    return [f"{directory}/{day}/{name}" for day in location.children(directory) if day.startswith("date=")
            for name in location.children(f"{directory}/{day}") if name.startswith("part-")
            and name.endswith(".parquet")]


def read_labels(root: str | Path | Location, as_of: datetime | None = None) -> pa.Table:
    """One label per request_id: the newest that arrived at or before `as_of` (default: all), from every
    writer's files under `root` (the store root)."""
    from quiver.serving.logs.read import read_files

    location = as_location(root)
    files = label_files(location)
    if as_of is not None:
        files = [f for f in files if f.rsplit("/", 2)[-2][5:] <= f"{as_of:%Y-%m-%d}"]
    if not files:
        return SCHEMA.empty_table()
    table = pa.concat_tables([t.cast(SCHEMA) for t in read_files(location, files)])
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
