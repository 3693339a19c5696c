"""Unbounded mode on real parts: start `quiver stream`, feed stream files over time, read Redis, SIGTERM,
feed more while it is down, restart, SIGTERM again — Redis then equals the batch recompute, and the
inbox stayed small (retention). Also: a Kafka-bound source without the connector jar fails with one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from quiver.catalog.loader import load_catalog
from quiver.compile.flink import streamed_views
from quiver.offline import layout
from quiver.online.redis_store import RedisOnlineStore
from quiver.streaming.feeder import BATCH_PREFIX, HISTORY, Feeder, source_feeds
from quiver.streaming.late import late_dir
from quiver.streaming.paths import StreamPaths, visible_files
from tests.integration.test_streaming_e2e import (
    REPO,
    STREAM_PYTHON,
    M,
    Streamed,
    assert_equal_values,
    backfill_on_time,
    entity_grid,
    random_stream,
    redis_for_module,  # noqa: F401  (module-scoped Redis of our own)
    redis_tiles,
    run_stream,
    write_project,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def wait_for(predicate, timeout: float, what: str, proc: subprocess.Popen[bytes], log: Path) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the job ended while waiting for {what}:\n{log.read_text()[-3000:]}")
        if predicate():
            return
        time.sleep(0.2)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")


def start(config_root: Path, log: Path) -> subprocess.Popen[bytes]:
    cmd = [str(STREAM_PYTHON), "-m", "quiver.streaming.runner", "--config", str(config_root / "quiver.yaml"),
           "--parallelism", "1", "--checkpoint-interval-ms", "500"]
    return subprocess.Popen(cmd, cwd=str(REPO), stdout=log.open("a"), stderr=subprocess.STDOUT, start_new_session=True)


def stop(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)  # what Kubernetes or Ctrl-C does: cancel, keep the checkpoint, drain
    return proc.wait(timeout=120)


def test_unbounded_feed_read_sigterm_restart_equals_batch(tmp_path: Path, redis_for_module) -> None:  # noqa: F811
    if not STREAM_PYTHON.exists():
        pytest.fail(f"streaming virtualenv missing ({STREAM_PYTHON}): run `make setup`", pytrace=False)
    data = random_stream(seed=44, n=6000, n_late=5)
    config = write_project(tmp_path, redis_for_module.url, data, rows_per_file=300)
    catalog = load_catalog(config.catalog_dir, root=config.root)
    stream = tmp_path / "data" / "stream" / "events"
    held = tmp_path / "held"
    held.mkdir()
    files = visible_files(stream)
    for path in files:
        path.rename(held / path.name)
    paths = StreamPaths.at(tmp_path / ".quiver" / "stream")
    views = streamed_views(catalog)
    log = tmp_path / "stream.log"

    def release(names: list[str]) -> None:
        for name in names:
            (held / name).rename(stream / name)  # atomic, like a producer
            time.sleep(0.3)

    def caught_up() -> bool:
        feeder = Feeder({"events": stream}, paths, source_feeds(catalog, views), late_dir(config.offline_dir))
        try:
            markers = set(json.loads((paths.root / "markers.json").read_text()))
        except (OSError, ValueError):
            return False
        return not feeder.pending("events") and set(feeder.batches()["events"]) <= markers

    names = [p.name for p in files]
    first, second = names[: len(names) * 2 // 3], names[len(names) * 2 // 3:]
    store = RedisOnlineStore(redis_for_module.url, config.project)
    proc = start(tmp_path, log)
    try:
        wait_for(lambda: (paths.status_file.exists()
                          and json.loads(paths.status_file.read_text()).get("state") == "running"),
                 300, "the job to run", proc, log)
        release(first)
        wait_for(caught_up, 300, "the first files to be committed", proc, log)
        time.sleep(3.0)  # a few checkpoints: every view's files of the last batch are committed and loaded
        view = catalog.views["user_activity"]
        assert sum(redis_tiles(store, config.project, view, entity_grid(view)).column("n_events").to_pylist()) > 0
    finally:
        code = stop(proc)
    assert code == 0, log.read_text()[-3000:]
    status = json.loads(paths.status_file.read_text())
    assert status["state"] == "stopped" and status["mode"] == "unbounded"
    # Retention: committed batches left the inbox; their bookkeeping lives on in the history.
    inbox = paths.inbox("events")
    assert (inbox / HISTORY).exists()
    assert len(visible_files(inbox, BATCH_PREFIX)) < len(json.loads((inbox / HISTORY).read_text())["files"])

    for name in second:  # written while the job is down
        (held / name).rename(stream / name)
    proc = start(tmp_path, log)
    try:
        wait_for(caught_up, 300, "the rest to be committed after the restart", proc, log)
        time.sleep(3.0)
    finally:
        code = stop(proc)
    assert code == 0, log.read_text()[-3000:]
    status = json.loads(paths.status_file.read_text())
    assert status["restored_from"], "the restart must resume from the checkpoint"

    backfill_on_time(config, catalog)
    non_null_users = sum(u is not None for u in data.valid.column("user_id").to_pylist())
    view = catalog.views["user_activity"]
    assert sum(redis_tiles(store, config.project, view, entity_grid(view)).column("n_events").to_pylist()) == \
        non_null_users  # every event exactly once across the stop
    for agg in (v for v in catalog.views.values() if v.kind == "agg"):
        online = redis_tiles(store, config.project, agg, entity_grid(agg))
        offline = pq.read_table(layout.view_dir(config.offline_dir, agg.name, layout.TILES), partitioning=None)
        keys = [*agg.key_names, "tile_start", "n_events"]
        assert sorted(zip(*(online.column(k).to_pylist() for k in keys), strict=True)) == \
            sorted(zip(*(offline.column(k).to_pylist() for k in keys), strict=True))
    streamed = Streamed(config, catalog, data, paths, store, subprocess.CompletedProcess([], 0))
    checked = sum(assert_equal_values(streamed, v, t) for v in catalog.views.values()
                  for t in (data.end_us, data.end_us + 45 * M))
    assert checked > 500
    store.close()


KAFKA_CATALOG = '''
from quiver import Aggregation, Entity, FeatureView, Source, StreamBinding

user = Entity(name="user", join_keys=["user_id"])
clicks = Source(name="clicks", path="data/events/clicks", timestamp_field="ts",
                stream=StreamBinding(kafka_topic="clicks", kafka_bootstrap_servers="localhost:9092"))
user_clicks = FeatureView(name="user_clicks", entities=[user], source=clicks,
                          aggregations=[Aggregation("qty", "sum", "1h")])
'''


def test_kafka_source_without_the_connector_jar_fails_with_one_clear_line(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import pyarrow as pa

    monkeypatch.setenv("QUIVER_JARS_DIR", str(tmp_path / "no-jars"))  # as if `make setup` had fetched none

    (tmp_path / "feature_defs").mkdir()
    (tmp_path / "feature_defs" / "features.py").write_text(KAFKA_CATALOG)
    batch = tmp_path / "data" / "events" / "clicks"
    batch.mkdir(parents=True)
    pq.write_table(pa.table({"user_id": pa.array([1], pa.int64()), "qty": pa.array([2], pa.int64()),
                             "ts": pa.array([0], pa.timestamp("us", tz="UTC"))}), batch / "part-0.parquet")
    (tmp_path / "quiver.yaml").write_text(f"project: kafkatest\ncatalog: feature_defs\nregistry_url: sqlite:///"
                                          f"{tmp_path}/registry.db\noffline_root: offline\n")
    env_jars = os.environ.pop("QUIVER_FLINK_JARS", None)
    try:
        result = run_stream(load_config_root(tmp_path), "--bounded", timeout=300)
    finally:
        if env_jars is not None:
            os.environ["QUIVER_FLINK_JARS"] = env_jars
    assert result.returncode == 2, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "flink-sql-connector-kafka" in lines[0] and "make setup" in lines[0] and "QUIVER_FLINK_JARS" in lines[0]


def load_config_root(root: Path):  # type: ignore[no-untyped-def]
    from quiver.config import load_config

    return load_config(root / "quiver.yaml")
