"""`make airflow` starts: Airflow standalone with the loop's DAGs, the project and the GPU pool, answering its API."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.harness import free_port

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
LOOP_DAGS = {"quiver_materialize", "quiver_drift", "quiver_retrain", "quiver_shadow_eval", "quiver_canary"}


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def test_make_airflow_starts_standalone_with_the_loop_dags(tmp_path: Path) -> None:
    project = tmp_path / "project"
    shutil.copytree(REPO / "feature_defs", project / "feature_defs")
    (project / "quiver.yaml").write_text("project: standalone\nregistry_url: sqlite:///.quiver/registry.db\n"
                                         "gpu_pool: gpu_test\n")
    port = free_port()
    log = (tmp_path / "standalone.log").open("w")
    process = subprocess.Popen([sys.executable, "-m", "quiver.pipelines.loop_airflow", "standalone", str(port), str(project)],
                               cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://localhost:{port}/api/v2"
    try:
        health: dict[str, Any] = {}
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and process.poll() is None:
            try:
                health = _get(f"{base}/monitor/health")
                if all(health.get(c, {}).get("status") == "healthy"
                       for c in ("metadatabase", "scheduler", "triggerer", "dag_processor")):
                    dags = {d["dag_id"] for d in _get(f"{base}/dags")["dags"]}
                    if dags >= LOOP_DAGS:
                        break
            except (urllib.error.URLError, OSError, ValueError):
                pass
            time.sleep(2)
        assert process.poll() is None, (tmp_path / "standalone.log").read_text()[-3000:]
        assert all(health[c]["status"] == "healthy" for c in ("metadatabase", "scheduler", "triggerer"))
        listed = _get(f"{base}/dags")["dags"]
        assert {d["dag_id"] for d in listed} >= LOOP_DAGS
        assert all(d["is_paused"] for d in listed)  # nothing runs until someone unpauses it
        assert _get(f"{base}/pools/gpu_test")["slots"] == 1  # the retrain DAG's pool, named in quiver.yaml
        assert (project / ".quiver/airflow/airflow.db").exists()
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=60)
        # Components that outlive standalone's own shutdown (the API server's workers) go with the group.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        log.close()
