"""The backfill's last two steps on an object store: check what an engine staged, then commit each date.

The staging folder is `<root>/<view>/.staging-<run>/` on the store (the engines write it: Spark from its
executors, DuckDB through pyarrow's client). Every date of the range is then committed by
`OfflineStore.commit` — files moved under run-unique names, one manifest PUT — so a reader sees a whole old
day or a whole new one (quiver.offline.store). Quarantine folders follow the same rule; one that a re-run
leaves empty is removed, manifest first.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from quiver.catalog.ir import ViewSpec
from quiver.compile.sql import DATE_COLUMN, main_kind
from quiver.offline import layout
from quiver.offline.store import MANIFEST, OfflineStore


def data_files(store: OfflineStore, folder: str) -> list[str]:
    """Parquet data files directly in `folder` (not hidden, not _underscored), sorted."""
    prefix = folder.rstrip("/") + "/"
    return [p for p in store.files_under(folder)
            if p.endswith(".parquet") and "/" not in p[len(prefix):] and not p[len(prefix):].startswith((".", "_"))]


def check_staged(store: OfflineStore, folder: str, expected: pa.Schema, view: str) -> dict[date, int]:
    """Check the schema of every file an engine staged under `folder/__date=…/`; rows per date."""
    counts: dict[date, int] = {}
    prefix = f"{folder}/{DATE_COLUMN}="
    days = sorted({p[len(prefix):].split("/", 1)[0] for p in store.files_under(folder) if p.startswith(prefix)})
    for day_text in days:
        day = date.fromisoformat(day_text)
        rows = 0
        for path in data_files(store, f"{prefix}{day_text}"):
            with store.fs.open_input_file(path) as handle:
                meta = pq.ParquetFile(handle)
                got = meta.schema_arrow
                if [(f.name, f.type) for f in got] != [(f.name, f.type) for f in expected]:
                    raise RuntimeError(f"view {view!r}: engine wrote schema {got} to {store.uri(path)}, "
                                       f"expected {expected}")
                rows += meta.metadata.num_rows
        counts[day] = rows
    return counts


def commit_view(store: OfflineStore, spec: ViewSpec, days: Sequence[date], stage: str, report: Any) -> None:
    """Commit every date of the range (an empty partition for a date without rows), then its quarantine."""
    kind = main_kind(spec)
    expected = layout.tile_schema(spec) if kind == "tiles" else layout.last_values_schema(spec)
    for day in days:
        staged_dir = f"{stage}/{kind}/{DATE_COLUMN}={day.isoformat()}"
        staged = data_files(store, staged_dir)
        if not staged:
            staged = [f"{staged_dir}/part-00000.parquet"]
            pq.write_table(expected.empty_table(), staged[0], filesystem=store.fs)
        store.commit(store.path(spec.name, kind, f"date={day.isoformat()}"), staged, report.rows_by_date.get(day, 0))
    for sub in [f"date={d.isoformat()}" for d in days] + [layout.NO_EVENT_TS]:
        staged = data_files(store, f"{stage}/{layout.QUARANTINE}/{sub}")
        target = store.path(layout.QUARANTINE, spec.name, sub)
        if staged:
            rows = sum(_rows(store, p) for p in staged)
            store.commit(target, staged, rows)
        elif store.exists(f"{target}/{MANIFEST}"):
            store.remove(target)  # stale quarantine of an earlier run of this date


def _rows(store: OfflineStore, path: str) -> int:
    with store.fs.open_input_file(path) as handle:
        return int(pq.ParquetFile(handle).metadata.num_rows)
