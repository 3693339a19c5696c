"""Fixtures shared by integration modules."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def operator_world(tmp_path_factory: pytest.TempPathFactory, redis_server: Any) -> Any:
    """The demo-like project the console and the operator CLI tests read (built once per session)."""
    from tests.integration.operator_world import build_world

    redis_server.start()
    return build_world(Path(tmp_path_factory.mktemp("operator")) / "project", redis_server.url)
