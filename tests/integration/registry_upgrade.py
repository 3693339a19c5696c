"""Bring a test registry to a given schema revision, as an older Quiver would have left it."""

from __future__ import annotations

from alembic import command
from alembic.config import Config as AlembicConfig

from quiver.registry.repository import _MIGRATIONS, make_engine


def upgrade_to(url: str, revision: str) -> None:
    """Run the registry's migrations on `url` up to `revision` (and no further)."""
    config = AlembicConfig()
    config.set_main_option("script_location", str(_MIGRATIONS))
    engine = make_engine(url)
    with engine.connect() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
        connection.commit()
    engine.dispose()
