"""Runner pieces without Flink: the Kafka connector jar lookup, KEY=VALUE settings, the job's settings and its
target (mini-cluster or a session cluster), the local session cluster's config."""

from __future__ import annotations

from pathlib import Path

import pytest

from quiver.catalog.errors import QuiverError
from quiver.streaming.options import kafka_jars, kafka_job_jars, settings_pairs
from quiver.streaming.paths import StreamPaths


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
    monkeypatch.setenv("QUIVER_JARS_DIR", str(tmp_path / "jars"))  # setup's folder, empty here
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)  # no PyFlink lib folder to search
    with pytest.raises(QuiverError, match=r"flink-sql-connector-kafka.*make setup.*QUIVER_FLINK_JARS"):
        kafka_jars()
    fetched = tmp_path / "jars" / "flink-kafka" / "flink-sql-connector-kafka-5.0.0-2.2.jar"
    fetched.parent.mkdir(parents=True)
    fetched.write_bytes(b"PK")
    assert kafka_jars() == [fetched]  # what `make setup` fetched
    with pytest.raises(QuiverError, match=r"quiver_parse.*redis-sink.*make setup"):
        kafka_job_jars()  # a Kafka job also needs Quiver's jar: its record parser
    ours = tmp_path / "jars" / "redis-sink" / "redis-sink-1.jar"
    ours.parent.mkdir(parents=True)
    ours.write_bytes(b"PK")
    assert kafka_job_jars() == [fetched, ours]


def test_settings_are_key_value_pairs() -> None:
    assert settings_pairs(["pipeline.object-reuse=true", " a = b=c "]) == (("pipeline.object-reuse", "true"), ("a", "b=c"))
    with pytest.raises(QuiverError, match="KEY=VALUE"):
        settings_pairs(["no-equals"])


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


def test_a_session_cluster_is_the_remote_target_and_the_mini_cluster_the_default(tmp_path: Path) -> None:
    from quiver.compile.flink import FlinkJob
    from quiver.streaming.job import JobOptions, flink_config, target_settings
    from quiver.streaming.runner import parse_args

    assert target_settings("") == {}
    assert target_settings("flink-jobmanager:8081") == {"execution.target": "remote",
                                                        "rest.address": "flink-jobmanager", "rest.port": "8081"}
    for bad in ("flink-jobmanager", ":8081", "host:port"):
        with pytest.raises(QuiverError, match="HOST:PORT"):
            target_settings(bad)
    job = FlinkJob(settings=(), statements=(), inserts=(), views=(), sources=())
    remote = flink_config(job, JobOptions(jobmanager="127.0.0.1:8081"), StreamPaths.at(tmp_path), None)
    assert remote["execution.target"] == "remote" and remote["rest.port"] == "8081"
    assert remote["execution.checkpointing.dir"] == (tmp_path / "checkpoints").resolve().as_uri()  # shared path
    assert "execution.target" not in flink_config(job, JobOptions(), StreamPaths.at(tmp_path), None)
    assert parse_args(["--jobmanager", "h:1"]).jobmanager == "h:1" and parse_args([]).jobmanager is None


def test_the_local_session_cluster_binds_loopback(tmp_path: Path) -> None:
    from quiver.streaming.cluster import SessionCluster

    home = tmp_path / "flink"
    (home / "bin").mkdir(parents=True)
    (home / "conf").mkdir()
    (home / "bin" / "jobmanager.sh").write_text("")
    for name in ("log4j.properties", "log4j-console.properties", "log4j-cli.properties"):
        (home / "conf" / name).write_text("")
    cluster = SessionCluster(tmp_path / "cluster", taskmanagers=2, home=home, rest_port=18081,
                             settings={"taskmanager.numberOfTaskSlots": "3"})
    import yaml

    conf = yaml.safe_load(cluster.write_config().read_text())
    assert cluster.jobmanager == "127.0.0.1:18081" and conf["rest.port"] == "18081"
    assert {conf[k] for k in ("jobmanager.bind-host", "taskmanager.bind-host", "rest.bind-address")} == {"127.0.0.1"}
    assert conf["taskmanager.numberOfTaskSlots"] == "3" and conf["heartbeat.timeout"] == "8000"
    with pytest.raises(QuiverError, match="at least one TaskManager"):
        SessionCluster(tmp_path / "x", taskmanagers=0, home=home)


def test_subtasks_not_yet_deployed_name_no_taskmanager(tmp_path: Path) -> None:
    """Flink's REST answers "(unassigned)" for a subtask still being scheduled: that is no machine to kill."""
    from quiver.streaming.cluster import SessionCluster

    answers = {
        "/jobs/j": {"vertices": [{"id": "v1"}, {"id": "v2"}]},
        "/jobs/j/vertices/v1/taskmanagers": {"taskmanagers": [{"taskmanager-id": "(unassigned)"}]},
        "/jobs/j/vertices/v2/taskmanagers": {"taskmanagers": [{"taskmanager-id": "tm1"}, {"taskmanager-id": ""}]},
        "/taskmanagers": {"taskmanagers": [{"id": "tm0"}, {"id": "tm1"}]},
    }
    cluster = SessionCluster(tmp_path / "cluster", taskmanagers=2, home=tmp_path)
    cluster.rest = lambda path, method="GET": answers[path]  # type: ignore[method-assign]
    assert cluster.job_taskmanagers("j") == {"tm1"}
    answers["/jobs/j/vertices/v2/taskmanagers"] = {"taskmanagers": [{"taskmanager-id": "(unassigned)"}]}
    assert cluster.job_taskmanagers("j") == set()


def test_a_java_error_is_summarised_by_its_cause_chain() -> None:
    from quiver.streaming.job import is_java_error, java_error_summary

    class Py4JJavaError(Exception):  # py4j's, as PyFlink raises it
        pass

    trace = ("An error occurred while calling o84.execute.\n"
             ": org.apache.flink.table.api.TableException: Cannot generate a valid execution plan\n"
             "\tat org.apache.flink.table.planner.Foo.bar(Foo.scala:64)\n\tat java.base/java.lang.Thread.run(Thread.java:840)\n"
             "Caused by: java.lang.OutOfMemoryError: Metaspace\n\tat q.r(R.java:1)\n\t... 25 more\n"
             "Caused by: java.lang.OutOfMemoryError: Metaspace\n\t... 3 more\n")
    assert is_java_error(Py4JJavaError(trace)) and not is_java_error(ValueError("x"))
    assert java_error_summary(Py4JJavaError(trace)) == (
        "org.apache.flink.table.api.TableException: Cannot generate a valid execution plan"
        " <- java.lang.OutOfMemoryError: Metaspace")
    assert java_error_summary(Py4JJavaError("no trace at all")) == "Py4JJavaError: no trace at all"


def test_no_collection_runs_while_a_job_is_planned() -> None:
    import gc

    from quiver.streaming.job import _one_java_thread

    assert gc.isenabled()
    with _one_java_thread():
        assert not gc.isenabled()  # a collection would run py4j finalizers on whichever thread set it off
    assert gc.isenabled()


def test_a_savepoint_newer_than_every_checkpoint_is_the_restore_point(tmp_path: Path) -> None:
    """A run stopped with a savepoint (SIGUSR1) resumes from it; its folder has no chk- number."""
    import os

    from quiver.streaming.job import SAVEPOINTS, checkpoint_number, latest_checkpoint

    chk = tmp_path / ("0" * 32) / "chk-7"
    chk.mkdir(parents=True)
    (chk / "_metadata").write_bytes(b"x")
    os.utime(chk / "_metadata", (1_000, 1_000))
    assert latest_checkpoint(tmp_path) == chk and checkpoint_number(chk) == 7
    savepoint = tmp_path / SAVEPOINTS / "savepoint-8024e7-7e440a8709d2"
    savepoint.mkdir(parents=True)
    (savepoint / "_metadata").write_bytes(b"x")
    assert latest_checkpoint(tmp_path) == savepoint
    assert checkpoint_number(savepoint) == 0  # no crash on the hex id (the runner's retention asks for it)


def test_a_checkpoint_flink_deletes_while_it_is_listed_is_skipped(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Flink keeps the newest checkpoints and deletes older ones as new ones complete. One deleted between
    the listing and its stat made `latest_checkpoint` raise FileNotFoundError in the loader thread, which
    died there, and a bounded run waited forever for the batches it would have loaded (a CI hang)."""
    import errno

    from quiver.streaming.job import latest_checkpoint

    job = tmp_path / ("0" * 32)
    for n in (4, 5):
        (job / f"chk-{n}").mkdir(parents=True)
        (job / f"chk-{n}" / "_metadata").write_bytes(b"x")
    real_stat = Path.stat
    seen: list[Path] = []

    def stat(path: Path, *args: object, **kwargs: object) -> object:
        if path.name == "_metadata" and path.parent.name == "chk-4":
            seen.append(path)
            if len(seen) > 1:  # the listing saw it; by the next look Flink has subsumed it
                raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(path))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(Path, "stat", stat)
    assert latest_checkpoint(tmp_path) == job / "chk-5"
    assert len(seen) == 2  # listed, then gone


def test_the_sink_writes_on_its_own_thread_unless_told_otherwise() -> None:
    from quiver.online.jvm_sink import DEFAULT_IN_FLIGHT
    from quiver.streaming.options import StreamOptions
    from quiver.streaming.runner import parse_args

    assert parse_args([]).sink_in_flight == StreamOptions().sink_in_flight == DEFAULT_IN_FLIGHT == 2
    assert parse_args(["--sink-in-flight", "0"]).sink_in_flight == 0  # in the task thread
