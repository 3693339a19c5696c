"""The streaming job reading a real Kafka broker with Flink's Kafka SQL connector, exactly once through faults.

A single-node KRaft broker (tests/conftest.py `kafka_broker`) holds a topic of 5 partitions; events are
keyed by user and one partition never gets a record (an idle partition must not hold the watermark back,
else the late events at the end would pass as on time). The job runs unbounded while the events arrive in
phases, and each run goes through faults: the broker restarted mid-stream; a job stopped with a savepoint
and restored on a session cluster, where one TaskManager is then SIGKILLed. After each run the online store
equals the batch backfill of the same events, tile for tile and value for value, and every record is
accounted for: records in = on time + late + quarantined (with their reasons).
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from quiver.catalog.loader import load_catalog
from quiver.config import Config, load_config
from quiver.offline import layout
from quiver.offline.store import store_for
from quiver.online.redis_store import RedisOnlineStore
from quiver.pipelines.stream_producer import to_ndjson
from quiver.streaming.cluster import SessionCluster
from quiver.streaming.kafka_broker import KafkaBroker, create_topic, end_offsets, produce
from quiver.streaming.late import late_events
from quiver.streaming.paths import StreamPaths
from tests.harness import RedisServer
from tests.integration.test_streaming_e2e import (
    CATALOG,
    DAY0,
    FUTURE,
    MALFORMED,
    REPO,
    STREAM_PYTHON,
    H,
    M,
    StreamData,
    Streamed,
    assert_equal_values,
    backfill_on_time,
    entity_grid,
    expected_quarantine,
    random_stream,
    redis_for_module,  # noqa: F401  (module-scoped Redis of our own)
    redis_tiles,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PARTITIONS, USED = 5, 4  # partition 4 stays empty: idle from the start
# Shorter than the default minute, to keep the test short. A partition with records must never fall silent
# this long (compile/flink.py, kafka_idle_ms): an idle partition that wakes after another has moved the
# watermark on would find its records late. The longest silence here is the broker's restart, which checks
# that it took under half of this.
IDLE_S = 40
KAFKA_CATALOG = CATALOG.replace('stream=StreamBinding(path="data/stream/events",',
                                'stream=StreamBinding(kafka_topic="events",')


def write_kafka_project(root: Path, redis_url: str, bootstrap: str, data: StreamData, topic: str) -> Config:
    (root / "feature_defs").mkdir(parents=True)
    (root / "feature_defs" / "features.py").write_text(KAFKA_CATALOG.replace('kafka_topic="events"',
                                                                             f'kafka_topic="{topic}"'))
    (root / "quiver.yaml").write_text(f"project: kafkatest\ncatalog: feature_defs\nregistry_url: "
                                      f"sqlite:///{root}/registry.db\noffline_root: offline\nredis_url: {redis_url}\n"
                                      f"kafka_bootstrap: {bootstrap}\n")
    batch = root / "data" / "events" / "events" / f"date={DAY0.isoformat()}"
    batch.mkdir(parents=True)
    pq.write_table(data.valid, batch / "part-00000.parquet")
    return load_config(root / "quiver.yaml")


def keyed(lines: list[bytes]) -> Iterator[tuple[bytes | None, bytes]]:
    for line in lines:
        try:
            user = json.loads(line).get("user_id")
        except (ValueError, AttributeError):
            user = None
        yield (str(user).encode() if user is not None else None), line


def send(broker: KafkaBroker, topic: str, lines: list[bytes]) -> None:
    # Explicit partitions: user % USED, so partition USED never gets a record.
    def partition(key: bytes | None) -> int:
        return int(key) % USED if key is not None and key.isdigit() else 0
    produce(broker.bootstrap, topic, keyed(lines), partition_of=partition)


def phases(data: StreamData, seed: int) -> tuple[list[bytes], list[bytes], list[bytes]]:
    """The valid events (and the malformed and future-dated records among them) in two halves, then the
    late events, which must arrive after the watermark has passed them."""
    lines = to_ndjson(data.valid, "ts", strict=True).splitlines()
    rng = np.random.default_rng(seed)
    for line, reason in MALFORMED:
        if reason != "reserved_field:__batch":
            lines.insert(int(rng.integers(0, len(lines))), line)
    lines.insert(int(rng.integers(0, len(lines) // 10)), FUTURE)
    half = len(lines) // 2
    return lines[:half], lines[half:], to_ndjson(data.late, "ts", strict=True).splitlines()


class Run:
    """`python -m quiver.streaming.runner` (unbounded) in the background, with its status file."""

    def __init__(self, config: Config, *args: str, cluster: SessionCluster | None = None) -> None:
        if not STREAM_PYTHON.exists():
            pytest.fail(f"streaming virtualenv missing ({STREAM_PYTHON}): run `make setup`", pytrace=False)
        self.paths = StreamPaths.at(Path(config.root) / ".quiver" / "stream")
        self.log = (Path(config.root) / f"runner-{time.time_ns()}.log").open("w")
        cmd = [str(STREAM_PYTHON), "-m", "quiver.streaming.runner", "--config", str(Path(config.root) / "quiver.yaml"),
               "--parallelism", "2", "--table-set", f"table.exec.source.idle-timeout={IDLE_S} s", *args]
        self.proc = subprocess.Popen(cmd, cwd=str(REPO), stdout=self.log, stderr=subprocess.STDOUT)
        self.cluster = cluster

    def status(self) -> dict[str, Any]:
        try:
            return dict(json.loads(self.paths.status_file.read_text()))
        except (OSError, ValueError):
            return {}

    def output(self) -> str:
        return Path(self.log.name).read_text()[-6000:]

    def tasks_started_at(self) -> float:
        """When the job's tasks last (re)started (epoch seconds): a partition without records turns idle
        IDLE_S after its source task starts. On a session cluster a restart after a lost TaskManager counts
        (the REST API's newest deployment of a vertex); the mini-cluster's job runs once here."""
        started = float(self.status()["timings"]["running"])
        if self.cluster is not None:
            vertices = self.cluster.job(self.status()["job_id"])["vertices"]
            started = max(started, *(v["start-time"] / 1000 for v in vertices))
        return started

    def wait_caught_up(self, records: int, timeout: float = 300) -> None:
        """Until the job has committed offsets for `records` records (its checkpoint holds them all)."""
        def done() -> bool:
            kafka = self.status().get("kafka", {}).get("events", {})
            return kafka.get("end") == records and kafka.get("committed") == records
        wait_for(done, timeout, f"the job to commit {records} records", self)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 180) -> int:
        self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        finally:
            self.log.close()
        return code


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, run: Run | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if run is not None and run.proc.poll() is not None:
            pytest.fail(f"the runner exited ({run.proc.returncode}) while waiting for {what}:\n{run.output()}")
        time.sleep(0.2)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}" + (f":\n{run.output()}" if run else ""))


@dataclass
class KafkaStreamed:
    streamed: Streamed
    records: int
    status: dict[str, Any]
    events: dict[str, str]  # what happened during the run, for the failure messages


def stream_with_faults(root: Path, redis: RedisServer, broker: KafkaBroker, topic: str, seed: int,
                       fault: Callable[[Config, Run, dict[str, str]], Run]) -> KafkaStreamed:
    data = random_stream(seed=seed)
    config = write_kafka_project(root, redis.url, broker.bootstrap, data, topic)
    create_topic(broker.bootstrap, topic, PARTITIONS)
    first, second, late = phases(data, seed)
    events: dict[str, str] = {}
    send(broker, topic, first)
    run = Run(config)
    run.wait_caught_up(len(first))
    run = fault(config, run, events)  # the fault strikes with the job running and records in flight
    send(broker, topic, second)
    run.wait_caught_up(len(first) + len(second))
    # Late records arrive once every partition's watermark has passed them: the records' partitions are read
    # to the end, and the empty partition no longer holds the watermark back (idle IDLE_S after its task
    # started; a few seconds more for the partition's assignment and the next periodic watermark).
    time.sleep(max(0.0, run.tasks_started_at() + IDLE_S + 8 - time.time()))
    send(broker, topic, late)
    records = len(first) + len(second) + len(late)
    run.wait_caught_up(records)
    assert run.stop() == 0, run.output()
    status = run.status()
    catalog = load_catalog(config.catalog_dir, root=config.root)
    backfill_on_time(config, catalog)
    store = RedisOnlineStore(redis.url, config.project)
    done = subprocess.CompletedProcess(args=[], returncode=0, stdout=run.output(), stderr="")
    return KafkaStreamed(Streamed(config, catalog, data, run.paths, store, done), records, status, events)


def assert_quiet_shorter_than_idle(began: float, events: dict[str, str]) -> None:
    """A fault keeps the partitions silent; past IDLE_S they would turn idle and the test would be a race."""
    quiet = time.monotonic() - began
    assert quiet < IDLE_S / 2, f"the fault kept the partitions silent {quiet:.0f} s ({events}): raise IDLE_S"


def restart_broker(broker: KafkaBroker) -> Callable[[Config, Run, dict[str, str]], Run]:
    def fault(config: Config, run: Run, events: dict[str, str]) -> Run:
        began = time.monotonic()
        broker.stop()
        time.sleep(3)  # the job's fetches fail meanwhile; it must neither lose nor repeat a record
        broker.start()
        events["broker"] = f"restarted in {time.monotonic() - began:.1f} s"
        assert_quiet_shorter_than_idle(began, events)
        return run
    return fault


@pytest.fixture(scope="module")
def through_broker_restart(tmp_path_factory: pytest.TempPathFactory, redis_for_module: RedisServer,  # noqa: F811
                           kafka_broker: KafkaBroker) -> Iterator[KafkaStreamed]:
    redis_for_module.start()
    with redis_for_module.client() as c:
        c.flushall()
    s = stream_with_faults(tmp_path_factory.mktemp("kafka-project"), redis_for_module, kafka_broker, "events-a",
                           seed=31, fault=restart_broker(kafka_broker))
    yield s
    s.streamed.store.close()


def check_equal_to_batch(k: KafkaStreamed) -> None:
    s = k.streamed
    checked = 0
    after_end = [s.data.end_us, s.data.end_us + 30 * M, s.data.end_us + 13 * H]
    for view in s.catalog.views.values():
        times = after_end if view.kind == "last" else s.data.request_times + after_end
        for t in times:
            checked += assert_equal_values(s, view, t)
    assert checked > 3000
    for view in s.catalog.views.values():
        if view.kind != "agg":
            continue
        online = redis_tiles(s.store, s.config.project, view, entity_grid(view))
        offline = pq.read_table(layout.view_dir(s.config.offline_dir, view.name, layout.TILES), partitioning=None)
        keys = [*view.key_names, "tile_start"]
        on = {tuple(r[k] for k in keys): r["n_events"] for r in online.to_pylist()}
        off = {tuple(r[k] for k in keys): r["n_events"] for r in offline.select([*keys, "n_events"]).to_pylist()}
        assert on == off, f"{view.name}: tiles differ ({k.events}): {sorted(set(on.items()) ^ set(off.items()))[:5]}"


def check_accounted_for(k: KafkaStreamed) -> None:
    """Records in = on time (each in the tiles once) + late + quarantined: nothing lost, nothing twice."""
    s, status = k.streamed, k.status
    assert status["kafka"]["events"]["end"] == status["kafka"]["events"]["committed"] == k.records
    assert sum(end_offsets(s.config.kafka_bootstrap, status["kafka"]["events"]["topic"]).values()) == k.records
    want = expected_quarantine(s)
    want.pop("reserved_field:__batch")
    assert status["loader"]["quarantined"]["events"] == want
    # The record dated in 2100 is beyond the source's max_future: it takes the batch route with the late ones,
    # and every one of them is in the offline store's late events (the next backfill of their days reads them).
    assert status["late"]["events"] == s.data.late.num_rows + 1
    stored = late_events(store_for(s.config), "events")
    assert stored is not None and stored.num_rows == s.data.late.num_rows + 1
    assert sorted(stored.column("cat").to_pylist()) == sorted(["late"] * s.data.late.num_rows + ["future"])
    view = s.catalog.views["user_activity"]
    in_tiles = sum(redis_tiles(s.store, s.config.project, view, entity_grid(view)).column("n_events").to_pylist())
    null_users = sum(u is None for u in s.data.valid.column("user_id").to_pylist())
    assert in_tiles == s.data.valid.num_rows - null_users
    quarantined = sum(n for reason, n in want.items() if not reason.startswith("null_key:")) + null_users
    assert in_tiles + status["late"]["events"] + quarantined == k.records


def test_online_equals_batch_through_a_broker_restart(through_broker_restart: KafkaStreamed) -> None:
    check_equal_to_batch(through_broker_restart)


def test_every_record_is_accounted_for_through_a_broker_restart(through_broker_restart: KafkaStreamed) -> None:
    check_accounted_for(through_broker_restart)


def test_malformed_records_are_quarantined_verbatim_with_their_reason(through_broker_restart: KafkaStreamed) -> None:
    paths = through_broker_restart.streamed.paths
    rows = [json.loads(line) for p in sorted(paths.sink("quarantine", "events").iterdir())
            for line in p.read_bytes().splitlines()]
    by_line = {r["line"].encode(): r["reason"] for r in rows if not r["view"]}
    for line, reason in MALFORMED:
        if reason != "reserved_field:__batch":
            assert by_line[line] == reason
    assert FUTURE not in by_line  # not quarantined: the batch route (check_accounted_for)


# ---- a savepoint, then a lost TaskManager, on a session cluster ----


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SessionCluster]:
    with SessionCluster(tmp_path_factory.mktemp("flink-cluster"), taskmanagers=2) as running:
        yield running


def savepoint_then_kill_taskmanager(cluster: SessionCluster) -> Callable[[Config, Run, dict[str, str]], Run]:
    def fault(config: Config, run: Run, events: dict[str, str]) -> Run:
        assert run.stop(signal.SIGUSR1) == 0, run.output()  # stop with a savepoint
        savepoint = run.status().get("savepoint") or ""
        assert "savepoint-" in savepoint, run.status()
        events["savepoint"] = savepoint
        run = Run(config, "--jobmanager", cluster.jobmanager, cluster=cluster)
        wait_for(lambda: (run.status().get("restored_from") or "").endswith(Path(savepoint).name), 120,
                 "the job to restore the savepoint", run)
        job_id = wait_for(lambda: run.status().get("job_id"), 120, "the restored job to run", run)
        holders = wait_for(lambda: sorted(cluster.job_taskmanagers(job_id)), 60, "the job's TaskManagers", run)
        # A lost machine: the job restarts from its latest checkpoint on the slots left.
        events["taskmanager"] = f"SIGKILL pid {cluster.kill_taskmanager(int(holders[0].removeprefix('tm')))}"
        # No silence to bound here: the whole job restarts after the kill (its exchanges make it one failover
        # region), and its sources start afresh with the second half already in the topic.
        return run
    return fault


def test_exactly_once_through_a_savepoint_and_a_lost_taskmanager(
        tmp_path_factory: pytest.TempPathFactory, redis_for_module: RedisServer, kafka_broker: KafkaBroker,  # noqa: F811
        cluster: SessionCluster) -> None:
    redis_for_module.start()
    with redis_for_module.client() as c:
        c.flushall()
    k = stream_with_faults(tmp_path_factory.mktemp("kafka-cluster-project"), redis_for_module, kafka_broker,
                           "events-b", seed=32, fault=savepoint_then_kill_taskmanager(cluster))
    try:
        check_equal_to_batch(k)
        check_accounted_for(k)
    finally:
        k.streamed.store.close()
