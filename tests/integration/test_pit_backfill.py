"""End to end: demo events → the real backfill job (DuckDB, and Spark) → training set, against brute force.

The brute force reads only the raw events; the PIT join reads the tiles and last values the backfill wrote
(plus raw head events), so this checks the two jobs agree on the layout and on every semantic rule.
"""

from __future__ import annotations

from datetime import date
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq
import pytest

from quiver.catalog.loader import load_catalog
from quiver.config import Config
from quiver.offline.backfill import backfill
from quiver.offline.pit import get_historical_features
from tests.unit.test_pit_reference import World, assert_same, reference_features

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
FIRST, LAST = date(2026, 11, 1), date(2026, 11, 2)


def _demo_project(root: Path) -> tuple[Config, Any, pd.DataFrame, dict[str, pd.DataFrame]]:
    from quiver.pipelines.demo_data import generate

    generate(root / "data", days=2, users=40, merchants=12, transactions_per_day=300, seed=3)
    catalog = load_catalog(REPO / "feature_defs", root=root)
    config = Config(root=root, offline_root="data/offline", registry_url=f"sqlite:///{root}/registry.db")
    labels = pq.read_table(root / "data" / "labels" / "labels.parquet").to_pandas()
    events = {}
    for source in catalog.sources.values():
        frame = pq.read_table(root / source.path).to_pandas()
        stamps = frame[source.timestamp_field].astype("datetime64[us, UTC]")
        frame["ts"] = pd.array(stamps.astype("int64").where(stamps.notna(), None), dtype="Int64")
        events[source.name] = frame
    return config, catalog, labels, events


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Config, Any, pd.DataFrame, dict[str, pd.DataFrame]]:
    return _demo_project(tmp_path_factory.mktemp("demo"))


def test_backfill_then_training_set_equals_brute_force(demo: tuple[Config, Any, pd.DataFrame, Any]) -> None:
    config, catalog, labels, events = demo
    backfill(config, catalog, FIRST, LAST, engine="duckdb")
    features = list(catalog.services["fraud_model"].features)
    got = get_historical_features(labels, "fraud_model", catalog=catalog, config=config, full_feature_names=True)
    world = World(config.root, catalog, config, events, labels)
    expected = reference_features(world, features, full_names=True)
    columns = [f.replace(":", "__") for f in features]
    assert len(got) == len(labels) and len(columns) >= 15
    assert_same(got, expected, columns)
    # Each label sits exactly at its own transaction (which must not count itself); most have history.
    assert got["user_spend__amount_count_24h"].gt(0).mean() > 0.5
    assert got["user_last_transaction__last_amount"].notna().mean() > 0.3


@pytest.mark.slow
def test_spark_backfill_and_spark_join_give_the_same_training_set(
        demo: tuple[Config, Any, pd.DataFrame, Any], tmp_path: Path) -> None:
    config, catalog, labels, _ = demo
    backfill(config, catalog, FIRST, LAST, engine="duckdb")
    from_duckdb = get_historical_features(labels, "fraud_model", catalog=catalog, config=config,
                                          full_feature_names=True)
    spark_config = Config(root=config.root, offline_root=str(tmp_path / "offline_spark"),
                          registry_url=config.registry_url)
    backfill(spark_config, catalog, FIRST, LAST, engine="spark")
    from_spark = get_historical_features(labels, "fraud_model", catalog=catalog, config=spark_config,
                                         full_feature_names=True, engine="spark")
    columns = [c for c in from_spark.columns if "__" in c]
    assert_same(from_spark, from_duckdb, columns)
