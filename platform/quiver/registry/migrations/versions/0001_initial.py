"""Initial registry schema: catalog versions, definitions, lineage, materialization runs.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "catalog_versions",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("project", sa.String(63), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("content_hash", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("author", sa.String(255), nullable=False),
        sa.Column("catalog_json", sa.Text, nullable=False),
        sa.Column("diff_json", sa.Text, nullable=False),
        sa.UniqueConstraint("project", "version", name="uq_catalog_versions_project_version"),
    )
    op.create_table(
        "definitions",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("version_id", sa.Integer, sa.ForeignKey("catalog_versions.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("content_hash", sa.String(64), nullable=False),
        sa.Column("spec_json", sa.Text, nullable=False),
        sa.Column("location", sa.String(1024), nullable=False),
        sa.UniqueConstraint("version_id", "kind", "name", name="uq_definitions_version_kind_name"),
    )
    op.create_table(
        "lineage_edges",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("version_id", sa.Integer, sa.ForeignKey("catalog_versions.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("parent_kind", sa.String(32), nullable=False),
        sa.Column("parent_name", sa.String(63), nullable=False),
        sa.Column("child_kind", sa.String(32), nullable=False),
        sa.Column("child_name", sa.String(63), nullable=False),
    )
    op.create_index("ix_lineage_child", "lineage_edges", ["version_id", "child_kind", "child_name"])
    op.create_table(
        "materialization_runs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("project", sa.String(63), nullable=False),
        sa.Column("view", sa.String(63), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("engine", sa.String(32), nullable=False),
        sa.Column("start_ts", sa.DateTime(timezone=True), nullable=True),
        sa.Column("end_ts", sa.DateTime(timezone=True), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("rows", sa.Integer, nullable=False),
        sa.Column("detail_json", sa.Text, nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_runs_project_view", "materialization_runs", ["project", "view", "kind"])


def downgrade() -> None:
    op.drop_table("materialization_runs")
    op.drop_table("lineage_edges")
    op.drop_table("definitions")
    op.drop_table("catalog_versions")
