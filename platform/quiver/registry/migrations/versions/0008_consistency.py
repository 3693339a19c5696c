"""Consistency: runs of the online/offline consistency job and their per-feature results.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "consistency_runs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("project", sa.String(63), nullable=False),
        sa.Column("subject", sa.String(255), nullable=False),
        sa.Column("window_start", _TS, nullable=False),
        sa.Column("window_end", _TS, nullable=False),
        sa.Column("as_of", _TS, nullable=False),
        sa.Column("started_at", _TS, nullable=False),
        sa.Column("finished_at", _TS, nullable=False),
        sa.Column("rows_logged", sa.Integer, nullable=False),
        sa.Column("rows_compared", sa.Integer, nullable=False),
        sa.Column("n_features", sa.Integer, nullable=False),
        sa.Column("n_inconsistent", sa.Integer, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("detail_json", sa.Text, nullable=False),
    )
    op.create_index("ix_consistency_runs_project_subject", "consistency_runs", ["project", "subject", "window_end"])
    op.create_table(
        "consistency_results",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.Integer, sa.ForeignKey("consistency_runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("project", sa.String(63), nullable=False),
        sa.Column("feature", sa.String(255), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("compared", sa.Integer, nullable=False),
        sa.Column("equal", sa.Integer, nullable=False),
        sa.Column("mismatched", sa.Integer, nullable=False),
        sa.Column("missing_online", sa.Integer, nullable=False),
        sa.Column("missing_offline", sa.Integer, nullable=False),
        sa.Column("late", sa.Integer, nullable=False),
        sa.Column("wrong", sa.Integer, nullable=False),
        sa.Column("wrong_rate", sa.Float, nullable=False),
        sa.Column("threshold", sa.Float, nullable=False),
        sa.Column("smape", sa.Float, nullable=True),
        sa.Column("computed_at", _TS, nullable=False),
        sa.Column("detail_json", sa.Text, nullable=False),
    )
    op.create_index("ix_consistency_results_feature", "consistency_results", ["project", "feature", "computed_at"])
    op.create_index("ix_consistency_results_run", "consistency_results", ["run_id"])


def downgrade() -> None:
    op.drop_table("consistency_results")
    op.drop_table("consistency_runs")
