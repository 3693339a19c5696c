"""The registry: catalog versions, definitions, lineage and runs, on any SQLAlchemy database.

Writes take the database's write lock first (SQLite `BEGIN IMMEDIATE`, a Postgres advisory lock), so
concurrent `apply`s from several processes serialize instead of racing for the next version number.
"""

from __future__ import annotations

import getpass
import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    Connection,
    CursorResult,
    Engine,
    create_engine,
    event,
    func,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.exc import DBAPIError

from quiver.catalog.errors import QuiverError
from quiver.catalog.ir import Catalog, content_hash, spec_to_dict
from quiver.registry.diff import CatalogDict, CatalogDiff, diff_catalogs
from quiver.registry.tables import catalog_versions, definitions, lineage_edges, materialization_runs

if TYPE_CHECKING:
    from quiver.config import Config

log = logging.getLogger(__name__)

_MIGRATIONS = Path(__file__).parent / "migrations"
_ADVISORY_LOCK = 7426184


@dataclass(frozen=True)
class VersionInfo:
    """One stored catalog version."""

    version: int
    content_hash: str
    created_at: datetime
    author: str
    diff: list[dict[str, Any]]


@dataclass(frozen=True)
class ApplyResult:
    """What `apply` did: the version now current, whether it was created, and the diff from the previous."""

    version: int
    created: bool
    diff: CatalogDiff


def make_engine(url: str) -> Engine:
    """An engine whose transactions take the write lock up front (SQLite) and wait instead of failing."""
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            _private_sqlite_file(Path(path))
        engine = create_engine(url, connect_args={"timeout": 60})

        @event.listens_for(engine, "connect")
        def _no_implicit_begin(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.isolation_level = None  # let us emit BEGIN ourselves
            dbapi_connection.execute("PRAGMA foreign_keys=ON")

        @event.listens_for(engine, "begin")
        def _begin_immediate(connection: Connection) -> None:
            connection.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    return create_engine(url, pool_pre_ping=True)


def _private_sqlite_file(path: Path) -> None:
    """Create a new registry file owner-only (0600), before SQLite would create it 0644 (its journal and WAL
    files take the database file's mode). A file that exists keeps its mode: its owner chose it."""
    from quiver.artifacts import private_dirs

    if "?" in str(path) or str(path).startswith("file:"):  # a URI filename: SQLite opens it as told
        return
    private_dirs(path.parent)
    if not path.exists():
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))  # an empty file is an empty database


class Registry:
    """Catalog versions and run records for one project."""

    def __init__(self, url: str, project: str = "default", *, migrate: bool = True):
        self.url = url
        self.project = project
        try:
            self.engine = make_engine(url)
        except Exception as exc:  # bad URL or missing driver: a user error, said plainly
            raise QuiverError(f"cannot open registry {_safe_url(url)}: {exc}") from None
        if migrate:
            try:
                self.migrate()
            except DBAPIError as exc:  # unreachable server, wrong credentials, unwritable file
                self.engine.dispose()
                raise QuiverError(f"cannot open registry {_safe_url(url)}: {exc.orig or exc}") from None

    def migrate(self) -> None:
        """Bring the schema to the newest migration (safe to run concurrently)."""
        from alembic import command
        from alembic.config import Config as AlembicConfig

        config = AlembicConfig()
        config.set_main_option("script_location", str(_MIGRATIONS))
        with self.engine.connect() as connection:
            config.attributes["connection"] = connection
            command.upgrade(config, "head")
            connection.commit()

    def schema_revision(self) -> str | None:
        with self.engine.connect() as connection:
            return connection.execute(text("SELECT version_num FROM alembic_version")).scalar()

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        with self.engine.begin() as connection:
            if connection.dialect.name == "postgresql":
                connection.execute(text(f"SELECT pg_advisory_xact_lock({_ADVISORY_LOCK})"))
            yield connection

    # ----- catalog versions -----

    def latest(self, connection: Connection | None = None) -> tuple[int, str, CatalogDict] | None:
        """(version, hash, catalog dict) of the newest version, or None when nothing was applied."""
        query = (select(catalog_versions.c.version, catalog_versions.c.content_hash,
                        catalog_versions.c.catalog_json)
                 .where(catalog_versions.c.project == self.project)
                 .order_by(catalog_versions.c.version.desc()).limit(1))
        if connection is None:
            with self.engine.connect() as own:
                row = own.execute(query).first()
        else:
            row = connection.execute(query).first()
        return (row.version, row.content_hash, json.loads(row.catalog_json)) if row else None

    def plan(self, catalog: Catalog) -> CatalogDiff:
        """The diff `apply` would store, without writing."""
        current = self.latest()
        return diff_catalogs(current[2] if current else None, catalog.to_dict())

    def apply(self, catalog: Catalog, author: str | None = None) -> ApplyResult:
        """Store `catalog` as a new version when its content changed; record definitions and lineage."""
        new = catalog.to_dict()
        digest = content_hash(new)
        with self._write() as connection:
            current = self.latest(connection)
            if current and current[1] == digest:
                return ApplyResult(current[0], False, CatalogDiff([]))
            diff = diff_catalogs(current[2] if current else None, new)
            version = (current[0] if current else 0) + 1
            version_id = _new_id(connection.execute(insert(catalog_versions).values(
                project=self.project, version=version, content_hash=digest,
                created_at=datetime.now(UTC), author=(author or _author())[:255],
                catalog_json=json.dumps(new, sort_keys=True), diff_json=json.dumps(diff.to_json()),
            )))
            rows = [
                {"version_id": version_id, "kind": kind, "name": name,
                 "content_hash": content_hash(spec_to_dict(spec)),
                 "spec_json": json.dumps(spec_to_dict(spec), sort_keys=True),
                 "location": str(getattr(spec, "location", ""))[-1024:]}
                for kind, specs in catalog.by_kind().items() for name, spec in specs.items()
            ]
            if rows:
                connection.execute(insert(definitions), rows)
            edges = _lineage(catalog, version_id)
            if edges:
                connection.execute(insert(lineage_edges), edges)
        return ApplyResult(version, True, diff)

    def versions(self) -> list[VersionInfo]:
        """All versions, oldest first."""
        query = (select(catalog_versions).where(catalog_versions.c.project == self.project)
                 .order_by(catalog_versions.c.version))
        with self.engine.connect() as connection:
            return [VersionInfo(r.version, r.content_hash, r.created_at, r.author, json.loads(r.diff_json))
                    for r in connection.execute(query)]

    def catalog_dict(self, version: int | None = None) -> CatalogDict:
        """The stored canonical catalog of `version` (default: latest)."""
        query = select(catalog_versions.c.catalog_json).where(catalog_versions.c.project == self.project)
        query = query.where(catalog_versions.c.version == version) if version else query.order_by(
            catalog_versions.c.version.desc()).limit(1)
        with self.engine.connect() as connection:
            blob = connection.execute(query).scalar()
        if blob is None:
            raise QuiverError(f"project {self.project!r} has no catalog version {version or '(none applied)'}")
        return dict(json.loads(blob))

    def lineage(self, name: str, version: int | None = None) -> list[tuple[str, str, str, str]]:
        """(parent_kind, parent_name, child_kind, child_name) edges touching `name` in a version."""
        with self.engine.connect() as connection:
            vid_query = select(catalog_versions.c.id).where(catalog_versions.c.project == self.project)
            vid_query = vid_query.where(catalog_versions.c.version == version) if version else vid_query.order_by(
                catalog_versions.c.version.desc()).limit(1)
            vid = connection.execute(vid_query).scalar()
            rows = connection.execute(select(lineage_edges).where(lineage_edges.c.version_id == vid).where(
                (lineage_edges.c.child_name == name) | (lineage_edges.c.parent_name == name)))
            return [(r.parent_kind, r.parent_name, r.child_kind, r.child_name) for r in rows]

    # ----- runs -----

    def start_run(self, view: str, kind: str, engine: str, start_ts: datetime | None = None,
                  end_ts: datetime | None = None) -> int:
        with self._write() as connection:
            result = connection.execute(insert(materialization_runs).values(
                project=self.project, view=view, kind=kind, engine=engine, start_ts=start_ts, end_ts=end_ts,
                status="running", rows=0, detail_json="{}", started_at=datetime.now(UTC)))
            return _new_id(result)

    def finish_run(self, run_id: int, status: str, rows: int = 0, detail: dict[str, Any] | None = None) -> None:
        with self._write() as connection:
            connection.execute(update(materialization_runs).where(materialization_runs.c.id == run_id).values(
                status=status, rows=rows, detail_json=json.dumps(detail or {}, default=str),
                finished_at=datetime.now(UTC)))

    def runs(self, view: str | None = None, kind: str | None = None) -> list[dict[str, Any]]:
        query = select(materialization_runs).where(materialization_runs.c.project == self.project)
        if view:
            query = query.where(materialization_runs.c.view == view)
        if kind:
            query = query.where(materialization_runs.c.kind == kind)
        with self.engine.connect() as connection:
            return [dict(r._mapping) for r in connection.execute(query.order_by(materialization_runs.c.id))]

    def count_versions(self) -> int:
        with self.engine.connect() as connection:
            return int(connection.execute(select(func.count()).select_from(catalog_versions).where(
                catalog_versions.c.project == self.project)).scalar() or 0)

    def close(self) -> None:
        self.engine.dispose()


@dataclass(frozen=True)
class AppliedCatalog:
    """The catalog readers use and where it came from: registry version `version` (None: nothing applied yet,
    so the definitions on disk), and whether the disk differs from it (`quiver plan` says how)."""

    catalog: Catalog
    version: int | None
    disk_differs: bool = False


def load_applied_catalog(config: Config, catalog_dir: str | Path | None = None) -> AppliedCatalog:
    """The registry's current catalog version, the one every reader (list, describe, FeatureStore,
    materialize, serve, jobs) uses: `quiver apply` is the gate. Definitions on disk are used as they are only
    while the project has no applied version yet. When the disk matches the current version its
    catalog (with file locations) is returned; when it differs, the stored version is rebuilt from the
    registry and a warning says that the disk holds unapplied changes."""
    directory = Path(catalog_dir) if catalog_dir else config.catalog_dir
    current = _current_version(config)
    if current is None:
        return AppliedCatalog(_load_catalog(directory, root=config.root), None)
    version, digest, stored = current
    try:
        disk: Catalog | None = _load_catalog(directory, root=config.root)
    except QuiverError as exc:  # a broken working copy must not stop serving what was applied
        log.warning("catalog on disk does not load (%s); using applied version %d", exc, version)
        disk = None
    if disk is not None and disk.content_hash == digest:
        return AppliedCatalog(disk, version)
    # Info, not a warning: commands say it in their own words (list, describe, plan), servers log it.
    log.info("definitions on disk differ from applied catalog version %d of project %r: using version %d "
                "(run `quiver plan` to see the difference, `quiver apply` to apply it)", version,
                config.project, version)
    from quiver.catalog.loader import catalog_from_dict

    return AppliedCatalog(catalog_from_dict(stored), version, disk_differs=True)


def _current_version(config: Config) -> tuple[int, str, dict[str, Any]] | None:
    url = config.registry
    if url.startswith("sqlite") and ":memory:" not in url:
        path = url.split("///", 1)[-1].split("?", 1)[0]
        if path and not Path(path).exists():  # never applied here; do not create a registry just to look
            return None
    registry = Registry(url, project=config.project)
    try:
        return registry.latest()
    finally:
        registry.close()


def _load_catalog(directory: Path, root: Path) -> Catalog:
    from quiver.catalog.loader import load_catalog

    return load_catalog(directory, root=root)


def _lineage(catalog: Catalog, version_id: int) -> list[dict[str, Any]]:
    edges = []
    for view in catalog.views.values():
        edges.append(("source", view.source, "feature_view", view.name))
        edges.extend(("entity", entity, "feature_view", view.name) for entity in view.entities)
    for service in catalog.services.values():
        for view_name in sorted({ref.split(":", 1)[0] for ref in service.features}):
            edges.append(("feature_view", view_name, "feature_service", service.name))
    return [{"version_id": version_id, "parent_kind": a, "parent_name": b, "child_kind": c, "child_name": d}
            for a, b, c, d in edges]


def _new_id(result: CursorResult[Any]) -> int:
    key = result.inserted_primary_key
    if key is None:  # every registry table has an autoincrement id
        raise RuntimeError("the database returned no id for an insert")
    return int(key[0])


def _safe_url(url: str) -> str:
    # Error messages end up in logs and terminals: never print a password.
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not even a URL: it holds no password we could recognise either
        return repr(url)


def _author() -> str:
    try:
        return os.environ.get("QUIVER_AUTHOR") or getpass.getuser()
    except Exception:  # no login name in some containers
        return "unknown"
