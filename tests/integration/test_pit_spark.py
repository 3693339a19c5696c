"""The Spark PIT engine on a real local Spark: equal to the embedded engine and to the brute force."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from quiver.config import Config
from quiver.offline import pit_spark
from quiver.offline.pit import get_historical_features
from tests.unit.test_pit_reference import (
    ALL_FEATURES,
    BASE,
    HOUR,
    assert_same,
    make_world,
    reference_features,
    tied_last_values,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from pyspark.sql import SparkSession

    existed = SparkSession.getActiveSession() is not None
    session = pit_spark.session(Config(spark_master="local[2]"))
    yield session
    if not existed:
        session.stop()


def test_spark_equals_embedded_and_brute_force_on_every_value(tmp_path: Path, spark: Any) -> None:
    world = make_world(tmp_path, seed=11)
    kwargs: dict[str, Any] = {"catalog": world.catalog, "config": world.config, "full_feature_names": True}
    on_spark = get_historical_features(world.labels, ALL_FEATURES, engine="spark", **kwargs)
    embedded = get_historical_features(world.labels, ALL_FEATURES, engine="duckdb", **kwargs)
    expected = reference_features(world, ALL_FEATURES, full_names=True)
    columns = [c for c in expected.columns if "__" in c]
    assert_same(on_spark, expected, columns)
    assert_same(on_spark, embedded, columns)
    pd.testing.assert_frame_equal(on_spark[world.labels.columns], world.labels)  # order and label columns kept
    for column in columns:  # the same dtypes from both engines
        assert on_spark[column].dtype == embedded[column].dtype, column


def test_spark_labels_without_data(tmp_path: Path, spark: Any) -> None:
    world = make_world(tmp_path, seed=12, n_events=150, n_labels=20)
    labels = pd.DataFrame({"user_id": pd.array([999, None, 2, 2], dtype="Int64"),
                           "merchant_code": ["m-a", "m-b", "zzz", "m-a"],
                           "event_ts": pd.to_datetime([BASE, BASE, BASE - 48 * HOUR, BASE + 3 * HOUR],
                                                      unit="us", utc=True)})
    features = ["user_spend:amount_count_2h", "user_spend:amount_mean_2h", "pair_spend:amount_sum_20m",
                "user_profile:tier", "merchant_stats:amount_count_1h"]
    got = get_historical_features(labels, features, catalog=world.catalog, config=world.config, engine="spark")
    assert got["amount_count_2h"].tolist()[:3] == [0, 0, 0]
    assert got["amount_mean_2h"].iloc[:3].isna().all()
    assert got["amount_sum_20m"].tolist()[:3] == [0.0, 0.0, 0.0]
    assert got["amount_count_1h"].iloc[2] == 0  # merchant 'zzz' has no events
    embedded = get_historical_features(labels, features, catalog=world.catalog, config=world.config)
    assert_same(got, embedded, [f.split(":")[1] for f in features])


def test_spark_last_value_ties_take_the_greatest_field_values(tmp_path: Path, spark: Any) -> None:
    world = make_world(tmp_path, seed=13, n_events=60, n_labels=5, write=False)
    config, labels, expected = tied_last_values(world, tmp_path)
    got = get_historical_features(labels, [f"user_profile:{f}" for f in expected], catalog=world.catalog,
                                  config=config, engine="spark")
    for name, values in expected.items():
        assert [None if pd.isna(v) else v for v in got[name].tolist()] == values, name
