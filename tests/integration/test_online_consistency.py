"""Online equals offline: after materializing as of t, every online value at t equals
get_historical_features at t, value for value (random events, random request times), on one Redis server and
on a Redis Cluster."""

from __future__ import annotations

import math
from datetime import timedelta

import numpy as np
import pandas as pd
import pytest
import redis

from quiver.offline.backfill import backfill
from quiver.offline.pit import get_historical_features
from quiver.online.materialize import materialize
from quiver.online.redis_store import RedisOnlineStore
from quiver.serving.store import FeatureStore
from tests.integration.test_online_materialize import DAY, DAY0, DAY0_US, make_project, random_events

pytestmark = pytest.mark.integration

USERS = 40


def assert_same(name: str, online: object, offline: object, user: int, t: int) -> None:
    missing_on = online is None or (isinstance(online, float) and math.isnan(online))
    missing_off = offline is None or offline is pd.NA or (isinstance(offline, float) and math.isnan(offline))
    where = f"{name} user={user} t={t}"
    assert missing_on == missing_off, f"{where}: online {online!r} offline {offline!r}"
    if missing_on:
        return
    if isinstance(online, float):
        assert math.isclose(online, float(offline), rel_tol=1e-9, abs_tol=1e-9), f"{where}: {online} != {offline}"
    else:
        assert online == offline, f"{where}: online {online!r} offline {offline!r}"


@pytest.fixture(params=["server", "cluster"])
def online_url(request: pytest.FixtureRequest) -> str:
    """A Redis server's URL, or a Redis Cluster's (emptied first)."""
    if request.param == "server":
        return str(request.getfixturevalue("redis_url"))
    cluster = request.getfixturevalue("redis_cluster")
    cluster.flushall()
    return str(cluster.url)


@pytest.mark.parametrize("seed", [11, 12])
def test_online_equals_offline_at_random_times(tmp_path, online_url, seed):
    rng = np.random.default_rng(seed)
    events = random_events(seed=seed, users=USERS)
    config, catalog = make_project(tmp_path, online_url, events)
    backfill(config, catalog, DAY0, DAY0 + timedelta(days=2))
    features = [f"{v.name}:{f}" for v in catalog.views.values() for f in v.feature_names]
    store = FeatureStore(config=config, catalog=catalog)
    # Random request times, a few of them exactly on a tile boundary, across all three days.
    times = sorted(int(t) for t in DAY0_US + rng.integers(0, 3 * DAY, 5))
    times.append(DAY0_US + DAY + 14 * 3_600_000_000)
    checked = 0
    for t in times:
        store.online.flush_project()  # online must hold exactly what is known as of t: nothing from later
        materialize(config, catalog, t, store=store.online)
        online = store.get_online_features(features, {"user_id": np.arange(USERS)}, at=t,
                                           full_feature_names=True).to_dict()
        labels = pd.DataFrame({"user_id": np.arange(USERS),
                               "event_ts": pd.to_datetime(np.full(USERS, t), unit="us", utc=True)})
        offline = get_historical_features(labels, features, catalog=catalog, config=config,
                                          full_feature_names=True)
        for ref in features:
            column = ref.replace(":", "__")
            for user in range(USERS):
                on = online[column][user]
                on = on.item() if hasattr(on, "item") else on
                assert_same(column, on, offline[column].iloc[user], user, t)
                checked += 1
    assert checked == len(times) * USERS * len(features)
    store.close()


def test_windows_decay_like_offline_between_events(tmp_path, redis_url):
    """One materialization as of `end`, read at many later times (one per row) until the next event:
    no new event arrives, so online values only decay with the windows, exactly as offline ones do."""
    events = random_events(seed=5, users=USERS)
    config, catalog = make_project(tmp_path, redis_url, events)
    backfill(config, catalog, DAY0, DAY0 + timedelta(days=2))
    end = DAY0_US + 2 * DAY + 2 * 3_600_000_000 + 123_456_789  # in the night: a gap before the next event
    with RedisOnlineStore(redis_url, "m") as online_store:
        materialize(config, catalog, end, ["spend"], store=online_store)
    ts = events.column("event_ts").cast("int64").to_numpy(zero_copy_only=False)
    next_event = int(ts[ts >= end].min()) if (ts >= end).any() else end + 4 * 3_600_000_000
    times = np.linspace(end, next_event, 12).astype(np.int64)
    assert times[-1] - times[0] > 0
    users = np.repeat(np.arange(USERS), len(times))
    at = np.tile(times, USERS)
    features = [f"spend:{f}" for f in catalog.views["spend"].feature_names]
    with FeatureStore(config=config, catalog=catalog) as store:
        online = store.get_online_features(features, {"user_id": users}, at=at).to_dict()
    labels = pd.DataFrame({"user_id": users, "event_ts": pd.to_datetime(at, unit="us", utc=True)})
    offline = get_historical_features(labels, features, catalog=catalog, config=config)
    for ref in features:
        name = ref.split(":")[1]
        for i in range(len(users)):
            on = online[name][i]
            assert_same(name, on.item() if hasattr(on, "item") else on, offline[name].iloc[i], int(users[i]),
                        int(at[i]))


def odfv_features(frame: pd.DataFrame) -> pd.DataFrame:
    """Every output type, nulls propagated, and arithmetic that meets NaN, zero and negative inputs."""
    out = pd.DataFrame(index=frame.index)
    out["ratio"] = frame["price"] / frame["amount_mean_1h"]
    out["log_price"] = np.log(frame["price"].where(frame["price"] > 0))
    out["big"] = frame["price"] > frame["amount"]
    out["count_plus_hour"] = frame["amount_count_3h"] + frame["request_ts"].dt.hour
    out["label"] = frame["channel"].fillna("none") + ":" + frame["category"].fillna("?")
    out["promo"] = frame["is_promo"]
    return out


@pytest.mark.parametrize("seed", [21, 22])
def test_on_demand_features_online_equal_offline_on_random_requests_with_nulls_and_nan(tmp_path, redis_url, seed):
    from quiver.catalog.definitions import Field, OnDemandFeatureView, RequestSource
    from quiver.catalog.validate import build_catalog
    from tests.integration.test_online_materialize import definitions

    rng = np.random.default_rng(seed)
    events = random_events(seed=seed, users=USERS)
    config, _ = make_project(tmp_path, redis_url, events)
    request = RequestSource("order", schema=[Field("price", "float64"), Field("channel", "string"),
                                             Field("is_promo", "bool")])
    odfv = OnDemandFeatureView("order_context", schema=[
        Field("ratio", "float64"), Field("log_price", "float64"), Field("big", "bool"),
        Field("count_plus_hour", "int64"), Field("label", "string"), Field("promo", "bool")],
        udf=odfv_features, request_sources=[request],
        inputs=["spend:amount_mean_1h", "spend:amount_count_3h", "last_tx:amount", "last_tx:category"])
    catalog = build_catalog([*definitions(), request, odfv], root=tmp_path)
    backfill(config, catalog, DAY0, DAY0 + timedelta(days=2))
    features = [f"order_context:{f}" for f in odfv.feature_names]
    store = FeatureStore(config=config, catalog=catalog)
    client = redis.Redis.from_url(redis_url)
    prices = rng.choice([np.nan, 0.0, -3.0, 1.5, 20.0, 1e6], USERS)
    fields = {"price": [None if i % 7 == 0 else float(p) for i, p in enumerate(prices)],
              "channel": [None if i % 5 == 0 else rng.choice(["web", "shop"]) for i in range(USERS)],
              "is_promo": [None if i % 6 == 0 else bool(rng.random() < 0.5) for i in range(USERS)]}
    checked = 0
    for t in sorted(int(x) for x in DAY0_US + DAY + rng.integers(0, 2 * DAY, 3)):
        client.flushall()
        materialize(config, catalog, t, store=store.online)
        online = store.get_online_features(features, {"user_id": np.arange(USERS)}, at=t,
                                           request=fields).to_lists()
        labels = pd.DataFrame({"user_id": np.arange(USERS), "event_ts": pd.to_datetime(np.full(USERS, t), unit="us",
                                                                                      utc=True), **fields})
        offline = get_historical_features(labels, features, catalog=catalog, config=config)
        for name in odfv.feature_names:
            for user in range(USERS):
                off = offline[name].iloc[user]
                off = off.item() if hasattr(off, "item") else off
                assert_same(name, online[name][user], off, user, t)
                checked += 1
    assert checked == 3 * USERS * len(odfv.feature_names)
    store.close()


def odfv_python(columns: dict[str, list]) -> dict[str, list]:
    """`odfv_features` in python mode: lists in, lists out, the same values (missing is None)."""
    out: dict[str, list] = {"ratio_py": [], "log_price_py": [], "big_py": [], "count_plus_hour_py": [],
                            "label_py": [], "promo_py": list(columns["is_promo"])}
    for price, mean, last, count, at, channel, category in zip(
            columns["price"], columns["amount_mean_1h"], columns["amount"], columns["amount_count_3h"],
            columns["request_ts"], columns["channel"], columns["category"], strict=True):
        out["ratio_py"].append(None if price is None or mean is None or mean == 0 else price / mean)
        out["log_price_py"].append(math.log(price) if price is not None and price > 0 else None)
        out["big_py"].append(price is not None and last is not None and price > last)
        out["count_plus_hour_py"].append(None if count is None else count + at.hour)
        out["label_py"].append(f"{'none' if channel is None else channel}:{'?' if category is None else category}")
    return out


def test_a_python_mode_view_equals_its_pandas_twin_online_and_offline(tmp_path, redis_url):
    from quiver.catalog.definitions import Field, OnDemandFeatureView, RequestSource
    from quiver.catalog.validate import build_catalog
    from tests.integration.test_online_materialize import definitions

    seed = 23
    rng = np.random.default_rng(seed)
    config, _ = make_project(tmp_path, redis_url, random_events(seed=seed, users=USERS))
    request = RequestSource("order", schema=[Field("price", "float64"), Field("channel", "string"),
                                             Field("is_promo", "bool")])
    inputs = ["spend:amount_mean_1h", "spend:amount_count_3h", "last_tx:amount", "last_tx:category"]
    types = [("ratio", "float64"), ("log_price", "float64"), ("big", "bool"), ("count_plus_hour", "int64"),
             ("label", "string"), ("promo", "bool")]
    pandas_view = OnDemandFeatureView("order_context", schema=[Field(n, t) for n, t in types], udf=odfv_features,
                                      request_sources=[request], inputs=inputs)
    python_view = OnDemandFeatureView("order_context_py", schema=[Field(f"{n}_py", t) for n, t in types],
                                      udf=odfv_python, request_sources=[request], inputs=inputs, mode="python")
    catalog = build_catalog([*definitions(), request, pandas_view, python_view], root=tmp_path)
    assert catalog.on_demand["order_context_py"].mode == "python"
    backfill(config, catalog, DAY0, DAY0 + timedelta(days=2))
    features = [f"order_context:{n}" for n, _ in types] + [f"order_context_py:{n}_py" for n, _ in types]
    store = FeatureStore(config=config, catalog=catalog)
    prices = rng.choice([np.nan, 0.0, -3.0, 1.5, 20.0, 1e6], USERS)
    fields = {"price": [None if i % 7 == 0 else float(p) for i, p in enumerate(prices)],
              "channel": [None if i % 5 == 0 else rng.choice(["web", "shop", ""]) for i in range(USERS)],
              "is_promo": [None if i % 6 == 0 else bool(rng.random() < 0.5) for i in range(USERS)]}
    t = int(DAY0_US + DAY + rng.integers(0, DAY))
    materialize(config, catalog, t, store=store.online)
    online = store.get_online_features(features, {"user_id": np.arange(USERS)}, at=t, request=fields).to_lists()
    labels = pd.DataFrame({"user_id": np.arange(USERS),
                           "event_ts": pd.to_datetime(np.full(USERS, t), unit="us", utc=True), **fields})
    offline = get_historical_features(labels, features, catalog=catalog, config=config)
    for name, _ in types:
        assert str(offline[f"{name}_py"].dtype) == str(offline[name].dtype), name  # the same typing
        for user in range(USERS):
            twin, off = (None if v is pd.NA else v.item() if hasattr(v, "item") else v
                         for v in (offline[name].iloc[user], offline[f"{name}_py"].iloc[user]))
            assert_same(f"{name}_py", online[f"{name}_py"][user], off, user, t)  # online = offline
            assert_same(f"{name}_py", off, twin, user, t)  # python mode = pandas mode
    assert sum(v is None for v in online["ratio_py"]) > 0 and sum(v is not None for v in online["ratio_py"]) > 0
    store.close()


def _differences(store: FeatureStore, features: list[str], config, catalog, t: int) -> list[str]:
    """Every (feature, user) whose online value at t differs from the point-in-time one."""
    online = store.get_online_features(features, {"user_id": np.arange(USERS)}, at=t,
                                       full_feature_names=True).to_dict()
    labels = pd.DataFrame({"user_id": np.arange(USERS), "event_ts": pd.to_datetime(np.full(USERS, t), unit="us",
                                                                                  utc=True)})
    offline = get_historical_features(labels, features, catalog=catalog, config=config, full_feature_names=True)
    found = []
    for ref in features:
        column = ref.replace(":", "__")
        for user in range(USERS):
            on = online[column][user]
            try:
                assert_same(column, on.item() if hasattr(on, "item") else on, offline[column].iloc[user], user, t)
            except AssertionError as exc:
                found.append(str(exc))
    return found


@pytest.mark.parametrize("planned", [True, False], ids=["planned", "one-query-a-moment"])
def test_following_the_events_keeps_online_equal_offline_at_every_moment(tmp_path, online_url, planned):
    """The replay's stand-in for a stream with no lag: materialized once, then `advance` before each moment
    (random, on tile boundaries, just after an event); online equals the point-in-time join at every one,
    while before each advance the store was behind at some of them (so the comparison has teeth)."""
    from quiver.online.follow import EventFollower

    rng = np.random.default_rng(31)
    events = random_events(seed=31, users=USERS)
    config, catalog = make_project(tmp_path, online_url, events)
    backfill(config, catalog, DAY0, DAY0 + timedelta(days=2))
    features = [f"{v.name}:{f}" for v in catalog.views.values() for f in v.feature_names]
    start, end = DAY0_US + DAY + 8 * 3_600_000_000, DAY0_US + DAY + 14 * 3_600_000_000
    ts = events.column("event_ts").cast("int64").to_numpy(zero_copy_only=False)
    after_events = [int(t) + 1 for t in ts[(ts >= start) & (ts < end)][:6]]
    on_tiles = [start + 10 * 60_000_000 * k for k in (1, 7, 30)]
    moments = sorted({*after_events, *on_tiles, *(int(t) for t in start + rng.integers(0, end - start, 12))})
    store = FeatureStore(config=config, catalog=catalog)
    materialize(config, catalog, start, store=store.online)
    behind = 0
    with EventFollower(config, catalog, store.online, start, end) as follower:
        if planned:
            follower.plan(moments)
            assert follower._tiles, "the tiles were planned"
        for t in moments:
            behind += bool(_differences(store, features, config, catalog, t))
            follower.advance(t)
            assert _differences(store, features, config, catalog, t) == [], t
    assert behind > 0
    store.close()
