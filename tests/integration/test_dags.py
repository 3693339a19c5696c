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
        "print(sorted(bag.dags))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=_airflow_env(tmp_path / "airflow"),
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "quiver_materialize" in out.stdout


def test_materialize_dag_runs_for_real(tmp_path: Path, redis_url: str) -> None:
    from pipelines.demo_data import generate

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
    # The day was backfilled offline and its values reached Redis.
    assert any((project / "data/offline/user_spend/tiles").glob("date=2026-11-02/*.parquet"))
    assert redis.Redis.from_url(redis_url).dbsize() > 0


def test_drift_dag_records_the_run_and_raises_alerts(tmp_path: Path) -> None:
    import numpy as np
    import pandas as pd
    from sqlalchemy import create_engine, text

    project = tmp_path / "project"
    shutil.copytree(REPO / "feature_defs", project / "feature_defs")
    rng = np.random.default_rng(5)
    (project / "data").mkdir()
    pd.DataFrame({"amount": rng.normal(50, 10, 5_000), "stable": rng.normal(0, 1, 5_000)}).to_parquet(
        project / "data/reference.parquet")
    pd.DataFrame({"amount": rng.normal(80, 10, 5_000), "stable": rng.normal(0, 1, 5_000)}).to_parquet(
        project / "data/current.parquet")
    # No sources are read by a drift check, so the catalog's data need not exist; only the registry.
    (project / "quiver.yaml").write_text("project: drifttest\nregistry_url: sqlite:///.quiver/registry.db\n")
    env = _airflow_env(tmp_path / "airflow", QUIVER_CONFIG=str(project / "quiver.yaml"),
                       QUIVER_DRIFT_REFERENCE="data/reference.parquet", QUIVER_DRIFT_CURRENT="data/current.parquet")
    assert subprocess.run([str(AIRFLOW), "db", "migrate"], env=env, capture_output=True, timeout=300).returncode == 0
    run = subprocess.run([str(AIRFLOW), "dags", "test", "quiver_drift", "2026-11-02"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    engine = create_engine(f"sqlite:///{project / '.quiver/registry.db'}")
    with engine.connect() as connection:
        subjects = {row[0] for row in connection.execute(text("SELECT subject FROM alerts"))}
    assert "scheduled:amount" in subjects and "scheduled:stable" not in subjects
