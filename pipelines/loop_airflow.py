"""Run the loop's DAGs through Airflow itself — `dag.test()` against a local metadata DB — from a program.

`make demo` and the integration tests drive the loop day by day, like a scheduler would, but every task runs
inside Airflow (its task runner, XComs, Asset events, sensors in reschedule mode). Airflow reads its settings
once per process, so the runs happen in a worker process with its own AIRFLOW_HOME:

    with AirflowWorker(home, config_path) as airflow:
        run = airflow.run("quiver_drift", logical_date=datetime(2026, 11, 12, tzinfo=UTC))
        run["state"], run["tasks"], run["results"]          # "success", {task: state}, {task: return value}
        airflow.asset_events("quiver://drift/fraud_model")  # [{"extra": …, "source_dag_id": …}, …]
        airflow.queued_dags("quiver://drift/fraud_model")   # DAGs the scheduler would now start
        airflow.run_triggered("quiver_retrain")             # the run the scheduler starts from those events

The worker speaks JSON lines on stdin/stdout (`python -m quiver.pipelines.loop_airflow serve`); Airflow's own log
goes to `<home>/worker.log`. A logical date at midnight gives daily DAGs the data interval of the day before.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parents[1]
log = logging.getLogger("quiver.loop_airflow")
DAGS_FOLDER = REPO / "dags"


def airflow_env(home: str | Path, config_path: str | Path, dags_folder: str | Path = DAGS_FOLDER) -> dict[str, str]:
    """Environment for an Airflow process of this project: its own home (SQLite metadata DB) and DAG folder."""
    return {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        # Unpaused, so an Asset event queues the DAGs scheduled on it (as the scheduler would see them).
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": os.environ.get("AIRFLOW__LOGGING__LOGGING_LEVEL", "WARNING"),
        "QUIVER_CONFIG": str(config_path),
    }


class _InProcess:
    """The worker side: Airflow imported in this process, DB migrated, DAGs parsed once."""

    def __init__(self) -> None:
        from airflow.dag_processing.dagbag import DagBag
        from airflow.utils import db

        db.upgradedb()  # `airflow db migrate`; a no-op when the DB is current
        self.bag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
        if self.bag.import_errors:
            raise RuntimeError(f"DAG import errors: {self.bag.import_errors}")

    def run(self, dag_id: str, logical_date: str | None, conf: dict[str, Any] | None) -> dict[str, Any]:
        dag = self.bag.dags[dag_id]
        started = time.perf_counter()
        when = datetime.fromisoformat(logical_date) if logical_date else datetime.now(UTC)
        return self._report(dag_id, dag.test(logical_date=when, run_conf=conf or None), started)

    def run_triggered(self, dag_id: str) -> dict[str, Any]:
        """Start `dag_id` from its queued Asset events exactly as the scheduler does (its own
        `_create_dag_runs_asset_triggered`: an asset-triggered run consuming the events, queue entries
        deleted), then run its tasks in this process the way `dag.test()` does. Tasks see the events in
        `triggering_asset_events`."""
        from airflow.jobs.job import Job
        from airflow.jobs.scheduler_job_runner import SchedulerJobRunner
        from airflow.models.dag import DagModel
        from airflow.models.dagrun import DagRun
        from airflow.settings import Session
        from airflow.utils.state import DagRunState
        from airflow.utils.types import DagRunType
        from sqlalchemy import select

        started = time.perf_counter()
        session = Session()
        scheduler = SchedulerJobRunner(job=Job(), executors=[])
        before = set(session.scalars(select(DagRun.run_id).where(DagRun.dag_id == dag_id)))
        scheduler._create_dag_runs_asset_triggered(dag_models=[session.get(DagModel, dag_id)], session=session)
        session.commit()
        created = [r for r in session.scalars(select(DagRun).where(
            DagRun.dag_id == dag_id, DagRun.run_type == DagRunType.ASSET_TRIGGERED)) if r.run_id not in before]
        if not created:
            raise RuntimeError(f"no Asset events queued for {dag_id}: the scheduler would start nothing")
        dag_run = created[0]
        dag_run.state = DagRunState.RUNNING
        session.commit()
        dag_run.dag = scheduler._get_current_dag(dag_id=dag_id, session=session)  # what the scheduler sets
        self._run_tasks(dag_id, dag_run, session)
        return self._report(dag_id, dag_run, started)

    def _run_tasks(self, dag_id: str, dag_run: Any, session: Any) -> None:
        """`dag.test()`'s loop: schedule what is ready, run it in this process, until the run ends."""
        from airflow.sdk.definitions.dag import _run_task
        from airflow.utils.state import DagRunState, TaskInstanceState

        dag = self.bag.dags[dag_id]
        while dag_run.state == DagRunState.RUNNING:
            session.expire_all()
            ready, _ = dag_run.update_state(session=session)
            for ti in ready:
                if ti.state != TaskInstanceState.UP_FOR_RESCHEDULE:
                    ti.try_number += 1
                ti.state = TaskInstanceState.SCHEDULED
            session.commit()
            scheduled = [ti for ti in dag_run.get_task_instances(session=session)
                         if ti.state == TaskInstanceState.SCHEDULED]
            if not scheduled and dag_run.state == DagRunState.RUNNING:
                time.sleep(0.5)  # a sensor rescheduled itself: wait for its next poke
            for ti in scheduled:
                try:
                    _run_task(ti=ti, task=dag.task_dict[ti.task_id], run_triggerer=True)
                except Exception:  # recorded as the task's state; the run goes on as the scheduler's would
                    log.exception("task %s failed", ti.task_id)

    def _report(self, dag_id: str, dag_run: Any, started: float) -> dict[str, Any]:
        from airflow.models.xcom import XComModel
        from airflow.settings import Session

        session = Session()
        tis = {ti.task_id: ti for ti in dag_run.get_task_instances(session=session)}
        results: dict[str, Any] = {}
        query = XComModel.get_many(run_id=dag_run.run_id, dag_ids=dag_id, key="return_value")
        for row in session.scalars(query):
            results[row.task_id] = XComModel.deserialize_value(row)
        interval = [dag_run.data_interval_start, dag_run.data_interval_end]
        return {"dag_id": dag_id, "run_id": dag_run.run_id, "run_type": str(dag_run.run_type),
                "state": str(dag_run.state), "tasks": {t: str(ti.state) for t, ti in sorted(tis.items())},
                "tries": {t: ti.try_number for t, ti in sorted(tis.items())}, "results": results,
                "data_interval": [d.isoformat() if d else None for d in interval],
                "seconds": round(time.perf_counter() - started, 2)}

    def asset_events(self, uri: str) -> list[dict[str, Any]]:
        from airflow.models.asset import AssetEvent, AssetModel
        from airflow.settings import Session
        from sqlalchemy import select

        session = Session()
        query = (select(AssetEvent).join(AssetModel, AssetModel.id == AssetEvent.asset_id)
                 .where(AssetModel.uri == uri).order_by(AssetEvent.id))
        return [{"id": e.id, "extra": e.extra, "source_dag_id": e.source_dag_id, "source_run_id": e.source_run_id,
                 "source_task_id": e.source_task_id, "timestamp": e.timestamp.isoformat()}
                for e in session.scalars(query)]

    def queued_dags(self, uri: str) -> list[str]:
        from airflow.models.asset import AssetDagRunQueue, AssetModel
        from airflow.settings import Session
        from sqlalchemy import select

        session = Session()
        query = (select(AssetDagRunQueue.target_dag_id).join(AssetModel, AssetModel.id == AssetDagRunQueue.asset_id)
                 .where(AssetModel.uri == uri))
        return sorted(set(session.scalars(query)))

    def dequeue(self, uri: str, dag_id: str) -> int:
        """Drop the queue entry a scheduler would consume when it starts `dag_id` for `uri`'s events."""
        from airflow.models.asset import AssetDagRunQueue, AssetModel
        from airflow.settings import Session
        from sqlalchemy import delete, select

        session = Session()
        asset_ids = select(AssetModel.id).where(AssetModel.uri == uri).scalar_subquery()
        result = session.execute(delete(AssetDagRunQueue).where(
            AssetDagRunQueue.asset_id.in_(asset_ids), AssetDagRunQueue.target_dag_id == dag_id))
        session.commit()
        return int(getattr(result, "rowcount", 0) or 0)


def _exit_with_parent(parent: int) -> None:
    # Airflow installs its own SIGTERM handling; a worker whose caller died must not outlive it.
    import threading

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="quiver-worker-parent", daemon=True).start()


def serve(reply_to: IO[str]) -> None:
    """The worker loop: one JSON request per stdin line, one JSON reply per line on `reply_to`."""
    _exit_with_parent(os.getppid())
    runner = _InProcess()
    reply_to.write(json.dumps({"ready": True, "dags": sorted(runner.bag.dags)}) + "\n")
    reply_to.flush()
    for line in sys.stdin:
        request = json.loads(line)
        try:
            op = request.pop("op")
            reply = {"ok": True, "value": getattr(runner, op)(**request)}
        except Exception as exc:  # the caller decides; the worker keeps serving
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        reply_to.write(json.dumps(reply, default=str) + "\n")
        reply_to.flush()


class AirflowWorker:
    """A worker process running DAGs with `dag.test()` (see the module docstring). Use as a context manager."""

    def __init__(self, home: str | Path, config_path: str | Path, *, dags_folder: str | Path = DAGS_FOLDER,
                 timeout_s: float = 600.0):
        self.home, self.timeout_s = Path(home), timeout_s
        self.home.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **airflow_env(self.home, config_path, dags_folder)}
        self._log = (self.home / "worker.log").open("a")
        self._process = subprocess.Popen([sys.executable, "-m", "quiver.pipelines.loop_airflow", "serve"], cwd=REPO,
                                         env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self._log, text=True, bufsize=1)
        hello = self._read()
        self.dags: list[str] = list(hello.get("dags", []))

    def _read(self) -> dict[str, Any]:
        assert self._process.stdout is not None
        line = self._process.stdout.readline()
        if not line:
            raise RuntimeError(f"Airflow worker exited ({self._process.poll()}); see {self.home / 'worker.log'}")
        return dict(json.loads(line))

    def _call(self, op: str, **kwargs: Any) -> Any:
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps({"op": op, **kwargs}, default=str) + "\n")
        self._process.stdin.flush()
        reply = self._read()
        if not reply["ok"]:
            raise RuntimeError(f"Airflow worker: {op} failed: {reply['error']}")
        return reply["value"]

    def run(self, dag_id: str, logical_date: datetime | None = None,
            conf: dict[str, Any] | None = None) -> dict[str, Any]:
        """Run one DAG run to completion; its state, task states, task results (XComs) and data interval."""
        result: dict[str, Any] = self._call("run", dag_id=dag_id,
                                            logical_date=logical_date.isoformat() if logical_date else None,
                                            conf=conf)
        return result

    def run_triggered(self, dag_id: str) -> dict[str, Any]:
        """Start `dag_id` from its queued Asset events as the scheduler does, and run it to completion."""
        result: dict[str, Any] = self._call("run_triggered", dag_id=dag_id)
        return result

    def asset_events(self, uri: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = self._call("asset_events", uri=uri)
        return events

    def queued_dags(self, uri: str) -> list[str]:
        queued: list[str] = self._call("queued_dags", uri=uri)
        return queued

    def dequeue(self, uri: str, dag_id: str) -> int:
        return int(self._call("dequeue", uri=uri, dag_id=dag_id))

    def close(self) -> None:
        if self._process.poll() is None:
            assert self._process.stdin is not None
            self._process.stdin.close()
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._log.close()

    def __enter__(self) -> AirflowWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


AIRFLOW_HOME_DIR = ".quiver/airflow"  # one metadata DB per project: `make demo` writes it, `make airflow` shows it
LOOP_DAGS = ("quiver_materialize", "quiver_drift", "quiver_retrain", "quiver_shadow_eval", "quiver_canary")


def airflow_home(project: str | Path) -> Path:
    return Path(project).resolve() / AIRFLOW_HOME_DIR


def standalone_env(project: str | Path, port: int, host: str = "127.0.0.1") -> dict[str, str]:
    """Environment of `airflow standalone` for a project: the project's metadata DB, sized for 2 cores,
    bound to `host` (loopback by default), no login (local use)."""
    root = Path(project).resolve()
    url = f"http://{'localhost' if host in ('127.0.0.1', 'localhost') else host}:{port}"
    return {**os.environ, **airflow_env(airflow_home(root), root / "quiver.yaml"),
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO", "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            # LocalExecutor starts `parallelism` worker processes up front (32 by default): two fit 2 cores.
            "AIRFLOW__CORE__PARALLELISM": os.environ.get("AIRFLOW__CORE__PARALLELISM", "2"),
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",  # you unpause what you want scheduled
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True", "AIRFLOW__API__HOST": host,
            "AIRFLOW__API__PORT": str(port), "AIRFLOW__API__BASE_URL": url,
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
            # standalone starts its components as `airflow …` from PATH: this venv's.
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}


def pid_file(project: str | Path) -> Path:
    return airflow_home(project) / "standalone.pid"


def standalone(project: str | Path = ".", port: int = 8080, host: str = "127.0.0.1") -> int:
    """`make airflow`: migrate the DB, create the GPU pool the retrain DAG uses, pause the loop's DAGs (a run of
    `make demo` left them unpaused for its own runs), then run Airflow standalone (scheduler, DAG processor,
    triggerer, API server + UI on `host:port`) with this project's DAGs until Ctrl-C, SIGTERM or
    `make airflow-stop` — which stop every process it started (they share one process group)."""
    import signal

    from quiver.config import load_config

    env = standalone_env(project, port, host)
    airflow = str(Path(sys.executable).with_name("airflow"))
    config = load_config(Path(project) / "quiver.yaml" if (Path(project) / "quiver.yaml").exists() else None)
    subprocess.run([airflow, "db", "migrate"], env=env, check=True, stdout=subprocess.DEVNULL)
    subprocess.run([airflow, "pools", "set", config.gpu_pool, "1", "GPU training slots (quiver_retrain)"],
                   env=env, check=True, stdout=subprocess.DEVNULL)
    for dag_id in LOOP_DAGS:  # absent until first parsed: then nothing to pause
        subprocess.run([airflow, "dags", "pause", dag_id], env=env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    print(f"Airflow UI: http://{host}:{port} (no login: local use only; the demo's DAG runs are in it); home "
          f"{env['AIRFLOW_HOME']}; stop with Ctrl-C or `make airflow-stop`", flush=True)
    process = subprocess.Popen([airflow, "standalone"], env=env, start_new_session=True)
    pid_file(project).write_text(str(process.pid))

    def on_signal(signum: int, frame: Any) -> None:
        stop_group(process.pid)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        return process.wait()
    finally:
        stop_group(process.pid)
        pid_file(project).unlink(missing_ok=True)


def stop_group(pgid: int, grace_s: float = 30.0) -> bool:
    """SIGTERM the process group `pgid`, SIGKILL it after `grace_s`; True when something was running."""
    import signal

    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    return True


def stop_standalone(project: str | Path = ".") -> bool:
    """`make airflow-stop`: stop the standalone Airflow of `project` and every process it started."""
    try:
        pgid = int(pid_file(project).read_text().strip())
    except (OSError, ValueError):
        return False
    stopped = stop_group(pgid)
    pid_file(project).unlink(missing_ok=True)
    return stopped


if __name__ == "__main__" and sys.argv[1:] == ["serve"]:
    # Airflow and task output go to stderr (the log file); stdout carries only the replies.
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    serve(replies)
elif __name__ == "__main__" and sys.argv[1:2] == ["standalone"]:
    # python -m quiver.pipelines.loop_airflow standalone [PORT [PROJECT_DIR [HOST]]]
    args = sys.argv[2:]
    raise SystemExit(standalone(args[1] if len(args) > 1 else ".", int(args[0]) if args else 8080,
                                args[2] if len(args) > 2 else "127.0.0.1"))
elif __name__ == "__main__" and sys.argv[1:2] == ["stop"]:
    # python -m quiver.pipelines.loop_airflow stop [PROJECT_DIR]
    found = stop_standalone(sys.argv[2] if len(sys.argv) > 2 else ".")
    print("stopped Airflow standalone" if found else "no Airflow standalone running for this project")
