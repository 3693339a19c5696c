"""`quiver redis status|stop` on a real embedded redis-server, and `make reset` calling it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from quiver.config import load_config
from quiver.online.embedded import embedded_dir, ensure_redis
from tests.cli_runs import done
from tests.cli_runs import quiver as run_quiver

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def quiver(*args: str, cwd: Path) -> str:
    # In process: the server is another process either way; what is checked is what the commands say.
    return done(run_quiver(*args, cwd=cwd, timeout=120))


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
    assert "quiver.cli kafka stop" in dry.stdout  # the demo's embedded Kafka broker, too


def test_redis_stop_in_a_copied_project_leaves_the_originals_server_alone(tmp_path: Path) -> None:
    """A copy of a project carries `.quiver/redis/redis.pid` naming the original's server. Before, `quiver
    redis stop` in the copy stopped it (the pid was a redis-server); now only a server answering on the copy's
    own socket, from the copy's folder, is this project's."""
    import shutil

    import redis
    from typer.testing import CliRunner

    from quiver.cli import _register_optional_commands, app

    original, copy = tmp_path / "original", tmp_path / "copy"
    original.mkdir()
    (original / "quiver.yaml").write_text("project: fraud\n")
    config = load_config(original / "quiver.yaml")
    url = ensure_redis(config)
    pid = int((embedded_dir(config) / "redis.pid").read_text())
    try:
        shutil.copytree(original, copy, ignore=shutil.ignore_patterns("redis.sock"))  # a socket is not copied
        assert (copy / ".quiver" / "redis" / "redis.pid").read_text().strip() == str(pid)
        _register_optional_commands()
        runner = CliRunner()
        args = ["--config", str(copy / "quiver.yaml")]
        status = runner.invoke(app, ["redis", "status", *args])
        assert status.exit_code == 0 and "no embedded Redis running" in status.output, status.output
        stop = runner.invoke(app, ["redis", "stop", *args])
        assert stop.exit_code == 0 and "no embedded Redis was running" in stop.output, stop.output
        assert _alive(pid) and redis.Redis.from_url(url).ping()
        mine = runner.invoke(app, ["redis", "stop", "--config", str(original / "quiver.yaml")])
        assert "stopped the embedded Redis" in mine.output and not _alive(pid)
    finally:
        if _alive(pid):
            os.kill(pid, 15)
