"""A secured Kafka, as managed clusters run it: the harness broker with a SASL_PLAINTEXT listener (PLAIN) and a
TLS listener whose certificate a CA made by the test signed. The stream job (`quiver.streaming.runner
--bounded`, Flink's shaded Kafka connector) reads a small topic through each, with the settings of quiver.yaml's
`kafka:` section (the password from the environment), and the values land in Redis; the topic is made and
written by Quiver's Python clients with the same settings. A wrong password, an untrusted certificate and an
absent cluster each end the run with one clear line and a non-zero exit, before any Flink job starts."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from quiver.config import Config, load_config
from quiver.serving.store import FeatureStore
from quiver.streaming.kafka_broker import (
    KafkaBroker,
    TlsFiles,
    create_topic,
    end_offsets,
    make_test_certificates,
    produce,
)
from tests.harness import RedisServer
from tests.integration.test_streaming_e2e import REPO, STREAM_PYTHON, redis_for_module  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PASSWORD_VARIABLE = "QUIVER_TEST_KAFKA_PASSWORD"  # the secret, as a Kubernetes Secret would hand it over
CATALOG = '''
from quiver import Aggregation, Entity, FeatureView, Source, StreamBinding
user = Entity(name="user", join_keys=["user_id"])
tx = Source(name="tx", path="data/tx", timestamp_field="ts", stream=StreamBinding(kafka_topic="{topic}"))
spend = FeatureView(name="spend", entities=[user], source=tx, tile="5m",
                    aggregations=[Aggregation("amount", "sum", "1d"), Aggregation("amount", "count", "1d")])
'''
USERS = 3
EVENTS = 24
JAAS = 'org.apache.kafka.common.security.plain.PlainLoginModule required username="alice" password="{password}";'


@dataclass
class SecuredKafka:
    broker: KafkaBroker
    tls: TlsFiles
    stranger: TlsFiles  # a CA that did not sign the broker's certificate


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredKafka]:
    from quiver.catalog.errors import QuiverError

    root = tmp_path_factory.mktemp("kafka-secured")
    tls = make_test_certificates(root / "certs")
    stranger = make_test_certificates(root / "certs", "stranger")
    broker = KafkaBroker(root / "broker", partitions=2, sasl_users={"alice": "secret"}, tls=tls)
    try:
        broker.start()
    except QuiverError as e:  # jars or Java missing: fail, never skip
        pytest.fail(str(e), pytrace=False)
    yield SecuredKafka(broker, tls, stranger)
    broker.stop()


def kafka_section(kafka: SecuredKafka, protocol: str, password: str = f"${{{PASSWORD_VARIABLE}}}",
                  ca: Path | None = None) -> str:
    lines = [f"  bootstrap: {kafka.broker.bootstrap_for(protocol)}", "  properties:",
             f"    security.protocol: {protocol}"]
    if protocol.startswith("SASL"):
        lines += ["    sasl.mechanism: PLAIN", f"    sasl.jaas.config: '{JAAS.format(password=password)}'"]
    if protocol.endswith("SSL"):
        lines += [f"    ssl.truststore.location: {ca or kafka.tls.ca}", "    ssl.truststore.type: PEM"]
    return "kafka:\n" + "\n".join(lines) + "\n"


def write_project(root: Path, redis_url: str, topic: str, kafka: str, project: str = "secured") -> Config:
    (root / "feature_defs").mkdir(parents=True)
    (root / "feature_defs" / "features.py").write_text(CATALOG.format(topic=topic))
    (root / "quiver.yaml").write_text(f"project: {project}\ncatalog: feature_defs\nregistry_url: sqlite:///{root}/r.db\n"
                                      f"offline_root: offline\nredis_url: {redis_url}\n{kafka}")
    batch = root / "data" / "tx" / "date=2026-11-01"
    batch.mkdir(parents=True)
    pq.write_table(pa.table({"user_id": pa.array([0], pa.int64()), "amount": [1.0],
                             "ts": pa.array([datetime(2026, 11, 1, tzinfo=UTC)], pa.timestamp("us", tz="UTC"))}),
                   batch / "part-00000.parquet")
    return load_config(root / "quiver.yaml")


def run_stream(config: Config, password: str = "secret", timeout: float = 300) -> subprocess.CompletedProcess[str]:
    if not STREAM_PYTHON.exists():
        pytest.fail(f"streaming virtualenv missing ({STREAM_PYTHON}): run `make setup`", pytrace=False)
    cmd = [str(STREAM_PYTHON), "-m", "quiver.streaming.runner", "--config", str(Path(config.root) / "quiver.yaml"),
           "--bounded", "--parallelism", "1", "--log-level", "warning"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=str(REPO),
                          env={**os.environ, PASSWORD_VARIABLE: password})


@pytest.mark.parametrize("protocol", ["SASL_PLAINTEXT", "SSL"])
def test_the_stream_job_reads_a_secured_listener_and_writes_redis(
        tmp_path: Path, secured: SecuredKafka, redis_for_module: RedisServer,  # noqa: F811
        protocol: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PASSWORD_VARIABLE, "secret")
    topic = f"tx-{protocol.lower()}"
    # A project per listener: one Redis holds both runs' values.
    config = write_project(tmp_path, redis_for_module.url, topic, kafka_section(secured, protocol),
                           project=f"secured_{protocol.lower()}")
    kafka = config.kafka
    bootstrap = kafka.bootstrap
    # Quiver's Python clients through the same listener and settings: the topic, the records, the offsets.
    create_topic(bootstrap, topic, 2, kafka)
    start_us = (int(time.time()) - 3600) * 1_000_000
    events = [(i % USERS, start_us + i * 60_000_000, float(i + 1)) for i in range(EVENTS)]
    records = [(str(user).encode(), b'{"ts_us": %d, "user_id": %d, "amount": %r}' % (ts, user, amount))
               for user, ts, amount in events]
    assert produce(bootstrap, topic, records, kafka=kafka) == EVENTS
    assert sum(end_offsets(bootstrap, topic, kafka).values()) == EVENTS

    result = run_stream(config)
    assert result.returncode == 0, f"the job failed:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    at = events[-1][1] + 60_000_000
    with FeatureStore(config=config) as store:
        online = store.get_online_features(["spend:amount_sum_1d", "spend:amount_count_1d"],
                                           {"user_id": list(range(USERS))}, at=at).to_dict()
    assert [float(v) for v in online["amount_sum_1d"]] == [
        sum(a for u, _, a in events if u == user) for user in range(USERS)]
    assert [int(v) for v in online["amount_count_1d"]] == [EVENTS // USERS] * USERS


@pytest.mark.parametrize(("case", "expected"), [
    ("wrong password", "error: Kafka at {bootstrap}: authentication failed (SASL PLAIN as 'alice'): Authentication "
                       "failed: Invalid username or password"),
    ("untrusted certificate", "error: Kafka at {bootstrap}: TLS handshake failed: the broker's certificate is not "
                              "trusted by {stranger} (error:0A000086:SSL routines::certificate verify failed)"),
    ("nobody there", "error: Kafka at {bootstrap}: no broker answered within 10 s (security.protocol SASL_SSL): "
                     "Connect to ipv4#{bootstrap} failed: Connection refused"),
])
def test_a_refused_or_absent_cluster_is_one_clear_line_and_a_failed_run(
        tmp_path: Path, secured: SecuredKafka, redis_for_module: RedisServer,  # noqa: F811
        case: str, expected: str) -> None:
    if case == "wrong password":
        section = kafka_section(secured, "SASL_PLAINTEXT")
    elif case == "untrusted certificate":
        section = kafka_section(secured, "SSL", ca=secured.stranger.ca)
    else:  # port 1: privileged, nothing listens there on a test machine
        section = kafka_section(secured, "SASL_SSL").replace(secured.broker.bootstrap_for("SASL_SSL"),
                                                             "127.0.0.1:1")
    config = write_project(tmp_path, redis_for_module.url, "never-read", section)
    began = time.monotonic()
    result = run_stream(config, password="wrong", timeout=120)
    took = time.monotonic() - began
    bootstrap = config.kafka_bootstrap
    assert result.returncode == 2, f"{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [expected.format(bootstrap=bootstrap, stranger=secured.stranger.ca)], (result.stderr, took)
