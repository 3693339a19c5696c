"""The repository stands on its own, and its setup says what it installs.

* No file cites design notes that live outside the repository (the project's own docs are in docs/).
* scripts/setup.sh chooses the torch build explicitly (CPU wheel for CPU machines where one can be had,
  else PyPI's build; CUDA build for GPU workers) and accepts Java 17 and newer; `setup.sh --plan` prints those choices without changing anything.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import re
import socket
import stat
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
OUTSIDE = re.compile(r"DESIGN\.md|STYLE\.md|work/shared")


def repository_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, text=True, check=True, timeout=60).stdout.split("\n")
    return [REPO / name for name in listed if name and (REPO / name).is_file()]


def test_no_file_cites_notes_outside_the_repository() -> None:
    here = Path(__file__).resolve()
    hits = []
    for path in repository_files():
        if path.resolve() == here or path.suffix in (".parquet", ".png", ".whl"):
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        hits += [f"{path.relative_to(REPO)}:{n}" for n, line in enumerate(text.splitlines(), 1) if OUTSIDE.search(line)]
    assert not hits, hits


@contextlib.contextmanager
def _index(tmp_path: Path) -> Iterator[str]:
    """A local HTTP folder with a `torch/` page, standing in for PyTorch's wheel index."""
    root = tmp_path / "index"
    (root / "whl" / "torch").mkdir(parents=True, exist_ok=True)
    (root / "whl" / "torch" / "index.html").write_text("<html></html>")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/whl"
    finally:
        server.shutdown()
        server.server_close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when the block ends: nothing listens there


def plan(tmp_path: Path, java_version: str | None, **env: str) -> str:
    """`setup.sh --plan` with a stand-in `java` printing `java_version` (None: no java on PATH)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    java = bin_dir / "java"
    java.unlink(missing_ok=True)
    if java_version is not None:
        java.write_text(f"#!/bin/sh\necho 'openjdk version \"{java_version}\" 2024-01-16' >&2\n")
        java.chmod(java.stat().st_mode | stat.S_IEXEC)
    keep = {k: v for k, v in os.environ.items() if k not in ("QUIVER_TORCH", "QUIVER_TORCH_INDEX")}
    path = f"{bin_dir}:{os.environ['PATH']}"
    result = subprocess.run(["bash", str(REPO / "scripts" / "setup.sh"), "--plan"], env={**keep, "PATH": path, **env},
                            capture_output=True, text=True, timeout=60)
    return result.stdout + result.stderr


@pytest.mark.parametrize(("version", "verdict"), [("17.0.15", "java: 17 ok"), ("21.0.2", "java: 21 ok"),
                                                  ("25", "java: 25 ok"), ("11.0.22", "java: 11 too old"),
                                                  ("1.8.0_392", "java: 1 too old")])
def test_java_17_and_newer_are_accepted(tmp_path: Path, version: str, verdict: str) -> None:
    assert verdict in plan(tmp_path, version)


def test_torch_build_is_chosen_explicitly(tmp_path: Path) -> None:
    no_local_wheels = {"PIP_FIND_LINKS": str(tmp_path / "no-wheels"), "PIP_FOR_CONFIG": "false",
                       "PIP_CONFIG_FILE": os.devnull}
    with _index(tmp_path) as index:  # a reachable CPU wheel index
        cpu = plan(tmp_path, "17.0.1", QUIVER_TORCH="cpu", QUIVER_TORCH_INDEX=index, **no_local_wheels)
    assert f"torch: cpu: pip install torch==2.13.0+cpu --extra-index-url {index}\n" in cpu
    # No local wheel and no index to reach (a closed network): PyPI's build, which runs on CPU too.
    closed = plan(tmp_path, "17.0.1", QUIVER_TORCH="cpu", QUIVER_TORCH_INDEX=f"http://127.0.0.1:{_closed_port()}/whl",
                  **no_local_wheels)
    assert "torch: cpu: pip install torch==2.13.0\n" in closed
    cuda = plan(tmp_path, "17.0.1", QUIVER_TORCH="cuda", **no_local_wheels)
    assert "torch: cuda: pip install torch==2.13.0\n" in cuda and "+cpu" not in cuda
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    local = plan(tmp_path, "17.0.1", QUIVER_TORCH="cpu", PIP_FIND_LINKS=str(wheels), PIP_FOR_CONFIG="false")
    assert "torch: cpu: pip install torch==2.13.0+cpu\n" in local  # a local CPU wheel needs no index
    assert "must be cpu or cuda" in plan(tmp_path, "17.0.1", QUIVER_TORCH="rocm")
