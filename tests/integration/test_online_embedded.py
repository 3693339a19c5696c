"""The embedded Redis: a private (0700) directory, an unpredictable socket for long paths, and a server on
its socket trusted only when it is the one Quiver started."""

from __future__ import annotations

import hashlib
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import redis

from quiver.config import Config
from quiver.online.base import OnlineStoreError
from quiver.online.embedded import embedded_dir, ensure_redis, stop_embedded

pytestmark = pytest.mark.integration


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_embedded_directory_is_private(tmp_path):
    (tmp_path / ".quiver" / "redis").mkdir(parents=True, mode=0o755)  # left open by an older version
    config = Config(root=tmp_path, project="emb")
    url = ensure_redis(config)
    try:
        sock = Path(url.removeprefix("unix://"))
        assert sock.parent == embedded_dir(config)
        assert mode(embedded_dir(config)) == 0o700
    finally:
        assert stop_embedded(config)


def test_long_project_path_gets_an_unpredictable_private_socket(tmp_path):
    root = tmp_path / ("p" * 90)
    root.mkdir()
    config = Config(root=root, project="emb")
    url = ensure_redis(config)
    try:
        sock = Path(url.removeprefix("unix://"))
        digest = hashlib.sha1(str(embedded_dir(config).resolve()).encode()).hexdigest()[:12]
        assert sock != Path(tempfile.gettempdir()) / f"quiver-redis-{digest}.sock"  # the old, guessable name
        assert mode(sock.parent) == 0o700 and sock.parent.stat().st_uid == embedded_dir(config).stat().st_uid
        assert ensure_redis(config) == url  # the next process finds the same server through the record
    finally:
        assert stop_embedded(config)
        shutil.rmtree(Path(url.removeprefix("unix://")).parent, ignore_errors=True)


def test_a_foreign_server_on_the_socket_is_not_trusted(tmp_path):
    config = Config(root=tmp_path, project="emb")
    directory = embedded_dir(config)
    directory.mkdir(parents=True, mode=0o700)
    sock = directory / "redis.sock"
    binary = shutil.which("redis-server")
    assert binary, "redis-server not on PATH"
    foreign = subprocess.Popen([binary, "--port", "0", "--unixsocket", str(sock), "--save", "", "--appendonly", "no",
                                "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            try:
                if redis.Redis(unix_socket_path=str(sock)).ping():
                    break
            except redis.ConnectionError:
                time.sleep(0.05)
        with pytest.raises(OnlineStoreError, match="did not start"):
            ensure_redis(config)
    finally:
        foreign.terminate()
        foreign.wait(10)
