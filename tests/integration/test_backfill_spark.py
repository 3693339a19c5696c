"""Spark (local mode) backfill: the same tiles and last values as DuckDB and as the reference.

One SparkSession and one pair of backfills serve the whole module: Spark startup costs 10-20 s.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from quiver.catalog.ir import Catalog
from quiver.compile.spark import SPARK
from quiver.compile.sql import AS_OF_PARAM, compile_values_at_boundary
from quiver.config import Config
from quiver.offline import layout
from quiver.offline.backfill import NO_EVENT_TS, QUARANTINE, BackfillReport, backfill
from quiver.offline.engines import spark_session
from tests.integration.test_backfill_support import (
    DAY0,
    US_PER_DAY,
    assert_rows_equal,
    brute_last_values,
    brute_tiles,
    brute_values_at,
    day_us,
    make_events,
    project,
    read_partitions,
    store_rows,
    values_close,
)

pytestmark = pytest.mark.integration
END = DAY0 + timedelta(days=2)
START_US, END_US = day_us(DAY0), day_us(END) + US_PER_DAY


@dataclass
class Stores:
    duckdb: Config
    spark: Config
    catalog: Catalog
    reports: dict[str, BackfillReport]


@pytest.fixture(scope="module")
def spark() -> Iterator[object]:
    # Left running for the other Spark modules (one local session per test run: startup is 10-20 s).
    yield spark_session("local[2]")


@pytest.fixture(scope="module")
def stores(spark: object, tmp_path_factory: pytest.TempPathFactory) -> Stores:
    config, catalog = project(tmp_path_factory.mktemp("spark-vs-duckdb"))
    duck = replace(config, offline_root="offline-duckdb")
    sprk = replace(config, offline_root="offline-spark")
    reports = {"duckdb": backfill(duck, catalog, DAY0, END, engine="duckdb"),
               "spark": backfill(sprk, catalog, DAY0, END, engine="spark")}
    return Stores(duck, sprk, catalog, reports)


def test_spark_tiles_and_last_values_equal_duckdb_and_the_reference(stores: Stores) -> None:
    events = make_events()
    for view in stores.catalog.views.values():
        got = store_rows(stores.spark.offline_dir, view)
        if view.kind == "agg":
            expected = brute_tiles(events, view, START_US, END_US)
        else:
            expected = brute_last_values(events, view, START_US, END_US)
        assert_rows_equal(got, expected, f"spark {view.name} vs reference")
        assert_rows_equal(got, store_rows(stores.duckdb.offline_dir, view), f"spark {view.name} vs duckdb")


def test_spark_writes_the_layout_one_file_per_date(stores: Stores) -> None:
    for view in stores.catalog.views.values():
        kind = "tiles" if view.kind == "agg" else "last_values"
        folder = stores.spark.offline_dir / view.name / kind
        table, days = read_partitions(folder)
        assert days == [DAY0, DAY0 + timedelta(days=1), END]
        want = layout.tile_schema(view) if kind == "tiles" else layout.last_values_schema(view)
        assert table is not None
        assert [(f.name, f.type) for f in table.schema] == [(f.name, f.type) for f in want]
        names = sorted(p.name for p in folder.rglob("*") if p.is_file())
        assert names == ["part-00000.parquet"] * 3, names  # no .crc, _SUCCESS or extra parts


def test_spark_report_and_quarantine_equal_duckdb(stores: Stores) -> None:
    duck, sprk = stores.reports["duckdb"], stores.reports["spark"]
    for name, item in sprk.views.items():
        other = duck.views[name]
        assert (item.events_read, item.quarantined_null_keys, item.quarantined_null_ts, item.rows_by_date) == (
            other.events_read, other.quarantined_null_keys, other.quarantined_null_ts, other.rows_by_date)
        assert item.quarantined > 0
        for sub in ("", NO_EVENT_TS):
            folder_s = stores.spark.offline_dir / QUARANTINE / name / sub
            folder_d = stores.duckdb.offline_dir / QUARANTINE / name / sub
            rows_s = sorted(map(repr, pq.read_table(folder_s).to_pylist()))
            assert rows_s == sorted(map(repr, pq.read_table(folder_d).to_pylist()))


def test_merge_and_finalize_on_spark_equal_the_reference(stores: Stores, spark: object) -> None:
    events = make_events()
    session = spark_session("local[2]")
    for name in ("user_activity", "user_merchant"):
        view = stores.catalog.view(name)
        tiles_dir = stores.spark.offline_dir / name / "tiles"
        session.read.parquet(*[str(p) for p in sorted(tiles_dir.rglob("*.parquet"))]).createOrReplaceTempView("tiles")
        sql = compile_values_at_boundary(SPARK, view)
        for as_of in (day_us(DAY0) + US_PER_DAY, day_us(DAY0) + 37 * 3_600_000_000, END_US):
            got = [row.asDict() for row in session.sql(sql, args={AS_OF_PARAM: as_of}).collect()]
            values_close(got, brute_values_at(events, view, as_of), f"spark {name} as of {as_of}")


def test_spark_failure_leaves_the_store_untouched(stores: Stores, tmp_path: Path) -> None:
    """A corrupt page found by Spark mid-run: the error names the file and no partition changes."""
    config, catalog = project(tmp_path)
    backfill(config, catalog, DAY0, DAY0, engine="duckdb", views=["user_last"])
    before = {p: p.read_bytes() for p in config.offline_dir.rglob("*") if p.is_file()}
    victim = sorted((tmp_path / "events").glob("*.parquet"))[1]
    data = bytearray(victim.read_bytes())
    footer = int.from_bytes(data[-8:-4], "little") + 8
    data[4:len(data) - footer] = bytes(len(data) - footer - 4)
    victim.write_bytes(bytes(data))
    from quiver.catalog.errors import QuiverError

    with pytest.raises(QuiverError, match=victim.name):
        backfill(config, catalog, DAY0, END, engine="spark", views=["user_last"])
    assert {p: p.read_bytes() for p in config.offline_dir.rglob("*") if p.is_file()} == before
