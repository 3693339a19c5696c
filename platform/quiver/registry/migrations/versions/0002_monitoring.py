"""Monitoring: drift runs, per-feature drift results, alerts (one open per dedup key), alert deliveries.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "drift_runs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("project", sa.String(63), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("reference", sa.String(1024), nullable=False),
        sa.Column("current", sa.String(1024), nullable=False),
        sa.Column("engine", sa.String(32), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("n_features", sa.Integer, nullable=False),
        sa.Column("n_judged", sa.Integer, nullable=False),
        sa.Column("n_drifted", sa.Integer, nullable=False),
        sa.Column("drift_share", sa.Float, nullable=False),
        sa.Column("dataset_drift", sa.Boolean, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("detail_json", sa.Text, nullable=False),
    )
    op.create_index("ix_drift_runs_project_name", "drift_runs", ["project", "name", "started_at"])
    op.create_table(
        "drift_results",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.Integer, sa.ForeignKey("drift_runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("project", sa.String(63), nullable=False),
        sa.Column("feature", sa.String(255), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("status", sa.String(24), nullable=False),
        sa.Column("drifted", sa.Boolean, nullable=False),
        sa.Column("psi", sa.Float, nullable=True),
        sa.Column("ks_statistic", sa.Float, nullable=True),
        sa.Column("ks_pvalue", sa.Float, nullable=True),
        sa.Column("wasserstein", sa.Float, nullable=True),
        sa.Column("jensenshannon", sa.Float, nullable=True),
        sa.Column("n_ref", sa.Integer, nullable=False),
        sa.Column("n_cur", sa.Integer, nullable=False),
        sa.Column("nulls_ref", sa.Integer, nullable=False),
        sa.Column("nulls_cur", sa.Integer, nullable=False),
        sa.Column("computed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("detail_json", sa.Text, nullable=False),
    )
    op.create_index("ix_drift_results_feature", "drift_results", ["project", "feature", "computed_at"])
    op.create_index("ix_drift_results_run", "drift_results", ["run_id"])
    op.create_table(
        "alerts",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("project", sa.String(63), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("subject", sa.String(255), nullable=False),
        sa.Column("dedup_key", sa.String(320), nullable=False),
        sa.Column("severity", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("title", sa.String(255), nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("detail_json", sa.Text, nullable=False),
        sa.Column("occurrences", sa.Integer, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("resolved_at", sa.DateTime(timezone=True), nullable=True),
    )
    # At most one open alert per condition; resolved ones stay as history.
    op.create_index("uq_alerts_open_dedup", "alerts", ["project", "dedup_key"], unique=True,
                    sqlite_where=sa.text("status = 'open'"), postgresql_where=sa.text("status = 'open'"))
    op.create_index("ix_alerts_project_status", "alerts", ["project", "status", "created_at"])
    op.create_table(
        "alert_deliveries",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("alert_id", sa.Integer, sa.ForeignKey("alerts.id", ondelete="CASCADE"), nullable=False),
        sa.Column("sink", sa.String(63), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("last_error", sa.Text, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.UniqueConstraint("alert_id", "sink", name="uq_alert_deliveries_alert_sink"),
    )


def downgrade() -> None:
    op.drop_table("alert_deliveries")
    op.drop_table("alerts")
    op.drop_table("drift_results")
    op.drop_table("drift_runs")
