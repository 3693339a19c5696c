"""SDK pieces without Redis: request plans, entity input, request times, result conversions."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
import pytest

from quiver import Aggregation, Entity, FeatureService, FeatureView, Field, Float64, Int64, Source, String
from quiver.catalog.errors import QuiverError
from quiver.catalog.validate import build_catalog
from quiver.online.base import Batch, Column
from quiver.serving.result import OnlineResult
from quiver.serving.store import entity_columns, request_times, resolve

COLUMNS = {"user_id": "int64", "shop": "string", "event_ts": "timestamp", "amount": "float64", "n": "int64"}


@pytest.fixture(scope="module")
def cat():
    user = Entity("user", ["user_id"])
    shop = Entity("shop", {"shop": String})
    src = Source("tx", "unused")
    a = FeatureView("a", [user], src, ttl="1h", schema=[Field("amount", Float64), Field("n", Int64)])
    b = FeatureView("b", [shop], src, ttl="1h", schema=[Field("amount", Float64)])
    c = FeatureView("c", [user], src, aggregations=[Aggregation("amount", "sum", "1h")])
    hidden = FeatureView("hidden", [user], src, ttl="1h", schema=[Field("n", Int64)], online=False)
    svc = FeatureService("svc", ["a:amount", c])
    return build_catalog([user, shop, src, a, b, c, hidden, svc], schema_reader=lambda s: COLUMNS)


def test_plan_groups_views_and_names_like_offline(cat):
    plan = resolve(cat, ["a:amount", "c:amount_sum_1h", "a:n", "a:amount"])
    assert [(r.view.name, r.features) for r in plan.reads] == [("a", ("amount", "n")), ("c", ("amount_sum_1h",))]
    assert [o[0] for o in plan.outputs] == ["amount", "amount_sum_1h", "n"]
    assert plan.keys == (("user_id", "int64"),)
    full = resolve(cat, "svc", full_feature_names=True)
    assert [o[0] for o in full.outputs] == ["a__amount", "c__amount_sum_1h"]


@pytest.mark.parametrize(("features", "message"), [
    (["a:nope"], "no feature"),
    (["zz:amount"], "unknown feature view"),
    ("nosvc", "unknown feature service"),
    (["a:amount", "b:amount"], "full_feature_names"),
    (["hidden:n"], "offline-only"),
    ([], "no features"),
])
def test_plan_errors_name_the_problem(cat, features, message):
    with pytest.raises(QuiverError, match=message):
        resolve(cat, features)


def test_entity_rows_and_columns_are_typed(cat):
    plan = resolve(cat, ["a:amount", "b:amount"], full_feature_names=True)
    rows = entity_columns(plan, [{"user_id": 1, "shop": "x"}, {"user_id": "2", "shop": "y"}])
    assert rows["user_id"].dtype == np.int64 and rows["user_id"].tolist() == [1, 2]
    assert rows["shop"].tolist() == ["x", "y"]
    cols = entity_columns(plan, {"user_id": np.array([3, 4], dtype=np.int32), "shop": ["p", "q"], "extra": 1})
    assert cols["user_id"].dtype == np.int64
    assert entity_columns(plan, {"user_id": 5, "shop": "s"})["user_id"].tolist() == [5]


@pytest.mark.parametrize(("rows", "message"), [
    ([{"user_id": 1}], "lacks join key 'shop'"),
    ({"user_id": [1, 2], "shop": ["x"]}, "differ in length"),
    ({"user_id": [1.5], "shop": ["x"]}, "int64"),
    ({"user_id": [True], "shop": ["x"]}, "int64"),
    ({"user_id": [2**70], "shop": ["x"]}, "int64"),
    ({"user_id": [1], "shop": [3]}, "string"),
])
def test_bad_entities_are_user_errors(cat, rows, message):
    plan = resolve(cat, ["a:amount", "b:amount"], full_feature_names=True)
    with pytest.raises(QuiverError, match=message):
        entity_columns(plan, rows)


def test_request_times():
    assert request_times("2027-01-15T08:00:00Z", 3) == 1_800_000_000_000_000
    assert request_times(datetime(2027, 1, 15, 8, tzinfo=UTC), 1) == 1_800_000_000_000_000
    per_row = request_times(np.array(["2027-01-15T08:00:00"], dtype="datetime64[us]"), 1)
    assert per_row.tolist() == [1_800_000_000_000_000]
    assert abs(request_times(None, 1) - datetime.now(UTC).timestamp() * 1e6) < 60e6
    with pytest.raises(QuiverError, match="2 times for 3"):
        request_times([1, 2], 3)


def test_result_conversions_keep_nulls_and_types():
    cols = {
        "f": Column(np.array([1.5, 0.0]), np.array([True, False]), "float64"),
        "i": Column(np.array([3, 0]), np.array([True, False]), "int64"),
        "c": Column(np.array([4, 5]), np.array([True, True]), "int64"),
        "s": Column(np.array(["x", None], dtype=object), np.array([True, False]), "string"),
        "b": Column(np.array([True, False]), np.array([False, True]), "bool"),
        "t": Column(np.array([1_800_000_000_000_000, 0]), np.array([True, False]), "timestamp"),
    }
    batch = Batch()
    for name, col in cols.items():
        batch.add(("v", name), col)
    batch.add_block([(("w", "x"), 0), (("w", "y"), 1)], np.array([[1, 2], [3, 4]]),
                    np.array([[True, True], [True, False]]), "int64")
    result = OnlineResult({"user_id": np.array([1, 2])}, batch,
                          [(name, ("v", name)) for name in cols] + [("x", ("w", "x")), ("y", ("w", "y"))], 0)
    d = result.to_dict()
    assert np.isnan(d["f"][1]) and d["f"][0] == 1.5
    assert d["c"].dtype == np.int64 and np.isnan(d["i"][1])
    assert d["s"].tolist() == ["x", None] and d["b"].tolist() == [None, False]
    assert str(d["t"][0]) == "2027-01-15T08:00:00.000000" and np.isnat(d["t"][1])
    table = result.to_arrow()
    assert table.schema.field("i").type == pa.int64() and table.column("i").to_pylist() == [3, None]
    assert table.schema.field("t").type == pa.timestamp("us", tz="UTC")
    assert result.to_pandas().shape == (2, 9)
    lists = result.to_lists()
    assert lists["f"] == [1.5, None] and lists["t"] == ["2027-01-15T08:00:00Z", None]
    assert lists["x"] == [1, 3] and lists["y"] == [2, None]
    # Within a block, only the column that holds a null turns float.
    assert d["x"].dtype == np.int64 and d["x"].tolist() == [1, 3]
    assert np.isnan(d["y"][1]) and d["y"][0] == 2
    assert len(result) == 2 and result.feature_names == [*cols, "x", "y"]
    assert result["y"].valid.tolist() == [True, False]
