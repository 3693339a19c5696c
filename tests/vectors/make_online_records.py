"""Write tests/vectors/online_records.json: sink rows → the Redis keys and record bytes of the Python codec.

Both writers of the online store are held to these bytes: tests/unit/test_online_vectors.py checks that the
Python codec still gives them, and the Flink sink's JUnit test (infra/jvm/redis-sink) that its encoder does.
Run after a deliberate layout change: `.venv/bin/python tests/vectors/make_online_records.py`.

Each vector is one flush of one view's sink: the layout JSON (`quiver.online.jvm_sink.sink_layout`), rows as
the Flink sink table holds them (timestamps as epoch µs; non-finite floats as the strings "NaN", "Infinity",
"-Infinity"), and what the Python loader does with them: the (key, value) pairs it sends, sorted by key,
`max_event_ts` it raises, the batch markers it records and the rows it drops (null key or time).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "platform")]

from quiver import Aggregation, Bool, Entity, FeatureView, Field, Float64, Int64, Source, String, Timestamp  # noqa: E402
from quiver.catalog.ir import ViewSpec  # noqa: E402
from quiver.catalog.loader import load_catalog  # noqa: E402
from quiver.catalog.validate import build_catalog  # noqa: E402
from quiver.compile.flink import BATCH_FIELD, NEWEST, streamed_views  # noqa: E402
from quiver.offline.layout import EVENT_TS  # noqa: E402
from quiver.online.codec import LastCodec, TileCodec, newest_per_entity  # noqa: E402
from quiver.online.jvm_sink import sink_layout  # noqa: E402
from quiver.online.layout import entity_keys, key_prefix  # noqa: E402
from quiver.streaming.loader import change_schema  # noqa: E402

OUT = Path(__file__).resolve().parent / "online_records.json"
PROJECT = "fraud"
H = 3_600_000_000
T0 = 1_793_491_200_000_000  # 2026-11-01
PRE_1970 = -86_400_000_000 * 365 - 1_234_567  # ~1969, not on a second boundary

# The example catalog's sources (their Parquet files need not exist to build the vectors).
EXAMPLE_COLUMNS = {
    "transactions": {"user_id": "int64", "merchant_id": "int64", "amount": "float64", "category": "string",
                     "is_online": "bool", "event_ts": "timestamp"},
    "user_profiles": {"user_id": "int64", "account_age_days": "int64", "credit_limit": "float64",
                      "country": "string", "event_ts": "timestamp"},
    "merchant_risk": {"merchant_id": "int64", "risk_score": "float64", "merchant_category": "string",
                      "event_ts": "timestamp"},
}
EDGE_COLUMNS = {"user_id": "int64", "shop": "string", "vip": "bool", "amount": "float64", "n": "int64",
                "flag": "bool", "seen": "timestamp", "note": "string", "tag": "string", "event_ts": "timestamp"}


def example_views() -> list[ViewSpec]:
    catalog = load_catalog(REPO / "feature_defs", root=REPO, schema_reader=lambda s: EXAMPLE_COLUMNS[s.name])
    return streamed_views(catalog)


def edge_views() -> dict[str, ViewSpec]:
    """Every slot type, composite and string and bool keys, string partials (var_len)."""
    user = Entity("user", ["user_id"])
    shop = Entity("shop", {"shop": String, "vip": Bool})
    src = Source("edges", "unused")
    every = FeatureView("every_type", [user, shop], src, ttl="1d", schema=[
        Field("amount", Float64), Field("n", Int64), Field("flag", Bool), Field("seen", Timestamp),
        Field("note", String), Field("tag", String)])
    wide = FeatureView("wide", [user], src, ttl="1d", schema=[Field(f"c{i}", Float64, column="amount")
                                                               for i in range(9)])
    strings = FeatureView("string_tiles", [shop], src, tile="1h", aggregations=[
        Aggregation("note", "last", "3h"), Aggregation("amount", "min", "2h"), Aggregation("n", "max", "2h"),
        Aggregation("flag", "mean", "2h"), Aggregation("tag", "last", "2h"), Aggregation("amount", "last", "2h")])
    catalog = build_catalog([user, shop, src, every, wide, strings], schema_reader=lambda s: EDGE_COLUMNS)
    return dict(catalog.views)


def example_rows(view: ViewSpec) -> list[dict[str, Any]]:
    """A few realistic rows of an example view, a replayed one, a null key and a marker."""
    if view.kind == "last":
        rows = [{"user_id": 7, EVENT_TS: T0 + 5, "last_amount": 12.5, "last_merchant_id": 3,
                 "last_category": "grocery"},
                {"user_id": 7, EVENT_TS: T0 + 9, "last_amount": 40.0, "last_merchant_id": 4, "last_category": "fuel"},
                {"user_id": 8, EVENT_TS: T0 + 1, "last_amount": 0.0, "last_merchant_id": None, "last_category": None},
                {"user_id": 7, EVENT_TS: T0 + 9, "last_amount": 40.0, "last_merchant_id": 4, "last_category": "fuel"},
                {"user_id": None, EVENT_TS: T0 + 20, "last_amount": 1.0, "last_merchant_id": 1, "last_category": "x"}]
    else:
        tile = int(view.tile_us or 0)
        rows = []
        for key, start, events in [(7, T0, 1), (7, T0, 3), (7, T0 + tile, 2), (9, T0 - tile, 5), (7, T0, 2)]:
            row: dict[str, Any] = {k: key for k in view.key_names}
            row.update({"tile_start": start, "n_events": events, NEWEST: start + events * 1000})
            row.update(_partials(view, float(events), key))
            rows.append(row)
        rows.append({**rows[0], **{k: None for k in view.key_names}, NEWEST: T0 + 10 * tile})
    rows.append({**{k: None for k in rows[0]}, BATCH_FIELD: f"batch-{view.name}-0001"})
    return rows


def _partials(view: ViewSpec, x: float, key: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for column in change_schema(view).names:
        if column.endswith("__cnt"):
            out[column] = int(x)
        elif column.endswith(("__sum", "__sumsq", "__min", "__max")):
            out[column] = x * (key + 0.25)
    return out


def edge_rows(name: str) -> list[dict[str, Any]]:
    nan, inf = math.nan, math.inf
    if name == "every_type":
        base = {"user_id": 1, "shop": "a:b%c{d}", "vip": True, "amount": 1.5, "n": -3, "flag": False,
                "seen": PRE_1970, "note": "héllo ✓ 𝄞", "tag": ""}
        return [
            {**base, EVENT_TS: T0},
            {**base, EVENT_TS: PRE_1970, "user_id": 2, "shop": "", "vip": False, "amount": nan, "n": None,
             "flag": None, "note": None, "tag": "ß"},
            {**base, EVENT_TS: T0, "user_id": -9_223_372_036_854_775_807, "amount": -inf, "n": 2**62},
            {**base, EVENT_TS: T0, "user_id": 3, "amount": -0.0, "note": "日本語"},
            # ties at one event_ts: the greatest field values win, field by field (NULL lowest, NaN greatest)
            {**base, EVENT_TS: T0 + 1, "user_id": 4, "amount": 2.0, "note": "b"},
            {**base, EVENT_TS: T0 + 1, "user_id": 4, "amount": nan, "note": "a"},
            {**base, EVENT_TS: T0 + 1, "user_id": 4, "amount": None, "note": "z"},
            {**base, EVENT_TS: T0 + 1, "user_id": 5, "amount": 2.0, "note": "ab"},
            {**base, EVENT_TS: T0 + 1, "user_id": 5, "amount": 2.0, "note": "b"},
            {**base, EVENT_TS: T0 + 1, "user_id": 5, "amount": 2.0, "note": "é"},
            {**base, EVENT_TS: T0 + 2, "user_id": 6, "amount": inf, "note": None},
            {**base, EVENT_TS: T0 + 1, "user_id": 6, "amount": 9.0, "note": "older"},
            {**base, EVENT_TS: None, "user_id": 8},  # no time: dropped like a null key
            {**base, EVENT_TS: T0, "shop": None},
        ]
    if name == "wide":  # 9 fields: a two-byte null bitmap
        return [{"user_id": 1, EVENT_TS: T0, **{f"c{i}": (None if i in (0, 8) else float(i)) for i in range(9)}},
                {"user_id": 2, EVENT_TS: T0, **{f"c{i}": None for i in range(9)}}]
    # string_tiles: var_len records, tiles out of order, duplicates, one past the trim horizon, nulls
    rows = []
    for shop, vip, start, events, note, tag in [
            ("s:1", True, T0, 2, "ünï", ""), ("s:1", True, T0 - 2 * H, 1, "old", "t"),
            ("s:1", True, T0 - 5 * H, 9, "trimmed", "x"), ("s:1", True, T0, 1, "fewer", "y"),
            ("s%2", False, PRE_1970 - PRE_1970 % H, 4, None, "🙂"), ("s:1", True, T0 - H, 3, "", None)]:
        rows.append({"shop": shop, "vip": vip, "tile_start": start, "n_events": events, NEWEST: start + 7,
                     "note__cnt": 0 if note is None else events, "note__last": note,
                     "note__last_ts": None if note is None else start + 5,
                     "amount__cnt": events, "amount__min": -0.5 * events, "amount__last": nan,
                     "amount__last_ts": start + 6, "n__cnt": 0, "n__max": None,
                     "flag__cnt": events, "flag__sum": 1.0, "tag__cnt": events, "tag__last": tag,
                     "tag__last_ts": start + 1})
    return rows


def loader_writes(view: ViewSpec, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What the Python loader and store send for these sink rows, from the real codec."""
    schema = change_schema(view)
    if view.kind == "agg":
        schema = schema.append(pa.field(NEWEST, pa.int64()))
    schema = schema.append(pa.field(BATCH_FIELD, pa.string()))
    table = pa.Table.from_pylist([{c: r.get(c) for c in schema.names} for r in rows], schema=schema)
    markers = sorted(set(pc.drop_null(table.column(BATCH_FIELD)).to_pylist()))
    table = table.filter(pc.is_null(table.column(BATCH_FIELD))).drop_columns([BATCH_FIELD])
    time_column = EVENT_TS if view.kind == "last" else "tile_start"
    valid = pc.is_valid(table.column(time_column))
    for key in view.key_names:
        valid = pc.and_(valid, pc.is_valid(table.column(key)))
    dropped = table.num_rows - int(pc.sum(valid).as_py() or 0)
    table = table.filter(valid)
    prefix = key_prefix(PROJECT, view)
    if view.kind == "last":
        newest = pc.max(table.column(EVENT_TS)).as_py()
        table = newest_per_entity(view, table.cast(_last_schema(view, table.schema)))
        values, _ = LastCodec(view).encode(table)
        keys = entity_keys(prefix, view, {k: table.column(k).to_numpy(zero_copy_only=False) for k in view.key_names})
    else:
        newest = max(pc.max(table.column(NEWEST)).as_py(), pc.max(table.column("tile_start")).as_py())
        firsts, values, _ = TileCodec(view).encode(table.drop_columns([NEWEST]))
        keys = entity_keys(prefix, view, {k: firsts.column(k).to_numpy(zero_copy_only=False) for k in view.key_names})
    writes = sorted(zip(keys, values, strict=True))
    return {"writes": [{"key": k.decode(), "value": v.hex()} for k, v in writes],
            "max_event_ts": newest, "markers": markers, "dropped": dropped}


def _last_schema(view: ViewSpec, schema: pa.Schema) -> pa.Schema:
    ts = pa.timestamp("us", tz="UTC")
    timestamps = {EVENT_TS} | {f.name for f in view.fields if f.dtype == "timestamp"}
    return pa.schema([pa.field(f.name, ts) if f.name in timestamps else f for f in schema])


def _json_value(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value


def vectors() -> list[dict[str, Any]]:
    cases = [(view, example_rows(view)) for view in example_views()]
    edges = edge_views()
    cases += [(edges[name], edge_rows(name)) for name in ("every_type", "wide", "string_tiles")]
    out = []
    for view, rows in cases:
        out.append({"name": view.name, "layout": sink_layout(view, PROJECT),
                    "rows": [{k: _json_value(v) for k, v in row.items()} for row in rows],
                    **loader_writes(view, rows)})
    return out


def render() -> str:
    doc = {"about": "Generated by tests/vectors/make_online_records.py from the Python codec; do not edit.",
           "project": PROJECT, "vectors": vectors()}
    return json.dumps(doc, indent=1, ensure_ascii=False, allow_nan=False) + "\n"


if __name__ == "__main__":
    np.seterr(all="ignore")
    OUT.write_text(render(), encoding="utf-8")
    print(f"wrote {OUT.relative_to(REPO)}")
