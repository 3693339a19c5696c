"""Exactly once on the Kafka route with records in flight, and two projects sharing one broker.

test_streaming_kafka.py faults a quiet job: everything before the fault is committed, nothing arrives during
it. Here a producer thread keeps writing (a steady rate, event-time order with the bounded disorder of
`random_stream`, keyed over 4 partitions, idempotent, with a delivery timeout that outlasts a broker crash)
while the job, on a session cluster, goes through six faults, each kind twice at different moments:

    broker SIGKILL + restart · stop with a savepoint, restore at parallelism 2 · TaskManager SIGKILL ·
    broker SIGKILL + restart · stop with a savepoint, restore at parallelism 1 · TaskManager SIGKILL

Each fault starts with records acknowledged by the broker and not yet committed by the job (the records a
restart replays), and the producer goes on writing through it. After the stream drains (lag 0) and a few
late records, the online store equals the batch backfill, tile for tile and value for value, and every record
is counted once: records in = on time + late + quarantined.

Last: two projects with a source named `events` on one topic keep their own consumer groups; one's `--fresh`
run leaves the other's committed offsets alone, and a bounded run is judged by its own group only.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from quiver.catalog.loader import load_catalog
from quiver.config import Config, load_config
from quiver.offline.store import store_for
from quiver.online.redis_store import RedisOnlineStore
from quiver.pipelines.stream_producer import to_ndjson
from quiver.streaming.cluster import SessionCluster
from quiver.streaming.kafka_broker import (
    KafkaBroker,
    TopicOffsets,
    admin_config,
    committed_offsets,
    create_topic,
    end_offsets,
    produce,
)
from quiver.streaming.late import late_events
from tests.harness import RedisServer
from tests.integration.test_streaming_e2e import (
    StreamData,
    Streamed,
    backfill_on_time,
    entity_grid,
    random_stream,
    redis_for_module,  # noqa: F401  (module-scoped Redis of our own)
    redis_tiles,
    run_stream,
)
from tests.integration.test_streaming_kafka import (
    KafkaStreamed,
    Run,
    check_accounted_for,
    check_equal_to_batch,
    keyed,
    phases,
    wait_for,
    write_kafka_project,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PARTITIONS = 4  # every partition gets records (user % 4): none turns idle, so no wait for idleness at the end
PER_SECOND = 60  # the producer's rate: the stream lasts ~2 min, about as long as the six faults take
# The producer may run this many records past the fault due next, and no further: a fault that takes long on a
# loaded machine still starts with the producer writing (it never runs dry before the last fault).
HORIZON = 1500
# The product's idle timeout (test_streaming_kafka's Run sets 40 s): a broker killed on a loaded machine took 17 s
# to come back, and the silence must stay well inside the timeout (see crash_broker).
IDLE_MS = 60_000
SETTINGS = ("--table-set", f"table.exec.source.idle-timeout={IDLE_MS} ms")


def partition_of(key: bytes | None) -> int:
    return int(key) % PARTITIONS if key is not None and key.isdigit() else 0


class SteadyProducer(threading.Thread):
    """Writes `lines` (keyed by user) at `per_second`, idempotently, and keeps its records through a broker
    crash (a delivery timeout of 5 minutes: librdkafka retries in order, the broker drops duplicates)."""

    def __init__(self, bootstrap: str, topic: str, lines: list[bytes], per_second: int) -> None:
        super().__init__(name="producer", daemon=True)
        self.bootstrap, self.topic, self.per_second = bootstrap, topic, per_second
        self.records = list(keyed(lines))
        self.sent = 0  # handed to the client
        self.acked = 0  # acknowledged by the broker
        self.errors: list[str] = []
        self._allowed = len(self.records)
        self._moved = threading.Condition()

    def hold_at(self, count: int) -> None:
        """Send no record past `count` until told otherwise."""
        with self._moved:
            self._allowed = min(count, len(self.records))
            self._moved.notify_all()

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is None:
            self.acked += 1
        else:
            self.errors.append(str(err))

    def run(self) -> None:
        from confluent_kafka import Producer

        producer = Producer({**admin_config(self.bootstrap), "enable.idempotence": True, "acks": "all",
                             "linger.ms": 20, "message.timeout.ms": 300_000})
        step = max(1, self.per_second // 10)  # a tenth of a second's records at a time
        due = time.monotonic()
        try:
            while self.sent < len(self.records):
                with self._moved:
                    while self.sent >= self._allowed:
                        self._moved.wait(0.05)
                        due = time.monotonic()
                    upto = min(self.sent + step, self._allowed)
                for key, value in self.records[self.sent:upto]:
                    producer.produce(self.topic, value=value, key=key, partition=partition_of(key),
                                     on_delivery=self._delivered)
                self.sent = upto
                due += 0.1
                while (left := due - time.monotonic()) > 0:
                    producer.poll(min(left, 0.05))
            if producer.flush(300):
                self.errors.append("records left undelivered after 5 minutes")
        except Exception as exc:  # the test reads it from `errors`
            self.errors.append(f"{type(exc).__name__}: {exc}")


@dataclass
class Faulting:
    """What a fault acts on, and the timeline of what happened (for the failure messages)."""

    config: Config
    broker: KafkaBroker
    cluster: SessionCluster
    producer: SteadyProducer
    offsets: TopicOffsets  # the job's group: what it has committed
    run: Run
    began: float = field(default_factory=time.monotonic)
    events: dict[str, str] = field(default_factory=dict)
    in_flight: list[int] = field(default_factory=list)  # acknowledged, not yet committed, as each fault struck

    def note(self, what: str, text: str) -> None:
        self.events[f"{len(self.events):02d} {what}"] = f"t={time.monotonic() - self.began:.0f}s {text}"

    def committed(self) -> int:
        return sum(max(o, 0) for o in self.offsets.committed().values())

    def uncommitted(self) -> int:
        return max(self.producer.acked - self.committed(), 0)

    def committed_past(self, count: int) -> bool:
        from confluent_kafka import KafkaException

        try:
            return self.committed() > count
        except KafkaException:  # the broker just came back: ask again
            return False


def crash_broker(f: Faulting) -> None:
    began = time.monotonic()
    f.broker.kill()  # SIGKILL: in-flight produce requests and the job's fetches die with it
    time.sleep(2)
    f.broker.start()
    quiet = time.monotonic() - began
    f.note("broker", f"SIGKILL, back in {quiet:.1f} s")
    # A partition silent past the idle timeout stops holding the watermark back: keep well inside it.
    assert quiet < IDLE_MS / 2000, f"the broker was down {quiet:.0f} s ({f.events}): raise IDLE_MS"


def rescale_through_savepoint(parallelism: int) -> Callable[[Faulting], None]:
    """Stop with a savepoint, restore at `parallelism` on the session cluster. The state maps to the new job by
    operator ids, which must not depend on the parallelism (Flink's default hashes the chained graph, and
    chaining changes with it: "Cannot map checkpoint/savepoint state for operator … to the new program")."""
    def fault(f: Faulting) -> None:
        assert f.run.stop(signal.SIGUSR1) == 0, f.run.output()  # stop with a savepoint
        savepoint = f.run.status().get("savepoint") or ""
        assert "savepoint-" in savepoint, f.run.status()
        f.run = Run(f.config, *SETTINGS, "--parallelism", str(parallelism), "--jobmanager", f.cluster.jobmanager,
                    cluster=f.cluster)
        wait_for(lambda: (f.run.status().get("restored_from") or "").endswith(Path(savepoint).name), 180,
                 "the job to restore the savepoint", f.run)
        job_id = wait_for(lambda: f.run.status().get("job_id"), 120, "the restored job to run", f.run)
        # The sources and the aggregations run `parallelism` wide (a file sink's committer stays at one).
        widths = {v["parallelism"] for v in f.cluster.job(job_id)["vertices"]}
        assert max(widths) == parallelism, f"restored at {widths}, not {parallelism}"
        f.note("savepoint", f"{Path(savepoint).name} restored at parallelism {parallelism}")
    return fault


def crash_taskmanager(f: Faulting) -> None:
    job_id = f.run.status()["job_id"]
    holders = wait_for(lambda: sorted(f.cluster.job_taskmanagers(job_id)), 60, "the job's TaskManagers", f.run)
    pid = f.cluster.kill_taskmanager(int(holders[0].removeprefix("tm")))
    # A replacement machine, so that the next loss still leaves slots (SessionCluster stops it with the rest).
    replacement = f.cluster.add_taskmanager()
    f.note("taskmanager", f"SIGKILL {holders[0]} (pid {pid}), tm{replacement} started")


FAULTS: list[tuple[float, Callable[[Faulting], None]]] = [  # (share of the stream sent, fault)
    (0.08, crash_broker),
    (0.16, rescale_through_savepoint(2)),
    (0.30, crash_taskmanager),
    (0.45, crash_broker),
    (0.55, rescale_through_savepoint(1)),
    (0.70, crash_taskmanager),
]


def stream_through_faults(root: Path, redis: RedisServer, broker: KafkaBroker, cluster: SessionCluster,
                          seed: int) -> KafkaStreamed:
    data = random_stream(seed=seed)
    topic = f"inflight-{uuid.uuid4().hex[:8]}"
    config = write_kafka_project(root, redis.url, broker.bootstrap, data, topic)
    create_topic(broker.bootstrap, topic, PARTITIONS)
    first, second, late = phases(data, seed)
    lines = first + second
    run = Run(config, *SETTINGS, "--parallelism", "1", "--jobmanager", cluster.jobmanager, cluster=cluster)
    wait_for(lambda: run.status().get("state") == "running", 180, "the job to run", run)
    producer = SteadyProducer(broker.bootstrap, topic, lines, PER_SECOND)
    group = config.kafka.group(config.project, "events")
    f = Faulting(config, broker, cluster, producer, TopicOffsets(broker.bootstrap, topic, group), run)
    try:
        producer.hold_at(int(FAULTS[0][0] * len(lines)) + HORIZON)
        producer.start()
        for k, (share, fault) in enumerate(FAULTS):
            due = int(share * len(lines))
            wait_for(lambda due=due: producer.sent >= due, 300, f"the producer to send {due} records", f.run)
            # In flight: acknowledged by the broker, not yet in a completed checkpoint of the job (just after a
            # checkpoint there may be none for a moment: the producer's next records make some).
            f.in_flight.append(wait_for(f.uncommitted, 60, "records in flight", f.run))
            fault(f)
            f.note("producer", f"{producer.sent} sent, {producer.acked} acknowledged")
            after = f.committed()  # the job (restarted, or restored) moves on from here, records still arriving
            wait_for(lambda after=after: f.committed_past(after), 240, "the job to commit after the fault", f.run)
            following = FAULTS[k + 1][0] if k + 1 < len(FAULTS) else 1.0
            producer.hold_at(int(following * len(lines)) + HORIZON)
        producer.join(360)
        assert not producer.is_alive() and not producer.errors and producer.acked == len(lines), \
            (producer.errors, producer.acked, f.events)
        f.run.wait_caught_up(len(lines))
        # Late records: every partition's watermark is past them now (the whole stream is committed).
        produce(broker.bootstrap, topic, keyed(late), partition_of=partition_of)
        records = len(lines) + len(late)
        f.run.wait_caught_up(records)
        assert f.run.status()["kafka"]["events"]["lag"] == 0
        assert f.run.stop() == 0, f.run.output()
    except BaseException:
        if f.run.proc.poll() is None:  # a failed fault must not leave the job running into the next module
            with contextlib.suppress(Exception):
                f.run.stop(timeout=60)
        raise
    finally:
        producer.hold_at(len(lines))
        broker.start()  # a fault that failed half way must not leave the session's broker down
        f.offsets.close()
    f.note("in flight", f"{f.in_flight}")
    print("\n".join(f"{k}: {v}" for k, v in f.events.items()))  # the timeline, shown with -s
    catalog = load_catalog(config.catalog_dir, root=config.root)
    backfill_on_time(config, catalog)
    store = RedisOnlineStore(redis.url, config.project)
    done = subprocess.CompletedProcess(args=[], returncode=0, stdout=f.run.output(), stderr="")
    streamed = KafkaStreamed(Streamed(config, catalog, data, f.run.paths, store, done), records, f.run.status(),
                             f.events)
    streamed.status["in_flight"] = f.in_flight
    return streamed


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SessionCluster]:
    with SessionCluster(tmp_path_factory.mktemp("flink-cluster"), taskmanagers=2) as running:
        yield running


@pytest.fixture(scope="module")
def through_faults(tmp_path_factory: pytest.TempPathFactory, redis_for_module: RedisServer,  # noqa: F811
                   kafka_broker: KafkaBroker, cluster: SessionCluster) -> Iterator[KafkaStreamed]:
    redis_for_module.start()
    with redis_for_module.client() as c:
        c.flushall()
    s = stream_through_faults(tmp_path_factory.mktemp("inflight-project"), redis_for_module, kafka_broker, cluster,
                              seed=51)
    yield s
    s.streamed.store.close()


def test_every_fault_struck_with_records_in_flight(through_faults: KafkaStreamed) -> None:
    in_flight = through_faults.status["in_flight"]
    assert len(in_flight) == len(FAULTS) and all(n > 0 for n in in_flight), through_faults.events


def test_online_equals_batch_through_faults_in_flight(through_faults: KafkaStreamed) -> None:
    check_equal_to_batch(through_faults)


def test_every_record_is_counted_once_through_faults_in_flight(through_faults: KafkaStreamed) -> None:
    check_accounted_for(through_faults)


def test_late_records_reach_the_offline_store_once(through_faults: KafkaStreamed) -> None:
    """The Kafka route's late records land in the offline store's `_late_events/`, as the file route's do, each
    once though the job replayed what it had not checkpointed."""
    s = through_faults.streamed
    late = late_events(store_for(s.config), "events")
    assert late is not None, "no late records in the offline store"
    late = late.filter(pc.equal(late.column("cat"), "late"))
    def rows(table: pa.Table) -> list[tuple[int, int]]:
        return sorted(zip(table.column("user_id").to_pylist(), table.column("ts").cast(pa.int64()).to_pylist(),
                          strict=True))
    assert rows(late) == rows(s.data.late)


# ---- two projects, one broker, a source of the same name ----


def kafka_project(root: Path, name: str, redis_url: str, bootstrap: str, data: StreamData, topic: str) -> Config:
    write_kafka_project(root, redis_url, bootstrap, data, topic)
    text = (root / "quiver.yaml").read_text().replace("project: kafkatest", f"project: {name}")
    (root / "quiver.yaml").write_text(text)
    return load_config(root / "quiver.yaml")


def bounded(config: Config, *args: str) -> dict[str, Any]:
    result = run_stream(config, "--bounded", "--parallelism", "1", *args, timeout=300)
    assert result.returncode == 0, f"{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    return dict(json.loads((Path(config.root) / ".quiver" / "stream" / "status.json").read_text()))


def events_in_tiles(config: Config, redis_url: str) -> int:
    catalog = load_catalog(config.catalog_dir, root=config.root)
    view = catalog.views["user_activity"]
    store = RedisOnlineStore(redis_url, config.project)
    try:
        return sum(redis_tiles(store, config.project, view, entity_grid(view)).column("n_events").to_pylist())
    finally:
        store.close()


def test_two_projects_with_a_source_of_the_same_name_keep_their_own_offsets(
        tmp_path_factory: pytest.TempPathFactory, redis_for_module: RedisServer,  # noqa: F811
        kafka_broker: KafkaBroker) -> None:
    redis_for_module.start()
    bootstrap, topic = kafka_broker.bootstrap, f"shared-{uuid.uuid4().hex[:8]}"
    data = random_stream(seed=61, n=600, n_late=0)
    alpha = kafka_project(tmp_path_factory.mktemp("alpha"), "alpha", redis_for_module.url, bootstrap, data, topic)
    beta = kafka_project(tmp_path_factory.mktemp("beta"), "beta", redis_for_module.url, bootstrap, data, topic)
    group_a, group_b = (c.kafka.group(c.project, "events") for c in (alpha, beta))
    assert group_a != group_b
    create_topic(bootstrap, topic, PARTITIONS)
    lines = to_ndjson(data.valid, "ts", strict=True).splitlines()
    half = len(lines) // 2
    with_user = sum(u is not None for u in data.valid.column("user_id").to_pylist())

    produce(bootstrap, topic, keyed(lines[:half]), partition_of=partition_of)
    bounded(alpha)
    alpha_read = committed_offsets(bootstrap, group_a, topic)
    assert sum(alpha_read.values()) == half and alpha_read == end_offsets(bootstrap, topic)

    # Beta starts afresh over the whole topic: its group is forgotten and read anew, alpha's is not touched.
    produce(bootstrap, topic, keyed(lines[half:]), partition_of=partition_of)
    beta_status = bounded(beta, "--fresh")
    assert beta_status["kafka"]["events"] == {"topic": topic, "end": len(lines), "committed": len(lines), "lag": 0}
    assert committed_offsets(bootstrap, group_a, topic) == alpha_read, "beta's --fresh moved alpha's offsets"
    assert events_in_tiles(beta, redis_for_module.url) == with_user

    # Beta's group is at the end; alpha's bounded run still reads the second half before it calls itself done.
    alpha_status = bounded(alpha)
    assert alpha_status["restored_from"], "alpha's second run did not resume its checkpoint"
    assert alpha_status["kafka_goal"] == {"events": len(lines)}
    assert sum(committed_offsets(bootstrap, group_a, topic).values()) == len(lines)
    assert events_in_tiles(alpha, redis_for_module.url) == with_user
    assert sum(committed_offsets(bootstrap, group_b, topic).values()) == len(lines)  # alpha left beta's alone
