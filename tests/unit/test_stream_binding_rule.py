"""Which a stream job reads, Kafka or files, by the binding rule (`StreamSpec.reads_kafka`): a binding that
names a topic reads it when brokers are known (config `kafka_bootstrap`, which wins, or the binding's
`kafka_bootstrap_servers`), or when it has no path; otherwise the files at its path. No broker, no Flink: the
runner is only built (its job compiled), never run."""

from __future__ import annotations

from pathlib import Path

import pytest

from quiver import Aggregation, Entity, FeatureView, Source, StreamBinding
from quiver.catalog.errors import QuiverError
from quiver.catalog.ir import Catalog, StreamSpec
from quiver.catalog.loader import load_catalog
from quiver.catalog.validate import build_catalog
from quiver.config import Config
from quiver.streaming.options import StreamOptions
from quiver.streaming.paths import StreamPaths
from quiver.streaming.runner import StreamRunner

REPO = Path(__file__).resolve().parents[2]
COLUMNS = {"user_id": "int64", "amount": "float64", "ts": "timestamp"}


def spec(path: str = "", topic: str = "", servers: str = "") -> StreamSpec:
    return StreamSpec(path, "json", topic, servers, 0, 0)


@pytest.mark.parametrize(("binding", "bootstrap", "kafka", "brokers"), [
    (spec(path="in"), "", False, ""),
    (spec(path="in"), "b:9092", False, "b:9092"),  # no topic: files, whatever brokers are known
    (spec(topic="t"), "", True, ""),  # only a topic: Kafka, as before, but no silent localhost:9092 (refused)
    (spec(topic="t", servers="s:9092"), "b:9092", True, "b:9092"),  # the config's brokers win
    (spec(path="in", topic="t"), "", False, ""),  # both, no brokers known: the files
    (spec(path="in", topic="t"), "b:9092", True, "b:9092"),  # both, brokers configured: the topic
    (spec(path="in", topic="t", servers="s:9092"), "", True, "s:9092"),  # both, the binding's own brokers
])
def test_a_binding_reads_its_topic_when_brokers_are_known_else_its_files(
        binding: StreamSpec, bootstrap: str, kafka: bool, brokers: str) -> None:
    assert binding.reads_kafka(bootstrap) is kafka
    assert binding.brokers(bootstrap) == brokers


def two_sources(first: StreamBinding, second: StreamBinding) -> Catalog:
    user = Entity("user", ["user_id"])
    tx = Source("tx", "tx", timestamp_field="ts", stream=first)
    refunds = Source("refunds", "refunds", timestamp_field="ts", stream=second)
    views = [FeatureView("spend", [user], tx, aggregations=[Aggregation("amount", "sum", "1h")]),
             FeatureView("refunded", [user], refunds, aggregations=[Aggregation("amount", "sum", "1h")])]
    return build_catalog([user, tx, refunds, *views], schema_reader=lambda s: dict(COLUMNS))


def runner(tmp_path: Path, catalog: Catalog, bootstrap: str, views: tuple[str, ...] | None = None) -> StreamRunner:
    config = Config(root=tmp_path, kafka_bootstrap=bootstrap)
    return StreamRunner(config, catalog, StreamPaths.at(tmp_path / "state"), StreamOptions(bounded=True, views=views))


@pytest.fixture(autouse=True)
def _connector_jar(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    jar = tmp_path / "flink-sql-connector-kafka-5.0.0-2.2.jar"  # found, never loaded: nothing runs here
    jar.write_bytes(b"PK")
    monkeypatch.setenv("QUIVER_FLINK_JARS", str(jar))


def source_table(runner: StreamRunner, source: str) -> str:
    """The job's CREATE TABLE statement of `source`'s input."""
    return next(s for s in runner.job.statements if s.startswith(f"CREATE TABLE `src__{source}`"))


def test_the_runner_reads_the_topic_only_once_brokers_are_known(tmp_path: Path) -> None:
    catalog = two_sources(StreamBinding(path="stream/tx", kafka_topic="tx-events"),
                          StreamBinding(path="stream/refunds", kafka_topic="refunds"))
    files = runner(tmp_path, catalog, "")
    assert not files.kafka and files.topics is None
    assert files.streams == {"refunds": tmp_path / "stream/refunds", "tx": tmp_path / "stream/tx"}
    assert "'connector' = 'filesystem'" in source_table(files, "tx") and "kafka" not in files.job.script()
    kafka = runner(tmp_path, catalog, "127.0.0.1:19092")
    assert kafka.kafka and kafka.streams == {}
    assert kafka.topics is not None and {t.bootstrap for t in kafka.topics.topics} == {"127.0.0.1:19092"}
    table = source_table(kafka, "tx")
    assert "'connector' = 'kafka'" in table and "'topic' = 'tx-events'" in table
    assert "'properties.bootstrap.servers' = '127.0.0.1:19092'" in table


def test_a_job_mixing_topics_and_files_is_still_refused(tmp_path: Path) -> None:
    catalog = two_sources(StreamBinding(path="stream/tx", kafka_topic="tx-events"), StreamBinding(path="stream/r"))
    assert not runner(tmp_path, catalog, "").kafka  # no brokers: both read files, one job
    with pytest.raises(QuiverError, match="separate jobs"):
        runner(tmp_path, catalog, "127.0.0.1:19092")
    assert runner(tmp_path, catalog, "127.0.0.1:19092", views=("spend",)).kafka  # one source per job: fine
    assert not runner(tmp_path, catalog, "127.0.0.1:19092", views=("refunded",)).kafka


def test_the_example_catalog_streams_files_until_told_its_brokers() -> None:
    """The README's `quiver stream --bounded` reads the stream files; the demo's step 8 sets
    QUIVER_KAFKA_BOOTSTRAP to its embedded broker and the same binding reads the topic."""
    columns = {"transactions": {"user_id": "int64", "merchant_id": "int64", "amount": "float64",
                                "category": "string", "is_online": "bool", "event_ts": "timestamp"},
               "user_profiles": {"user_id": "int64", "account_age_days": "int64", "credit_limit": "float64",
                                 "country": "string", "event_ts": "timestamp"},
               "merchant_risk": {"merchant_id": "int64", "risk_score": "float64", "merchant_category": "string",
                                 "event_ts": "timestamp"}}
    catalog = load_catalog(REPO / "feature_defs", root=REPO, schema_reader=lambda s: dict(columns[s.name]))
    binding = catalog.sources["transactions"].stream
    assert binding is not None and binding.path == "data/stream/transactions" and binding.kafka_topic == "transactions"
    assert not binding.reads_kafka("") and binding.reads_kafka("127.0.0.1:9092")


def test_the_jvm_sink_takes_a_redis_it_can_reach_a_unix_socket_included(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import quiver.streaming.runner as runner_module

    monkeypatch.setattr(runner_module, "has_bundle", lambda bundle: True)  # the sink's jar, as setup builds it
    monkeypatch.setattr(runner_module, "bundle_jars", lambda bundle: [tmp_path / "redis-sink-1.jar"])
    catalog = two_sources(StreamBinding(path="stream/tx"), StreamBinding(path="stream/refunds"))

    def direct(url: str, sink: str = "auto") -> str:
        config = Config(root=tmp_path, redis_url=url)
        return StreamRunner(config, catalog, StreamPaths.at(tmp_path / "state"),
                            StreamOptions(bounded=True, sink=sink)).redis_url

    sock = "unix:///run/quiver project/.quiver/redis/redis.sock"  # the embedded Redis; a path with a space
    assert direct(sock) == sock and direct(sock, "redis") == sock
    assert direct("redis://h:6379/0") == "redis://h:6379/0" and direct(sock, "files") == ""
    with pytest.raises(QuiverError, match=r"unix:/// URL, not memory://x: use --sink files"):
        direct("memory://x", "redis")
