"""A Flink standalone session cluster from the distribution inside PyFlink's wheel (`pyflink/bin/…`).

`quiver stream --jobmanager HOST:PORT` (or `flink_jobmanager` in quiver.yaml) submits the compiled job to such
a cluster instead of the embedded mini-cluster. This module starts one on this machine — one JobManager and
N TaskManagers, each its own JVM in the foreground of a process we own, bound to 127.0.0.1 — for tests,
benchmarks and a single host; on several hosts, start `jobmanager.sh` / `taskmanager.sh` with the same
`config.yaml` (docs/streaming.md, "A session cluster"). Checkpoints go wherever the job says
(`--checkpoint-dir`): a path every TaskManager and the JobManager share.

    with SessionCluster(workdir, taskmanagers=2) as cluster:
        cluster.jobmanager          # "127.0.0.1:<rest port>", what --jobmanager takes
        cluster.taskmanager_ids()   # the TaskManagers registered with the JobManager
        cluster.kill_taskmanager(0) # SIGKILL, as a lost machine

Command line: ``python -m quiver.streaming.cluster start DIR [--taskmanagers N]`` (runs until Ctrl-C or
SIGTERM, then stops every JVM it started).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from quiver.catalog.errors import QuiverError

DEFAULT_SETTINGS: dict[str, str] = {
    # Small JVMs: a 2-core machine runs the JobManager, two TaskManagers and Redis side by side.
    "jobmanager.memory.process.size": "768m",
    "taskmanager.memory.process.size": "1024m",
    "taskmanager.numberOfTaskSlots": "2",
    # A lost TaskManager is noticed within seconds (its RPCs fail; the heartbeat times out at worst).
    "heartbeat.interval": "1000",
    "heartbeat.timeout": "8000",
    "heartbeat.rpc-failure-threshold": "2",
    # Spread a job's slots over the TaskManagers, so losing one costs a part and the rest can take over.
    "cluster.evenly-spread-out-slots": "true",
    "jobmanager.execution.failover-strategy": "region",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def flink_home(python: str | Path | None = None) -> Path:
    """The Flink distribution inside PyFlink's package, found with `python` (default: the streaming venv's)."""
    if python is None:
        python = _default_python()
    try:
        out = subprocess.run([str(python), "-c", "import os, pyflink; print(os.path.dirname(pyflink.__file__))"],
                             capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        raise QuiverError(f"cannot find PyFlink with {python}: {exc} (run `make setup`)") from None
    home = Path(out)
    if not (home / "bin" / "jobmanager.sh").exists():
        raise QuiverError(f"{home} has no bin/jobmanager.sh: not a PyFlink with its Flink distribution")
    return home


def _default_python() -> str:
    """This interpreter when it has PyFlink, else $QUIVER_STREAM_PYTHON, else the checkout's .venv-stream."""
    import importlib.util

    if importlib.util.find_spec("pyflink") is not None:
        return sys.executable
    explicit = os.environ.get("QUIVER_STREAM_PYTHON")
    if explicit:
        return explicit
    candidate = Path(__file__).resolve().parents[3] / ".venv-stream" / "bin" / "python"
    if candidate.exists():
        return str(candidate)
    raise QuiverError("no Python with PyFlink found: run `make setup` (builds .venv-stream) or set "
                      "QUIVER_STREAM_PYTHON")


class SessionCluster:
    """One JobManager and `taskmanagers` TaskManagers on 127.0.0.1 (see the module docstring)."""

    def __init__(self, workdir: str | Path, *, taskmanagers: int = 2, settings: Mapping[str, str] | None = None,
                 home: Path | None = None, rest_port: int | None = None, host: str = "127.0.0.1"):
        if taskmanagers < 1:
            raise QuiverError("a session cluster needs at least one TaskManager")
        self.workdir = Path(workdir).resolve()
        self.home = home or flink_home()
        self.host = host
        self.rest_port = rest_port or free_port()
        self.rpc_port = free_port()
        self.count = taskmanagers
        self.settings = {**DEFAULT_SETTINGS, **dict(settings or {})}
        self.conf_dir = self.workdir / "conf"
        self.log_dir = self.workdir / "log"
        self._jobmanager: subprocess.Popen[bytes] | None = None
        self._taskmanagers: list[subprocess.Popen[bytes] | None] = []

    @property
    def jobmanager(self) -> str:
        """host:port of the JobManager's REST endpoint (what `quiver stream --jobmanager` takes)."""
        return f"{self.host}:{self.rest_port}"

    @property
    def url(self) -> str:
        return f"http://{self.jobmanager}"

    def write_config(self) -> Path:
        """conf/config.yaml (+ the distribution's log4j files): flat keys, bound to `host` only."""
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for name in ("log4j.properties", "log4j-console.properties", "log4j-cli.properties"):
            shutil.copy(self.home / "conf" / name, self.conf_dir / name)
        values = {
            "jobmanager.rpc.address": self.host, "jobmanager.rpc.port": str(self.rpc_port),
            "jobmanager.bind-host": self.host, "taskmanager.bind-host": self.host, "taskmanager.host": self.host,
            "rest.address": self.host, "rest.bind-address": self.host, "rest.port": str(self.rest_port),
            "io.tmp.dirs": str(self.workdir / "tmp"), "parallelism.default": "1", **self.settings,
        }
        (self.workdir / "tmp").mkdir(exist_ok=True)
        # JSON strings are valid YAML scalars: no quoting rules to get wrong.
        text = "".join(f"{k}: {json.dumps(v)}\n" for k, v in values.items())
        (self.conf_dir / "config.yaml").write_text(text)
        return self.conf_dir / "config.yaml"

    def _env(self, name: str) -> dict[str, str]:
        return {**os.environ, "FLINK_CONF_DIR": str(self.conf_dir), "FLINK_LOG_DIR": str(self.log_dir),
                "FLINK_IDENT_STRING": name}

    def _start(self, script: str, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = open(self.log_dir / f"{name}.out", "ab")  # noqa: SIM115  (the child owns it)
        try:
            # Its own session: a Ctrl-C in the caller's terminal reaches us, and we stop the JVMs in order.
            return subprocess.Popen(["bash", str(self.home / "bin" / script), "start-foreground", *args],
                                    env=self._env(name), stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            log.close()

    def start(self, timeout_s: float = 180.0) -> SessionCluster:
        """Start the JobManager, then the TaskManagers; return once all are registered."""
        self.write_config()
        self._jobmanager = self._start("jobmanager.sh", "jobmanager")
        for index in range(self.count):
            self._taskmanagers.append(self.start_taskmanager(index))
        try:
            self.wait_for_taskmanagers(self.count, timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def start_taskmanager(self, index: int) -> subprocess.Popen[bytes]:
        """One more TaskManager JVM (its own resource id, temp folder and log)."""
        tmp = self.workdir / "tmp" / f"tm{index}"
        tmp.mkdir(parents=True, exist_ok=True)
        return self._start("taskmanager.sh", f"taskmanager-{index}", "-D", f"taskmanager.resource-id=tm{index}",
                           "-D", f"io.tmp.dirs={tmp}")

    def rest(self, path: str, method: str = "GET") -> Any:
        request = urllib.request.Request(f"{self.url}{path}", method=method)
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
        return json.loads(body) if body else None

    def taskmanager_ids(self) -> list[str]:
        """Resource ids of the TaskManagers the JobManager knows now."""
        try:
            return sorted(t["id"] for t in self.rest("/taskmanagers")["taskmanagers"])
        except (urllib.error.URLError, OSError, ValueError, KeyError):
            return []

    def add_taskmanager(self) -> int:
        """One more TaskManager (a replacement for a lost one), stopped with the rest; returns its index."""
        self._taskmanagers.append(self.start_taskmanager(len(self._taskmanagers)))
        return len(self._taskmanagers) - 1

    def wait_for_taskmanagers(self, count: int, timeout_s: float = 180.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._jobmanager is not None and self._jobmanager.poll() is not None:
                raise QuiverError(f"the Flink JobManager exited; see {self.log_dir}")
            if len(self.taskmanager_ids()) >= count:
                return
            time.sleep(0.5)
        raise QuiverError(f"{count} TaskManager(s) did not register within {timeout_s:.0f} s; see {self.log_dir}")

    def jobs(self) -> list[dict[str, Any]]:
        """[{"id", "status"}, …] of the cluster's jobs."""
        return list(self.rest("/jobs")["jobs"])

    def job(self, job_id: str) -> dict[str, Any]:
        return dict(self.rest(f"/jobs/{job_id}"))

    def job_taskmanagers(self, job_id: str) -> set[str]:
        """Resource ids of the TaskManagers running a part of the job now.

        Subtasks not yet deployed report the placeholder "(unassigned)"; only registered TaskManagers count.
        """
        used: set[str] = set()
        for vertex in self.job(job_id).get("vertices", []):
            detail = self.rest(f"/jobs/{job_id}/vertices/{vertex['id']}/taskmanagers")
            used.update(t.get("taskmanager-id", "") for t in detail.get("taskmanagers", []))
        return used & set(self.taskmanager_ids())

    def kill_taskmanager(self, index: int) -> int:
        """SIGKILL TaskManager `index` (its JVM and the shell that started it): a machine lost. Returns its pid."""
        process = self._taskmanagers[index]
        if process is None or process.poll() is not None:
            raise QuiverError(f"TaskManager {index} is not running")
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        self._taskmanagers[index] = None
        return process.pid

    def stop(self) -> None:
        """Stop every JVM this cluster started (TERM, then KILL after 15 s)."""
        processes = [p for p in [*self._taskmanagers, self._jobmanager] if p is not None and p.poll() is None]
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for process in processes:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self._taskmanagers, self._jobmanager = [], None

    def __enter__(self) -> SessionCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m quiver.streaming.cluster", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="start a session cluster and keep it running until Ctrl-C / SIGTERM")
    start.add_argument("workdir", type=Path)
    start.add_argument("--taskmanagers", type=int, default=2)
    start.add_argument("--rest-port", type=int, default=8081)
    start.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra Flink setting")
    args = parser.parse_args(argv)
    settings = dict(item.split("=", 1) for item in args.set)
    cluster = SessionCluster(args.workdir, taskmanagers=args.taskmanagers, rest_port=args.rest_port, settings=settings)
    stop = False

    def on_signal(signum: int, frame: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        cluster.start()
        print(f"Flink session cluster: --jobmanager {cluster.jobmanager} (web UI {cluster.url}); logs {cluster.log_dir}",
              flush=True)
        while not stop:
            time.sleep(0.5)
    except QuiverError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
