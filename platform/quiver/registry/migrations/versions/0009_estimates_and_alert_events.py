"""Label-free performance estimates beside their realized values, and every state change of an alert.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "performance_estimates",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("project", sa.String(63), nullable=False),
        sa.Column("model", sa.String(255), nullable=False),
        sa.Column("version", sa.String(255), nullable=False),
        sa.Column("arm", sa.String(32), nullable=False),
        sa.Column("window_start", _TS, nullable=False),
        sa.Column("window_end", _TS, nullable=False),
        sa.Column("as_of", _TS, nullable=False),
        sa.Column("computed_at", _TS, nullable=False),
        sa.Column("metric", sa.String(32), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("rows", sa.Integer, nullable=False),
        sa.Column("estimate", sa.Float, nullable=True),
        sa.Column("lower", sa.Float, nullable=True),
        sa.Column("upper", sa.Float, nullable=True),
        sa.Column("reference", sa.Float, nullable=True),
        sa.Column("realized", sa.Float, nullable=True),
        sa.Column("realized_rows", sa.Integer, nullable=True),
        sa.Column("realized_at", _TS, nullable=True),
        sa.Column("detail_json", sa.Text, nullable=False),
        sa.UniqueConstraint("project", "model", "version", "arm", "window_start", "window_end", "metric",
                            name="uq_performance_estimates_window"),
    )
    op.create_index("ix_performance_estimates_model", "performance_estimates", ["project", "model", "window_end"])
    op.create_table(
        "alert_events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("alert_id", sa.Integer, sa.ForeignKey("alerts.id", ondelete="CASCADE"), nullable=False),
        sa.Column("project", sa.String(63), nullable=False),
        sa.Column("event", sa.String(16), nullable=False),
        sa.Column("severity", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("at", _TS, nullable=False),
        sa.Column("as_of", _TS, nullable=True),
        sa.Column("detail_json", sa.Text, nullable=False),
    )
    op.create_index("ix_alert_events_alert", "alert_events", ["alert_id", "at"])


def downgrade() -> None:
    op.drop_index("ix_alert_events_alert", table_name="alert_events")
    op.drop_table("alert_events")
    op.drop_index("ix_performance_estimates_model", table_name="performance_estimates")
    op.drop_table("performance_estimates")
