"""Alembic environment: runs on the connection Quiver hands in (no alembic.ini, no URL in files)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import text

connection = context.config.attributes["connection"]
# transactional_ddl: SQLite runs DDL in transactions too, and alembic otherwise commits after every migration
# (its SQLite default), so two processes opening a new registry could both read "no version" and then run
# the same migration twice. As one transaction, begun with BEGIN IMMEDIATE (repository.make_engine), the
# version read and every step happen under the write lock.
context.configure(connection=connection, target_metadata=None, render_as_batch=True, transactional_ddl=True)
with context.begin_transaction():
    if connection.dialect.name == "postgresql":
        # Serialize concurrent migrations across processes; released at commit.
        connection.execute(text("SELECT pg_advisory_xact_lock(7426183)"))
    context.run_migrations()
