"""The Flink SQL compiler without Flink: which views stream, names, intervals, state TTL, errors."""

from __future__ import annotations

import pytest

from quiver import Aggregation, Entity, FeatureView, Field, Float64, Source, StreamBinding
from quiver.catalog.errors import QuiverError
from quiver.catalog.validate import build_catalog
from quiver.compile.flink import FlinkTarget, compile_flink, state_ttl_ms, streamed_views
from quiver.compile.flink_sources import PARSE_CLASS
from quiver.compile.flink_sql import interval

COLUMNS = {"user_id": "int64", "amount": "float64", "ts": "timestamp", "ts_ms": "int64", "__x": "float64",
           "flag": "bool"}
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
    assert targets == ["last__last_tx", "tiles__spend"]  # the feeder did the checks and the late split
    script = job.script()
    assert "'path' = 'file:///sinks/tiles/spend'" in script and "'format' = 'debezium-json'" in script
    assert "'source.monitor-interval' = '100 ms'" not in script  # the target says 200 ms by default
    assert "'source.monitor-interval' = '200 ms'" in script
    assert "'json.ignore-parse-errors' = 'false'" in script  # nothing is skipped silently
    assert "CURRENT_WATERMARK" not in script and "WATERMARK FOR" not in script and "TRY_CAST" not in script
    assert ("SET 'table.exec.mini-batch.enabled' = 'false';" in script
            and script.rstrip().endswith("END;"))
    # The first view of the source carries the batch markers as part of its key.
    assert "PARTITION BY `user_id`, `__batch`" in script


def test_no_query_filters_the_file_source() -> None:
    """A filter is pushed into the file scan, and scans with different filters are not shared: every
    INSERT would parse every file again. So the local job has no WHERE before its aggregations."""
    script = compile_flink(catalog(), TARGET).script()
    body = script.split("EXECUTE STATEMENT SET BEGIN")[1]
    assert "WHERE `__rank` = 1" in body and body.count("WHERE") == 1
    assert "WHERE" not in script.split("CREATE TEMPORARY VIEW `tx__events`")[1].split(";")[0]


def test_tiles_floor_event_times_in_microseconds_also_before_1970() -> None:
    script = compile_flink(catalog(), TARGET).script()
    # floor(t / g) * g for negative t too (SQL MOD truncates toward zero); 5 min tiles in µs.
    assert "`__ts_us` - MOD(MOD(`__ts_us`, 300000000) + 300000000, 300000000) AS `tile_start`" in script
    assert "COALESCE(`ts_us`, `ts_ms` * 1000) AS `__ts_us`" in script  # older ms producers still read


def test_float_min_max_and_last_treat_nan_as_the_greatest_value() -> None:
    script = compile_flink(catalog(), TARGET).script()
    assert "COUNT(CASE WHEN ABS(`amount`) >= 0 THEN CAST(NULL AS DOUBLE) ELSE `amount` END) AS `amount__nan`" in script
    assert "NOT (ABS(" not in script  # Calcite would turn it into ABS(x) < 0, false for NaN as well
    assert "MAX(CASE WHEN ABS(`amount`) >= 0 THEN `amount` END) AS `amount__max`" in script
    assert "CASE WHEN `amount__nan` > 0 THEN CAST('NaN' AS DOUBLE) ELSE `amount__max` END" in script


def test_mini_batch_is_allowed_locally_but_never_with_the_watermark_split() -> None:
    local = compile_flink(catalog(), FlinkTarget(inbox=TARGET.inbox, sink_root="file:///s", mini_batch_ms=500))
    assert ("table.exec.mini-batch.enabled", "true") in local.settings
    assert ("table.exec.mini-batch.allow-latency", "500 ms") in local.settings
    cat = catalog(stream=StreamBinding(kafka_topic="tx-events"))
    kafka = compile_flink(cat, FlinkTarget(inbox={}, sink_root="file:///s", kafka=True, kafka_bootstrap="k:9092",
                                           mini_batch_ms=500))
    assert ("table.exec.mini-batch.enabled", "false") in kafka.settings
    assert "CURRENT_WATERMARK(`__rowtime`)" in kafka.script()


def test_state_ttl_covers_the_longest_window_and_the_lateness() -> None:
    cat = catalog()
    views = streamed_views(cat)
    # spend: 1 d window + 5 min tile; last_tx: 2 d ttl; plus 10 min lateness and 2 s watermark delay.
    assert state_ttl_ms(cat, views) == (2 * 86_400 + 600 + 2) * 1000
    assert state_ttl_ms(cat, [cat.views["spend"]]) == (86_400 + 300 + 600 + 2) * 1000


def test_intervals_are_day_to_second_literals() -> None:
    assert interval(2_000_000) == "INTERVAL '0 00:00:02.000' DAY TO SECOND(3)"
    assert interval((86_400 + 3_723) * 1_000_000 + 456_000) == "INTERVAL '1 01:02:03.456' DAY TO SECOND(3)"
    with pytest.raises(QuiverError, match="too long"):
        interval(100 * 86_400 * 1_000_000)


def test_reserved_stream_names_are_refused() -> None:
    user = Entity("user", ["user_id"])
    clicks = Source("clicks", "clicks", timestamp_field="ts", stream=StreamBinding(path="s"))
    view = FeatureView("bad", [user], clicks, aggregations=[Aggregation("ts_ms", "sum", "1h"),
                                                            Aggregation("flag", "count", "1h")])
    with pytest.raises(QuiverError, match="reserved for streaming"):
        compile_flink(catalog(view), FlinkTarget(inbox={"clicks": "file:///in"}, sink_root="file:///s"), ["bad"])


def test_kafka_needs_a_topic_and_renders_the_connector() -> None:
    kafka = FlinkTarget(inbox={}, sink_root="file:///sinks", kafka=True, kafka_bootstrap="k:9092")
    with pytest.raises(QuiverError, match="no kafka_topic"):
        compile_flink(catalog(), kafka)
    cat = catalog(stream=StreamBinding(kafka_topic="tx-events", kafka_bootstrap_servers="k:9092"))
    script = compile_flink(cat, kafka).script()
    assert "'connector' = 'kafka'" in script and "'topic' = 'tx-events'" in script
    assert "'properties.bootstrap.servers' = 'k:9092'" in script
    # Malformed records are quarantined, never skipped by the format: each record is read as a string.
    assert "'format' = 'raw'" in script and "ignore-parse-errors" not in script
    # Each record is parsed by our JVM function (registered before the source that calls it), not by SQL's
    # JSON_VALUE; its type problem (unparseable_json, null_event_ts, bad_type:<col>) comes first in `__problem`.
    job = compile_flink(cat, kafka)
    assert job.statements[0].startswith(f"CREATE TEMPORARY SYSTEM FUNCTION IF NOT EXISTS quiver_parse AS '{PARSE_CLASS}'")
    assert "JSON_VALUE" not in script and "IS JSON" not in script
    parsed = next(s for s in job.statements if "__parsed` AS" in s)
    assert parsed.count("quiver_parse(") == 1
    assert "WHEN `__reason` IS NOT NULL THEN `__reason`" in parsed


def test_nothing_to_stream_is_a_user_error() -> None:
    user = Entity("user", ["user_id"])
    src = Source("other", "other", timestamp_field="ts")
    cat = build_catalog([user, src, FeatureView("v", [user], src, aggregations=[Aggregation("amount", "sum", "1h")])],
                        schema_reader=lambda s: dict(COLUMNS))
    with pytest.raises(QuiverError, match="no feature view to stream"):
        compile_flink(cat, TARGET)
