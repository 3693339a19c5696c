"""Airflow DAGs: they parse cleanly (DagBag), follow house rules, and really run under `airflow dags test`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import redis

REPO = Path(__file__).resolve().parents[2]
AIRFLOW = Path(sys.executable).with_name("airflow")
pytestmark = pytest.mark.integration


def _airflow_env(home: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "AIRFLOW__CORE__UNIT_TEST_MODE": "False"}, **extra)
    return env


def test_dagbag_has_no_import_errors_and_follows_house_rules(tmp_path: Path) -> None:
    code = (
        "from airflow.dag_processing.dagbag import DagBag\n"
        f"bag = DagBag(dag_folder={str(REPO / 'dags')!r})\n"
        "assert not bag.import_errors, bag.import_errors\n"
        "for dag_id, dag in bag.dags.items():\n"
        "    assert 'quiver' in dag.tags, dag_id\n"
        "    assert dag.doc_md, dag_id\n"
        "    for t in dag.tasks:\n"
        "        assert t.retries >= 1, (dag_id, t.task_id)\n"
        "        assert t.owner == 'quiver', (dag_id, t.task_id, t.owner)\n"
        "train = bag.dags['quiver_retrain'].get_task('train')\n"
        "assert (train.queue, train.pool) == ('gpu', 'gpu'), (train.queue, train.pool)\n"
        "assert bag.dags['quiver_shadow_eval'].get_task('wait_for_labels').mode == 'reschedule'\n"
        "assert not bag.dags['quiver_canary'].get_task('compact_serving_logs').upstream_task_ids\n"
        "print(sorted(bag.dags))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=_airflow_env(tmp_path / "airflow"),
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    for dag_id in ("quiver_materialize", "quiver_drift", "quiver_retrain", "quiver_shadow_eval", "quiver_canary"):
        assert dag_id in out.stdout


def test_materialize_dag_runs_for_real(tmp_path: Path, redis_url: str) -> None:
    from quiver.pipelines.demo_data import generate

    project = tmp_path / "project"
    shutil.copytree(REPO / "feature_defs", project / "feature_defs")
    generate(project / "data", days=3, users=200, merchants=20, transactions_per_day=2_000, seed=3)
    (project / "quiver.yaml").write_text(
        f"project: dagtest\nregistry_url: sqlite:///.quiver/registry.db\nredis_url: {redis_url}\n")
    env = _airflow_env(tmp_path / "airflow", QUIVER_CONFIG=str(project / "quiver.yaml"))
    migrate = subprocess.run([str(AIRFLOW), "db", "migrate"], env=env, capture_output=True, text=True,
                             timeout=300)
    assert migrate.returncode == 0, migrate.stderr[-3000:]
    run = subprocess.run([str(AIRFLOW), "dags", "test", "quiver_materialize", "2026-11-02"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert "DagRun Finished" in run.stdout + run.stderr
    # The day was backfilled offline and its values reached Redis: read online as of the end of the day (the
    # DAG's materialization time), user_spend equals the offline PIT join at that time and holds real counts
    # (`dbsize() > 0` passed with metadata keys alone; those read as empty windows: count 0 everywhere).
    # `dags test … 2026-11-02` runs the daily interval [11-01, 11-02): the DAG processes 11-01.
    assert any((project / "data/offline/user_spend/tiles").glob("date=2026-11-01/*.parquet"))
    import numpy as np
    import pandas as pd

    from quiver.catalog.loader import load_catalog
    from quiver.config import load_config
    from quiver.offline.pit import get_historical_features
    from quiver.serving.store import FeatureStore

    config = load_config(project / "quiver.yaml")
    catalog = load_catalog(project / "feature_defs", root=project)
    entity_keys = [k for k in redis.Redis.from_url(redis_url).scan_iter(match=b"q:dagtest:user_spend:*")
                   if b":_meta:" not in k]
    assert entity_keys, "no user_spend entity records in Redis"
    days = sorted(p.name.removeprefix("date=") for p in (project / "data/offline/user_spend/tiles").glob("date=*"))
    end = pd.Timestamp(days[-1], tz="UTC") + pd.Timedelta(days=1)  # the end of the day the DAG processed
    users = np.arange(1, 201)  # demo users are 1..200
    features = ["user_spend:amount_count_24h", "user_spend:amount_sum_1h"]
    with FeatureStore(config=config, catalog=catalog) as store:
        online = store.get_online_features(features, {"user_id": users}, at=end).to_dict()
    offline = get_historical_features(pd.DataFrame({"user_id": users, "event_ts": [end] * len(users)}),
                                      features, catalog=catalog, config=config)
    counts = [int(v) for v in online["amount_count_24h"]]
    assert sum(counts) > 0
    assert counts == offline["amount_count_24h"].astype(int).tolist()
    assert np.allclose(np.asarray(online["amount_sum_1h"], dtype=float), offline["amount_sum_1h"].to_numpy())


def test_drift_dag_compares_the_champion_reference_with_serving_logs(tmp_path: Path) -> None:
    import json
    from datetime import UTC, datetime, timedelta

    import numpy as np
    import pandas as pd
    from sqlalchemy import create_engine, text

    from quiver.registry import Registry
    from quiver.registry.models import ModelRegistry
    from quiver.serving.logs import ServingLogger

    project = tmp_path / "project"
    shutil.copytree(REPO / "feature_defs", project / "feature_defs")
    # One day of drift calls for a retrain here (`loop_drift_persist_days: 1`): the Asset is part of what is tested.
    (project / "quiver.yaml").write_text("project: drifttest\nregistry_url: sqlite:///.quiver/registry.db\n"
                                         "loop_model: m\nloop_drift_persist_days: 1\n")
    # The champion's reference (as training stores it) and a day of its serving traffic whose `amount` and
    # scores moved: 2 of 3 columns drifted, above the dataset-drift share.
    rng = np.random.default_rng(5)
    reference = project / ".quiver/references/m.parquet"  # a key under the default artifact root (.quiver)
    reference.parent.mkdir(parents=True)
    pd.DataFrame({"amount": rng.normal(50, 10, 3_000), "stable": rng.normal(0, 1, 3_000),
                  "score": rng.beta(2, 20, 3_000)}).to_parquet(reference)
    models = ModelRegistry(Registry(f"sqlite:///{project / '.quiver/registry.db'}", project="drifttest"))
    version = models.register("m", artifact_path="models/m/0000000000000000", sha256="0" * 64, label_column="y",
                              metrics={"roc_auc": 0.7, "baseline": {"roc_auc": 0.6}},
                              window_start=datetime(2026, 10, 20, tzinfo=UTC), cutoff=datetime(2026, 11, 1, tzinfo=UTC),
                              features=["amount", "stable"], catalog_version=None, lineage={},
                              reference_path="references/m.parquet")
    models.set_alias("m", "champion", version.version, expected=None, reason="test")
    day = datetime(2026, 11, 1, tzinfo=UTC)
    with ServingLogger(project / "data/offline") as logger:
        for i in range(3_000):
            logger.log(f"r{i}", {"user_id": i}, {"user_spend:amount": float(rng.normal(80, 10)),
                                                 "stable": float(rng.normal(0, 1))},
                       model_version="m:1", prediction=float(rng.beta(6, 20)),
                       ts=day + timedelta(seconds=20 * i))
    env = _airflow_env(tmp_path / "airflow", QUIVER_CONFIG=str(project / "quiver.yaml"))
    assert subprocess.run([str(AIRFLOW), "db", "migrate"], env=env, capture_output=True, timeout=300).returncode == 0
    run = subprocess.run([str(AIRFLOW), "dags", "test", "quiver_drift", "2026-11-02"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    engine = create_engine(f"sqlite:///{project / '.quiver/registry.db'}")
    with engine.connect() as connection:
        subjects = {row[0] for row in connection.execute(text("SELECT subject FROM alerts"))}
        runs = connection.execute(text("SELECT id, reference, current, dataset_drift FROM drift_runs")).all()
    assert "m:amount" in subjects and "m:stable" not in subjects and "m" in subjects  # "m": dataset drift
    assert len(runs) == 1 and runs[0][1] == "m:1 reference" and runs[0][3]
    assert runs[0][2] == "serving_logs[2026-11-01T00:00:00+00:00,2026-11-02T00:00:00+00:00)"
    # The drift Asset carries the run id: it is what the retrain DAG is scheduled on.
    airflow_db = create_engine(f"sqlite:///{tmp_path / 'airflow/airflow.db'}")
    with airflow_db.connect() as connection:
        extras = [json.loads(row[0]) for row in connection.execute(text(
            "SELECT e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id WHERE a.uri = 'quiver://drift/m'"))]
    assert [e["drift_run_id"] for e in extras] == [runs[0][0]]
    # This version has no held-out rows (no artifact, no lineage): the day is not estimated, and says why.
    assert extras[0]["trigger"] == "persistent_drift" and "no estimate (no held-out rows" in extras[0]["reason"]


def test_the_hourly_compaction_task_runs_for_real(tmp_path: Path) -> None:
    """The canary DAG's `compact_serving_logs` through Airflow: an hour of two replicas' files becomes one."""
    import numpy as np

    from quiver.serving.logs import ServingLogger, read_serving_logs

    project = tmp_path / "project"
    (project / "feature_defs").mkdir(parents=True)
    (project / "quiver.yaml").write_text("project: dagtest\nregistry_url: sqlite:///.quiver/registry.db\n")
    offline = project / "data" / "offline"
    t0 = 1_793_696_400_000_000  # 2026-11-03 09:00 UTC
    for replica in ("a", "b"):
        with ServingLogger(offline, replica=replica, flush_interval_s=3_600) as logger:
            for k in range(3):
                logger.log_batch([f"{replica}{k}"], {"user_id": np.arange(1)}, {"x": np.ones(1)}, "m:1",
                                 ts_us=np.array([t0 + k], dtype=np.int64))
                logger.flush()
    hour = offline / "serving_logs" / "date=2026-11-03" / "hour=09"
    assert len(list(hour.glob("part-*.parquet"))) == 6
    env = _airflow_env(tmp_path / "airflow", QUIVER_CONFIG=str(project / "quiver.yaml"))
    migrate = subprocess.run([str(AIRFLOW), "db", "migrate"], env=env, capture_output=True, text=True, timeout=300)
    assert migrate.returncode == 0, migrate.stderr[-3000:]
    run = subprocess.run([str(AIRFLOW), "tasks", "test", "quiver_canary", "compact_serving_logs",
                          "2026-11-03T11:00:00+00:00"], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert not list(hour.glob("part-*.parquet")) and len(list(hour.glob("compacted-*.parquet"))) == 1
    assert sorted(read_serving_logs(offline)["request_id"].to_pylist()) == ["a0", "a1", "a2", "b0", "b1", "b2"]
