"""Registry tables (SQLAlchemy Core). The schema itself is created and evolved only by migrations/."""

from __future__ import annotations

from sqlalchemy import Column, DateTime, ForeignKey, Integer, MetaData, String, Table, Text, UniqueConstraint

metadata = MetaData()

catalog_versions = Table(
    "catalog_versions",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("project", String(63), nullable=False),
    Column("version", Integer, nullable=False),
    Column("content_hash", String(64), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("author", String(255), nullable=False, default=""),
    Column("catalog_json", Text, nullable=False),
    Column("diff_json", Text, nullable=False),
    UniqueConstraint("project", "version", name="uq_catalog_versions_project_version"),
)

definitions = Table(
    "definitions",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("version_id", Integer, ForeignKey("catalog_versions.id", ondelete="CASCADE"), nullable=False),
    Column("kind", String(32), nullable=False),
    Column("name", String(63), nullable=False),
    Column("content_hash", String(64), nullable=False),
    Column("spec_json", Text, nullable=False),
    Column("location", String(1024), nullable=False, default=""),
    UniqueConstraint("version_id", "kind", "name", name="uq_definitions_version_kind_name"),
)

lineage_edges = Table(
    "lineage_edges",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("version_id", Integer, ForeignKey("catalog_versions.id", ondelete="CASCADE"), nullable=False),
    Column("parent_kind", String(32), nullable=False),
    Column("parent_name", String(63), nullable=False),
    Column("child_kind", String(32), nullable=False),
    Column("child_name", String(63), nullable=False),
)

materialization_runs = Table(
    "materialization_runs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("project", String(63), nullable=False),
    Column("view", String(63), nullable=False),
    Column("kind", String(32), nullable=False),  # backfill | materialize | stream
    Column("engine", String(32), nullable=False),
    Column("start_ts", DateTime(timezone=True), nullable=True),
    Column("end_ts", DateTime(timezone=True), nullable=True),
    Column("status", String(16), nullable=False),  # running | succeeded | failed
    Column("rows", Integer, nullable=False, default=0),
    Column("detail_json", Text, nullable=False, default="{}"),
    Column("started_at", DateTime(timezone=True), nullable=False),
    Column("finished_at", DateTime(timezone=True), nullable=True),
)
