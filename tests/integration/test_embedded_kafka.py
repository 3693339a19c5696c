"""The project's embedded Kafka broker (`quiver.streaming.embedded_kafka`) on a real broker: started detached,
found and reused by the next caller, stopped by `stop_embedded_broker` and `quiver kafka stop`, never mistaken
for a copied project's; and None with the reason when it cannot be had."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from quiver.config import Config, load_config
from quiver.streaming.embedded_kafka import broker_dir, ensure_broker, running_broker, stop_embedded_broker
from quiver.streaming.kafka_broker import create_topic, end_offsets, fresh_topic, produce
from tests.cli_runs import done, quiver

pytestmark = pytest.mark.integration


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Config]:
    (tmp_path / "quiver.yaml").write_text("project: kafkaemb\n")
    config = load_config(tmp_path / "quiver.yaml")
    yield config
    found = running_broker(config)
    if found is not None:  # a failed test must not leave a JVM behind
        os.kill(found[0], signal.SIGKILL)


def test_the_broker_is_reused_while_it_runs_and_stop_stops_it(project: Config) -> None:
    bootstrap = ensure_broker(project)
    assert bootstrap is not None and bootstrap.startswith("127.0.0.1:")
    running = running_broker(project)
    assert running is not None and running[1] == bootstrap
    pid = running[0]
    assert stat.S_IMODE(broker_dir(project).stat().st_mode) == 0o700
    parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    assert parent != os.getpid()  # detached: not our child, so it outlives this process
    create_topic(bootstrap, "kept", 2)
    produce(bootstrap, "kept", [(b"1", b'{"a": 1}')] * 3)

    assert ensure_broker(project) == bootstrap  # the next caller finds ours answering: no second broker
    assert running_broker(project) == running

    assert stop_embedded_broker(project)
    assert not alive(pid) and running_broker(project) is None
    assert not stop_embedded_broker(project)  # nothing left to stop

    again = ensure_broker(project)  # a restart takes its ports again (free still) and keeps the topics
    assert again == bootstrap and sum(end_offsets(again, "kept").values()) == 3
    fresh_topic(again, "kept", 2)  # the demo's rerun: the same topic, empty
    assert sum(end_offsets(again, "kept").values()) == 0
    assert stop_embedded_broker(project)


def test_a_copied_project_never_takes_the_originals_broker(project: Config, tmp_path: Path) -> None:
    bootstrap = ensure_broker(project)
    assert bootstrap is not None
    copy = tmp_path / "copy"
    shutil.copytree(project.root, copy, ignore=shutil.ignore_patterns("start.lock"))
    copied = load_config(copy / "quiver.yaml")
    assert (broker_dir(copied) / "broker.pid").exists()  # the original's pid and ports came along
    assert running_broker(copied) is None and not stop_embedded_broker(copied)
    assert running_broker(project) is not None
    try:
        other = ensure_broker(copied)  # the copy starts a broker of its own, on other ports
        assert other is not None and other != bootstrap
    finally:
        stop_embedded_broker(copied)
        stop_embedded_broker(project)


def test_quiver_kafka_status_start_stop(project: Config) -> None:
    root = Path(project.root)
    assert "no embedded Kafka broker running" in done(quiver("kafka", "status", cwd=root))
    started = done(quiver("kafka", "start", cwd=root, timeout=180))
    running = running_broker(project)
    assert running is not None and f"QUIVER_KAFKA_BOOTSTRAP={running[1]}" in started
    assert f"running (pid {running[0]}) at {running[1]}" in done(quiver("kafka", "status", cwd=root))
    assert "stopped the embedded Kafka broker" in done(quiver("kafka", "stop", cwd=root))
    assert not alive(running[0])
    assert "no embedded Kafka broker was running" in done(quiver("kafka", "stop", cwd=root))


def test_without_the_broker_jars_there_is_no_broker_and_the_reason_is_logged(
        project: Config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("QUIVER_JARS_DIR", str(tmp_path / "no-jars"))  # as if `make setup` had not run
    with caplog.at_level(logging.WARNING, logger="quiver.kafka.embedded"):
        assert ensure_broker(project) is None
    assert "broker jars are not built" in caplog.text and "make setup" in caplog.text
    assert running_broker(project) is None
