"""Catalog diffs name what changed down to single features (pure: catalogs built from in-memory schemas)."""

from __future__ import annotations

import json
from typing import Any

from quiver import Aggregation, Entity, FeatureService, FeatureView, Field, Float64, Int64, Source, String
from quiver.catalog.validate import build_catalog
from quiver.registry.diff import CatalogDiff, Change, diff_catalogs

SCHEMA = {"user_id": "int64", "amount": "float64", "category": "string", "event_ts": "timestamp"}


def _catalog(*defs: object, schema: dict[str, str] | None = None) -> dict[str, Any]:
    columns = dict(schema or SCHEMA)
    return build_catalog(defs, schema_reader=lambda source: dict(columns)).to_dict()  # type: ignore[arg-type]


USER = Entity("user", ["user_id"])
TX = Source("tx", "data/tx")


def _last(ttl: str = "1d", *fields: Field, name: str = "last_tx") -> FeatureView:
    return FeatureView(name, [USER], TX, schema=list(fields) or [Field("amount", Float64)], ttl=ttl)


def _spend(*aggs: Aggregation, tile: str | None = None) -> FeatureView:
    return FeatureView("spend", [USER], TX, aggregations=list(aggs), tile=tile)


def _only(diff: CatalogDiff, kind: str = "feature_view") -> Change:
    [change] = [c for c in diff.changes if c.kind == kind]
    return change


def test_first_apply_adds_everything_in_dependency_order() -> None:
    svc = FeatureService("svc", ["last_tx:amount"])
    diff = diff_catalogs(None, _catalog(USER, TX, _last(), svc))
    assert [(c.kind, c.name, c.action) for c in diff.changes] == [
        ("entity", "user", "added"), ("source", "tx", "added"),
        ("feature_view", "last_tx", "added"), ("feature_service", "svc", "added")]
    assert _only(diff).details == ["features: amount"]
    assert _only(diff, "feature_service").details == ["features: last_tx:amount"]
    assert str(_only(diff)) == "+ feature view last_tx (features: amount)"


def test_identical_catalogs_have_no_diff() -> None:
    diff = diff_catalogs(_catalog(USER, TX, _last()), _catalog(USER, TX, _last()))
    assert diff.is_empty and str(diff) == "no changes" and diff.to_json() == []


def test_view_added_and_removed() -> None:
    old = _catalog(_last(name="a"))
    new = _catalog(_last(name="b"))
    diff = diff_catalogs(old, new)
    assert [(c.name, c.action) for c in diff.changes] == [("a", "removed"), ("b", "added")]  # by kind, name
    assert str(diff.changes[0]) == "- feature view a"


def test_feature_added_removed_and_changed_inside_a_view() -> None:
    old = _catalog(_spend(Aggregation("amount", "sum", "1h"), Aggregation("amount", "max", "1h", name="top"),
                          Aggregation("amount", "count", "1h")))
    new = _catalog(_spend(Aggregation("amount", "sum", "1h"), Aggregation("amount", "max", "2h", name="top"),
                          Aggregation("amount", "mean", "1h")))
    change = _only(diff_catalogs(old, new))
    assert change.action == "changed"
    assert change.details == ["+feature amount_mean_1h", "-feature amount_count_1h",
                              "~feature top: window: 1h → 2h"]
    assert str(change) == ("~ feature view spend (+feature amount_mean_1h; -feature amount_count_1h; "
                           "~feature top: window: 1h → 2h)")


def test_ttl_and_tile_changes_read_as_durations() -> None:
    assert _only(diff_catalogs(_catalog(_last("1d")), _catalog(_last("3d")))).details == ["ttl: 1d → 3d"]
    old, new = _spend(Aggregation("amount", "sum", "1h")), _spend(Aggregation("amount", "sum", "1h"), tile="10m")
    assert _only(diff_catalogs(_catalog(old), _catalog(new))).details == ["tile: 5m → 10m"]


def test_field_dtype_change_is_a_changed_feature() -> None:
    old = _catalog(_last("1d", Field("category", String)))
    new = _catalog(_last("1d", Field("category", Int64)), schema={**SCHEMA, "category": "int64"})
    diff = diff_catalogs(old, new)
    assert _only(diff).details == ["~feature category: dtype: 'string' → 'int64'"]
    assert _only(diff, "source").details == ["~column category: string → int64"]


def test_source_columns_and_description_changes() -> None:
    old = _catalog(_last())
    new = _catalog(_last(), schema={**SCHEMA, "country": "string"})
    assert _only(diff_catalogs(old, new), "source").details == ["+column country"]
    described = Source("tx", "data/tx", description="card transactions")
    change = _only(diff_catalogs(old, _catalog(FeatureView("last_tx", [USER], described,
                                                           schema=[Field("amount", Float64)], ttl="1d"))), "source")
    assert change.details == ["description: '' → 'card transactions'"]


def test_service_feature_list_changes() -> None:
    view = _last("1d", Field("amount", Float64), Field("category", String))
    old = _catalog(view, FeatureService("svc", ["last_tx:amount"]))
    new = _catalog(view, FeatureService("svc", ["last_tx:category"]))
    assert _only(diff_catalogs(old, new), "feature_service").details == [
        "+feature last_tx:category", "-feature last_tx:amount"]


def test_diff_json_round_trips() -> None:
    diff = diff_catalogs(_catalog(_last("1d")), _catalog(_last("2d")))
    data = json.loads(json.dumps(diff.to_json()))
    assert data == [{"kind": "feature_view", "name": "last_tx", "action": "changed", "details": ["ttl: 1d → 2d"]}]
