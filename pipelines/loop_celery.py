"""The loop's DAGs on Airflow's CeleryExecutor: one metadata DB (PostgreSQL), Redis as the broker, and
workers that are separate processes — each in its own working directory, with its own copy of the project
settings — one on the default queue and one on the `gpu` queue (concurrency 1), where `train` runs.

    with CeleryDeployment(home, metadata_url=pg, broker_url=redis, config_path=…) as airflow:
        airflow.start_worker("default", queues=["default"], concurrency=2, workdir=…, config_path=…)
        airflow.start_worker("gpu", queues=["gpu"], concurrency=1, workdir=…, config_path=…)
        airflow.trigger("quiver_drift", logical_date=…)
        airflow.task_instances("quiver_retrain")   # queue, hostname (the worker's name), state, … from Airflow's DB

Components: the API server (UI, REST and the Execution API the workers report to), the scheduler, the DAG
processor, and the workers (`airflow celery worker`). Every process binds 127.0.0.1, shares one JWT secret,
and each worker names itself: task instances record it as their `hostname` (`worker_hostname`), so which
worker ran what is read from Airflow's own records. Sizing for a 2-core machine: executor parallelism 4, the
API server with one worker process, worker concurrency as given. The metadata URL is a SQLAlchemy URL
(`postgresql+psycopg://…`); the same database, prefixed `db+`, is Celery's result backend.

For Kubernetes (KubernetesExecutor and a pod template requesting `nvidia.com/gpu`), see infra/README.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from quiver.pipelines.loop_airflow import DAGS_FOLDER

AIRFLOW = Path(sys.executable).with_name("airflow")


def worker_hostname() -> str:
    """Airflow's `hostname_callable` for our workers: the name the worker was started with, else the FQDN."""
    return os.environ.get("QUIVER_WORKER_NAME") or socket.getfqdn()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class CeleryDeployment:
    """Airflow on CeleryExecutor on this machine (see the module docstring). Use as a context manager."""

    def __init__(self, home: str | Path, *, metadata_url: str, broker_url: str, config_path: str | Path,
                 dags_folder: str | Path = DAGS_FOLDER, api_port: int | None = None, parallelism: int = 4,
                 gpu_pool: str = "gpu", extra_env: dict[str, str] | None = None):
        self.home = Path(home).resolve()
        self.home.mkdir(parents=True, exist_ok=True)
        self.api_port = api_port or free_port()
        self.gpu_pool = gpu_pool
        self.config_path = Path(config_path)
        self._processes: dict[str, subprocess.Popen[bytes]] = {}
        self.env = {
            **os.environ, **(extra_env or {}),
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",  # unpause() what should run
            "AIRFLOW__CORE__PARALLELISM": str(parallelism),
            "AIRFLOW__CORE__HOSTNAME_CALLABLE": "quiver.pipelines.loop_celery.worker_hostname",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{self.api_port}/execution/",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": metadata_url,
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": metadata_url,  # psycopg 3 speaks asyncio too
            "AIRFLOW__CELERY__BROKER_URL": broker_url,
            "AIRFLOW__CELERY__RESULT_BACKEND": f"db+{metadata_url}",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.api_port),
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{self.api_port}",
            # Every component signs or checks the Execution API's task tokens: one secret for all.
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "30",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": os.environ.get("AIRFLOW__LOGGING__LOGGING_LEVEL", "INFO"),
            "QUIVER_CONFIG": str(self.config_path),
            "PATH": os.pathsep.join([str(AIRFLOW.parent), os.environ.get("PATH", "")]),
        }

    # ----- processes -----

    def _airflow(self, *args: str, timeout: float = 300, env: dict[str, str] | None = None) -> str:
        done = subprocess.run([str(AIRFLOW), *args], env=env or self.env, capture_output=True, text=True,
                              timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"airflow {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        return done.stdout

    def _spawn(self, name: str, args: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen[bytes]:
        log = open(self.home / f"{name}.log", "ab")  # noqa: SIM115  (the child owns it)
        try:
            process = subprocess.Popen([str(AIRFLOW), *args], env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                                       stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            log.close()
        self._processes[name] = process
        return process

    def start(self, timeout_s: float = 240) -> CeleryDeployment:
        """Migrate the metadata DB, create the GPU pool, start the API server, scheduler and DAG processor."""
        self._airflow("db", "migrate", timeout=600)
        self._airflow("pools", "set", self.gpu_pool, "1", "GPU training slots (quiver_retrain)")
        self._spawn("api-server", ["api-server"], self.env, self.home)
        self._spawn("scheduler", ["scheduler"], self.env, self.home)
        self._spawn("dag-processor", ["dag-processor"], self.env, self.home)
        self.wait_for(lambda: self._healthy("metadatabase", "scheduler", "dag_processor"), timeout_s,
                      "the API server, scheduler and DAG processor to report healthy")
        return self

    def start_worker(self, name: str, *, queues: list[str], concurrency: int, workdir: str | Path,
                     config_path: str | Path) -> subprocess.Popen[bytes]:
        """`airflow celery worker` in `workdir`, serving `queues`, with its own project settings file."""
        folder = Path(workdir).resolve()
        folder.mkdir(parents=True, exist_ok=True)
        env = {**self.env, "QUIVER_WORKER_NAME": name, "QUIVER_CONFIG": str(Path(config_path).resolve()),
               "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port())}  # one log server per worker
        return self._spawn(f"worker-{name}", ["celery", "worker", "--queues", ",".join(queues), "--concurrency",
                                              str(concurrency), "--celery-hostname", f"{name}@%h",
                                              "--without-mingle", "--without-gossip"], env, folder)

    def stop(self) -> None:
        """SIGTERM every process group started here, SIGKILL what is left after 30 s."""
        for process in self._processes.values():
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        for process in self._processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # children the component left behind go too
            process.wait()
        self._processes.clear()

    def __enter__(self) -> CeleryDeployment:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_tail(self, name: str, lines: int = 40) -> str:
        try:
            return "\n".join((self.home / f"{name}.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # ----- the REST API -----

    def api(self, path: str, method: str = "GET", body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"http://127.0.0.1:{self.api_port}/api/v2{path}", data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            raw = response.read()
        return json.loads(raw) if raw else None

    def _healthy(self, *components: str) -> bool:
        for name, process in self._processes.items():
            if process.poll() is not None:
                raise RuntimeError(f"Airflow {name} exited ({process.returncode}):\n{self.log_tail(name)}")
        try:
            health = self.api("/monitor/health")
        except (urllib.error.URLError, OSError, ValueError):
            return False
        return all(health.get(c, {}).get("status") == "healthy" for c in components)

    def wait_for(self, predicate: Any, timeout_s: float, what: str) -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(1.0)
        raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")

    def dags(self) -> set[str]:
        try:
            return {d["dag_id"] for d in self.api("/dags?limit=100")["dags"]}
        except (urllib.error.URLError, OSError, ValueError, KeyError):
            return set()

    def unpause(self, dag_id: str) -> None:
        self.api(f"/dags/{dag_id}", "PATCH", {"is_paused": False})

    def trigger(self, dag_id: str, logical_date: str | None = None, conf: dict[str, Any] | None = None) -> str:
        """Start a DAG run by hand (as the UI's trigger button does); returns its run id."""
        run = self.api(f"/dags/{dag_id}/dagRuns", "POST", {"logical_date": logical_date, "conf": conf or {}})
        return str(run["dag_run_id"])

    def dag_runs(self, dag_id: str) -> list[dict[str, Any]]:
        return list(self.api(f"/dags/{dag_id}/dagRuns?order_by=start_date&limit=100")["dag_runs"])

    def task_instances(self, dag_id: str, run_id: str) -> dict[str, dict[str, Any]]:
        """task id → Airflow's record of it: state, queue, pool, hostname (the worker), try number, …"""
        found = self.api(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]
        return {t["task_id"]: t for t in found}

    def xcom(self, dag_id: str, run_id: str, task_id: str) -> Any:
        entry = self.api(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/return_value"
                         f"?deserialize=true")
        return entry.get("value")
