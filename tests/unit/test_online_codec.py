"""Pure unit tests of the online layout: keys, tags, packing and decoding (no Redis)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from quiver import Aggregation, Entity, FeatureView, Field, Float64, Int64, Source, String
from quiver.catalog.validate import build_catalog
from quiver.offline.layout import last_values_schema, tile_schema
from quiver.online.base import timestamp_us
from quiver.online.codec import LastCodec, TileCodec
from quiver.online.layout import entity_keys, key_prefix, view_tag

M = 60_000_000
H = 60 * M
T0 = 1_800_000_000_000_000 // H * H
COLUMNS = {"user_id": "int64", "shop": "string", "event_ts": "timestamp", "amount": "float64",
           "category": "string", "n": "int64", "flag": "bool", "seen": "timestamp"}


def catalog(tile: str = "10m", extra_window: str | None = None):
    user = Entity("user", ["user_id"])
    shop = Entity("shop", {"shop": String})
    src = Source("tx", "unused", timestamp_field="event_ts")
    last = FeatureView("last", [user], src, ttl="1h", schema=[
        Field("amount", Float64), Field("category", String), Field("n", Int64), Field("flag", "bool"),
        Field("seen", "timestamp")])
    pair = FeatureView("pair", [user, shop], src, ttl="1h", schema=[Field("amount", Float64)])
    aggs = [Aggregation("amount", "sum", "1h"), Aggregation("amount", "count", "1h"),
            Aggregation("amount", "max", "1h"), Aggregation("category", "last", "1h"),
            Aggregation("amount", "stddev", "2h")]
    if extra_window:
        aggs.append(Aggregation("amount", "mean", extra_window))
    agg = FeatureView("agg", [user], src, aggregations=aggs, tile=tile)
    return build_catalog([user, shop, src, last, pair, agg], schema_reader=lambda s: COLUMNS)


def by_name(batch):
    return {feature: column for (_, feature), column in batch.items()}


def ts(values):
    return pa.array(values, pa.timestamp("us", tz="UTC"))


def test_keys_are_readable_and_escape_separators():
    cat = catalog()
    view = cat.views["pair"]
    prefix = key_prefix("proj", view)
    assert prefix == f"q:proj:pair:{view_tag(view)}:{{".encode()
    keys = entity_keys(prefix, view, {"user_id": np.array([1, -2, 3]),
                                      "shop": np.array(["a:b", "50%", "{x}"], dtype=object)})
    # The braces are the cluster's hash tag: escaped inside the entity, so the tag is always the whole entity.
    assert keys == [prefix + b"1:a%3Ab}", prefix + b"-2:50%25}", prefix + b"3:%7Bx%7D}"]
    single = cat.views["last"]
    assert entity_keys(key_prefix("p", single), single, {"user_id": [7]}) == [key_prefix("p", single) + b"7}"]


def test_tag_follows_storage_schema_only():
    base = catalog().views["agg"]
    # mean over 1 h reads the __cnt and __sum partials the view already stores: the same layout, same tag.
    assert view_tag(base) == view_tag(catalog(extra_window="1h").views["agg"])
    # A longer window changes which tiles are kept, so the layout (and the tag) changes.
    assert view_tag(base) != view_tag(catalog(extra_window="1d").views["agg"])
    assert view_tag(base) != view_tag(catalog(tile="5m").views["agg"])


def test_last_values_round_trip_with_nulls_strings_and_ttl():
    view = catalog().views["last"]
    codec = LastCodec(view)
    table = pa.table({
        "user_id": [1, 2, 3], "event_ts": ts([T0, T0 + 10, T0 - 2 * H]),
        "amount": [1.5, None, 3.0], "category": ["ünï", None, "x:y"], "n": [None, 2, 3],
        "flag": [True, None, False], "seen": ts([T0 - 5, None, T0]),
    }).cast(last_values_schema(view))
    values, event_ts = codec.encode(table)
    assert event_ts.tolist() == [T0, T0 + 10, T0 - 2 * H]
    out = by_name(codec.decode([values[0], None, values[1], values[2]],
                       ["amount", "category", "n", "flag", "seen"], np.asarray(T0 + 20), view.ttl_us))
    assert out["amount"].valid.tolist() == [True, False, False, False]  # None: missing; row 3: older than ttl
    assert out["amount"].values[0] == 1.5
    assert out["category"].values.tolist() == ["ünï", None, None, None]
    assert out["n"].valid.tolist() == [False, False, True, False] and out["n"].values[2] == 2
    assert out["flag"].values[0] and out["flag"].valid.tolist() == [True, False, False, False]
    assert out["seen"].values[0] == T0 - 5
    # As of an earlier time the value does not exist yet (event_ts < t is strict).
    early = by_name(codec.decode([values[0]], ["amount"], np.asarray(T0), view.ttl_us))
    assert not early["amount"].valid[0]
    # Per-entity request times.
    per = by_name(codec.decode([values[2], values[2]], ["category"], np.array([T0 - H, T0 + 10]), view.ttl_us))
    assert per["category"].valid.tolist() == [True, False]


def test_foreign_bytes_read_as_missing():
    view = catalog().views["pair"]
    codec = LastCodec(view)
    out = by_name(codec.decode([b"short", None], ["amount"], np.asarray(T0), view.ttl_us))
    assert out["amount"].valid.tolist() == [False, False]


def tiles_table(view, rows):
    names = tile_schema(view).names
    data = {n: [r.get(n) for r in rows] for n in names}
    return pa.table(data).cast(tile_schema(view))


def test_tiles_group_per_entity_dedupe_and_pretrim():
    view = catalog().views["agg"]
    codec = TileCodec(view)
    rows = [
        {"user_id": 2, "tile_start": T0, "n_events": 1, "amount__cnt": 1, "amount__sum": 5.0},
        {"user_id": 1, "tile_start": T0, "n_events": 1, "amount__cnt": 1, "amount__sum": 1.0},
        {"user_id": 1, "tile_start": T0, "n_events": 3, "amount__cnt": 3, "amount__sum": 6.0},  # fuller: wins
        {"user_id": 1, "tile_start": T0 - 5 * H, "n_events": 9, "amount__cnt": 9, "amount__sum": 9.0},  # trimmed
    ]
    firsts, values, newest = codec.encode(tiles_table(view, rows))
    assert firsts.column("user_id").to_pylist() == [1, 2]
    assert newest.tolist() == [T0, T0]
    out = by_name(codec.decode(values, ["amount_sum_1h", "amount_count_1h"], np.asarray(T0 + M)))
    assert out["amount_sum_1h"].values.tolist() == [6.0, 5.0]
    assert out["amount_count_1h"].values.tolist() == [3, 1]
    # The 5 h old tile is not in the record at all: read as of its own hour (when it would be in the 1 h
    # window, and the T0 tiles are still in the future) nothing is there. Without the pre-trim: 9 events.
    then = by_name(codec.decode(values, ["amount_count_1h"], np.asarray(T0 - 5 * H + 30 * M)))
    assert then["amount_count_1h"].values.tolist() == [0, 0]


def test_string_last_partials_survive_packing():
    view = catalog().views["agg"]
    codec = TileCodec(view)
    rows = [
        {"user_id": 1, "tile_start": T0, "n_events": 1, "category__cnt": 1, "category__last": "ab",
         "category__last_ts": T0 + 1, "amount__cnt": 0},
        {"user_id": 1, "tile_start": T0 + 10 * M, "n_events": 2, "category__cnt": 2, "category__last": "zzz",
         "category__last_ts": T0 + 10 * M + 5, "amount__cnt": 0},
        {"user_id": 3, "tile_start": T0, "n_events": 1, "category__cnt": 0, "amount__cnt": 1, "amount__sum": 2.0,
         "amount__max": 2.0},
    ]
    _, values, _ = codec.encode(tiles_table(view, rows))
    out = by_name(codec.decode([values[0], None, values[1]], ["category_last_1h", "amount_max_1h"], np.asarray(T0 + 15 * M)))
    assert out["category_last_1h"].values.tolist() == ["zzz", None, None]
    assert out["category_last_1h"].valid.tolist() == [True, False, False]
    # No amount in user 1's tiles: max is null there (cnt 0), not the stored placeholder 0.
    assert out["amount_max_1h"].valid.tolist() == [False, False, True]
    assert out["amount_max_1h"].values[2] == 2.0


@pytest.mark.parametrize(("value", "expected"), [
    ("2027-01-15T08:00:00Z", 1_800_000_000_000_000),
    (1_800_000_000_000_000, 1_800_000_000_000_000),
    (np.datetime64("2027-01-15T08:00:00", "us"), 1_800_000_000_000_000),
])
def test_timestamp_parsing(value, expected):
    assert timestamp_us(value) == expected


def test_bad_timestamp_is_a_user_error():
    from quiver.catalog.errors import QuiverError

    with pytest.raises(QuiverError, match="ISO"):
        timestamp_us("yesterday-ish")
    with pytest.raises(QuiverError):
        timestamp_us(True)
