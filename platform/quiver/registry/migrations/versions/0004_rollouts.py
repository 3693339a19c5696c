"""Rollouts (canary steps, salt, fraction, status) and decisions (verdicts with statistics, idempotency key).

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rollouts",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("project", sa.String(63), nullable=False),
        sa.Column("model", sa.String(63), nullable=False),
        sa.Column("champion_version", sa.Integer, nullable=False),
        sa.Column("canary_version", sa.Integer, nullable=False),
        sa.Column("salt", sa.String(64), nullable=False),
        sa.Column("fraction", sa.Float, nullable=False),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("settings_json", sa.Text, nullable=False),
        sa.Column("step_started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("started_by", sa.String(255), nullable=False),
    )
    # One running rollout per model; finished ones stay as history.
    op.create_index("uq_rollouts_running", "rollouts", ["project", "model"], unique=True,
                    sqlite_where=sa.text("status = 'running'"), postgresql_where=sa.text("status = 'running'"))
    op.create_index("ix_rollouts_model", "rollouts", ["project", "model", "id"])
    op.create_table(
        "decisions",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("project", sa.String(63), nullable=False),
        sa.Column("model", sa.String(63), nullable=False),
        sa.Column("rollout_id", sa.Integer, sa.ForeignKey("rollouts.id", ondelete="CASCADE"), nullable=True),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("step", sa.Integer, nullable=True),
        sa.Column("fraction", sa.Float, nullable=True),
        sa.Column("champion_version", sa.String(127), nullable=False),
        sa.Column("candidate_version", sa.String(127), nullable=False),
        sa.Column("statistics_json", sa.Text, nullable=False),
        sa.Column("idempotency_key", sa.String(64), nullable=False),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("decided_by", sa.String(255), nullable=False),
    )
    op.create_index("uq_decisions_key", "decisions", ["project", "idempotency_key"], unique=True)
    op.create_index("ix_decisions_model", "decisions", ["project", "model", "id"])


def downgrade() -> None:
    op.drop_table("decisions")
    op.drop_table("rollouts")
