"""A Spark standalone cluster — one master, two workers, each with its own work folder — backfills the example
catalog into S3 (moto's server) through s3a and runs the point-in-time join from it; both equal DuckDB's
answers on local files. Credentials reach every JVM the usual way (the workers' environment), never through
Spark's settings. The workers share nothing but the bucket: the source events, the late stream events and
the offline store all live there.

Kept small (2 days, 40 users): benchmarks/pit_scale.py carries the sizes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from quiver.offline.backfill import backfill
from quiver.offline.engines import spark_session, stop_spark
from quiver.offline.pit import get_historical_features
from quiver.offline.store import store_for
from tests.harness import SparkStandalone
from tests.integration.object_store_support import listing, s3_config, s3_rows
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


def test_cluster_backfill_and_join_on_s3_equal_duckdb(cluster: tuple[str, int], s3_server: Any,
                                                      tmp_path: Path) -> None:
    url, web = cluster
    local, catalog, labels, _ = _demo_project(tmp_path)
    s3 = replace(s3_config(local, s3_server, "cluster"), spark_master=url, engine="spark")
    late = _late_file(local, catalog)  # late stream events, on each side's offline store: executors read s3a
    for store in (store_for(local), store_for(s3)):
        store.put(store.path("_late_events", "transactions", f"date={FIRST}", "upto-x.parquet"), late)
    remote = sources_on_s3(local, catalog, s3_server, "cluster-sources")  # the same events, in the bucket
    local_report = backfill(local, catalog, FIRST, LAST, engine="duckdb")
    report = backfill(s3, remote, FIRST, LAST, engine="spark")
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
