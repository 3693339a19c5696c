"""Registry tables of the model half (SQLAlchemy Core): model versions, aliases, and the alias history.

Created and evolved only by migrations/versions/0003_models.py onwards.

* `model_versions` is append-only apart from `status` (registered → archived): one row per trained model,
  numbered per (project, name), with the artifact's path and sha256, the training window, the features and
  catalog version, metrics, lineage and the path of the reference distribution drift checks compare with.
* `model_aliases` holds where each alias points now; one row per (project, name, alias). Moves are
  compare-and-set under the registry's write lock.
* `model_alias_history` records every move (from → to, reason, by, decision) and is never updated or deleted.
"""

from __future__ import annotations

from sqlalchemy import Column, DateTime, Index, Integer, MetaData, String, Table, Text, UniqueConstraint

metadata = MetaData()

model_versions = Table(
    "model_versions",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("project", String(63), nullable=False),
    Column("name", String(63), nullable=False),
    Column("version", Integer, nullable=False),
    Column("status", String(16), nullable=False),  # registered | rejected | archived
    Column("artifact_path", String(1024), nullable=False),
    Column("sha256", String(64), nullable=False),
    Column("window_start", DateTime(timezone=True), nullable=False),
    Column("cutoff", DateTime(timezone=True), nullable=False),
    Column("features_json", Text, nullable=False),
    Column("catalog_version", Integer, nullable=True),
    Column("label_column", String(63), nullable=False),
    Column("metrics_json", Text, nullable=False),
    Column("lineage_json", Text, nullable=False),
    Column("reference_path", String(1024), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("created_by", String(255), nullable=False, default=""),
    UniqueConstraint("project", "name", "version", name="uq_model_versions_project_name_version"),
)

model_aliases = Table(
    "model_aliases",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("project", String(63), nullable=False),
    Column("name", String(63), nullable=False),
    Column("alias", String(63), nullable=False),
    Column("version", Integer, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    UniqueConstraint("project", "name", "alias", name="uq_model_aliases_project_name_alias"),
)

model_alias_history = Table(
    "model_alias_history",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("project", String(63), nullable=False),
    Column("name", String(63), nullable=False),
    Column("alias", String(63), nullable=False),
    Column("from_version", Integer, nullable=True),  # null: the alias did not exist before
    Column("to_version", Integer, nullable=True),  # null: the alias was removed
    Column("reason", Text, nullable=False),
    Column("moved_by", String(255), nullable=False),
    Column("decision_id", Integer, nullable=True),
    Column("moved_at", DateTime(timezone=True), nullable=False),  # wall time recorded
    Column("as_of", DateTime(timezone=True), nullable=True),  # 0007: data time of the decision behind the move
    Index("ix_model_alias_history_name", "project", "name", "id"),
)
