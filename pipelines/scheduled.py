"""Jobs the Airflow DAGs call: each takes plain arguments (dates, paths) and returns a JSON-ready summary.

DAG files stay thin (schedule, dependencies, retries); the work, and its tests, live here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quiver.catalog.loader import load_catalog
from quiver.config import Config, load_config

if TYPE_CHECKING:
    from quiver.catalog.locations import Location


def _project(config_path: str | None) -> tuple[Config, Any]:
    config = load_config(Path(config_path) if config_path else None)
    return config, load_catalog(config.catalog_dir, root=config.root)


def quality_gate_day(day: str, config_path: str | None = None, max_bad_fraction: float = 0.01) -> dict[str, Any]:
    """Gate the day's input batches (one `date=<day>` partition per source) before they are backfilled.

    A source with a contract passes while the share of rows its contract refuses stays within the contract's
    `max_invalid_share` (the backfill quarantines those rows one by one, by the same rules); without one, a
    batch whose flagged rows stay within `max_bad_fraction` passes. A batch above it, or with a table-level failure (missing column, wrong type), fails the gate: it
    is moved to quarantine with its report and an alert is raised, so the backfill never reads it. Re-running
    the day changes nothing further: a quarantined batch is no longer in the ingest path.

    A source on an object store is gated the same way on the day's files of its listing (`store_day_batches`);
    a failing file goes to `<source prefix>/_quarantine/<source>/<batch_id>/` in the bucket (copied, then
    deleted; `source_left` in its entry says why a delete failed) and its entry names both URIs.
    """
    import pyarrow.parquet as pq

    from quiver.catalog.locations import is_remote
    from quiver.monitoring.alerts import AlertManager, sinks_from_config
    from quiver.monitoring.quality import QualityGate, read_batch
    from quiver.monitoring.settings import load_settings
    from quiver.registry import Registry

    config, catalog = _project(config_path)
    settings = load_settings(config)
    alerts = AlertManager(Registry(config.registry, project=config.project),
                          sinks_from_config(settings.alert_sinks))
    gate = QualityGate(catalog, quarantine_dir=settings.quarantine_dir, expectations_dir=settings.expectations_dir,
                       on_failure="continue", alerts=alerts)
    sources: dict[str, Any] = {}
    for name, source in sorted(catalog.sources.items()):
        store: Location | None = None
        if is_remote(source.path):
            store, paths = store_day_batches(source.path, config.root, day, f"source {name!r} path")
        else:
            folder = config.root / source.path / f"date={day}"
            paths = [str(p) for p in sorted(folder.glob("*.parquet"))] if folder.is_dir() else []
        for path in paths:
            table = pq.read_table(path, filesystem=store.fs if store else None)
            frame = read_batch(table)
            success, validation = gate.validate(frame, name, table=table)
            flagged, table_level = _flagged_rows(validation)
            entry = {"file": store.uri(path) if store else Path(path).name, "rows": len(frame),
                     "flagged_rows": flagged, "passed": True}
            # With a contract the suite itself holds the threshold (the contract's max_invalid_share).
            strict = source.contract is not None
            if not success and (strict or table_level or flagged > max_bad_fraction * max(len(frame), 1)):
                # the pipeline's gate: the failing file leaves the ingest path
                result = gate.gate(path, name, store=store) if store else gate.gate(Path(path), name)
                entry.update(passed=False, bad_rows=result.n_bad_rows,
                             quarantine=result.quarantine_uri or (
                                 str(result.quarantine_path) if result.quarantine_path else None))
                if result.source_left is not None:
                    entry["source_left"] = result.source_left
            sources.setdefault(name, []).append(entry)
        if sources.get(name) and all(entry["passed"] for entry in sources[name]):
            alerts.resolve("quality", name)  # only when none of its files failed: a later good file is no cure
    failed = sorted(n for n, batches in sources.items() if any(not b.get("passed", True) for b in batches))
    return {"day": day, "sources": sources, "quarantined": failed, "passed": not failed}


def store_day_batches(source_path: str, project_root: Path, day: str, setting: str) -> tuple[Location, list[str]]:
    """The day's files of a source on an object store, and a Location rooted at the source's prefix (where
    its `_quarantine/` goes).

    The files are those the source's listing holds (`source_location`: what the backfill reads, hidden and
    `_`-prefixed names skipped) whose folder is `date=<day>`: for a prefix, `<prefix>/date=<day>/*.parquet`
    as for a folder (and `date=<day>` folders deeper down); for a glob, the files it matches in such folders.
    """
    from quiver.catalog.schema import source_location

    files = source_location(source_path, project_root, setting)
    root = listing_root(files.location.base, single_file=files.paths == (files.location.base,))
    return replace(files.location, base=root), day_files(files.paths, day)


def listing_root(base: str, single_file: bool = False) -> str:
    """The folder a source's listing starts from: a prefix itself, a glob's folders before its first wildcard,
    a single file's folder."""
    parts = base.rstrip("/").split("/")
    wild = next((i for i, part in enumerate(parts) if any(c in part for c in "*?[")), None)
    if wild is not None:
        return "/".join(parts[:wild])
    return "/".join(parts[:-1]) if single_file else "/".join(parts)


def day_files(paths: Iterable[str], day: str) -> list[str]:
    """The paths whose folder is the day's partition (`…/date=<day>/<file>`), sorted."""
    folder = f"date={day}"
    return sorted(p for p in paths if p.count("/") >= 1 and p.rsplit("/", 2)[-2] == folder)


def _flagged_rows(validation: dict[str, Any]) -> tuple[int, bool]:
    """(an upper bound on the rows flagged, whether an expectation failed for the table as a whole)."""
    flagged, table_level = 0, False
    for item in validation.get("results", []):
        if item.get("success"):
            continue
        count = (item.get("result") or {}).get("unexpected_count")
        if count is None:
            table_level = True
        else:
            flagged += int(count)
    return flagged, table_level


def backfill_day(day: str, config_path: str | None = None, engine: str | None = None) -> dict[str, Any]:
    """Recompute one day's tiles and last values (re-running replaces exactly that day)."""
    from quiver.offline.backfill import backfill

    config, catalog = _project(config_path)
    when = date.fromisoformat(day)
    report = backfill(config, catalog, when, when, engine=engine or config.engine)
    return {"day": day, "rows_written": report.rows_written,
            "views": {name: {"events": v.events_read, "rows": v.rows_written, "quarantined": v.quarantined}
                      for name, v in report.views.items()}}


def materialize_until(day: str, config_path: str | None = None) -> dict[str, Any]:
    """Load the online store with values as of the end of `day` (midnight UTC after it)."""
    from quiver.online.materialize import materialize

    config, catalog = _project(config_path)
    end = datetime.combine(date.fromisoformat(day) + timedelta(days=1), time(), tzinfo=UTC)
    report = materialize(config, catalog, end=end)
    return {"day": day, "entities_written": report.entities_written, "seconds": round(report.seconds, 3)}
