"""The loop on Airflow's CeleryExecutor, as a team would run it: PostgreSQL metadata DB and result backend,
Redis broker, and two Celery workers in separate working directories — `default` (concurrency 2) and `gpu`
(concurrency 1) — each with its own copy of the project settings. They share only the registry (PostgreSQL),
the artifact store (an S3 bucket: moto's server on 127.0.0.1) and the data lake; no worker can read another's
files.

The scheduler runs `quiver_drift` on a drifted day; its dataset-drift Asset event starts `quiver_retrain`.
From Airflow's own records (task instances: queue, hostname = the worker's name): `check_drift` ran on the
default worker and read the champion's reference through the store (its download lies in that worker's
cache), `train` ran on the gpu queue's worker, and the version it registered is loaded — from the bucket, by
checksum — by a prediction server started in a third directory.

What ran where is written to <tmp>/celery-run.json and printed (`pytest -s`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from quiver.pipelines.loop_common import Project, drift_asset_uri
from tests.harness import RedisServer, free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
START = date(2026, 11, 1)
DAYS, DRIFT_DAY = 10, 7
BUCKET = "quiver-loop"
MODEL = "fraud_model"


def day(index: int) -> datetime:
    return datetime.combine(START + timedelta(days=index), datetime.min.time(), tzinfo=UTC)


def _project(folder: Path, shared: Path, registry_url: str, artifact_root: str, redis_url: str) -> Path:
    """A worker's own copy of the project: settings and definitions; the data lake is the shared one. Any day
    of drift calls for a retrain (`loop_drift_persist_days: 1`): this test is about where the loop's tasks run."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copytree(REPO / "feature_defs", folder / "feature_defs", ignore=shutil.ignore_patterns("__pycache__"))
    (folder / "data").symlink_to(shared / "data", target_is_directory=True)
    (folder / "quiver.yaml").write_text(
        f"project: celerytest\nregistry_url: {registry_url}\noffline_root: {shared / 'offline'}\n"
        f"artifact_root: \"{artifact_root}\"\nredis_url: {redis_url}\nloop_window_days: 2\n"
        f"loop_retrain_calendar: ''\nredis_timeout_s: 10\nloop_drift_persist_days: 1\n")
    return folder / "quiver.yaml"


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory, postgres_server: Any, s3_server: Any) -> Iterator[Any]:
    from quiver.catalog.loader import load_catalog
    from quiver.config import load_config
    from quiver.offline.backfill import backfill
    from quiver.pipelines.demo_data import generate
    from quiver.pipelines.loop_celery import CeleryDeployment
    from quiver.pipelines.replay import replay
    from quiver.pipelines.training import run_training
    from quiver.registry import Registry
    from quiver.serving.logs import ServingLogger
    from quiver.serving.prediction import PredictionService
    from quiver.serving.store import FeatureStore

    base = tmp_path_factory.mktemp("celery")
    shared = base / "shared"
    generate(shared / "data", days=DAYS, start=START, users=1_000, merchants=100, transactions_per_day=4_000, seed=7,
             drift_from_day=DRIFT_DAY)
    redis = RedisServer(shutil.which("redis-server") or "redis-server", base)
    redis.start()
    s3_server.create_bucket(BUCKET)
    registry_url = postgres_server.url(postgres_server.create_database())
    metadata_url = postgres_server.url(postgres_server.create_database())
    online = f"redis://127.0.0.1:{redis.port}/0"
    artifact_root = s3_server.uri(BUCKET, "quiver")
    configs = {name: _project(base / name, shared, registry_url, artifact_root, online)
               for name in ("setup", "default-worker", "gpu-worker", "serving")}
    # What happened before today: the catalog applied, the offline store backfilled, a champion trained on the
    # pre-drift days, and a drifted day of its traffic served (serving logs in the offline store).
    config = load_config(configs["setup"])
    catalog = load_catalog(config.catalog_dir, root=config.root)
    Registry(config.registry, project=config.project).apply(catalog, author="test")
    backfill(config, catalog, START, START + timedelta(days=DAYS - 1))
    project = Project(config)
    for seed in range(3):
        result = run_training(config, MODEL, f"{DRIFT_DAY}d", day(DRIFT_DAY), device="cpu", seed=seed,
                              model_name=MODEL, alias="champion", log=lambda _: None)
        if result.status == "registered":
            break
    assert project.models.alias(MODEL, "champion") is not None, "no champion: worse than the baseline"
    with FeatureStore(config=config) as store, ServingLogger(config.offline_dir, flush_interval_s=3600) as logger, \
            PredictionService(store, MODEL, logger=logger, poll_interval_s=3600) as service:
        replay(config, service, day(DRIFT_DAY + 1), day(DRIFT_DAY + 3))
    airflow = CeleryDeployment(base / "airflow", metadata_url=metadata_url,
                               broker_url=f"redis://127.0.0.1:{redis.port}/1", config_path=configs["default-worker"])
    try:
        airflow.start()
        airflow.start_worker("default", queues=["default"], concurrency=2, workdir=base / "default-worker",
                             config_path=configs["default-worker"])
        airflow.start_worker("gpu", queues=["gpu"], concurrency=1, workdir=base / "gpu-worker",
                             config_path=configs["gpu-worker"])
        airflow.wait_for(lambda: {"quiver_drift", "quiver_retrain"} <= airflow.dags(), 300, "the loop's DAGs parsed")
        for dag_id in ("quiver_drift", "quiver_retrain"):
            airflow.unpause(dag_id)
        yield {"airflow": airflow, "base": base, "configs": configs, "project": project}
    finally:
        airflow.stop()
        redis.stop()


def _finished(airflow: Any, dag_id: str, after: int = 0) -> dict[str, Any] | None:
    runs = airflow.dag_runs(dag_id)[after:]
    done = [r for r in runs if r["state"] in ("success", "failed")]
    return done[0] if done else None


@pytest.fixture(scope="module")
def story(deployment: dict[str, Any]) -> dict[str, Any]:
    """quiver_drift run on two drifted days, each followed by the retrain its Asset event starts: the first
    waits (no label of the drifted traffic has arrived a day after it), the second trains."""
    airflow = deployment["airflow"]
    runs: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
    for n, logical in enumerate((day(DRIFT_DAY + 2), day(DRIFT_DAY + 3))):
        drift_id = airflow.trigger("quiver_drift", logical_date=logical.isoformat())
        drift = airflow.wait_for(lambda i=drift_id: next((r for r in airflow.dag_runs("quiver_drift")
                                                          if r["dag_run_id"] == i
                                                          and r["state"] in ("success", "failed")), None),
                                 600, "quiver_drift to finish")
        assert drift["state"] == "success", airflow.log_tail("worker-default", 80)
        retrain = airflow.wait_for(lambda k=n: _finished(airflow, "quiver_retrain", after=k), 900,
                                   "quiver_retrain, started by the drift Asset event, to finish")
        runs.append((drift_id, drift, retrain))
    (_, _, waited), (drift_id, drift, retrain) = runs
    return {"drift": drift, "retrain": retrain, "waited": waited,
            "waited_tasks": airflow.task_instances("quiver_retrain", waited["dag_run_id"]),
            "drift_tasks": airflow.task_instances("quiver_drift", drift_id),
            "retrain_tasks": airflow.task_instances("quiver_retrain", retrain["dag_run_id"])}


def test_the_drift_event_starts_the_retrain_and_train_runs_on_the_gpu_worker(
        deployment: dict[str, Any], story: dict[str, Any]) -> None:
    airflow = deployment["airflow"]
    retrain, tasks = story["retrain"], story["retrain_tasks"]
    assert retrain["state"] == "success", {t: (v["state"], v["hostname"]) for t, v in tasks.items()}
    assert retrain["run_type"] == "asset_triggered"
    events = airflow.api("/assets/events?source_dag_id=quiver_drift&limit=10")["asset_events"]
    assert any(e["uri"] == drift_asset_uri(MODEL) for e in events)
    train = tasks["train"]
    assert (train["queue"], train["pool"], train["hostname"], train["state"]) == ("gpu", "gpu", "gpu", "success")
    # The first drift's retrain planned nothing: labels of the drifted traffic had not arrived by its cutoff.
    waited = story["waited_tasks"]
    assert story["waited"]["run_type"] == "asset_triggered" and waited["plan"]["state"] == "skipped"
    assert waited.get("train", {}).get("state") in ("skipped", "upstream_skipped", None)
    for task_id in ("plan", "gate"):
        assert (tasks[task_id]["queue"], tasks[task_id]["hostname"]) == ("default", "default")
    drift = story["drift_tasks"]["check_drift"]
    assert (drift["queue"], drift["hostname"], drift["state"]) == ("default", "default", "success")


def test_the_drift_task_read_the_reference_through_the_store(deployment: dict[str, Any],
                                                              story: dict[str, Any]) -> None:
    airflow, base, project = deployment["airflow"], deployment["base"], deployment["project"]
    result = airflow.xcom("quiver_drift", story["drift"]["dag_run_id"], "check_drift")
    assert result["status"] == "computed" and result["dataset_drift"] is True
    champion = project.models.get(MODEL, int(result["champion"].rsplit(":", 1)[1]))
    # The default worker has the champion's artifact only as a download from the bucket, verified on read.
    cached = base / "default-worker" / ".quiver" / "cache" / "artifacts" / champion.artifact_path
    assert (cached / "reference.parquet").is_file() and (cached / "checksum.json").is_file()
    for worker in ("default-worker", "gpu-worker"):
        assert not (base / worker / ".quiver" / "models").exists()  # nothing written outside the store


def test_the_registered_model_is_served_from_a_third_directory(deployment: dict[str, Any],
                                                               story: dict[str, Any]) -> None:
    airflow, base, project = deployment["airflow"], deployment["base"], deployment["project"]
    trained = airflow.xcom("quiver_retrain", story["retrain"]["dag_run_id"], "train")
    version = project.models.get(MODEL, int(trained["version"]))
    assert version.artifact_path == f"models/{MODEL}/{version.sha256[:16]}" and trained["reused"] is False
    assert version.status == "registered", "the retrained version was worse than its baseline"
    champion = project.models.aliases(MODEL)["champion"]
    project.models.set_alias(MODEL, "champion", version.version, expected=champion, reason="test: serve the retrain")
    port = free_port()
    serving = base / "serving"
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUIVER_")}
    log = (serving / "serve.log").open("w")
    server = subprocess.Popen([str(Path(sys.executable).with_name("quiver")), "serve-model", MODEL, "--port",
                               str(port)], cwd=serving, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        health = airflow.wait_for(lambda: _health(port, server), 180, "the prediction server to answer")
        assert health["champion"] == version.label
        body = json.dumps({"rows": [{"request_id": "r1", "entities": {"user_id": 3, "merchant_id": 4},
                                     "fields": {"amount": 25.0, "is_online": False},
                                     "at": day(DAYS).isoformat()}]}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/predict", data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            prediction = json.loads(response.read())["predictions"][0]
        assert prediction["model_version"] == version.label and not prediction["fallback"]
        assert 0.0 <= prediction["score"] <= 1.0
        assert (serving / ".quiver" / "cache" / "artifacts" / version.artifact_path / "weights.pt").is_file()
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()
    report = {"drift": {t: {k: v[k] for k in ("queue", "hostname", "state", "pool")}
                        for t, v in story["drift_tasks"].items()},
              "retrain": {t: {k: v[k] for k in ("queue", "hostname", "state", "pool")}
                          for t, v in story["retrain_tasks"].items()},
              "retrain_run_type": story["retrain"]["run_type"], "trained": trained,
              "served": {"label": version.label, "artifact": version.artifact_path}}
    (base / "celery-run.json").write_text(json.dumps(report, indent=2, default=str))
    print("celery run:", json.dumps(report, default=str))


def _health(port: int, server: subprocess.Popen[bytes]) -> dict[str, Any] | None:
    if server.poll() is not None:
        raise RuntimeError(f"the prediction server exited ({server.returncode})")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
            return dict(json.loads(response.read()))
    except (urllib.error.URLError, OSError, ValueError):
        time.sleep(0.5)
        return None
