"""What a Kafka source compiles to: scoped consumer groups, startup modes, client properties, event time from a
named field or the record's timestamp, per-source future tolerance, idleness and watermark alignment; and the
binding mistakes refused at apply with the definition's file and line."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from quiver import KAFKA_TIMESTAMP, Aggregation, Entity, FeatureView, Source, StreamBinding
from quiver.catalog.errors import CatalogError, QuiverError
from quiver.catalog.ir import Catalog
from quiver.catalog.loader import catalog_from_dict
from quiver.catalog.validate import build_catalog
from quiver.compile.flink import FlinkTarget, compile_flink
from quiver.compile.flink_sources import startup_options
from quiver.config import Config, KafkaSettings
from quiver.streaming.options import kafka_target, startup_mode

COLUMNS = {"user_id": "int64", "amount": "float64", "ts": "timestamp"}
TARGET = FlinkTarget(inbox={}, sink_root="file:///sinks", kafka=True, kafka_bootstrap="k:9092")


def catalog(**binding: object) -> Catalog:
    user = Entity("user", ["user_id"])
    tx = Source("tx", "tx", timestamp_field="ts", stream=StreamBinding(**{"kafka_topic": "tx", **binding}))  # type: ignore[arg-type]
    spend = FeatureView("spend", [user], tx, aggregations=[Aggregation("amount", "sum", "1h")])
    return build_catalog([user, tx, spend], schema_reader=lambda s: dict(COLUMNS))


def source_ddl(cat: Catalog, target: FlinkTarget = TARGET) -> str:
    return next(s for s in compile_flink(cat, target).statements if s.startswith("CREATE TABLE `src__tx`"))


def parsed_view(cat: Catalog, target: FlinkTarget = TARGET) -> str:
    return next(s for s in compile_flink(cat, target).statements if "`tx__parsed` AS" in s)


def test_consumer_groups_are_scoped_by_project_so_two_projects_never_share_offsets() -> None:
    a = Config(project="fraud", kafka_bootstrap="k:9092")
    b = Config(project="ads", kafka_bootstrap="k:9092")
    assert kafka_target(a, ["tx"])["kafka_groups"] == {"tx": "quiver.fraud.tx"}
    assert kafka_target(b, ["tx"])["kafka_groups"] == {"tx": "quiver.ads.tx"}
    assert KafkaSettings(group_prefix="team.prod").group("fraud", "tx") == "team.prod.tx"
    ddl = source_ddl(catalog(), FlinkTarget(**{**TARGET.__dict__, **kafka_target(a, ["tx"])}))
    assert "'properties.group.id' = 'quiver.fraud.tx'" in ddl
    assert "quiver-tx" not in ddl  # the old, unscoped name


@pytest.mark.parametrize(("startup", "options"), [
    ("earliest", [("scan.startup.mode", "earliest-offset")]),
    ("latest", [("scan.startup.mode", "latest-offset")]),
    ("group-offsets", [("scan.startup.mode", "group-offsets"), ("properties.auto.offset.reset", "earliest")]),
    ("timestamp:1796638500000", [("scan.startup.mode", "timestamp"),
                                 ("scan.startup.timestamp-millis", "1796638500000")]),
])
def test_startup_modes(startup: str, options: list[tuple[str, str]]) -> None:
    assert startup_options(startup) == options
    ddl = source_ddl(catalog(), FlinkTarget(**{**TARGET.__dict__, "kafka_startup": startup}))
    assert all(f"'{k}' = '{v}'" in ddl for k, v in options)


def test_startup_is_read_from_the_command_line_with_a_clear_error() -> None:
    assert startup_mode("Latest") == "latest"
    assert startup_mode("timestamp:2026-12-07T10:15:00Z") == "timestamp:1796638500000"
    assert startup_mode("timestamp:1796638500000") == "timestamp:1796638500000"
    for bad in ("newest", "timestamp:yesterday", "timestamp:2026-12-07T10:15:00"):  # the last has no zone
        with pytest.raises(QuiverError, match="expected earliest, latest, group-offsets or timestamp"):
            startup_mode(bad)


def test_client_properties_reach_the_source_and_are_redacted_when_shown() -> None:
    config = Config(kafka_bootstrap="k:9093", kafka_properties={
        "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
        "sasl.jaas.config": 'org.apache.kafka.common.security.plain.PlainLoginModule required username="u" '
                            'password="p";'})
    ddl = source_ddl(catalog(), FlinkTarget(**{**TARGET.__dict__, **kafka_target(config, ["tx"])}))
    assert "'properties.security.protocol' = 'SASL_SSL'" in ddl and "password=\"p\"" in ddl
    shown = source_ddl(catalog(), FlinkTarget(**{**TARGET.__dict__, **kafka_target(config, ["tx"], redact=True)}))
    assert "'properties.sasl.jaas.config' = '<redacted>'" in shown and "password" not in shown.split("jaas")[1]


def test_a_topic_without_brokers_is_refused_not_read_from_localhost() -> None:
    with pytest.raises(QuiverError, match="reads Kafka topic 'tx', but no brokers are set"):
        compile_flink(catalog(), FlinkTarget(inbox={}, sink_root="file:///s", kafka=True))
    assert "'properties.bootstrap.servers' = 'b:1'" in source_ddl(
        catalog(kafka_bootstrap_servers="b:1"), FlinkTarget(inbox={}, sink_root="file:///s", kafka=True))


def test_event_time_from_a_named_field_in_its_format() -> None:
    ddl = source_ddl(catalog(event_time="ts", event_time_format="iso8601"))
    assert "quiver_parse(`line`, '@ts=iso8601;user_id:int64,amount:float64')" in ddl
    assert "epoch_ms" in source_ddl(catalog(event_time="at", event_time_format="epoch_ms"))


def test_event_time_from_the_records_timestamp() -> None:
    cat = catalog(event_time=KAFKA_TIMESTAMP)
    ddl = source_ddl(cat)
    assert "`__kafka_ts` TIMESTAMP_LTZ(3) METADATA FROM 'timestamp' VIRTUAL" in ddl
    assert "CAST(TIMESTAMPDIFF(SECOND, TO_TIMESTAMP_LTZ(0, 3), `__kafka_ts`) AS BIGINT) * 1000000" in ddl
    parsed = parsed_view(cat)
    assert "'@;user_id:int64,amount:float64'" in parsed  # the parser reads no time field
    assert "EXTRACT(MILLISECOND FROM `__kafka_ts`) * 1000) AS `__ts_us`" in parsed
    assert "SELECT `line`, `__rowtime`, `__kafka_ts`, quiver_parse(" in parsed


def test_future_tolerance_is_per_source_and_future_records_take_the_batch_route() -> None:
    assert "+ 300000000" in source_ddl(catalog())  # 5 minutes by default
    assert "+ 60000000" in source_ddl(catalog(max_future="1m"))
    assert "+ 2000000" in source_ddl(catalog(max_future="1m"), FlinkTarget(**{**TARGET.__dict__, "max_future_ms": 2000}))
    job = compile_flink(catalog(), TARGET)
    parsed = parsed_view(catalog())
    assert "event_ts_in_future" not in job.script()  # no longer a quarantine reason
    assert "NOT (`__ts_us` <= (UNIX_TIMESTAMP() + 1) * 1000000 + 300000000) AS `__future`" in parsed
    [late] = [i for i in job.inserts if i.startswith("INSERT INTO `late__tx`")]
    assert "(`__future` OR (CURRENT_WATERMARK(`__rowtime`)" in late
    on_time = next(s for s in job.statements if "`tx__events` AS" in s)
    assert "AND NOT (`__future` OR" in on_time


def test_idleness_and_watermark_alignment_per_source() -> None:
    ddl = source_ddl(catalog(idle_timeout="15s", watermark_alignment="30s"))
    assert "'scan.watermark.idle-timeout' = '15000 ms'" in ddl
    assert "'scan.watermark.alignment.group' = 'quiver'" in ddl
    assert "'scan.watermark.alignment.max-drift' = '30000 ms'" in ddl
    plain = source_ddl(catalog())
    assert "idle-timeout" not in plain and "alignment" not in plain


def test_new_binding_options_at_their_defaults_keep_the_catalogs_version() -> None:
    stream = catalog().sources["tx"].stream
    assert stream is not None and stream.max_future_us == 300_000_000
    # Exactly the keys a catalog had before these options: its version hash (and what the registry stores) holds.
    assert set(catalog().to_dict()["source"]["tx"]["stream"]) == {
        "path", "format", "kafka_topic", "kafka_bootstrap_servers", "watermark_delay_us", "allowed_lateness_us"}
    stored = catalog(max_future="1m", event_time="at")
    assert catalog_from_dict(stored.to_dict()).to_dict() == stored.to_dict()  # what the registry reads back
    assert catalog(max_future="1m").to_dict()["source"]["tx"]["stream"]["max_future_us"] == 60_000_000


@pytest.mark.parametrize(("binding", "message"), [
    ({"format": "csv"}, "stream format 'csv': the stream reads JSON records only"),
    ({"event_time_format": "iso"}, "event_time_format 'iso' is not one of epoch_s, epoch_ms, epoch_us, iso8601"),
    ({"event_time_format": "epoch_ms"}, "event_time_format needs event_time"),
    ({"event_time": "at", "path": "stream/tx"}, "event_time 'at' applies to Kafka records"),
    ({"event_time": KAFKA_TIMESTAMP, "event_time_format": "epoch_ms"}, "does not apply to KAFKA_TIMESTAMP"),
    ({"event_time": "a.b"}, "must be a top-level JSON field name"),
    ({"event_time": "amount"}, "event_time 'amount' is another column of the source"),
    ({"max_future": "soon"}, "max_future:"),
    ({"idle_timeout": timedelta(seconds=-1)}, "idle_timeout must not be negative"),
])
def test_binding_mistakes_are_refused_at_apply_with_file_and_line(binding: dict[str, object], message: str) -> None:
    with pytest.raises(CatalogError) as info:
        catalog(**binding)
    text = str(info.value)
    assert message in text
    assert f"{Path(__file__).name}:" in text  # where the source was defined


def test_a_rotated_password_or_a_new_start_keeps_the_jobs_checkpoints() -> None:
    """The checkpoint identity leaves out client settings, the group and the start (a password rotation must not
    replay the topic from scratch); other brokers are another cluster's offsets, so a fresh job."""
    from quiver.streaming.job import job_hash

    def job(**target: object) -> str:
        return job_hash(compile_flink(catalog(), FlinkTarget(**{**TARGET.__dict__, **target})))

    base = job(kafka_properties=(("sasl.jaas.config", 'x password="old";'),))
    assert job(kafka_properties=(("sasl.jaas.config", 'x password="new";'), ("ssl.truststore.type", "PEM")),
               kafka_groups={"tx": "team.tx"}, kafka_startup="latest") == base
    assert job(kafka_bootstrap="other:9092") != base
    assert job(max_future_ms=0) != base  # what the job computes still counts

