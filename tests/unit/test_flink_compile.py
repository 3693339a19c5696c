"""The Flink SQL compiler without Flink: which views stream, names, intervals, state TTL, errors."""

from __future__ import annotations

import pytest

from quiver import Aggregation, Entity, FeatureView, Field, Float64, Source, StreamBinding
from quiver.catalog.errors import QuiverError
from quiver.catalog.validate import build_catalog
from quiver.compile.flink import FlinkTarget, _interval, compile_flink, state_ttl_ms, streamed_views

COLUMNS = {"user_id": "int64", "amount": "float64", "ts": "timestamp", "ts_ms": "int64", "__x": "float64"}
TARGET = FlinkTarget(inbox={"tx": "file:///in/tx", "other": "file:///in/other"}, sink_root="file:///sinks")


def catalog(*views_extra: object, stream: StreamBinding | None = None):  # type: ignore[no-untyped-def]
    user = Entity("user", ["user_id"])
    tx = Source("tx", "tx", timestamp_field="ts",
                stream=stream or StreamBinding(path="stream/tx", watermark_delay="2s", allowed_lateness="10m"))
    batch_only = Source("other", "other", timestamp_field="ts")
    views = [
        FeatureView("spend", [user], tx, aggregations=[Aggregation("amount", "sum", "1h"),
                                                       Aggregation("amount", "max", "1d")], tile="5m"),
        FeatureView("last_tx", [user], tx, schema=[Field("amount", Float64)], ttl="2d"),
        FeatureView("offline", [user], tx, aggregations=[Aggregation("amount", "sum", "1h")], online=False),
        FeatureView("no_stream", [user], batch_only, aggregations=[Aggregation("amount", "sum", "1h")]),
        *views_extra,
    ]
    return build_catalog([user, tx, batch_only, *views], schema_reader=lambda s: dict(COLUMNS))


def test_streamed_views_are_online_views_with_a_stream_binding() -> None:
    cat = catalog()
    assert [v.name for v in streamed_views(cat)] == ["last_tx", "spend"]
    with pytest.raises(QuiverError, match="no stream binding"):
        streamed_views(cat, ["no_stream"])
    with pytest.raises(QuiverError, match="unknown feature view"):
        streamed_views(cat, ["nope"])


def test_job_has_one_pipeline_per_source_and_one_insert_per_view() -> None:
    job = compile_flink(catalog(), TARGET)
    assert job.views == ("last_tx", "spend") and job.sources == ("tx",)
    targets = [i.split("`")[1] for i in job.inserts]
    assert targets == ["late__tx", "quarantine__tx", "last__last_tx", "tiles__spend"]
    script = job.script()
    assert "'path' = 'file:///sinks/tiles/spend'" in script and "'format' = 'debezium-json'" in script
    assert "'source.monitor-interval' = '100 ms'" not in script  # the target says 200 ms by default
    assert "'source.monitor-interval' = '200 ms'" in script
    assert "(`__ts_ms` - MOD(`__ts_ms`, 300000)) * 1000 AS `tile_start`" in script  # 5 min tiles, in µs
    assert "INTERVAL '0 00:10:00.000' DAY TO SECOND(3)" in script  # allowed lateness
    assert ("SET 'table.exec.mini-batch.enabled' = 'false';" in script
            and script.rstrip().endswith("END;"))


def test_state_ttl_covers_the_longest_window_and_the_lateness() -> None:
    cat = catalog()
    views = streamed_views(cat)
    # spend: 1 d window + 5 min tile; last_tx: 2 d ttl; plus 10 min lateness and 2 s watermark delay.
    assert state_ttl_ms(cat, views) == (2 * 86_400 + 600 + 2) * 1000
    assert state_ttl_ms(cat, [cat.views["spend"]]) == (86_400 + 300 + 600 + 2) * 1000


def test_intervals_are_day_to_second_literals() -> None:
    assert _interval(2_000_000) == "INTERVAL '0 00:00:02.000' DAY TO SECOND(3)"
    assert _interval((86_400 + 3_723) * 1_000_000 + 456_000) == "INTERVAL '1 01:02:03.456' DAY TO SECOND(3)"
    with pytest.raises(QuiverError, match="too long"):
        _interval(100 * 86_400 * 1_000_000)


def test_reserved_stream_names_are_refused() -> None:
    user = Entity("user", ["user_id"])
    clicks = Source("clicks", "clicks", timestamp_field="ts", stream=StreamBinding(path="s"))
    view = FeatureView("bad", [user], clicks, aggregations=[Aggregation("ts_ms", "sum", "1h")])
    with pytest.raises(QuiverError, match="reserved for streaming"):
        compile_flink(catalog(view), FlinkTarget(inbox={"clicks": "file:///in"}, sink_root="file:///s"), ["bad"])


def test_kafka_needs_a_topic_and_renders_the_connector() -> None:
    kafka = FlinkTarget(inbox={}, sink_root="file:///sinks", kafka=True)
    with pytest.raises(QuiverError, match="no kafka_topic"):
        compile_flink(catalog(), kafka)
    cat = catalog(stream=StreamBinding(kafka_topic="tx-events", kafka_bootstrap_servers="k:9092"))
    script = compile_flink(cat, kafka).script()
    assert "'connector' = 'kafka'" in script and "'topic' = 'tx-events'" in script
    assert "'properties.bootstrap.servers' = 'k:9092'" in script


def test_nothing_to_stream_is_a_user_error() -> None:
    user = Entity("user", ["user_id"])
    src = Source("other", "other", timestamp_field="ts")
    cat = build_catalog([user, src, FeatureView("v", [user], src, aggregations=[Aggregation("amount", "sum", "1h")])],
                        schema_reader=lambda s: dict(COLUMNS))
    with pytest.raises(QuiverError, match="no feature view to stream"):
        compile_flink(cat, TARGET)
