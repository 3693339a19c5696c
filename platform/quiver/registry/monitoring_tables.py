"""Registry tables of the monitoring loop (SQLAlchemy Core): drift runs, per-feature drift results, alerts
and their deliveries. Created and evolved only by migrations/versions/0002_monitoring.py onwards.

* `drift_results` is the time series of drift per feature: one row per (run, feature), indexed by
  (project, feature, computed_at); the common scores have their own columns, the rest is in detail_json.
* `alerts` holds at most one *open* alert per (project, dedup_key) — a partial unique index enforces it — so a
  repeated condition bumps `occurrences` instead of opening a new alert.
* `alert_deliveries` records each (alert, sink) delivery: pending → delivered | failed, with attempts and the
  last error. The alert row is committed before any delivery is tried, so a failing sink never loses it.
* `alert_events` (0009): every state change of an alert (opened, updated, escalated, resolved), with why, the
  wall clock (`at`) and the data time it was about (`as_of`).
"""

from __future__ import annotations

from sqlalchemy import (
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)

metadata = MetaData()

drift_runs = Table(
    "drift_runs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("project", String(63), nullable=False),
    Column("name", String(255), nullable=False),  # what was compared: a model, a service, a dataset label
    Column("reference", String(1024), nullable=False, default=""),
    Column("current", String(1024), nullable=False, default=""),
    Column("engine", String(32), nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=False),
    Column("finished_at", DateTime(timezone=True), nullable=True),
    Column("n_features", Integer, nullable=False, default=0),
    Column("n_judged", Integer, nullable=False, default=0),
    Column("n_drifted", Integer, nullable=False, default=0),
    Column("drift_share", Float, nullable=False, default=0.0),
    Column("dataset_drift", Boolean, nullable=False, default=False),
    Column("status", String(16), nullable=False),  # succeeded | failed
    Column("detail_json", Text, nullable=False, default="{}"),
    Column("as_of", DateTime(timezone=True), nullable=True),  # 0007: data time compared (current window's end)
    Index("ix_drift_runs_project_name", "project", "name", "started_at"),
)

drift_results = Table(
    "drift_results",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", Integer, ForeignKey("drift_runs.id", ondelete="CASCADE"), nullable=False),
    Column("project", String(63), nullable=False),
    Column("feature", String(255), nullable=False),
    Column("kind", String(16), nullable=False),  # numerical | categorical
    Column("status", String(24), nullable=False),  # ok | warn | alert | insufficient_data | skipped
    Column("drifted", Boolean, nullable=False, default=False),
    Column("psi", Float, nullable=True),
    Column("ks_statistic", Float, nullable=True),
    Column("ks_pvalue", Float, nullable=True),
    Column("wasserstein", Float, nullable=True),
    Column("jensenshannon", Float, nullable=True),
    Column("n_ref", Integer, nullable=False, default=0),
    Column("n_cur", Integer, nullable=False, default=0),
    Column("nulls_ref", Integer, nullable=False, default=0),
    Column("nulls_cur", Integer, nullable=False, default=0),
    Column("computed_at", DateTime(timezone=True), nullable=False),
    Column("detail_json", Text, nullable=False, default="{}"),
    Index("ix_drift_results_feature", "project", "feature", "computed_at"),
    Index("ix_drift_results_run", "run_id"),
)

alerts = Table(
    "alerts",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("project", String(63), nullable=False),
    Column("kind", String(32), nullable=False),  # drift | dataset_drift | quality | freshness | …
    Column("subject", String(255), nullable=False),  # the feature, view, source or run it is about
    Column("dedup_key", String(320), nullable=False),
    Column("severity", String(16), nullable=False),  # info | warning | critical
    Column("status", String(16), nullable=False),  # open | resolved
    Column("title", String(255), nullable=False),
    Column("message", Text, nullable=False, default=""),
    Column("detail_json", Text, nullable=False, default="{}"),
    Column("occurrences", Integer, nullable=False, default=1),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("last_seen_at", DateTime(timezone=True), nullable=False),
    Column("resolved_at", DateTime(timezone=True), nullable=True),
    Column("as_of", DateTime(timezone=True), nullable=True),  # 0007: data time the condition was about
    Index("uq_alerts_open_dedup", "project", "dedup_key", unique=True,
          sqlite_where=text("status = 'open'"), postgresql_where=text("status = 'open'")),
    Index("ix_alerts_project_status", "project", "status", "created_at"),
)

alert_deliveries = Table(
    "alert_deliveries",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("alert_id", Integer, ForeignKey("alerts.id", ondelete="CASCADE"), nullable=False),
    Column("sink", String(63), nullable=False),
    Column("status", String(16), nullable=False),  # pending | delivered | failed
    Column("attempts", Integer, nullable=False, default=0),
    Column("last_error", Text, nullable=False, default=""),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Column("delivered_at", DateTime(timezone=True), nullable=True),
    UniqueConstraint("alert_id", "sink", name="uq_alert_deliveries_alert_sink"),
)

alert_events = Table(
    "alert_events",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("alert_id", Integer, ForeignKey("alerts.id", ondelete="CASCADE"), nullable=False),
    Column("project", String(63), nullable=False),
    Column("event", String(16), nullable=False),  # opened | updated | escalated | resolved
    Column("severity", String(16), nullable=False),
    Column("reason", Text, nullable=False, default=""),
    Column("at", DateTime(timezone=True), nullable=False),  # wall clock
    Column("as_of", DateTime(timezone=True), nullable=True),  # data time the condition was about
    Column("detail_json", Text, nullable=False, default="{}"),
    Index("ix_alert_events_alert", "alert_id", "at"),
)
