"""Two clocks: every record of the loop keeps the data time it judged and the wall time it was recorded.

Until now one column held whichever moment its writer had at hand: a canary step's `decided_at` was the
data time it judged (its `as_of`), a shadow verdict's the wall clock, alias moves and alerts the wall clock.
Timelines mixing them put a verdict recorded today below canary steps that judged later data.

* `decisions.as_of`: the data time judged (labels and serving logs up to it); backfilled from the
  statistics' `window.as_of`, else `decided_at`.
* `decisions.recorded_at`: the wall time it was stored; backfilled with `decided_at` where that was the wall
  clock (anything but a `decided_at` equal to the window's `as_of`: the canary judge's), else left empty: the
  old row never recorded it.
* `model_alias_history.as_of`: the data time of the decision that moved the alias, else the move's own
  `moved_at` (a manual move acts on the data of its moment). `moved_at` stays the wall time recorded.
* `alerts.as_of`, `drift_runs.as_of`: the data time the condition or comparison was about (`as_of`, or the
  end of a `window`, in the detail), else `created_at` / `started_at`, which stay the wall times recorded.
* `rollouts.recorded_at`: the wall time the rollout was stored (`started_at` is the data time the loop
  started it at); unknown for old rows.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_TS = sa.DateTime(timezone=True)


def _moment(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, str) and value:
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            return None
    else:
        return None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def judged_time(detail_json: str | None) -> datetime | None:
    """The data time a record's detail says it judged: `as_of`, else its window's `as_of` or `end`."""
    try:
        detail = json.loads(detail_json or "{}")
    except ValueError:
        return None
    if not isinstance(detail, dict):
        return None
    window = detail.get("window")
    window = window if isinstance(window, dict) else {}
    for value in (detail.get("as_of"), window.get("as_of"), window.get("end")):
        found = _moment(value)
        if found is not None:
            return found
    return None


def upgrade() -> None:
    with op.batch_alter_table("decisions") as batch:
        batch.add_column(sa.Column("as_of", _TS, nullable=True))
        batch.add_column(sa.Column("recorded_at", _TS, nullable=True))
    with op.batch_alter_table("model_alias_history") as batch:
        batch.add_column(sa.Column("as_of", _TS, nullable=True))
    with op.batch_alter_table("alerts") as batch:
        batch.add_column(sa.Column("as_of", _TS, nullable=True))
    with op.batch_alter_table("drift_runs") as batch:
        batch.add_column(sa.Column("as_of", _TS, nullable=True))
    with op.batch_alter_table("rollouts") as batch:
        batch.add_column(sa.Column("recorded_at", _TS, nullable=True))
    connection = op.get_bind()
    decisions = sa.table("decisions", sa.column("id", sa.Integer), sa.column("statistics_json", sa.Text),
                         sa.column("decided_at", _TS), sa.column("as_of", _TS), sa.column("recorded_at", _TS))
    as_of_by_decision: dict[int, datetime] = {}
    for row in connection.execute(sa.select(decisions.c.id, decisions.c.statistics_json, decisions.c.decided_at)):
        decided = _moment(row.decided_at)
        named = judged_time(row.statistics_json)
        # decided_at was the data time when the writer passed one (the canary judge: then it equals the
        # window's as_of); otherwise it was the wall clock, which is the moment recorded.
        recorded = None if named is not None and named == decided else decided
        judged = named or decided
        if judged is not None:
            as_of_by_decision[int(row.id)] = judged
        connection.execute(sa.update(decisions).where(decisions.c.id == row.id).values(
            as_of=judged, recorded_at=recorded))
    history = sa.table("model_alias_history", sa.column("id", sa.Integer), sa.column("decision_id", sa.Integer),
                       sa.column("moved_at", _TS), sa.column("as_of", _TS))
    for row in connection.execute(sa.select(history.c.id, history.c.decision_id, history.c.moved_at)):
        judged = as_of_by_decision.get(row.decision_id) if row.decision_id is not None else None
        connection.execute(sa.update(history).where(history.c.id == row.id).values(
            as_of=judged or _moment(row.moved_at)))
    for name, wall in (("alerts", "created_at"), ("drift_runs", "started_at")):
        records = sa.table(name, sa.column("id", sa.Integer), sa.column("detail_json", sa.Text),
                           sa.column(wall, _TS), sa.column("as_of", _TS))
        for row in connection.execute(sa.select(records.c.id, records.c.detail_json, records.c[wall])):
            connection.execute(sa.update(records).where(records.c.id == row.id).values(
                as_of=judged_time(row.detail_json) or _moment(row[2])))


def downgrade() -> None:
    with op.batch_alter_table("rollouts") as batch:
        batch.drop_column("recorded_at")
    for name in ("drift_runs", "alerts", "model_alias_history"):
        with op.batch_alter_table(name) as batch:
            batch.drop_column("as_of")
    with op.batch_alter_table("decisions") as batch:
        batch.drop_column("recorded_at")
        batch.drop_column("as_of")
