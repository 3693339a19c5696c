"""Run the installed `quiver` command in a project folder, as a user would (shared by CLI tests)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

QUIVER = Path(sys.executable).parent / "quiver"


def quiver(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`quiver *args` in `cwd`, without the caller's QUIVER_* settings, wide enough for whole tables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUIVER_")} | {"COLUMNS": "250"}
    return subprocess.run([str(QUIVER), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def done(result: subprocess.CompletedProcess[str], code: int = 0) -> str:
    """The output of a run that exited with `code` and no traceback."""
    assert result.returncode == code, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr
    return result.stdout
