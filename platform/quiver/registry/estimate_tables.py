"""Registry table of label-free performance estimates (SQLAlchemy Core), created by
migrations/versions/0009_estimates_and_alert_events.py (which also adds `monitoring_tables.alert_events`).

* `performance_estimates`: one row per (model, version, arm, serving window, metric): the estimate made
  without labels (`estimate`, with its band `lower`..`upper`, and the same metric on the labelled reference
  in `reference`), and once labels arrived the `realized` value beside it. `status`: estimated | realized |
  uncalibrated (the model's scores failed the calibration check, so nothing was estimated). `as_of` is the
  data time judged (the window's end); `computed_at` and `realized_at` are wall-clock times.
"""

from __future__ import annotations

from sqlalchemy import (
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)

metadata = MetaData()

performance_estimates = Table(
    "performance_estimates",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("project", String(63), nullable=False),
    Column("model", String(255), nullable=False),
    Column("version", String(255), nullable=False),  # the version's label, e.g. "fraud_model:2"
    Column("arm", String(32), nullable=False),  # champion | shadow | canary
    Column("window_start", DateTime(timezone=True), nullable=False),
    Column("window_end", DateTime(timezone=True), nullable=False),
    Column("as_of", DateTime(timezone=True), nullable=False),  # data time judged: the window's end
    Column("computed_at", DateTime(timezone=True), nullable=False),  # wall clock
    Column("metric", String(32), nullable=False),  # roc_auc | log_loss | brier | precision | recall | …
    Column("status", String(16), nullable=False),  # estimated | realized | uncalibrated
    Column("rows", Integer, nullable=False),  # scored rows the estimate used
    Column("estimate", Float, nullable=True),
    Column("lower", Float, nullable=True),
    Column("upper", Float, nullable=True),
    Column("reference", Float, nullable=True),  # the metric on the labelled reference (what "no harm" is)
    Column("realized", Float, nullable=True),
    Column("realized_rows", Integer, nullable=True),
    Column("realized_at", DateTime(timezone=True), nullable=True),
    Column("detail_json", Text, nullable=False, default="{}"),
    UniqueConstraint("project", "model", "version", "arm", "window_start", "window_end", "metric",
                     name="uq_performance_estimates_window"),
    Index("ix_performance_estimates_model", "project", "model", "window_end"),
)
