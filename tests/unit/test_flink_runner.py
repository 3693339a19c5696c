"""Runner pieces without Flink: the Kafka connector jar lookup and KEY=VALUE settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from quiver.catalog.errors import QuiverError
from quiver.streaming.runner import _pairs, kafka_jars


def test_kafka_jar_comes_from_quiver_flink_jars_or_fails_with_one_clear_message(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    jar = tmp_path / "flink-sql-connector-kafka-4.0.0-2.0.jar"
    jar.write_bytes(b"PK")
    monkeypatch.setenv("QUIVER_FLINK_JARS", str(jar))
    assert kafka_jars()[0] == jar
    monkeypatch.setenv("QUIVER_FLINK_JARS", str(tmp_path / "missing.jar"))
    with pytest.raises(QuiverError, match="does not exist"):
        kafka_jars()
    monkeypatch.setenv("QUIVER_FLINK_JARS", "")
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)  # no PyFlink lib folder to search
    with pytest.raises(QuiverError, match=r"flink-sql-connector-kafka.*QUIVER_FLINK_JARS"):
        kafka_jars()


def test_settings_are_key_value_pairs() -> None:
    assert _pairs(["pipeline.object-reuse=true", " a = b=c "]) == (("pipeline.object-reuse", "true"), ("a", "b=c"))
    with pytest.raises(QuiverError, match="KEY=VALUE"):
        _pairs(["no-equals"])
