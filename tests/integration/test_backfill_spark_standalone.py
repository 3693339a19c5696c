"""The same Spark backfill on a real standalone cluster (a master and one worker started from the scripts
bundled with pyspark) gives exactly what local mode gives."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from quiver.offline.backfill import backfill
from quiver.offline.engines import spark_session, stop_spark
from tests.harness import SparkStandalone
from tests.integration.test_backfill_support import DAY0, assert_rows_equal, project, store_rows

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """(master URL, master web port) of a master and one 2-core worker."""
    try:
        with SparkStandalone(tmp_path_factory.mktemp("standalone"), workers=1, cores=2) as cluster:
            yield cluster.url, cluster.web
    finally:
        stop_spark()


def _status(web_port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{web_port}/json/", timeout=5) as response:
        return dict(json.load(response))


def test_standalone_cluster_backfill_equals_local_mode(standalone: tuple[str, int], tmp_path: Path) -> None:
    url, web = standalone
    config, catalog = project(tmp_path)
    end = DAY0 + timedelta(days=2)
    local = replace(config, offline_root="offline-local", spark_master="local[2]")
    cluster = replace(config, offline_root="offline-cluster", spark_master=url)
    local_report = backfill(local, catalog, DAY0, end, engine="spark")
    cluster_report = backfill(cluster, catalog, DAY0, end, engine="spark")
    assert spark_session(url).sparkContext.master == url
    apps = _status(web)["activeapps"]
    assert [a["name"] for a in apps] == ["quiver"], apps  # the job ran on the cluster, not in-process
    for view in catalog.views.values():
        assert_rows_equal(store_rows(cluster.offline_dir, view), store_rows(local.offline_dir, view),
                          f"{view.name}: standalone vs local")
        assert cluster_report.views[view.name].rows_by_date == local_report.views[view.name].rows_by_date
        assert cluster_report.views[view.name].rows_written > 0
