"""A registry the CLI cannot write (read-only) is one clear red line and exit code 2, never a SQLAlchemy
traceback — on a real SQLite file opened read-only."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.integration.test_prediction_service import MODEL, Project, project, register

pytestmark = pytest.mark.integration
__all__ = ["project"]


def test_a_read_only_registry_is_a_clear_error(project: Project, tmp_path: Path) -> None:
    from quiver.cli import _register_optional_commands, app

    _register_optional_commands()
    v1 = register(project.models, project.root, seed=1)
    database = project.config.registry_url.removeprefix("sqlite:///")
    config = tmp_path / "readonly.yaml"
    # mode=ro: SQLite itself refuses every write (file permissions would not stop root, who runs CI here).
    config.write_text(f"project: p\nregistry_url: sqlite:///file:{database}?mode=ro&uri=true\n"
                      f"redis_url: {project.config.redis_url}\n")
    result = CliRunner().invoke(app, ["shadow", "start", MODEL, "--version", str(v1), "--config", str(config)])
    assert result.exit_code == 2, result.output
    assert "registry database is read-only" in result.output
    assert "Traceback" not in result.output and "sqlalchemy" not in result.output.lower()
    assert "shadow" not in project.models.aliases(MODEL)
