"""Loop state: a rollout's fixed reference and post-promotion watch; when (and how) a decision was applied.

* `rollouts.reference_json`: what the judge compares against, fixed when the rollout starts (the champion's
  latency threshold and score reference), so no look re-estimates it from the data under test.
* `rollouts.watch_until`: a promoted rollout stays `watching` until then, comparing the new champion with
  `previous` on labels that arrive later.
* `decisions.applied_at` / `decisions.actions_json`: set in the transaction that carried the decision out, so
  a decision is applied at most once and a retry can tell.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("rollouts") as batch:
        batch.add_column(sa.Column("reference_json", sa.Text, nullable=False, server_default="{}"))
        batch.add_column(sa.Column("watch_until", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("decisions") as batch:
        batch.add_column(sa.Column("applied_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("actions_json", sa.Text, nullable=False, server_default="[]"))


def downgrade() -> None:
    with op.batch_alter_table("decisions") as batch:
        batch.drop_column("actions_json")
        batch.drop_column("applied_at")
    with op.batch_alter_table("rollouts") as batch:
        batch.drop_column("watch_until")
        batch.drop_column("reference_json")
