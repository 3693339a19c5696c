"""FeatureStore end to end from a project on disk (quiver.yaml + feature_defs/) on a real Redis."""

from __future__ import annotations

from datetime import timedelta

import pandas as pd
import pytest

from quiver.catalog.errors import QuiverError
from quiver.offline.backfill import backfill
from quiver.serving.store import FeatureStore
from tests.integration.test_online_materialize import DAY0, random_events, write_source

pytestmark = pytest.mark.integration

DEFS = """
from quiver import Aggregation, Entity, FeatureService, FeatureView, Field, Float64, Source, String
user = Entity("user", ["user_id"])
tx = Source("tx", "data/events/tx", timestamp_field="event_ts")
last_tx = FeatureView("last_tx", [user], tx, ttl="1d", schema=[Field("amount", Float64), Field("category", String)])
spend = FeatureView("spend", [user], tx, aggregations=[Aggregation("amount", "sum", "1h"),
                                                       Aggregation("amount", "count", "1d")])
model = FeatureService("model", [last_tx, spend])
"""


@pytest.fixture
def project(tmp_path, redis_url):
    write_source(tmp_path, random_events(seed=1, users=20))
    (tmp_path / "feature_defs").mkdir()
    (tmp_path / "feature_defs" / "defs.py").write_text(DEFS)
    (tmp_path / "quiver.yaml").write_text(
        f"project: sdk\nregistry_url: sqlite:///reg.db\noffline_root: offline\nredis_url: {redis_url}\n")
    return tmp_path / "quiver.yaml"


def test_feature_store_online_equals_historical(project):
    with FeatureStore(project) as store:
        backfill(store.config, store.catalog, DAY0, DAY0 + timedelta(days=2))
        end = "2026-11-03T18:25:00Z"
        report = store.materialize(end)
        assert report.entities_written > 0
        rows = [{"user_id": u} for u in range(20)]
        online = store.get_online_features("model", rows, at=end).to_pandas()
        labels = pd.DataFrame({"user_id": range(20), "event_ts": pd.Timestamp(end)})
        offline = store.get_historical_features(labels, "model")
        for column in ("amount", "category", "amount_sum_1h", "amount_count_1d"):
            pd.testing.assert_series_equal(online[column], offline[column], check_dtype=False, check_names=False)
        assert online["amount_count_1d"].sum() > 0
        with pytest.raises(QuiverError, match="no feature"):
            store.get_online_features(["spend:nope"], rows)
        empty = store.get_online_features(["spend:amount_sum_1h"], {"user_id": []}).to_dict()
        assert len(empty["amount_sum_1h"]) == 0
