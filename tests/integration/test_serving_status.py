"""Every value read through the SDK carries a status (Feast's FieldStatus), on a real Redis: a missing entity
is NOT_FOUND rather than a zero row, an expired one OUTSIDE_MAX_AGE, a null field NULL_VALUE."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from quiver.config import Config
from quiver.offline.layout import tile_schema
from quiver.online.base import EntityPresence, FieldStatus, entity_status
from quiver.online.redis_store import RedisOnlineStore
from quiver.serving.store import FeatureStore
from tests.integration.test_serving_http import T0, H, catalog, write_rows

P, N, E, X = (FieldStatus.PRESENT, FieldStatus.NULL_VALUE, FieldStatus.NOT_FOUND, FieldStatus.OUTSIDE_MAX_AGE)


def test_statuses_of_last_and_aggregation_views(redis_url):
    cat = catalog()
    online = RedisOnlineStore(redis_url, "st")
    write_rows(online, cat)  # users 1, 2 at T0 (user 2's amount null)
    agg = cat.views["agg"]
    online.write_tiles(agg, one_tile(agg, user=1, start=T0))  # user 1 only
    with FeatureStore(config=Config(project="st"), catalog=cat, online_store=online) as store:
        users = {"user_id": [1, 2, 999_999]}
        now = store.get_online_features(["last:amount", "last:n", "agg:amount_sum_1h"], users, at=T0 + 10)
        codes = now.statuses()
        assert codes["amount"].tolist() == [P, N, E]
        assert codes["n"].tolist() == [P, P, E]
        assert codes["amount_sum_1h"].tolist() == [P, E, E]  # a zero sum, but one of them was never written
        assert now.to_dict()["amount_sum_1h"][2] == 0.0
        assert now.not_found() == {"last": 1, "agg": 2}
        assert now.status_lists()["amount"] == ["PRESENT", "NULL_VALUE", "NOT_FOUND"]
        later = store.get_online_features(["last:n"], users, at=T0 + 2 * H)  # ttl 1h
        assert later.statuses()["n"].tolist() == [X, X, E]
        before = store.get_online_features(["last:n"], users, at=T0)  # only a value at T0: nothing before it
        assert before.statuses()["n"].tolist() == [E, E, E]


def one_tile(view, user: int, start: int) -> pa.Table:
    """One tile of one event (amount 2.0) in the view's tile layout."""
    schema = tile_schema(view)
    row = {"user_id": user, "tile_start": start}
    for field in schema:
        if field.name not in row:
            row[field.name] = 2.0 if pa.types.is_floating(field.type) else 1
    return pa.Table.from_pylist([row]).cast(schema)


def test_entity_status_matches_the_decoder_rule():
    def record(ts: int) -> bytes:
        return ts.to_bytes(8, "little", signed=True) + b"\x00" * 8

    values = [record(100), record(10), None, record(200), record(50)]
    status = entity_status(EntityPresence(values, np.array(150), 60, True))
    # ts < at and ts >= at - ttl counts; older is outside max age; at or after `at` is nothing yet.
    assert status.tolist() == [P, X, E, E, X]
    assert entity_status(EntityPresence(values, np.array(150), None, False)).tolist() == [P, P, E, P, P]


def test_one_entity_shortcut_agrees_with_the_vector_rule():
    def record(ts: int) -> bytes:
        return ts.to_bytes(8, "little", signed=True) + b"\x00" * 8

    for value in (record(100), record(10), None, record(200), record(150), record(90)):
        for ttl, timed in ((60, True), (None, True), (None, False)):
            one = entity_status(EntityPresence([value], np.array(150), ttl, timed)).tolist()
            many = entity_status(EntityPresence([value, None], np.array(150), ttl, timed)).tolist()[:1]
            assert one == many, (value, ttl, timed)
