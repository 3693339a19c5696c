"""`quiver redis status|stop` on a real embedded redis-server, and `make reset` calling it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from quiver.config import load_config
from quiver.online.embedded import embedded_dir, ensure_redis

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def quiver(*args: str, cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUIVER_")}
    result = subprocess.run([sys.executable, "-m", "quiver.cli", *args], cwd=cwd, env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return b"redis-server" in Path(f"/proc/{pid}/cmdline").read_bytes()


def test_redis_stop_stops_the_embedded_server(tmp_path: Path) -> None:
    import redis

    (tmp_path / "quiver.yaml").write_text("project: stopper\n")
    config = load_config(tmp_path / "quiver.yaml")
    url = ensure_redis(config)
    assert redis.Redis.from_url(url).ping()
    pid = int((embedded_dir(config) / "redis.pid").read_text())
    try:
        assert f"embedded Redis running (pid {pid})" in quiver("redis", "status", cwd=tmp_path)
        assert "stopped the embedded Redis" in quiver("redis", "stop", cwd=tmp_path)
        assert not _alive(pid)
        assert "no embedded Redis running" in quiver("redis", "status", cwd=tmp_path)
        assert "no embedded Redis was running" in quiver("redis", "stop", cwd=tmp_path)
    finally:
        if _alive(pid):
            os.kill(pid, 15)


def test_make_reset_stops_redis_and_removes_the_project_state() -> None:
    makefile = (REPO / "Makefile").read_text()
    reset = makefile[makefile.index("\nreset:"):]
    assert "redis stop" in reset and "rm -rf .quiver" in reset
    dry = subprocess.run(["make", "-n", "reset"], cwd=REPO, capture_output=True, text=True, timeout=60, check=True)
    assert "quiver.cli redis stop" in dry.stdout and "rm -rf .quiver" in dry.stdout and "rm -rf data" in dry.stdout
