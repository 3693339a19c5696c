"""Registry tables of rollouts and decisions (SQLAlchemy Core). Created by migrations/versions/0004_rollouts.py
(0005_loop_state.py adds the reference, the watch and when a decision was applied; 0007_two_clocks.py the
data time judged beside the wall time recorded).

* `rollouts`: one canary rollout of a model — champion and canary versions, the routing salt, the canary's
  traffic fraction and step, status (running | promoted | rolled_back | halted) and the judge settings it was
  started with (so every step is judged alike). A partial unique index allows one *running* rollout per model.
* `decisions`: every shadow verdict, canary step judgement and manual rollback, with the statistics that
  justified it. `idempotency_key` (unique per project) is a digest of what the decision was computed from:
  recording the same judgement twice stores it once. Alias moves point back here through
  `model_alias_history.decision_id`.
"""

from __future__ import annotations

from sqlalchemy import (
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
    text,
)

metadata = MetaData()

rollouts = Table(
    "rollouts",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("project", String(63), nullable=False),
    Column("model", String(63), nullable=False),
    Column("champion_version", Integer, nullable=False),
    Column("canary_version", Integer, nullable=False),
    Column("salt", String(64), nullable=False),
    Column("fraction", Float, nullable=False),
    Column("step", Integer, nullable=False),
    Column("status", String(16), nullable=False),
    Column("settings_json", Text, nullable=False),
    Column("step_started_at", DateTime(timezone=True), nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=False),
    Column("finished_at", DateTime(timezone=True), nullable=True),
    Column("started_by", String(255), nullable=False),
    Column("reference_json", Text, nullable=False, server_default="{}"),
    Column("watch_until", DateTime(timezone=True), nullable=True),
    Column("recorded_at", DateTime(timezone=True), nullable=True),  # wall time; started_at is the data time
    Index("uq_rollouts_running", "project", "model", unique=True,
          sqlite_where=text("status = 'running'"), postgresql_where=text("status = 'running'")),
    Index("ix_rollouts_model", "project", "model", "id"),
)

decisions = Table(
    "decisions",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("project", String(63), nullable=False),
    Column("model", String(63), nullable=False),
    Column("rollout_id", Integer, ForeignKey("rollouts.id", ondelete="CASCADE"), nullable=True),
    Column("kind", String(32), nullable=False),  # shadow_evaluation | canary_step | manual_rollback
    Column("outcome", String(16), nullable=False),
    Column("step", Integer, nullable=True),
    Column("fraction", Float, nullable=True),
    Column("champion_version", String(127), nullable=False),
    Column("candidate_version", String(127), nullable=False),
    Column("statistics_json", Text, nullable=False),
    Column("idempotency_key", String(64), nullable=False),
    Column("decided_at", DateTime(timezone=True), nullable=False),
    Column("decided_by", String(255), nullable=False),
    Column("applied_at", DateTime(timezone=True), nullable=True),
    Column("actions_json", Text, nullable=False, server_default="[]"),
    # 0007: the two clocks. as_of: the data time judged (labels and logs up to it); recorded_at: the wall time
    # stored (empty on rows older than 0007 whose decided_at held the data time).
    Column("as_of", DateTime(timezone=True), nullable=True),
    Column("recorded_at", DateTime(timezone=True), nullable=True),
    Index("uq_decisions_key", "project", "idempotency_key", unique=True),
    Index("ix_decisions_model", "project", "model", "id"),
)
