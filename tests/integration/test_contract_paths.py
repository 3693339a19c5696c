"""Same answer everywhere: one source with a contract using every rule, fed the same malformed rows through the
backfill (DuckDB and Spark), the stream (feeder → real PyFlink job → Redis) and `/predict`. Each path refuses
the same rows for the same reasons, counts them, and the features equal a brute force over the valid rows
only — offline (point-in-time join, both engines) and online (Redis after the stream)."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from quiver.catalog.ir import Catalog
from quiver.catalog.loader import load_catalog
from quiver.config import Config, load_config
from quiver.offline.backfill import NO_EVENT_TS, QUARANTINE, BackfillReport, backfill
from quiver.offline.pit import get_historical_features
from quiver.online.base import ViewRead
from quiver.online.redis_store import RedisOnlineStore
from quiver.pipelines.stream_producer import to_ndjson
from quiver.streaming.paths import StreamPaths
from tests.integration.test_backfill_support import brute_reason
from tests.integration.test_streaming_e2e import DAY0, DAY0_US, H, M, redis_for_module, run_stream

pytestmark = [pytest.mark.integration, pytest.mark.slow]
__all__ = ["redis_for_module"]

CATALOG = '''
from datetime import UTC, datetime

from quiver import Aggregation, Check, Contract, Entity, FeatureView, Field, Float64, Source, StreamBinding, String

user = Entity(name="user", join_keys=["user_id"])
merchant = Entity(name="merchant", join_keys=["merchant_id"])
events = Source(
    name="events", path="data/events/events", timestamp_field="ts",
    stream=StreamBinding(path="data/stream/events", watermark_delay="2s", allowed_lateness="1d"),
    contract=Contract({
        "user_id": Check(not_null=True),
        "amount": Check(finite=True, min=0.0, max=90.0),
        "qty": Check(min=1, max=5),
        "cat": Check(one_of=["a", "b", "c"]),
        "ts": Check(min=datetime(2026, 11, 1, 1, tzinfo=UTC), max_future="1h"),
    }, max_invalid_share=0.05),
)
user_activity = FeatureView(
    name="user_activity", entities=[user], source=events, tile="5m",
    aggregations=[*[Aggregation("amount", fn, "2h") for fn in ("count", "sum", "mean", "min", "max", "last")],
                  Aggregation("qty", "sum", "6h"), Aggregation("cat", "count", "1d")])
merchant_last = FeatureView(name="merchant_last", entities=[merchant], source=events, ttl="1d",
                            schema=[Field("amount", Float64), Field("cat", String)])
'''
SCHEMA = pa.schema([("user_id", pa.int64()), ("merchant_id", pa.int64()), ("amount", pa.float64()),
                    ("qty", pa.int64()), ("cat", pa.string()), ("ts", pa.timestamp("us", tz="UTC"))])
USERS, MERCHANTS = 12, 3
FAR_FUTURE_US = 4_102_444_800_000_000  # 2100


def events(seed: int = 5, n: int = 2500) -> pa.Table:
    """Valid events over 20 h, then malformed ones for every rule (several each), at distinct µs times."""
    rng = np.random.default_rng(seed)
    ts = DAY0_US + 2 * H + rng.integers(0, 18 * H, n)
    valid = {"user_id": rng.integers(0, USERS, n).tolist(), "merchant_id": rng.integers(0, MERCHANTS, n).tolist(),
             "amount": (rng.integers(0, 360, n) * 0.25).tolist(), "qty": rng.integers(1, 6, n).tolist(),
             "cat": rng.choice(["a", "b", "c"], n).tolist(), "ts": ts.tolist()}
    valid["merchant_id"][:20] = [None] * 20  # valid for the contract, a null key for merchant_last only
    valid["amount"][20:40] = [None] * 20  # a null passes every rule but not_null
    bad: list[dict[str, Any]] = []
    for k in range(6):
        base = {"user_id": k % USERS, "merchant_id": k % MERCHANTS, "amount": 10.0, "qty": 2, "cat": "a"}
        bad += [{**base, "user_id": None}, {**base, "amount": math.nan}, {**base, "amount": math.inf},
                {**base, "amount": -0.25}, {**base, "amount": 90.25}, {**base, "qty": 0}, {**base, "qty": 6},
                {**base, "cat": "z"}, {**base, "ts": DAY0_US + 30 * M + k}, {**base, "ts": FAR_FUTURE_US + k}]
    bad_ts = DAY0_US + 3 * H + rng.choice(15 * H, len(bad), replace=False)
    for row, t in zip(bad, bad_ts, strict=True):
        row.setdefault("ts", int(t))
    columns = {name: valid[name] + [r[name] for r in bad] for name in SCHEMA.names}
    table = pa.table({k: pa.array(v, SCHEMA.field(k).type) for k, v in columns.items()}, schema=SCHEMA)
    order = np.argsort(np.minimum(table.column("ts").cast(pa.int64()).to_numpy(), DAY0_US + 21 * H), kind="stable")
    return table.take(pa.array(order))  # time order; the far-future rows sit among the last


@dataclass
class Paths:
    config: Config
    catalog: Catalog
    table: pa.Table
    reports: dict[str, BackfillReport]
    stream: StreamPaths
    store: RedisOnlineStore


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, redis_for_module: Any) -> Iterator[Paths]:
    root = tmp_path_factory.mktemp("contracts")
    (root / "feature_defs").mkdir()
    (root / "feature_defs" / "features.py").write_text(CATALOG)
    (root / "quiver.yaml").write_text(f"project: contracts\ncatalog: feature_defs\nregistry_url: sqlite:///{root}/r.db\n"
                                      f"offline_root: offline\nredis_url: {redis_for_module.url}\n")
    table = events()
    folder = root / "data" / "events" / "events" / f"date={DAY0.isoformat()}"
    folder.mkdir(parents=True)
    pq.write_table(table, folder / "part-00000.parquet")
    stream = root / "data" / "stream" / "events"
    stream.mkdir(parents=True)
    lines = to_ndjson(table, "ts").splitlines()
    for seq, start in enumerate(range(0, len(lines), 400)):
        (stream / f"{seq:013d}-{seq:08d}.jsonl").write_bytes(b"\n".join(lines[start:start + 400]) + b"\n")
    config = load_config(root / "quiver.yaml")
    catalog = load_catalog(config.catalog_dir, root=config.root)
    result = run_stream(config, "--bounded", "--parallelism", "1")
    assert result.returncode == 0, f"streaming job failed:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    reports = {"duckdb": backfill(config, catalog, DAY0, DAY0 + timedelta(days=1), engine="duckdb"),
               "spark": backfill(replace(config, offline_root="offline-spark"), catalog, DAY0,
                                 DAY0 + timedelta(days=1), engine="spark")}
    store = RedisOnlineStore(redis_for_module.url, config.project)
    yield Paths(config, catalog, table, reports, StreamPaths.at(root / ".quiver" / "stream"), store)
    store.close()  # the Spark session stays up for the other Spark modules (startup is 10-20 s)


def expected_reasons(w: Paths) -> dict[int, str]:
    """ts_us → reason of every malformed row, by the brute-force rules."""
    contract = w.catalog.sources["events"].contract
    now_us = DAY0_US + 100 * 86_400_000_000  # any clock between the data and 2100 gives the same answer
    out = {}
    for row in w.table.to_pylist():
        reason = brute_reason(row, contract, now_us)
        if reason is not None:
            out[int(row["ts"].timestamp() * 1_000_000)] = reason
    return out


def backfill_quarantine(root: Path, view: str) -> dict[int, str]:
    files = sorted((root / QUARANTINE / view).glob("*/part-*.parquet"))
    rows = pa.concat_tables([pq.read_table(p) for p in files]).to_pylist()
    return {int(r["ts"].timestamp() * 1_000_000): r["quarantine_reason"] for r in rows
            if r["quarantine_reason"] != "null_key"}


def test_every_path_refuses_the_same_rows_for_the_same_reasons(world: Paths) -> None:
    want = expected_reasons(world)
    assert set(Counter(want.values())) == set(world.catalog.sources["events"].contract.reasons)  # every rule
    for name, root in (("duckdb", world.config.offline_dir), ("spark", Path(world.config.root) / "offline-spark")):
        report = world.reports[name]
        for view in ("user_activity", "merchant_last"):
            assert backfill_quarantine(root, view) == want, (name, view)
            assert report.views[view].quarantined_by_check == dict(Counter(want.values())), (name, view)
        assert (root / QUARANTINE / "user_activity" / NO_EVENT_TS).is_dir()  # the 2100 rows: no usable date
    stream = [json.loads(line) for p in sorted(world.stream.sink("quarantine", "events").iterdir())
              for line in p.read_bytes().splitlines()]
    refused = {json.loads(q["line"])["ts_us"]: q["reason"] for q in stream if not q["view"]}
    assert refused == want
    status = json.loads(world.stream.status_file.read_text())
    counts = status["loader"]["quarantined"]["events"]
    assert {k: v for k, v in counts.items() if not k.startswith("null_key")} == dict(Counter(want.values()))
    assert counts["null_key:merchant_last"] == 20  # valid rows with a null key of one view stay for the others


def brute_activity(table: pa.Table, t: int) -> pd.DataFrame:
    """user_activity as of t from the valid rows only: a window w holds [floor_5m(t) - w, t) (whole tiles, then
    the raw head of the current one; docs/architecture.md, "As of t")."""
    rows = table.to_pylist()
    start = t - t % (5 * M)
    out = []
    for user in range(USERS):
        mine = [r for r in rows if r["user_id"] == user]
        mine = [r | {"us": int(r["ts"].timestamp() * 1_000_000)} for r in mine]
        two = [r for r in mine if start - 2 * H <= r["us"] < t and r["amount"] is not None]
        amounts = [r["amount"] for r in two]
        last = max(two, key=lambda r: (r["us"], r["amount"]))["amount"] if two else None
        out.append({"user_id": user, "amount_count_2h": len(amounts), "amount_sum_2h": float(sum(amounts)),
                    "amount_mean_2h": sum(amounts) / len(amounts) if amounts else None,
                    "amount_min_2h": min(amounts) if amounts else None, "amount_max_2h": max(amounts) if amounts
                    else None, "amount_last_2h": last,
                    "qty_sum_6h": float(sum(r["qty"] for r in mine if start - 6 * H <= r["us"] < t and r["qty"] is not None)),
                    "cat_count_1d": sum(1 for r in mine if start - 24 * H <= r["us"] < t and r["cat"] is not None)})
    return pd.DataFrame(out)


def valid_rows(w: Paths) -> pa.Table:
    bad = set(expected_reasons(w))
    keep = [int(t.timestamp() * 1_000_000) not in bad for t in w.table.column("ts").to_pylist()]
    return w.table.filter(pa.array(keep))


def same(got: Any, want: Any, where: str) -> None:
    missing = want is None or (isinstance(want, float) and math.isnan(want))
    got_missing = got is None or got is pd.NA or (isinstance(got, float) and math.isnan(got))
    assert missing == got_missing, f"{where}: {got!r} vs {want!r}"
    if not missing:
        assert math.isclose(float(got), float(want), rel_tol=1e-12), f"{where}: {got!r} vs {want!r}"


FEATURES = ["amount_count_2h", "amount_sum_2h", "amount_mean_2h", "amount_min_2h", "amount_max_2h",
            "amount_last_2h", "qty_sum_6h", "cat_count_1d"]


@pytest.mark.parametrize("engine", ["duckdb", "spark"])
def test_training_sets_equal_a_brute_force_over_the_valid_rows_only(world: Paths, engine: str) -> None:
    valid = valid_rows(world)
    config = world.config if engine == "duckdb" else replace(world.config, offline_root="offline-spark")
    # Just after refused rows too: their tile is the labels' current one, so only the head filter keeps them out.
    refused = sorted(ts for ts, reason in expected_reasons(world).items()
                     if reason in ("finite:amount", "min:amount", "max:amount", "max:qty"))[:6]
    for t in (DAY0_US + 4 * H + 7 * M + 3, DAY0_US + 11 * H, DAY0_US + 19 * H + 59 * M, *(r + 1 for r in refused)):
        labels = pd.DataFrame({"user_id": np.arange(USERS, dtype=np.int64),
                               "event_ts": pd.to_datetime(np.full(USERS, t), unit="us", utc=True)})
        got = get_historical_features(labels, [f"user_activity:{f}" for f in FEATURES], catalog=world.catalog,
                                      config=config, engine=engine)
        want = brute_activity(valid, t)
        for feature in FEATURES:
            for i in range(USERS):
                same(got[feature].iloc[i], want[feature].iloc[i], f"{engine} t={t} user={i} {feature}")


def test_online_values_after_the_stream_equal_the_brute_force(world: Paths) -> None:
    view = world.catalog.views["user_activity"]
    t = DAY0_US + 21 * H  # after the last valid event
    online = world.store.read([ViewRead(view, tuple(FEATURES))], {"user_id": np.arange(USERS, dtype=np.int64)}, t)
    want = brute_activity(valid_rows(world), t)
    nonzero = 0
    for feature in FEATURES:
        column = online[("user_activity", feature)]
        for i in range(USERS):
            value = column.values[i].item() if column.valid[i] else None
            same(value, want[feature].iloc[i], f"online user={i} {feature}")
            nonzero += bool(value)
    assert nonzero > 3 * USERS  # the windows are not empty: the comparison is not vacuous
