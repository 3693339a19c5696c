"""Backfill: compute tiles and last values of a date range and write them into the Parquet offline store.

    backfill(config, catalog, start, end, engine="duckdb", views=None) -> BackfillReport

1. Check every source file first (footers only, with pyarrow): a corrupt file or a column whose type
   differs between files stops the run with a QuiverError naming the files, before anything is written.
2. Run each view's compiled SQL (`compile/sql.py`) on the engine, which writes its rows by date into a
   hidden staging folder beside the view's data.
3. Only when every view is staged, swap each date of [start, end] into place with
   `layout.replace_partition`; a date without events gets an empty partition, so re-running a range
   replaces exactly those dates and nothing else.

Rows with an event time in range that fail the source's contract (`Contract`: first failing check) or have
a null join key go to `_quarantine/<view>/date=…/` (replaced with their date); rows without a usable event
time (none, or one beyond the run's clock by more than the contract's `max_future`) belong to no date, so
every run rewrites the snapshot `_quarantine/<view>/no_event_ts/` of all of them in the source. All are
counted in the report (contract refusals per check), never dropped silently; none reaches a tile or a
last value. Each view's run is recorded in the registry (kind 'backfill') with its counts.

A run that fails before the swap changes nothing in the store. The swap itself is one rename per date and
view: a crash in the middle of it leaves some dates new and some old, each of them whole.

On an object store (`offline_root: s3://…`, quiver.offline.store) the engines write the staging folder on
the store itself (Spark through s3a from its executors, DuckDB through pyarrow's client), and each date is
committed by its manifest instead of a rename; the guarantees above hold the same way.
"""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from quiver.catalog.errors import QuiverError
from quiver.catalog.ir import Catalog, ViewSpec
from quiver.catalog.locations import Location
from quiver.catalog.schema import logical_dtype, source_location
from quiver.compile.sql import (
    DATE_COLUMN,
    REASON_COLUMN,
    compile_last_values,
    compile_quarantine,
    compile_stats,
    compile_tiles,
    main_kind,
    quarantine_columns,
    query_params,
)
from quiver.config import Config
from quiver.offline import layout
from quiver.offline.engines import BatchEngine, DuckDBEngine, open_engine
from quiver.offline.store import OfflineStore, store_for

QUARANTINE = layout.QUARANTINE
NO_EVENT_TS = layout.NO_EVENT_TS
_US_PER_DAY = 86_400_000_000
Progress = Callable[[int, int, str], None]  # (steps done, steps in all, what runs now)


@dataclass
class ViewReport:
    """What a backfill did for one view."""

    view: str
    kind: str  # tiles | last_values
    events_read: int = 0  # source rows with an event time in range (null keys included)
    quarantined_null_keys: int = 0
    quarantined_null_ts: int = 0  # rows without an event time anywhere in the source
    # Rows refused by the source's contract, per failed check (`<rule>:<column>`, its first failing one).
    quarantined_by_check: dict[str, int] = field(default_factory=dict)
    rows_written: int = 0  # tiles or last-value rows
    rows_by_date: dict[date, int] = field(default_factory=dict)
    run_id: int | None = None

    @property
    def quarantined(self) -> int:
        return self.quarantined_null_keys + self.quarantined_null_ts + sum(self.quarantined_by_check.values())


@dataclass
class BackfillReport:
    """What a backfill did: per view counts, the range, the engine and the wall time."""

    start: date
    end: date
    engine: str
    views: dict[str, ViewReport]
    seconds: float = 0.0

    @property
    def rows_written(self) -> int:
        return sum(v.rows_written for v in self.views.values())


def backfill(config: Config, catalog: Catalog, start: date, end: date, engine: str = "duckdb",
             views: Sequence[str] | None = None, *, registry: Any = None,
             progress: Progress | None = None, threads: int | None = None) -> BackfillReport:
    """Backfill `views` (default: all) for the days `start`..`end` (inclusive, UTC) with `engine`.

    `registry` defaults to the project's registry (`config.registry`); runs are recorded there.
    `threads` caps DuckDB's threads (default: every core); Spark's cores come from `config.spark_master`.
    """
    began = time.perf_counter()
    if end < start:
        raise QuiverError(f"backfill range is empty: end {end} is before start {start}")
    if engine not in ("duckdb", "spark"):
        raise QuiverError(f"engine must be duckdb or spark, got {engine!r}")
    specs = catalog.select_views(views)
    store = store_for(config)  # a bad offline_root (scheme, credentials) fails before any work
    files = check_sources(catalog, specs, config.root, engine, extra=_late_event_files(store, specs), extra_store=store)
    if registry is None:
        from quiver.registry import Registry

        registry = Registry(config.registry, project=config.project)
        try:
            return _run(config, specs, files, start, end, engine, registry, progress, began, threads, store)
        finally:
            registry.close()
    return _run(config, specs, files, start, end, engine, registry, progress, began, threads, store)


def _run(config: Config, specs: list[ViewSpec], files: dict[str, list[CheckedFile]], start: date,
         end: date, engine: str, registry: Any, progress: Progress | None, began: float,
         threads: int | None = None, store: OfflineStore | None = None) -> BackfillReport:
    remote = store if store is not None and not store.is_local else None
    root = config.offline_dir
    now_us = time.time_ns() // 1000  # one clock for the whole run: a contract's `max_future` reads it
    report = BackfillReport(start, end, engine, {v.name: ViewReport(v.name, main_kind(v)) for v in specs})
    start_ts, end_ts = _utc(start), _utc(end + timedelta(days=1))
    for spec in specs:
        report.views[spec.name].run_id = registry.start_run(spec.name, "backfill", engine, start_ts, end_ts)
    # Hidden folders on the offline store's own filesystem, so moving a staged date in is one rename (an
    # object store: a server-side copy, then the manifest).
    run_tag = f".staging-{uuid.uuid4().hex[:12]}"
    staging: dict[str, Path | str] = {spec.name: remote.path(spec.name, run_tag) if remote else
                                      Path(root) / spec.name / run_tag for spec in specs}
    total, done = 2 * len(specs) + 1, 0
    runner: BatchEngine | None = None
    try:
        if progress:
            progress(done, total, f"starting {engine}")
        if engine == "duckdb":
            runner = DuckDBEngine(threads=threads)
            if remote:
                runner.attach(remote)
        else:
            runner = open_engine(engine, config.spark, remote)
        for source in sorted({s.source for s in specs}):
            for location in {id(f.location): f.location for f in files[source]}.values():
                runner.attach(location)  # a source (or its late events) on an object store
            runner.register_source(source, [f.uri for f in files[source]],
                                   _columns_differ([f.schema for f in files[source]]))
        for spec in specs:
            if progress:
                progress(done, total, f"{spec.name}: {main_kind(spec)}")
            params = query_params(spec, _day_us(start), _day_us(end + timedelta(days=1)), now_us)
            _stage_view(runner, spec, params, staging[spec.name], report.views[spec.name], _days(start, end),
                        remote)
            done += 1
            if progress:
                progress(done, total, f"{spec.name}: quarantine")
            _stage_quarantine(runner, spec, params, staging[spec.name], report.views[spec.name], remote)
            done += 1
        if progress:
            progress(done, total, "replacing partitions")
        for spec in specs:
            stage = staging[spec.name]
            if isinstance(stage, Path):
                _commit(root, spec, start, end, stage)
            else:
                from quiver.offline.store_commit import commit_view

                commit_view(_require(remote), spec, _days(start, end), stage, report.views[spec.name])
    except BaseException as exc:
        # Footers were fine, so look for a file whose pages do not decode: name it instead of the
        # engine's anonymous error. Only on failure, so a good run never reads its input twice.
        culprit = _unreadable_file(files, specs) if isinstance(exc, Exception) else None
        for view_report in report.views.values():
            if view_report.run_id is not None:
                error = str(culprit) if culprit else f"{type(exc).__name__}: {exc}"
                registry.finish_run(view_report.run_id, "failed", 0, {"error": error})
        if culprit:
            raise culprit from exc
        raise
    finally:
        if runner is not None:
            runner.close()
        for folder in staging.values():
            if isinstance(folder, Path):
                shutil.rmtree(folder, ignore_errors=True)
            else:
                _require(remote).delete_tree(folder)
    report.seconds = time.perf_counter() - began
    for view_report in report.views.values():
        registry.finish_run(view_report.run_id, "succeeded", view_report.rows_written, _detail(report, view_report))
    if progress:
        progress(total, total, "done")
    return report


class CheckedFile(NamedTuple):
    """A source file whose footer passed `check_sources`: as the engines open it, and where it lives."""

    uri: str  # a folder path, or an object store's URI
    path: str  # inside `location.fs`
    schema: pa.Schema
    location: Location


def check_sources(catalog: Catalog, views: Sequence[ViewSpec], root: Path, engine: str = "duckdb",
                  extra: dict[str, list[str]] | None = None, extra_store: OfflineStore | None = None,
                  ) -> dict[str, list[CheckedFile]]:
    """Files and footer schemas of every source the views read (on disk or on an object store), checked
    before any engine runs. `extra`: more files per source, paths inside `extra_store` (the stream's late
    events on the offline store).

    Raises QuiverError naming the file when one is not readable Parquet, lacks a column a view needs,
    has a type the catalog does not expect, disagrees with another file on a column's type, or (Spark)
    holds nanosecond timestamps, which Spark's Parquet reader refuses.
    """
    needed: dict[str, dict[str, tuple[str, str]]] = {}  # source → column → (logical dtype, view)
    for view in views:
        cols = needed.setdefault(view.source, {})
        for name, dtype in view.source_columns:
            cols.setdefault(name, (dtype, view.name))
    out: dict[str, list[CheckedFile]] = {}
    for source_name, columns in sorted(needed.items()):
        source = catalog.sources[source_name]
        files = source_location(source.path, root, f"source {source_name!r} path")
        if not files:
            where = f" under {root}" if files.location.is_local else ""
            raise QuiverError(f"source {source_name!r}: no Parquet files match {source.path!r}{where}")
        listed = [(p, files.location) for p in files.paths]
        if extra_store is not None:
            listed += [(p, extra_store) for p in (extra or {}).get(source_name, [])]  # e.g. the stream's late events
        checked: list[CheckedFile] = []
        first: dict[str, tuple[pa.DataType, str]] = {}
        for inside, location in listed:
            path = location.uri(inside)
            try:
                schema = pq.read_schema(inside, filesystem=location.fs)
            except (pa.ArrowException, OSError) as exc:
                raise QuiverError(f"source {source_name!r}: cannot read Parquet file {path}: {exc}") from None
            for column in schema:
                seen = first.setdefault(column.name, (column.type, path))
                if seen[0] != column.type:
                    raise QuiverError(
                        f"source {source_name!r}: schema drift in column {column.name!r}: {column.type} in "
                        f"{path}, but {seen[0]} in {seen[1]}")
            for name, (dtype, view_name) in columns.items():
                index = schema.get_field_index(name)
                if index < 0:
                    raise QuiverError(f"source {source_name!r}: {path} has no column {name!r} "
                                      f"(read by view {view_name!r})")
                arrow_type = schema.field(index).type
                if engine == "spark" and pa.types.is_timestamp(arrow_type) and arrow_type.unit == "ns":
                    raise QuiverError(f"source {source_name!r}: column {name!r} in {path} holds nanosecond "
                                      "timestamps, which Spark cannot read; write microseconds (pyarrow: "
                                      "coerce_timestamps='us') or use the duckdb engine")
                found = logical_dtype(arrow_type)
                if found != dtype:
                    raise QuiverError(f"source {source_name!r}: column {name!r} is {found} in {path}, but view "
                                      f"{view_name!r} expects {dtype}; re-apply the catalog or fix the file")
            checked.append(CheckedFile(path, inside, schema, location))
        out[source_name] = checked
    return out


def _unreadable_file(files: dict[str, list[CheckedFile]], views: Sequence[ViewSpec]) -> QuiverError | None:
    for source, checked in sorted(files.items()):
        columns = sorted({c for v in views if v.source == source for c, _ in v.source_columns})
        for file in checked:
            try:
                with file.location.fs.open_input_file(file.path) as stream:
                    for _batch in pq.ParquetFile(stream).iter_batches(columns=columns):
                        pass
            except (pa.ArrowException, OSError) as exc:
                return QuiverError(f"source {source!r}: cannot read Parquet file {file.uri}: {exc}")
    return None


# ---- staging ----


def _stage_view(runner: BatchEngine, spec: ViewSpec, params: dict[str, int], stage: Path | str,
                report: ViewReport, days: list[date], remote: OfflineStore | None = None) -> None:
    stats = runner.fetch(compile_stats(runner.dialect, spec), params).to_pylist()[0]
    report.events_read = int(stats["events_in_range"])
    report.quarantined_null_keys = int(stats["null_keys"])
    report.quarantined_null_ts = int(stats["null_event_ts"])
    report.quarantined_by_check = {reason: int(stats[reason]) for reason in
                                   (spec.contract.reasons if spec.contract else ()) if stats[reason]}
    kind = main_kind(spec)
    sql = compile_tiles(runner.dialect, spec) if kind == "tiles" else compile_last_values(runner.dialect, spec)
    expected = layout.tile_schema(spec) if kind == "tiles" else layout.last_values_schema(spec)
    if isinstance(stage, Path):
        runner.write_by_date(sql, params, stage / kind)
        written = _tidy_staged(stage / kind, expected, spec.name)
    else:
        from quiver.offline.store_commit import check_staged

        store = _require(remote)
        runner.write_by_date(sql, params, store.uri(f"{stage}/{kind}", spark=runner.name == "spark"))
        written = check_staged(store, f"{stage}/{kind}", expected, spec.name)
    report.rows_by_date = {day: written.get(day, 0) for day in days}
    report.rows_written = sum(report.rows_by_date.values())


def _stage_quarantine(runner: BatchEngine, spec: ViewSpec, params: dict[str, int], stage: Path | str,
                      report: ViewReport, remote: OfflineStore | None = None) -> None:
    if not report.quarantined:
        return
    rows = runner.fetch(compile_quarantine(runner.dialect, spec), params)
    schema = quarantine_schema(spec)
    dates = rows.column(DATE_COLUMN)
    body = rows.drop_columns([DATE_COLUMN]).cast(schema)
    for day in sorted(set(dates.to_pylist()), key=lambda d: (d is None, d)):
        mask = pc.is_null(dates) if day is None else pc.fill_null(pc.equal(dates, pa.scalar(day, dates.type)), False)
        name = NO_EVENT_TS if day is None else f"date={day.isoformat()}"
        if isinstance(stage, Path):
            folder = stage / QUARANTINE / name
            folder.mkdir(parents=True)
            pq.write_table(body.filter(mask), folder / "part-00000.parquet")
        else:
            pq.write_table(body.filter(mask), f"{stage}/{QUARANTINE}/{name}/part-00000.parquet",
                           filesystem=_require(remote).fs)


def quarantine_schema(spec: ViewSpec) -> pa.Schema:
    """Arrow schema of a view's quarantined rows: the source columns it reads and its contract checks, then
    the reason."""
    fields = [pa.field(name, layout.arrow_type(dtype)) for name, dtype in quarantine_columns(spec)]
    return pa.schema([*fields, pa.field(REASON_COLUMN, pa.string())])


def _tidy_staged(folder: Path, expected: pa.Schema, view: str) -> dict[date, int]:
    """Check what the engine wrote, name its files part-NNNNN.parquet, drop checksum files; rows per date."""
    counts: dict[date, int] = {}
    if not folder.is_dir():
        return counts  # no rows at all: the engine may write nothing
    prefix = f"{DATE_COLUMN}="
    for part in sorted(p for p in folder.iterdir() if p.is_dir() and p.name.startswith(prefix)):
        day = date.fromisoformat(part.name[len(prefix):])
        files = sorted(p for p in part.iterdir() if p.suffix == ".parquet" and not p.name.startswith((".", "_")))
        rows = 0
        for index, path in enumerate(files):
            meta = pq.ParquetFile(path)
            got = meta.schema_arrow
            if [(f.name, f.type) for f in got] != [(f.name, f.type) for f in expected]:
                raise RuntimeError(f"view {view!r}: engine wrote schema {got} to {path}, expected {expected}")
            rows += meta.metadata.num_rows
            path.rename(part / f"part-{index:05d}.parquet")
        for leftover in part.iterdir():
            if not leftover.name.startswith("part-"):
                leftover.unlink()  # Hadoop .crc checksums
        counts[day] = rows
    return counts


# ---- commit ----


def _commit(root: Path, spec: ViewSpec, start: date, end: date, stage: Path) -> None:
    """Swap every date of the range into place; dates without rows get an empty partition."""
    kind = main_kind(spec)
    expected = layout.tile_schema(spec) if kind == "tiles" else layout.last_values_schema(spec)
    for day in _days(start, end):
        staged = stage / kind / f"{DATE_COLUMN}={day.isoformat()}"
        if not staged.is_dir():
            staged.mkdir(parents=True)
            pq.write_table(expected.empty_table(), staged / "part-00000.parquet")
        layout.replace_partition(layout.partition_dir(root, spec.name, kind, day), staged)
    base = Path(root) / QUARANTINE / spec.name
    for day in _days(start, end):
        _replace_or_remove(base / f"date={day.isoformat()}", stage / QUARANTINE / f"date={day.isoformat()}")
    _replace_or_remove(base / NO_EVENT_TS, stage / QUARANTINE / NO_EVENT_TS)


def _replace_or_remove(target: Path, staged: Path) -> None:
    if staged.is_dir():
        layout.replace_partition(target, staged)
    elif target.exists():
        # Stale quarantine of an earlier run of this date: move it aside in one rename, then delete.
        old = target.with_name(f".old-{target.name}-{uuid.uuid4().hex[:8]}")
        target.rename(old)
        shutil.rmtree(old, ignore_errors=True)


# ---- helpers ----


def _require(store: OfflineStore | None) -> OfflineStore:
    if store is None:
        raise AssertionError("staged on an object store without one")
    return store


def _late_event_files(store: OfflineStore, views: Sequence[ViewSpec]) -> dict[str, list[str]]:
    """Late and future-dated stream events the streaming job set aside for the batch route (streaming/late.py),
    paths inside the offline store."""
    return {s: store.late_event_files(s) for s in sorted({v.source for v in views})}


def _columns_differ(schemas: list[pa.Schema]) -> bool:
    return len({tuple(s.names) for s in schemas}) > 1


def _days(start: date, end: date) -> list[date]:
    return [start + timedelta(days=i) for i in range((end - start).days + 1)]


def _day_us(day: date) -> int:
    return (day - date(1970, 1, 1)).days * _US_PER_DAY


def _utc(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


def _detail(report: BackfillReport, view: ViewReport) -> dict[str, Any]:
    return {
        "start": report.start.isoformat(), "end": report.end.isoformat(), "engine": report.engine,
        "kind": view.kind, "events_read": view.events_read,
        "quarantined_null_keys": view.quarantined_null_keys, "quarantined_null_ts": view.quarantined_null_ts,
        "quarantined_by_check": dict(sorted(view.quarantined_by_check.items())),
        "rows_written": view.rows_written, "seconds": round(report.seconds, 3),
        "rows_by_date": {d.isoformat(): n for d, n in sorted(view.rows_by_date.items())},
    }
