"""The shared online-record vectors still describe the Python codec, byte for byte (the Flink sink's JUnit test
holds the Java encoder to the same file), and the sink's options are what the Java factory expects."""

from __future__ import annotations

import json
import math

import pytest

from quiver import Aggregation, Entity, FeatureView, Field, Float64, Source
from quiver.catalog.validate import build_catalog
from quiver.online.jvm_sink import CONNECTOR, markers_key, sink_layout, sink_options
from quiver.online.layout import key_prefix, meta_key
from tests.vectors import make_online_records as vectors


def test_the_vectors_are_what_the_python_codec_writes_now() -> None:
    # A failure here is a layout change: regenerate the file (make_online_records.py) only if it is deliberate,
    # and the Java encoder must follow (its JUnit test reads the same file).
    assert vectors.OUT.read_text(encoding="utf-8") == vectors.render()


def test_the_vectors_hold_the_edge_cases() -> None:
    doc = json.loads(vectors.OUT.read_text(encoding="utf-8"))
    values = [v for vec in doc["vectors"] for row in vec["rows"] for v in row.values()]
    strings = [v for v in values if isinstance(v, str)]
    assert {"NaN", "Infinity", "-Infinity", ""} <= set(strings)
    assert any(len(s.encode()) > len(s) for s in strings)  # multibyte UTF-8
    assert None in values and any(isinstance(v, int) and v < 0 and abs(v) > 10**13 for v in values)  # pre-1970
    assert {vec["layout"]["kind"] for vec in doc["vectors"]} == {"tiles", "last"}
    assert any(vec["layout"]["var_len_offset"] for vec in doc["vectors"])
    assert any(vec["markers"] for vec in doc["vectors"]) and any(vec["dropped"] for vec in doc["vectors"])
    assert all(not isinstance(v, float) or math.isfinite(v) for v in values)  # strict JSON for the Java reader


@pytest.fixture(scope="module")
def views():
    user = Entity("user", ["user_id"])
    src = Source("tx", "unused")
    last = FeatureView("last", [user], src, ttl="1h", schema=[Field("amount", Float64)])
    agg = FeatureView("agg", [user], src, tile="10m", aggregations=[Aggregation("amount", "sum", "1h")])
    columns = {"user_id": "int64", "event_ts": "timestamp", "amount": "float64"}
    return build_catalog([user, src, last, agg], schema_reader=lambda s: columns).views


def test_layouts_come_from_layout_py(views) -> None:
    last, agg = views["last"], views["agg"]
    lay = sink_layout(last, "p")
    assert lay["key_prefix"] == key_prefix("p", last).decode() and lay["meta_key"] == meta_key("p", "last").decode()
    assert [(f["column"], f["slot"], f["offset"], f["null_bit"]) for f in lay["fields"]] == [
        ("event_ts", "<i8", 0, None), ("amount", "<f8", 8, 0)]
    assert lay["width"] == 17 and lay["null_bitmap"] == {"offset": 16, "bytes": 1} and lay["script"] == "last"
    tiles = sink_layout(agg, "p")
    assert [f["column"] for f in tiles["fields"]] == ["tile_start", "n_events", "amount__cnt", "amount__sum"]
    assert tiles["script"] == "tile" and tiles["trim_horizon_us"] == 70 * 60_000_000 and tiles["width"] == 32
    assert tiles["newest_column"] == "__newest_us" and tiles["var_len_offset"] == 0


def test_sink_options_are_the_with_clause(views) -> None:
    options = sink_options(views["agg"], "tiles", "redis://h:6379/0", project="p",
                           markers_key=markers_key("p", "tx"), buffer_rows=100)
    assert options["connector"] == CONNECTOR == "quiver-redis"
    assert options["markers.key"] == "q:p:_markers:tx" and options["buffer.rows"] == "100"
    assert json.loads(options["layout"]) == sink_layout(views["agg"], "p")
    assert "markers.key" not in sink_options(views["last"], "last", "redis://h:6379/0")
    with pytest.raises(ValueError, match="no 'last' sink"):
        sink_options(views["agg"], "last", "redis://h:6379/0")
    with pytest.raises(ValueError, match="buffer_rows"):
        sink_options(views["last"], "last", "redis://h:6379/0", buffer_rows=0)
    assert "flush.interval" not in options  # only on checkpoints unless asked
    timed = sink_options(views["last"], "last", "redis://h:6379/0", flush_interval_ms=200)
    assert timed["flush.interval"] == "200 ms"
    with pytest.raises(ValueError, match="flush_interval_ms"):
        sink_options(views["last"], "last", "redis://h:6379/0", flush_interval_ms=-1)
    assert options["write.in-flight"] == "2"  # written on the sink's own thread unless asked
    assert sink_options(views["last"], "last", "redis://h:6379/0", in_flight=0)["write.in-flight"] == "0"
    with pytest.raises(ValueError, match="in_flight"):
        sink_options(views["last"], "last", "redis://h:6379/0", in_flight=-1)
