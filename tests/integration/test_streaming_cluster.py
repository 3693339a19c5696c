"""The streaming job on a Flink standalone session cluster (JobManager + two TaskManagers started from the
Flink distribution in PyFlink's wheel), checkpoints on a path they all share. Mid-stream one TaskManager
running the job is SIGKILLed (a lost machine); the job must restore its latest checkpoint on the slots left,
finish, and leave the online store equal to the batch recompute: nothing lost, nothing counted twice.

The figures of the run (which TaskManager died, the checkpoint restored, seconds to recover, the counts
compared) are written to <tmp>/cluster-recovery.json and printed (`pytest -s`)."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from quiver.catalog.loader import load_catalog
from quiver.offline import layout
from quiver.offline.backfill import backfill
from quiver.online.redis_store import RedisOnlineStore
from quiver.streaming.cluster import SessionCluster
from quiver.streaming.job import latest_checkpoint
from quiver.streaming.paths import StreamPaths
from tests.integration.test_streaming_e2e import (
    DAY0,
    REPO,
    STREAM_PYTHON,
    H,
    M,
    Streamed,
    assert_equal_values,
    entity_grid,
    random_stream,
    redis_for_module,  # noqa: F401  (module-scoped Redis of our own)
    redis_tiles,
    write_project,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SessionCluster]:
    if not STREAM_PYTHON.exists():
        pytest.fail(f"streaming virtualenv missing ({STREAM_PYTHON}): run `make setup`", pytrace=False)
    with SessionCluster(tmp_path_factory.mktemp("flink-cluster"), taskmanagers=2) as running:
        yield running


def wait_for(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")


def _all_running(cluster: SessionCluster, job_id: str) -> bool:
    try:
        job = cluster.job(job_id)
    except (urllib.error.URLError, OSError, ValueError):
        return False
    return job["state"] == "RUNNING" and all(v["status"] == "RUNNING" for v in job["vertices"])


def test_a_lost_taskmanager_is_recovered_from_the_checkpoint(
        tmp_path: Path, cluster: SessionCluster, redis_for_module: Any) -> None:  # noqa: F811
    data = random_stream(seed=47, n=150_000, n_late=0)
    config = write_project(tmp_path, redis_for_module.url, data, rows_per_file=5_000)
    paths = StreamPaths.at(tmp_path / ".quiver" / "stream")
    cmd = [str(STREAM_PYTHON), "-m", "quiver.streaming.runner", "--config", str(tmp_path / "quiver.yaml"),
           "--bounded", "--parallelism", "2", "--checkpoint-interval-ms", "500", "--jobmanager", cluster.jobmanager]
    log_path = tmp_path / "runner.log"
    catalog = load_catalog(config.catalog_dir, root=config.root)
    view = catalog.views["user_activity"]
    store = RedisOnlineStore(redis_for_module.url, config.project)

    def loaded_events() -> int:
        tiles = redis_tiles(store, config.project, view, entity_grid(view))
        return sum(tiles.column("n_events").to_pylist()) if tiles.num_rows else 0

    non_null_users = sum(u is not None for u in data.valid.column("user_id").to_pylist())
    with open(log_path, "w") as log:
        runner = subprocess.Popen(cmd, cwd=str(REPO), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            def running_job() -> str | None:
                if runner.poll() is not None:
                    pytest.fail(f"the runner ended before the kill:\n{log_path.read_text()[-3000:]}")
                jobs = [j["id"] for j in cluster.jobs() if j["status"] == "RUNNING"]
                # A tenth of the stream in Redis first: the kill lands in the middle, with state to restore.
                loaded = latest_checkpoint(paths.checkpoints) is not None and loaded_events() > non_null_users // 10
                return jobs[0] if jobs and loaded else None

            job_id = wait_for(running_job, 300, "the job running on the cluster with a checkpoint loaded")
            holders = wait_for(lambda: sorted(cluster.job_taskmanagers(job_id)), 60, "the job's TaskManagers")
            victim = holders[0]
            checkpoint_before = latest_checkpoint(paths.checkpoints)
            loaded_before = loaded_events()
            killed_at = time.time()
            cluster.kill_taskmanager(int(victim.removeprefix("tm")))
            assert 0 < loaded_before < non_null_users, "the kill must land mid-stream"
            wait_for(lambda: victim not in cluster.taskmanager_ids(), 60, "the JobManager to notice the lost TaskManager")
            noticed_at = time.time()

            def restored() -> dict[str, Any] | None:
                stats = cluster.rest(f"/jobs/{job_id}/checkpoints")
                info = stats.get("latest", {}).get("restored")
                return info if info and _all_running(cluster, job_id) else None

            restored_info = wait_for(restored, 180, "the job to restore a checkpoint and run again")
            running_at = time.time()
            code = runner.wait(timeout=600)
        finally:
            if runner.poll() is None:
                os.killpg(runner.pid, 9)
                runner.wait()
    assert code == 0, f"the runner failed after the TaskManager loss:\n{log_path.read_text()[-4000:]}"
    status = json.loads(paths.status_file.read_text())
    assert status["state"] == "finished" and status["cluster"] == cluster.jobmanager
    survivors = cluster.taskmanager_ids()
    assert victim not in survivors and len(survivors) == 1
    assert restored_info["is_savepoint"] is False and int(restored_info["id"]) >= 1

    backfill(config, catalog, DAY0, DAY0 + timedelta(days=1))
    online_events = loaded_events()
    assert online_events == non_null_users  # every event exactly once, across the failover
    compared = {"user_activity_events": online_events}
    for agg in (v for v in catalog.views.values() if v.kind == "agg"):
        online = redis_tiles(store, config.project, agg, entity_grid(agg))
        offline = pq.read_table(layout.view_dir(config.offline_dir, agg.name, layout.TILES), partitioning=None)
        keys = [*agg.key_names, "tile_start"]
        online_rows = sorted(zip(*(online.column(k).to_pylist() for k in [*keys, "n_events"]), strict=True))
        offline_rows = sorted(zip(*(offline.column(k).to_pylist() for k in [*keys, "n_events"]), strict=True))
        assert online_rows == offline_rows
        compared[f"{agg.name}_tiles"] = len(online_rows)
    streamed = Streamed(config, catalog, data, paths, store, subprocess.CompletedProcess(cmd, code, "", ""))
    values = 0
    for view_spec in catalog.views.values():
        for t in (data.end_us, data.end_us + 45 * M, data.end_us + 12 * H + 30 * M):
            values += assert_equal_values(streamed, view_spec, t)
    compared["feature_values_equal"] = values
    store.close()
    report = {"killed_taskmanager": victim, "job_taskmanagers": holders, "survivors": survivors,
              "checkpoint_before_kill": checkpoint_before.name if checkpoint_before else None,
              "restored_checkpoint": restored_info, "loaded_events_before_kill": loaded_before,
              "lost_noticed_s": round(noticed_at - killed_at, 2), "recovered_s": round(running_at - killed_at, 2),
              "events": non_null_users, "compared": compared}
    (tmp_path.parent / "cluster-recovery.json").write_text(json.dumps(report, indent=2, default=str))
    print("cluster recovery:", json.dumps(report, default=str))
