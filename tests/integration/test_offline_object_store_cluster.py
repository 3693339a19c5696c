"""A Spark standalone cluster — one master, two workers, each with its own work folder — backfills the example
catalog into S3 (moto's server) through s3a and runs the point-in-time join from it; both equal DuckDB's
answers on local files. Credentials reach every JVM the usual way (the workers' environment), never through
Spark's settings. The workers share nothing but the bucket: the source events, the late stream events and
the offline store all live there.

Kept small (2 days, 40 users): benchmarks/pit_scale.py carries the sizes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd
import pytest

from quiver.config import Config
from quiver.offline.backfill import backfill
from quiver.offline.engines import spark_session, stop_spark
from quiver.offline.pit import get_historical_features
from quiver.offline.store import store_for
from tests.harness import SparkStandalone
from tests.integration.object_store_support import BUCKET, listing, s3_config, s3_rows
from tests.integration.test_backfill_spark_standalone import _status
from tests.integration.test_backfill_support import assert_rows_equal, store_rows
from tests.integration.test_offline_object_store import sources_on_s3
from tests.integration.test_pit_backfill import FIRST, LAST, _demo_project

pytestmark = [pytest.mark.integration, pytest.mark.slow]
WORKERS = 2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, s3_server: Any) -> Iterator[tuple[str, int]]:
    """(master URL, master web port) of a running cluster; started after s3_server put the credentials in
    this process's environment, which the daemons (and so their executors) inherit. Each worker has its own
    folder; they share only the bucket."""
    stop_spark()  # a local session of an earlier module would hold the JVM
    try:
        with SparkStandalone(tmp_path_factory.mktemp("cluster"), workers=WORKERS, cores=1, memory="1g") as running:
            yield running.url, running.web
    finally:
        stop_spark()


@dataclass(frozen=True)
class Lake:
    """The demo project backfilled twice: by DuckDB into a folder, and by the cluster into the bucket."""

    local: Config
    s3: Config
    catalog: Any
    remote: Any  # the catalog with its sources in the bucket
    labels: pd.DataFrame
    local_report: Any
    report: Any


@pytest.fixture(scope="module")
def lake(cluster: tuple[str, int], s3_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Lake:
    url, _ = cluster
    local, catalog, labels, _ = _demo_project(tmp_path_factory.mktemp("lake"))
    s3 = replace(s3_config(local, s3_server, "cluster"), spark_master=url, engine="spark")
    late = _late_file(local, catalog)  # late stream events, on each side's offline store: executors read s3a
    for store in (store_for(local), store_for(s3)):
        store.put(store.path("_late_events", "transactions", f"date={FIRST}", "upto-x.parquet"), late)
    remote = sources_on_s3(local, catalog, s3_server, "cluster-sources")  # the same events, in the bucket
    local_report = backfill(local, catalog, FIRST, LAST, engine="duckdb")
    report = backfill(s3, remote, FIRST, LAST, engine="spark")
    return Lake(local, s3, catalog, remote, labels, local_report, report)


def test_cluster_backfill_and_join_on_s3_equal_duckdb(cluster: tuple[str, int], lake: Lake) -> None:
    url, web = cluster
    local, s3, catalog, remote, labels = lake.local, lake.s3, lake.catalog, lake.remote, lake.labels
    local_report, report = lake.local_report, lake.report
    in_source = _source_rows_between(local, catalog, "transactions")
    for name, view in catalog.views.items():
        if view.source == "transactions":
            assert report.views[name].events_read == local_report.views[name].events_read == in_source + 5
    status = _status(web)
    assert [a["name"] for a in status["activeapps"]] == ["quiver"]  # it ran on the cluster
    assert spark_session(url).sparkContext.master == url
    assert len([w for w in status["workers"] if w["coresused"] > 0]) == WORKERS, status["workers"]
    for view in catalog.views.values():
        assert_rows_equal(s3_rows(s3, view), store_rows(local.offline_dir, view), f"{view.name}: cluster s3 vs duckdb")
        assert report.views[view.name].rows_written > 0
    assert not [p for p in listing(store_for(s3)) if "/.staging-" in p]
    expected = get_historical_features(labels, "fraud_model", catalog=catalog, config=local, full_feature_names=True)
    got = get_historical_features(labels, "fraud_model", catalog=remote, config=s3, engine="spark",
                                  full_feature_names=True)
    columns = [c for c in expected.columns if "__" in c]
    assert len(columns) >= 15 and len(got) == len(labels)
    pd.testing.assert_frame_equal(got[columns], expected[columns], check_exact=False, rtol=1e-9)


def _late_file(config: Any, catalog: Any) -> bytes:
    """Five transactions of the first day, as the stream's feeder would have set them aside (Parquet)."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from quiver.catalog.schema import source_files

    source = catalog.sources["transactions"]
    table = pa.concat_tables([pq.read_table(f, partitioning=None) for f in source_files(source.path, config.root)])
    first_day = [t is not None and t.date() == FIRST for t in table[source.timestamp_field].to_pylist()]
    buffer = io.BytesIO()
    pq.write_table(table.filter(first_day).slice(0, 5), buffer)
    return buffer.getvalue()


def _source_rows_between(config: Any, catalog: Any, name: str) -> int:
    """Rows of the source's own files dated FIRST..LAST (what a backfill reads without late events)."""
    import pyarrow.parquet as pq

    from quiver.catalog.schema import source_files

    source = catalog.sources[name]
    times = [t for f in source_files(source.path, config.root) for t in
             pq.read_table(f, columns=[source.timestamp_field], partitioning=None)[source.timestamp_field].to_pylist()]
    return sum(1 for t in times if t is not None and FIRST <= t.date() <= LAST)


def test_labels_in_the_bucket_make_a_training_set_in_the_bucket_without_the_driver(
        cluster: tuple[str, int], lake: Lake, s3_server: Any) -> None:
    """Labels as a Parquet prefix on the bucket, the training set written to the bucket by the executors and
    committed by one manifest, equal to DuckDB's answer on local files. Spark's own stage metrics show what
    reached the driver during the write: the labels' bounds (one row), never the rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from quiver.offline.spark_training_sets import (
        read_training_set,
        spark_historical_features,
        write_historical_features,
    )
    from tests.harness import free_port

    url, _ = cluster
    labels = pd.concat([lake.labels] * 20, ignore_index=True)  # 12,000 rows: a collect would show
    fs = store_for(lake.s3).fs
    table = pa.Table.from_pandas(labels, preserve_index=False)
    step = -(-len(labels) // 4)
    for i in range(4):
        pq.write_table(table.slice(i * step, step), f"{BUCKET}/labels-in/part-{i}.parquet", filesystem=fs)
    stop_spark()  # the same cluster, with the UI's REST API on: Spark's figures for what the driver received
    ui = free_port()
    spark = spark_session(url, conf={"spark.ui.enabled": "true", "spark.ui.port": str(ui)})
    out, labels_in = s3_server.uri(BUCKET, "training/fraud_v3"), s3_server.uri(BUCKET, "labels-in")
    before = {s["stageId"] for s in _rest(ui, spark, "stages")}
    written = write_historical_features(labels_in, "fraud_model", out, catalog=lake.remote, config=lake.s3,
                                        full_feature_names=True)
    stages = [s for s in _rest(ui, spark, "stages") if s["stageId"] not in before]
    before = {s["stageId"] for s in _rest(ui, spark, "stages")}  # the same join collected, for comparison
    collected = spark_historical_features(labels_in, "fraud_model", catalog=lake.remote, config=lake.s3,
                                          full_feature_names=True).toArrow()
    collecting = [s for s in _rest(ui, spark, "stages") if s["stageId"] not in before]
    expected = get_historical_features(labels, "fraud_model", catalog=lake.catalog, config=lake.local,
                                       full_feature_names=True)
    assert written.rows == len(labels) and written.uri == out
    got = read_training_set(out).to_pandas().sort_values("label_row", kind="stable").reset_index(drop=True)
    columns = [c for c in expected.columns if "__" in c]
    assert len(columns) >= 15
    pd.testing.assert_frame_equal(got[columns], expected[columns], check_exact=False, rtol=1e-9,
                                  check_dtype=False)
    assert list(got.columns[:len(labels.columns)]) == list(labels.columns)
    assert sum(s["outputBytes"] for s in stages) > 200_000, stages  # the executors wrote the set
    # What tasks sent the driver (Spark's resultSize: task status and metrics, the bounds' one row) during the
    # write, against the same join collected: the collect carried the rows, the write did not.
    to_driver, by_collect = sum(s["resultSize"] for s in stages), sum(s["resultSize"] for s in collecting)
    assert collected.num_rows == len(labels)
    assert to_driver + collected.nbytes / 2 < by_collect, (to_driver, by_collect, collected.nbytes)
    names = listing(store_for(replace(lake.s3, offline_root=out)))
    assert "_manifest.json" in {p.rsplit("/", 1)[-1] for p in names}
    assert not [p for p in names if "/.staging-" in p], names


def _rest(port: int, spark: Any, what: str) -> list[dict[str, Any]]:
    import json
    import urllib.request

    app = spark.sparkContext.applicationId
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/applications/{app}/{what}", timeout=10) as r:
        return list(json.load(r))
