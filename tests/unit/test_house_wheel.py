"""The built wheel installs one top-level package, `quiver`; the job and monitoring folders live inside it.

Generic names such as `pipelines` and `monitoring` would collide with other projects in site-packages, so
pyproject.toml maps the repository's top-level folders into the namespace (quiver.pipelines,
quiver.monitoring), and no code imports them by their bare names.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BARE = ("pipelines", "monitoring")


@pytest.mark.slow
def test_wheel_holds_only_the_quiver_package(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path), str(REPO)], check=True, capture_output=True, timeout=300)
    (wheel,) = tmp_path.glob("quiver-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith((".dist-info", ".data"))}
    assert top == {"quiver"}, top
    for module in ("quiver/pipelines/demo/run.py", "quiver/monitoring/drift.py", "quiver/models/train.py",
                   "quiver/ui/app.py", "quiver/registry/migrations/versions/0004_rollouts.py"):
        assert module in names, module


def _bare_imports(path: Path) -> list[str]:
    hits = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
            [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
        hits += [f"{path.relative_to(REPO)}:{node.lineno}: {n}" for n in names if n.split(".")[0] in BARE]
    return hits


def test_no_code_imports_the_folders_by_their_bare_names() -> None:
    folders = ["platform", "pipelines", "monitoring", "dags", "benchmarks", "tests"]
    files = [p for f in folders for p in (REPO / f).rglob("*.py") if "__pycache__" not in p.parts]
    hits = [hit for path in files for hit in _bare_imports(path)]
    assert not hits, hits
