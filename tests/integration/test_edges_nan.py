"""One NaN rule in every engine: NaN is a value (counted, never null) and the greatest one for min, max and
`last` ties. So max of a window holding a NaN is NaN, min is NaN only when every value is NaN, and a `last`
tie between NaN and a number at one event time is NaN.

Every engine answers the same questions (features of a few users at a few times) from the same events and
must equal the brute-force reference below, value for value, NaN for NaN and null for null:

* duckdb  — DuckDB backfill (compile/duckdb.py SQL) + the embedded PIT engine (numpy merges)
* spark   — Spark backfill (compile/spark.py SQL) + the Spark PIT engine
* online  — DuckDB backfill, materialized into a real Redis, read with the online merge (online/merge.py)

To add an engine (e.g. the Flink streaming job), add a function `(Project, times) -> Answers` to `ENGINES`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from quiver import Aggregation, Entity, FeatureView, Field, Float64, Source
from quiver.catalog.ir import Catalog
from quiver.catalog.validate import build_catalog
from quiver.config import Config

pytestmark = pytest.mark.integration

NAN = float("nan")
M = 60_000_000
DAY0 = date(2026, 11, 2)
BASE = int(datetime(DAY0.year, DAY0.month, DAY0.day, 10, tzinfo=UTC).timestamp()) * 1_000_000
AGG_FNS = ("count", "sum", "min", "max", "last")
USERS = [0, 1, 2, 3, 4, 5, 9]  # 9 has no events: nulls (count 0, sum 0)

# (user, minutes after BASE, x): each user is one awkward case; tiles are 10 minutes.
EVENTS: list[tuple[int, float, float | None]] = [
    (0, 0, 1.0), (0, 5, NAN), (0, 12, 3.0),  # NaN among numbers: max NaN, min 1, last 3
    (1, 1, NAN), (1, 11, NAN),  # only NaN: min NaN, max NaN
    (2, 2, 4.0), (2, 3, None), (2, 14, 5.0), (2, 14, NAN),  # a last tie at 14 m: NaN wins
    (3, 2, NAN), (3, 12, None),  # a NaN tile, then a tile with no value: min stays NaN (not +inf)
    (4, 1, 4.0), (4, 15, 2.0), (4, 15, 7.0),  # numbers only, with a tie
    (5, 1, NAN), (5, 11, 6.0),  # a NaN-only tile, then a number: min 6 (a NaN-propagating min gives NaN)
]
# Aligned (tiles only), inside a tile (tiles + head events), 1 µs after events, and much later.
TIMES = [BASE + m for m in (10 * M, 12 * M + 1, 14 * M + 1, 15 * M + 1, 17 * M, 20 * M, 45 * M)]


@dataclass
class Project:
    root: Path
    config: Config
    catalog: Catalog
    features: list[str]


Answers = dict[tuple[str, int, int], Any]  # (feature, user, t) → value: None for null, NaN for NaN


def _project(root: Path, redis_url: str) -> Project:
    user = Entity("user", ["user_id"])
    source = Source("tx", "events/tx", timestamp_field="event_ts")
    stats = FeatureView("stats", [user], source, tile="10m",
                        aggregations=[Aggregation("x", fn, "1h") for fn in AGG_FNS])
    latest = FeatureView("latest", [user], source, ttl="2h", schema=[Field("x", Float64)])
    folder = root / "events" / "tx"
    folder.mkdir(parents=True)
    pq.write_table(pa.table({
        "user_id": pa.array([u for u, _, _ in EVENTS], pa.int64()),
        "event_ts": pa.array([BASE + int(m * M) for _, m, _ in EVENTS], pa.int64()).cast(pa.timestamp("us", "UTC")),
        "x": pa.array([x for _, _, x in EVENTS], pa.float64()),  # NaN stays a value, None is null
    }), folder / "part-0.parquet")
    config = Config(root=root, project="nan", registry_url=f"sqlite:///{root}/registry.db",
                    offline_root="offline", redis_url=redis_url)
    catalog = build_catalog([user, source, stats, latest], root)
    features = [f"stats:x_{fn}_1h" for fn in AGG_FNS] + ["latest:x"]
    return Project(root, config, catalog, features)


# --- the reference: straight from EVENTS --------------------------------------------------------------------


def _order(value: float) -> tuple[int, float]:
    return (1, 0.0) if math.isnan(value) else (0, value)  # NaN above every number


def reference(project: Project, times: list[int]) -> Answers:
    out: Answers = {}
    tile = 10 * M
    for t in times:
        for user in USERS:
            mine = [(BASE + int(m * M), x) for u, m, x in EVENTS if u == user]
            window = [(ts, x) for ts, x in mine if t - t % tile - 60 * M <= ts < t and x is not None]
            values = [x for _, x in window]
            out[("x_count_1h", user, t)] = len(values)
            out[("x_sum_1h", user, t)] = sum(values) if values else 0.0
            out[("x_min_1h", user, t)] = min(values, key=_order) if values else None
            out[("x_max_1h", user, t)] = max(values, key=_order) if values else None
            newest = max(window, key=lambda p: (p[0], _order(p[1])), default=None)
            out[("x_last_1h", user, t)] = None if newest is None else newest[1]
            # last-value view: newest event (any value, null lowest) in [t - ttl, t)
            seen = [(ts, x) for ts, x in mine if t - 120 * M <= ts < t]
            row = max(seen, key=lambda p: (p[0], (-1, 0.0) if p[1] is None else _order(p[1])), default=None)
            out[("x", user, t)] = None if row is None else row[1]
    return out


# --- engines ------------------------------------------------------------------------------------------------


def _backfill(project: Project, engine: str) -> Config:
    from quiver.offline.backfill import backfill

    config = replace(project.config, offline_root=f"offline-{engine}")
    backfill(config, project.catalog, DAY0, DAY0 + timedelta(days=1), engine=engine)
    return config


def _historical(project: Project, times: list[int], engine: str) -> Answers:
    from quiver.offline.pit import get_historical_features

    config = _backfill(project, engine)
    users = np.repeat(USERS, len(times))
    at = np.tile(times, len(USERS))
    labels = pd.DataFrame({"user_id": users, "event_ts": pd.to_datetime(at, unit="us", utc=True)})
    frame = get_historical_features(labels, project.features, catalog=project.catalog, config=config,
                                    engine=engine)
    out: Answers = {}
    for ref in project.features:
        name = ref.split(":")[1]
        for user, t, value in zip(users, at, frame[name].tolist(), strict=True):
            out[(name, int(user), int(t))] = None if value is None or value is pd.NA else value
    return out


def _online(project: Project, times: list[int]) -> Answers:
    import redis

    from quiver.online.base import ViewRead
    from quiver.online.materialize import materialize
    from quiver.online.redis_store import RedisOnlineStore

    config = _backfill(project, "duckdb")
    client = redis.Redis.from_url(project.config.redis_url)
    out: Answers = {}
    with RedisOnlineStore(project.config.redis_url, "nan") as store:
        for t in times:
            client.flushall()  # online holds exactly what is known as of t
            materialize(config, project.catalog, t, store=store)
            views = [project.catalog.views[v] for v in ("stats", "latest")]
            reads = [ViewRead(v, tuple(v.feature_names)) for v in views]
            columns = store.read(reads, {"user_id": np.array(USERS)}, t)
            for (_, name), column in columns.items():
                for i, user in enumerate(USERS):
                    value = column.values[i].item() if hasattr(column.values[i], "item") else column.values[i]
                    out[(name, user, t)] = value if column.valid[i] else None
    return out


# Engines whose answers come back through pandas float64 columns, where a null reads as NaN.
NULL_AS_NAN = {"duckdb", "spark"}
ENGINES: dict[str, Callable[[Project, list[int]], Answers]] = {
    "duckdb": lambda p, times: _historical(p, times, "duckdb"),
    "spark": lambda p, times: _historical(p, times, "spark"),
    "online": _online,
}


def _same(got: Any, want: Any, null_as_nan: bool) -> bool:
    if want is None:
        return got is None or (null_as_nan and isinstance(got, float) and math.isnan(got))
    if got is None:
        return False
    if isinstance(want, float) and math.isnan(want):
        return isinstance(got, float) and math.isnan(got)
    return bool(float(got) == float(want))


def test_the_reference_follows_the_nan_rule(tmp_path: Path) -> None:
    want = reference(_project(tmp_path, "redis://unused"), [BASE + 20 * M])
    t = BASE + 20 * M
    assert math.isnan(want[("x_max_1h", 0, t)]) and want[("x_min_1h", 0, t)] == 1.0
    assert want[("x_last_1h", 0, t)] == 3.0 and want[("x_count_1h", 0, t)] == 3
    assert math.isnan(want[("x_min_1h", 1, t)]) and math.isnan(want[("x_min_1h", 3, t)])
    assert math.isnan(want[("x_last_1h", 2, t)]) and math.isnan(want[("x", 2, t)])
    assert want[("x_last_1h", 4, t)] == 7.0 and want[("x_min_1h", 9, t)] is None


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_every_engine_follows_the_nan_rule(engine: str, tmp_path: Path, redis_url: str) -> None:
    project = _project(tmp_path, redis_url)
    want = reference(project, TIMES)
    got = ENGINES[engine](project, TIMES)
    assert set(got) == set(want)
    wrong = [f"{name} user={user} t=BASE+{(t - BASE) / M:g}m: got {got[(name, user, t)]!r}, want {value!r}"
             for (name, user, t), value in sorted(want.items())
             if not _same(got[(name, user, t)], value, engine in NULL_AS_NAN)]
    assert not wrong, f"{engine}: {len(wrong)} values break the NaN rule: " + "; ".join(wrong[:8])
