"""The user's Spark settings on a real local Spark: quiver.yaml's `spark.conf` reaches the session Quiver starts
(the shuffle partitions show in the plans, the backfill's own included), and a session that other code started
is checked, never changed.

One JVM serves the process: every test ends with no session running, and the JVM keeps Quiver's class path
(the first session of the module is Quiver's).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from quiver.catalog.errors import QuiverError
from quiver.config import Config, SparkSettings
from quiver.offline import engines
from quiver.offline.backfill import backfill
from quiver.offline.engines import SPARK_CORRECTNESS, spark_session, spark_session_for, stop_spark
from tests.integration.test_backfill_support import DAY0, assert_rows_equal, project, store_rows

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.heavy]
MASTER = "local[2]"
PARTITIONS = "spark.sql.shuffle.partitions"
TIME_ZONE = "spark.sql.session.timeZone"
# AQE off: the plan shows the planned shuffle partitions (AQE would coalesce them at run time).
USER_CONF = {PARTITIONS: "7", "spark.sql.adaptive.enabled": "false"}


@pytest.fixture(autouse=True)
def no_session_around() -> Iterator[None]:
    engines.spark_session(MASTER)  # the JVM starts with Quiver's class path (later modules may need s3a)
    stop_spark()
    yield
    stop_spark()


def _shuffle_partitions(plan: str) -> set[int]:
    return {int(n) for n in re.findall(r"hashpartitioning\([^()]*(?:\([^()]*\)[^()]*)*, (\d+)\)", plan)}


def _plan(frame: Any) -> str:
    return str(frame._jdf.queryExecution().executedPlan().toString())


def test_a_users_shuffle_partitions_reach_the_session_and_the_backfill(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    base, catalog = project(tmp_path)
    config = replace(base, spark_conf=USER_CONF)
    spark = spark_session_for(config)
    assert spark.conf.get(PARTITIONS) == "7"
    numbers = spark.range(100)
    assert _shuffle_partitions(_plan(numbers.groupBy((numbers.id % 5).alias("k")).count())) == {7}

    plans: list[str] = []
    write = engines.SparkEngine.write_by_date

    def write_seen(self: engines.SparkEngine, sql: str, params: Any, out_dir: Any) -> None:
        plans.append(_plan(self.session.sql(sql, args=dict(params))))
        write(self, sql, params, out_dir)

    monkeypatch.setattr(engines.SparkEngine, "write_by_date", write_seen)
    stop_spark()  # the backfill starts its own session from the project's settings
    spark_config = replace(config, offline_root="offline-spark")
    with caplog.at_level(logging.INFO, logger="quiver.offline.engines"):
        backfill(spark_config, catalog, DAY0, DAY0 + timedelta(days=1), engine="spark", views=["user_activity"])
    assert "spark.sql.shuffle.partitions=7 (yours, not Quiver's default 4)" in caplog.text  # what was applied
    assert "spark.sql.session.timeZone=UTC (Quiver's, needed)" in caplog.text
    assert plans and {7} == set().union(*map(_shuffle_partitions, plans)), plans
    assert engines.spark_session(MASTER, settings=config.spark).conf.get(PARTITIONS) == "7"
    duck = replace(base, offline_root="offline-duckdb")
    backfill(duck, catalog, DAY0, DAY0 + timedelta(days=1), engine="duckdb", views=["user_activity"])
    view = catalog.view("user_activity")
    assert_rows_equal(store_rows(spark_config.offline_dir, view), store_rows(duck.offline_dir, view), "7 partitions")


def test_quivers_own_session_follows_the_settings_asked_for() -> None:
    assert spark_session(MASTER, settings=SparkSettings(MASTER, {PARTITIONS: "9"})).conf.get(PARTITIONS) == "9"
    assert spark_session(MASTER).conf.get(PARTITIONS) == "4"  # Quiver's default again: its own session


def test_a_users_setting_against_quivers_needs_starts_no_session(tmp_path: Path) -> None:
    config = Config(root=tmp_path, spark_conf={TIME_ZONE: "Europe/Paris"})
    with pytest.raises(QuiverError, match=r"spark\.sql\.session\.timeZone=Europe/Paris in the Spark settings"):
        spark_session_for(config)
    from pyspark.sql import SparkSession

    assert SparkSession.getActiveSession() is None


def _foreign_session(conf: dict[str, str]) -> Any:
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(MASTER).appName("not-quiver")
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def test_an_adopted_session_with_a_wrong_time_zone_is_a_named_error_and_stays_as_it_was(tmp_path: Path) -> None:
    mine = _foreign_session({TIME_ZONE: "America/New_York"})
    try:
        config = Config(root=tmp_path, spark_conf=USER_CONF)
        with pytest.raises(QuiverError) as info:
            spark_session_for(config)
        message = str(info.value)
        assert "was not started by Quiver, and Quiver does not change it" in message
        assert "spark.sql.session.timeZone=America/New_York" in message
        assert 'spark.conf.set("spark.sql.session.timeZone", "UTC")' in message
        assert mine.conf.get(TIME_ZONE) == "America/New_York"
        assert mine.conf.get(PARTITIONS) != "7"  # quiver.yaml's settings are not applied to it either
    finally:
        mine.stop()


def test_an_adopted_session_keeps_its_own_settings(tmp_path: Path) -> None:
    mine = _foreign_session({**SPARK_CORRECTNESS, PARTITIONS: "3"})
    try:
        assert spark_session_for(Config(root=tmp_path)) is mine
        assert spark_session(MASTER) is mine
        assert mine.conf.get(PARTITIONS) == "3"  # not Quiver's default 4
        assert mine.conf.get("spark.sql.adaptive.enabled") == "true"
        stop_spark()
        assert mine.sparkContext._jsc is not None  # Quiver stops only the sessions it started
    finally:
        mine.stop()


def test_an_adopted_session_on_another_master_is_not_stopped(tmp_path: Path) -> None:
    mine = _foreign_session(dict(SPARK_CORRECTNESS))
    try:
        with pytest.raises(QuiverError, match=r"Quiver did not start runs on local\[2\].*Spark master is local\[1\]"):
            spark_session_for(Config(root=tmp_path, spark_master="local[1]"))
        assert mine.sparkContext._jsc is not None
    finally:
        mine.stop()
