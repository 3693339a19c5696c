"""The offline store on S3 (moto's server) with DuckDB: the backfill writes the same rows and quarantine as
to a folder, days are replaced by manifest, a failed run leaves the bucket as it was, and point-in-time
joins, training sets and materialization read it. The Spark cluster's side: test_offline_object_store_cluster."""

from __future__ import annotations

import contextlib
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from quiver.catalog.errors import QuiverError
from quiver.offline import store_commit
from quiver.offline.backfill import QUARANTINE, backfill
from quiver.offline.pit import get_historical_features, write_training_set
from quiver.offline.store import MANIFEST, store_for
from tests.integration.object_store_support import BUCKET, listing, partition_table, s3_config, s3_rows
from tests.integration.test_backfill_support import DAY0, assert_rows_equal, project, store_rows

pytestmark = pytest.mark.integration
END = DAY0 + timedelta(days=2)


@pytest.fixture
def stores(tmp_path: Path, s3_server: Any) -> tuple[Any, Any, Any]:
    """(local config, S3 config, catalog) of one project: the golden catalog over random events."""
    config, catalog = project(tmp_path)
    return config, s3_config(config, s3_server), catalog


def test_duckdb_backfill_to_s3_writes_what_a_folder_gets(stores: tuple[Any, Any, Any]) -> None:
    local, s3, catalog = stores
    local_report = backfill(local, catalog, DAY0, END)
    s3_report = backfill(s3, catalog, DAY0, END)
    store = store_for(s3)
    for view in catalog.views.values():
        assert_rows_equal(s3_rows(s3, view), store_rows(local.offline_dir, view), f"{view.name}: s3 vs folder")
        assert s3_report.views[view.name].rows_by_date == local_report.views[view.name].rows_by_date
    quarantined = 0
    for name, view_report in local_report.views.items():
        for sub in [f"date={d}" for d in view_report.rows_by_date] + ["no_event_ts"]:
            folder = local.offline_dir / QUARANTINE / name / sub
            files = store.partition_files(store.path(QUARANTINE, name, sub))
            assert bool(files) == folder.is_dir(), f"{name}/{sub}"
            if files:
                got = pq.read_table(files[0], filesystem=store.fs)
                assert got.equals(pq.read_table(folder / "part-00000.parquet")), f"{name}/{sub}"
                quarantined += got.num_rows
    assert quarantined > 0  # the events have null keys and times: the quarantine path ran
    assert not [p for p in listing(store) if "/.staging-" in p]  # staging is gone


def test_rerunning_a_day_replaces_it_by_manifest_and_nothing_else(stores: tuple[Any, Any, Any]) -> None:
    _, s3, catalog = stores
    backfill(s3, catalog, DAY0, END)
    store = store_for(s3)
    view = sorted(catalog.views)[0]
    kind = "tiles" if catalog.views[view].kind == "agg" else "last_values"
    before = listing(store)
    folder = store.path(view, kind, f"date={DAY0 + timedelta(days=1)}")
    old = json.loads(store.fs.open_input_stream(f"{folder}/{MANIFEST}").read())
    backfill(s3, catalog, DAY0 + timedelta(days=1), DAY0 + timedelta(days=1), views=[view])
    after = listing(store)
    new = json.loads(store.fs.open_input_stream(f"{folder}/{MANIFEST}").read())
    assert new["run"] != old["run"] and new["rows"] == old["rows"]
    assert sorted(p for p in after if p.startswith(folder + "/")) == sorted(
        [f"{folder}/{MANIFEST}", *(f"{folder}/{n}" for n in new["files"])])  # the old files are gone
    untouched = {p: s for p, s in before.items() if not p.startswith(folder + "/") and f"/{QUARANTINE}/" not in p}
    assert {p: after.get(p) for p in untouched} == untouched  # other days and views: not a byte changed


def test_a_run_that_fails_before_commit_leaves_the_bucket_as_it_was(stores: tuple[Any, Any, Any],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    _, s3, catalog = stores
    backfill(s3, catalog, DAY0, END)
    before = listing(store_for(s3))

    def crash(*_: Any) -> None:
        raise RuntimeError("the driver died before the commit")

    monkeypatch.setattr(store_commit, "commit_view", crash)
    with pytest.raises(RuntimeError, match="driver died"):
        backfill(s3, catalog, DAY0, END)
    assert listing(store_for(s3)) == before  # no staged object left behind, no day touched


def test_point_in_time_join_training_set_and_materialization_read_s3(tmp_path: Path, s3_server: Any,
                                                                      redis_url: str) -> None:
    from quiver.online.materialize import materialize
    from tests.integration.test_pit_backfill import FIRST, LAST, _demo_project

    local, catalog, labels, _ = _demo_project(tmp_path)
    s3 = s3_config(local, s3_server)
    backfill(local, catalog, FIRST, LAST)
    backfill(s3, catalog, FIRST, LAST)
    expected = get_historical_features(labels, "fraud_model", catalog=catalog, config=local, full_feature_names=True)
    got = get_historical_features(labels, "fraud_model", catalog=catalog, config=s3, full_feature_names=True)
    pd.testing.assert_frame_equal(got, expected)
    # A training set and its labels on the bucket too (one upload: whole or absent).
    uri = s3_server.uri("quiver-lake", "training/fraud.parquet")
    assert write_training_set(got, uri) == "s3://quiver-lake/training/fraud.parquet"
    store = store_for(s3)
    read_back = pq.read_table("quiver-lake/training/fraud.parquet", filesystem=store.fs).to_pandas()
    pd.testing.assert_frame_equal(read_back, got.reset_index(drop=True))
    # Materialization reads the same partitions through the manifests.
    from dataclasses import replace

    report = materialize(replace(s3, redis_url=redis_url), catalog, end=datetime(2026, 11, 3, tzinfo=UTC))
    assert all(v.rows_read > 0 for v in report.views.values())
    assert partition_table(store, "user_spend", "tiles") is not None


def test_bad_offline_roots_fail_with_the_setting_named(stores: tuple[Any, Any, Any],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from dataclasses import replace

    local, s3, catalog = stores
    with pytest.raises(QuiverError, match=r"offline_root 'ftp://host/x': unknown URI scheme 'ftp'"):
        backfill(replace(local, offline_root="ftp://host/x"), catalog, DAY0, END)
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/config")
    with pytest.raises(QuiverError, match=r"offline_root s3://quiver-lake/offline-\w+: no AWS credentials found"):
        backfill(s3, catalog, DAY0, END)
    view = catalog.views[sorted(catalog.views)[0]]
    feature = f"{view.name}:{[*view.fields, *view.aggregations][0].name}"
    labels = pa.table({k: [1] for k in view.key_names}
                      | {"event_ts": pa.array([0], pa.timestamp("us", tz="UTC"))}).to_pandas()
    with pytest.raises(QuiverError, match="no AWS credentials found"):
        get_historical_features(labels, [feature], catalog=catalog, config=s3)


def test_late_stream_events_go_to_the_bucket_and_into_the_next_backfill(tmp_path: Path, s3_server: Any) -> None:
    """With the offline store on S3, the stream's feeder writes its late events there (one PUT per file) and
    the next backfill reads them with the source's files: its rows equal a folder store's whose source holds
    the same events. Before, late events went to a local folder no backfill of a URI root read."""
    from quiver.streaming.feeder import Feeder, SourceFeed
    from quiver.streaming.late import late_events
    from quiver.streaming.paths import StreamPaths
    from tests.integration.test_backfill_support import day_us, make_events, project, write_events

    events = make_events()
    s3_config_, catalog = project(tmp_path / "s3")
    s3 = s3_config(s3_config_, s3_server)
    source = catalog.sources["events"]
    keys = tuple((v.name, tuple(v.key_names)) for v in catalog.views.values() if v.source == "events")
    columns = tuple((c, d) for c, d in source.columns if c != source.timestamp_field)
    feed = SourceFeed("events", columns, keys, "ts", watermark_delay_us=0, allowed_lateness_us=0)
    noon = day_us(DAY0 + timedelta(days=1)) + 12 * 3_600_000_000
    lines = [{"ts_us": noon, "user_id": 3, "merchant_id": 2, "amount": 10.5, "qty": 1, "flag": True, "cat": "a"},
             # behind the watermark (noon) by hours: late, so the batch route's
             {"ts_us": noon - 5 * 3_600_000_000, "user_id": 3, "merchant_id": 2, "amount": 99.0, "qty": 4,
              "flag": False, "cat": "b"},
             {"ts_us": noon - 7 * 3_600_000_000, "user_id": 7, "merchant_id": 1, "amount": 1.25, "qty": -2,
              "flag": None, "cat": None}]
    stream = tmp_path / "stream"
    stream.mkdir()
    (stream / "0001.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    store = store_for(s3)
    feeder = Feeder({"events": stream}, StreamPaths.at(tmp_path / "state"), {"events": feed}, store,
                    clock=lambda: (noon + 3_600_000_000) / 1e6)
    assert feeder.feed().late == {"events": 2}
    files = store.late_event_files("events")
    assert len(files) == 1 and files[0].startswith(f"{store.base}/_late_events/events/date=")
    assert not (tmp_path / "s3" / "offline").exists()  # nothing late left on the local disk
    late = late_events(store, "events")
    assert late is not None and sorted(late.column("amount").to_pylist()) == [1.25, 99.0]

    folder, _ = project(tmp_path / "folder")  # the same events, the late two in the source itself
    late_rows = pa.Table.from_pylist([{**{k: v for k, v in line.items() if k != "ts_us"},
                                       "ts": datetime.fromtimestamp(line["ts_us"] / 1e6, UTC)}
                                      for line in lines[1:]], schema=events.schema)
    write_events(pa.concat_tables([events, late_rows]), tmp_path / "folder" / "events")
    write_events(events, tmp_path / "s3" / "events")
    backfill(s3, catalog, DAY0, END)
    backfill(folder, catalog, DAY0, END)
    for view in catalog.views.values():
        if view.source == "events":
            assert_rows_equal(s3_rows(s3, view), store_rows(folder.offline_dir, view), f"{view.name}: late on s3")


def sources_on_s3(local: Any, catalog: Any, s3_server: Any, prefix: str) -> Any:
    """`catalog` with every source's files copied to the bucket under `prefix` and its path the bucket's URI."""
    from dataclasses import replace

    import pyarrow.fs as pafs

    with contextlib.suppress(OSError):
        s3_server.create_bucket(BUCKET)
    fs = store_for(replace(local, offline_root=s3_server.uri(BUCKET, prefix))).fs
    sources = {}
    for name, source in catalog.sources.items():
        pafs.copy_files(str(local.root / source.path), f"{BUCKET}/{prefix}/{name}",
                        source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)
        sources[name] = replace(source, path=s3_server.uri(BUCKET, f"{prefix}/{name}"))
    return replace(catalog, sources=sources)


def test_sources_on_s3_are_read_by_the_catalog_backfill_join_and_materialization(
        tmp_path: Path, s3_server: Any, redis_url: str) -> None:
    """Every source of the demo's catalog in the bucket (its path an s3:// URI): the catalog reads the same
    schema from the footers there; a DuckDB backfill (into a folder, and into the bucket beside them), the
    point-in-time join's raw heads and materialization's current tile read them, and every answer equals the
    same catalog's on local files. Before, a source path could only be a folder."""
    from dataclasses import replace

    from quiver.catalog.schema import read_source_schema
    from quiver.online.materialize import materialize
    from tests.integration.test_pit_backfill import FIRST, LAST, _demo_project

    local, catalog, labels, _ = _demo_project(tmp_path / "local")
    remote = sources_on_s3(local, catalog, s3_server, f"sources-{tmp_path.name}")
    for name, source in remote.sources.items():
        assert source.path.startswith("s3://")
        assert read_source_schema(source.path, local.root) == read_source_schema(catalog.sources[name].path,
                                                                                local.root)
    into_folder = replace(local, offline_root=str(tmp_path / "from-s3"))
    into_bucket = s3_config(local, s3_server)
    backfill(local, catalog, FIRST, LAST)
    backfill(into_folder, remote, FIRST, LAST)
    backfill(into_bucket, remote, FIRST, LAST)
    for view in catalog.views.values():
        expected = store_rows(local.offline_dir, view)
        assert expected, view.name
        assert_rows_equal(store_rows(into_folder.offline_dir, view), expected, f"{view.name}: s3 sources")
        assert_rows_equal(s3_rows(into_bucket, view), expected, f"{view.name}: s3 sources and offline store")
    expected = get_historical_features(labels, "fraud_model", catalog=catalog, config=local, full_feature_names=True)
    got = get_historical_features(labels, "fraud_model", catalog=remote, config=into_folder, full_feature_names=True)
    pd.testing.assert_frame_equal(got, expected)
    end = datetime(2026, 11, 2, 13, 7, tzinfo=UTC)  # inside a tile: the current tile comes from the raw source
    heads = []
    for config, cat, name in ((local, catalog, "local"), (into_folder, remote, "remote")):
        report = materialize(replace(config, redis_url=redis_url, project=name), cat, end=end, full=True)
        heads.append({name: v.head_tiles for name, v in report.views.items()})
    assert heads[0] == heads[1] and sum(heads[0].values()) > 0


def test_a_source_uri_with_no_files_or_a_bad_scheme_is_named(tmp_path: Path, s3_server: Any) -> None:
    from quiver.catalog.schema import read_source_schema

    with pytest.raises(QuiverError, match=r"no Parquet files match 's3://quiver-lake/nothing-here"):
        with contextlib.suppress(OSError):
            s3_server.create_bucket(BUCKET)
        read_source_schema(s3_server.uri(BUCKET, "nothing-here"), tmp_path)
    with pytest.raises(QuiverError, match=r"source path 'ftp://host/events': unknown URI scheme 'ftp'"):
        read_source_schema("ftp://host/events", tmp_path)


def test_a_catalog_whose_source_is_in_the_bucket_loads_and_the_daily_gate_reads_it(
        tmp_path: Path, s3_server: Any) -> None:
    """Definitions naming an s3:// source load through the real loader (the schema read from the bucket's
    footers); the scheduled quality gate reads the day's file in the bucket (its null keys fail it, so it goes
    to the source's _quarantine/). A `_SUCCESS` marker beside the data is not read as Parquet, nor gated."""
    from quiver.catalog.loader import load_catalog
    from quiver.pipelines.scheduled import quality_gate_day
    from tests.integration.test_backfill_support import make_events

    with contextlib.suppress(OSError):
        s3_server.create_bucket(BUCKET)
    prefix = f"defs-{tmp_path.name}/events"
    fs = store_for(s3_config(project(tmp_path / "p")[0], s3_server)).fs
    with fs.open_output_stream(f"{BUCKET}/{prefix}/date=2024-03-01/part-0.parquet") as out:
        pq.write_table(make_events(), out)
    with fs.open_output_stream(f"{BUCKET}/{prefix}/_SUCCESS") as out:  # a marker, not data
        out.write(b"")
    uri = s3_server.uri(BUCKET, prefix)
    root = tmp_path / "defs"
    (root / "feature_defs").mkdir(parents=True)
    (root / "quiver.yaml").write_text(f"project: defs\nregistry_url: sqlite:///{root}/registry.db\n")
    (root / "feature_defs" / "definitions.py").write_text(
        "from quiver import Entity, FeatureView, Field, Float64, Source\n"
        "user = Entity(name='user', join_keys=['user_id'])\n"
        f"events = Source(name='events', path={uri!r}, timestamp_field='ts')\n"
        "amounts = FeatureView(name='amounts', entities=[user], source=events, ttl='1d',\n"
        "                      schema=[Field('amount', Float64)])\n")
    catalog = load_catalog(root / "feature_defs", root=root)
    assert dict(catalog.sources["events"].columns)["amount"] == "float64"
    day = quality_gate_day("2024-03-01", str(root / "quiver.yaml"))
    [entry] = day["sources"]["events"]  # the _SUCCESS marker is not a batch
    assert entry["file"].endswith(f"{prefix}/date=2024-03-01/part-0.parquet") and not entry["passed"]
    assert f"{prefix}/_quarantine/events/" in entry["quarantine"]
