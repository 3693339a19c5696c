"""Time edges on the batch side, one rule each, on both SQL targets and the embedded PIT engine.

* Before 1970: a tile starts at floor_g(t) toward the past (SQL's `%` truncates toward zero and put an
  event at -1 µs in the tile starting at 0, after the event itself).
* Finer than a microsecond: the catalog's resolution is the µs; every path floors finer times (DuckDB used
  to round a nanosecond source time to the nearest µs, the PIT engine truncated toward zero, labels rounded
  up), so an event after t can never count as before it.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import date, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from quiver import Aggregation, Entity, FeatureView, Field, Float64, Source
from quiver.catalog.validate import build_catalog
from quiver.compile.duckdb import DUCKDB
from quiver.compile.sql import (
    AS_OF_PARAM,
    END_PARAM,
    START_PARAM,
    compile_last_values,
    compile_values_at_boundary,
)
from quiver.config import Config
from quiver.offline.backfill import backfill
from quiver.offline.engines import DuckDBEngine, spark_session
from quiver.offline.pit import get_historical_features
from tests.integration.test_backfill_support import (
    DAY0,
    assert_rows_equal,
    brute_tiles,
    brute_values_at,
    day_us,
    make_events,
    project,
    store_rows,
    values_close,
)

pytestmark = pytest.mark.integration

EPOCH_DAY = date(1970, 1, 1)


def _around_the_epoch() -> pa.Table:
    """The support module's random events moved so that their five days straddle 1970-01-01."""
    events = make_events()
    shift = day_us(EPOCH_DAY - timedelta(days=2)) - day_us(DAY0 - timedelta(days=1))
    ts = pa.compute.add(events.column("ts").cast(pa.int64()), shift).cast(events.schema.field("ts").type)
    return events.set_column(events.schema.get_field_index("ts"), "ts", ts)


@pytest.fixture(scope="module")
def spark() -> Iterator[object]:
    yield spark_session("local[2]")  # left running for the other Spark modules (startup is 10-20 s)


@pytest.mark.parametrize("engine", ["duckdb", "spark"])
def test_tiles_before_1970_start_at_the_floor(engine: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if engine == "spark":
        request.getfixturevalue("spark")
    events = _around_the_epoch()
    config, catalog = project(tmp_path, events)
    first, last = EPOCH_DAY - timedelta(days=1), EPOCH_DAY + timedelta(days=1)
    backfill(config, catalog, first, last, engine=engine, views=["user_activity"])
    view = catalog.view("user_activity")
    start_us, end_us = day_us(first), day_us(last + timedelta(days=1))
    expected = brute_tiles(events, view, start_us, end_us)
    assert any(row["tile_start"] < 0 for row in expected) and any(row["tile_start"] >= 0 for row in expected)
    assert_rows_equal(store_rows(config.offline_dir, view), expected, f"{engine} tiles around 1970")


def test_window_values_before_1970_equal_the_reference(tmp_path: Path) -> None:
    events = _around_the_epoch()
    config, catalog = project(tmp_path, events)
    backfill(config, catalog, EPOCH_DAY - timedelta(days=1), EPOCH_DAY + timedelta(days=1), views=["user_activity"])
    view = catalog.view("user_activity")
    engine = DuckDBEngine()
    files = sorted((config.offline_dir / "user_activity" / "tiles").rglob("*.parquet"))
    engine.connection.execute(f"CREATE VIEW tiles AS SELECT * FROM read_parquet({[str(f) for f in files]!r})")
    sql = compile_values_at_boundary(DUCKDB, view)
    for as_of in (-3_600_000_000, 0, 3 * 3_600_000_000):  # 23:00 on 1969-12-31, the epoch, 03:00 after
        got = engine.fetch(sql, {AS_OF_PARAM: as_of}).to_pylist()
        values_close(got, brute_values_at(events, view, as_of), f"values as of {as_of}")
    engine.close()


# --- finer than a microsecond --------------------------------------------------------------------------------

NS_TIMES = [1_767_225_600_000_001_900, 1_767_225_600_000_003_100, -100, -1_999]  # ns; µs floors: …001, …003, -1, -2


def _ns_source(folder: Path) -> Path:
    folder.mkdir(parents=True)
    path = folder / "part-0.parquet"
    pq.write_table(pa.table({"user_id": pa.array([1, 2, 3, 4], pa.int64()),
                             "ts": pa.array(NS_TIMES, pa.timestamp("ns", tz="UTC")),
                             "x": pa.array([1.0, 2.0, 3.0, 4.0])}), path)
    return path


def test_duckdb_floors_nanosecond_source_times(tmp_path: Path) -> None:
    path = _ns_source(tmp_path / "events")
    user = Entity("user", ["user_id"])
    source = Source("events", "events", timestamp_field="ts")
    view = FeatureView("v", [user], source, ttl="1d", schema=[Field("x", Float64)])
    spec = build_catalog([user, source, view], tmp_path).views["v"]
    engine = DuckDBEngine()
    engine.register_source("events", [path], union_by_name=False)
    got = engine.fetch(compile_last_values(DUCKDB, spec), {START_PARAM: -10**12, END_PARAM: 1_800_000_000_000_000})
    engine.close()
    us = got.column("event_ts").cast(pa.int64()).to_pylist()
    assert sorted(us) == sorted(t // 1000 for t in NS_TIMES)  # floor: 1.9 µs → 1 (rounding gave 2), -0.1 → -1


def test_the_pit_engine_floors_source_and_label_times_alike(tmp_path: Path) -> None:
    """Head events (raw source, ns) and labels (ns) both floored: an event 0.1 µs after the label, in the same
    microsecond, is not counted (label rounding up counted it); an event in an earlier µs is."""
    base = 1_767_225_600_000_000_000  # 2026-01-01, ns
    folder = tmp_path / "events"
    folder.mkdir()
    pq.write_table(pa.table({"user_id": pa.array([1, 1, 2], pa.int64()),
                             "ts": pa.array([base + 5_500, base + 5_900, base + 4_200], pa.timestamp("ns", tz="UTC")),
                             "x": pa.array([1.0, 2.0, 3.0])}), folder / "part-0.parquet")
    user = Entity("user", ["user_id"])
    source = Source("events", "events", timestamp_field="ts")
    view = FeatureView("v", [user], source, tile="5m", aggregations=[Aggregation("x", "count", "1h")])
    catalog = build_catalog([user, source, view], tmp_path)
    config = Config(root=tmp_path, offline_root="offline", registry_url=f"sqlite:///{tmp_path}/registry.db")
    day = date(2026, 1, 1)
    backfill(config, catalog, day - timedelta(days=1), day, views=["v"])
    # Labels at base + 5.8 µs (user 1: events at 5.5 and 5.9 µs, both in µs 5) and user 2 (event at 4.2 µs).
    labels = pd.DataFrame({"user_id": [1, 2, 1],
                           "event_ts": pd.to_datetime([base + 5_800, base + 5_800, base + 6_000], unit="ns", utc=True)})
    got = get_historical_features(labels, ["v:x_count_1h"], catalog=catalog, config=config)["x_count_1h"].tolist()
    assert got == [0, 1, 2]
    assert np.asarray(labels["event_ts"].dt.unit == "ns")
