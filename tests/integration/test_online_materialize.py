"""Materialization from a real Parquet offline store into a real Redis: values, incremental runs, crash and
resume, a flushed Redis, the current tile from raw events, and the CLI."""

from __future__ import annotations

import os
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis
from typer.testing import CliRunner

from quiver import Aggregation, Entity, FeatureView, Field, Float64, Int64, Source, String
from quiver.catalog.validate import build_catalog
from quiver.config import Config
from quiver.offline import layout
from quiver.online.base import OnlineStoreError, ViewRead
from quiver.online.materialize import materialize
from quiver.online.redis_store import RedisOnlineStore
from quiver.registry import Registry

pytestmark = pytest.mark.integration

M = 60_000_000
H = 60 * M
DAY = 24 * H
DAY0 = date(2026, 11, 1)
DAY0_US = (DAY0 - date(1970, 1, 1)).days * DAY


def source_schema() -> pa.Schema:
    return pa.schema([("user_id", pa.int64()), ("event_ts", pa.timestamp("us", tz="UTC")),
                      ("amount", pa.float64()), ("category", pa.string()), ("qty", pa.int64())])


def random_events(seed: int = 0, n: int = 3000, users: int = 40, days: int = 3) -> pa.Table:
    """Events over `days` days; some null amounts, categories and user ids (quarantined offline)."""
    rng = np.random.default_rng(seed)
    ts = DAY0_US + rng.integers(0, days * DAY, n)
    user = rng.integers(0, users, n).astype(object)
    user[rng.random(n) < 0.01] = None
    amount = np.round(rng.lognormal(3, 1, n), 2).astype(object)
    amount[rng.random(n) < 0.1] = None
    category = rng.choice(["food", "fuel", "travel", "tech"], n).astype(object)
    category[rng.random(n) < 0.1] = None
    return pa.table({"user_id": pa.array(user, pa.int64()), "event_ts": pa.array(ts, pa.timestamp("us", tz="UTC")),
                     "amount": pa.array(amount, pa.float64()), "category": pa.array(category, pa.string()),
                     "qty": pa.array(rng.integers(1, 5, n), pa.int64())}, schema=source_schema())


def write_source(root: Path, events: pa.Table) -> None:
    days = sorted({d.date() for d in events.column("event_ts").to_pylist()})
    for day in days:
        lo = datetime(day.year, day.month, day.day, tzinfo=UTC)
        mask = [lo <= t < lo + timedelta(days=1) for t in events.column("event_ts").to_pylist()]
        folder = root / "data" / "events" / "tx" / f"date={day.isoformat()}"
        folder.mkdir(parents=True, exist_ok=True)
        pq.write_table(events.filter(pa.array(mask)), folder / "part-00000.parquet")


def definitions():
    user = Entity("user", ["user_id"])
    src = Source("tx", "data/events/tx", timestamp_field="event_ts")
    last = FeatureView("last_tx", [user], src, ttl="6h",
                       schema=[Field("amount", Float64), Field("category", String), Field("qty", Int64)])
    aggs = [Aggregation(c, fn, w) for w in ("1h", "3h") for c, fn in
            [("amount", "count"), ("amount", "sum"), ("amount", "mean"), ("amount", "min"), ("amount", "max"),
             ("amount", "stddev"), ("category", "last"), ("qty", "last")]]
    spend = FeatureView("spend", [user], src, aggregations=aggs, tile="10m")
    return [user, src, last, spend]


def make_project(tmp: Path, redis_url: str, events: pa.Table | None = None):
    write_source(tmp, events if events is not None else random_events())
    config = Config(root=tmp, project="m", registry_url=f"sqlite:///{tmp}/registry.db", offline_root="offline",
                    redis_url=redis_url)
    return config, build_catalog(definitions(), root=tmp)


def read(store, view, features, users, at):
    out = store.read([ViewRead(view, tuple(features))], {"user_id": np.array(users)}, at)
    return {f: [c.values[i] if c.valid[i] else None for i in range(len(users))] for (_, f), c in out.items()}


def write_last_partition(config: Config, view, day: date, rows: list[dict]) -> None:
    schema = layout.last_values_schema(view)
    folder = layout.partition_dir(config.offline_dir, view.name, layout.LAST_VALUES, day)
    staged = layout.staging_dir(folder)
    data = {n: [r.get(n) for r in rows] for n in schema.names}
    pq.write_table(pa.table(data).cast(schema), staged / "part-00000.parquet")
    layout.replace_partition(folder, staged)


def ts(day_offset: int, minutes: int) -> datetime:
    return datetime(DAY0.year, DAY0.month, DAY0.day, tzinfo=UTC) + timedelta(days=day_offset, minutes=minutes)


def test_incremental_runs_read_only_changed_partitions(tmp_path, redis_url):
    config, catalog = make_project(tmp_path, redis_url)
    view = catalog.views["last_tx"]
    write_last_partition(config, view, DAY0, [{"user_id": 1, "event_ts": ts(0, 1250), "amount": 1.0}])
    write_last_partition(config, view, DAY0 + timedelta(days=1),
                         [{"user_id": 2, "event_ts": ts(1, 60), "amount": 2.0}])
    end = ts(1, 120)
    first = materialize(config, catalog, end, ["last_tx"]).views["last_tx"]
    assert first.full and first.partitions_read == ["2026-11-01", "2026-11-02"]
    second = materialize(config, catalog, end, ["last_tx"]).views["last_tx"]
    # Only the day holding the previous end may have rows between the two ends.
    assert not second.full and second.partitions_read == ["2026-11-02"]
    write_last_partition(config, view, DAY0, [{"user_id": 1, "event_ts": ts(0, 1300), "amount": 7.0}])
    third = materialize(config, catalog, end, ["last_tx"]).views["last_tx"]
    assert third.partitions_read == ["2026-11-01", "2026-11-02"]
    with RedisOnlineStore(redis_url, "m") as store:
        assert read(store, view, ["amount"], [1, 2], end)["amount"] == [7.0, 2.0]
    runs = Registry(config.registry, project="m").runs(view="last_tx", kind="materialize")
    assert [r["status"] for r in runs] == ["succeeded"] * 3
    assert [r["rows"] for r in runs] == [2, 1, 2]


def test_flushed_redis_gets_a_full_run(tmp_path, redis_url):
    config, catalog = make_project(tmp_path, redis_url)
    view = catalog.views["last_tx"]
    write_last_partition(config, view, DAY0, [{"user_id": 1, "event_ts": ts(0, 10), "amount": 1.0}])
    end = ts(0, 60)
    materialize(config, catalog, end, ["last_tx"])
    redis.Redis.from_url(redis_url).flushall()
    again = materialize(config, catalog, end, ["last_tx"]).views["last_tx"]
    assert again.full
    with RedisOnlineStore(redis_url, "m") as store:
        assert read(store, view, ["amount"], [1], end)["amount"] == [1.0]


class FailingStore(RedisOnlineStore):
    """A real Redis store that dies after `budget` write calls (a crash in the middle of a run)."""

    budget = 1

    def write_tiles(self, view, table, progress=None):
        if self.budget <= 0:
            raise OnlineStoreError("simulated crash")
        self.budget -= 1
        return super().write_tiles(view, table, progress)


def test_crash_then_resume_does_not_double_count(tmp_path, redis_url, monkeypatch):
    from quiver.offline.backfill import backfill

    config, catalog = make_project(tmp_path, redis_url)
    backfill(config, catalog, DAY0, DAY0 + timedelta(days=2))
    view = catalog.views["spend"]
    end = ts(2, 13 * 60)
    monkeypatch.setattr("quiver.online.materialize._CHUNK_ROWS", 50)  # several write calls per view
    crashing = FailingStore(redis_url, "m")
    with pytest.raises(OnlineStoreError, match="simulated"):
        materialize(config, catalog, end, ["spend"], store=crashing)
    runs = Registry(config.registry, project="m").runs(view="spend", kind="materialize")
    assert runs[-1]["status"] == "failed"
    materialize(config, catalog, end, ["spend"])  # resume: replays what the crashed run wrote
    materialize(config, catalog, end, ["spend"], full=True)  # and once more, in full
    with RedisOnlineStore(redis_url, "m") as store:
        once = read(store, view, ["amount_count_3h", "amount_sum_3h"], list(range(40)), end)
    redis.Redis.from_url(redis_url).flushall()
    materialize(config, catalog, end, ["spend"])
    with RedisOnlineStore(redis_url, "m") as store:
        clean = read(store, view, ["amount_count_3h", "amount_sum_3h"], list(range(40)), end)
    assert once == clean and sum(once["amount_count_3h"]) > 0


def test_current_tile_comes_from_raw_events(tmp_path, redis_url):
    from quiver.offline.backfill import backfill

    events = random_events(seed=3)
    config, catalog = make_project(tmp_path, redis_url, events)
    backfill(config, catalog, DAY0, DAY0 + timedelta(days=2))
    view = catalog.views["spend"]
    end_dt = ts(1, 9 * 60 + 7)  # 09:07, inside the tile [09:00, 09:10)
    report = materialize(config, catalog, end_dt, ["spend"]).views["spend"]
    assert report.head_tiles > 0
    end = int(end_dt.timestamp() * 1_000_000)
    window_lo = end - end % (10 * M) - H
    ids = events.column("user_id").to_pylist()
    times = [int(t.timestamp() * 1_000_000) for t in events.column("event_ts").to_pylist()]
    amounts = events.column("amount").to_pylist()
    with RedisOnlineStore(redis_url, "m") as store:
        got = read(store, view, ["amount_count_1h"], list(range(40)), end)["amount_count_1h"]
    want = [sum(1 for u, t, a in zip(ids, times, amounts, strict=True) if u == user and window_lo <= t < end
                and a is not None) for user in range(40)]
    assert got == want


def test_cli_materialize(tmp_path, redis_url):
    from quiver.cli import _register_optional_commands, app

    make_project(tmp_path, redis_url)
    defs = tmp_path / "feature_defs"
    defs.mkdir()
    (defs / "defs.py").write_text(
        "from quiver import Aggregation, Entity, FeatureView, Field, Float64, Source\n"
        "user = Entity('user', ['user_id'])\n"
        "tx = Source('tx', 'data/events/tx', timestamp_field='event_ts')\n"
        "last_tx = FeatureView('last_tx', [user], tx, ttl='6h', schema=[Field('amount', Float64)])\n"
        "spend = FeatureView('spend', [user], tx, aggregations=[Aggregation('amount', 'sum', '1h')])\n")
    (tmp_path / "quiver.yaml").write_text(
        f"project: m\nregistry_url: sqlite:///registry.db\noffline_root: offline\nredis_url: {redis_url}\n")
    _register_optional_commands()
    runner = CliRunner()
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        done = runner.invoke(app, ["backfill", "--start", "2026-11-01", "--end", "2026-11-03"])
        assert done.exit_code == 0, done.output
        result = runner.invoke(app, ["materialize", "--end", "2026-11-03T12:00:00Z"])
        assert result.exit_code == 0, result.output
        assert "last_tx" in result.output and "spend" in result.output
        bad = runner.invoke(app, ["materialize", "--end", "not-a-time"])
        assert bad.exit_code == 2 and "ISO" in bad.output
    finally:
        os.chdir(cwd)
    keys = redis.Redis.from_url(redis_url).keys("q:m:last_tx:*")
    assert len(keys) == 40
