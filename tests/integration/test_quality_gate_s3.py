"""The daily quality gate on a source in the bucket (moto's S3 server): a failing file leaves the source's
prefix for its `_quarantine/` (copied whole, then deleted), the next backfill reads the good files only, and a
re-run changes nothing. Before, the gate reported object-store sources as skipped and gated nothing."""

from __future__ import annotations

import contextlib
import json
from datetime import date
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from fsspec.implementations.local import LocalFileSystem

from quiver.catalog.loader import load_catalog
from quiver.catalog.locations import Location, open_location
from quiver.catalog.schema import source_location
from quiver.config import load_config
from quiver.monitoring.alerts import AlertManager
from quiver.monitoring.quality import QualityGate
from quiver.offline.backfill import backfill
from quiver.pipelines.scheduled import day_files, listing_root, quality_gate_day
from quiver.registry import Registry
from tests.integration.object_store_support import BUCKET
from tests.unit.test_monitoring_quality import DEFS, corrupt, transactions

pytestmark = pytest.mark.integration
DAY = date(2024, 3, 1)
DEFINITIONS = """
from quiver import Entity, FeatureView, Field, Float64, Int64, Source
user = Entity(name="user", join_keys=["user_id"], dtype=Int64)
events = Source(name="events", path={uri!r}, timestamp_field="ts", tags={{"expect.amount.min": "0"}})
last_amount = FeatureView(name="last_amount", entities=[user], source=events, ttl="2d",
                          schema=[Field("amount", Float64)])
"""


def events(n: int, first_user: int, amount: float, null_keys: bool = False, day: date = DAY) -> pa.Table:
    start = int(pa.scalar(day, pa.date32()).cast(pa.timestamp("us")).value)
    users = [None if null_keys else first_user + i % 7 for i in range(n)]
    return pa.table({"user_id": pa.array(users, pa.int64()),
                     "amount": pa.array([amount + i for i in range(n)], pa.float64()),
                     "ts": pa.array([start + i * 60_000_000 for i in range(n)], pa.timestamp("us", tz="UTC"))})


def put(fs: pafs.FileSystem, path: str, table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    data = sink.getvalue().to_pybytes()
    with fs.open_output_stream(path) as out:
        out.write(data)
    return data


def objects(fs: pafs.FileSystem, prefix: str) -> dict[str, bytes]:
    infos = fs.get_file_info(pafs.FileSelector(prefix, allow_not_found=True, recursive=True))
    out = {}
    for info in infos:
        if info.type == pafs.FileType.File:
            with fs.open_input_stream(info.path) as stream:
                out[info.path] = stream.read()
    return out


def test_the_gate_quarantines_a_bad_file_in_the_bucket_and_the_next_backfill_skips_it(
        tmp_path: Path, s3_server: Any) -> None:
    uri = s3_server.uri(BUCKET, f"gate-{tmp_path.name}/events")
    with contextlib.suppress(OSError):
        s3_server.create_bucket(BUCKET)
    store = open_location(uri, tmp_path)
    partition = f"{store.base}/date={DAY}"
    good = events(40, first_user=1, amount=10.0)
    bad = events(30, first_user=100, amount=-500.0, null_keys=True)  # null keys, negative amounts: far over 1 %
    good_bytes = put(store.fs, f"{partition}/part-0.parquet", good)
    bad_bytes = put(store.fs, f"{partition}/part-1.parquet", bad)
    later = date(2024, 3, 5)  # another day: the gate of DAY leaves it alone
    put(store.fs, f"{store.base}/date={later}/part-0.parquet", events(5, first_user=1, amount=1.0, day=later))
    root = tmp_path / "project"
    (root / "feature_defs").mkdir(parents=True)
    (root / "quiver.yaml").write_text(f"project: gate\nregistry_url: sqlite:///{root}/registry.db\n")
    (root / "feature_defs" / "definitions.py").write_text(DEFINITIONS.format(uri=uri))

    summary = quality_gate_day(str(DAY), str(root / "quiver.yaml"))

    assert not summary["passed"] and summary["quarantined"] == ["events"]
    first, second = summary["sources"]["events"]
    assert first == {"file": f"s3://{partition}/part-0.parquet", "rows": 40, "flagged_rows": 0, "passed": True}
    assert second["file"] == f"s3://{partition}/part-1.parquet" and not second["passed"]
    assert second["bad_rows"] == 30 and "source_left" not in second
    quarantine = second["quarantine"]
    assert quarantine.startswith(f"s3://{store.base}/_quarantine/events/") and "part-1" in quarantine
    inside = quarantine.removeprefix("s3://")
    held = objects(store.fs, inside)
    assert held[f"{inside}/batch/part-1.parquet"] == bad_bytes  # whole, the same bytes
    assert pq.read_table(pa.BufferReader(held[f"{inside}/bad_rows.parquet"])).num_rows == 30
    report = json.loads(held[f"{inside}/validation.json"])
    assert report["source_moved"] is True and report["origin"] == second["file"]
    assert report["batch"] == f"{quarantine}/batch/part-1.parquet" and report["source_left"] is None
    assert f"{inside}/validation.html" in held
    in_source = objects(store.fs, partition)
    assert in_source == {f"{partition}/part-0.parquet": good_bytes}  # the bad file left, the good one stayed
    config = load_config(root / "quiver.yaml")
    [alert] = AlertManager(Registry(config.registry, project=config.project)).open_alerts("quality")
    assert alert.detail["quarantine"] == quarantine and alert.detail["origin"] == second["file"]
    assert "moved out of the offline path" in alert.message and alert.detail["source_moved"] is True

    catalog = load_catalog(config.catalog_dir, root=config.root)
    listed = source_location(catalog.sources["events"].path, config.root).paths
    assert not [p for p in listed if "/_quarantine/" in p]  # the listing the backfill reads skips it
    report_of_day = backfill(config, catalog, DAY, DAY, engine="duckdb")
    assert report_of_day.views["last_amount"].events_read == good.num_rows  # the bad file's rows: not read
    stored = pa.concat_tables(pq.read_table(p) for p in sorted(
        (config.offline_dir / "last_amount" / "last_values").glob("date=*/*.parquet")))
    assert stored.num_rows > 0 and min(stored.column("amount").to_pylist()) >= 10.0
    assert not (config.offline_dir / "_quarantine" / "last_amount").exists()  # no null keys reached it

    before = objects(store.fs, store.base)
    again = quality_gate_day(str(DAY), str(root / "quiver.yaml"))
    assert again["passed"] and again["sources"]["events"] == [first]
    assert objects(store.fs, store.base) == before  # a re-run moves and writes nothing


def test_a_good_file_after_a_bad_one_leaves_the_alert_open(tmp_path: Path, s3_server: Any) -> None:
    """The source's alert resolves only on a day none of its files failed: before, a passing file gated after a
    failing one resolved the alert the failing one had just raised (folders and buckets alike)."""
    uri = s3_server.uri(BUCKET, f"order-{tmp_path.name}/events")
    with contextlib.suppress(OSError):
        s3_server.create_bucket(BUCKET)
    store = open_location(uri, tmp_path)
    put(store.fs, f"{store.base}/date={DAY}/part-0.parquet", events(30, first_user=100, amount=-500.0,
                                                                    null_keys=True))
    put(store.fs, f"{store.base}/date={DAY}/part-1.parquet", events(40, first_user=1, amount=10.0))
    root = tmp_path / "project"
    (root / "feature_defs").mkdir(parents=True)
    (root / "quiver.yaml").write_text(f"project: gate\nregistry_url: sqlite:///{root}/registry.db\n")
    (root / "feature_defs" / "definitions.py").write_text(DEFINITIONS.format(uri=uri))
    summary = quality_gate_day(str(DAY), str(root / "quiver.yaml"))
    assert [e["passed"] for e in summary["sources"]["events"]] == [False, True]
    config = load_config(root / "quiver.yaml")
    alerts = AlertManager(Registry(config.registry, project=config.project))
    assert len(alerts.open_alerts("quality")) == 1
    assert quality_gate_day(str(DAY), str(root / "quiver.yaml"))["passed"]  # the bad file is gone: a clean day
    assert alerts.open_alerts("quality") == []


class _NoDeletes(LocalFileSystem):
    """A store that refuses deletes (a bucket policy without s3:DeleteObject)."""

    def rm_file(self, path: str) -> None:
        raise PermissionError(f"AccessDenied: delete {path}")

    def rm(self, path: Any, recursive: bool = False, maxdepth: Any = None) -> None:
        raise PermissionError(f"AccessDenied: delete {path}")


def test_a_file_the_store_will_not_delete_is_copied_and_said_to_be_left(tmp_path: Path, sqlite_url: str) -> None:
    (tmp_path / "feature_defs").mkdir()
    (tmp_path / "feature_defs" / "quality_defs.py").write_text(DEFS)
    (tmp_path / "data" / "tx").mkdir(parents=True)
    pq.write_table(transactions(100), tmp_path / "data" / "tx" / "part-0.parquet")
    catalog = load_catalog(tmp_path / "feature_defs", root=tmp_path)
    bucket = tmp_path / "bucket"
    (bucket / "tx" / "date=2026-11-02").mkdir(parents=True)
    batch = bucket / "tx" / "date=2026-11-02" / "part-0.parquet"
    pq.write_table(corrupt(transactions(200, seed=1))[0], batch)
    fs = pafs.PyFileSystem(pafs.FSSpecHandler(_NoDeletes(auto_mkdir=True)))
    store = Location("s3://bucket/tx", fs, str(bucket / "tx"), "s3")
    manager = AlertManager(Registry(sqlite_url, project="fraud"))
    gate = QualityGate(catalog, quarantine_dir=tmp_path / "q", alerts=manager)

    result = gate.gate(str(batch), "transactions", store=store)

    assert not result.success and not result.source_moved and "AccessDenied" in (result.source_left or "")
    assert batch.exists() and result.quarantine_uri is not None and result.quarantine_path is None
    target = Path(result.quarantine_uri.removeprefix("s3://"))
    assert target.parent == bucket / "tx" / "_quarantine" / "transactions"
    assert (target / "batch" / batch.name).read_bytes() == batch.read_bytes()
    report = json.loads((target / "validation.json").read_text())
    assert report["source_moved"] is False and "AccessDenied" in report["source_left"]
    [alert] = manager.open_alerts("quality")
    assert alert.severity == "critical" and "could not be deleted" in alert.message
    assert alert.detail["source_left"] == result.source_left
    assert not (tmp_path / "q").exists()  # a store's batch is quarantined in the store, not in quarantine_dir


def test_the_days_files_of_a_listing_and_where_its_quarantine_goes() -> None:
    paths = ["b/ev/date=2024-03-01/a.parquet", "b/ev/date=2024-03-02/a.parquet", "b/ev/x/date=2024-03-01/c.parquet",
             "b/ev/date=2024-03-01/sub/d.parquet", "b/ev/date=2024-03-01"]
    assert day_files(reversed(paths), "2024-03-01") == ["b/ev/date=2024-03-01/a.parquet",
                                                       "b/ev/x/date=2024-03-01/c.parquet"]
    assert listing_root("b/ev") == "b/ev" and listing_root("b/ev/") == "b/ev"
    assert listing_root("b/ev/date=*/*.parquet") == "b/ev" and listing_root("b/e?/date=*/*") == "b"
    assert listing_root("b/ev/date=2024-03-01/a.parquet", single_file=True) == "b/ev/date=2024-03-01"
