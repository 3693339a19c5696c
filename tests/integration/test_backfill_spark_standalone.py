"""The same Spark backfill on a real standalone cluster (a master and one worker started from the scripts
bundled with pyspark) gives exactly what local mode gives."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from quiver.offline.backfill import backfill
from quiver.offline.engines import spark_session, stop_spark
from tests.integration.test_backfill_support import DAY0, assert_rows_equal, project, store_rows

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _status(web_port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{web_port}/json/", timeout=5) as response:
        return dict(json.load(response))


def _wait(what: str, check: Any, procs: list[subprocess.Popen[bytes]], logs: list[Path],
          timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in procs:
            if proc.poll() is not None:
                pytest.fail(f"{what}: a Spark daemon exited:\n" + "\n".join(p.read_text()[-3000:] for p in logs))
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.5)
    pytest.fail(f"timed out waiting for {what}:\n" + "\n".join(p.read_text()[-3000:] for p in logs))


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    import pyspark

    home = Path(pyspark.__file__).parent
    spark_class = home / "bin" / "spark-class"
    assert spark_class.exists(), f"pyspark ships no {spark_class}"
    work = tmp_path_factory.mktemp("standalone")
    env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1"}
    port, web = _free_port(), _free_port()
    url = f"spark://127.0.0.1:{port}"
    logs = [work / "master.log", work / "worker.log"]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with logs[0].open("wb") as log:
            procs.append(subprocess.Popen(
                [str(spark_class), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                 "--port", str(port), "--webui-port", str(web)],
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True))
        _wait("the master", lambda: _status(web)["status"] == "ALIVE", procs, logs)
        with logs[1].open("wb") as log:
            procs.append(subprocess.Popen(
                [str(spark_class), "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                 "--cores", "2", "--memory", "2g", "--webui-port", str(_free_port()),
                 "--work-dir", str(work / "work"), url],
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True))
        _wait("the worker", lambda: _status(web)["aliveworkers"] >= 1, procs, logs)
        yield url, web
    finally:
        stop_spark()
        for proc in reversed(procs):  # worker first: it stops its executors
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(procs):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def test_standalone_cluster_backfill_equals_local_mode(standalone: tuple[str, int], tmp_path: Path) -> None:
    url, web = standalone
    config, catalog = project(tmp_path)
    end = DAY0 + timedelta(days=2)
    local = replace(config, offline_root="offline-local", spark_master="local[2]")
    cluster = replace(config, offline_root="offline-cluster", spark_master=url)
    local_report = backfill(local, catalog, DAY0, end, engine="spark")
    cluster_report = backfill(cluster, catalog, DAY0, end, engine="spark")
    assert spark_session(url).sparkContext.master == url
    apps = _status(web)["activeapps"]
    assert [a["name"] for a in apps] == ["quiver"], apps  # the job ran on the cluster, not in-process
    for view in catalog.views.values():
        assert_rows_equal(store_rows(cluster.offline_dir, view), store_rows(local.offline_dir, view),
                          f"{view.name}: standalone vs local")
        assert cluster_report.views[view.name].rows_by_date == local_report.views[view.name].rows_by_date
        assert cluster_report.views[view.name].rows_written > 0
