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


def test_job_settings_reuse_objects_and_skip_rocksdb_compression_unless_overridden(tmp_path: Path) -> None:
    """The two measured defaults (docs/streaming.md): object reuse, uncompressed RocksDB state; both can
    be set back with --flink-set, and a heap state backend gets no RocksDB option."""
    from quiver.compile.flink import FlinkJob
    from quiver.streaming.job import JobOptions, flink_config
    from quiver.streaming.paths import StreamPaths

    job = FlinkJob(settings=(("table.local-time-zone", "UTC"),), statements=(), inserts=(), views=(), sources=())
    paths = StreamPaths.at(tmp_path)
    rocks = flink_config(job, JobOptions(), paths, None)
    assert rocks["pipeline.object-reuse"] == "true"
    assert rocks["state.backend.rocksdb.compression.per.level"] == "NO_COMPRESSION"
    assert rocks["table.local-time-zone"] == "UTC" and rocks["state.backend.type"] == "rocksdb"
    heap = flink_config(job, JobOptions(state_backend="hashmap"), paths, None)
    assert "state.backend.rocksdb.compression.per.level" not in heap
    back = flink_config(job, JobOptions(extra=(("pipeline.object-reuse", "false"),
                                               ("state.backend.rocksdb.compression.per.level", "LZ4_COMPRESSION"))),
                        paths, None)
    assert back["pipeline.object-reuse"] == "false"
    assert back["state.backend.rocksdb.compression.per.level"] == "LZ4_COMPRESSION"
