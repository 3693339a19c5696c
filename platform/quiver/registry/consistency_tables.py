"""Registry tables of the online/offline consistency job (SQLAlchemy Core), created by
migrations/versions/0008_consistency.py.

* `consistency_runs`: one row per run: what was checked (a model, a service), the serving-log window (its end
  is the run's data time, `as_of`), how many rows were logged and compared, and how many features alerted.
* `consistency_results`: one row per (run, feature), indexed by (project, feature, computed_at): the time
  series of a feature's consistency. Counts have their own columns; the causes and examples are in detail_json.
"""

from __future__ import annotations

from sqlalchemy import Column, DateTime, Float, ForeignKey, Index, Integer, MetaData, String, Table, Text

metadata = MetaData()

consistency_runs = Table(
    "consistency_runs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("project", String(63), nullable=False),
    Column("subject", String(255), nullable=False),  # "model fraud_model", "service fraud", or both
    Column("window_start", DateTime(timezone=True), nullable=False),
    Column("window_end", DateTime(timezone=True), nullable=False),
    Column("as_of", DateTime(timezone=True), nullable=False),  # data time judged: the window's end
    Column("started_at", DateTime(timezone=True), nullable=False),  # wall clock
    Column("finished_at", DateTime(timezone=True), nullable=False),
    Column("rows_logged", Integer, nullable=False),
    Column("rows_compared", Integer, nullable=False),
    Column("n_features", Integer, nullable=False),
    Column("n_inconsistent", Integer, nullable=False),
    Column("status", String(16), nullable=False),  # ok | alert | no_rows
    Column("detail_json", Text, nullable=False, default="{}"),
    Index("ix_consistency_runs_project_subject", "project", "subject", "window_end"),
)

consistency_results = Table(
    "consistency_results",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", Integer, ForeignKey("consistency_runs.id", ondelete="CASCADE"), nullable=False),
    Column("project", String(63), nullable=False),
    Column("feature", String(255), nullable=False),  # view:feature
    Column("status", String(16), nullable=False),  # ok | alert | no_rows
    Column("compared", Integer, nullable=False),
    Column("equal", Integer, nullable=False),
    Column("mismatched", Integer, nullable=False),
    Column("missing_online", Integer, nullable=False),
    Column("missing_offline", Integer, nullable=False),
    Column("late", Integer, nullable=False),
    Column("wrong", Integer, nullable=False),
    Column("wrong_rate", Float, nullable=False),
    Column("threshold", Float, nullable=False),
    Column("smape", Float, nullable=True),
    Column("computed_at", DateTime(timezone=True), nullable=False),
    Column("detail_json", Text, nullable=False, default="{}"),
    Index("ix_consistency_results_feature", "project", "feature", "computed_at"),
    Index("ix_consistency_results_run", "run_id"),
)
