"""Crash and resume: SIGKILL the streaming job (Python driver and Flink JVM) mid-stream, restart it from the
latest checkpoint, let it finish — the online store then equals the batch recompute: nothing lost, nothing
counted twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from datetime import timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from quiver.catalog.loader import load_catalog
from quiver.offline import layout
from quiver.offline.backfill import backfill
from quiver.online.redis_store import RedisOnlineStore
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
    run_stream,
    write_project,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def wait_for(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")


def test_sigkill_mid_stream_then_resume_equals_batch(tmp_path: Path, redis_for_module) -> None:  # noqa: F811
    data = random_stream(seed=33, n=150_000, n_late=0)
    config = write_project(tmp_path, redis_for_module.url, data, rows_per_file=5_000)
    paths = StreamPaths.at(tmp_path / ".quiver" / "stream")
    if not STREAM_PYTHON.exists():
        pytest.fail(f"streaming virtualenv missing ({STREAM_PYTHON}): run `make setup`", pytrace=False)
    cmd = [str(STREAM_PYTHON), "-m", "quiver.streaming.runner", "--config", str(tmp_path / "quiver.yaml"),
           "--bounded", "--parallelism", "2", "--checkpoint-interval-ms", "500"]
    log = (tmp_path / "first-run.log").open("w")
    first = subprocess.Popen(cmd, cwd=str(REPO), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    catalog = load_catalog(config.catalog_dir, root=config.root)
    view = catalog.views["user_activity"]
    store = RedisOnlineStore(redis_for_module.url, config.project)

    def loaded_events() -> int:
        tiles = redis_tiles(store, config.project, view, entity_grid(view))
        return sum(tiles.column("n_events").to_pylist()) if tiles.num_rows else 0

    def mid_stream() -> bool:
        if first.poll() is not None:
            pytest.fail(f"the job ended before it could be killed:\n{(tmp_path / 'first-run.log').read_text()[-3000:]}")
        return latest_checkpoint(paths.checkpoints) is not None and loaded_events() > 0

    try:
        wait_for(mid_stream, 300, "a completed checkpoint and a first load into Redis")
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the driver and the Flink JVM it started: a machine crash
        first.wait()
        log.close()
    status = json.loads(paths.status_file.read_text())
    assert status["state"] == "running"  # it never got to say goodbye
    non_null_users = sum(u is not None for u in data.valid.column("user_id").to_pylist())
    partial = loaded_events()
    assert 0 < partial < non_null_users, "the kill must land mid-stream"

    second = run_stream(config, "--bounded", "--parallelism", "2", "--checkpoint-interval-ms", "500")
    assert second.returncode == 0, f"restart failed:\n{second.stdout[-3000:]}\n{second.stderr[-6000:]}"
    status = json.loads(paths.status_file.read_text())
    assert status["restored_from"], "the second run must resume from the checkpoint, not start over"
    assert status["state"] == "finished"

    backfill(config, catalog, DAY0, DAY0 + timedelta(days=1))
    assert loaded_events() == non_null_users  # every event exactly once
    for agg in (v for v in catalog.views.values() if v.kind == "agg"):
        online = redis_tiles(store, config.project, agg, entity_grid(agg))
        offline = pq.read_table(layout.view_dir(config.offline_dir, agg.name, layout.TILES), partitioning=None)
        keys = [*agg.key_names, "tile_start"]
        assert sorted(zip(*(online.column(k).to_pylist() for k in [*keys, "n_events"]), strict=True)) == \
            sorted(zip(*(offline.column(k).to_pylist() for k in [*keys, "n_events"]), strict=True))
    streamed = Streamed(config, catalog, data, paths, store, second)
    for view_spec in catalog.views.values():
        for t in (data.end_us, data.end_us + 45 * M, data.end_us + 12 * H + 30 * M):
            assert_equal_values(streamed, view_spec, t)
    store.close()
