"""Committed Flink change files → the online store, vectorised; late and quarantine logs → counts.

Flink writes each view's updating result as `debezium-json` change rows (`op` "c" = the new value of a
tile or of an entity's last value, "d" = the value it replaces) and makes a file visible only when the
checkpoint holding it completes, so every visible file is final and exactly-once. A poll reads all new
files of a view with one `pyarrow.json` call, keeps the "c" rows, and hands them to the online store's
ordinary writers: tiles are whole per-tile partials upserted by (entity, tile_start) where the fuller tile
wins, last values are newer-wins by event time. Loading a file twice therefore changes nothing, which is
what makes delete-after-load safe across crashes (at-least-once loading, exactly-once effect).
"""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from quiver.catalog.ir import ViewSpec
from quiver.offline.layout import EVENT_TS, last_values_schema, tile_schema
from quiver.online.base import OnlineStore
from quiver.streaming.feeder import MARKER
from quiver.streaming.paths import StreamPaths, visible_files

log = logging.getLogger(__name__)
_TS = pa.timestamp("us", tz="UTC")


def change_schema(view: ViewSpec) -> pa.Schema:
    """Columns of a view's change rows as the Flink job writes them (timestamps as int64 epoch µs)."""
    if view.kind == "agg":
        return tile_schema(view)
    schema = last_values_schema(view)
    return pa.schema([pa.field(f.name, pa.int64()) if pa.types.is_timestamp(f.type) else f for f in schema])


def read_changes(view: ViewSpec, files: Sequence[Path]) -> pa.Table:
    """The new values ("c" rows) of `files`, typed like the offline store's tiles or last values."""
    blob = b"".join(_with_newline(p.read_bytes()) for p in files)
    schema = change_schema(view)
    if not blob.strip():
        return _typed(view, schema.empty_table())
    after = pa.struct(list(schema))
    options = pj.ParseOptions(explicit_schema=pa.schema([("after", after), ("op", pa.string())]),
                              unexpected_field_behavior="ignore")
    table = pj.read_json(io.BytesIO(blob), parse_options=options,
                         read_options=pj.ReadOptions(block_size=max(1 << 20, min(len(blob) + 1, 64 << 20))))
    table = table.filter(pc.equal(table.column("op"), "c"))
    rows = table.column("after").combine_chunks()
    if isinstance(rows, pa.ChunkedArray):  # an empty filter result keeps zero chunks
        rows = pa.array([], type=after)
    return _typed(view, pa.Table.from_arrays(rows.flatten(), schema=schema))


def _with_newline(data: bytes) -> bytes:
    return data if not data or data.endswith(b"\n") else data + b"\n"


def _typed(view: ViewSpec, table: pa.Table) -> pa.Table:
    if view.kind == "agg":
        return table
    return table.cast(last_values_schema(view))  # epoch µs → timestamp(us, UTC)


@dataclass
class LoadStats:
    """Running totals of one loader."""

    files: int = 0
    rows: int = 0
    entities: int = 0
    polls: int = 0
    last_load_s: float = 0.0
    first_load_at: float | None = None  # wall clock of the first and the latest load with data
    last_load_at: float | None = None
    newest_event_us: dict[str, int] = field(default_factory=dict)
    late: dict[str, int] = field(default_factory=dict)
    quarantined: dict[str, dict[str, int]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"files": self.files, "rows": self.rows, "entities": self.entities, "polls": self.polls,
                "last_load_s": round(self.last_load_s, 4), "first_load_at": self.first_load_at,
                "last_load_at": self.last_load_at, "newest_event_us": dict(self.newest_event_us),
                "late": dict(self.late), "quarantined": {k: dict(v) for k, v in self.quarantined.items()}}


class Loader:
    """Polls the sink folders of `views` and writes what Flink committed into `store`."""

    def __init__(self, views: Sequence[ViewSpec], sources: Sequence[str], store: OnlineStore, paths: StreamPaths):
        self.views = list(views)
        self.sources = list(sources)
        self.store = store
        self.paths = paths
        self.stats = LoadStats()
        self.markers: set[str] = set()  # inbox batches whose end marker is committed: fully processed
        self._counted: dict[str, dict[str, Any]] = self._read_counts()
        self._recount()

    # ----- change files → online store -----

    def poll(self) -> int:
        """Load every committed change file once; returns the files loaded."""
        began = time.perf_counter()
        loaded = 0
        for view in self.views:
            kind = "tiles" if view.kind == "agg" else "last"
            files = visible_files(self.paths.sink(kind, view.name), "part-")
            if not files:
                continue
            table = read_changes(view, files)
            if table.num_rows:
                if view.kind == "agg":
                    self.stats.entities += self.store.write_tiles(view, table)
                    newest = pc.max(table.column("tile_start")).as_py()
                else:
                    self.stats.entities += self.store.write_last_values(view, table)
                    newest = pc.max(table.column(EVENT_TS).cast(pa.int64())).as_py()
                if newest is not None:
                    self.stats.newest_event_us[view.name] = max(newest, self.stats.newest_event_us.get(view.name, newest))
            for path in files:
                path.unlink(missing_ok=True)  # reloading would change nothing: deleting is safe after the write
            self.stats.rows += table.num_rows
            loaded += len(files)
        self.stats.files += loaded
        self.stats.polls += 1
        if loaded:
            self.stats.last_load_s = time.perf_counter() - began
            self.stats.last_load_at = time.time()
            if self.stats.first_load_at is None:
                self.stats.first_load_at = self.stats.last_load_at
        self.count_logs()
        return loaded

    # ----- late and quarantine logs → counts -----

    def count_logs(self) -> bool:
        """Count rows of new late / quarantine files (kept as logs); returns whether anything changed."""
        changed = False
        for source in self.sources:
            for kind in ("late", "quarantine"):
                for path in visible_files(self.paths.sink(kind, source)):
                    key = f"{kind}/{source}/{path.name}"
                    if key in self._counted:
                        continue
                    self._counted[key] = _count_file(kind, path)
                    changed = True
        if changed:
            self._recount()
            self._write_counts()
        return changed

    def _recount(self) -> None:
        late: dict[str, int] = {s: 0 for s in self.sources}
        quarantined: dict[str, dict[str, int]] = {s: {} for s in self.sources}
        for key, counts in self._counted.items():
            kind, source, _ = key.split("/", 2)
            if kind == "late":
                late[source] = late.get(source, 0) + int(counts.get("rows", 0))
                continue
            per = quarantined.setdefault(source, {})
            for reason, n in counts.items():
                if reason.startswith(_MARKER_KEY):
                    self.markers.add(reason[len(_MARKER_KEY):])
                else:
                    per[reason] = per.get(reason, 0) + int(n)
        self.stats.late, self.stats.quarantined = late, quarantined

    def _read_counts(self) -> dict[str, dict[str, Any]]:
        path = self.paths.root / "counts.json"
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return {}
        return {k: v for k, v in data.items() if (self.paths.sinks / k).exists()}

    def _write_counts(self) -> None:
        path = self.paths.root / "counts.json"
        tmp = path.with_name(".counts.json.tmp")
        tmp.write_text(json.dumps(self._counted))
        tmp.replace(path)


_MARKER_KEY = "__batch_done__:"


def _count_file(kind: str, path: Path) -> dict[str, Any]:
    """Rows of a late file ({"rows": n}) or rows per reason of a quarantine file ({"null_key:view": n});
    batch end markers are bookkeeping, not quarantined rows: they come back as `__batch_done__:<batch>`."""
    lines = [line for line in path.read_bytes().split(b"\n") if line.strip()]
    if kind == "late":
        return {"rows": len(lines)}
    counts: dict[str, int] = {}
    for line in lines:
        try:
            row = json.loads(line)
            reason = str(row.get("reason") or "unknown")
            view = row.get("view") or ""
            marker = row.get("ts_ms")
        except ValueError:
            reason, view, marker = "unreadable_quarantine_row", "", None
        if isinstance(marker, str) and marker.startswith(MARKER):
            label = _MARKER_KEY + marker[len(MARKER):]
        else:
            label = f"{reason}:{view}" if view else reason
        counts[label] = counts.get(label, 0) + 1
    return counts


def late_events(paths: StreamPaths, source: str) -> pa.Table:
    """The late-events log of `source` as a table (ts_ms + typed columns), e.g. to hand to a backfill."""
    files = visible_files(paths.sink("late", source))
    blob = b"".join(_with_newline(p.read_bytes()) for p in files)
    if not blob.strip():
        return pa.table({"ts_ms": pa.array([], pa.int64())})
    table = pj.read_json(io.BytesIO(blob))
    ts = table.column("ts_ms").cast(pa.int64())
    return table.append_column("event_ts", pc.multiply(ts, 1000).cast(pa.int64()).cast(_TS))
