"""Backfill with DuckDB into a real Parquet store: semantics against the reference, atomic reruns,
bad input, registry runs and the CLI."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from quiver.catalog.errors import QuiverError
from quiver.compile.duckdb import DUCKDB
from quiver.compile.sql import AS_OF_PARAM, compile_values_at_boundary
from quiver.offline import layout
from quiver.offline.backfill import NO_EVENT_TS, QUARANTINE, backfill, quarantine_schema
from quiver.registry import Registry
from tests.integration.test_backfill_support import (
    DAY0,
    GOLDEN_CATALOG,
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
    write_events,
)

pytestmark = pytest.mark.integration
END = DAY0 + timedelta(days=2)
START_US, END_US = day_us(DAY0), day_us(END) + US_PER_DAY


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_tiles_and_last_values_equal_the_reference(tmp_path: Path) -> None:
    config, catalog = project(tmp_path)
    events = make_events()
    report = backfill(config, catalog, DAY0, END)
    assert set(report.views) == set(catalog.views)
    for view in catalog.views.values():
        kind = "tiles" if view.kind == "agg" else "last_values"
        folder = config.offline_dir / view.name / kind
        table, days = read_partitions(folder)
        assert days == [DAY0, DAY0 + timedelta(days=1), END]
        assert table is not None
        want_schema = layout.tile_schema(view) if kind == "tiles" else layout.last_values_schema(view)
        assert [(f.name, f.type) for f in table.schema] == [(f.name, f.type) for f in want_schema]
        if kind == "tiles":
            expected = brute_tiles(events, view, START_US, END_US)
        else:
            expected = brute_last_values(events, view, START_US, END_US)
        assert_rows_equal(store_rows(config.offline_dir, view), expected, view.name)
        assert report.views[view.name].rows_written == len(expected)


def test_report_counts_and_quarantine_files(tmp_path: Path) -> None:
    config, catalog = project(tmp_path)
    rows = make_events().to_pylist()
    in_range = [r for r in rows if r["ts"] is not None and START_US <= _us(r["ts"]) < END_US]
    report = backfill(config, catalog, DAY0, END, views=["user_merchant"])
    item = report.views["user_merchant"]
    null_keys = [r for r in in_range if r["user_id"] is None or r["merchant_id"] is None]
    null_ts = [r for r in rows if r["ts"] is None]
    assert null_keys and null_ts  # the generator makes both
    assert (item.events_read, item.quarantined_null_keys, item.quarantined_null_ts) == (
        len(in_range), len(null_keys), len(null_ts))
    base = config.offline_dir / QUARANTINE / "user_merchant"
    dated, _ = read_partitions(base)
    undated = pq.read_table(base / NO_EVENT_TS)
    view = catalog.view("user_merchant")
    assert dated is not None and dated.schema == quarantine_schema(view) == undated.schema
    assert dated.num_rows == len(null_keys) and set(dated.column("quarantine_reason").to_pylist()) == {"null_key"}
    assert undated.num_rows == len(null_ts)
    assert set(undated.column("quarantine_reason").to_pylist()) == {"null_event_ts"}
    tiles = pa.concat_tables(pq.read_table(p) for p in (config.offline_dir / "user_merchant" / "tiles").rglob("*.parquet"))
    assert sum(tiles.column("n_events").to_pylist()) == len(in_range) - len(null_keys)


def test_window_values_from_tiles_equal_the_reference(tmp_path: Path) -> None:
    """merge_exprs + finalize_expr, run by DuckDB over the written tiles, give docs/architecture.md, "As of t" values."""
    config, catalog = project(tmp_path)
    events = make_events()
    backfill(config, catalog, DAY0, END, views=["user_activity", "user_merchant"])
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    for name in ("user_activity", "user_merchant"):
        view = catalog.view(name)
        files = ", ".join(f"'{p}'" for p in sorted((config.offline_dir / name / "tiles").rglob("*.parquet")))
        con.execute(f"CREATE OR REPLACE VIEW tiles AS SELECT * FROM read_parquet([{files}])")
        sql = compile_values_at_boundary(DUCKDB, view)
        # Midnight between two partitions, mid-day, and the end of the range.
        for as_of in (day_us(DAY0) + US_PER_DAY, day_us(DAY0) + US_PER_DAY + 13 * 3_600_000_000 + 1_800_000_000,
                      END_US):
            got = con.sql(sql, params={AS_OF_PARAM: as_of}).to_arrow_table().to_pylist()
            values_close(got, brute_values_at(events, view, as_of), f"{name} as of {as_of}")


def test_rerun_replaces_exactly_the_dates_of_its_range(tmp_path: Path) -> None:
    config, catalog = project(tmp_path)
    backfill(config, catalog, DAY0, END)
    before = _tree(config.offline_dir)
    middle = DAY0 + timedelta(days=1)
    new_events = make_events(seed=2)
    for old in (tmp_path / "events").glob("*.parquet"):
        old.unlink()
    write_events(new_events, tmp_path / "events")
    backfill(config, catalog, middle, middle)
    after = _tree(config.offline_dir)
    tag = f"date={middle.isoformat()}"

    def untouched(tree: dict[str, bytes]) -> dict[str, bytes]:
        # Rows without an event time belong to no date: each run rewrites that snapshot of the source.
        return {k: v for k, v in tree.items() if tag not in k and NO_EVENT_TS not in k}

    assert untouched(after) == untouched(before) and len(untouched(after)) > 10
    assert {k for k in after if tag in k} and any(after[k] != before.get(k) for k in after if tag in k)
    view = catalog.view("user_activity")
    table, _ = read_partitions(config.offline_dir / "user_activity" / "tiles")
    assert table is not None
    rows = [r for r in store_rows(config.offline_dir, view)
            if day_us(middle) <= r["tile_start"] < day_us(middle) + US_PER_DAY]
    assert_rows_equal(rows, brute_tiles(new_events, view, day_us(middle), day_us(middle) + US_PER_DAY), "rerun")
    hidden = [p for p in config.offline_dir.rglob(".*")]
    assert hidden == [], f"staging or old folders left behind: {hidden}"


def test_a_date_without_events_gets_an_empty_partition_replacing_stale_rows(tmp_path: Path) -> None:
    config, catalog = project(tmp_path)
    backfill(config, catalog, DAY0, END, views=["user_last"])
    folder = layout.partition_dir(config.offline_dir, "user_last", "last_values", END)
    assert pq.read_table(folder).num_rows > 0
    events = make_events()
    keep = [ts is None or _us(ts) < day_us(END) for ts in events.column("ts").to_pylist()]
    for old in (tmp_path / "events").glob("*.parquet"):
        old.unlink()
    write_events(events.filter(pa.array(keep)), tmp_path / "events")
    report = backfill(config, catalog, END, END + timedelta(days=1), views=["user_last"])
    assert report.views["user_last"].rows_by_date == {END: 0, END + timedelta(days=1): 0}
    for day in (END, END + timedelta(days=1)):
        table = pq.read_table(layout.partition_dir(config.offline_dir, "user_last", "last_values", day))
        assert table.num_rows == 0 and table.schema.names == layout.last_values_schema(catalog.view("user_last")).names


def test_corrupt_file_is_named_and_nothing_is_written(tmp_path: Path) -> None:
    config, catalog = project(tmp_path)
    backfill(config, catalog, DAY0, DAY0)
    before = _tree(config.offline_dir)
    bad = tmp_path / "events" / "broken.parquet"
    bad.write_bytes(b"PAR1 this is not parquet at all")
    with pytest.raises(QuiverError, match=r"broken\.parquet"):
        backfill(config, catalog, DAY0, END)
    assert _tree(config.offline_dir) == before


def test_corrupt_data_pages_fail_the_run_without_writing(tmp_path: Path) -> None:
    """A file whose footer reads fine but whose pages are garbage fails in the engine: the error names the
    file, runs are marked failed and the store is untouched (nothing is swapped in before all is staged)."""
    config, catalog = project(tmp_path)
    backfill(config, catalog, DAY0, DAY0)
    before = _tree(config.offline_dir)
    victim = sorted((tmp_path / "events").glob("*.parquet"))[0]
    data = bytearray(victim.read_bytes())
    footer = int.from_bytes(data[-8:-4], "little") + 8
    data[4:len(data) - footer] = bytes(len(data) - footer - 4)  # zero every page, keep the footer
    victim.write_bytes(bytes(data))
    pq.read_schema(victim)  # the footer still reads
    with pytest.raises(QuiverError, match=victim.name):
        backfill(config, catalog, DAY0, END)
    assert _tree(config.offline_dir) == before
    runs = Registry(config.registry, project=config.project).runs(kind="backfill")
    assert {r["status"] for r in runs[-len(catalog.views):]} == {"failed"}


@pytest.mark.parametrize("drift", ["logical", "physical"])
def test_schema_drift_names_both_files(tmp_path: Path, drift: str) -> None:
    config, catalog = project(tmp_path)
    table = make_events(seed=3, n=50)
    qty_type = pa.float64() if drift == "logical" else pa.int32()
    drifted = table.set_column(3, pa.field("qty", qty_type), table.column("qty").cast(qty_type))
    pq.write_table(drifted, tmp_path / "events" / "zz-drifted.parquet")
    with pytest.raises(QuiverError, match=r"zz-drifted\.parquet.*events-0\.parquet"):
        backfill(config, catalog, DAY0, END)
    assert not config.offline_dir.exists()


def test_runs_are_recorded_in_the_registry(tmp_path: Path) -> None:
    config, catalog = project(tmp_path)
    report = backfill(config, catalog, DAY0, END, views=["user_activity", "pair_last"])
    runs = Registry(config.registry, project=config.project).runs(kind="backfill")
    assert sorted(r["view"] for r in runs) == ["pair_last", "user_activity"]
    for run in runs:
        item = report.views[run["view"]]
        assert (run["status"], run["engine"], run["rows"]) == ("succeeded", "duckdb", item.rows_written)
        import json

        detail = json.loads(run["detail_json"])
        assert detail["events_read"] == item.events_read
        assert detail["quarantined_null_keys"] == item.quarantined_null_keys
        assert sum(detail["rows_by_date"].values()) == item.rows_written


def test_unknown_view_and_empty_range_are_user_errors(tmp_path: Path) -> None:
    config, catalog = project(tmp_path)
    with pytest.raises(QuiverError, match="nope"):
        backfill(config, catalog, DAY0, END, views=["nope"])
    with pytest.raises(QuiverError, match="before start"):
        backfill(config, catalog, END, DAY0)


def test_cli_compile_prints_the_golden_sql_and_backfill_writes(tmp_path: Path) -> None:
    from quiver.cli import app
    from quiver.cli.offline import register

    if not any(c.name == "backfill" for c in app.registered_commands):
        register(app)
    write_events(make_events(), tmp_path / "events")
    config_file = tmp_path / "quiver.yaml"
    config_file.write_text(f"project: t\ncatalog: {GOLDEN_CATALOG}\noffline_root: offline\n"
                           f"registry_url: sqlite:///{tmp_path}/registry.db\n")
    runner = CliRunner()
    result = runner.invoke(app, ["compile", "--target", "spark", "user_activity", "--plain",
                                 "--config", str(config_file)])
    assert result.exit_code == 0, result.output
    golden = Path(__file__).resolve().parents[1] / "golden" / "spark" / "user_activity__tiles.sql"
    assert result.output.strip() == golden.read_text().strip()
    result = runner.invoke(app, ["backfill", "--start", DAY0.isoformat(), "--end", END.isoformat(),
                                 "--views", "user_last,pair_last", "--config", str(config_file)])
    assert result.exit_code == 0, result.output
    assert "user_last" in result.output and "pair_last" in result.output
    assert layout.partition_days(tmp_path / "offline", "user_last", "last_values") == [
        DAY0, DAY0 + timedelta(days=1), END]
    result = runner.invoke(app, ["backfill", "--start", "2024-13-01", "--end", "2024-03-02",
                                 "--config", str(config_file)])
    assert result.exit_code == 2 and "--start must be a date" in result.output


def _us(ts: object) -> int:
    from datetime import UTC, datetime

    assert isinstance(ts, datetime)
    return (ts - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


@pytest.mark.parametrize("ts_type", [pa.timestamp("ns", tz="UTC"), pa.timestamp("us")],
                         ids=["nanoseconds", "naive"])
def test_other_timestamp_types_give_the_same_store(tmp_path: Path, ts_type: pa.DataType) -> None:
    """pandas writes nanoseconds; some writers drop the time zone (read as UTC)."""
    events = make_events()
    config, catalog = project(tmp_path, events.set_column(6, pa.field("ts", ts_type), events.column("ts").cast(ts_type)))
    backfill(config, catalog, DAY0, END)
    for name in ("user_activity", "pair_last"):
        view = catalog.view(name)
        brute = brute_tiles if view.kind == "agg" else brute_last_values
        assert_rows_equal(store_rows(config.offline_dir, view), brute(events, view, START_US, END_US), name)


def test_spark_refuses_nanosecond_timestamps_before_starting(tmp_path: Path) -> None:
    events = make_events(n=100)
    ns = pa.timestamp("ns", tz="UTC")
    config, catalog = project(tmp_path, events.set_column(6, pa.field("ts", ns), events.column("ts").cast(ns)))
    with pytest.raises(QuiverError, match=r"'ts' in .*events-0\.parquet holds nanosecond timestamps"):
        backfill(config, catalog, DAY0, END, engine="spark")
    assert not config.offline_dir.exists()
