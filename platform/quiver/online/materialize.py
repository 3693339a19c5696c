"""Materialization: copy what the offline store knows as of `end` into the online store, incrementally.

Per view:
- last values: the newest row per entity with `end - ttl <= event_ts < end` from the `last_values` log;
- tiles: whole tiles with `floor_g(end) - longest window <= tile_start < floor_g(end)` from `tiles`, plus the
  current, partial tile `[floor_g(end), end)` computed from the raw source with the view's compiled tile SQL
  (DuckDB), so values read at `end` equal the offline point-in-time values at `end` exactly.

Incremental: each run records, per view, a fingerprint of every partition it covered and its `end` in the
registry (run kind 'materialize'); the next run reads only partitions that changed, are new, or may hold
rows between the previous `end` and this one. Writes are idempotent (newer-wins last values, tiles upserted
whole by tile_start), so replaying partitions after a crash never double counts. A marker in Redis (the
view's meta hash) ties the online data to the run that wrote it: a flushed or replaced Redis gets a full run.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from quiver.catalog.aggregations import TILE_START
from quiver.catalog.ir import Catalog, ViewSpec
from quiver.config import Config
from quiver.offline import layout
from quiver.online.base import OnlineStore, now_us, timestamp_us
from quiver.online.codec import newest_per_entity
from quiver.online.layout import view_tag

KIND = "materialize"
_US_PER_DAY = 86_400_000_000
_CHUNK_ROWS = 200_000  # rows per write call: bounds the packed bytes held in memory at once


@dataclass
class ViewMaterialization:
    """What one view's materialization did."""

    view: str
    kind: str  # last_values | tiles
    full: bool
    partitions_read: list[str] = field(default_factory=list)
    rows_read: int = 0
    entities_written: int = 0
    head_tiles: int = 0
    run_id: int | None = None
    seconds: float = 0.0


@dataclass
class MaterializeReport:
    """What `materialize` did, per view."""

    end_us: int
    views: dict[str, ViewMaterialization]
    seconds: float = 0.0

    @property
    def entities_written(self) -> int:
        return sum(v.entities_written for v in self.views.values())

    def __str__(self) -> str:
        lines = [f"materialized as of {datetime.fromtimestamp(self.end_us / 1e6, UTC).isoformat()} "
                 f"in {self.seconds:.2f}s"]
        for v in self.views.values():
            lines.append(f"  {v.view}: {v.entities_written} entities from {len(v.partitions_read)} partition(s)"
                         f" ({'full' if v.full else 'incremental'})")
        return "\n".join(lines)


Progress = Callable[[str, int, int], None]  # (view, entities done, entities in all)


def materialize(config: Config, catalog: Catalog, end: Any = None, views: Sequence[str] | None = None, *,
                store: OnlineStore | None = None, registry: Any = None, full: bool = False,
                progress: bool | Progress = False) -> MaterializeReport:
    """Write online values as of `end` (default: now) for `views` (default: every online view).

    `store` defaults to the project's Redis (`ensure_redis(config)`), `registry` to `config.registry`.
    `full` ignores the previous run's watermark. `progress=True` shows a rich progress bar.
    """
    began = time.perf_counter()
    end_us = now_us() if end is None else timestamp_us(end)
    specs = catalog.select_views(views or None, need="online")
    own_store = store is None
    if store is None:
        from quiver.online.factory import open_online_store

        store = open_online_store(config, writer=True)
    if registry is None:
        from quiver.registry import Registry

        registry = Registry(config.registry, project=config.project)
    report = MaterializeReport(end_us, {})
    try:
        with _progress(progress) as tick:
            for spec in specs:
                report.views[spec.name] = _materialize_view(config, catalog, spec, end_us, store, registry,
                                                            full, tick)
    finally:
        if own_store:
            store.close()
    report.seconds = time.perf_counter() - began
    return report


def _materialize_view(config: Config, catalog: Catalog, spec: ViewSpec, end_us: int, store: OnlineStore,
                      registry: Any, full: bool, tick: Progress) -> ViewMaterialization:
    began = time.perf_counter()
    kind = layout.TILES if spec.kind == "agg" else layout.LAST_VALUES
    tag = view_tag(spec)
    previous = None if full else _previous_run(registry, spec.name)
    marker = _get_marker(store, spec.name)
    incremental = (previous is not None and previous["detail"].get("tag") == tag
                   and marker == str(previous["id"]))
    result = ViewMaterialization(spec.name, kind, full=not incremental)
    root = config.offline_dir
    lo_us, hi_us = _time_range(spec, end_us)
    from quiver.offline.store import store_for

    remote = store_for(config)
    if remote.is_local:
        fingerprints = {d.isoformat(): _fingerprint(layout.partition_dir(root, spec.name, kind, d))
                        for d in layout.partition_days(root, spec.name, kind) if _day_overlaps(d, lo_us, end_us)}
    else:  # an object store: a day's manifest names its commit (quiver.offline.store)
        fingerprints = {d.isoformat(): str((remote.read_manifest(remote.path(spec.name, kind, f"date={d}")) or {})
                                           .get("run", "missing"))
                        for d in remote.partition_days(spec.name, kind) if _day_overlaps(d, lo_us, end_us)}
    selected = sorted(fingerprints)
    if incremental and previous is not None:
        old = previous["detail"].get("partitions", {})
        since = _day_of(int(previous["detail"].get("end_us", 0))).isoformat()
        selected = [d for d in selected if old.get(d) != fingerprints[d] or d >= since]
    result.run_id = registry.start_run(spec.name, KIND, "redis", None, datetime.fromtimestamp(end_us / 1e6, UTC))
    try:
        table = read_partitions(root, spec, kind, selected, lo_us, hi_us, None if remote.is_local else remote)
        result.partitions_read = selected
        result.rows_read = table.num_rows
        if spec.kind == "agg":
            head = _head_tiles(config, catalog, spec, end_us)
            result.head_tiles = head.num_rows
            if head.num_rows:
                table = pa.concat_tables([table, head.select(table.column_names).cast(table.schema)])
        result.entities_written = _write(store, spec, table, tick)
        _set_marker(store, spec.name, str(result.run_id))
    except BaseException as exc:
        registry.finish_run(result.run_id, "failed", 0, {"error": f"{type(exc).__name__}: {exc}", "tag": tag})
        raise
    result.seconds = time.perf_counter() - began
    partitions = dict(previous["detail"].get("partitions", {})) if incremental and previous else {}
    partitions.update(fingerprints)
    registry.finish_run(result.run_id, "succeeded", result.entities_written, {
        "end_us": end_us, "tag": tag, "full": result.full, "partitions": partitions,
        "partitions_read": selected, "rows_read": result.rows_read, "head_tiles": result.head_tiles,
        "seconds": round(result.seconds, 3)})
    return result


def _time_range(spec: ViewSpec, end_us: int) -> tuple[int, int]:
    """[lo, hi) of the event times (last values) or tile starts (tiles) that matter as of `end_us`."""
    if spec.kind == "last":
        lo = end_us - spec.ttl_us if spec.ttl_us is not None else -(2**62)
        return lo, end_us
    tile = int(spec.tile_us or 1)
    floor = end_us - end_us % tile
    return floor - spec.max_window_us, floor


def read_partitions(root: Path, spec: ViewSpec, kind: str, days: Sequence[str], lo_us: int,
                     hi_us: int, remote: Any = None) -> pa.Table:
    schema = layout.tile_schema(spec) if kind == layout.TILES else layout.last_values_schema(spec)
    time_column = TILE_START if kind == layout.TILES else layout.EVENT_TS
    tables = []
    for day in days:
        files: list[Any]
        if remote is not None:
            files = remote.partition_files(remote.path(spec.name, kind, f"date={day}"))
        else:
            folder = layout.partition_dir(root, spec.name, kind, date.fromisoformat(day))
            files = sorted(p for p in folder.glob("*.parquet") if not p.name.startswith((".", "_")))
        for path in files:
            part = pq.read_table(path, columns=schema.names, filesystem=remote.fs if remote else None)
            part = part.select(schema.names).cast(schema)
            times = part.column(time_column)
            if kind == layout.LAST_VALUES:
                times = times.cast(pa.int64())
            in_range = pc.and_(pc.greater_equal(times, lo_us), pc.less(times, hi_us))
            tables.append(part.filter(in_range))
    return pa.concat_tables(tables) if tables else schema.empty_table()


def _head_tiles(config: Config, catalog: Catalog, spec: ViewSpec, end_us: int) -> pa.Table:
    """The current tile [floor_g(end), end) from raw events, with the view's compiled tile SQL on DuckDB."""
    tile = int(spec.tile_us or 1)
    floor = end_us - end_us % tile
    if floor == end_us:
        return layout.tile_schema(spec).empty_table()
    from quiver.offline.engines import open_engine

    engine = open_engine("duckdb")
    try:
        if not register_source(engine, config, catalog, spec.source):
            return layout.tile_schema(spec).empty_table()
        return tiles_between(engine, spec, floor, end_us)
    finally:
        engine.close()


def register_source(engine: Any, config: Config, catalog: Catalog, source: str, as_name: str | None = None) -> bool:
    """Register the raw files of `source` (on disk or an object store) on `engine` (as `as_name`, default the
    source's name); False when it has none."""
    from quiver.catalog.schema import source_location

    files = source_location(catalog.sources[source].path, config.root, f"source {source!r} path")
    if not files:
        return False
    schemas = [files.read_schema(p) for p in files.paths]
    engine.attach(files.location)
    engine.register_source(as_name or source, files.uris(), any(s != schemas[0] for s in schemas))
    return True


def tiles_between(engine: Any, spec: ViewSpec, start_us: int, end_us: int) -> pa.Table:
    """Tiles of the events with start <= event time < end (the view's compiled tile SQL; tiles schema)."""
    from quiver.compile.sql import compile_tiles, query_params

    rows = engine.fetch(compile_tiles(engine.dialect, spec), query_params(spec, start_us, end_us))
    schema = layout.tile_schema(spec)
    return rows.select(schema.names).cast(schema)


def _write(store: OnlineStore, spec: ViewSpec, table: pa.Table, tick: Progress) -> int:
    """Write `table` in chunks; returns (and the progress bar counts) entities, as the report does."""
    if spec.kind == "last":  # one row per entity first, so chunks never split an entity
        table = newest_per_entity(spec, table)
        entities = int(table.num_rows)
    else:  # a tiles table holds several rows per entity; the bar and the summary count entities
        entities = int(table.select(spec.key_names).group_by(spec.key_names).aggregate([]).num_rows)
    written = 0
    tick(spec.name, 0, entities)
    for offset in range(0, table.num_rows, _CHUNK_ROWS):
        chunk = table.slice(offset, _CHUNK_ROWS)
        if spec.kind == "last":
            written += store.write_last_values(spec, chunk)
        else:
            written += store.write_tiles(spec, chunk)
        tick(spec.name, min(written, entities), entities)  # an entity split over two chunks counts once
    return min(written, entities)


def _previous_run(registry: Any, view: str) -> dict[str, Any] | None:
    runs = [r for r in registry.runs(view=view, kind=KIND) if r["status"] == "succeeded"]
    if not runs:
        return None
    last = runs[-1]
    return {"id": last["id"], "detail": json.loads(last["detail_json"] or "{}")}


def _get_marker(store: OnlineStore, view: str) -> str | None:
    return store.get_meta(view, "run")


def _set_marker(store: OnlineStore, view: str, value: str) -> None:
    store.set_meta(view, "run", value)


def _fingerprint(folder: Path) -> str:
    """Changes whenever a partition is rewritten (backfill swaps in a new folder)."""
    digest = hashlib.sha1()
    try:
        st = folder.stat()
        digest.update(f"{st.st_ino}:{st.st_mtime_ns}".encode())
        for path in sorted(folder.iterdir()):
            s = path.stat()
            digest.update(f"{path.name}:{s.st_size}:{s.st_mtime_ns}:{s.st_ino}".encode())
    except FileNotFoundError:
        return "missing"
    return digest.hexdigest()[:16]


def _day_of(us: int) -> date:
    return date(1970, 1, 1) + timedelta(days=us // _US_PER_DAY)


def _day_overlaps(day: date, lo_us: int, hi_us: int) -> bool:
    start = (day - date(1970, 1, 1)).days * _US_PER_DAY
    return start < hi_us and start + _US_PER_DAY > lo_us


class _NullProgress:
    def __enter__(self) -> Progress:
        return lambda view, done, total: None

    def __exit__(self, *exc: object) -> None:
        return None


class _RichProgress:
    def __enter__(self) -> Progress:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("entities"), TimeElapsedColumn(), transient=False)
        self.bar.__enter__()
        self.tasks: dict[str, Any] = {}

        def tick(view: str, done: int, total: int) -> None:
            if view not in self.tasks:
                self.tasks[view] = self.bar.add_task(view, total=total)
            self.bar.update(self.tasks[view], completed=done, total=total)

        return tick

    def __exit__(self, *exc: object) -> None:
        self.bar.__exit__(None, None, None)


class _CallbackProgress:
    def __init__(self, callback: Progress):
        self.callback = callback

    def __enter__(self) -> Progress:
        return self.callback

    def __exit__(self, *exc: object) -> None:
        return None


def _progress(progress: bool | Progress) -> Any:
    if callable(progress):
        return _CallbackProgress(progress)
    return _RichProgress() if progress else _NullProgress()
