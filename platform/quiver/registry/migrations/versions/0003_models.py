"""Models: versions (artifact, window, features, metrics, lineage, reference), aliases, alias history.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "model_versions",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("project", sa.String(63), nullable=False),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("artifact_path", sa.String(1024), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("window_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("cutoff", sa.DateTime(timezone=True), nullable=False),
        sa.Column("features_json", sa.Text, nullable=False),
        sa.Column("catalog_version", sa.Integer, nullable=True),
        sa.Column("label_column", sa.String(63), nullable=False),
        sa.Column("metrics_json", sa.Text, nullable=False),
        sa.Column("lineage_json", sa.Text, nullable=False),
        sa.Column("reference_path", sa.String(1024), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_by", sa.String(255), nullable=False),
        sa.UniqueConstraint("project", "name", "version", name="uq_model_versions_project_name_version"),
    )
    op.create_table(
        "model_aliases",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("project", sa.String(63), nullable=False),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("alias", sa.String(63), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("project", "name", "alias", name="uq_model_aliases_project_name_alias"),
    )
    op.create_table(
        "model_alias_history",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("project", sa.String(63), nullable=False),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("alias", sa.String(63), nullable=False),
        sa.Column("from_version", sa.Integer, nullable=True),
        sa.Column("to_version", sa.Integer, nullable=True),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("moved_by", sa.String(255), nullable=False),
        sa.Column("decision_id", sa.Integer, nullable=True),
        sa.Column("moved_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_model_alias_history_name", "model_alias_history", ["project", "name", "id"])


def downgrade() -> None:
    op.drop_table("model_alias_history")
    op.drop_table("model_aliases")
    op.drop_table("model_versions")
