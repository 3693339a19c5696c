"""Alembic environment: runs on the connection Quiver hands in (no alembic.ini, no URL in files)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import text

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=None, render_as_batch=True)
with context.begin_transaction():
    if connection.dialect.name == "postgresql":
        # Serialize concurrent migrations across processes; released at commit.
        connection.execute(text("SELECT pg_advisory_xact_lock(7426183)"))
    context.run_migrations()
