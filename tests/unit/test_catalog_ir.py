"""The Catalog IR's canonical form: the registry's version key must depend on content, never on files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quiver import Catalog, load_catalog
from quiver.catalog.ir import content_hash
from tests.unit.catalogs.builders import PREAMBLE, transactions, write_catalog, write_parquet


def _load(root: Path, body: str, subdir: str = "defs", prefix: str = "") -> Catalog:
    write_parquet(root / "data/tx/part-0.parquet", transactions())
    write_catalog(root / subdir, {"defs.py": prefix + PREAMBLE + body})
    return load_catalog(root / subdir, root=root)


def test_hash_ignores_where_definitions_live(tmp_path: Path) -> None:
    a = _load(tmp_path / "a", "")
    b = _load(tmp_path / "b", "", subdir="elsewhere", prefix="# moved down a few lines\n\n\n")
    assert a.views["good"].location != b.views["good"].location
    assert a.to_dict() == b.to_dict()
    assert a.content_hash == b.content_hash


@pytest.mark.parametrize("body", [
    'extra = FeatureView("extra", [user], tx, schema=[Field("category", String)], ttl="1d")\n',
    'svc = FeatureService("svc", [good])\n',
    'good2 = Entity("shop", ["merchant_id"])\n',
])
def test_hash_changes_with_content(tmp_path: Path, body: str) -> None:
    assert _load(tmp_path / "a", "").content_hash != _load(tmp_path / "b", body).content_hash


def test_to_dict_is_json_and_round_trips_to_the_same_hash(tmp_path: Path) -> None:
    catalog = _load(tmp_path, 'svc = FeatureService("svc", [good], tags={"team": "fraud"})\n')
    data = catalog.to_dict()
    assert set(data) == {"entity", "source", "feature_view", "feature_service"}
    assert "location" not in json.dumps(data)
    assert content_hash(json.loads(json.dumps(data))) == catalog.content_hash
    view = data["feature_view"]["good"]
    assert view["ttl_us"] == 86_400_000_000 and view["keys"] == [["user_id", "int64"]]
    assert view["fields"] == [{"name": "amount", "column": "amount", "dtype": "float64", "description": ""}]
    assert data["feature_service"]["svc"]["tags"] == [["team", "fraud"]]


def test_view_lookup_names_known_views(tmp_path: Path) -> None:
    catalog = _load(tmp_path, "")
    with pytest.raises(KeyError, match="unknown feature view 'nope'; known: good"):
        catalog.view("nope")


def test_one_view_selection_for_every_command(tmp_path: Path) -> None:
    from quiver.catalog.errors import QuiverError

    catalog = _load(tmp_path, 'cold = FeatureView("cold", [user], tx, schema=[Field("category", String)], '
                              'ttl="1d", online=False)\n'
                              'live_tx = Source("live_tx", "data/tx", stream=StreamBinding(path="data/stream"))\n'
                              'live = FeatureView("live", [user], live_tx, schema=[Field("amount", Float64)], '
                              'ttl="1d")\n')
    names = lambda views: [v.name for v in views]  # noqa: E731
    assert names(catalog.select_views()) == ["cold", "good", "live"]
    assert names(catalog.select_views(need="online")) == ["good", "live"]
    assert names(catalog.select_views(need="streamed")) == ["live"]
    assert names(catalog.select_views(["live", "good", "live"])) == ["live", "good"]  # as given, once each
    with pytest.raises(QuiverError, match=r"unknown feature view\(s\) 'godo' \(did you mean 'good'\?\); known: "
                                          r"cold, good, live"):
        catalog.select_views(["godo"])
    with pytest.raises(QuiverError, match=r"unknown feature view\(s\) 'x', 'y'; known"):
        catalog.select_views(["good", "x", "y"])  # every unknown name in one error
    with pytest.raises(QuiverError, match="'cold' is offline-only"):
        catalog.select_views(["cold"], need="online")
    with pytest.raises(QuiverError, match="source 'tx' has no stream binding"):
        catalog.select_views(["good"], need="streamed")
