"""An embedded Kafka broker for the demo and laptops: one per project, shared by its processes, like the
embedded Redis (`quiver.online.embedded`).

`ensure_broker(config)` returns the bootstrap (`127.0.0.1:<port>`) of the project's broker, started if
needed, or None when none can be had: the broker jars are not built, Java is missing, or the broker would
not start. The reason is logged (`start_broker` raises it instead), and the caller streams from files. The
broker is a `KafkaBroker` (single-node KRaft, loopback only, no authentication) over
`<project>/.quiver/kafka/` (made 0700): its config, data, log, pidfile, and `ports.json` with its two ports,
which a later start takes again while they are free. It is started detached (its launcher exits at once and
init adopts it), so it outlives the command that started it. A broker found there is used only when it is
ours: the pidfile's process belongs to this user and runs this folder's config, so a copied project never
takes the original's broker for its own. `stop_embedded_broker(config)` stops it (`quiver kafka stop`,
`make reset`, the demo's fresh start); its topics stay on disk for the next start.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from quiver.catalog.errors import QuiverError
from quiver.config import Config
from quiver.jars import KAFKA_BROKER, has_bundle, jars_dir
from quiver.streaming.kafka_broker import BrokerError, KafkaBroker, free_port, log_tail

log = logging.getLogger("quiver.kafka.embedded")
PARTITIONS = 4  # topics created without a partition count get this many


def broker_dir(config: Config) -> Path:
    return Path(config.root) / ".quiver" / "kafka"


def ensure_broker(config: Config, timeout_s: float = 120.0) -> str | None:
    """The bootstrap of the project's broker (started unless ours already answers), or None, with the
    reason logged, when it cannot be had."""
    try:
        return start_broker(config, timeout_s)
    except QuiverError as exc:  # a BrokerError, or the jars vanishing between the check and the start
        log.warning("no embedded Kafka broker: %s", exc)
        return None


def start_broker(config: Config, timeout_s: float = 120.0) -> str:
    """Like `ensure_broker`, but a BrokerError says why there is no broker."""
    missing = _missing()
    if missing:
        raise BrokerError(missing)
    directory = _private_dir(broker_dir(config))
    import fcntl

    with open(directory / "start.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two commands starting at once must not start two brokers
        found = _running(directory)
        if found is not None:
            pid, port, controller_port = found
            broker = KafkaBroker(directory, port, controller_port, PARTITIONS)
            _wait_answering(broker, pid, timeout_s)
            return broker.bootstrap
        port, controller_port = _ports(directory)
        broker = KafkaBroker(directory, port, controller_port, PARTITIONS)
        try:
            pid = _spawn(broker.command(), broker.log_file)
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            raise BrokerError(f"starting the broker in {directory} failed: {exc}") from exc
        (directory / "broker.pid").write_text(str(pid))
        (directory / "ports.json").write_text(json.dumps({"port": port, "controller_port": controller_port}))
        _wait_answering(broker, pid, timeout_s)
        log.info("embedded Kafka broker %s started (pid %d, data in %s)", broker.bootstrap, pid, directory)
        return broker.bootstrap


def running_broker(config: Config) -> tuple[int, str] | None:
    """(process id, bootstrap) of this project's broker when ours runs, else None (it may still be starting)."""
    found = _running(broker_dir(config))
    return None if found is None else (found[0], f"127.0.0.1:{found[1]}")


def stop_embedded_broker(config: Config, timeout_s: float = 60.0) -> bool:
    """Stop the project's broker (SIGTERM: a clean shutdown, then SIGKILL after `timeout_s`). True when one
    of ours was running; a process that is not ours is never signalled."""
    found = _running(broker_dir(config))
    if found is None:
        return False
    pid = found[0]
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while _alive(pid):
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
        time.sleep(0.1)
    return True


def _missing() -> str | None:
    """What this machine lacks to run the broker, or None."""
    if shutil.which("java") is None:
        return "Java is not on PATH (apt-get install openjdk-17-jre-headless)"
    if not has_bundle(KAFKA_BROKER):
        return f"the broker jars are not built ({jars_dir() / KAFKA_BROKER}): run `make setup`"
    try:
        import confluent_kafka  # noqa: F401  (the topic and offset helpers)
    except ImportError:
        return "confluent-kafka is not installed (it is in requirements; run `make setup`)"
    return None


def _private_dir(directory: Path) -> Path:
    """`directory`, created if needed, owned by this user and closed to everyone else (0700)."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = directory.stat()
    if info.st_uid != os.getuid():
        raise BrokerError(f"{directory} belongs to another user (uid {info.st_uid}): refusing to run a broker there")
    if info.st_mode & 0o077:
        directory.chmod(0o700)
    return directory


def _running(directory: Path) -> tuple[int, int, int] | None:
    """(pid, port, controller port) when the pidfile's process is ours: alive, this user's, and running this
    folder's config (a pidfile copied with a project, or a reused pid, names some other process)."""
    try:
        pid = int((directory / "broker.pid").read_text().strip())
        ports = json.loads((directory / "ports.json").read_text())
        proc = Path(f"/proc/{pid}")
        if proc.stat().st_uid != os.getuid() or not _alive(pid):
            return None
        args = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        if str((directory / "server.properties").resolve()) not in args:
            return None
        return pid, int(ports["port"]), int(ports["controller_port"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (a broker this process started and that died is one)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _ports(directory: Path) -> tuple[int, int]:
    """The ports of the last start while both are free (the same address as before), else two new ones."""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        ports = json.loads((directory / "ports.json").read_text())
        port, controller_port = int(ports["port"]), int(ports["controller_port"])
        if _free(port) and _free(controller_port):
            return port, controller_port
    port = free_port()
    controller_port = free_port()
    while controller_port == port:
        controller_port = free_port()
    return port, controller_port


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _spawn(command: list[str], log_file: Path) -> int:
    """Run `command` detached; its pid. A shell in a session of its own starts it in the background and exits,
    so init adopts it: no tie to this process (never a zombie of ours), no terminal's signals."""
    with log_file.open("ab") as out:
        launcher = subprocess.run(["/bin/sh", "-c", '"$@" </dev/null 2>&1 & echo $! >&2', "sh", *command],
                                  stdout=out, stderr=subprocess.PIPE, start_new_session=True, timeout=30,
                                  text=True, check=True)
    return int(launcher.stderr.strip())


def _wait_answering(broker: KafkaBroker, pid: int, timeout_s: float) -> None:
    """Until the broker answers metadata requests; a BrokerError (the broker stopped) when it exits or
    does not answer in time."""
    deadline = time.monotonic() + timeout_s
    while not broker.answers():
        if not _alive(pid):
            raise BrokerError(f"the embedded Kafka broker exited:\n{log_tail(broker.log_file)}")
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            raise BrokerError(f"the embedded Kafka broker did not answer within {timeout_s:.0f}s:\n"
                              f"{log_tail(broker.log_file)}")
        time.sleep(0.3)
