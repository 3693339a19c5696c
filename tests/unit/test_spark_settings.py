"""The user's Spark settings: quiver.yaml's `spark:` section, its environment overrides and errors, and how a new
session's settings are merged with Quiver's defaults and the settings its answers depend on (no Spark here)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from quiver import Config, QuiverError, load_config
from quiver.config import DEFAULT_CONFIG_TEXT, SparkSettings
from quiver.offline.engines import (
    SPARK_CONF,
    SPARK_CORRECTNESS,
    SPARK_DEFAULTS,
    adopted_session_problems,
    merged_spark_conf,
)

TIME_ZONE = "spark.sql.session.timeZone"
PARTITIONS = "spark.sql.shuffle.partitions"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("QUIVER_"):
            monkeypatch.delenv(key)


def _config(tmp_path: Path, text: str) -> Config:
    path = tmp_path / "quiver.yaml"
    path.write_text(text)
    return load_config(path)


SECTION = """\
spark:
  master: spark://host:7077
  conf:
    spark.sql.shuffle.partitions: 64
    spark.executor.memory: 8g
    spark.sql.adaptive.enabled: true
    spark.memory.fraction: 0.75
"""


def test_the_spark_section_reads_into_typed_settings(tmp_path: Path) -> None:
    config = _config(tmp_path, SECTION)
    assert config.spark_master == "spark://host:7077"  # the flat field the existing callers read
    assert config.spark == SparkSettings("spark://host:7077", {
        PARTITIONS: "64", "spark.executor.memory": "8g", "spark.sql.adaptive.enabled": "true",
        "spark.memory.fraction": "0.75"})
    with pytest.raises(AttributeError):
        config.spark.master = "local[1]"  # type: ignore[misc]  # frozen
    assert pickle.loads(pickle.dumps(config)) == config  # a Config still travels to worker processes


def test_the_flat_spark_master_keeps_working_and_may_repeat_the_section(tmp_path: Path) -> None:
    assert _config(tmp_path, "spark_master: spark://old:7077\n").spark == SparkSettings("spark://old:7077")
    same = _config(tmp_path, "spark_master: spark://h:7077\nspark:\n  master: spark://h:7077\n")
    assert same.spark_master == "spark://h:7077"
    assert _config(tmp_path, "spark:\n").spark == SparkSettings()  # an empty section: the defaults


def test_the_starter_file_shows_the_section_and_loads_with_the_defaults(tmp_path: Path) -> None:
    assert "spark:\n  master: local[2]" in DEFAULT_CONFIG_TEXT and "#   spark.sql.shuffle.partitions" in \
        DEFAULT_CONFIG_TEXT
    assert _config(tmp_path, DEFAULT_CONFIG_TEXT.format(project="demo")).spark == SparkSettings("local[2]", {})


def test_environment_overrides_the_master_and_the_conf_key_by_key(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUIVER_SPARK_MASTER", "local[3]")
    monkeypatch.setenv("QUIVER_SPARK_CONF", " spark.sql.shuffle.partitions=8, spark.driver.memory=4g,")
    config = _config(tmp_path, SECTION)
    assert config.spark_master == "local[3]"
    assert config.spark_conf == {PARTITIONS: "8", "spark.executor.memory": "8g", "spark.sql.adaptive.enabled": "true",
                                 "spark.memory.fraction": "0.75", "spark.driver.memory": "4g"}


def test_environment_alone_sets_the_conf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUIVER_SPARK_CONF", "spark.sql.shuffle.partitions=8")
    assert _config(tmp_path, "project: p\n").spark_conf == {PARTITIONS: "8"}


@pytest.mark.parametrize(("text", "message"), [
    ("spark:\n  conf:\n    sql.shuffle.partitions: 8\n", "spark.conf: 'sql.shuffle.partitions' is not a Spark setting"),
    ("spark:\n  conf:\n    spark.executor.memory: [8g]\n", "spark.conf: spark.executor.memory must be a string, a "
                                                            "number or true/false, got ['8g']"),
    ("spark:\n  conf:\n    spark.executor.memory:\n", "spark.conf: spark.executor.memory must be a string"),
    ("spark:\n  conf:\n    spark.master: local[1]\n", "spark.master belongs in the spark section's master key"),
    ("spark:\n  conf: 8\n", "spark.conf must be a mapping of spark.* keys"),
    ("spark:\n  masters: local[1]\n", "spark: unknown key(s) masters; known: conf, master"),
    ("spark:\n  master: 7\n", "spark.master must be a Spark master URL"),
    ("spark: local[2]\n", "spark must be a mapping with master and/or conf"),
    ("spark_master: spark://a:7077\nspark:\n  master: spark://b:7077\n",
     "spark_master ('spark://a:7077') and spark.master ('spark://b:7077') differ; keep one, spark.master"),
    ("spark_conf:\n  spark.x: 1\nspark:\n  conf:\n    spark.x: 2\n", "spark_conf ({'spark.x': '1'}) and spark.conf"),
])
def test_bad_spark_settings_name_the_file_and_the_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(QuiverError) as info:
        _config(tmp_path, text)
    assert message in str(info.value)
    assert str(tmp_path / "quiver.yaml") in str(info.value)


def test_a_bad_environment_conf_names_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUIVER_SPARK_CONF", "spark.sql.shuffle.partitions=8,executor.memory=2g")
    with pytest.raises(QuiverError, match=r"QUIVER_SPARK_CONF: 'executor\.memory' is not a Spark setting"):
        _config(tmp_path, "")
    monkeypatch.setenv("QUIVER_SPARK_CONF", "spark.sql.shuffle.partitions")
    with pytest.raises(QuiverError, match=r"QUIVER_SPARK_CONF: 'spark\.sql\.shuffle\.partitions' is not key=value"):
        _config(tmp_path, "")


def test_settings_built_in_code_are_checked_and_read_as_spark_does() -> None:
    assert SparkSettings("local[1]", {"spark.sql.adaptive.enabled": False, PARTITIONS: 3}).conf == {
        "spark.sql.adaptive.enabled": "false", PARTITIONS: "3"}
    with pytest.raises(QuiverError, match="'shuffle' is not a Spark setting"):
        SparkSettings("local[1]", {"shuffle": "3"})


# ---- the merge: a new session's settings ----


def test_without_user_settings_a_session_gets_quivers_defaults_and_correctness() -> None:
    assert merged_spark_conf({}) == dict(SPARK_CONF) == {**SPARK_DEFAULTS, **SPARK_CORRECTNESS}
    assert not set(SPARK_DEFAULTS) & set(SPARK_CORRECTNESS)


def test_user_settings_replace_defaults_and_the_caller_adds_object_store_settings() -> None:
    merged = merged_spark_conf({PARTITIONS: "64", "spark.executor.memory": "8g", "spark.custom.thing": "x"},
                               extra={"spark.hadoop.fs.s3a.endpoint": "http://minio:9000"})
    assert (merged[PARTITIONS], merged["spark.executor.memory"], merged["spark.custom.thing"]) == ("64", "8g", "x")
    assert merged["spark.hadoop.fs.s3a.endpoint"] == "http://minio:9000"
    assert merged["spark.driver.memory"] == SPARK_DEFAULTS["spark.driver.memory"]  # a default the user left alone
    assert {key: merged[key] for key in SPARK_CORRECTNESS} == SPARK_CORRECTNESS


def test_a_user_class_path_goes_first_and_the_connectors_stay() -> None:
    merged = merged_spark_conf({"spark.driver.extraClassPath": "/opt/mine.jar"},
                               classpath={"spark.driver.extraClassPath": "/jars/s3a/*",
                                          "spark.executor.extraClassPath": "/jars/s3a/*"})
    assert merged["spark.driver.extraClassPath"] == "/opt/mine.jar:/jars/s3a/*"
    assert merged["spark.executor.extraClassPath"] == "/jars/s3a/*"


def test_a_user_setting_equal_to_quivers_needs_is_kept() -> None:
    merged = merged_spark_conf({TIME_ZONE: "Etc/UTC", "spark.sql.parquet.datetimeRebaseModeInRead": "exception"})
    assert merged[TIME_ZONE] == "Etc/UTC"
    assert merged["spark.sql.parquet.datetimeRebaseModeInRead"] == "exception"


def test_a_user_setting_against_quivers_needs_is_a_named_error() -> None:
    with pytest.raises(QuiverError) as info:
        merged_spark_conf({TIME_ZONE: "Europe/Paris", PARTITIONS: "8",
                           "spark.sql.parquet.outputTimestampType": "INT96"})
    message = str(info.value)
    assert ("spark.sql.session.timeZone=Europe/Paris in the Spark settings (quiver.yaml spark.conf or "
            "QUIVER_SPARK_CONF): Quiver's point-in-time joins and date partitions compare UTC microseconds; "
            "remove it or set UTC") in message
    assert "spark.sql.parquet.outputTimestampType=INT96" in message and "set TIMESTAMP_MICROS" in message
    assert PARTITIONS not in message
    with pytest.raises(QuiverError, match=r"datetimeRebaseModeInWrite=LEGACY .*LEGACY would shift dates"):
        merged_spark_conf({"spark.sql.parquet.datetimeRebaseModeInWrite": "LEGACY"})


def test_an_adopted_sessions_problems_name_each_setting_its_value_and_the_fix() -> None:
    current = {TIME_ZONE: "America/New_York", "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
               "spark.sql.parquet.int96RebaseModeInRead": "LEGACY", PARTITIONS: "3"}
    problems = adopted_session_problems(current)
    assert len(problems) == 2
    assert problems[0] == ('spark.sql.session.timeZone=America/New_York (Quiver\'s point-in-time joins and date '
                           'partitions compare UTC microseconds; fix: spark.conf.set("spark.sql.session.timeZone", '
                           '"UTC"))')
    assert problems[1].startswith("spark.sql.parquet.int96RebaseModeInRead=LEGACY (")
    assert problems[1].endswith('fix: spark.conf.set("spark.sql.parquet.int96RebaseModeInRead", "CORRECTED"))')
    assert adopted_session_problems({TIME_ZONE: "Etc/UTC", **{k: v for k, v in SPARK_CORRECTNESS.items()
                                                             if k != TIME_ZONE}}) == []
