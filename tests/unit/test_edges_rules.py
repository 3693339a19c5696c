"""Unit checks of the one-rule edges (NaN greatest, µs floor) in the numpy kernels, and a guard that the
semantic SQL tests keep covering every aggregation fn on every input kind."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa

from quiver import Entity, FeatureView, Field, Float64, Source
from quiver.catalog.aggregations import AGG_FUNCTIONS
from quiver.catalog.validate import build_catalog
from quiver.offline.pit_plan import ascending_order, timestamps_us
from quiver.offline.pit_ranges import merge_identity, range_merge
from quiver.online.codec import newest_per_entity
from quiver.online.merge import Segments, merge_partial

NAN = math.nan


def test_online_min_skips_nan_unless_every_value_is_nan() -> None:
    segs = Segments(np.array([0, 0, 1, 1, 2]), 3)
    values = np.array([NAN, 2.0, NAN, NAN, 5.0])
    got = merge_partial("min", segs, values, np.array([True, True, True, True, False]))
    assert got[0] == 2.0 and math.isnan(got[1])  # before: np.minimum gave NaN for entity 0
    top = merge_partial("max", segs, values, np.ones(5, dtype=bool))
    assert math.isnan(top[0]) and math.isnan(top[1]) and top[2] == 5.0


def test_range_min_of_nan_and_a_null_stays_nan() -> None:
    # A null partial is replaced by the identity; +inf would have made min(NaN, null) = inf.
    identity = merge_identity("min", np.dtype(np.float64))
    assert math.isnan(identity)
    values = np.array([NAN, identity, 3.0])
    got = range_merge("min", values, np.array([0, 0]), np.array([2, 3]))
    assert math.isnan(got[0]) and got[1] == 3.0


def test_ties_order_null_lowest_and_nan_greatest() -> None:
    table = pa.table({"k": [1, 1, 1, 1], "x": pa.array([1.0, None, NAN, 5.0])})
    assert ascending_order(table, ["k", "x"]).to_pylist() == [1, 0, 3, 2]


def test_online_last_value_tie_picks_nan_like_the_offline_sql(tmp_path: Path) -> None:
    user = Entity("user", ["user_id"])
    source = Source("s", "unused", timestamp_field="event_ts")
    view = FeatureView("v", [user], source, ttl="1h", schema=[Field("x", Float64)])
    spec = build_catalog([user, source, view], schema_reader=lambda s: {"user_id": "int64", "event_ts": "timestamp",
                                                                         "x": "float64"}).views["v"]
    ts = pa.array([5, 5, 5, 7, 7], pa.int64()).cast(pa.timestamp("us", "UTC"))
    table = pa.table({"user_id": pa.array([1, 1, 1, 2, 2], pa.int64()), "event_ts": ts,
                      "x": pa.array([5.0, NAN, None, 2.0, None])})
    newest = newest_per_entity(spec, table)
    assert newest.column("user_id").to_pylist() == [1, 2]
    x = newest.column("x").to_pylist()
    assert math.isnan(x[0]) and x[1] == 2.0  # DuckDB/Spark `x DESC NULLS LAST` pick NaN, then 2.0 over null


def test_nanosecond_times_floor_to_the_microsecond_before_1970_too() -> None:
    ns = pa.array([1_900, -100, -1_999, None], pa.timestamp("ns", tz="UTC"))
    values, nulls = timestamps_us(ns)
    assert values[:3].tolist() == [1, -1, -2]  # Arrow's own cast truncates toward zero: 1, 0, -1
    assert nulls is not None and nulls.tolist() == [False, False, False, True]


def test_the_semantic_sql_tests_cover_every_fn_on_every_input_kind() -> None:
    """test_backfill_{duckdb,spark}.py run the generated SQL of the golden catalog on data and compare
    with a brute force; this keeps that catalog covering every fn on float, int and bool columns."""
    from quiver.catalog.loader import load_catalog

    catalog = load_catalog(Path(__file__).resolve().parents[1] / "golden" / "catalog", schema_reader=lambda s: {
        "user_id": "int64", "merchant_id": "int64", "amount": "float64", "qty": "int64", "flag": "bool",
        "cat": "string", "ts": "timestamp"})
    covered = {(a.fn, a.input_dtype) for a in catalog.view("user_activity").aggregations}
    for fn in AGG_FUNCTIONS:
        for dtype in ("float64", "int64", "bool"):
            assert (fn, dtype) in covered, f"{fn} on {dtype} has no semantic SQL test"
