"""`make airflow` starts: Airflow standalone with the loop's DAGs, the project and the GPU pool, answering its API
on 127.0.0.1 only, with a handful of processes (not 32 executor workers), and `make airflow-stop` (the
module's `stop`) ends every process it started."""

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
        group = int((project / ".quiver/airflow/standalone.pid").read_text())
        members = _group(group)
        print(f"make airflow: {len(members)} processes: {sorted(c for _, c in members)}")
        assert 3 <= len(members) <= 16, f"{len(members)} processes: {members}"  # was 41 with 32 executor workers
        listening = _listening_addresses(port)
        assert listening and listening <= {"127.0.0.1"}, listening  # loopback only (AIRFLOW_HOST to change)
        stop = subprocess.run([sys.executable, "-m", "quiver.pipelines.loop_airflow", "stop", str(project)],
                              cwd=REPO, capture_output=True, text=True, timeout=120)
        assert stop.returncode == 0 and "stopped" in stop.stdout, stop.stdout + stop.stderr
        process.wait(timeout=60)
        assert _group(group) == [] and not any(_alive(pid) for pid, _ in members)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=60)
        # Components that outlive standalone's own shutdown (the API server's workers) go with the group.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        log.close()


def _group(pgid: int) -> list[tuple[int, str]]:
    """(pid, command) of the live processes in process group `pgid`."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            out.append((int(stat.parent.name), text.split("(", 1)[1].rsplit(")", 1)[0]))
    return sorted(out)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _listening_addresses(port: int) -> set[str]:
    """IPv4/IPv6 addresses with a socket listening on `port` (from /proc/net/tcp*)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            address, _, hexport = local.partition(":")
            if state == "0A" and int(hexport, 16) == port:  # 0A = LISTEN
                if len(address) == 8:
                    found.add(".".join(str(int(address[i:i + 2], 16)) for i in (6, 4, 2, 0)))
                else:
                    found.add("::" if set(address) == {"0"} else address)
    return found
