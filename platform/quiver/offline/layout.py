"""The offline store's layout, in one place: folders, partitions and the schemas of tiles and last values.

    <offline_root>/<view>/tiles/date=YYYY-MM-DD/part-00000.parquet
        join keys…, tile_start (int64, epoch µs, aligned to the view's tile), n_events (int64),
        one column per partial: <col>__cnt int64, <col>__sum / <col>__sumsq float64,
        <col>__min / <col>__max / <col>__last (input dtype; bool stored as int64), <col>__last_ts int64 µs.
        A tile never crosses midnight UTC (tiles divide a day), so its date is its tile_start's date.
    <offline_root>/<view>/last_values/date=YYYY-MM-DD/part-00000.parquet
        join keys…, event_ts (timestamp µs UTC), one column per field (named as the feature).
        The view's projected event log, one row per (keys, event_ts): the value as of t is the newest row
        before t. Ties at one event_ts keep the row with the greatest field values (NULL lowest), in
        field order, so every engine picks the same row.
    <offline_root>/_quarantine/<view>/date=YYYY-MM-DD/…   rows skipped for null join keys, by event date.
    <offline_root>/_quarantine/<view>/no_event_ts/…       rows without an event time (rewritten by every run).
    <offline_root>/_late_events/<source>/date=YYYY-MM-DD/…  stream events the streaming job did not take on
        time (`quiver.streaming.late` writes them); the backfill reads them with the source's own files.

Every partition is written to a temp folder beside it and renamed into place, so readers see the old day
or the new day, never half of one; re-running a date range replaces exactly those dates.
On an object store (`offline_root: s3://…`) the same folders hold run-named files and a `_manifest.json`
naming the current ones, which is the commit point (quiver.offline.store); the functions below are the
folder case.
"""

from __future__ import annotations

import os
import shutil
import uuid
from datetime import date
from pathlib import Path

import pyarrow as pa

from quiver.catalog.aggregations import EVENTS_COLUMN, TILE_START, last_ts_column, view_partials
from quiver.catalog.ir import ViewSpec

TILES = "tiles"
LAST_VALUES = "last_values"
EVENT_TS = "event_ts"

_ARROW = {
    "int64": pa.int64(),
    "float64": pa.float64(),
    "string": pa.string(),
    "bool": pa.bool_(),
    "timestamp": pa.timestamp("us", tz="UTC"),
}

QUARANTINE = "_quarantine"  # folder of the rows a backfill set aside, per view
NO_EVENT_TS = "no_event_ts"  # quarantine folder for rows without an event time (they have no date)
LATE_DIR = "_late_events"  # stream events kept for the batch route, per source


def arrow_type(dtype: str) -> pa.DataType:
    """Arrow type of a logical dtype."""
    return _ARROW[dtype]


def late_dir(offline_root: str | Path) -> Path:
    """Root of the late-events Parquet of every source."""
    return Path(offline_root) / LATE_DIR


def view_dir(root: Path, view: str, kind: str) -> Path:
    return Path(root) / view / kind


def partition_dir(root: Path, view: str, kind: str, day: date) -> Path:
    return view_dir(root, view, kind) / f"date={day.isoformat()}"


def partition_days(root: Path, view: str, kind: str) -> list[date]:
    """Dates present for a view and kind, sorted."""
    base = view_dir(root, view, kind)
    if not base.is_dir():
        return []
    return sorted(date.fromisoformat(p.name[5:]) for p in base.iterdir()
                  if p.is_dir() and p.name.startswith("date="))


def tile_schema(view: ViewSpec) -> pa.Schema:
    """Arrow schema of a view's tiles (see module docstring)."""
    fields = [pa.field(k, arrow_type(t)) for k, t in view.keys]
    fields += [pa.field(TILE_START, pa.int64()), pa.field(EVENTS_COLUMN, pa.int64())]
    triples = [(a.column, a.fn, a.input_dtype) for a in view.aggregations]
    for partial in view_partials(triples):
        fields.append(pa.field(partial.name, arrow_type(partial.dtype)))
        if partial.partial.kind == "last":
            fields.append(pa.field(last_ts_column(partial.column), pa.int64()))
    return pa.schema(fields)


def last_values_schema(view: ViewSpec) -> pa.Schema:
    """Arrow schema of a view's last-value log (see module docstring)."""
    fields = [pa.field(k, arrow_type(t)) for k, t in view.keys]
    fields.append(pa.field(EVENT_TS, arrow_type("timestamp")))
    fields += [pa.field(f.name, arrow_type(f.dtype)) for f in view.fields]
    return pa.schema(fields)


def replace_partition(target: Path, staged: Path) -> None:
    """Move a fully written `staged` folder to `target`, replacing what was there, as atomically as a
    filesystem allows: one rename in, one rename of the old copy out."""
    target.parent.mkdir(parents=True, exist_ok=True)
    old = target.with_name(f".old-{target.name}-{uuid.uuid4().hex[:8]}")
    if target.exists():
        os.replace(target, old)
    os.replace(staged, target)
    shutil.rmtree(old, ignore_errors=True)


def staging_dir(target: Path) -> Path:
    """A fresh hidden folder beside `target` (same filesystem, so the final rename is atomic)."""
    staged = target.with_name(f".tmp-{target.name}-{uuid.uuid4().hex[:8]}")
    staged.mkdir(parents=True)
    return staged
